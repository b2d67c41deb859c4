internal import CSocketShims
package import ConnectionCore
internal import Glibc

// Creating a socket and setting its options (setsockopt, fcntl).
extension Syscall {
    /// socket(2), close-on-exec, optionally non-blocking.
    package static func socket(
        family: SocketAddress.Family, datagram: Bool, nonBlocking: Bool = false
    )
        throws(ConnectionError) -> Int32
    {
        var type = (datagram ? Int32(SOCK_DGRAM.rawValue) : Int32(SOCK_STREAM.rawValue)) | Int32(SOCK_CLOEXEC.rawValue)
        if nonBlocking { type |= Int32(SOCK_NONBLOCK.rawValue) }
        let domain = family == .ipv4 ? AF_INET : AF_INET6
        return Int32(try retrying("socket", { Int(Glibc.socket(domain, type, 0)) }))
    }

    /// setsockopt(2) with an `Int32` value.
    package static func setOption(_ fd: Int32, level: Int32, name: Int32, value: Int32) throws(ConnectionError) {
        var value = value
        _ = try retrying(
            "setsockopt(\(level), \(name))",
            { Int(setsockopt(fd, level, name, &value, socklen_t(MemoryLayout<Int32>.size))) })
    }

    /// getsockopt(2) reading an `Int32`.
    package static func getOption(_ fd: Int32, level: Int32, name: Int32) throws(ConnectionError) -> Int32 {
        var value: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        _ = try retrying("getsockopt(\(level), \(name))", { Int(getsockopt(fd, level, name, &value, &length)) })
        return value
    }

    /// TCP_NODELAY on or off.
    package static func setNoDelay(_ fd: Int32, _ on: Bool) throws(ConnectionError) {
        try setOption(fd, level: Int32(IPPROTO_TCP), name: TCP_NODELAY, value: on ? 1 : 0)
    }

    /// SO_REUSEADDR on or off.
    package static func setReuseAddress(_ fd: Int32, _ on: Bool) throws(ConnectionError) {
        try setOption(fd, level: SOL_SOCKET, name: SO_REUSEADDR, value: on ? 1 : 0)
    }

    /// SO_REUSEPORT on or off.
    package static func setReusePort(_ fd: Int32, _ on: Bool) throws(ConnectionError) {
        try setOption(fd, level: SOL_SOCKET, name: SO_REUSEPORT, value: on ? 1 : 0)
    }

    /// SO_RCVBUF / SO_SNDBUF when given.
    package static func setBufferSizes(_ fd: Int32, receive: Int?, send: Int?) throws(ConnectionError) {
        if let receive { try setOption(fd, level: SOL_SOCKET, name: SO_RCVBUF, value: Int32(clamping: receive)) }
        if let send { try setOption(fd, level: SOL_SOCKET, name: SO_SNDBUF, value: Int32(clamping: send)) }
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

    /// IPV6_V6ONLY, so an IPv6 listener on `::` does not also take IPv4.
    package static func setIPv6Only(_ fd: Int32, _ on: Bool) throws(ConnectionError) {
        try setOption(fd, level: Int32(IPPROTO_IPV6), name: IPV6_V6ONLY, value: on ? 1 : 0)
    }

    /// The pending socket error (SO_ERROR), cleared by reading it; 0 when none.
    package static func pendingError(_ fd: Int32) throws(ConnectionError) -> Int32 {
        try getOption(fd, level: SOL_SOCKET, name: SO_ERROR)
    }

    /// Switches O_NONBLOCK.
    package static func setNonBlocking(_ fd: Int32, _ on: Bool) throws(ConnectionError) {
        let flags = try retrying("fcntl(F_GETFL)", { Int(fcntl(fd, F_GETFL)) })
        let new = on ? (Int32(flags) | O_NONBLOCK) : (Int32(flags) & ~O_NONBLOCK)
        _ = try retrying("fcntl(F_SETFL)", { Int(fcntl(fd, F_SETFL, new)) })
    }

    /// SO_RCVTIMEO: a blocking receive gives up (EAGAIN, `.wouldBlock`) after `milliseconds`.
    package static func setReceiveTimeout(_ fd: Int32, milliseconds: Int) throws(ConnectionError) {
        var timeout = timeval(tv_sec: milliseconds / 1000, tv_usec: (milliseconds % 1000) * 1000)
        _ = try retrying(
            "SO_RCVTIMEO",
            { Int(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))) })
    }
}
