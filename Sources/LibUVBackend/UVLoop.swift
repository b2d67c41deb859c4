internal import CLibUV
@_spi(Loop) public import ConnectionCore
import Glibc
import POSIXSupport
import Synchronization

/// A libuv loop (`uv_loop_t`) running on a thread of its own: the libuv style.
///
/// libuv's rules, kept here:
/// 1. One loop per thread. Handles of this loop are used only on its thread (inside callbacks, or inside blocks
///    given to ``execute(_:)``).
/// 2. No handle is touched from another thread: ``execute(_:)`` queues a block and wakes the loop with it (an
///    eventfd the loop polls; wake-ups coalesce; every queued block runs).
/// 3. A handle's memory is released only in its close callback.
/// 4. ``shutdown()`` stops the loop and `uv_loop_close` must succeed: every handle must have been closed first,
///    otherwise it reports `EBUSY` with the handles still open.
public final class UVLoop: @unchecked Sendable {
    // `@unchecked`: libuv's loop and handle structs are raw pointers; only the loop thread touches them. Other
    // threads only write to `wake`.
    let raw: UnsafeMutablePointer<uv_loop_t>
    /// Wakes the loop from other threads: an eventfd, watched by `wakeup` (a `uv_poll_t`) on the loop thread.
    ///
    /// Not `uv_async_send`: libuv 1.44's sender marks the handle pending, writes the loop's eventfd, then marks it
    /// done, and the woken loop spins (997 `pause`s, then `sched_yield`, over and over) until the sender has done
    /// so. A sender preempted between the two by the loop it woke (a waker on the loop's CPU, such as compare's
    /// open-loop pacer) left the loop spinning: rate-5000 uv tcp sent each message 33 us after its time, 4-5 us for
    /// the other backends, at twice their CPU per message (`perf record` showed the loop thread in that spin).
    /// An eventfd write has no second step to wait for.
    private let wake: WakeEvent
    private let wakeup: UnsafeMutablePointer<uv_poll_t>
    /// Run the work queued on the loop thread itself after the callbacks of each poll (`uv_check_t`), and
    /// everything queued before the loop waits (`uv_prepare_t`, which also tells the queue the loop is about to
    /// sleep); unreferenced, so they never keep the loop alive.
    private let prepare: UnsafeMutablePointer<uv_prepare_t>
    private let check: UnsafeMutablePointer<uv_check_t>
    /// Blocks and jobs for the loop thread: the package's one loop work queue, woken through `wake` (only while
    /// the loop sleeps in its poll). Closed on the loop thread just before the wake-up handle is: later work is
    /// dropped, and no signal is in flight once it has closed, so the eventfd is closed after the loop ends.
    private let work: LoopWorkQueue
    /// Whether a read callback has run the loop's work since the last poll (`runCallbackWork()`).
    private let ranCallbackWork: LoopConfined<Bool>
    private let state = Guarded(LoopState())
    /// The thread's name, for `top -H` and debuggers.
    public let name: String

    private struct LoopState {
        var stopping = false
        var finished: Result<Void, ConnectionError>?
        var waiters: [CheckedContinuation<Result<Void, ConnectionError>, Never>] = []
    }

    /// Creates a loop and starts its thread.
    public init(name: String = "uv-loop") throws(ConnectionError) {
        self.name = name
        let wake = try WakeEvent()
        self.wake = wake
        raw = .allocate(capacity: 1)
        wakeup = .allocate(capacity: 1)
        work = LoopWorkQueue(signal: { wake.signal() })
        ranCallbackWork = LoopConfined(false, on: work.thread)
        prepare = .allocate(capacity: 1)
        check = .allocate(capacity: 1)
        var failed: (status: Int32, call: String)?
        if case let status = uv_loop_init(raw), status != 0 {
            failed = (status, "uv_loop_init")
        } else if case let status = wake.ifOpen({ uv_poll_init(raw, wakeup, $0.number) }) ?? -EBADF, status != 0 {
            uv_loop_close(raw)
            failed = (status, "uv_poll_init")
        }
        if let failed {
            wake.close()
            raw.deallocate()
            wakeup.deallocate()
            prepare.deallocate()
            check.deallocate()
            throw UVError(failed.status).connectionError(failed.call)
        }
        csuv_reserve_emfile_fd(raw)
        uv_handle_set_data(csuv_handle(wakeup), Unmanaged.passUnretained(self).toOpaque())
        uv_poll_start(wakeup, Int32(UV_READABLE.rawValue), uvLoopWakeup)
        uv_prepare_init(raw, prepare)
        uv_check_init(raw, check)
        uv_handle_set_data(csuv_handle(prepare), Unmanaged.passUnretained(self).toOpaque())
        uv_handle_set_data(csuv_handle(check), Unmanaged.passUnretained(self).toOpaque())
        uv_prepare_start(prepare, uvLoopPrepare)
        uv_check_start(check, uvLoopCheck)
        uv_unref(csuv_handle(prepare))
        uv_unref(csuv_handle(check))
        PosixThread.spawnAndWait(name: name, started: { [work] in work.bindToCurrentThread() }) { [self] in run() }
    }

