public import Synchronization

// The package's one lock type, defined once. `Synchronization.Mutex` in a normal build; under ThreadSanitizer
// (`scripts/sanitize thread` builds with -DSOCKETSTYLES_TSAN) `SanitizerMutex`, which TSan can see (see there
// for why). Every module of the package writes `Guarded(value)` and `withLock`, and imports ConnectionCore for it.
// (Until session 21 each of fifteen modules declared its own `typealias Mutex` under the flag, to shadow the
// standard library's; a package-level alias cannot shadow it: `Mutex(0)` is then ambiguous.)
#if SOCKETSTYLES_TSAN
@usableFromInline package typealias Guarded<Value: ~Copyable> = SanitizerMutex<Value>
#else
@usableFromInline package typealias Guarded<Value: ~Copyable> = Synchronization.Mutex<Value>
#endif
