#if SOCKETSTYLES_TSAN
import ConnectionCore
// Under ThreadSanitizer, Mutex is ConnectionCore.SanitizerMutex (see there for why).
typealias Mutex<Value: ~Copyable> = SanitizerMutex<Value>
#endif
