internal import CLibUV
public import ConnectionCore
import Glibc
import POSIXSupport
import Synchronization

/// A libuv loop (`uv_loop_t`) running on a thread of its own: the libuv style.
///
/// libuv's rules, kept here:
/// 1. One loop per thread. Handles of this loop are used only on its thread (inside callbacks, or inside blocks
///    given to ``execute(_:)``).
/// 2. The only thread-safe call is `uv_async_send`: ``execute(_:)`` queues a block and wakes the loop with it
///    (wake-ups coalesce; every queued block runs).
/// 3. A handle's memory is released only in its close callback.
/// 4. ``shutdown()`` stops the loop and `uv_loop_close` must succeed: every handle must have been closed first,
///    otherwise it reports `EBUSY` with the handles still open.
public final class UVLoop: @unchecked Sendable {
    let raw: UnsafeMutablePointer<uv_loop_t>
    private let wakeup: UnsafeMutablePointer<uv_async_t>
    private let pending = Mutex<[@Sendable () -> Void]>([])
    private let threadID = Atomic<Int>(0)
    private let state = Mutex(LoopState())
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
        raw = .allocate(capacity: 1)
        wakeup = .allocate(capacity: 1)
        let status = uv_loop_init(raw)
        guard status == 0 else {
            raw.deallocate()
            wakeup.deallocate()
            throw UVError(status).connectionError("uv_loop_init")
        }
        csuv_reserve_emfile_fd(raw)
        uv_async_init(raw, wakeup, uvLoopWakeup)
        uv_handle_set_data(csuv_handle(wakeup), Unmanaged.passUnretained(self).toOpaque())
        let started = ConditionLock()
        nonisolated(unsafe) var ready = false
        PosixThread.spawn(name: name) { [self] in
            started.withLock {
                threadID.store(Self.currentThreadID(), ordering: .releasing)
                ready = true
                started.broadcast()
            }
            run()
        }
        started.withLock { started.wait(until: { ready }) }
    }

    deinit {
        raw.deallocate()
        wakeup.deallocate()
    }

    private static func currentThreadID() -> Int { Int(bitPattern: UInt(pthread_self())) }

    /// `true` when called on this loop's thread.
    public var isOnLoopThread: Bool { threadID.load(ordering: .acquiring) == Self.currentThreadID() }

    /// Runs `block` on the loop thread, soon (from any thread: `uv_async_send`). Blocks queued after
    /// ``shutdown()`` began still run if the loop is still turning; after it ended they are dropped.
    public func execute(_ block: @escaping @Sendable () -> Void) {
        pending.withLock { $0.append(block) }
        uv_async_send(wakeup)
    }

    fileprivate func drain() {
        while true {
            let blocks = pending.withLock { blocks in
                defer { blocks.removeAll(keepingCapacity: true) }
                return blocks
            }
            if blocks.isEmpty { return }
            for block in blocks { block() }
        }
    }

    private func run() {
        uv_run(raw, UV_RUN_DEFAULT)
        drain()
        // Everything is closed (otherwise uv_run would still be turning): close the loop itself.
        var status = uv_loop_close(raw)
        var open: [String] = []
        if status != 0 {
            open = Self.openHandles(raw)
            // Let close callbacks of handles closed during the last drain run, then try once more.
            uv_run(raw, UV_RUN_NOWAIT)
            status = uv_loop_close(raw)
        }
        let result: Result<Void, ConnectionError> =
            status == 0
            ? .success(())
            : .failure(
                UVError(status).connectionError("uv_loop_close (still open: \(open.joined(separator: ", ")))"))
        let waiters = state.withLock { state in
            state.finished = result
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters { waiter.resume(returning: result) }
    }

    /// Stops the loop once the handles it serves are closed, closes it with `uv_loop_close`, and ends its
    /// thread. Throws when `uv_loop_close` failed (a handle was left open: libuv's `EBUSY`).
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
                        uv_close(csuv_handle(wakeup), nil)
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

private let uvLoopWakeup: @convention(c) (UnsafeMutablePointer<uv_async_t>?) -> Void = { handle in
    let loop = Unmanaged<UVLoop>.fromOpaque(uv_handle_get_data(csuv_handle(handle!))).takeUnretainedValue()
    loop.drain()
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
