import BenchmarkDriver
import ConnectionTestKit
import SocketStyles
import Testing

/// The relay's fault injection with no socket: the relay, its upstream and its clients all on ``MemoryBackend``
/// (tcp, and ws through `TransportStack`), each test checking that the process's open sockets did not change.
/// What a fault does is the relay's own code, not the kernel's: these tests pin it down without loopback's timing.
@Suite("Relay faults without sockets", .timeLimit(.minutes(20)))  // its tests wait their turn (SocketTest)
struct RelayMemoryTests {
    /// An endpoint of the memory backend (its ports are its own; the host is not looked at).
    static func memory(_ transport: Transport, port: UInt16 = 0) -> Endpoint {
        Endpoint(transport: transport, host: .ipv4("127.0.0.1"), port: port)
    }

    /// A memory backend with an echo server on it, and a relay to that server with the given faults.
    private static func setUp(
        _ transport: Transport, toUpstream: FaultPlan = FaultPlan(), toClient: FaultPlan = FaultPlan()
    ) async throws -> (stack: TransportStack, server: EchoServer, relay: Relay) {
        let backend = MemoryBackend()
        let stack = TransportStack(over: backend)
        let server = EchoServer(listener: try await stack.listen(on: memory(transport)))
        server.begin()
        let relay = try await Relay.start(
            listen: memory(transport), upstream: server.endpoint, backend: backend, toUpstream: toUpstream,
            toClient: toClient)
        return (stack, server, relay)
    }

    @Test("An injected delay is in every round trip, and never less", arguments: [Transport.tcp, .ws])
    func delay(_ transport: Transport) async throws {
        try await SocketTest.runWithoutSockets {
            let (stack, server, relay) = try await Self.setUp(
                transport, toUpstream: .with { $0.delay = .milliseconds(15) },
                toClient: .with { $0.delay = .milliseconds(15) })
            let client = try await stack.connect(to: relay.endpoint)
            let result = try await PingRunner(size: 64, count: 30, warmup: 2).run(on: client)
            #expect(result.latency.min >= 30_000_000, "fastest round trip \(result.latency.min) ns")
            await client.close()
            await relay.stop()
            await server.stop()
        }
    }

    @Test(
        "A hold delays the message carrying its byte; the later ones wait behind it unless reordering is on (udp)",
        arguments: [Transport.tcp, .ws, .udp])
    func hold(_ transport: Transport) async throws {
        try await SocketTest.runWithoutSockets {
            let size = 8
            let (stack, server, relay) = try await Self.setUp(
                transport,
                toUpstream: .with {
                    $0.hold = .init(byte: 3 * size + 2, duration: .milliseconds(300))
                    $0.reorder = transport == .udp
                })
            let client = try await stack.connect(to: relay.endpoint)
            let started = ContinuousClock.now
            for number in 0..<8 {
                try await client.send([UInt8](repeating: UInt8(number), count: size))
                // On the byte stream, #0-#2 each come back before the next goes, so #3 starts a chunk of its own.
                if transport == .tcp && number < 3 { _ = try await client.receive(exactly: size) }
            }
            var order: [UInt8] = []
            if transport == .tcp {
                // #0-#2 came back already. The byte stream is split at the held byte: #3's first two bytes come
                // back at once, the rest of #3 and everything after it together, after the hold.
                #expect(try await client.receive(exactly: 2) == [3, 3])
                let early = ContinuousClock.now - started
                #expect(early < .milliseconds(300), "the bytes before the held one came back after \(early)")
                let rest = [3, 3] + (try await client.receive(exactly: 5 * size - 2))
                order = [0, 1, 2] + rest.enumerated().filter { $0.offset % size == 0 }.map(\.element)
            } else {
                while order.count < 8, let message = try await client.receive() { order.append(message.bytes[0]) }
            }
            let took = ContinuousClock.now - started
            #expect(took >= .milliseconds(300), "the held message came back after \(took)")
            #expect(relay.statistics.held == 1)
            if transport == .udp {
                #expect(order.last == 3, "the held datagram came back last: \(order)")
                #expect(order.filter { $0 != 3 } == [0, 1, 2, 4, 5, 6, 7])
            } else {
                #expect(order == [0, 1, 2, 3, 4, 5, 6, 7], "in order, the later ones behind the held one")
            }
            await client.close()
            await relay.stop()
            await server.stop()
        }
    }

