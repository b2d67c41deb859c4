import ConnectionTestKit
import Foundation
import POSIXSupport
import SocketStyles
import Testing

/// The samples that are clients run as written: the echo client in every style (README.md, docs/styles.md,
/// SwiftNIO's included) against a tcp echo server, and the WebSocket client of docs/websocket.md against a ws
/// echo server, both on `127.0.0.1:9000` as the docs say. A fixed port is only safe where nothing else can
/// listen: this test runs itself again inside a network namespace of its own (`unshare --net`, loopback only,
/// gone when the process ends), so it needs root and `unshare`; without them it says so and checks nothing.
@Suite("Documentation samples run")
struct DocSnippetRunTests {
    static let marker = "SOCKETSTYLES_SNIPPETS_IN_NAMESPACE"
    static let inside = ProcessInfo.processInfo.environment[marker] == "1"

    @Test("The client samples run as written against echo servers on port 9000 of a private network namespace")
    func samplesRun() async throws {
        if Self.inside { return try await runInside() }
        guard getuid() == 0, FileManager.default.isExecutableFile(atPath: "/usr/bin/unshare") else {
            print("DocSnippetRunTests: skipped: a private network namespace needs root and unshare(1)")
            return
        }
        try await SocketTest.run(timeLimit: .seconds(120)) {
            let child = try ChildProcess(
                [
                    "/usr/bin/unshare", "--net", "/bin/sh", "-c",
                    "ip link set lo up && exec env \(Self.marker)=1 \"$0\" --testing-library swift-testing --filter DocSnippetRunTests",
                    Self.testBinary(),
                ])
            let output = try await blocking { child.readToEnd() }
            let status = try await blocking { try child.wait() }
            #expect(status == 0, "the samples in the namespace:\n\(output)")
            #expect(output.contains("samples ran: 11"), "\(output)")
        }
    }

    /// In the namespace: the servers, then each sample, bounded in time; the servers count what was served.
    private func runInside() async throws {
        let tcpSamples: [(String, @Sendable () async throws -> Void)] = [
            ("README.md (bsd through Connection)", DocSnippets.README_1),
            ("docs/styles.md (blocking BSDSocket)", DocSnippets.docs_styles_2),
            ("docs/styles.md (libuv callbacks)", DocSnippets.docs_styles_3),
            ("docs/styles.md (stream delegates)", DocSnippets.docs_styles_4),
            ("docs/styles.md (AsyncSocket)", DocSnippets.docs_styles_5),
            ("docs/styles.md (unified Connection)", DocSnippets.docs_styles_6),
            ("docs/styles.md (SwiftNIO)", DocSnippets.docs_styles_nio),
            ("docs/styles.md (io_uring)", DocSnippets.docs_styles_uring),
            ("docs/backends/uring.md (buffers the kernel writes)", DocSnippets.docs_backends_uring),
            ("TheConnectionContract.md (buffers you own, uv)", DocSnippets.docc_contract_owned_buffers),
        ]
        let tcp = try await EchoServer.start(.async, on: Endpoint(url: "tcp://127.0.0.1:9000"))
        for (name, sample) in tcpSamples {
            do {
                try await withTimeLimit(.seconds(10)) { try await sample() }
            } catch {
                Issue.record("\(name): \(error)")
            }
        }
        // The libuv sample returns once its loop has the work; every client must have come and gone.
        try await withTimeLimit(.seconds(10)) {
            while tcp.connectionsServed < tcpSamples.count { try await Task.sleep(for: .milliseconds(10)) }
        }
        #expect(tcp.connectionsServed == tcpSamples.count)
        await tcp.stop()

        let ws = try await EchoServer.start(.async, on: Endpoint(url: "ws://127.0.0.1:9000/chat"))
        try await withTimeLimit(.seconds(10)) { try await DocSnippets.docs_websocket_8() }
        try await withTimeLimit(.seconds(10)) {
            while ws.connectionsServed < 1 { try await Task.sleep(for: .milliseconds(10)) }
        }
        await ws.stop()
        print("samples ran: \(tcpSamples.count + 1)")
    }

    private static func testBinary() -> String {
        var buffer = [CChar](repeating: 0, count: 4096)
        let count = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        return count > 0
            ? String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self) : CommandLine.arguments[0]
    }
}
