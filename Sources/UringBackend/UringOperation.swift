internal import CURing
@_spi(Loop) import ConnectionCore
internal import Glibc
@_spi(Loop) import POSIXSupport
import Synchronization

/// One operation for the ring: the fields of a submission queue entry the backend uses. Buffers and addresses are
/// carried as addresses (`UInt`), so a request can be handed to the loop thread from any thread; whoever makes
/// one keeps what they point at alive until ``UringLoop/run(_:timeout:guardedBy:)`` returns.
enum UringOperation: Sendable {
    /// recv(2) into `length` bytes at `buffer`.
    case receive(fd: Int32, buffer: UInt, length: Int, flags: Int32)
    /// send(2) of `length` bytes at `buffer`.
    case send(fd: Int32, buffer: UInt, length: Int, flags: Int32)
    /// send(2) with zero copy (IORING_OP_SEND_ZC): completes once the kernel is done with the buffer.
    case sendZeroCopy(fd: Int32, buffer: UInt, length: Int, flags: Int32)
    /// accept4(2); the peer's address is written at `address` (a `sockaddr_storage`), its length at `length`.
    case accept(fd: Int32, address: UInt, length: UInt)
    /// connect(2) to the `length`-byte address at `address`.
    case connect(fd: Int32, address: UInt, length: UInt32)
    /// recvmsg(2) with the `csur_message` at `message`.
    case receiveMessage(fd: Int32, message: UInt, flags: UInt32)
    /// sendmsg(2) with the `csur_message` at `message`.
    case sendMessage(fd: Int32, message: UInt, flags: UInt32)
    /// One sendmsg of datagrams the kernel cuts apart (UDP GSO), with the `csur_segmented` at `segments`.
    case sendSegmented(fd: Int32, segments: UInt)
    /// Completes after `after` (with -ETIME).
    case sleep
}

/// What a descriptor's owner closes: once ``close()`` has run, the loop submits no more operations on it (one
/// already queued for submission completes with `-ECANCELED`), so the owner can cancel what is in flight and know
/// nothing follows.
final class UringDescriptorGuard: Sendable {
    private let closed = Atomic<Bool>(false)

    var isClosed: Bool { closed.load(ordering: .acquiring) }

    func close() { closed.store(true, ordering: .releasing) }
}

/// The operations of one ``UringLoop/run(batch:guardedBy:)`` call (loop thread only).
final class UringBatch {
    private var results: [Int32]
    private var remaining: Int
    private let continuation: UnsafeContinuation<[Int32], Never>

    init(count: Int, continuation: UnsafeContinuation<[Int32], Never>) {
        results = Array(repeating: 0, count: count)
        remaining = count
        self.continuation = continuation
    }

    func complete(_ position: Int, _ result: Int32) {
        results[position] = result
        remaining -= 1
        if remaining == 0 { continuation.resume(returning: results) }
    }
}

/// Hands an operation's id from the loop to a cancellation handler on another thread: whichever comes second acts.
final class CancelToken: Sendable {
    private static let cancelled: UInt64 = .max
    private let state = Atomic<UInt64>(0)

    /// Loop thread, after submitting: `false` when the task was cancelled already (the caller cancels `id`).
    func publish(_ id: UInt64) -> Bool {
        state.compareExchange(expected: 0, desired: id &+ 1, ordering: .acquiringAndReleasing).exchanged
    }

    /// The cancellation handler: the id to cancel when the operation was submitted, else `nil` (it will be).
    func cancel() -> UInt64? {
        let previous = state.exchange(Self.cancelled, ordering: .acquiringAndReleasing)
        return previous == 0 || previous == Self.cancelled ? nil : previous &- 1
    }
}
