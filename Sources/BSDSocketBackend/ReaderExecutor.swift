import ConnectionCore
import POSIXSupport
import Synchronization

/// A connection's reader thread as a `TaskExecutor` (its ``Connection/preferredExecutor``): a task that prefers
/// it runs on the reader thread, so the receive that thread completes continues right there, instead of waking a
/// thread of Swift's pool for every message (the hop that made a `bsd` round trip through `Connection` cost two
/// extra context switches on each end).
///
/// The reader waits in poll(2) on its socket and this executor's eventfd; a job enqueued from another thread
/// signals the eventfd, one enqueued on the reader thread just queues. Once the reader thread ends (end of stream,
/// error, close), jobs, queued and new, go to Swift's global executor, and the eventfd is closed.
final class ReaderExecutor: TaskExecutor, @unchecked Sendable {
    private struct State {
        var jobs: [UnownedJob] = []
        /// The reader is in (or about to enter) poll: an enqueue or a wake-up must signal.
        var sleeping = false
        /// A ``wake()`` came while the reader was not waiting: its next ``wait(socket:events:)`` returns at once,
        /// so the reader looks again at what the wake-up was for (a close, room in the queue).
        var wakePending = false
        /// -1 once the reader thread has ended.
        var wakeFD: Int32
    }

    private let state: Guarded<State>
    /// The reader thread's ``PosixThread/currentID`` while it runs (0 before and after).
    private let readerThread = Atomic<UInt>(0)

    init() throws(ConnectionError) {
        state = Guarded(State(wakeFD: try Syscall.eventFD()))
    }

    /// An executor whose reader never started (made ahead for a connection that did not come) still closes its
    /// eventfd.
    deinit {
        let fd = state.withLock { $0.wakeFD }
        if fd >= 0 { Syscall.close(fd) }
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let taken = state.withLock { state in
            guard state.wakeFD >= 0 else { return false }
            state.jobs.append(job)
            if state.sleeping {
                state.sleeping = false
                Syscall.eventFDSignal(state.wakeFD)
            }
            return true
        }
        if !taken { globalConcurrentExecutor.enqueue(ExecutorJob(job)) }
    }

    /// Wakes the reader from any thread (a close, or room in the receive queue).
    func wake() {
        state.withLock { state in
            guard state.wakeFD >= 0 else { return }
            if state.sleeping {
                state.sleeping = false
                Syscall.eventFDSignal(state.wakeFD)
            } else {
                state.wakePending = true
            }
        }
    }

    /// `true` on the reader thread: a task running here may read the socket itself, since the reader is not in
    /// the middle of a read (it is running this task's job).
    var isCurrent: Bool { readerThread.load(ordering: .relaxed) == PosixThread.currentID }

    // MARK: On the reader thread

    /// Records the calling thread as the reader (at the start of its loop).
    func bindReaderThread() { readerThread.store(PosixThread.currentID, ordering: .relaxed) }

    /// Reader-thread only (so unsynchronised: only that thread reads or writes it): the batch being run, swapped
    /// with the queue so neither buffer is reallocated, and the index of its next job. A job that waits in place
    /// (``wait(socket:events:)`` from a receive) must not block while jobs of its own batch are still to run: they
    /// are no longer in the queue, and one of them may be the send that the awaited reply depends on.
    private nonisolated(unsafe) var batch: (jobs: [UnownedJob], next: Int) = ([], 0)

    /// Runs every queued job, including those the jobs enqueue.
    func runJobs() {
        while true {
            state.withLock { swap(&batch.jobs, &$0.jobs) }
            if batch.jobs.isEmpty { return }
            batch.next = 0
            while batch.next < batch.jobs.count {
                let job = batch.jobs[batch.next]
                batch.next += 1
                job.runSynchronously(on: asUnownedTaskExecutor())
            }
            batch.jobs.removeAll(keepingCapacity: true)
            batch.next = 0
        }
    }

    /// Waits until `socket` has `events` (`socket` < 0: only for jobs or ``wake()``), or a job comes. Returns the
    /// socket's revents (0 when woken for something else).
    func wait(socket: Int32, events: Int16) throws(ConnectionError) -> Int16 {
        if batch.next < batch.jobs.count { return 0 }  // jobs of the batch being run come first
        let wakeFD: Int32? = state.withLock { state in
            guard state.jobs.isEmpty, !state.wakePending else {
                state.wakePending = false
                return nil
            }
            state.sleeping = true
            return state.wakeFD
        }
        guard let wakeFD else { return 0 }
        let (revents, woken) = try Syscall.poll(socket, events, wakeFD, Syscall.pollIn)
        state.withLock { $0.sleeping = false }
        if woken != 0 { Syscall.eventFDDrain(wakeFD) }
        return revents
    }

    /// The reader thread ends: queued and later jobs go to Swift's global executor.
    func stop() {
        readerThread.store(0, ordering: .relaxed)
        let (jobs, fd): ([UnownedJob], Int32) = state.withLock { state in
            defer {
                state.jobs = []
                state.wakeFD = -1
            }
            return (state.jobs, state.wakeFD)
        }
        if fd >= 0 { Syscall.close(fd) }
        for job in jobs { globalConcurrentExecutor.enqueue(ExecutorJob(job)) }
    }
}
