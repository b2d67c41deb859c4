internal import CSocketShims
package import ConnectionCore
internal import Glibc

// Sending and receiving: streams, datagrams (one or a batch per call), peeking, shutdown and close.
extension Syscall {
    /// send(2) with MSG_NOSIGNAL (and MSG_DONTWAIT when `dontWait`).
    package static func send(
        _ descriptor: borrowing BorrowedDescriptor, _ buffer: UnsafeRawBufferPointer, dontWait: Bool = false
    )
        throws(ConnectionError) -> IOResult<Int>
    {
        let fd = descriptor.number
        let flags = Int32(MSG_NOSIGNAL) | (dontWait ? Int32(MSG_DONTWAIT) : 0)
        return try retryingIO("send", { Glibc.send(fd, buffer.baseAddress, buffer.count, flags) })
    }

    /// Non-blocking send(2)s of `bytes` on a stream socket until it has no room: how many bytes it took (a gathered
    /// send's write, `SendGathering`).
    package static func sendAvailable(
        _ descriptor: borrowing BorrowedDescriptor, _ bytes: UnsafeRawBufferPointer
    ) throws(ConnectionError) -> Int {
        var offset = 0
        while offset < bytes.count {
            let rest = UnsafeRawBufferPointer(rebasing: bytes[offset...])
            guard case .processed(let sent) = try send(descriptor, rest, dontWait: true) else { break }
            offset += sent
        }
        return offset
    }

    /// recv(2) (MSG_DONTWAIT when `dontWait`). 0 means end of stream on TCP and an empty datagram on UDP.
    package static func recv(
        _ descriptor: borrowing BorrowedDescriptor, _ buffer: UnsafeMutableRawBufferPointer, dontWait: Bool = false
    )
        throws(ConnectionError) -> IOResult<Int>
    {
        let fd = descriptor.number
        let flags = dontWait ? Int32(MSG_DONTWAIT) : 0
        return try retryingIO("recv", { Glibc.recv(fd, buffer.baseAddress, buffer.count, flags) })
    }

    /// recv(2) on a datagram socket with MSG_TRUNC: the result is the datagram's real size, which exceeds the
    /// buffer when it was truncated.
    package static func recvDatagram(
        _ descriptor: borrowing BorrowedDescriptor, _ buffer: UnsafeMutableRawBufferPointer, dontWait: Bool = false
    )
        throws(ConnectionError) -> IOResult<Int>
    {
        let fd = descriptor.number
        let flags = Int32(MSG_TRUNC) | (dontWait ? Int32(MSG_DONTWAIT) : 0)
        return try retryingIO("recv", { Glibc.recv(fd, buffer.baseAddress, buffer.count, flags) })
    }

    /// sendto(2) with MSG_NOSIGNAL (and MSG_DONTWAIT when `dontWait`).
    package static func sendTo(
        _ descriptor: borrowing BorrowedDescriptor, _ buffer: UnsafeRawBufferPointer, to address: SocketAddress,
        dontWait: Bool = false
    ) throws(ConnectionError) -> IOResult<Int> {
        let fd = descriptor.number
        let flags = Int32(MSG_NOSIGNAL) | (dontWait ? Int32(MSG_DONTWAIT) : 0)
        return try retryingIO(
            "sendto \(address)",
            { address.withSockAddr { Glibc.sendto(fd, buffer.baseAddress, buffer.count, flags, $0, $1) } })
    }

    /// Sends `datagrams[start...]` in order, as few system calls as the kernel allows: runs of equal-sized
    /// datagrams as one segmented send (UDP GSO) when ``udpSegmentationAvailable``, the rest by sendmmsg(2).
    /// Returns how many of them left (at least one), `.wouldBlock` when none could (MSG_DONTWAIT when
    /// `dontWait`); throws only when not even the first went.
    package static func sendDatagrams(
        _ descriptor: borrowing BorrowedDescriptor, _ datagrams: [UnsafeRawBufferPointer], from start: Int = 0,
        to address: SocketAddress? = nil,
        dontWait: Bool = false
    ) throws(ConnectionError) -> IOResult<Int> {
        let fd = descriptor.number
        let count = datagrams.count - start
        guard count > 0 else { return .processed(0) }
        return try withUnsafeTemporaryAllocation(of: UnsafeRawPointer?.self, capacity: count) {
            (bases) throws(ConnectionError) -> IOResult<Int> in
            try withUnsafeTemporaryAllocation(of: Int.self, capacity: count) {
                (lengths) throws(ConnectionError) -> IOResult<Int> in
                for index in 0..<count {
                    let datagram = datagrams[start + index]
                    // A zero-length datagram has no base address; any valid pointer does for it.
                    bases[index] = datagram.baseAddress ?? UnsafeRawPointer(bitPattern: 1)
                    lengths[index] = datagram.count
                }
                return try retryingIO(
                    "sendmmsg",
                    {
                        let sent: Int32 =
                            if let address {
                                address.withSockAddr {
                                    csock_send_datagrams(
                                        fd, bases.baseAddress, lengths.baseAddress, Int32(count), $0, $1,
                                        dontWait ? 1 : 0, 1)
                                }
                            } else {
                                csock_send_datagrams(
                                    fd, bases.baseAddress, lengths.baseAddress, Int32(count), nil, 0, dontWait ? 1 : 0,
                                    1)
                            }
                        return Int(sent)
                    })
            }
        }
    }

