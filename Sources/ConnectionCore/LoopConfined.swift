// Public imports: the inlinable bodies below read an atomic and call pthread_self().
public import Glibc
public import Synchronization

/// The thread a loop (or a reader) runs on, as the owner of ``LoopConfined`` values: a loop binds it once when
/// its thread starts, and every value confined to that loop checks against it, however many objects hold one.
///
/// `LoopThread` and ``LoopConfined`` are public only to an SPI (`@_spi(Loop)`), not to users: the compiler inlines a
/// `package` declaration's `@inlinable` body into no other module (checked with Swift 6.3.1: a call remains, and for
/// a generic one an unspecialized call), and these run on every turn of every loop.
@_spi(Loop) public final class LoopThread: Sendable {
    @usableFromInline let id = Atomic<UInt>(0)

    package init() {}

    /// Makes the calling thread the owner (the loop or reader thread, as it starts).
    package func bindToCurrentThread() {
        id.store(UInt(pthread_self()), ordering: .releasing)
    }

    /// No owner any more: the thread has ended (what is left may be read by whoever ends the object).
    package func unbind() {
        id.store(0, ordering: .releasing)
    }

    /// `true` on the owning thread.
    @inlinable
    public var isCurrent: Bool {
        id.load(ordering: .acquiring) == UInt(pthread_self())
    }

    /// `true` on the owning thread, or while no thread is bound.
    @usableFromInline
    func allowsCurrentThread() -> Bool {
        let bound = id.load(ordering: .acquiring)
        return bound == 0 || bound == UInt(pthread_self())
    }
}

/// State that one thread owns (a loop's thread, a connection's reader thread) inside an object that other threads
/// share: the package's one way to say "only the loop touches this", in place of an `@unchecked Sendable` on the
/// whole object or a `nonisolated(unsafe)` per variable.
///
/// The owner is a ``LoopThread``: the value's own, bound with ``bindToCurrentThread()``, or a loop's (`on:`), which
/// the loop binds when its thread starts. Before a thread is bound (while the object is being set up, before any
/// other thread can reach it) and after it is unbound, any thread may touch the value. In debug builds every access
/// checks the thread, so a touch from a wrong thread stops the test that makes it instead of racing; release builds
/// check nothing. Accesses are short (`withValue`) and must not nest: run no callback or job inside one, since it
/// may come back to the same value.
@_spi(Loop) public final class LoopConfined<Value>: @unchecked Sendable {
    // The value is stored in the object (a box per connection costs one allocation, not two), with its exclusivity
    // unchecked: every `inout` use of a class's stored property is otherwise checked for exclusive access at run time
    // (swift_beginAccess and a thread-local access set), which the confinement makes redundant.
    @exclusivity(unchecked) @usableFromInline var storage: Value
    /// The thread allowed to touch the value.
    public let owner: LoopThread
    /// Called with the value when this box goes (from whichever thread drops the last reference: no other can
    /// reach the value then), for a value that must be released by hand (a buffer the loop reads into).
    private let release: ((Value) -> Void)?

    /// A value owned by `owner` (by default a thread of its own, bound with ``bindToCurrentThread()``); `release`
    /// runs on it when the box goes.
    package init(_ value: Value, on owner: LoopThread = LoopThread(), release: ((Value) -> Void)? = nil) {
        assert(
            !FunctionValue.isBare(Value.self),
            "LoopConfined<\(Value.self)>: put the function value in a struct (docs/architecture.md, function values)")
        storage = value
        self.owner = owner
        self.release = release
    }

    deinit {
        release?(storage)
    }

    /// Makes the calling thread the owner (the loop or reader thread, as it starts).
    package func bindToCurrentThread() { owner.bindToCurrentThread() }

    /// No owner any more: the thread has ended (what is left may be read by whoever ends the object).
    package func unbind() { owner.unbind() }

    /// `true` on the owning thread.
    @inlinable
    public var isOwnerThread: Bool { owner.isCurrent }

    /// Reads or changes the value; on the owning thread only (or while none is bound).
    @inlinable
    public func withValue<R, E: Error>(_ body: (inout Value) throws(E) -> R) throws(E) -> R {
        assert(owner.allowsCurrentThread(), "loop-confined state touched off its thread")
        return try body(&storage)
    }
}

/// The rule that keeps a stored closure from growing as it is read: a function value kept in a generic box
/// (``LoopConfined``, `Guarded`, `Late`) is a field of a named struct, never the box's type argument itself.
///
/// A generic box holds its value at the most general abstraction; a closure that takes the value `inout` at its
/// concrete function type (`withValue { $0 }`, `withLock { $0 }`) gets a copy wrapped in a reabstraction thunk,
/// and the write-back on return wraps that in a thunk going the other way. The box then holds a closure one thunk
/// pair deeper than before, every read deepens it again, and a call runs through all of them: the runloop
/// listener's accept handler, read once per accepted connection, overflowed its thread's stack at the 6,461st
/// connection (Swift 6.3.1, release build). A struct field keeps the function at its own abstraction, so
/// passing the struct `inout` converts nothing.
package enum FunctionValue {
    /// `true` when `type` is a function type, or an optional or tuple holding one at its top level (what must not
    /// be a generic box's type argument). Decided by the type's name, for debug-build checks.
    package static func isBare(_ type: Any.Type) -> Bool {
        var name = Substring(String(reflecting: type))
        while name.hasPrefix("Swift.Optional<") { name = name.dropFirst("Swift.Optional<".count) }
        // A nominal type's name is qualified by its module ("Swift.Array<() -> ()>" holds a function but is not
        // one); a function's starts with its parameters or its attributes ("nonisolated(nonsending) @Sendable ...").
        let word = name.prefix { $0.isLetter || $0.isNumber || $0 == "_" }
        let nominal = !word.isEmpty && name.dropFirst(word.count).first == "."
        return !nominal && name.contains("->")
    }
}
