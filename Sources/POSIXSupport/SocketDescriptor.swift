import Synchronization

/// One socket descriptor and the duty to close it, exactly once.
///
/// A final class, not a `~Copyable` struct: the descriptor is shared by the object that owns the connection, the
/// loop's readiness handler and the tasks that send and receive, on different threads, and any of them may be the
/// one that closes it (the user's `close()`, a failure, `deinit`). A `~Copyable` value cannot be captured by those
/// escaping closures or held by two objects; an atomic exchange makes "close once" hold under that sharing.
///
/// ```swift
/// let socket = try Socket.listen(on: address, transport: .tcp, describing: endpoint)
/// defer { socket.descriptor.close() }   // a second close() does nothing
/// ```
public final class SocketDescriptor: Sendable, CustomStringConvertible {
    private let value: Atomic<Int32>

    /// Takes ownership of `fd`: this object closes it. -1: none yet (see ``adopt(_:)``).
    public init(adopting fd: Int32 = -1) {
        value = Atomic(fd)
    }

    /// Takes ownership of `fd` for an owner made empty (a connection whose socket is made by its connect).
    public func adopt(_ fd: Int32) {
        let (exchanged, _) = value.compareExchange(expected: -1, desired: fd, ordering: .acquiringAndReleasing)
        precondition(exchanged, "SocketDescriptor.adopt: this owner already holds a descriptor")
    }

    deinit {
        let fd = value.load(ordering: .relaxed)
        if fd >= 0 { Syscall.close(fd) }
    }

    /// The descriptor number, or -1 once closed (or released).
    public var raw: Int32 { value.load(ordering: .acquiring) }

    /// `true` once ``close()`` (or ``release()``) ran.
    public var isClosed: Bool { raw < 0 }

    /// Closes the descriptor. Only the first call closes: it runs `beforeClosing` with the number (to unregister
    /// it from an epoll set while the number is still ours) and returns `true`; later calls return `false`.
    @discardableResult
    public func close(beforeClosing: (Int32) -> Void = { _ in }) -> Bool {
        let fd = value.exchange(-1, ordering: .acquiringAndReleasing)
        guard fd >= 0 else { return false }
        beforeClosing(fd)
        Syscall.close(fd)
        return true
    }

    /// Gives up ownership: returns the descriptor (once; `nil` afterwards) and will not close it. For handing the
    /// socket to a library that closes it itself (SwiftNIO's `withBoundSocket`).
    public func release() -> Int32? {
        let fd = value.exchange(-1, ordering: .acquiringAndReleasing)
        return fd >= 0 ? fd : nil
    }

    public var description: String { "fd \(raw)" }
}
