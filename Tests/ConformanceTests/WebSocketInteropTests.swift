import BenchmarkDriver
import ConnectionTestKit
import Foundation
import POSIXSupport
import SocketStyles
import Testing

/// Interop with an independent WebSocket implementation: Python `websockets` (set up by scripts/peers/setup).
@Suite("WebSocket interop with Python websockets", .timeLimit(.minutes(20)))
struct WebSocketInteropTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()
    static let python = root.appendingPathComponent(".venv-peers/bin/python").path
    static let peer = root.appendingPathComponent("scripts/peers/ws_peer.py").path
    static var available: Bool { FileManager.default.isExecutableFile(atPath: python) }

    @Test(
        "Our client against the Python server, without and with permessage-deflate (websockets' defaults)",
        arguments: ConformanceCase.ws.filter(\.usesSockets), [false, true])
    func ourClient(_ test: ConformanceCase, deflate: Bool) async throws {
        guard Self.available else {
            print("skipped: no Python WebSocket peer (run scripts/peers/setup)")
            return
        }
        try await SocketTest.run {
            let certificate = test.transport.isSecure ? ConformanceCase.certificates.server : nil
            let server = try ChildProcess(
                [Self.python, Self.peer, "server"] + [certificate?.certificate, certificate?.key].compactMap { $0 }
                    + (deflate ? ["--deflate"] : []),
                mergeErrors: false)
            defer {
                server.closeInput()
                _ = try? server.wait()
            }
            let line = try await onThread { server.readLine() }  // blocking: off the cooperative pool
            let endpoint = try Endpoint(url: String(line.dropFirst("listening on ".count)))
            try #require(endpoint.transport == test.transport, "the Python server said: \(line)")
            let client = try #require(
                try await test.connect(
                    to: endpoint, webSocket: .with { $0.deflate = deflate ? WebSocketDeflateOptions() : nil })
                    as? WebSocketConnection)
            #expect((client.deflate != nil) == deflate)
            for sequence in 0..<(deflate ? 50 : 0) {
                try await client.send(.text(MarketData.book(sequence)))
                #expect(try await client.receive() == .text(MarketData.book(sequence)))
            }
            for size in [0, 125, 126, 70_000, 1024 * 1024] {
                let binary = pattern(size, seed: 2)
                try await client.send(Message(binary))
                #expect(try await client.receive() == Message(binary))
                let text = String(repeating: "ü", count: size / 2)
                try await client.send(.text(text))
                #expect(try await client.receive() == .text(text))
            }
            let receiving = Task { try? await client.receive() }
            try await client.sendPing([7])
            await client.close(code: .normalClosure, reason: "bye")
            _ = await receiving.value
            #expect(client.peerCloseCode == .normalClosure)
        }
    }

    @Test(
        "The Python client against our server, without and with permessage-deflate (websockets' defaults)",
        arguments: ConformanceCase.ws.filter(\.usesSockets), [false, true])
    func ourServer(_ test: ConformanceCase, deflate: Bool) async throws {
        guard Self.available else {
            print("skipped: no Python WebSocket peer (run scripts/peers/setup)")
            return
        }
        try await SocketTest.run {
            let server =
                deflate
                ? try await test.echoServer(webSocket: .with { $0.deflate = WebSocketDeflateOptions() })
                : try await test.echoServer()
            let output: (Int32, String) = try await withCheckedThrowingContinuation { continuation in
                PosixThread.spawn(name: "py-client") {
                    continuation.resume(
                        with: Result {
                            try ChildProcess.run(
                                [
                                    Self.python, Self.peer, "client", "\(server.endpoint)",
                                    ConformanceCase.certificates.caFile,
                                ] + (deflate ? ["--deflate"] : []))
                        })
                }
            }
            #expect(output.0 == 0, "python client: \(output.1)")
            #expect(output.1.contains("ok"))
            await server.stop()
        }
    }
}
