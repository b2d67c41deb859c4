#if SOCKETSTYLES_TSAN
// Under ThreadSanitizer, Mutex is ConnectionCore.SanitizerMutex (see there for why).
@usableFromInline typealias Mutex<Value: ~Copyable> = SanitizerMutex<Value>
#endif
