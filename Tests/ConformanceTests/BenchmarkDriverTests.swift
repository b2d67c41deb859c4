import BenchmarkDriver
import ConnectionTestKit
import SocketStyles
import Synchronization
import Testing

/// The benchmark driver's scenarios, run for real (small and short) against in-process servers: they must
/// measure what they claim (every byte delivered, every message matched), whatever the figures are.
@Suite("Benchmark driver scenarios", .timeLimit(.minutes(20)))
struct BenchmarkDriverTests {
    @Test("soak: every byte comes back verified over every backend x transport", arguments: ConformanceCase.all)
    func soakClean(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            let client = try await test.connect(to: server.endpoint)
            var configuration = SoakRunner.Configuration(messages: 300)
            configuration.sizes = 0...4096
            configuration.window = 8
            let report = await SoakRunner(configuration).run(on: client)
            let reliable = test.transport != .udp
            #expect(report.passed(reliable: reliable), "\(report)")
            #expect(report.sent == 300)
            if reliable { #expect(report.verified == 300) }
            await server.stop()
        }
    }

    @Test(
        "soak: a server that flips a byte, drops or repeats a message is caught",
        arguments: [Transport.tcp, .udp, .ws])
    func soakCatchesFaults(_ transport: Transport) async throws {
        try await SocketTest.run {
            let test = ConformanceCase(backend: .async, transport: transport)
            let listener = try await test.listen()
            // An echo server that corrupts message 10, drops message 20 (message transports) and repeats 30.
            let faulty = Task {
                guard let connection = try? await listener.accept() else { return }
                var index = 0
                while let message = try? await connection.receive() {
                    index += 1
                    var bytes = message.bytes
                    if index == 10, bytes.count > 20 { bytes[bytes.count - 1] ^= 0xFF }
                    if index == 20 && !transport.isByteStream { continue }
                    let reply = Message(kind: message.kind, bytes: bytes)
                    try? await connection.send(reply)
                    if index == 30 && !transport.isByteStream { try? await connection.send(reply) }
                }
                await connection.close()
            }
            let client = try await test.connect(to: listener.localEndpoint)
            var configuration = SoakRunner.Configuration(messages: 60)
            configuration.sizes = 100...200
            configuration.window = 1  // one message per receive on every transport, so the faults hit known messages
            configuration.lossTimeout = .milliseconds(200)
            configuration.drainTimeout = .milliseconds(500)
            let report = await SoakRunner(configuration).run(on: client)
            #expect(report.corrupted == 1, "\(report)")
            #expect(!report.passed(reliable: transport != .udp))
            switch transport {
            case .udp:
                #expect(report.lost == 1 && report.duplicated == 1, "\(report)")
            case .ws:
                // A reliable transport that loses a message has stalled: the soak says so instead of waiting.
                #expect(report.lost == 1 && report.error?.contains("no echo of message 19") == true, "\(report)")
            default:
                #expect(report.error == nil && report.verified == 59, "\(report)")
            }
            await listener.close()
            await faulty.value
        }
    }