    /// Whether this kernel segments UDP sends (UDP_SEGMENT, "GSO"), probed once on a throwaway socket.
    package static var udpSegmentationAvailable: Bool { csock_udp_gso_state() == 1 }
    /// Whether this kernel can coalesce UDP receives (UDP_GRO), probed once. The backends do not use it: tried on
    /// the UDP servers (the coalesced reads split back into datagrams), it let a server take datagrams off the
    /// kernel faster than its consumers could use them, so fewer arrived (the 1,400-byte pump's sink received
    /// 31-57k of 192k datagrams with it, 45-108k without, runloop and async, same and cross placement).
    package static var udpReceiveCoalescingAvailable: Bool { csock_udp_gro_state() == 1 }

    /// recvfrom(2) with MSG_TRUNC: returns the datagram's real size (above the buffer size when truncated) and
    /// its sender.
    package static func recvFrom(
        _ descriptor: borrowing BorrowedDescriptor, _ buffer: UnsafeMutableRawBufferPointer, dontWait: Bool = false
    )
        throws(ConnectionError) -> IOResult<(count: Int, from: SocketAddress)>
    {
        let fd = descriptor.number
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let flags = Int32(MSG_TRUNC) | (dontWait ? Int32(MSG_DONTWAIT) : 0)
        let result = try retryingIO(
            "recvfrom",
            {
                length = socklen_t(MemoryLayout<sockaddr_storage>.size)
                return withUnsafeMutablePointer(to: &storage) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        Glibc.recvfrom(fd, buffer.baseAddress, buffer.count, flags, $0, &length)
                    }
                }
            })
        switch result {
        case .wouldBlock: return .wouldBlock
        case .processed(let count):
            guard let from = withUnsafeBytes(of: &storage, { SocketAddress($0.baseAddress!, length: Int(length)) })
            else { throw ConnectionError(.unsupported, "recvfrom: sender is not an IP address") }
            return .processed((count, from))
        }
    }

    /// shutdown(2). ENOTCONN is ignored: the effect asked for (nothing more flows that way) already holds, and
    /// on Linux the call still wakes threads blocked on the socket.
    package static func shutdown(_ descriptor: borrowing BorrowedDescriptor, _ how: ShutdownHow) throws(ConnectionError)
    {
        let fd = descriptor.number
        if Glibc.shutdown(fd, how.raw) != 0 {
            let code = Glibc.errno
            if code != ENOTCONN { throw .errno(code, "shutdown") }
        }
    }

    /// Resets a connected TCP socket: connect(2) with `AF_UNSPEC` makes Linux send a RST at once, discard what is
    /// still queued to send, wake every thread blocked on the socket and leave it unconnected, so that the
    /// shutdown and close that follow send nothing more (SO_LINGER 0 would only reset at close(2), and only if no
    /// shutdown sent a FIN first). Not a TCP socket, or not connected: nothing happens.
    package static func resetConnection(_ descriptor: borrowing BorrowedDescriptor) {
        let fd = descriptor.number
        var address = sockaddr()
        address.sa_family = sa_family_t(AF_UNSPEC)
        _ = Glibc.connect(fd, &address, socklen_t(MemoryLayout<sockaddr>.size))
    }

    /// close(2), never retried (on Linux the descriptor is gone even when EINTR is returned).
    package static func close(_ fd: Int32) {
        _ = Glibc.close(fd)
    }

    /// recv(MSG_PEEK | MSG_DONTWAIT) of one byte: 1 when data is waiting, 0 at the end of the stream,
    /// `.wouldBlock` when nothing is there yet.
    package static func peekByte(_ descriptor: borrowing BorrowedDescriptor) throws(ConnectionError) -> IOResult<Int> {
        let fd = descriptor.number
        var byte: UInt8 = 0
        return try retryingIO("recv(MSG_PEEK)", { Glibc.recv(fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT)) })
    }

    /// FIONREAD: bytes waiting in the receive buffer (0 on error).
    package static func bytesReadable(_ descriptor: borrowing BorrowedDescriptor) -> Int {
        let fd = descriptor.number
        var count: Int32 = 0
        return ioctl(fd, UInt(FIONREAD), &count) == 0 ? Int(count) : 0
    }

    /// TIOCOUTQ: bytes in the send buffer not yet acknowledged by the peer (0 on error).
    package static func bytesUnsent(_ descriptor: borrowing BorrowedDescriptor) -> Int {
        let fd = descriptor.number
        var count: Int32 = 0
        return ioctl(fd, UInt(TIOCOUTQ), &count) == 0 ? Int(count) : 0
    }
}
