import ConnectionCore
import Glibc
@_spi(Loop) import POSIXSupport
import Synchronization

/// How an open-loop sender waits for each send time.
public enum Pacing: String, Sendable, Codable, CaseIterable {
    /// Check the clock, yielding the CPU (sched_yield) to any other runnable thread between checks, as sockperf's
    /// sender polls the clock: the CPU never idles, so neither the send nor a thread woken on the same CPU (the
    /// server, the receiver) pays a timer's lateness or an idle CPU's wake-up, and a yield gives them the CPU at
    /// once. Costs a CPU while waiting (reported apart, left out of CPU per message).
    case spin
    /// Sleep (ppoll with a nanosecond time-out, as clock_nanosleep would) to each send time: costs no CPU, and
    /// every message pays the timer's lateness (the corrected latency shows it) and, on a virtual machine, the
    /// wake-up of an idle CPU (the uncorrected one).
    case sleep
}

/// The open-loop sender's clock, as the C floor's client keeps it: a thread of its own waits for each message's
/// time (start + i x interval; `pacing` says how) and, when a sender waits for that message, resumes it (a
/// workload has one sender per connection, each waiting for its own messages).
///
/// The pacer is also a `TaskExecutor`: a sender that prefers it runs on the pacer's thread and sends from there,
/// as the C floor's sender does, when its connection sends from any thread without a hand-over
/// (``Connection/sendsFromAnyThread``). Resumed there, it sends at once, and whatever it does after the send
/// (its bookkeeping, its next wait) runs on a thread that has used the CPU all along, so the scheduler puts the
/// server and the receiver it woke first; on the connection's thread (bsd's reader), the send first had to wake
/// that thread, and the bookkeeping ran before the thread went back to wait for the echo (session 41 in
/// docs/benchmarks.md). A sender whose connection hands sends to a loop runs on that loop instead (its
/// ``Connection/preferredExecutor``): the pacer resumes it there, one hand-over before the send time is taken.
///
/// `Task.sleep` costs more per message here: Dispatch's timer thread fires, a thread of Swift's global pool
/// runs the task, and a task that prefers a connection's executor hops once more (perf, rate-20000 bsd tcp: the
/// pool thread and the timer thread took a third of the client's CPU; docs/benchmarks.md).
final class Pacer: TaskExecutor, Sendable {
    private struct State {
        /// Senders waiting, by the message each waits for (one sender, or one per connection of a workload): a slot
        /// per message, so a wait and its resumption cost a store, not a hash.
        var waiters: [UnsafeContinuation<Void, Never>?]
        /// How many slots hold a sender.
        var waiting = 0
        /// The last message whose time has come (-1: none yet).
        var reached = -1
        var stopped = false
        /// The CPU time the pacer's thread spent waiting, once it has ended.
        var cpuNanoseconds: UInt64?
        /// Waiting for the thread to end.
        var endWaiters: [UnsafeContinuation<UInt64, Never>] = []
    }

