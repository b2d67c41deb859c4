internal import CSocketShims
package import ConnectionCore
internal import Glibc

// IPv4 multicast membership and sending options.
extension Syscall {
    /// IP_ADD_MEMBERSHIP: joins an IPv4 multicast group on the interface with address `interface`.
    package static func joinMulticastGroup(
        _ descriptor: borrowing BorrowedDescriptor, group: SocketAddress, interface: SocketAddress
    )
        throws(ConnectionError)
    {
        let fd = descriptor.number
        var request = ip_mreq()
        group.withSockAddr { pointer, _ in
            request.imr_multiaddr = UnsafeRawPointer(pointer).load(as: sockaddr_in.self).sin_addr
        }
        interface.withSockAddr { pointer, _ in
            request.imr_interface = UnsafeRawPointer(pointer).load(as: sockaddr_in.self).sin_addr
        }
        _ = try retrying(
            "IP_ADD_MEMBERSHIP",
            {
                Int(
                    setsockopt(
                        fd, Int32(IPPROTO_IP), IP_ADD_MEMBERSHIP, &request, socklen_t(MemoryLayout<ip_mreq>.size)))
            })
    }

    /// IP_MULTICAST_ALL: whether a socket receives every group joined by any socket of the host (Linux's
    /// default) or only the groups it joined itself.
    package static func setMulticastAll(_ descriptor: borrowing BorrowedDescriptor, _ on: Bool) throws(ConnectionError)
    {
        try setOption(descriptor, level: Int32(IPPROTO_IP), name: 49 /* IP_MULTICAST_ALL */, value: on ? 1 : 0)
    }

    /// IP_MULTICAST_IF and IP_MULTICAST_LOOP for a multicast sender.
    package static func setMulticastSender(
        _ descriptor: borrowing BorrowedDescriptor, interface: SocketAddress, loop: Bool
    ) throws(ConnectionError) {
        let fd = descriptor.number
        var address = in_addr()
        interface.withSockAddr { pointer, _ in address = UnsafeRawPointer(pointer).load(as: sockaddr_in.self).sin_addr }
        _ = try retrying(
            "IP_MULTICAST_IF",
            { Int(setsockopt(fd, Int32(IPPROTO_IP), IP_MULTICAST_IF, &address, socklen_t(MemoryLayout<in_addr>.size))) }
        )
        var value: UInt8 = loop ? 1 : 0
        _ = try retrying("IP_MULTICAST_LOOP", { Int(setsockopt(fd, Int32(IPPROTO_IP), IP_MULTICAST_LOOP, &value, 1)) })
    }
}
