#if SOCKETSTYLES_TSAN
import Glibc
import Synchronization

/// `Synchronization.Mutex` as ThreadSanitizer can see it. The standard library's Mutex locks with futex
/// system calls inside the precompiled Synchronization module, which TSan does not instrument, so under TSan
/// every access it guards is reported as a race. Built with `-DSOCKETSTYLES_TSAN` (`scripts/sanitize thread`),
/// the package's lock type ``Guarded`` is this one, so the whole package locks a `pthread_mutex_t`, whose lock
/// and unlock TSan intercepts. Same API as the parts of `Synchronization.Mutex` the package uses.
public struct SanitizerMutex<Value: ~Copyable>: ~Copyable, @unchecked Sendable {
    private let lock: UnsafeMutablePointer<pthread_mutex_t>
    private let value: UnsafeMutablePointer<Value>

    public init(_ initialValue: consuming sending Value) {
        lock = .allocate(capacity: 1)
        pthread_mutex_init(lock, nil)
        value = .allocate(capacity: 1)
        value.initialize(to: initialValue)
    }

    deinit {
        value.deinitialize(count: 1)
        value.deallocate()
        pthread_mutex_destroy(lock)
        lock.deallocate()
    }

    public borrowing func withLock<Result: ~Copyable, E: Error>(
        _ body: (inout sending Value) throws(E) -> sending Result
    ) throws(E) -> sending Result {
        pthread_mutex_lock(lock)
        defer { pthread_mutex_unlock(lock) }
        return try body(&value.pointee)
    }

    public borrowing func withLockIfAvailable<Result: ~Copyable, E: Error>(
        _ body: (inout sending Value) throws(E) -> sending Result
    ) throws(E) -> sending Result? {
        guard pthread_mutex_trylock(lock) == 0 else { return nil }
        defer { pthread_mutex_unlock(lock) }
        return try body(&value.pointee)
    }
}
#endif
