public import ConnectionCore

/// A loop's wake-up: one eventfd, owned here and closed once, that any thread signals and the loop's thread
/// waits on (in epoll, poll, libuv or the ring) and drains. Every loop of the package wakes through one of these;
/// a signal after the close does nothing (it can never reach a descriptor number reused by something else).
public final class WakeSignal: Sendable {
    private let descriptor: SocketDescriptor

    /// A new eventfd (non-blocking, close-on-exec).
    public init() throws(ConnectionError) {
        descriptor = SocketDescriptor(adopting: try Syscall.eventFD())
    }

    /// Wakes whoever waits on it (from any thread).
    @inlinable @inline(__always)
    public func signal() {
        signalNow()
    }

    @usableFromInline func signalNow() {
        _ = descriptor.withDescriptor { Syscall.eventFDSignal($0) }
    }

    /// Takes the signals that came (the waiter, after waking).
    public func drain() {
        _ = descriptor.withDescriptor { Syscall.eventFDDrain($0) }
    }

    /// Runs `body` with the eventfd's number (to register it with epoll, poll it, or arm a read on a ring); `nil`
    /// once closed. A registration that outlives the call is undone by its owner before ``close()``.
    public func withDescriptor<R, E: Error>(_ body: (Int32) throws(E) -> R) throws(E) -> R? {
        try descriptor.withDescriptor(body)
    }

    /// Closes the eventfd (once; also on deinit).
    public func close() {
        descriptor.close()
    }
}
