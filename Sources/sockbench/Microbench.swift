import ArgumentParser
import BenchmarkDriver
import Foundation
import Histogram
import SocketStyles

struct Microbench: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Small measurements of the machinery under the styles.",
        discussion: """
            perform: one-way latency of handing a block from another thread to a run loop (SocketRunLoop.perform: \
            a queue plus an eventfd that wakes epoll_wait), sampled --count times, each after the previous block \
            has run.
            """
    )

    @Argument(help: "What to measure: perform.")
    var what: String = "perform"

    @Option(help: "Samples.")
    var count: Int = 100_000

    @Option(help: "Pin the run loop's thread and the caller to this CPU (same CPU) or `cross`.")
    var placement: String = "none"

    func run() throws {
        guard what == "perform" else { throw fail("unknown measurement '\(what)' (perform)") }
        let runLoop: SocketRunLoop
        do throws(ConnectionError) {
            runLoop = try SocketRunLoop.startThread(name: "perform-bench")
        } catch {
            throw fail(error.description)
        }
        if placement == "same" || placement == "cross" {
            let last = Syscall.cpuCount - 1
            let done = ConditionLock()
            nonisolated(unsafe) var pinned = false
            runLoop.perform {
                _ = try? Syscall.pinCurrentThread(toCPU: placement == "same" ? last : 0)
                done.withLock {
                    pinned = true
                    done.broadcast()
                }
            }
            done.withLock { done.wait(until: { pinned }) }
            do throws(ConnectionError) {
                try Syscall.pinCurrentThread(toCPU: last)
            } catch {
                throw fail(error.description)
            }
        }
        var histogram = LatencySummary.makeHistogram()
        let done = ConditionLock()
        nonisolated(unsafe) var latency: UInt64 = 0
        nonisolated(unsafe) var finished = false
        for _ in 0..<count {
            let start = MonotonicClock.nanoseconds()
            runLoop.perform {
                let now = MonotonicClock.nanoseconds()
                done.withLock {
                    latency = now - start
                    finished = true
                    done.signal()
                }
            }
            done.withLock {
                done.wait(until: { finished })
                finished = false
            }
            _ = histogram.record(max(1, latency))
        }
        runLoop.stop()
        let summary = LatencySummary(histogram)
        Console.line(
            "cross-thread perform (placement \(placement)), \(summary.count) samples, one-way (us): min \(microseconds(summary.min))  p50 \(microseconds(summary.p50))  p90 \(microseconds(summary.p90))  p99 \(microseconds(summary.p99))  p99.9 \(microseconds(summary.p999))  max \(microseconds(summary.max))"
        )
    }
}
