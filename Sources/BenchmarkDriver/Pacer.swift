import ConnectionCore
import Glibc
import POSIXSupport
import Synchronization

/// How an open-loop sender waits for each send time.
public enum Pacing: String, Sendable, Codable, CaseIterable {
    /// Check the clock, yielding the CPU (sched_yield) to any other runnable thread between checks, as sockperf's
    /// sender polls the clock: the CPU never idles, so neither the send nor a thread woken on the same CPU (the
    /// server, the receiver) pays a timer's lateness or an idle CPU's wake-up, and a yield gives them the CPU at
    /// once. Costs a CPU while waiting (reported apart, left out of CPU per message).
    case spin
    /// Sleep (clock_nanosleep) to each send time: costs no CPU, and every message pays the timer's lateness (the
    /// corrected latency shows it) and, on a virtual machine, the wake-up of an idle CPU (the uncorrected one).
    case sleep
}

/// The open-loop sender's clock, as the C floor's client keeps it: a thread of its own waits for each message's
/// time (start + i x interval; `pacing` says how) and, when a sender waits for that message, resumes it
/// there (a workload has one sender per connection, each waiting for its own messages). The sender keeps running on the connection's executor: the resumption goes straight to it (one
/// hand-over to the connection's thread).
///
/// `Task.sleep` costs more per message here: Dispatch's timer thread fires, a thread of Swift's global pool
/// runs the task, and a task that prefers a connection's executor hops once more (perf, rate-20000 bsd tcp: the
/// pool thread and the timer thread took a third of the client's CPU; docs/benchmarks.md).
final class Pacer: Sendable {
    private struct State {
        /// Senders waiting, by the message each waits for (one sender, or one per connection of a workload).
        var waiters: [Int: UnsafeContinuation<Void, Never>] = [:]
        /// The last message whose time has come (-1: none yet).
        var reached = -1
        var stopped = false
        /// The pacer thread's CPU time, once it has ended.
        var cpuNanoseconds: UInt64?
        /// Waiting for the thread to end.
        var endWaiters: [UnsafeContinuation<UInt64, Never>] = []
    }

    private let state = Guarded(State())
    /// Set by ``stop()``: a spinning pacer checks it between yields and ends.
    private let halted = Atomic<Bool>(false)
    /// When message `index` is due: `start + index x interval` (``MonotonicClock`` nanoseconds).
    let start: UInt64
    let interval: Double
    let count: Int
    let pacing: Pacing

    init(start: UInt64, interval: Double, count: Int, pacing: Pacing = .spin) {
        self.start = start
        self.interval = interval
        self.count = count
        self.pacing = pacing
        PosixThread.spawn(name: "rate-pacer") { [self] in run() }
    }

    func due(_ index: Int) -> UInt64 { start + UInt64(Double(index) * interval) }

    /// Returns once message `index` is due: at once when it already is, else when the pacer reaches it.
    func wait(for index: Int) async {
        if MonotonicClock.nanoseconds() >= due(index) { return }
        await withUnsafeContinuation { continuation in
            let now = state.withLock { state in
                guard state.reached < index, !state.stopped else { return true }
                precondition(state.waiters[index] == nil, "two senders wait for message \(index)")
                state.waiters[index] = continuation
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// The CPU time the pacer's thread spent (waiting for send times, and resuming the sender), once it has
    /// ended; `nil` before.
    var cpuNanoseconds: UInt64? { state.withLock { $0.cpuNanoseconds } }

    /// Stops the pacer and returns its thread's CPU time once the thread has ended (a sleeping pacer ends after
    /// its current sleep).
    func end() async -> UInt64 {
        stop()
        return await withUnsafeContinuation { continuation in
            let spent = state.withLock { state in
                if state.cpuNanoseconds == nil { state.endWaiters.append(continuation) }
                return state.cpuNanoseconds
            }
            if let spent { continuation.resume(returning: spent) }
        }
    }

    /// Whether a sender waits now (for tests).
    var hasWaiter: Bool { state.withLock { !$0.waiters.isEmpty } }

    /// Ends the pacer after its current sleep; waiting senders are resumed.
    func stop() {
        halted.store(true, ordering: .relaxed)
        let waiters = state.withLock { state in
            state.stopped = true
            defer { state.waiters = [:] }
            return state.waiters
        }
        for waiter in waiters.values { waiter.resume() }
    }

    private static func threadCPU() -> UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now)
        return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
    }

    private func run() {
        let cpuAtStart = Self.threadCPU()
        defer {
            let spent = Self.threadCPU() &- cpuAtStart
            let waiters = state.withLock { state in
                state.cpuNanoseconds = spent
                defer { state.endWaiters = [] }
                return state.endWaiters
            }
            for waiter in waiters { waiter.resume(returning: spent) }
        }
        for index in 0..<count {
            let deadline = due(index)
            switch pacing {
            case .spin:
                while MonotonicClock.nanoseconds() < deadline, !halted.load(ordering: .relaxed) { sched_yield() }
            case .sleep:
                var until = timespec(tv_sec: Int(deadline / 1_000_000_000), tv_nsec: Int(deadline % 1_000_000_000))
                while MonotonicClock.nanoseconds() < deadline,
                    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, nil) == EINTR
                {}
            }
            // Every index is reached in turn, and a sender waits only for one not reached yet: the one waiting
            // for this index, if any, is the one to resume.
            let (waiter, stopped) = state.withLock { state -> (UnsafeContinuation<Void, Never>?, Bool) in
                state.reached = index
                return (state.waiters.isEmpty ? nil : state.waiters.removeValue(forKey: index), state.stopped)
            }
            waiter?.resume()
            if stopped { return }
        }
    }
}
