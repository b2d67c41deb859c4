import Benchmark
import ConnectionTestKit
import SocketStyles

/// One 64-byte TCP echo round trip through `Connection` per iteration, for each backend, against an echo
/// server of the same backend in this process (so allocations and context switches of both ends are counted).
/// Allocations and context switches per round trip are gated by the committed thresholds, with a tolerance:
/// the p90 of allocations depends on whether a receive finds its bytes at once or suspends, so it moves between
/// runs of one build (four runs on 2026-11-24: nio 20-21 and 23 in CI, runloop 9-12, uv 13-16, bsd 8-9,
/// async 9; nio after session 16's change to its reads and sends: 19 in four runs here, 16 in CI; uv after
/// session 28's hand-over queue: 13 in three runs here, 10 in CI, its p25 10 and p50 13 in every run; uring
/// after session 34's send queue: 13 in three runs here and in CI, down from 16; uv after session 42, whose
/// sends from off the loop no longer hand it a block and a continuation: 9 in CI). Each backend's threshold is
/// in its registration (`Backend.Tooling.allocationsPerRoundTrip`; `scripts/benchmarks` writes it where the
/// check reads it): the middle of what was seen, which may be missed by 2 either way, no more; time is reported,
/// not gated.
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
