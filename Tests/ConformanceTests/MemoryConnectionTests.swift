import ConnectionTestKit
import Foundation
import SocketStyles
import Testing

/// The in-memory pair, and protocol code above `Connection` on it with no socket: TLS and WebSocket
/// handshakes, messages and closes, and what they do with a wire that misbehaves.
@Suite("In-memory connections (no socket)", .serialized, .timeLimit(.minutes(20)))
struct MemoryConnectionTests {
    /// Runs `body` alone among socket tests and checks that it left the open sockets as they were.
    func socketless(_ body: @escaping @Sendable () async throws -> Void) async throws {
        try await SocketTest.runWithoutSockets(timeLimit: .seconds(60), body)
    }

    @Test("Bytes arrive in order, joined or held and released; a FIN follows them; close and reset end the peer")
    func byteStream() async throws {
        try await socketless {
            let (client, server, wire) = MemoryConnection.pair()
            try await client.send(Array(0..<6))
            try await client.send(Array(6..<10))
            #expect(try await server.receive(maximumLength: 4)?.bytes == [0, 1, 2, 3])
            #expect(try await server.receive(maximumLength: 100)?.bytes == Array(4..<10))
            wire.hold(toward: .toFirst)
            try await server.send([42])
            try await server.closeOutput()
            #expect(wire.heldCount(toward: .toFirst) == 2)
            let waiting = Task { try await client.receive(exactly: 1) }
            wire.release(toward: .toFirst)
            #expect(try await waiting.value == [42])
            #expect(try await client.receive() == nil)
            await expectConnectionError(.closed) { () throws(ConnectionError) in try await server.send([1]) }
            await client.close()
            #expect(try await server.receive() == nil)
            await server.close()

            let (a, b, resetting) = MemoryConnection.pair()
            resetting.reset()
            await expectConnectionError(.reset) { () throws(ConnectionError) in try await b.receive() }
            await expectConnectionError(.reset) { () throws(ConnectionError) in try await a.send([1]) }
            await a.close()
            await b.close()
        }
    }

    @Test("A sender waits while the receiver's queue is full, and goes on when it reads")
    func backpressure() async throws {
        try await socketless {
            var options = ConnectionOptions()
            options.receiveQueueLimit = 1024
            let (client, server, wire) = MemoryConnection.pair(options: options)
            let sent = Task { try await client.send([UInt8](repeating: 7, count: 4096)) }
            while wire.waitingSenders(toward: .toSecond) == 0 { await Task.yield() }  // it waits for room
            var received = 0
            while received < 4096 { received += try await server.receive(maximumLength: 512)?.bytes.count ?? 0 }
            try await sent.value
            await client.close()
            await server.close()
        }
    }

    @Test("WebSocket over the pair: both handshakes, text and binary echoed, the close code reaches the other end")
    func webSocket() async throws {
        try await socketless {
            let (tcpClient, tcpServer, _) = MemoryConnection.pair()
            let endpoint = try Endpoint(url: "ws://memory-server:2/chat")
            async let accepted = WebSocketConnection.server(over: tcpServer)
            let client = try await WebSocketConnection.client(over: tcpClient, endpoint: endpoint)
            let server = try await accepted
            try await client.send(text: "hello")
            let message = try #require(try await server.receive())
            #expect(message.kind == .text && message.bytes == Array("hello".utf8))
            try await server.send(Message([1, 2, 3]))
            #expect(try await client.receive()?.bytes == [1, 2, 3])
            let reading = Task { try await server.receive() }
            await client.close(code: .goingAway, reason: "done")
            #expect(try await reading.value == nil)
            #expect(server.peerCloseCode == .goingAway)
            #expect(server.peerCloseReason == "done")
            await server.close()
        }
    }

