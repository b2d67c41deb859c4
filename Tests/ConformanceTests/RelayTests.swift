import BenchmarkDriver
import ConnectionTestKit
import SocketStyles
import Testing

/// The relay (`sockbench proxy`) on every backend x transport: what goes in comes out, ends are carried, an
/// unreachable upstream ends the client cleanly, and injected faults are there in the numbers.
@Suite("Relay", .timeLimit(.minutes(20)))
struct RelayTests {
    private func relay(
        _ test: ConformanceCase, to upstream: Endpoint, toUpstream: FaultPlan = FaultPlan(),
        toClient: FaultPlan = FaultPlan()
    ) async throws -> Relay {
        try await Relay.start(
            listen: test.anyPort, upstream: upstream, backend: test.backend, serverTLS: test.serverTLS,
            upstreamTLS: test.clientTLS, toUpstream: toUpstream, toClient: toClient)
    }

    @Test("Every byte and message comes back verified through the relay", arguments: ConformanceCase.all)
    func relaysExactly(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            let proxy = try await relay(test, to: server.endpoint)
            let client = try await test.connect(to: proxy.endpoint)
            var configuration = SoakRunner.Configuration(messages: 300)
            configuration.sizes = 0...8192
            configuration.window = 8
            let report = await SoakRunner(configuration).run(on: client)
            #expect(report.passed(reliable: test.transport != .udp), "\(report)")
            if test.transport != .udp { #expect(report.verified == 300) }
            await proxy.stop()
            await server.stop()
        }
    }

