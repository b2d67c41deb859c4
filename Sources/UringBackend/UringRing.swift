internal import CURing
@_spi(Loop) import ConnectionCore
internal import Glibc
@_spi(Loop) import POSIXSupport
import Synchronization

/// The ring as code on its own thread uses it (``UringLoop/execute(_:)``): each operation is queued with what to do
/// when it completes, and every entry queued in one turn of the loop goes to the kernel with one `io_uring_enter`.
/// A handler runs on the ring's thread; the buffers an operation names must stay valid until its handler ran.
///
/// ```swift
/// loop.execute { ring in
///     // send, then (only once the send completed in full) receive into the same buffer: one system call for both
///     ring.send(fd, request, linked: true) { sent in }
///     ring.receive(fd, into: buffer) { count in print("received", count) }
/// }
/// ```
public struct UringRing {
    let loop: UringLoop

    /// send(2) of `bytes` on `fd`; `then` gets the count sent or `-errno`. `linked`: the next operation queued
    /// starts only after this one sent everything.
    public func send(
        _ fd: Int32, _ bytes: UnsafeRawBufferPointer, linked: Bool = false, then: @escaping (Int32) -> Void
    ) {
        let operation = UringOperation.send(
            fd: fd, buffer: UInt(bitPattern: bytes.baseAddress), length: bytes.count, flags: Int32(MSG_NOSIGNAL))
        if !loop.submit(operation, linked: linked, then: then) { then(-EBUSY) }
    }

    /// send(2) of all of `bytes` on a stream socket, then (once every byte went) recv(2) into `buffer`: two
    /// operations, one completion, so a request and its answer cost the ring's thread one wake-up. `then` gets the
    /// count received (0 at the end of the stream) or `-errno`: the send's when it failed (`-ECANCELED` on kernels
    /// before 5.17). `buffer` may be the memory `bytes` points into: the receive starts only after the send
    /// completed.
    public func sendThenReceive(
        _ fd: Int32, _ bytes: UnsafeRawBufferPointer, into buffer: UnsafeMutableRawBufferPointer,
        then: @escaping (Int32) -> Void
    ) {
        if !loop.submitSendThenReceive(fd: fd, send: bytes, into: buffer, then: then) { then(-EBUSY) }
    }

    /// recv(2) into `buffer` on `fd`; `then` gets the count received (0 at the end of a TCP stream) or `-errno`.
    public func receive(
        _ fd: Int32, into buffer: UnsafeMutableRawBufferPointer, linked: Bool = false,
        then: @escaping (Int32) -> Void
    ) {
        let operation = UringOperation.receive(
            fd: fd, buffer: UInt(bitPattern: buffer.baseAddress), length: buffer.count, flags: 0)
        if !loop.submit(operation, linked: linked, then: then) { then(-EBUSY) }
    }
}

// The ring's own style: what UringRing asks of the loop.
extension UringLoop {
    /// Runs `body` on the ring's thread with the ring, for code written in the ring's own idiom (``UringRing``):
    /// operations queued with what to do when each completes, no task suspended in between.
    public func execute(_ body: @escaping @Sendable (UringRing) -> Void) {
        perform { [self] in body(UringRing(loop: self)) }
    }

    /// Loop thread: queues `operation` with a completion handler. With `linked`, the next entry queued starts only
    /// once this one completed in full (IOSQE_IO_LINK); when this one fails or falls short, the next completes with
    /// `-ECANCELED`. Returns `false` when the ring had no room (the handler is not called).
    func submit(_ operation: UringOperation, linked: Bool, then handler: @escaping (Int32) -> Void) -> Bool {
        precondition(inLoop, "UringRing is used on its loop's thread only (UringLoop.execute)")
        return confined.withValue { confined -> Bool in
            let ring = confined.ring!
            let id = Self.allocate(&confined, owned: nil)
            confined.slots[Int(truncatingIfNeeded: id & 0xffff_ffff)] = .callback(handler)
            let prepared: Int32
            switch operation {
            case .receive(let fd, let buffer, let length, let flags):
                prepared = csur_prep_recv(ring, id, fd, UnsafeMutableRawPointer(bitPattern: buffer), length, flags)
            case .send(let fd, let buffer, let length, let flags):
                prepared = csur_prep_send(ring, id, fd, UnsafeRawPointer(bitPattern: buffer), length, flags)
            default:
                prepared = -EINVAL
            }
            if prepared == 0, linked { csur_link_last(ring) }
            if prepared != 0 { Self.release(&confined, id) }
            return prepared == 0
        }
    }

    /// Loop thread: sends all of `bytes` (MSG_WAITALL: the kernel sends a stream socket's rest itself) and, linked
    /// behind it, receives into `buffer`; `handler` gets the receive's result, or the send's error when it failed.
    /// The send posts no completion when it succeeds (IOSQE_CQE_SKIP_SUCCESS), so the pair wakes the ring's thread
    /// once. When it fails, the kernel posts its completion and skips the cancelled receive's (a link head that
    /// skips success skips its failed links' too: seen here, the receive's never came), so the send carries the
    /// receive's id and the one completion is the send's error. Where the kernel cannot skip, the send's
    /// completion is dropped and a failed send shows as the receive's `-ECANCELED`.
    func submitSendThenReceive(
        fd: Int32, send bytes: UnsafeRawBufferPointer, into buffer: UnsafeMutableRawBufferPointer,
        then handler: @escaping (Int32) -> Void
    ) -> Bool {
        precondition(inLoop, "UringRing is used on its loop's thread only (UringLoop.execute)")
        return confined.withValue { confined -> Bool in
            let ring = confined.ring!
            let flags = Int32(MSG_NOSIGNAL | MSG_WAITALL)
            guard csur_reserve(ring, 2) == 0 else { return false }
            let id = Self.allocate(&confined, owned: nil)
            confined.slots[Int(truncatingIfNeeded: id & 0xffff_ffff)] = .callback(handler)
            let sendID = confined.skipsSuccess ? id : Self.ignoredToken
            guard csur_prep_send(ring, sendID, fd, bytes.baseAddress, bytes.count, flags) == 0 else {
                _ = Self.release(&confined, id)
                return false
            }
            csur_link_last(ring)
            if confined.skipsSuccess { csur_skip_success_last(ring) }
            // Room for both was made: the receive's entry is there.
            let prepared = csur_prep_recv(ring, id, fd, buffer.baseAddress, buffer.count, 0)
            precondition(prepared == 0, "the ring had room for the pair")
            // The reply to what this sends cannot be there before the send has gone: a first try would find
            // nothing and then arm the poll anyway (native-64: 1.19x the C floor with it, 1.21-1.22x without).
            if confined.pollsFirst { csur_poll_first_last(ring) }
            return true
        }
    }
}
