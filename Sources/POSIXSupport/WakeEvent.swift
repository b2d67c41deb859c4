package import ConnectionCore

/// A loop's wake-up descriptor and its one owner: an eventfd that other threads write to end the loop's wait
/// (`epoll_wait` for ``EpollLoop``, a read on the ring for the uring loop, libuv's poll for uv's, the pacer's
/// `poll`). Each loop used to make and close its own; here the number is lent like a socket's
/// (``SocketDescriptor``), so a ``signal()`` that races the loop's shutdown writes to nothing rather than to
/// whatever socket was given the number after the close.
package final class WakeEvent: Sendable {
    private let descriptor: SocketDescriptor

    /// eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK).
    package init() throws(ConnectionError) {
        descriptor = try Syscall.eventFD()
    }

    /// Adds 1 to the counter: wakes the loop (from any thread; after ``close()``, nothing).
    package func signal() {
        descriptor.ifOpen { Syscall.eventFDSignal($0) }
    }

    /// Reads the counter back to 0 (the loop, once woken).
    package func drain() {
        descriptor.ifOpen { Syscall.eventFDDrain($0) }
    }

    /// Runs `body` with the number, to hand it to a poller (epoll, libuv, a ring read); `.closed` once closed.
    package func withDescriptor<R>(
        _ body: (borrowing BorrowedDescriptor) throws(ConnectionError) -> R
    ) throws(ConnectionError) -> R {
        try descriptor.withDescriptor(body)
    }

    /// Runs `body` with the number; `nil` once closed.
    package func ifOpen<R>(_ body: (borrowing BorrowedDescriptor) -> R) -> R? { descriptor.ifOpen(body) }

    /// Closes the eventfd (once; also when the owner goes).
    package func close() { descriptor.close() }
}
