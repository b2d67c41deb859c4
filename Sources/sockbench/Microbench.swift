import ArgumentParser
import BenchmarkDriver
import Foundation
import Histogram
import POSIXSupport
import SocketStyles

struct Microbench: ParsableCommand {
    /// Masks a 16 MiB buffer repeatedly (WebSocketMasking, 8 bytes at a time) and reports GB/s.
    func measureMasking() {
        var buffer = [UInt8](repeating: 0x5A, count: 16 * 1024 * 1024)
        let rounds = 64
        WebSocketMasking.apply(key: 0x1234_5678, to: &buffer)  // warm-up
        let start = MonotonicClock.nanoseconds()
        for round in 0..<rounds {
            WebSocketMasking.apply(key: 0x9E37_79B9 &+ UInt32(round), to: &buffer, offset: round)
        }
        let seconds = Double(MonotonicClock.nanoseconds() - start) / 1e9
        let gigabytes = Double(buffer.count * rounds) / 1e9
        Console.line(
            "WebSocket masking: \(rounds) x 16 MiB in \(fixed(seconds, 3)) s = \(fixed(gigabytes / seconds, 2)) GB/s (checksum \(buffer[12345]))"
        )
    }

    static let configuration = CommandConfiguration(
        abstract: "Small measurements of the machinery under the styles.",
        discussion: """
            masking: throughput of WebSocket masking (XOR with the 4-byte key, 8 bytes at a time) over 16 MiB. \
            perform: one-way latency of handing a block from another thread to a run loop (SocketRunLoop.perform: \
            a queue plus an eventfd that wakes epoll_wait), sampled --count times, each after the previous block \
            has run.
            """
    )

    @Argument(help: "What to measure: perform, or masking (WebSocket masking throughput).")
    var what: String = "perform"

    @Option(help: "Samples.")
    var count: Int = 100_000

    @Option(help: "Pin the run loop's thread and the caller to this CPU (same CPU) or `cross`.")
    var placement: String = "none"

    func run() throws {
        if what == "masking" { return measureMasking() }
        guard what == "perform" else { throw fail("unknown measurement '\(what)' (perform, masking)") }
        let runLoop: SocketRunLoop
        do throws(ConnectionError) {
            runLoop = try SocketRunLoop.startThread(name: "perform-bench")
        } catch {
            throw fail(error.description)
        }
        if placement == "same" || placement == "cross" {
            let last = Syscall.cpuCount - 1
            let pinned = Latch()
            runLoop.perform {
                _ = try? Syscall.pinCurrentThread(toCPU: placement == "same" ? last : 0)
                pinned.open()
            }
            pinned.wait()
            do throws(ConnectionError) {
                try Syscall.pinCurrentThread(toCPU: last)
            } catch {
                throw fail(error.description)
            }
        }
        var histogram = LatencySummary.makeHistogram()
        let done = ConditionLock()
        let latency = Late<UInt64>()
        for _ in 0..<count {
            let start = MonotonicClock.nanoseconds()
            runLoop.perform {
                let now = MonotonicClock.nanoseconds()
                done.withLock {
                    latency.set(now - start)
                    done.signal()
                }
            }
            let measured = done.withLock {
                done.wait(until: { latency.value != nil })
                defer { latency.clear() }
                return latency.value!
            }
            _ = histogram.record(max(1, measured))
        }
        runLoop.stop()
        let summary = LatencySummary(histogram)
        Console.line(
            "cross-thread perform (placement \(placement)), \(summary.count) samples, one-way (us): min \(microseconds(summary.min))  p50 \(microseconds(summary.p50))  p90 \(microseconds(summary.p90))  p99 \(microseconds(summary.p99))  p99.9 \(microseconds(summary.p999))  max \(microseconds(summary.max))"
        )
    }
}
