import ConnectionCore
import Synchronization

/// Counts the users of a descriptor that outlive a single system call (bsd: the owner, a reader thread, a writer
/// thread; uring's UDP server: the owner and each reply in flight) and closes it when the last one is done, so
/// the owner's `close()` can await ``closed()`` and return only once the descriptor is closed: a test that counts
/// descriptors, or a caller that opens the next socket, then finds it gone. (A ``SocketDescriptor`` borrowed
/// while it closes already defers its `close(2)` to the borrower; this is what lets its owner wait for that.)
package final class DescriptorLease: Sendable {
    private struct State {
        var users = 1
        var waiters: [CheckedContinuation<Void, Never>] = []
    }
    private let state = Guarded(State())
    private let close: @Sendable () -> Void

    /// The owner is the first user; the last one's ``release()`` runs `close`.
    package init(closing close: @escaping @Sendable () -> Void) { self.close = close }

    /// Adds a user; `false` when the descriptor is already closed.
    package func retain() -> Bool {
        state.withLock { state in
            guard state.users > 0 else { return false }
            state.users += 1
            return true
        }
    }

    /// Drops a user; the last one closes the descriptor and wakes every ``closed()`` waiter.
    package func release() {
        let waiters: [CheckedContinuation<Void, Never>]? = state.withLock { state in
            state.users -= 1
            guard state.users == 0 else { return nil }
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        guard let waiters else { return }
        close()
        for waiter in waiters { waiter.resume() }
    }

    /// Returns once the descriptor is closed.
    package func closed() async {
        await withCheckedContinuation { continuation in
            let done: Bool = state.withLock { state in
                if state.users == 0 { return true }
                state.waiters.append(continuation)
                return false
            }
            if done { continuation.resume() }
        }
    }
}
