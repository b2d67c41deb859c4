internal import CSocketShims
public import ConnectionCore
internal import Glibc
import Synchronization

/// Starts detached POSIX threads for backends whose style needs threads of their own (blocking sockets, event
/// loops). Swift's cooperative pool never runs a blocking call of ours.
public enum PosixThread {
    private final class Start {
        let name: String
        let body: @Sendable () -> Void
        init(name: String, body: @escaping @Sendable () -> Void) {
            self.name = name
            self.body = body
        }
    }

    /// Starts a detached thread running `body`. The name (at most 15 bytes are kept) shows in `top -H` and gdb.
    /// Terminates the process if the system cannot create a thread: for a loop a backend cannot run without. A
    /// thread per connection uses ``trySpawn(name:stackSize:_:)`` and fails that connection instead.
    public static func spawn(name: String, stackSize: Int = 512 * 1024, _ body: @escaping @Sendable () -> Void) {
        let result = trySpawn(name: name, stackSize: stackSize, body)
        precondition(result == nil, "pthread_create failed: \(result.map(String.init(describing:)) ?? "")")
    }

    /// Starts a detached thread running `body`; when the system cannot create one (EAGAIN: the process's or the
    /// system's thread or memory limits), returns that as a `.resourceExhausted` error and `body` never runs.
    public static func trySpawn(
        name: String, stackSize: Int = 512 * 1024, _ body: @escaping @Sendable () -> Void
    ) -> ConnectionError? {
        let start = Unmanaged.passRetained(Start(name: name, body: body))
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
        pthread_attr_setstacksize(&attributes, stackSize)
        var thread = pthread_t()
        let result = pthread_create(&thread, &attributes, threadEntry, start.toOpaque())
        pthread_attr_destroy(&attributes)
        guard result != 0 else { return nil }
        start.release()
        return ConnectionError(
            .resourceExhausted, "no thread for \(name): pthread_create: \(String(cString: strerror(result)))",
            systemCode: .init(domain: "errno", code: result, name: result == EAGAIN ? "EAGAIN" : "errno \(result)"))
    }

    /// Starts a thread that runs `started`, then `body`, and returns (blocking the caller) once `started` has run:
    /// a loop thread binds itself to what it owns before anyone may hand it work.
    public static func spawnAndWait(
        name: String, started: @escaping @Sendable () -> Void, _ body: @escaping @Sendable () -> Void
    ) {
        let latch = Latch()
        spawn(name: name) {
            started()
            latch.open()
            body()
        }
        latch.wait()
    }

    /// Starts a thread running `body` and waits, without blocking, until `body` calls `deliver` (once) with the
    /// result; the thread may go on working after it (a blocking connect's thread becomes the reader). When no
    /// thread can be created, the result is that error (``trySpawn(name:stackSize:_:)``) and `body` never runs.
    ///
    /// The hand-off is ordered by an atomic besides the continuation (``awaitHandOff(_:)``): when the thread resumes
    /// before the task has suspended, the concurrency runtime orders the two with atomics ThreadSanitizer cannot see
    /// (its runtime is not instrumented), so without it every object the thread built would be reported as a race.
    public static func spawnAndAwait<Success: Sendable>(
        name: String,
        _ body: @escaping @Sendable (_ deliver: @Sendable (Result<Success, ConnectionError>) -> Void) -> Void
    ) async -> Result<Success, ConnectionError> {
        await awaitHandOff { deliver in
            if let error = trySpawn(name: name, { body(deliver) }) { deliver(.failure(error)) }
        }
    }

    fileprivate static func run(_ raw: UnsafeMutableRawPointer) {
        let start = Unmanaged<Start>.fromOpaque(raw).takeRetainedValue()
        csock_set_thread_name(start.name)
        start.body()
    }
}

