public import ConnectionCore
public import Synchronization

/// One socket descriptor and the duty to close it, exactly once; the number is lent out only for the length of a
/// call, and never after the close.
///
/// A final class, not a `~Copyable` struct: the descriptor is shared by the object that owns the connection, the
/// loop's readiness handler and the tasks that send and receive, on different threads, and any of them may be the
/// one that closes it (the user's `close()`, a failure, `deinit`). A `~Copyable` value cannot be captured by those
/// escaping closures or held by two objects; an atomic exchange makes "close once" hold under that sharing.
///
/// The number is read only inside ``withDescriptor(_:)``, which counts its callers: a ``close()`` that comes while
/// one is inside (another thread's `send`, say) takes the number from every later caller at once and leaves the
/// system call `close(2)` to the last caller out, so the kernel cannot give the number to a new socket while a
/// call still uses it (the reuse that sends one connection's bytes down another's socket). A blocking call inside
/// holds the close back until it returns: wake it first (`shutdown(2)`), as with any blocking socket.
///
/// ```swift
/// let socket = try Socket.listen(on: address, transport: .tcp, describing: endpoint)
/// defer { socket.descriptor.close() }   // a second close() does nothing
/// let port = try socket.withDescriptor { try Syscall.localAddress($0) }   // nil once closed
/// ```
public final class SocketDescriptor: Sendable, CustomStringConvertible {
    /// The descriptor; -1 before ``adopt(_:)`` and once closed or released.
    @usableFromInline let number: Atomic<Int32>
    /// Callers inside ``withDescriptor(_:)``, times 2, plus 1 once ``close()`` or ``release()`` has run.
    @usableFromInline let state = Atomic<Int>(0)

    /// Takes ownership of `fd`: this object closes it. -1: none yet (see ``adopt(_:)``).
    public init(adopting fd: Int32 = -1) {
        number = Atomic(fd)
    }

    /// Takes ownership of `fd` for an owner made empty (a connection whose socket is made by its connect).
    public func adopt(_ fd: Int32) {
        let (exchanged, _) = number.compareExchange(expected: -1, desired: fd, ordering: .acquiringAndReleasing)
        precondition(exchanged, "SocketDescriptor.adopt: this owner already holds a descriptor")
    }

    deinit {
        // No caller can be inside (each holds a reference), so a close still owed has been made.
        let fd = number.load(ordering: .relaxed)
        if fd >= 0 { Syscall.close(fd) }
    }

    /// Runs `body` with the descriptor number and returns what it returns, or `nil` without running it once
    /// ``close()`` (or ``release()``) has run, or before ``adopt(_:)``. The number is valid for the call only:
    /// keep no copy of it.
    @inlinable @inline(__always)
    public func withDescriptor<R, E: Error>(_ body: (Int32) throws(E) -> R) throws(E) -> R? {
        guard enter() else { return nil }
        defer { leave() }
        let fd = number.load(ordering: .acquiring)
        guard fd >= 0 else { return nil }
        return try body(fd)
    }

    /// ``withDescriptor(_:)`` for a body that awaits (an event loop's receive that waits for readiness between
    /// its reads): a ``close()`` meanwhile is finished when the body returns, so whatever closes must also wake
    /// what the body waits for (the loop backends fail their readiness waiters first).
    @inlinable @inline(__always)
    public func withDescriptorWhileAwaiting<R, E: Error>(
        _ body: (Int32) async throws(E) -> R
    ) async throws(E) -> R? {
        guard enter() else { return nil }
        defer { leave() }
        let fd = number.load(ordering: .acquiring)
        guard fd >= 0 else { return nil }
        return try await body(fd)
    }

    /// ``withDescriptor(_:)`` for socket code: a closed descriptor is `ConnectionError.closed`.
    @inlinable @inline(__always)
    public func withOpenDescriptor<R>(_ body: (Int32) throws(ConnectionError) -> R) throws(ConnectionError) -> R {
        guard let result = try withDescriptor(body) else { throw .closed("the socket is closed") }
        return result
    }

    /// Counts a caller in, unless the descriptor is closed.
    @inlinable @inline(__always)
    func enter() -> Bool {
        var current = state.load(ordering: .relaxed)
        while current & 1 == 0 {
            let (exchanged, seen) = state.weakCompareExchange(
                expected: current, desired: current + 2, successOrdering: .acquiring, failureOrdering: .relaxed)
            if exchanged { return true }
            current = seen
        }
        return false
    }

    /// Counts a caller out; the last one out after a ``close()`` closes the number.
    @inlinable @inline(__always)
    func leave() {
        if state.subtract(2, ordering: .acquiringAndReleasing).newValue == 1 { finishClose() }
    }

    /// The system call, once: by ``close()`` when no caller was inside, else by the last caller out.
    @usableFromInline func finishClose() {
        let fd = number.exchange(-1, ordering: .acquiringAndReleasing)
        if fd >= 0 { Syscall.close(fd) }
    }

    /// `true` once ``close()`` (or ``release()``) ran.
    public var isClosed: Bool { state.load(ordering: .acquiring) & 1 != 0 }

    /// Closes the descriptor. Only the first call closes: it runs `beforeClosing` with the number (to unregister
    /// it from an epoll set while the number is still ours) and returns `true`; later calls return `false`. From
    /// here on ``withDescriptor(_:)`` lends the number to no one; `close(2)` itself waits for the callers inside.
    @discardableResult
    public func close(beforeClosing: (Int32) -> Void = { _ in }) -> Bool {
        let before = state.bitwiseOr(1, ordering: .acquiringAndReleasing).oldValue
        guard before & 1 == 0 else { return false }
        let fd = number.load(ordering: .acquiring)
        if fd >= 0 { beforeClosing(fd) }
        if before == 0 { finishClose() }
        return true
    }

    /// Gives up ownership: returns the descriptor (once; `nil` afterwards, or when a call is inside) and will not
    /// close it. For handing the socket to a library that closes it itself (SwiftNIO's `withBoundSocket`).
    public func release() -> Int32? {
        let (exchanged, _) = state.compareExchange(expected: 0, desired: 1, ordering: .acquiringAndReleasing)
        guard exchanged else { return nil }
        let fd = number.exchange(-1, ordering: .acquiringAndReleasing)
        return fd >= 0 ? fd : nil
    }

    public var description: String {
        withDescriptor { "fd \($0)" } ?? "fd (closed)"
    }
}