    @Test("Injected loss drops WebSocket messages near its rate (2,000 messages), and the relay counts each")
    func loss() async throws {
        try await SocketTest.runWithoutSockets {
            let (stack, server, relay) = try await Self.setUp(.ws, toUpstream: .with { $0.loss = 0.25 })
            let client = try await stack.connect(to: relay.endpoint)
            // Nothing else on the way loses a message here, so what is lost is what the relay dropped.
            let report = try await expectQuarterLost(on: client)
            #expect(relay.statistics.dropped == report.lost, "\(relay.statistics) against \(report)")
            #expect(report.corrupted == 0)
            await client.close()
            await relay.stop()
            await server.stop()
        }
    }

    @Test("A bandwidth cap holds a transfer to its rate")
    func bandwidth() async throws {
        try await SocketTest.runWithoutSockets {
            // 200 kB/s toward the upstream. The relay waits after each chunk it forwards for as long as the chunk
            // takes at that rate, so the first chunk (64 KiB at most) goes at once: 320 kB cannot arrive in under
            // (320,000 - 65,536) / 200,000 s, 1.27 s.
            let (stack, server, relay) = try await Self.setUp(.tcp, toUpstream: .with { $0.bandwidth = 200_000 })
            let client = try await stack.connect(to: relay.endpoint)
            let payload = pattern(320_000, seed: 5)
            let started = ContinuousClock.now
            async let echoed = client.receive(exactly: payload.count)
            try await client.send(payload)
            #expect(try await echoed == payload)
            let took = ContinuousClock.now - started
            #expect(took >= .milliseconds(1_270), "320 kB at 200 kB/s came back in \(took)")
            await client.close()
            await relay.stop()
            await server.stop()
        }
    }

    @Test("An injected cut resets the client and the upstream, and nothing after it is forwarded")
    func cut() async throws {
        try await SocketTest.runWithoutSockets {
            let backend = MemoryBackend()
            let upstream = try await backend.listen(on: Self.memory(.tcp), options: ConnectionOptions())
            let relay = try await Relay.start(
                listen: Self.memory(.tcp), upstream: upstream.localEndpoint, backend: backend,
                toUpstream: .with { $0.cutAfterBytes = 4 })
            let client = try await backend.connect(to: relay.endpoint, options: ConnectionOptions())
            let server = try await upstream.accept()
            try await client.send([1, 2, 3, 4, 5, 6])
            await expectConnectionError(.reset) { () throws(ConnectionError) in
                while try await server.receive() != nil {}
            }
            await expectConnectionError(.reset) { () throws(ConnectionError) in
                while try await client.receive() != nil {}
            }
            // Cut at the byte asked for: the fifth and sixth were never forwarded.
            #expect(relay.statistics.bytesToUpstream == 4, "\(relay.statistics)")
            await client.close()
            await server.close()
            await relay.stop()
            await upstream.close()
        }
    }

    @Test("A reset is carried as a reset, from either side", arguments: [Transport.tcp, .ws])
    func resetCarried(_ transport: Transport) async throws {
        try await SocketTest.runWithoutSockets {
            let backend = MemoryBackend()
            let stack = TransportStack(over: backend)
            let upstream = try await stack.listen(on: Self.memory(transport))
            let relay = try await Relay.start(
                listen: Self.memory(transport), upstream: upstream.localEndpoint, backend: backend)
            for upstreamResets in [true, false] {
                let client = try await stack.connect(to: relay.endpoint)
                let server = try await upstream.accept()
                try await expectResetCarried(client: client, server: server, upstreamResets: upstreamResets)
            }
            await relay.stop()
            await upstream.close()
        }
    }