private let threadEntry: @convention(c) (UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? = { raw in
    PosixThread.run(raw!)
    return nil
}

/// A mutex with a condition variable, for threads that must sleep until told (a blocked reader waiting for
/// room in its queue, a writer thread waiting for work). Not for async code: it blocks the calling thread.
///
/// It guards `State` as `Mutex` does (reached only inside `withLock(_:)`), so an object whose threads share
/// state under it needs no `@unchecked Sendable` of its own; `ConditionLock()` guards nothing, for callers whose
/// condition lives elsewhere.
public final class ConditionLock<State>: @unchecked Sendable {
    // `@unchecked`: the pthread objects are pointers, and `state` is touched only with the mutex held.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let condition: UnsafeMutablePointer<pthread_cond_t>
    private var state: State

    /// Creates an unlocked lock guarding `state`.
    public init(_ state: State) {
        self.state = state
        mutex = .allocate(capacity: 1)
        condition = .allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(condition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    deinit {
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        condition.deallocate()
        mutex.deallocate()
    }

    /// Runs `body` on the state, holding the mutex.
    public func withLock<R, E: Error>(_ body: (inout State) throws(E) -> R) throws(E) -> R {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&state)
    }

    /// Holding the mutex, sleeps (releasing it while asleep) until `predicate` holds, then runs `body`.
    public func withLock<R>(waitingUntil predicate: (State) -> Bool, _ body: (inout State) -> R) -> R {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        while !predicate(state) { pthread_cond_wait(condition, mutex) }
        return body(&state)
    }

    /// Wakes every waiting thread. Call from inside `withLock(_:)`.
    public func broadcast() {
        pthread_cond_broadcast(condition)
    }

    /// Wakes one waiting thread. Call from inside `withLock(_:)`.
    public func signal() {
        pthread_cond_signal(condition)
    }
}

extension ConditionLock where State == Void {
    /// A lock guarding no state: its callers keep their condition elsewhere.
    public convenience init() { self.init(()) }

    /// Runs `body` holding the mutex. No access to the (empty) state is open while it runs, so `body` may
    /// `wait(until:)`, which releases the mutex while asleep (a wait inside a state's access would let another
    /// thread in while the access is still open: an exclusivity violation, which ThreadSanitizer reports).
    public func withLock<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body()
    }

    /// Waits (holding the mutex, which is released while asleep) until `predicate` holds.
    /// Call only from inside `withLock(_:)`. A lock with a state waits with `withLock(waitingUntil:_:)`.
    public func wait(until predicate: () -> Bool) {
        while !predicate() { pthread_cond_wait(condition, mutex) }
    }

    /// Waits like `wait(until:)` but for at most `timeout`; returns whether `predicate` holds.
    /// Call only from inside `withLock(_:)`.
    public func wait(until predicate: () -> Bool, timeout: Duration) -> Bool {
        let deadline = MonotonicClock.nanoseconds() &+ timeout.wholeNanoseconds
        var limit = timespec(tv_sec: Int(deadline / 1_000_000_000), tv_nsec: Int(deadline % 1_000_000_000))
        while !predicate() {
            if pthread_cond_timedwait(condition, mutex, &limit) == ETIMEDOUT { return predicate() }
        }
        return true
    }
}

/// A gate threads wait at until some thread opens it, once; it stays open.
public final class Latch: Sendable {
    private let condition = ConditionLock()
    private let opened = Atomic<Bool>(false)

    /// A closed latch.
    public init() {}

    /// Opens it and wakes every waiting thread.
    public func open() {
        condition.withLock {
            opened.store(true, ordering: .relaxed)
            condition.broadcast()
        }
    }

    /// Whether it is open.
    public var isOpen: Bool { opened.load(ordering: .relaxed) }

    /// Blocks the calling thread until the latch is open.
    public func wait() {
        condition.withLock { condition.wait(until: { opened.load(ordering: .relaxed) }) }
    }
}

/// A monotonic clock in nanoseconds (CLOCK_MONOTONIC), for measurements that must not jump.
public enum MonotonicClock {
    /// Nanoseconds since an arbitrary fixed point.
    @inline(__always)
    public static func nanoseconds() -> UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return UInt64(now.tv_sec) &* 1_000_000_000 &+ UInt64(now.tv_nsec)
    }
}

extension PosixThread {
    /// The calling thread's identity (`pthread_self()`), never 0: for a loop or reader thread to record itself and
    /// for code to ask "am I on it?" with one atomic load.
    @inline(__always)
    public static var currentID: UInt { UInt(pthread_self()) }
}

/// Runs `handler` (on a thread of its own, not inside a signal handler) when SIGINT or SIGTERM arrives. The
/// signal handler only writes to a self-pipe; a thread reading the pipe calls `handler` with the signal number.
/// Installed once per process; later calls replace the handler.
public enum SignalForwarder {
    /// In a struct, not bare in the lock: see docs/architecture.md, "Function values in generic boxes".
    private struct Handler: Sendable {
        let call: @Sendable (Int32) -> Void
    }
    private static let handler = Guarded<Handler?>(nil)
    private static let installed = Guarded(false)

    public static func install(_ body: @escaping @Sendable (Int32) -> Void) {
        handler.withLock { $0 = Handler(call: body) }
        let first = installed.withLock { installed in
            defer { installed = true }
            return !installed
        }
        guard first else { return }
        var fds: [Int32] = [0, 0]
        guard csock_pipe_cloexec(&fds) == 0 else { return }
        let (readEnd, writeEnd) = (fds[0], fds[1])
        _ = csock_forward_signals_to(writeEnd)
        PosixThread.spawn(name: "signals") {
            var byte: UInt8 = 0
            while read(readEnd, &byte, 1) == 1 || errno == EINTR {
                handler.withLock { $0 }?.call(Int32(byte))
            }
        }
    }
}
