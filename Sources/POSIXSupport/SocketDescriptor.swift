public import ConnectionCore
import Synchronization

/// One descriptor and the duty to close it, exactly once; the only way to its number is to borrow it.
///
/// A final class, not a `~Copyable` struct: the descriptor is shared by the object that owns the connection, the
/// loop's readiness handler and the tasks that send and receive, on different threads, and any of them may be the
/// one that closes it (the user's `close()`, a failure, `deinit`). A `~Copyable` value cannot be captured by those
/// escaping closures or held by two objects.
///
/// The number is lent, never handed out: ``withDescriptor(_:)`` (or ``ifOpen(_:)``) runs a body with it and
/// fails once the descriptor is closed. A ``close()`` while some thread is inside such a body marks the
/// descriptor closed at once (no new borrow succeeds) and leaves the `close(2)` to the last borrower on its way
/// out, so no system call ever runs on a number that was closed and given to another socket meanwhile (a churn of
/// short connections reuses numbers within microseconds). A body that blocks (bsd's `recv`) holds the close back
/// until it returns: wake it first (`shutdown(2)`), as for any descriptor.
///
/// ```swift
/// let socket = try Socket.listen(on: address, transport: .tcp, describing: endpoint)
/// defer { socket.descriptor.close() }   // a second close() does nothing
/// let local = try socket.descriptor.withDescriptor { fd throws(ConnectionError) in try Syscall.localAddress(fd) }
/// ```
public final class SocketDescriptor: Sendable, CustomStringConvertible {
    /// The number (low 32 bits; all ones: none), the borrowers (bits 32-61), released (62), closing (63): one word,
    /// so that "closed" and "nobody inside" are seen together and the close happens once.
    private let state: Atomic<UInt64>

    private static let noNumber: UInt64 = 0xFFFF_FFFF
    private static let oneBorrower: UInt64 = 1 << 32
    private static let borrowers: UInt64 = ((1 << 30) - 1) << 32
    private static let released: UInt64 = 1 << 62
    private static let closing: UInt64 = 1 << 63

    private static func number(_ state: UInt64) -> Int32 {
        Int32(bitPattern: UInt32(truncatingIfNeeded: state))
    }

    /// Takes ownership of `fd`: this object closes it. -1: none yet (see ``adopt(_:)``).
    public init(adopting fd: Int32 = -1) {
        state = Atomic(fd >= 0 ? UInt64(UInt32(fd)) : Self.noNumber)
    }

    /// Takes ownership of `fd` for an owner made empty (a connection whose socket is made by its connect).
    public func adopt(_ fd: Int32) {
        precondition(fd >= 0, "SocketDescriptor.adopt: not a descriptor")
        let (exchanged, _) = state.compareExchange(
            expected: Self.noNumber, desired: UInt64(UInt32(fd)), ordering: .acquiringAndReleasing)
        precondition(exchanged, "SocketDescriptor.adopt: this owner already holds a descriptor")
    }

    deinit {
        let current = state.load(ordering: .acquiring)
        if current & Self.closing == 0, Self.number(current) >= 0 { Syscall.close(Self.number(current)) }
    }

    /// Runs `body` with the descriptor number, which stays this socket's until `body` returns (a ``close()`` meanwhile
    /// waits for it); `nil` without running it once the descriptor is closed (or released, or not yet adopted).
    @inlinable
    public func ifOpen<R, E: Error>(_ body: (borrowing BorrowedDescriptor) throws(E) -> R) throws(E) -> R? {
        guard let fd = borrow() else { return nil }
        defer { giveBack() }
        return try body(BorrowedDescriptor(fd))
    }

    /// Runs `body` with the descriptor number, which stays this socket's until `body` returns; throws `.closed` once
    /// the descriptor is closed.
    @inlinable
    public func withDescriptor<R>(
        _ body: (borrowing BorrowedDescriptor) throws(ConnectionError) -> R
    ) throws(ConnectionError) -> R {
        guard let fd = borrow() else { throw .closed("the socket is closed") }
        defer { giveBack() }
        return try body(BorrowedDescriptor(fd))
    }

    /// As ``withDescriptor(_:)``, for a body that awaits: the number stays this socket's across the awaits (an
    /// io_uring operation that names it, until the operation completed), and a ``close()`` meanwhile waits for the
    /// body to return, so whoever closes cancels such operations first.
    @inlinable
    public func withDescriptorAsync<R>(
        _ body: (borrowing BorrowedDescriptor) async throws(ConnectionError) -> R
    ) async throws(ConnectionError) -> R {
        guard let fd = borrow() else { throw .closed("the socket is closed") }
        defer { giveBack() }
        return try await body(BorrowedDescriptor(fd))
    }

