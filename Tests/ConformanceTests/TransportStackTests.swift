import ConnectionTestKit
import NativeStyles
import SocketStyles
import Testing

/// A backend written outside the package's own five (``MemoryBackend``: tcp only, no kernel) gets tls, ws and
/// wss, relaying and reconnection from ``TransportStack``, as the package's own backends do.
@Suite("Transport stack over a user's backend", .timeLimit(.minutes(20)))
struct TransportStackTests {
    static let secure = ConformanceCase(backend: .bsd, transport: .tls)

    /// An endpoint of the memory backend: its ports are its own; the host is what TLS checks the certificate for.
    static func memory(_ transport: Transport, port: UInt16 = 0) -> Endpoint {
        Endpoint(transport: transport, host: .ipv4("127.0.0.1"), port: port)
    }

    @Test("tcp, tls, ws and wss echo over the memory backend", arguments: [Transport.tcp, .tls, .ws, .wss])
    func echo(_ transport: Transport) async throws {
        try await SocketTest.runWithoutSockets {
            let stack = TransportStack(over: MemoryBackend())
            #expect(stack.transports == [.tcp, .udp, .tls, .ws, .wss])
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
        try await SocketTest.runWithoutSockets {
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

    @Test("A backend registered from outside: listed, found by name, given tls and wss; a taken name is refused")
    func registration() async throws {
        try await SocketTest.runWithoutSockets {
            let memory = MemoryBackend()  // one table: the listener and the connects must share it
            let mine = Backend(name: "memory-registered", summary: "in-memory pairs", style: "a test's own") { memory }
            try Backend.register(mine)
            #expect(Backend.allCases.last == mine)
            #expect(try Backend(name: "MEMORY-registered") == mine)
            #expect(mine.transports == [.tcp, .udp, .tls, .ws, .wss])
            await expectConnectionError(.invalidEndpoint) { () throws(ConnectionError) in try Backend.register(mine) }
            let taken = Backend(name: "bsd", summary: "", style: "") { memory }
            await expectConnectionError(.invalidEndpoint) { () throws(ConnectionError) in try Backend.register(taken) }
            #expect(Backend.bsd.implementation is BSDBackend)
            // No native style of its own: compare leaves its native rows out, and asking says why.
            #expect(mine.nativeTransports.isEmpty)
            await expectConnectionError(.unsupported) { () throws(ConnectionError) in
                _ = try await mine.nativeEchoServer(on: Self.memory(.tcp))
            }
            for transport in [Transport.tls, .wss] {
                let server = try await EchoServer.start(
                    Backend(name: "memory-registered"), on: Self.memory(transport), tls: Self.secure.serverTLS)
                let client = try await mine.connect(to: server.endpoint, tls: Self.secure.clientTLS)
                try await client.send(Array("registered".utf8))
                let reply =
                    transport.isByteStream ? try await client.receive(exactly: 10) : try await client.receive()?.bytes
                #expect(reply == Array("registered".utf8))
                await client.close()
                await server.stop()
            }
        }
    }
}