    @Test(
        "ping against a peer that accepts and never answers fails with .timedOut after its timeout",
        arguments: ConformanceCase.all.filter { $0.transport == .tcp || $0.transport == .udp })
    func pingTimeout(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            // A silent peer: accepts (tcp) or receives (udp), never answers.
            let listener = try await test.listen()
            let silent = Task { () -> (any Connection)? in
                guard let connection = try? await listener.accept() else { return nil }
                while (try? await connection.receive()) != nil {}
                return connection
            }
            let client = try await test.connect(to: listener.localEndpoint)
            let started = ContinuousClock.now
            await expectConnectionError(.timedOut) { () throws(ConnectionError) in
                try await PingRunner(size: 64, count: 10, warmup: 0, timeout: .milliseconds(400)).run(on: client)
            }
            #expect(ContinuousClock.now - started < .seconds(3))
            await client.close()
            await listener.close()
            await silent.value?.close()
        }
    }

    @Test("pump delivers every byte to the sink, which reports the count", arguments: [Transport.tcp, .ws, .tls])
    func pumpReliable(_ transport: Transport) async throws {
        try await SocketTest.run {
            let certificates = ConformanceCase.certificates
            let sink = try await EchoServer.start(
                .async, on: try Endpoint(url: "\(transport)://127.0.0.1:0"),
                tls: transport.isSecure ? certificates.server.server : nil, mode: .sink)
            let connection = try await Backend.bsd.connect(to: sink.endpoint, tls: certificates.client)
            let result = try await PumpRunner(size: 4096, totalBytes: 4 << 20).run(on: connection)
            #expect(result.messages == 1024)
            #expect((result.bytesPerSecond ?? 0) > 0)
            await connection.close()
            await sink.stop()
        }
    }

    @Test("UDP pump: the sink's counts add up (received + lost = sent)")
    func pumpDatagrams() async throws {
        try await SocketTest.run {
            let sink = try await EchoServer.start(.async, on: try Endpoint(url: "udp://127.0.0.1:0"), mode: .sink)
            let connection = try await Backend.async.connect(to: sink.endpoint)
            let result = try await PumpRunner(size: 1400, totalBytes: 1400 * 2000).run(on: connection)
            let received = try #require(result.received)
            #expect(received > 0 && received <= 2000)
            #expect(received + (result.lost ?? -1) == result.messages)
            await connection.close()
            await sink.stop()
        }
    }

    /// The sender and the receiver both run on the connection's executor (the pacer only wakes the sender), so
    /// this runs the open-loop runner on every backend's executor.
    @Test(
        "rate: every echo is matched to its send; corrected latency is never below uncorrected",
        arguments: ConformanceCase.all.filter { [.tcp, .udp, .ws].contains($0.transport) })
    func rate(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            // Socket buffers that hold every datagram of the run (net.core.rmem_max is 4 MB here and in CI): a debug
            // build's loop that a busy host keeps off the CPU for 100 ms lost 317 of 700 to a full 208 KiB buffer of
            // nio's server (2026-12-03, CI beside the lessons' compare), which is the host, not the runner.
            let buffers = ConnectionOptions.with { $0.receiveBufferSize = 4 << 20 }
            let server = try await EchoServer.start(
                test.backend, on: test.anyPort, options: buffers, tls: test.serverTLS)
            let connection = try await test.connect(to: server.endpoint, options: buffers)
            let runner = RateRunner(perSecond: 2000, duration: .milliseconds(300), warmup: .milliseconds(50))
            let result = try await runner.run(on: connection)
            // Loopback keeps every datagram at this rate; a busy CI machine may drop one now and then.
            #expect(result.lost ?? 0 <= (test.transport == .udp ? runner.total / 100 : 0))
            let corrected = try #require(result.latency)
            let uncorrected = try #require(result.uncorrectedLatency)
            #expect(corrected.count == uncorrected.count && corrected.count > 0)
            #expect(corrected.p50 >= uncorrected.p50)
            await connection.close()
            await server.stop()
        }
    }

    /// The wires of the in-memory connections a batch opened (what goes toward the server's end is held there, so
    /// a close shows as a held end of stream), and how many connects were asked for.
    private final class Opened: Sendable {
        let wires = Mutex<[MemoryWire]>([])
        let connects = Atomic<Int>(0)
        let prepared = Atomic<Int>(0)
    }

    @Test("Connections open in batches, each prepared; a failure closes every one opened and says how far it got")
    func connectionBatch() async throws {
        typealias Connector = @Sendable () async throws(ConnectionError) -> any Connection
        func connector(_ opened: Opened, failingAt failure: Int?) -> Connector {
            { () throws(ConnectionError) in
                let call = opened.connects.add(1, ordering: .relaxed).newValue
                if call == failure { throw ConnectionError(.refused, "connect \(call) refused") }
                let (client, _, wire) = MemoryConnection.pair()
                wire.hold(toward: .toSecond)
                opened.wires.withLock { $0.append(wire) }
                return client
            }
        }
        let fine = Opened()
        let connections = try await ConnectionBatch.open(70, batchSize: 64, connect: connector(fine, failingAt: nil)) {
            _ throws(ConnectionError) in fine.prepared.add(1, ordering: .relaxed)
        }
        #expect(connections.count == 70 && fine.prepared.load(ordering: .relaxed) == 70)
        for connection in connections { await connection.close() }

        let failing = Opened()
        await #expect {
            _ = try await ConnectionBatch.open(150, batchSize: 64, connect: connector(failing, failingAt: 100))
        } throws: { error in
            let error = error as? ConnectionError
            return error?.kind == .refused && error?.detail == "after 64 of 150 connections: connect 100 refused"
        }
        // The batch that failed stopped there: 64 opened before it, 63 beside the failure, all closed.
        let wires = failing.wires.withLock { $0 }
        #expect(wires.count == 127 && failing.connects.load(ordering: .relaxed) == 128)
        let leftOpen = wires.count { $0.heldCount(toward: .toSecond) == 0 }
        #expect(leftOpen == 0, "\(leftOpen) connections the batch opened were left open")
    }

    @Test("fanin: every client's round trips are counted; connect: each handshake timed")
    func faninAndConnect() async throws {
        try await SocketTest.run {
            let server = try await EchoServer.start(.uv, on: try Endpoint(url: "ws://127.0.0.1:0/"))
            let endpoint = server.endpoint
            // The server runs in this process, so its memory is ours here; the point is that both are read.
            let fanin = try await FaninRunner(connections: 20, count: 50, warmup: 5).run(
                serverUsage: { ResourceUsage.read() }
            ) { () throws(ConnectionError) in try await Backend.runloop.connect(to: endpoint) }
            #expect(fanin.messages == 1000)
            #expect(fanin.latency?.count == 1000)
            #expect(fanin.serverKiBPerConnection != nil && fanin.clientKiBPerConnection != nil)
            let fairness = try #require(fanin.fairness)
            #expect(fairness.connections == 20)
            #expect(fairness.jainIndex > 0.05 && fairness.jainIndex <= 1)
            #expect(fairness.medianP99 != nil && fairness.medianP99! <= fairness.worstP99!)
            let connect = try await ConnectRunner(count: 20).run { () throws(ConnectionError) in
                try await Backend.nio.connect(to: endpoint)
            }
            #expect(connect.latency?.count == 20)
            await server.stop()
        }
    }

    @Test("churn in lanes: that many clients at a time, never more; progress counts every client once, in order")
    func churnLanes() async throws {
        try await SocketTest.run {
            let server = try await EchoServer.start(.async, on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let endpoint = server.endpoint
            for lanes in [1, 4] {
                // Connects in progress at once: the first `lanes` wait for each other (for at most 10 s), which
                // can only end early when the lanes really run together; never more than `lanes` at a time.
                let connecting = Atomic<Int>(0)
                let most = Atomic<Int>(0)
                let met = Atomic<Int>(0)
                let counted = Mutex<[Int]>([])
                let outcome = await ChurnRunner(sequential: 40, lanes: lanes, deadline: .seconds(60)).run(
                    transport: .tcp,
                    progress: { done in
                        counted.withLock { $0.append(done) }
                        return true
                    },
                    connect: { () throws(ConnectionError) in
                        let now = connecting.add(1, ordering: .relaxed).newValue
                        _ = most.max(now, ordering: .relaxed)
                        defer { connecting.subtract(1, ordering: .relaxed) }
                        if met.add(1, ordering: .relaxed).newValue <= lanes {
                            let until = ContinuousClock.now + .seconds(10)
                            while most.load(ordering: .relaxed) < lanes && ContinuousClock.now < until {
                                await Task.yield()
                            }
                        }
                        return try await Backend.async.connect(to: endpoint)
                    })
                #expect(outcome.completed == 40 && outcome.allServed, "\(lanes) lane(s): \(outcome.failures)")
                #expect(most.load(ordering: .relaxed) == lanes, "\(lanes) lane(s)")
                #expect(counted.withLock { $0 } == Array(1...40))
            }
            await server.stop()
        }
    }

    @Test("A WebSocket ping never re-sends a probe, however late its echo: only UDP may lose one")
    func webSocketProbesAreNotResent() async throws {
        try await SocketTest.run {
            let server = try await EchoServer.start(.async, on: try Endpoint(url: "ws://127.0.0.1:0/"))
            let connection = try await Backend.async.connect(to: server.endpoint)
            // Every echo is later than this: a UDP runner would re-send each probe and count it lost.
            let result = try await PingRunner(count: 200, warmup: 0, lossTimeout: .nanoseconds(1)).run(on: connection)
            #expect(result.lost == 0)
            #expect(result.stale == 0)
            #expect(result.latency.count == 200)
            await connection.close()
            await server.stop()
        }
    }

    @Test("Resource usage reads this process: CPU time grows, threads are counted")
    func resources() async throws {
        // Inside SocketTest.run: reading /proc opens descriptors, which other tests' leak checks must not see.
        try await SocketTest.run {
            let before = try #require(ResourceUsage.read())
            var sum = 0
            for index in 0..<2_000_000 { sum &+= index &* 7 }
            let after = try #require(ResourceUsage.read())
            #expect(sum != 1)
            #expect(after.since(before).cpuNanoseconds > 0)
            #expect(after.threads >= 1)
            #expect(after.peakResidentKiB > 0)
            #expect((after.residentKiB ?? 0) > 0)
        }
    }
}