    @Test("1 MiB and a half-close are carried both ways: every byte comes back, then the upstream's end")
    func halfClose() async throws {
        try await SocketTest.runWithoutSockets {
            let (stack, server, relay) = try await Self.setUp(.tcp)
            let client = try await stack.connect(to: relay.endpoint)
            let payload = pattern(1 << 20, seed: 6)
            let reader = Task { () throws(ConnectionError) -> [UInt8] in
                var echoed: [UInt8] = []
                while let message = try await client.receive() { echoed += message.bytes }
                return echoed
            }
            try await client.send(payload)
            try await client.closeOutput()
            let echoed = try await reader.value
            #expect(echoed.count == payload.count)
            #expect(echoed == payload)
            await client.close()
            await relay.stop()
            await server.stop()
        }
    }

    @Test("An upstream nobody listens on gives the client a clean end, and counts one failure")
    func upstreamRefused() async throws {
        try await SocketTest.runWithoutSockets {
            let backend = MemoryBackend()
            let relay = try await Relay.start(
                listen: Self.memory(.tcp), upstream: Self.memory(.tcp, port: 4321), backend: backend)
            let client = try await backend.connect(to: relay.endpoint, options: ConnectionOptions())
            let outcome = try await withTimeLimit(.seconds(10)) { try? await client.receive() }
            #expect(outcome == nil, "the client got data from nowhere")
            #expect(relay.statistics.upstreamFailures == 1)
            await client.close()
            await relay.stop()
        }
    }

    @Test("An upstream that never reads holds the client back: a bounded amount goes in, then sends wait")
    func backpressure() async throws {
        try await SocketTest.runWithoutSockets(timeLimit: .seconds(120)) {
            let backend = MemoryBackend()
            let upstream = try await backend.listen(on: Self.memory(.tcp), options: ConnectionOptions())
            let held = Task { try await upstream.accept() }
            let relay = try await Relay.start(
                listen: Self.memory(.tcp), upstream: upstream.localEndpoint, backend: backend)
            let client = try await backend.connect(to: relay.endpoint, options: ConnectionOptions())
            let (sent, stalled) = try await sendUntilHeldBack(
                client, chunk: [UInt8](repeating: 7, count: 64 * 1024), limit: 512 << 20, wait: .seconds(2))
            #expect(stalled, "the relay took \(sent) bytes for a reader that never reads")
            // The relay's queue (256 chunks of 64 KiB) and two memory receive queues: tens of MiB at most.
            #expect(sent < 64 << 20, "\(sent) bytes went in before the sender was held back")
            await client.close()
            await relay.stop()
            if let server = try? await held.value { await server.close() }
            await upstream.close()
        }
    }

    @Test("A black hole keeps both connections open and forwards nothing; WebSocket keep-alive notices it")
    func blackHole() async throws {
        try await SocketTest.runWithoutSockets {
            let backend = MemoryBackend()
            let stack = TransportStack(over: backend)
            let server = EchoServer(listener: try await stack.listen(on: Self.memory(.ws)))
            server.begin()
            // A byte relay under the WebSocket that goes silent toward the client after the 101 response and one
            // echo.
            let relay = try await Relay.start(
                listen: Self.memory(.tcp), upstream: server.endpoint.with(transport: .tcp), backend: backend,
                toClient: .with { $0.blackHoleAfterBytes = 140 })
            let client = try await stack.connectWebSocket(
                to: relay.endpoint.with(transport: .ws),
                webSocket: .with {
                    $0.keepAliveInterval = .milliseconds(100)
                    $0.pongDeadline = .milliseconds(300)
                })
            try await client.send(.text("hello"))
            #expect(try await client.receive()?.text == "hello")
            await expectKeepAliveEnds(client)
            await client.close()
            await relay.stop()
            await server.stop()
        }
    }
}