    @Test("WebSocket over the pair: a handshake answer that never comes times out at its deadline; garbage is refused")
    func webSocketBadPeer() async throws {
        try await socketless {
            let (tcpClient, tcpServer, wire) = MemoryConnection.pair()
            wire.hold(toward: .toFirst)  // the server's answer never arrives
            let clock = ManualClock()
            let options = WebSocketOptions.with {
                $0.handshakeTimeout = .seconds(30)
                $0.clock = clock.deadlineClock
            }
            let endpoint = try Endpoint(url: "ws://memory-server:2/")
            async let accepted = try? WebSocketConnection.server(over: tcpServer)
            let handshake = Task {
                _ = try await WebSocketConnection.client(over: tcpClient, endpoint: endpoint, options: options)
            }
            await expectTimedOut(handshake, after: .seconds(30), on: clock)
            await (await accepted)?.close()
            await tcpServer.close()

            let (garbageClient, garbageServer, _) = MemoryConnection.pair()
            let answering = Task {
                _ = try await garbageServer.receive()
                try await garbageServer.send(Array("SSH-2.0-OpenSSH_9.2\r\n\r\n".utf8))
            }
            await expectConnectionError(.protocolViolation) { () throws(ConnectionError) in
                _ = try await WebSocketConnection.client(over: garbageClient, endpoint: endpoint)
            }
            try await answering.value
            await garbageClient.close()
            await garbageServer.close()
        }
    }

    /// A WebSocket pair over the in-memory wire, client options as given.
    static func webSocketPair(
        client options: WebSocketOptions = WebSocketOptions(),
        server serverOptions: WebSocketOptions = WebSocketOptions()
    ) async throws -> (client: WebSocketConnection, server: WebSocketConnection, wire: MemoryWire) {
        let (tcpClient, tcpServer, wire) = MemoryConnection.pair()
        async let accepted = WebSocketConnection.server(over: tcpServer, options: serverOptions)
        let client = try await WebSocketConnection.client(
            over: tcpClient, endpoint: try Endpoint(url: "ws://memory-server:2/"), options: options)
        return (client, try await accepted, wire)
    }

    @Test("WebSocket over the pair: a ping whose pong is held back fails at its deadline; a pong in time succeeds")
    func webSocketPingDeadline() async throws {
        try await socketless {
            let clock = ManualClock()
            let (client, server, wire) = try await Self.webSocketPair(client: .with { $0.clock = clock.deadlineClock })
            let serving = Task { while (try? await server.receive()) != nil {} }  // answers pings as it reads
            try await client.sendPing(timeout: .seconds(5))  // its pong comes with no time passing on the clock
            wire.hold(toward: .toFirst)  // the pong never reaches the client
            let ping = Task { try await client.sendPing(timeout: .seconds(30)) }
            await expectTimedOut(ping, after: .seconds(30), on: clock)
            wire.release(toward: .toFirst)
            await client.close()
            await serving.value
            await server.close()
        }
    }

    @Test("WebSocket over the pair: keep-alive fails a receive when the peer goes silent behind the wire")
    func webSocketKeepAlive() async throws {
        try await socketless {
            let clock = ManualClock()
            let options = WebSocketOptions.with {
                $0.keepAliveInterval = .seconds(20)
                $0.pongDeadline = .seconds(10)
                $0.clock = clock.deadlineClock
            }
            let (client, server, wire) = try await Self.webSocketPair(client: options)
            let serving = Task { while (try? await server.receive()) != nil {} }
            wire.hold(toward: .toFirst)  // a black hole toward the client: no pong, no data, no end
            let receiving = Task { try await client.receive() }
            await clock.waitForSleepers(1)  // keep-alive waits out its interval
            clock.advance(by: .seconds(20))  // a ping goes out; its pong cannot come
            await expectTimedOut(receiving, after: .seconds(10), on: clock)  // the ping's pong deadline
            wire.release(toward: .toFirst)
            await client.close()
            await server.close()
            await serving.value
        }
    }

    @Test("WebSocket over the pair: a message in 7-byte fragments arrives whole; fragments past the limit get 1009")
    func webSocketFragments() async throws {
        try await socketless {
            let (client, server, _) = try await Self.webSocketPair(
                client: .with { $0.fragmentSize = 7 }, server: .with { $0.maximumMessageSize = 200 })
            let text = "fragmented: κόσμε 🎉 " + String(repeating: "x", count: 100)
            try await client.send(text: text)  // 7-byte fragments split code points across frames
            #expect(try await server.receive()?.text == text)
            try await client.send(text: String(repeating: "y", count: 300))  // 43 fragments, over the limit
            await expectConnectionError(.messageTooLarge) { () throws(ConnectionError) in
                _ = try await server.receive()
            }
            #expect(try await client.receive() == nil)  // the server's close (1009) ended the client's stream
            #expect(client.peerCloseCode == .messageTooBig)
            await client.close()
            await server.close()
        }
    }

