import Synchronization

/// A FIFO async lock for backends and transports: one holder at a time, waiters admitted in arrival order,
/// without blocking a thread. Uncontended it costs one lock. Used to serve concurrent receives in call order
/// and to keep concurrent sends whole and in order.
///
/// Noncopyable, stored in the object it guards: a class of its own would be one more allocation for every
/// connection (two over WebSocket and TLS, which hold a send and a receive gate).
public struct AsyncGate: ~Copyable, Sendable {
    // Internal, not private: a private type nested in a noncopyable struct crashes the compiler in debug builds
    // (Swift 6.3: "Global is external, but doesn't have external or weak linkage").
    struct State {
        var busy = false
        var waiters: [CheckedContinuation<Void, Never>] = []
    }
    private let state = Guarded(State())

    public init() {}

    /// Waits until the gate is free, then holds it.
    ///
    /// On a hot path write `if !gate.tryEnter() { await gate.enter() }`: a call to an `async` function costs
    /// an executor check in the runtime at entry and after it returns, even when it does not suspend (measured
    /// on the async backend: two of its eight per round trip); `tryEnter()` is a plain call.
    public func enter() async {
        if tryEnter() { return }
        await withCheckedContinuation { continuation in
            let now: Bool = state.withLock { state in
                if !state.busy {
                    state.busy = true
                    return true
                }
                state.waiters.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Enters when the gate is free, without waiting; `false` when someone holds it.
    public func tryEnter() -> Bool {
        state.withLock { state in
            if state.busy { return false }
            state.busy = true
            return true
        }
    }

    /// Releases the gate to the next waiter, if any.
    public func leave() {
        let next: CheckedContinuation<Void, Never>? = state.withLock { state in
            if state.waiters.isEmpty {
                state.busy = false
                return nil
            }
            return state.waiters.removeFirst()
        }
        next?.resume()
    }
}