    deinit {
        raw.deallocate()
        wakeup.deallocate()
        prepare.deallocate()
        check.deallocate()
    }

    /// `true` when called on this loop's thread.
    public var isOnLoopThread: Bool { work.isLoopThread }

    /// Loop thread: the loop's turn, which changes each time it is about to poll (sends of one connection in one
    /// turn gather: `WriteThrough`).
    var turn: UInt32 { work.turn }

    /// Loop thread: runs `block` once, before the loop next polls (in its `uv_prepare_t`).
    func beforeSleep(_ block: @escaping () -> Void) { work.beforeSleep(block) }

    /// The loop's thread, for state that only its callbacks touch (`LoopConfined`).
    package var thread: LoopThread { work.thread }

    /// Runs `block` on the loop thread, soon (from any thread: an eventfd write). Once ``shutdown()`` has
    /// closed the wake-up handle, blocks are dropped.
    public func execute(_ block: @escaping @Sendable () -> Void) {
        work.add(.block(block))
    }

    /// Runs `block` at once when called on the loop thread (inside a callback or a job of a task that prefers
    /// this loop), otherwise like ``execute(_:)``. For the hot paths (send): no wake-up when there is no thread
    /// to cross.
    public func executeHere(_ block: @escaping @Sendable () -> Void) {
        if isOnLoopThread { block() } else { execute(block) }
    }

    /// Runs the queued work, including what it queues (loop thread).
    fileprivate func drain() {
        work.runAll(jobsAs: asUnownedTaskExecutor())
    }

    /// Before the loop polls: runs everything queued, until the queue agrees that the loop may sleep.
    fileprivate func beforePoll() {
        repeat { drain() } while !work.prepareToSleep()
    }

    /// After the poll (and in the wake-up callback): adds stop signalling; runs what the callbacks queued.
    fileprivate func afterPoll() {
        ranCallbackWork.withValue { $0 = false }
        work.awoke()
        drain()
    }

    /// Inside a read callback: runs at once the work the delivered data queued (the task it resumed, on this
    /// loop), rather than after the poll's other callbacks. libuv reads a UDP socket again after every datagram
    /// until the read would block, so a task left for the check handle answered one system call later: that
    /// read sat between a datagram's arrival and its echo. `sockbench serve udp://127.0.0.1:0 --backend uv --cpu 1`
    /// under a C ping client on the same CPU: p50 round trip 14.9 us before, 13.5 after (the C floor's server:
    /// 11.5).
    ///
    /// Once per poll: the first datagram or read of a poll's callbacks is answered at once, and what the later ones
    /// resume runs after the callbacks, as before. Run after every datagram, a flooded UDP sink resumed and
    /// suspended its task once per datagram instead of once per batch of up to 32 (`compare --scenarios pump-1400
    /// --transports udp`: uv's goodput 1.40x the C floor's, against 2.0-2.1x for bsd, runloop and async).
    func runCallbackWork() {
        guard work.hasUnrunWork, !ranCallbackWork.withValue({ $0 }) else { return }
        afterPoll()
        ranCallbackWork.withValue { $0 = true }
    }

    /// The wake-up eventfd is readable: reads it back to 0, then as ``afterPoll()``.
    fileprivate func woken() {
        wake.drain()
        afterPoll()
    }