    @Test("WebSocket over the pair: permessage-deflate agreed when both offer it; a message past the limit is refused")
    func webSocketDeflateAndLimit() async throws {
        try await socketless {
            var deflating = WebSocketOptions()
            deflating.deflate = WebSocketDeflateOptions()
            var limited = WebSocketOptions()
            limited.deflate = WebSocketDeflateOptions()
            limited.maximumMessageSize = 1000
            let (client, server, _) = try await Self.webSocketPair(client: deflating, server: limited)
            #expect(client.deflate != nil && server.deflate != nil)
            let text = String(repeating: "compressible ", count: 70)  // 910 bytes: under the limit
            try await client.send(text: text)
            #expect(try await server.receive()?.bytes == Array(text.utf8))
            try await client.send(Message([UInt8](repeating: 1, count: 5000)))  // over the server's limit
            await expectConnectionError(.messageTooLarge) { () throws(ConnectionError) in
                _ = try await server.receive()
            }
            #expect(server.peerCloseCode == nil)  // the server failed the connection (it sends 1009)
            await client.close()
            await server.close()
        }
    }

    @Test(
        "TLS over the pair: the handshake, bytes both ways, close_notify as the end; garbage is refused; silence times out"
    )
    func tls() async throws {
        try await socketless {
            let certificates = ConformanceCase.certificates
            let (tcpClient, tcpServer, _) = MemoryConnection.pair()
            let endpoint = try Endpoint(url: "tls://localhost:443")
            async let accepted = TLSConnection.server(over: tcpServer, configuration: certificates.server.server)
            let client = try await TLSConnection.client(
                over: tcpClient, endpoint: endpoint, configuration: certificates.client)
            let server = try await accepted
            try await client.send(Array("ping".utf8))
            #expect(try await server.receive(exactly: 4) == Array("ping".utf8))
            try await server.send(Array("pong".utf8))
            #expect(try await client.receive(exactly: 4) == Array("pong".utf8))
            await client.close()
            #expect(try await server.receive() == nil)
            await server.close()

            let (garbageClient, garbageServer, _) = MemoryConnection.pair()
            let answering = Task {
                _ = try await garbageServer.receive()
                try await garbageServer.send(Array("HTTP/1.1 400 Bad Request\r\n\r\n".utf8))
            }
            await #expect(throws: ConnectionError.self) {
                _ = try await TLSConnection.client(
                    over: garbageClient, endpoint: endpoint, configuration: certificates.client)
            }
            try await answering.value
            await garbageClient.close()
            await garbageServer.close()

            // A peer that takes the connection and never answers: the handshake ends at its deadline.
            let (silentClient, silentServer, _) = MemoryConnection.pair()
            let clock = ManualClock()
            var configuration = certificates.client
            configuration.handshakeTimeout = .seconds(30)
            configuration.clock = clock.deadlineClock
            let handshake = Task {
                try await TLSConnection.client(over: silentClient, endpoint: endpoint, configuration: configuration)
            }
            await expectTimedOut(handshake, after: .seconds(30), on: clock)
            await silentClient.close()
            await silentServer.close()
        }
    }

    /// Once `task` has armed its deadline on `clock`: one second short of `deadline` it still waits, at
    /// `deadline` it fails with `.timedOut`, and far less real time than `deadline` went by.
    func expectTimedOut<T>(
        _ task: Task<T, any Error>, after deadline: Duration, on clock: ManualClock,
        sourceLocation: SourceLocation = #_sourceLocation
    ) async {
        let started = ContinuousClock.now
        await clock.waitForSleepers(1)
        clock.advance(by: deadline - .seconds(1))
        #expect(clock.sleeperCount == 1, "a second short, still waiting", sourceLocation: sourceLocation)
        clock.advance(by: .seconds(1))
        await expectFailure(.timedOut, of: task, sourceLocation: sourceLocation)
        #expect(ContinuousClock.now - started < deadline / 3, "on the manual clock, not in real time")
    }

    /// Expects `task` to fail with a ``ConnectionError`` of `kind`.
    func expectFailure<T>(
        _ kind: ConnectionError.Kind, of task: Task<T, any Error>, sourceLocation: SourceLocation = #_sourceLocation
    ) async {
        switch await task.result {
        case .success: Issue.record("expected \(kind), but it succeeded", sourceLocation: sourceLocation)
        case .failure(let error):
            #expect((error as? ConnectionError)?.kind == kind, "\(error)", sourceLocation: sourceLocation)
        }
    }
}
