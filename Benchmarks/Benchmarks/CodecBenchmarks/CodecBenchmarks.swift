import Benchmark
import SocketStyles

/// The WebSocket codec's hot paths, one operation per iteration (names without spaces: the threshold files are
/// named after them). Allocations are exact and gated by the
/// committed thresholds; time is reported, not gated (a shared machine's clock is too noisy to gate on).
let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .throughput, .mallocCountTotal],
        warmupIterations: 10,
        maxDuration: .seconds(1),
        maxIterations: 100_000,
        thresholds: [
            // Exact: an extra allocation per frame is a regression to look at.
            .mallocCountTotal: BenchmarkThresholds(relative: [.p90: 0], absolute: [.p90: 0]),
            .wallClock: .none,
            .throughput: .none,
        ]
    )

    for size in [125, 64 * 1024] {
        let payload = [UInt8](repeating: 0x42, count: size)
        let masked = WebSocketFrame(opcode: .binary, payload: payload, maskingKey: 0x1234_5678)
        let encoded = WebSocketFrameEncoder.encode(masked)

        Benchmark("Encode-masked-binary-frame-\(size)B") { benchmark in
            for _ in benchmark.scaledIterations {
                blackHole(WebSocketFrameEncoder.encode(masked))
            }
        }

        Benchmark("Parse-masked-binary-frame-\(size)B") { benchmark in
            for _ in benchmark.scaledIterations {
                var parser = WebSocketFrameParser(role: .server)
                parser.feed(encoded)
                blackHole(try? parser.nextFrame())
            }
        }
    }

    var block = [UInt8](repeating: 0x5A, count: 64 * 1024)
    Benchmark("Mask-64KiB-in-place") { benchmark in
        for _ in benchmark.scaledIterations {
            WebSocketMasking.apply(key: 0x9E37_79B9, to: &block)
            blackHole(block[0])
        }
    }

    let ascii = [UInt8](repeating: UInt8(ascii: "a"), count: 64 * 1024)
    let mixed = Array(String(repeating: "héllo wörld ✓ 𝄞 ", count: 3000).utf8.prefix(64 * 1024 - 3))
    Benchmark("Validate-UTF8-64KiB-ASCII") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(UTF8Validator.isValid(ascii))
        }
    }
    Benchmark("Validate-UTF8-64KiB-mixed-1-to-4-byte") { benchmark in
        for _ in benchmark.scaledIterations {
            var validator = UTF8Validator()
            blackHole(validator.feed(mixed))
        }
    }
}
