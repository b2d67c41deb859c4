internal import CURing
@_spi(Loop) import ConnectionCore
internal import Glibc
import POSIXSupport
import Synchronization

/// Stream receives into buffers the kernel picks from one set the ring owns (a provided buffer ring,
/// IOSQE_BUFFER_SELECT): a receive waiting for data holds no buffer, and its bytes are copied out at the length
/// that arrived when it completes, on the ring's thread, and the buffer goes back to the ring at once. An idle
/// connection then keeps no read buffer of its own (a 64 KiB one each was 4 KiB of resident memory per idle
/// connection: docs/benchmarks.md).
extension UringLoop {
    /// What a selected receive gives: the bytes, or the result that carried none (0 at the end of the stream,
    /// `-errno` on failure).
    enum SelectedReceive: Sendable {
        case bytes([UInt8])
        case result(Int32)
    }

    /// The ring's stream buffers: 8 of 64 KiB, 512 KiB of which only the buffers used become resident. The kernel
    /// hands them out in turn, so each is reused after this many receives: 8 keep them in the CPU's cache (with 32,
    /// a tcp pump into a uring sink used 20% more CPU per message than with a buffer per socket).
    static let streamBufferCount: UInt32 = 8
    static let streamBufferSize = 64 * 1024

    /// Receives at most `length` bytes (at most a stream buffer's) from `fd`; cancellable as
    /// ``run(_:timeout:guardedBy:)``, and like it, returns only once the operation has completed. Only when
    /// ``selectsStreamBuffers`` holds.
    ///
    /// When data came to more sockets at once than the ring has buffers, the kernel completes the others with
    /// `-ENOBUFS`: their data is there, so it is read at once with a non-blocking recv(2) into the calling thread's
    /// buffer (the caller's read gate keeps the descriptor open). Made again with buffer selection instead, 10,000
    /// connections echoing at once got 1,194 round trips a second (every turn of the ring served its 32 buffers' worth and turned the
    /// rest away), against 33,767 with a buffer per socket; into a buffer allocated for the one receive, the heap
    /// kept 1 KiB a connection more.
    func receiveSelected(
        fd: borrowing BorrowedDescriptor, length: Int, guardedBy gate: UringDescriptorGuard
    ) async -> SelectedReceive {
        while true {
            let outcome = await receiveSelectedOnce(fd: fd.number, length: length, gate: gate)
            guard case .result(-ENOBUFS) = outcome else { return outcome }
            receivesTurnedAway.add(1, ordering: .relaxed)
            let buffer = ThreadReadBuffer.take(max(1, length))
            let count = Glibc.recv(fd.number, buffer.baseAddress, buffer.count, Int32(MSG_DONTWAIT))
            if count > 0 { return .bytes([UInt8](UnsafeRawBufferPointer(rebasing: buffer[..<count]))) }
            if count == 0 { return .result(0) }
            let code = errno
            if code == EAGAIN || code == EWOULDBLOCK || code == EINTR { continue }
            return .result(-code)
        }
    }

    /// `fd`: the number the kernel reads when the request is submitted on the ring's thread; the caller's borrow
    /// keeps it this socket's until the operation completed.
    private func receiveSelectedOnce(fd: Int32, length: Int, gate: UringDescriptorGuard) async -> SelectedReceive {
        await awaitCompletion(of: SelectedRequest(fd: fd, length: length, gate: gate))
    }

    private struct SelectedRequest: UringRequest {
        let fd: Int32
        let length: Int
        let gate: UringDescriptorGuard
        var refused: SelectedReceive { .result(-ECANCELED) }
        func submit(on loop: UringLoop) -> UInt64? { loop.submitSelected(fd: fd, length: length, gate: gate) }
        func attach(_ continuation: UnsafeContinuation<SelectedReceive, Never>, to id: UInt64, on loop: UringLoop) {
            loop.attachSelected(continuation, to: id)
        }
    }

    /// Loop thread: the entry, or `nil` when the gate has closed or the ring refused it.
    fileprivate func submitSelected(fd: Int32, length: Int, gate: UringDescriptorGuard) -> UInt64? {
        if gate.isClosed { return nil }
        return confined.withValue { confined -> UInt64? in
            guard let buffers = confined.streamBuffers else { return nil }
            let id = Self.allocate(&confined, owned: nil)
            confined.slots[Int(truncatingIfNeeded: id & 0xffff_ffff)] = .selecting(nil)
            if csur_prep_recv_select(confined.ring!, id, fd, max(1, length), buffers) != 0 {
                Self.release(&confined, id)
                return nil
            }
            // The caller found nothing waiting (or did not look): the kernel waits for data before its first try,
            // instead of picking a buffer, finding nothing and giving the buffer back.
            if confined.pollsFirst { csur_poll_first_last(confined.ring!) }
            return id
        }
    }

    fileprivate func attachSelected(_ continuation: UnsafeContinuation<SelectedReceive, Never>, to id: UInt64) {
        confined.withValue { confined in
            let index = Int(truncatingIfNeeded: id & 0xffff_ffff)
            guard case .selecting = confined.slots[index] else { preconditionFailure("no such operation") }
            confined.slots[index] = .selecting(continuation)
        }
    }

    /// Loop thread, as a selected receive completes: its bytes copied out, its buffer back to the ring.
    func selected(_ result: Int32, _ flags: UInt32) -> SelectedReceive {
        let id = csur_buffer_id(flags)
        guard id >= 0, let buffers = confined.withValue({ $0.streamBuffers }) else { return .result(result) }
        defer { csur_buffers_recycle(buffers, UInt32(id)) }
        guard result > 0 else { return .result(result) }
        let start = csur_buffers_address(buffers, UInt32(id))
        return .bytes([UInt8](UnsafeRawBufferPointer(start: start, count: Int(result))))
    }
}
