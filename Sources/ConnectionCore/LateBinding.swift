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
