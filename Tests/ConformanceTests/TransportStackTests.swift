import ConnectionTestKit
import SocketStyles
import Testing

/// A backend written outside the package's own five (``MemoryBackend``: tcp only, no kernel) gets tls, ws and
/// wss, relaying and reconnection from ``TransportStack``, as `Backend`'s cases do.
@Suite("Transport stack over a user's backend", .timeLimit(.minutes(10)))
struct TransportStackTests {
    static let secure = ConformanceCase(backend: .bsd, transport: .tls)

    /// An endpoint of the memory backend: its ports are its own; the host is what TLS checks the certificate for.
    static func memory(_ transport: Transport, port: UInt16 = 0) -> Endpoint {
        Endpoint(transport: transport, host: .ipv4("127.0.0.1"), port: port)
    }

    @Test("tcp, tls, ws and wss echo over the memory backend", arguments: [Transport.tcp, .tls, .ws, .wss])
    func echo(_ transport: Transport) async throws {
        try await SocketTest.run {
            let stack = TransportStack(over: MemoryBackend())
            #expect(stack.transports == [.tcp, .tls, .ws, .wss])
            let listener = try await stack.listen(
                on: Self.memory(transport), tls: transport.isSecure ? Self.secure.serverTLS : nil)
            let server = EchoServer(listener: listener)
            server.begin()
            let client = try await stack.connect(to: server.endpoint, tls: Self.secure.clientTLS)
            #expect(client.transport == transport)
            let text = Array("over \(transport), no socket".utf8)
            try await client.send(text)
            let reply =
                transport.isByteStream
                ? try await client.receive(exactly: text.count) : try await client.receive()?.bytes
            #expect(reply == text)
            if let webSocket = client as? WebSocketConnection { try await webSocket.sendPing(timeout: .seconds(5)) }
            await client.close()
            await server.stop()
        }
    }

    @Test("A refused memory connect and a taken memory port fail as sockets do")
    func failures() async throws {
        let backend = MemoryBackend()
        let stack = TransportStack(over: backend)
        await expectConnectionError(.refused) { () throws(ConnectionError) in
            _ = try await stack.connect(to: Self.memory(.ws, port: 4321))
        }
        let listener = try await stack.listen(on: Self.memory(.tcp, port: 4321))
        await expectConnectionError(.addressInUse) { () throws(ConnectionError) in
            _ = try await stack.listen(on: Self.memory(.tcp, port: 4321))
        }
        await listener.close()
        await expectConnectionError(.closed) { () throws(ConnectionError) in _ = try await listener.accept() }
        let again = try await stack.listen(on: Self.memory(.tcp, port: 4321))  // free again once closed
        await again.close()
    }

    @Test("Relay and ReconnectingConnection take the user's backend")
    func relayAndReconnection() async throws {
        try await SocketTest.run {
            let backend = MemoryBackend()
            let stack = TransportStack(over: backend)
            let upstream = EchoServer(listener: try await stack.listen(on: Self.memory(.ws)))
            upstream.begin()
            // A relay on the memory backend, ws to ws, with a delay injected toward the client.
            let relay = try await Relay.start(
                listen: Self.memory(.ws), upstream: upstream.endpoint, backend: backend,
                toClient: .with { $0.delay = .milliseconds(5) })
            let client = try await stack.connectWebSocket(to: relay.endpoint)
            try await client.send(.text("through the relay"))
            #expect(try await client.receive()?.text == "through the relay")
            await client.close()
            await relay.stop()
            // Reconnection: the server goes away and comes back on the same memory port.
            let endpoint = upstream.endpoint
            let reconnecting = ReconnectingConnection(
                backend: backend, endpoint: endpoint,
                policy: .with {
                    $0.initialDelay = .milliseconds(10)
                    $0.maximumDelay = .milliseconds(50)
                })
            try await reconnecting.send(.text("one"))
            #expect(try await reconnecting.receive()?.text == "one")
            // A receive waits across the outage: it sees the loss, and gets what comes after the reconnection.
            let receiver = Task { try await reconnecting.receive()?.text }
            await upstream.stop()
            let lost = try await withTimeLimit(.seconds(10)) { () -> Bool in
                while true {
                    if case .waiting = reconnecting.state { return true }
                    try await Task.sleep(for: .milliseconds(5))
                }
            }
            #expect(lost)
            let back = EchoServer(listener: try await stack.listen(on: endpoint))
            back.begin()
            try await withTimeLimit(.seconds(10)) { try await reconnecting.send(.text("two")) }
            #expect(try await withTimeLimit(.seconds(10)) { try await receiver.value } == "two")
            await reconnecting.close()
            await back.stop()
        }
    }
}
