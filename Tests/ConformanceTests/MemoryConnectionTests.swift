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

    @Test("WebSocket over the pair: a handshake answer that never comes times out; garbage is refused")
    func webSocketBadPeer() async throws {
        try await socketless {
            let (tcpClient, tcpServer, wire) = MemoryConnection.pair()
            wire.hold(toward: .toFirst)  // the server's answer never arrives
            var options = WebSocketOptions()
            options.handshakeTimeout = .milliseconds(200)
            let endpoint = try Endpoint(url: "ws://memory-server:2/")
            async let accepted = try? WebSocketConnection.server(over: tcpServer)
            await expectConnectionError(.timedOut) { () throws(ConnectionError) in
                _ = try await WebSocketConnection.client(over: tcpClient, endpoint: endpoint, options: options)
            }
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
            let (client, server, wire) = try await Self.webSocketPair()
            let serving = Task { while (try? await server.receive()) != nil {} }  // answers pings as it reads
            try await client.sendPing(timeout: .seconds(5))
            wire.hold(toward: .toFirst)  // the pong never reaches the client
            await expectConnectionError(.timedOut) { () throws(ConnectionError) in
                try await client.sendPing(timeout: .milliseconds(100))
            }
            wire.release(toward: .toFirst)
            await client.close()
            await serving.value
            await server.close()
        }
    }

    @Test("WebSocket over the pair: keep-alive fails a receive when the peer goes silent behind the wire")
    func webSocketKeepAlive() async throws {
        try await socketless {
            var options = WebSocketOptions()
            options.keepAliveInterval = .milliseconds(50)
            options.pongDeadline = .milliseconds(100)
            let (client, server, wire) = try await Self.webSocketPair(client: options)
            let serving = Task { while (try? await server.receive()) != nil {} }
            wire.hold(toward: .toFirst)  // a black hole toward the client: no pong, no data, no end
            await expectConnectionError(.timedOut) { () throws(ConnectionError) in _ = try await client.receive() }
            wire.release(toward: .toFirst)
            await client.close()
            await server.close()
            await serving.value
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

    @Test("TLS over the pair: the handshake, bytes both ways, close_notify as the end; garbage is refused")
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
        }
    }
}