    private func run() {
        uv_run(raw, UV_RUN_DEFAULT)
        drain()
        // uv_run returns when no handle is active any more; a handle that is open but idle (not reading, not
        // connecting) does not keep it turning, and uv_loop_close then fails with EBUSY. Report that (it is a
        // leak in the caller), but still close what is left so the loop's own descriptors are released.
        var status = uv_loop_close(raw)
        var leftOpen: [String] = []
        if status != 0 {
            leftOpen = Self.openHandles(raw)
            uv_walk(raw, uvWalkClose, nil)
            uv_run(raw, UV_RUN_DEFAULT)
            status = uv_loop_close(raw)
        }
        // The queue closed before the wake-up handle did, and waited for signals already decided: nothing writes to
        // the eventfd any more, and libuv no longer watches it.
        wake.close()
        let result: Result<Void, ConnectionError>
        if leftOpen.isEmpty && status == 0 {
            result = .success(())
        } else {
            let what = leftOpen.isEmpty ? "" : " (left open: \(leftOpen.joined(separator: ", ")))"
            result = .failure(UVError(-EBUSY).connectionError("uv_loop_close\(what)"))
        }
        let waiters = state.withLock { state in
            state.finished = result
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters { waiter.resume(returning: result) }
    }

    /// Stops the loop once the handles it serves are closed, closes it with `uv_loop_close`, and ends its
    /// thread. Throws when a handle was left open (libuv's `EBUSY`), naming the handle types; those handles are
    /// then closed so that the loop's own descriptors are still released.
    public func shutdown() async throws(ConnectionError) {
        let result = await withCheckedContinuation { continuation in
            let done: Result<Void, ConnectionError>? = state.withLock { state in
                if let finished = state.finished { return finished }
                state.waiters.append(continuation)
                let first = !state.stopping
                state.stopping = true
                if first {
                    execute { [self] in
                        // The wake-up handle is the last one this loop owns: once it is closed, uv_run returns
                        // as soon as the other handles are closed too.
                        drain()
                        for item in work.close() ?? [] { item.run(as: asUnownedTaskExecutor()) }
                        uv_close(csuv_handle(wakeup), nil)
                        uv_close(csuv_handle(prepare), nil)
                        uv_close(csuv_handle(check), nil)
                    }
                }
                return nil
            }
            if let done { continuation.resume(returning: done) }
        }
        try result.get()
    }

    /// The types of the handles still open on a loop (for the EBUSY report).
    static func openHandles(_ loop: UnsafeMutablePointer<uv_loop_t>) -> [String] {
        let collector = HandleNameCollector()
        uv_walk(loop, uvWalkCollect, Unmanaged.passUnretained(collector).toOpaque())
        return collector.names
    }
}

private let uvLoopWakeup: @convention(c) (UnsafeMutablePointer<uv_poll_t>?, Int32, Int32) -> Void = {
    handle, _, _ in
    Unmanaged<UVLoop>.fromOpaque(uv_handle_get_data(csuv_handle(handle!))).takeUnretainedValue().woken()
}

private let uvLoopPrepare: @convention(c) (UnsafeMutablePointer<uv_prepare_t>?) -> Void = { handle in
    Unmanaged<UVLoop>.fromOpaque(uv_handle_get_data(csuv_handle(handle!))).takeUnretainedValue().beforePoll()
}

private let uvLoopCheck: @convention(c) (UnsafeMutablePointer<uv_check_t>?) -> Void = { handle in
    Unmanaged<UVLoop>.fromOpaque(uv_handle_get_data(csuv_handle(handle!))).takeUnretainedValue().afterPoll()
}

private let uvWalkClose: @convention(c) (UnsafeMutablePointer<uv_handle_t>?, UnsafeMutableRawPointer?) -> Void = {
    handle, _ in
    if uv_is_closing(handle) == 0 {
        // A Swift-owned handle closes through its object, so its memory is released in the close callback.
        if let data = uv_handle_get_data(handle),
            let object = Unmanaged<AnyObject>.fromOpaque(data).takeUnretainedValue() as? UVHandle
        {
            object.close()
        } else {
            uv_close(handle, nil)
        }
    }
}

/// Collects the type names of open handles (for the EBUSY report).
final class HandleNameCollector {
    var names: [String] = []
}

private let uvWalkCollect: @convention(c) (UnsafeMutablePointer<uv_handle_t>?, UnsafeMutableRawPointer?) -> Void = {
    handle, context in
    let collector = Unmanaged<HandleNameCollector>.fromOpaque(context!).takeUnretainedValue()
    let type = uv_handle_get_type(handle)
    collector.names.append(
        String(cString: uv_handle_type_name(type)) + (uv_is_closing(handle) != 0 ? " (closing)" : ""))
}

extension LibUVBackend {
    /// The libuv library in use, e.g. "1.44.2" (for reports).
    public static var libraryVersion: String { String(cString: uv_version_string()) }
}

/// The loop as a `TaskExecutor`: a task that prefers it (`withTaskExecutorPreference(loop)`, or a connection's
/// ``Connection/preferredExecutor``) runs on the loop thread, so a read callback that resumes it needs no thread hop
/// and its sends go straight to `uv_try_write`. A job enqueued from another thread goes through the same queue as
/// ``execute(_:)`` (one eventfd write, coalesced). A job enqueued on the loop thread itself (the common case: a read
/// callback resumes a waiting receive) is kept in a loop-local queue that the read callback runs as it returns
/// (`runCallbackWork()`), a `uv_check_t` right after the callbacks of the same poll, and a `uv_prepare_t` before the
/// loop next waits: no eventfd write, no extra turn of the loop. A job never runs inside `enqueue`. Jobs enqueued after
/// ``shutdown()`` has closed the wake-up handle are dropped, like blocks: shut a loop down only once no task uses it.
extension UVLoop: TaskExecutor {
    public func enqueue(_ job: consuming ExecutorJob) {
        work.add(.job(UnownedJob(job)))
    }
}
