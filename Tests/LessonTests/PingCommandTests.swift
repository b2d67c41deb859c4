import ConnectionTestKit
import Foundation
import Lessons
import POSIXSupport
import SocketStyles
import Testing

/// `sockbench ping` and `pump` as a user runs them, against a `sockbench serve` child on loopback: a timed run
/// with interval lines and both exports, a run ended by a signal that still prints its summary, and pumps whose
/// JSON adds up.
@Suite("sockbench ping and pump", .serialized, .timeLimit(.minutes(20)))
struct PingCommandTests {
    private func withServer(
        _ transport: Transport = .tcp, sink: Bool = false, _ body: @escaping @Sendable (String) async throws -> Void
    ) async throws {
        try await SocketTest.run(timeLimit: .seconds(120)) {
            let server = try ChildProcess(
                [
                    NetworkLab.selfPath(), "serve", "\(transport)://127.0.0.1:0", "--backend", "async",
                    "--exit-on-stdin-eof",
                ] + (sink ? ["--sink"] : []),
                mergeErrors: false)
            defer { NetworkLab.stop(server) }
            let line = try await blocking { server.readLine() }
            try #require(line.hasPrefix("listening on "), "the server said: \(line)")
            try await body(String(line.dropFirst(13)))
        }
    }

    /// `sockbench backends | head -1`, or any reader that stops reading: SIGPIPE is ignored (for the sockets), so a
    /// write to the closed pipe fails with EPIPE, and `FileHandle.write` crashed on it (status 132 and a
    /// backtrace of 9 KB on stderr, every time). It must end quietly.
    @Test("A reader that goes away (a pipe closed before sockbench writes) ends it quietly, with no crash")
    func closedPipe() async throws {
        // A child process's pipes (and Foundation's own descriptors for it) are descriptors of this process: under
        // SocketTest's lock, or a socket test running meanwhile counts them as its leak (CI, 2026-12-03).
        try await SocketTest.run { try await Self.closedPipeRuns() }
    }

    private static func closedPipeRuns() async throws {
        // ChildProcess, not Foundation's Process: that one opens a run loop (an epoll and an eventfd) on the calling
        // thread, which lives as long as that pooled thread and counts as this test's leak.
        for arguments in [["backends"], ["backends", "--json"]] {
            let child = try ChildProcess([NetworkLab.selfPath()] + arguments, outputReaderGone: true)
            let said = try await blocking { child.readToEnd() }
            let status = try await blocking { try child.wait() }
            #expect(status == 0, "sockbench \(arguments.joined(separator: " "))")
            #expect(said.isEmpty, "\(said.prefix(300))")
        }
    }

    /// What the scripts read from the backends' registrations: one JSON object per line, every built-in backend
    /// with its module, colour and threshold, and the Autobahn runs CI makes.
    @Test("backends --json: a line per backend with what the scripts read from its registration")
    func backendsJSON() async throws {
        try await SocketTest.run { try await Self.backendsJSONRun() }
    }

    private static func backendsJSONRun() async throws {
        let child = try ChildProcess([NetworkLab.selfPath(), "backends", "--json"], mergeErrors: false)
        let output = try await blocking { child.readToEnd() }
        #expect(try await blocking { try child.wait() } == 0)
        let entries = try output.split(separator: "\n").map {
            try #require(try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])
        }
        #expect(entries.compactMap { $0["name"] as? String } == Backend.everyCase.map(\.name))
        for entry in entries {
            #expect(entry["module"] is String && entry["colour"] is String && entry["allocationsPerRoundTrip"] is Int)
        }
        let autobahn = entries.compactMap { entry in (entry["autobahn"] as? String).map { "\(entry["name"]!) \($0)" } }
        #expect(autobahn == ["bsd ws", "async wss", "nio ws", "uring ws"])
        let deflate = entries.compactMap { entry in
            (entry["autobahnDeflate"] as? String).map { "\(entry["name"]!) \($0)" }
        }
        #expect(deflate == ["bsd server", "async client"])
    }

    @Test("--time with --interval, --hgrm and --samples: JSON alone on stdout, a line per interval, both files")
    func timedRun() async throws {
        try await withServer { url in
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("ping-\(getpid())")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: directory) }
            let hgrm = directory.appendingPathComponent("ping.hgrm").path
            let samples = directory.appendingPathComponent("ping.csv").path
            let ping = try ChildProcess(
                [
                    NetworkLab.selfPath(), "ping", url, "--time", "1.2", "--interval", "0.25", "--warmup", "100",
                    "--hgrm", hgrm, "--samples", samples, "--json",
                ], mergeErrors: false)
            let output = try await blocking { ping.readToEnd() }
            let status = try await blocking { try ping.wait() }
            #expect(status == 0, "\(output)")
            // stdout is the JSON report alone.
            let report = try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any]
            let latency = try #require(report?["latency"] as? [String: Any], "\(output)")
            let count = try #require(latency["count"] as? Int)
            #expect(count > 100)
            #expect(report?["latencyUnit"] as? String == "ns")
            // Every measured round trip is in the samples file, in order.
            let lines = try String(contentsOfFile: samples, encoding: .utf8).split(separator: "\n")
            #expect(lines.count == count)
            #expect(lines.first?.hasPrefix("0,") == true)
            // The .hgrm file: HdrHistogram's header and its percentile rows up to 100%.
            let distribution = try String(contentsOfFile: hgrm, encoding: .utf8)
            #expect(distribution.contains("Percentile"))
            #expect(distribution.contains("1.000000000000"))
        }
    }

    @Test("--interval lines come as the run goes; SIGTERM ends it with the summary of what was measured")
    func stoppedBySignal() async throws {
        try await withServer { url in
            let ping = try ChildProcess(
                [NetworkLab.selfPath(), "ping", url, "--count", "100000000", "--interval", "0.2", "--warmup", "10"],
                mergeErrors: false)
            // Two interval lines, then the signal.
            for _ in 0..<2 {
                let line = try await blocking { ping.readLine() }
                #expect(line.hasPrefix("[") && line.contains("round trips"), "\(line)")
            }
            kill(ping.pid, SIGTERM)
            let rest = try await blocking { ping.readToEnd() }
            let status = try await blocking { try ping.wait() }
            #expect(status == 0, "\(rest)")
            #expect(rest.contains("stopped by SIGTERM after"), "\(rest)")
            #expect(rest.contains("round trip (us): min"), "\(rest)")
        }
    }

    @Test(
        "pump --bytes over tcp and ws: the sink counted every byte; udp: received and lost add up",
        arguments: [
            Transport.tcp, .ws, .udp,
        ])
    func pump(_ transport: Transport) async throws {
        try await withServer(transport, sink: true) { url in
            let pump = try ChildProcess(
                [NetworkLab.selfPath(), "pump", url, "--bytes", "4000000", "--interval", "0.1", "--json"],
                mergeErrors: false)
            let output = try await blocking { pump.readToEnd() }
            let status = try await blocking { try pump.wait() }
            #expect(status == 0, "\(output)")
            let report = try #require(try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])
            let messages = try #require(report["messages"] as? Int)
            #expect((report["bytesPerSecond"] as? Double ?? 0) > 0)
            if transport == .udp {
                // 1400-byte datagrams; what the sink did not count is lost, none is invented.
                #expect(messages == 4_000_000 / 1400)
                let received = try #require(report["received"] as? Int)
                #expect(received > 0 && received + (report["lost"] as? Int ?? -1) == messages)
            } else {
                // Delivered is checked inside the run (the sink's count must equal what was sent).
                #expect(messages == 4_000_000 / 65_536)
            }
        }
    }
}
