import Glibc
package import Synchronization

/// State that one thread owns (a loop's thread, a connection's reader thread) inside an object that other threads
/// share: the package's one way to say "only the loop touches this", in place of an `@unchecked Sendable` on the
/// whole object or a `nonisolated(unsafe)` per variable.
///
/// The owner binds itself with ``bindToCurrentThread()`` when its thread starts; before that (while the object is
/// being set up, before any other thread can reach it) any thread may touch the value. In debug builds every access
/// checks the thread, so a touch from a wrong thread stops the test that makes it instead of racing; release builds
/// check nothing. Accesses are short (`withValue`) and must not nest: run no callback or job inside one, since it
/// may come back to the same value.
package final class LoopConfined<Value>: @unchecked Sendable {
    // Inlinable, so the loops in other modules touch their state without a generic call per access.
    @usableFromInline var value: Value
    @usableFromInline let owner = Atomic<UInt>(0)

    package init(_ value: Value) {
        self.value = value
    }

    /// Makes the calling thread the owner (the loop or reader thread, as it starts).
    package func bindToCurrentThread() {
        owner.store(UInt(pthread_self()), ordering: .releasing)
    }

    /// No owner any more: the thread has ended (what is left may be read by whoever ends the object).
    package func unbind() {
        owner.store(0, ordering: .releasing)
    }

    /// `true` on the owning thread.
    @inlinable
    package var isOwnerThread: Bool {
        owner.load(ordering: .acquiring) == UInt(pthread_self())
    }

    @usableFromInline
    func bindingAllows() -> Bool {
        let bound = owner.load(ordering: .acquiring)
        return bound == 0 || bound == UInt(pthread_self())
    }

    /// Reads or changes the value; on the owning thread only (or before one is bound).
    @inlinable
    package func withValue<R, E: Error>(_ body: (inout Value) throws(E) -> R) throws(E) -> R {
        assert(bindingAllows(), "loop-confined state touched off its thread")
        return try body(&value)
    }
}