    /// One more borrower, unless closing or empty: the number.
    @usableFromInline func borrow() -> Int32? {
        var current = state.load(ordering: .relaxed)
        while true {
            if current & Self.closing != 0 || Self.number(current) < 0 { return nil }
            let (exchanged, original) = state.compareExchange(
                expected: current, desired: current &+ Self.oneBorrower, ordering: .acquiring)
            if exchanged { return Self.number(current) }
            current = original
        }
    }

    /// One borrower less; the last one out of a descriptor being closed closes it.
    @usableFromInline func giveBack() {
        let after = state.wrappingSubtract(Self.oneBorrower, ordering: .acquiringAndReleasing).newValue
        if after & (Self.closing | Self.borrowers | Self.released) == Self.closing {
            Syscall.close(Self.number(after))
        }
    }

    /// `true` once ``close()`` (or ``release()``) ran, and before ``adopt(_:)``.
    public var isClosed: Bool {
        let current = state.load(ordering: .acquiring)
        return current & Self.closing != 0 || Self.number(current) < 0
    }

    /// Closes the descriptor: from now on nothing borrows it, and `close(2)` runs now, or when the last body that
    /// holds the number returns. Only the first call closes: it runs `beforeClosing` with the number (to unregister
    /// it from an epoll set while the number is still ours) and returns `true`; later calls return `false`.
    @discardableResult
    public func close(beforeClosing: (borrowing BorrowedDescriptor) -> Void = { _ in }) -> Bool {
        // The closer counts as a borrower until `beforeClosing` has run.
        guard let fd = mark(Self.closing | Self.oneBorrower) else { return false }
        beforeClosing(BorrowedDescriptor(fd))
        giveBack()
        return true
    }

    /// Gives up ownership: returns the descriptor (once; `nil` afterwards) and will not close it. For handing the
    /// socket to a library that closes it itself (SwiftNIO's `withBoundSocket`). Nothing may be borrowing it.
    public func release() -> Int32? {
        mark(Self.closing | Self.released)
    }

    /// Sets `bits` (closing and more) unless closing already: the number, or `nil`.
    private func mark(_ bits: UInt64) -> Int32? {
        var current = state.load(ordering: .relaxed)
        while true {
            if current & Self.closing != 0 || Self.number(current) < 0 { return nil }
            let (exchanged, original) = state.compareExchange(
                expected: current, desired: (current | (bits & ~Self.oneBorrower)) &+ (bits & Self.oneBorrower),
                ordering: .acquiringAndReleasing)
            if exchanged { return Self.number(current) }
            current = original
        }
    }

    public var description: String {
        let current = state.load(ordering: .relaxed)
        return current & Self.closing != 0 ? "closed fd" : "fd \(Self.number(current))"
    }
}

/// A descriptor's number, lent for one body of ``SocketDescriptor/withDescriptor(_:)`` (or ``SocketDescriptor/ifOpen(_:)``,
/// ``SocketDescriptor/withDescriptorAsync(_:)``): noncopyable and received `borrowing`, so the body can hand it to
/// the system-call layer (`Syscall`, which takes this type, not a number) but cannot keep it, copy it or capture it
/// in a closure that outlives the body. The compiler, not a convention, keeps the number from outliving the borrow.
///
/// ``number`` is the escape a system call needs (a C function, an io_uring operation the kernel reads at
/// submission, an epoll registration): read it where the call is made, inside the body.
public struct BorrowedDescriptor: ~Copyable {
    /// The number, for the system call made in the body.
    public let number: Int32

    @usableFromInline init(_ number: Int32) { self.number = number }
}

extension BorrowedDescriptor {
    /// Lends `number`, a descriptor another owner keeps open while `body` runs, to `body`: libuv's, whose handle
    /// owns its socket (`uv_fileno` on the loop thread, the handle open). The one way to a ``BorrowedDescriptor``
    /// that is not a ``SocketDescriptor``'s borrow; the owner's rules keep the number valid, not this package's.
    package static func lend<R, E: Error>(
        _ number: Int32, _ body: (borrowing BorrowedDescriptor) throws(E) -> R
    ) throws(E) -> R {
        try body(BorrowedDescriptor(number))
    }
}