    private let state: Guarded<State>
    /// Set by ``stop()``: a spinning pacer checks it between yields and ends.
    private let halted = Atomic<Bool>(false)
    /// Jobs of tasks that prefer the pacer (senders), run on its thread; from another thread they signal
    /// `wake`, so a sleeping pacer runs them at once.
    private let work: LoopWorkQueue
    private let wake: WakeEvent?
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
        state = Guarded(State(waiters: Array(repeating: nil, count: max(0, count))))
        // A spinning pacer looks for jobs between its checks of the clock; a sleeping one is woken by an eventfd
        // (without one, descriptors exhausted, it still runs them at every send time).
        let wake = pacing == .sleep ? try? WakeEvent() : nil
        self.wake = wake
        work = LoopWorkQueue(signal: { wake?.signal() })
        PosixThread.spawn(name: "rate-pacer") { [self] in run() }
    }

    func due(_ index: Int) -> UInt64 { start + UInt64(Double(index) * interval) }

    /// A job of a sender that prefers the pacer: run on its thread (at once when it waits; before the next
    /// send time at the latest), or on Swift's global executor once the pacer has ended.
    func enqueue(_ job: consuming ExecutorJob) { work.enqueue(UnownedJob(job)) }

    /// Returns once message `index` is due: at once when it already is, else when the pacer reaches it.
    func wait(for index: Int) async {
        if MonotonicClock.nanoseconds() >= due(index) { return }
        await withUnsafeContinuation { continuation in
            let now = state.withLock { state in
                guard state.reached < index, !state.stopped, index < state.waiters.count else { return true }
                precondition(state.waiters[index] == nil, "two senders wait for message \(index)")
                state.waiters[index] = continuation
                state.waiting += 1
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// The CPU time the pacer's thread spent waiting for send times, once it has ended; `nil` before. What
    /// senders on its thread did (their sends) is not in it.
    var cpuNanoseconds: UInt64? { state.withLock { $0.cpuNanoseconds } }

    /// Stops the pacer and returns the CPU time its thread spent waiting, once the thread has ended (a sleeping
    /// pacer wakes at once).
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

    /// `true` on the pacer's thread (for tests).
    var isCurrent: Bool { work.isLoopThread }

    /// Whether a sender waits now (for tests).
    var hasWaiter: Bool { state.withLock { $0.waiting > 0 } }

    /// Ends the pacer; waiting senders are resumed.
    func stop() {
        halted.store(true, ordering: .relaxed)
        let waiters = state.withLock { state -> [UnsafeContinuation<Void, Never>] in
            state.stopped = true
            guard state.waiting > 0 else { return [] }
            let waiting = state.waiters.compactMap { $0 }
            state.waiters = Array(repeating: nil, count: state.waiters.count)
            state.waiting = 0
            return waiting
        }
        for waiter in waiters { waiter.resume() }
        work.wake()
    }

    private static func threadCPU() -> UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now)
        return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
    }

    private func run() {
        work.bindToCurrentThread()
        let me = asUnownedTaskExecutor()
        var waited: UInt64 = 0
        defer {
            // Jobs that come later (a sender's send that suspended and is resumed now) run on the global executor.
            work.end()
            wake?.close()
            let waiters = state.withLock { state in
                state.cpuNanoseconds = waited
                defer { state.endWaiters = [] }
                return state.endWaiters
            }
            for waiter in waiters { waiter.resume(returning: waited) }
        }
        for index in 0..<count {
            let deadline = due(index)
            // Only the wait is the pacer's CPU (as the C floor's sender counts it); a job run here while waiting
            // (a sender resumed after a send that had to wait for room) is counted with it.
            let before = Self.threadCPU()
            switch pacing {
            case .spin:
                while MonotonicClock.nanoseconds() < deadline, !halted.load(ordering: .relaxed) {
                    work.runAll(jobsAs: me)
                    sched_yield()
                }
            case .sleep:
                while MonotonicClock.nanoseconds() < deadline, !halted.load(ordering: .relaxed) {
                    work.runAll(jobsAs: me)
                    guard work.prepareToSleep() else { continue }
                    if let woken = wake?.ifOpen({ Syscall.waitReadable($0, untilMonotonic: deadline) }) {
                        if woken { wake?.drain() }
                    } else {
                        Syscall.sleep(untilMonotonic: deadline)
                    }
                    work.awoke()
                }
            }
            waited &+= Self.threadCPU() &- before
            // Every index is reached in turn, and a sender waits only for one not reached yet: the one waiting
            // for this index, if any, is the one to resume; a sender on this thread sends right here.
            let (waiter, stopped) = state.withLock { state -> (UnsafeContinuation<Void, Never>?, Bool) in
                state.reached = index
                guard let waiter = state.waiters[index] else { return (nil, state.stopped) }
                state.waiters[index] = nil
                state.waiting -= 1
                return (waiter, state.stopped)
            }
            waiter?.resume()
            work.runAll(jobsAs: me)
            if stopped || halted.load(ordering: .relaxed) { return }
        }
    }
}
