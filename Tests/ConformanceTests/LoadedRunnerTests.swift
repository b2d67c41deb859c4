import BenchmarkDriver
import ConnectionTestKit
import SocketStyles
import Testing

/// Latency under load, run for real (small and short): the probe's round trips are all answered while bulk
/// connections to the same server carry as much as they can.
@Suite("Latency under load: a probe beside bulk connections", .timeLimit(.minutes(20)))
struct LoadedRunnerTests {
    @Test(
        "Every probe round trip is answered while the bulk flows run, and the bulk flows move bytes",
        arguments: ConformanceCase.all.filter { [.tcp, .udp, .ws].contains($0.transport) })
    func probeAnswered(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            let endpoint = server.endpoint
            var probe = PingRunner(count: 200, warmup: 20)
            probe.keepsSamples = true
            // WebSocket bulk in 16 KiB messages: a debug build masks 64 KiB slowly, and the probe waits behind it.
            let runner = LoadedRunner(bulk: 3, probe: probe, bulkSize: test.transport == .ws ? 16_384 : nil)
            let result = try await runner.run { () throws(ConnectionError) in try await test.connect(to: endpoint) }
            #expect(result.latency?.count == 200, "every measured probe round trip was answered")
            #expect(result.messages == 200)
            #expect((result.bytesPerSecond ?? 0) > 0, "the bulk flows moved bytes meanwhile")
            let fairness = try #require(result.fairness)
            #expect(fairness.connections == 3)
            await server.stop()
        }
    }

    @Test("With no bulk connection it is the plain probe", arguments: [Backend.bsd, .uv])
    func idle(_ backend: Backend) async throws {
        try await SocketTest.run {
            let server = try await EchoServer.start(backend, on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let endpoint = server.endpoint
            let result = try await LoadedRunner(bulk: 0, probe: PingRunner(count: 100, warmup: 10)).run {
                () throws(ConnectionError) in try await backend.connect(to: endpoint)
            }
            #expect(result.latency?.count == 100)
            #expect(result.bytesPerSecond == nil && result.fairness == nil)
            await server.stop()
        }
    }

    @Test("A probe given a duration makes at least its minimum of round trips, and stops at the end of its window")
    func window() async throws {
        try await SocketTest.run {
            let server = try await EchoServer.start(.async, on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let connection = try await Backend.async.connect(to: server.endpoint)
            var probe = PingRunner(count: 1_000_000, warmup: 5)
            probe.duration = .zero
            probe.minimumCount = 50
            #expect(try await probe.run(on: connection).latency.count == 50, "a window already over: the minimum")
            probe.duration = .milliseconds(200)
            probe.minimumCount = 0
            let started = ContinuousClock.now
            let result = try await probe.run(on: connection)
            #expect(result.latency.count > 0 && result.latency.count < 1_000_000, "stopped by the window")
            #expect(ContinuousClock.now - started < .seconds(10))
            await connection.close()
            await server.stop()
        }
    }
}
