@_spi(Loop) import ConnectionCore
import POSIXSupport
import Synchronization

/// A connection's reader thread as a `TaskExecutor` (its ``Connection/preferredExecutor``): a task that prefers
/// it runs on the reader thread, so the receive that thread completes continues right there, instead of waking a
/// thread of Swift's pool for every message (the hop that made a `bsd` round trip through `Connection` cost two
/// extra context switches on each end).
///
/// The reader waits in poll(2) on its socket alone; a job enqueued from another thread wakes it with a signal sent
/// to that thread (``ThreadWake``: no descriptor, so a connection costs one, its socket), a job enqueued on the
/// reader thread just queues. Once the reader thread ends (end of stream, error, close), jobs, queued and new, go
/// to Swift's global executor.
final class ReaderExecutor: TaskExecutor, Sendable {
    private let waker: ThreadWake
    private let work: LoopWorkQueue

    init() {
        let waker = ThreadWake()
        self.waker = waker
        work = LoopWorkQueue(signal: { waker.signal() })
    }

    /// An executor whose reader never started (made for a connection that did not come) closes its queue here.
    deinit {
        _ = work.close()
    }

    func enqueue(_ job: consuming ExecutorJob) { work.enqueue(UnownedJob(job)) }

    /// Wakes the reader from any thread (a close, or room in the receive queue).
    func wake() { work.wake() }

    /// `true` on the reader thread: a task running here may read the socket itself, since the reader is not in
    /// the middle of a read (it is running this task's job).
    var isCurrent: Bool { work.isLoopThread }

    /// Reader thread: the loop's turn, which changes each time it is about to wait (TCP sends of one turn gather:
    /// ``BSDWriter``).
    var turn: UInt32 { work.turn }

    /// Reader thread: runs `block` once, before the reader next waits.
    func beforeSleep(_ block: @escaping () -> Void) { work.beforeSleep(block) }

    /// The reader thread, for state only it touches (`LoopConfined`).
    var thread: LoopThread { work.thread }

    // MARK: On the reader thread

    /// Records the calling thread as the reader (at the start of its loop).
    func bindReaderThread() {
        waker.bindToCurrentThread()
        work.bindToCurrentThread()
    }

    /// Runs every queued job, including those the jobs enqueue.
    func runJobs() { work.runAll(jobsAs: asUnownedTaskExecutor()) }

    /// Waits until `socket` has `events`, or a job comes. Returns the socket's revents (0 when woken for something
    /// else, or at once while jobs the reader took are still to run: a receive waiting in place must not block the
    /// send beside it that its reply depends on).
    func wait(socket: borrowing BorrowedDescriptor, events: Int16) throws(ConnectionError) -> Int16 {
        try sleeping { () throws(ConnectionError) in try waker.poll(socket, events: events) }
    }

    /// Waits until a job comes or ``wake()`` is called (the reader does not read: its receive queue is full).
    func waitForJobs() throws(ConnectionError) {
        _ = try sleeping { () throws(ConnectionError) in
            try waker.waitForSignal()
            return 0
        }
    }

    /// The work queue told the thread sleeps (unless jobs came meanwhile: 0 at once), then `poll`, then woken.
    @inline(__always)
    private func sleeping(_ poll: () throws(ConnectionError) -> Int16) throws(ConnectionError) -> Int16 {
        waker.bindToCurrentThread()
        guard work.prepareToSleep() else { return 0 }
        let polled = Result { () throws(ConnectionError) in try poll() }
        work.awoke()
        return try polled.get()
    }

    /// The reader thread ends: queued and later jobs go to Swift's global executor. No wake-up is in flight once
    /// the queue has ended, so none reaches the thread after it has gone.
    func stop() {
        work.end()
        waker.unbind()
    }
}
