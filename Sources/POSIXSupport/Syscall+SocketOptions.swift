internal import CSocketShims
package import ConnectionCore
internal import Glibc

// Creating a socket and setting its options (setsockopt, fcntl).
extension Syscall {
    /// socket(2), close-on-exec, optionally non-blocking: the new socket, owned.
    package static func socket(
        family: SocketAddress.Family, datagram: Bool, nonBlocking: Bool = false
    )
        throws(ConnectionError) -> SocketDescriptor
    {
        var type = (datagram ? Int32(SOCK_DGRAM.rawValue) : Int32(SOCK_STREAM.rawValue)) | Int32(SOCK_CLOEXEC.rawValue)
        if nonBlocking { type |= Int32(SOCK_NONBLOCK.rawValue) }
        let domain = family == .ipv4 ? AF_INET : AF_INET6
        return SocketDescriptor(adopting: Int32(try retrying("socket", { Int(Glibc.socket(domain, type, 0)) })))
    }

    /// setsockopt(2) with an `Int32` value.
    package static func setOption(
        _ descriptor: borrowing BorrowedDescriptor, level: Int32, name: Int32, value: Int32
    ) throws(ConnectionError) {
        let fd = descriptor.number
        var value = value
        _ = try retrying(
            "setsockopt(\(level), \(name))",
            { Int(setsockopt(fd, level, name, &value, socklen_t(MemoryLayout<Int32>.size))) })
    }

    /// getsockopt(2) reading an `Int32`.
    package static func getOption(
        _ descriptor: borrowing BorrowedDescriptor, level: Int32, name: Int32
    ) throws(ConnectionError) -> Int32 {
        let fd = descriptor.number
        var value: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        _ = try retrying("getsockopt(\(level), \(name))", { Int(getsockopt(fd, level, name, &value, &length)) })
        return value
    }

    /// A socket option that is on or off.
    package enum Switch: Sendable {
        /// TCP_NODELAY: small segments go at once instead of waiting for the last one's acknowledgement (Nagle).
        case noDelay
        /// SO_REUSEADDR: a listener may bind a port whose earlier connections are still in TIME_WAIT.
        case reuseAddress
        /// SO_REUSEPORT: several sockets bind one address and the kernel spreads connections over them.
        case reusePort
        /// IPV6_V6ONLY: an IPv6 listener on `::` does not also take IPv4.
        case ipv6Only

        var levelAndName: (Int32, Int32) {
            switch self {
            case .noDelay: (Int32(IPPROTO_TCP), TCP_NODELAY)
            case .reuseAddress: (SOL_SOCKET, SO_REUSEADDR)
            case .reusePort: (SOL_SOCKET, SO_REUSEPORT)
            case .ipv6Only: (Int32(IPPROTO_IPV6), IPV6_V6ONLY)
            }
        }
    }

    /// Turns `option` on or off.
    package static func setOption(
        _ descriptor: borrowing BorrowedDescriptor, _ option: Switch, _ on: Bool
    ) throws(ConnectionError) {
        let (level, name) = option.levelAndName
        try setOption(descriptor, level: level, name: name, value: on ? 1 : 0)
    }

    /// SO_RCVBUF / SO_SNDBUF when given.
    package static func setBufferSizes(
        _ descriptor: borrowing BorrowedDescriptor, receive: Int?, send: Int?
    ) throws(ConnectionError) {
        if let receive {
            try setOption(descriptor, level: SOL_SOCKET, name: SO_RCVBUF, value: Int32(clamping: receive))
        }
        if let send { try setOption(descriptor, level: SOL_SOCKET, name: SO_SNDBUF, value: Int32(clamping: send)) }
    }

    /// net.core.rmem_max: the most SO_RCVBUF a socket gets without CAP_NET_ADMIN (Linux grants twice what is asked,
    /// for its bookkeeping, up to twice this); `nil` when it cannot be read.
    package static var receiveBufferLimit: Int? {
        guard let file = fopen("/proc/sys/net/core/rmem_max", "r") else { return nil }
        defer { fclose(file) }
        var line = [CChar](repeating: 0, count: 32)
        guard fgets(&line, Int32(line.count), file) != nil else { return nil }
        let text = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return Int(text.trimmingPrefix(" ").prefix { $0.isNumber })
    }

    /// The pending socket error (SO_ERROR), cleared by reading it; 0 when none.
    package static func pendingError(_ descriptor: borrowing BorrowedDescriptor) throws(ConnectionError) -> Int32 {
        try getOption(descriptor, level: SOL_SOCKET, name: SO_ERROR)
    }

    /// Switches O_NONBLOCK.
    package static func setNonBlocking(_ descriptor: borrowing BorrowedDescriptor, _ on: Bool) throws(ConnectionError) {
        let fd = descriptor.number
        let flags = try retrying("fcntl(F_GETFL)", { Int(fcntl(fd, F_GETFL)) })
        let new = on ? (Int32(flags) | O_NONBLOCK) : (Int32(flags) & ~O_NONBLOCK)
        _ = try retrying("fcntl(F_SETFL)", { Int(fcntl(fd, F_SETFL, new)) })
    }

    /// SO_RCVTIMEO: a blocking receive gives up (EAGAIN, `.wouldBlock`) after `milliseconds`.
    package static func setReceiveTimeout(
        _ descriptor: borrowing BorrowedDescriptor, milliseconds: Int
    ) throws(ConnectionError) {
        let fd = descriptor.number
        var timeout = timeval(tv_sec: milliseconds / 1000, tv_usec: (milliseconds % 1000) * 1000)
        _ = try retrying(
            "SO_RCVTIMEO",
            { Int(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))) })
    }
}
