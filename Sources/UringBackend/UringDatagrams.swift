internal import CURing
@_spi(Loop) package import ConnectionCore
internal import Glibc
@_spi(Loop) package import POSIXSupport
import Synchronization

/// What became of a UDP socket's datagrams sent without waiting (``UringLoop/sendDatagram(_:to:fd:failures:gate:)``):
/// the last failure, thrown by the next send to the same address (a UDP send reports what it knows then, as a
/// send into the kernel's buffer does), and whether one waits for room in the socket buffer (sends then wait too).
package final class UringSendFailures: Sendable {
    private struct State {
        /// `nil` address: a connected socket's peer.
        var failure: (address: SocketAddress?, code: Int32)?
        var waitingForRoom = 0
    }
    private let state = Guarded(State())

    package init() {}

    package var isWaitingForRoom: Bool { state.withLock { $0.waitingForRoom > 0 } }

    /// The failure of an earlier send to `address` (`nil`: a connected socket's), once.
    package func take(for address: SocketAddress?) -> ConnectionError? {
        state.withLock { state -> ConnectionError? in
            guard let failure = state.failure, failure.address == address else { return nil }
            state.failure = nil
            return .errno(-failure.code, address.map { "sendmsg to \($0)" } ?? "send")
        }
    }

    package func record(_ code: Int32, to address: SocketAddress?) {
        state.withLock { $0.failure = (address, code) }
    }

    package func waitForRoom() { state.withLock { $0.waitingForRoom += 1 } }

    package func roomCame(_ failure: (code: Int32, address: SocketAddress?)?) {
        state.withLock { state in
            state.waitingForRoom -= 1
            if let failure { state.failure = (failure.address, failure.code) }
        }
    }
}

/// One datagram to send: a copy of its bytes in memory that stays put while the kernel may still read it and, to
/// an address, the msghdr naming both (a connected socket sends without one). Freed by whoever saw the send end.
struct UringDatagram {
    let payload: UnsafeMutableRawPointer
    let length: Int
    let message: OpaquePointer?

    /// `nil` when out of memory.
    init?(copying bytes: [UInt8], to address: SocketAddress?) {
        let payload = UnsafeMutableRawPointer.allocate(byteCount: max(1, bytes.count), alignment: 16)
        bytes.withUnsafeBytes { bytes in
            if let base = bytes.baseAddress { payload.copyMemory(from: base, byteCount: bytes.count) }
        }
        var message: OpaquePointer?
        if let address {
            guard let made = csur_message_create() else {
                payload.deallocate()
                return nil
            }
            address.withSockAddr { pointer, length in
                csur_message_prepare(made, payload, bytes.count, pointer, length)
            }
            message = made
        }
        self.payload = payload
        self.length = bytes.count
        self.message = message
    }

    /// The address it goes to (`nil` on a connected socket).
    var address: SocketAddress? {
        guard let message else { return nil }
        var length: socklen_t = 0
        return csur_message_address(message, &length).flatMap { SocketAddress($0, length: Int(length)) }
    }

    func free() {
        if let message { csur_message_destroy(message) }
        payload.deallocate()
    }
}

// Datagrams sent without waiting.
extension UringLoop {
    /// Loop thread: sends one datagram to `address` on the unconnected socket `fd` (`nil`: on the connected socket
    /// `fd`, to its peer) and returns at once: sendto(2) with MSG_DONTWAIT on this thread, as the echo's task runs.
    /// An entry for the ring instead (IORING_OP_SENDMSG, taken when the turn enters the kernel to wait) was slower
    /// on a paced echo: the datagram left only after the rest of the turn, and the kernel's sendmsg path, the
    /// msghdr and the copy cost more than the system call (server round trip 15.6-16.2 us against 14.1-14.3 with
    /// this, docs/backends/uring.md). A send the socket buffer had no room for (EAGAIN) goes to the ring, waiting
    /// for room, and later sends wait behind it; any other failure is kept in `failures` for the next send to that
    /// address or the next receive. `false` (nothing sent) off the ring's thread, while a send waits for room,
    /// when the gate closed, or when the ring had no room (or no memory) for a send that must wait: the caller then
    /// sends and waits.
    func sendDatagram(
        _ bytes: [UInt8], to address: SocketAddress?, fd: borrowing BorrowedDescriptor, failures: UringSendFailures,
        gate: UringDescriptorGuard
    ) -> Bool {
        // The descriptor stays open through the call: a connection's send holds its write gate, which close()
        // waits for, and a listener closes its descriptor only after its receive, run on this thread, has ended.
        guard inLoop, !gate.isClosed, !failures.isWaitingForRoom else { return false }
        do throws(ConnectionError) {
            let sent = try bytes.withBytes { (raw) throws(ConnectionError) -> IOResult<Int> in
                if let address { return try Syscall.sendTo(fd, raw, to: address, dontWait: true) }
                return try Syscall.send(fd, raw, dontWait: true)
            }
            if case .processed = sent { return true }
        } catch {
            failures.record(-(error.systemCode?.code ?? EIO), to: address)
            return true
        }
        guard let datagram = UringDatagram(copying: bytes, to: address) else { return false }
        failures.waitForRoom()
        let number = fd.number
        let queued = confined.withValue { confined -> Bool in
            let id = Self.allocate(&confined, owned: nil)
            confined.slots[Int(truncatingIfNeeded: id & 0xffff_ffff)] = .callback { result in
                datagram.free()
                failures.roomCame(result < 0 && result != -ECANCELED ? (result, address) : nil)
            }
            let flags = Int32(MSG_NOSIGNAL)
            let prepared =
                if let message = datagram.message {
                    csur_prep_sendmsg(confined.ring!, id, number, message, flags)
                } else {
                    csur_prep_send(confined.ring!, id, number, datagram.payload, datagram.length, flags)
                }
            if prepared != 0 { Self.release(&confined, id) }
            return prepared == 0
        }
        if !queued {
            // The ring had no room for the entry: the caller sends and waits.
            datagram.free()
            failures.roomCame(nil)
        }
        return queued
    }
}