    @Test(
        "4 MiB and a half-close are carried both ways: every byte comes back, then the upstream's end",
        arguments: ConformanceCase.all.filter { $0.transport == .tcp })
    func halfClose(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            let proxy = try await relay(test, to: server.endpoint)
            let client = try await test.connect(to: proxy.endpoint)
            let payload = pattern(4 << 20, seed: 4)
            // Read while sending: 4 MiB echoed can be more than the buffers on the way hold.
            let reader = Task { () throws(ConnectionError) -> [UInt8] in
                var echoed: [UInt8] = []
                while let message = try await client.receive() { echoed += message.bytes }
                return echoed
            }
            try await client.send(payload)
            try await client.closeOutput()  // FIN: the echo server answers everything, then ends
            let echoed = try await reader.value
            #expect(echoed.count == payload.count)
            #expect(echoed == payload)
            await client.close()
            await proxy.stop()
            await server.stop()
        }
    }

    @Test(
        "An upstream that refuses gives the client a clean end, not a hang",
        arguments: ConformanceCase.all.filter { $0.transport == .tcp || $0.transport == .ws })
    func upstreamRefused(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            // A port that refuses for the whole test (RefusingPort: one only noted and let go was taken meanwhile).
            let refusing = try RefusingPort()
            defer { refusing.close() }
            let proxy = try await relay(test, to: try refusing.endpoint(test.transport))
            do {
                let client = try await test.connect(to: proxy.endpoint)
                let outcome: Message?? = try? await withTimeLimit(.seconds(10)) { try await client.receive() }
                #expect(outcome.map { $0 == nil } ?? true, "the client got data from nowhere")
                await client.close()
            } catch {
                // ws: the relay closes before answering the upgrade, so the handshake fails: also a clean end.
                #expect(test.transport == .ws, "\(error)")
            }
            #expect(proxy.statistics.upstreamFailures == 1)
            await proxy.stop()
        }
    }

    @Test(
        "A reader that stops holds the sender back: a bounded amount goes in, then sends wait",
        arguments: ConformanceCase.all.filter { $0.transport == .tcp })
    func backpressure(_ test: ConformanceCase) async throws {
        try await SocketTest.run(timeLimit: .seconds(120)) {
            // Upstream: accepts and never reads.
            let listener = try await test.listen()
            let held = Task { try await listener.accept() }
            let proxy = try await relay(test, to: listener.localEndpoint)
            let client = try await test.connect(to: proxy.endpoint)
            // 512 MiB: what a relay without backpressure would take in well under a minute here.
            let (sent, stalled) = try await sendUntilHeldBack(
                client, chunk: [UInt8](repeating: 7, count: 64 * 1024), limit: 512 << 20, wait: .seconds(2))
            #expect(stalled, "the relay took \(sent) bytes for a reader that never reads")
            // The relay's queue (256 chunks) plus four kernel buffers on loopback: tens of MiB at most.
            #expect(sent < 128 << 20, "\(sent) bytes went in before the sender was held back")
            await client.close()
            await proxy.stop()
            if let upstream = try? await held.value { await upstream.close() }
            await listener.close()
        }
    }

    @Test(
        "A reset is carried as a reset, both ways, and an injected cut resets both sides",
        arguments: ConformanceCase.all.filter { $0.transport != .udp })
    func resetCarried(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let upstream = try await test.listen()
            let proxy = try await relay(test, to: upstream.localEndpoint)
            for upstreamResets in [true, false] {
                let client = try await test.connect(to: proxy.endpoint)
                let server = try await upstream.accept()
                try await expectResetCarried(client: client, server: server, upstreamResets: upstreamResets)
            }
            await proxy.stop()
            // --cut-after: the relay resets the client and the upstream once 4 bytes went toward the upstream.
            let cutting = try await relay(
                test, to: upstream.localEndpoint, toUpstream: .with { $0.cutAfterBytes = 4 })
            let client = try await test.connect(to: cutting.endpoint)
            let server = try await upstream.accept()
            try await client.send([1, 2, 3, 4])
            await expectConnectionError(.reset) { () throws(ConnectionError) in
                while try await server.receive() != nil {}
            }
            await expectConnectionError(.reset) { () throws(ConnectionError) in
                while try await client.receive() != nil {}
            }
            await client.close()
            await server.close()
            await cutting.stop()
            await upstream.close()
        }
    }

    @Test(
        "An upstream that goes away mid-connection ends the client, not a hang",
        arguments: ConformanceCase.all.filter { $0.transport == .tcp || $0.transport == .ws })
    func upstreamVanishes(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            let proxy = try await relay(test, to: server.endpoint)
            let client = try await test.connect(to: proxy.endpoint)
            try await client.send(Array("before".utf8))
            if test.transport.isByteStream {
                #expect(try await client.receive(exactly: 6) == Array("before".utf8))
            } else {
                #expect(try await client.receive()?.bytes == Array("before".utf8))
            }
            await server.stop()  // closes every connection it served
            // The end or an error, within the limit (a hang fails with the time limit's error).
            try await withTimeLimit(.seconds(10)) {
                do {
                    while try await client.receive() != nil {}
                } catch {}
            }
            await client.close()
            await proxy.stop()
        }
    }

    @Test(
        "Injected delay is in every round trip; injected loss is near its rate (2,000 datagrams)",
        arguments: Backend.allCases)
    func faultsMeasured(_ backend: Backend) async throws {
        try await SocketTest.run {
            // Delay: 15 ms each way, so no round trip can take under 30 ms.
            let tcp = ConformanceCase(backend: backend, transport: .tcp)
            let server = try await tcp.echoServer()
            let delayed = try await relay(
                tcp, to: server.endpoint, toUpstream: .with { $0.delay = .milliseconds(15) },
                toClient: .with { $0.delay = .milliseconds(15) })
            let client = try await tcp.connect(to: delayed.endpoint)
            let result = try await PingRunner(size: 64, count: 40, warmup: 2).run(on: client)
            #expect(result.latency.min >= 30_000_000, "fastest round trip \(result.latency.min) ns")
            await client.close()
            await delayed.stop()
            await server.stop()

            // Loss: 25% of datagrams toward the server, none back, plus whatever loopback itself drops (none at
            // this pace).
            let udp = ConformanceCase(backend: backend, transport: .udp)
            let udpServer = try await udp.echoServer()
            let lossy = try await relay(udp, to: udpServer.endpoint, toUpstream: .with { $0.loss = 0.25 })
            let udpClient = try await udp.connect(to: lossy.endpoint)
            let report = try await expectQuarterLost(on: udpClient)
            #expect(lossy.statistics.dropped == report.lost || report.lost > lossy.statistics.dropped)
            await lossy.stop()
            await udpServer.stop()
        }
    }

    @Test(
        "Keep-alive sees a peer gone silent behind a black hole (connection kept, nothing forwarded) in bounded time",
        arguments: ConformanceCase.ws.filter { $0.transport == .ws })
    func keepAliveThroughBlackHole(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            // A byte relay under the WebSocket (handshake, frames, pings and pongs all pass through it) that goes
            // silent toward the client after the 101 response and one echo.
            let tcp = ConformanceCase(backend: test.backend, transport: .tcp)
            let proxy = try await relay(
                tcp, to: server.endpoint.with(transport: .tcp), toClient: .with { $0.blackHoleAfterBytes = 140 })
            let client = try await test.backend.connectWebSocket(
                to: proxy.endpoint.with(transport: .ws),
                webSocket: .with {
                    $0.keepAliveInterval = .milliseconds(100)
                    $0.pongDeadline = .milliseconds(300)
                })
            try await client.send(text: "hello")
            #expect(try await client.receive()?.text == "hello")
            await expectKeepAliveEnds(client)
            await client.close()
            await proxy.stop()
            await server.stop()
        }
    }

    @Test("200 clients at once through one relay, each verified", arguments: Backend.allCases)
    func manyClients(_ backend: Backend) async throws {
        try await SocketTest.run(timeLimit: .seconds(120)) {
            let test = ConformanceCase(backend: backend, transport: .tcp)
            let server = try await test.echoServer()
            let proxy = try await relay(test, to: server.endpoint)
            let clients = try await withThrowingTaskGroup(of: (any Connection).self) { group in
                for _ in 0..<200 { group.addTask { try await test.connect(to: proxy.endpoint) } }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            try await withThrowingTaskGroup(of: Void.self) { group in
                for (index, client) in clients.enumerated() {
                    group.addTask {
                        let payload = pattern(4096, seed: UInt8(truncatingIfNeeded: index))
                        try await client.send(payload)
                        #expect(try await client.receive(exactly: payload.count) == payload)
                    }
                }
                try await group.waitForAll()
            }
            #expect(proxy.statistics.clients == 200)
            for client in clients { await client.close() }
            await proxy.stop()
            await server.stop()
        }
    }
}

