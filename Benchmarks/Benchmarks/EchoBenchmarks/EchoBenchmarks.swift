import Benchmark
import ConnectionTestKit
import SocketStyles

/// One 64-byte TCP echo round trip through `Connection` per iteration, for each backend, against an echo
/// server of the same backend in this process (so allocations and context switches of both ends are counted).
/// Allocations and context switches per round trip are gated by the committed thresholds, with a tolerance
/// (the concurrency runtime's allocations vary a little: uv's p90 was 13 in one run and 15 in the next, so an
/// allocation count may move by 2 either way, no more); time is reported, not gated.
nonisolated(unsafe) var server: EchoServer?
nonisolated(unsafe) var connection: (any Connection)?

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .throughput, .mallocCountTotal, .contextSwitches],
        warmupIterations: 200,
        maxDuration: .seconds(1),
        maxIterations: 20_000,
        thresholds: [
            .mallocCountTotal: BenchmarkThresholds(absolute: [.p90: 2]),
            .contextSwitches: BenchmarkThresholds(relative: [.p90: 50], absolute: [.p90: 4]),
            .wallClock: .none,
            .throughput: .none,
        ]
    )

    let probe = [UInt8](repeating: 0x5A, count: 64)
    for backend in Backend.allCases {
        Benchmark(
            "Echo-roundtrip-64B-tcp-\(backend)",
            closure: { benchmark in
                guard let connection else { return }
                for _ in benchmark.scaledIterations {
                    do {
                        try await connection.send(probe)
                        blackHole(try await connection.receive(exactly: probe.count))
                    } catch {
                        benchmark.error("round trip failed: \(error)")
                        return
                    }
                }
            },
            setup: {
                let started = try await EchoServer.start(backend, on: try Endpoint(url: "tcp://127.0.0.1:0"))
                server = started
                connection = try await backend.connect(to: started.endpoint)
            },
            teardown: {
                await connection?.close()
                await server?.stop()
                connection = nil
                server = nil
            }
        )
    }
}
