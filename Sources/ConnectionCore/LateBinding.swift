import Synchronization

/// A value that a closure needs but that exists only after the closure is made: a listener's callback that needs
/// the listener's bound address, a receive queue's callback made in an initializer that needs the object being
/// initialized. Set, read any number of times, from any thread.
package final class Late<Value: Sendable>: Sendable {
    private let cell = Guarded<Value?>(nil)

    package init() {}

    /// Sets the value.
    package func set(_ value: Value) { cell.withLock { $0 = value } }

    /// Back to `nil` (for a value handed over again and again).
    package func clear() { cell.withLock { $0 = nil } }

    /// The value, `nil` until set.
    package var value: Value? { cell.withLock { $0 } }
}

/// A weak reference set after the closure holding it is made (an initializer's callback that must not keep the
/// object alive).
package final class WeakLate<Object: AnyObject & Sendable>: Sendable {
    private struct Weak: Sendable {
        weak let object: Object?
    }
    private let cell = Guarded(Weak(object: nil))

    package init() {}

    /// Points at `object`, weakly.
    package func set(_ object: Object) { cell.withLock { $0 = Weak(object: object) } }

    /// The object, while it lives.
    package var object: Object? { cell.withLock { $0.object } }
}
