import ConnectionCore
import Glibc
import POSIXSupport
import Synchronization

/// The open-loop sender's clock, as the C floor's client keeps it: a thread of its own sleeps with
/// clock_nanosleep(2) to each message's time (start + i x interval) and, when the sender waits for that message,
/// resumes it there. The sender keeps running on the connection's executor: the resumption goes straight to it
/// (one wake-up of the pacer, one hand-over to the connection's thread).
///
/// `Task.sleep` costs more per message here: Dispatch's timer thread fires, a thread of Swift's global pool
/// runs the task, and a task that prefers a connection's executor hops once more (perf, rate-20000 bsd tcp: the
/// pool thread and the timer thread took a third of the client's CPU; docs/benchmarks.md).
final class Pacer: Sendable {
    private struct State {
        /// The sender, waiting for message `index`.
        var waiter: (index: Int, continuation: UnsafeContinuation<Void, Never>)?
        /// The last message whose time has come (-1: none yet).
        var reached = -1
        var stopped = false
    }

    private let state = Guarded(State())
    /// When message `index` is due: `start + index x interval` (``MonotonicClock`` nanoseconds).
    let start: UInt64
    let interval: Double
    let count: Int

    init(start: UInt64, interval: Double, count: Int) {
        self.start = start
        self.interval = interval
        self.count = count
        PosixThread.spawn(name: "rate-pacer") { [self] in run() }
    }

    func due(_ index: Int) -> UInt64 { start + UInt64(Double(index) * interval) }

    /// Returns once message `index` is due: at once when it already is, else when the pacer reaches it.
    func wait(for index: Int) async {
        if MonotonicClock.nanoseconds() >= due(index) { return }
        await withUnsafeContinuation { continuation in
            let now = state.withLock { state in
                guard state.reached < index, !state.stopped else { return true }
                state.waiter = (index, continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Whether a sender waits now (for tests).
    var hasWaiter: Bool { state.withLock { $0.waiter != nil } }

    /// Ends the pacer after its current sleep; a waiting sender is resumed.
    func stop() {
        let waiter = state.withLock { state in
            state.stopped = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.continuation.resume()
    }

    private func run() {
        for index in 0..<count {
            let deadline = due(index)
            var until = timespec(tv_sec: Int(deadline / 1_000_000_000), tv_nsec: Int(deadline % 1_000_000_000))
            while MonotonicClock.nanoseconds() < deadline,
                clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, nil) == EINTR
            {}
            let (waiter, stopped) = state.withLock { state -> (UnsafeContinuation<Void, Never>?, Bool) in
                state.reached = index
                guard let waiter = state.waiter, waiter.index <= index else { return (nil, state.stopped) }
                state.waiter = nil
                return (waiter.continuation, state.stopped)
            }
            waiter?.resume()
            if stopped { return }
        }
    }
}
