internal import CURing
@_spi(Loop) import ConnectionCore
internal import Glibc
@_spi(Loop) import POSIXSupport
import Synchronization

// Multishot receives with provided buffers.
extension UringLoop {
    /// Loop thread: a provided buffer ring of `count` buffers of `size` bytes, or `nil` when the kernel has none.
    func makeBuffers(count: UInt32, size: Int) -> OpaquePointer? {
        precondition(inLoop, "buffer rings are made on the ring's thread")
        return confined.withValue { confined -> OpaquePointer? in
            confined.nextBufferGroup &+= 1
            var code: Int32 = 0
            return csur_buffers_create(confined.ring!, confined.nextBufferGroup, count, size, &code)
        }
    }

    /// Loop thread: unregisters and frees a buffer ring once no operation uses it.
    func destroyBuffers(_ buffers: OpaquePointer) {
        precondition(inLoop, "buffer rings are released on the ring's thread")
        confined.withValue { csur_buffers_destroy($0.ring!, buffers) }
    }

    /// Loop thread: arms a multishot recvmsg on `fd` with `buffers`; `handler` gets each completion (result and
    /// flags: the buffer id, and whether more follow). `false` when the gate has closed or the ring had no room.
    func receiveMessages(
        on fd: borrowing BorrowedDescriptor, buffers: OpaquePointer, guardedBy gate: UringDescriptorGuard,
        then handler: @escaping (_ result: Int32, _ flags: UInt32) -> Void
    ) -> Bool {
        precondition(inLoop, "multishot operations are armed on the ring's thread")
        if gate.isClosed { return false }
        let number = fd.number
        return confined.withValue { confined -> Bool in
            let id = Self.allocate(&confined, owned: nil)
            confined.slots[Int(truncatingIfNeeded: id & 0xffff_ffff)] = .multishot(handler)
            if csur_prep_recvmsg_multishot(confined.ring!, id, number, buffers) != 0 {
                Self.release(&confined, id)
                return false
            }
            return true
        }
    }

    /// Loop thread: arms a multishot accept on the listening socket `fd`; `handler` gets each completion (a new
    /// descriptor or `-errno`, and whether more follow). Returns the operation's id (for ``cancelMultishot(_:)``),
    /// `nil` when the gate has closed or the ring had no room.
    func acceptClients(
        on fd: borrowing BorrowedDescriptor, guardedBy gate: UringDescriptorGuard,
        then handler: @escaping (_ result: Int32, _ flags: UInt32) -> Void
    ) -> UInt64? {
        precondition(inLoop, "multishot operations are armed on the ring's thread")
        if gate.isClosed { return nil }
        let number = fd.number
        return confined.withValue { confined -> UInt64? in
            let id = Self.allocate(&confined, owned: nil)
            confined.slots[Int(truncatingIfNeeded: id & 0xffff_ffff)] = .multishot(handler)
            if csur_prep_accept_multishot(confined.ring!, id, number) != 0 {
                Self.release(&confined, id)
                return nil
            }
            return id
        }
    }

    /// Loop thread: asks the kernel to end the multishot operation `id` (its handler then gets a last completion,
    /// `-ECANCELED`, with no more to follow). Nothing when it has ended already.
    func cancelMultishot(_ id: UInt64) {
        precondition(inLoop, "multishot operations are cancelled on the ring's thread")
        cancel(id)
    }
}