/// One side of a relayed pair sends two bytes, which must arrive, then resets (`abort()`): the other side must
/// see `.reset`, not a clean end. `upstreamResets` picks the side. Closes the other side (the resetting one is
/// gone with its reset).
func expectResetCarried(
    client: any Connection, server: any Connection, upstreamResets: Bool,
    sourceLocation: SourceLocation = #_sourceLocation
) async throws {
    let (resetting, other) = upstreamResets ? (server, client) : (client, server)
    try await resetting.send([7, 7])
    if client.transport.isByteStream {
        #expect(try await other.receive(exactly: 2) == [7, 7], sourceLocation: sourceLocation)
    } else {
        #expect(try await other.receive()?.bytes == [7, 7], sourceLocation: sourceLocation)
    }
    await resetting.abort()
    await expectConnectionError(.reset, sourceLocation: sourceLocation) { () throws(ConnectionError) in
        while try await other.receive() != nil {}
    }
    await other.close()
}

/// 2,000 small messages through a relay that drops 25% of them toward the server: the share lost must be 25% +- 4
/// points (more than four standard deviations over 2,000). Returns the soak's report.
func expectQuarterLost(
    on client: any Connection, sourceLocation: SourceLocation = #_sourceLocation
) async throws -> SoakRunner.Report {
    var configuration = SoakRunner.Configuration(messages: 2000)
    configuration.sizes = 16...64
    configuration.window = 64
    configuration.lossTimeout = .milliseconds(300)
    let report = await SoakRunner(configuration).run(on: client)
    let share = Double(report.lost) / Double(report.sent)
    #expect(
        abs(share - 0.25) < 0.04, "\(report.lost) of \(report.sent) lost (\(share))", sourceLocation: sourceLocation)
    return report
}

/// After its last message came, a WebSocket client behind a black hole must end with `.timedOut` (close code 1001,
/// going away) from its keep-alive, within 5 s (with keep-alive every 100 ms and a 300 ms pong deadline).
func expectKeepAliveEnds(_ client: WebSocketConnection, sourceLocation: SourceLocation = #_sourceLocation) async {
    let started = ContinuousClock.now
    let error = await expectConnectionError(.timedOut, sourceLocation: sourceLocation) {
        () throws(ConnectionError) in
        while true { _ = try await client.receive() }
    }
    #expect(error?.systemCode?.code == 1001, sourceLocation: sourceLocation)
    let took = ContinuousClock.now - started
    #expect(took < .seconds(5), "noticed only after \(took)", sourceLocation: sourceLocation)
}
