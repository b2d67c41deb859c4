internal import CSocketShims
public import ConnectionCore
internal import Glibc

/// The result of a call on a non-blocking descriptor: done, or "would block" (EAGAIN) as a value, not an error.
public enum IOResult<Value: Sendable>: Sendable {
    case processed(Value)
    case wouldBlock
}

extension DirectReadCount {
    /// One non-blocking stream read as `ReceiveQueue.next(into:readingNow:)` takes it: bytes, nothing yet
    /// (EAGAIN), or the end (0 bytes: the peer finished; an error: the stream failed).
    public init(reading read: () throws(ConnectionError) -> IOResult<Int>) {
        do {
            switch try read() {
            case .wouldBlock: self = .nothing
            case .processed(0): self = .end(.finished)
            case .processed(let count): self = .count(count)
            }
        } catch {
            self = .end(.failed(error))
        }
    }
}

/// Shutdown directions for ``Syscall/shutdown(_:_:)``.
public enum ShutdownHow: Sendable {
    case read, write, both
    var raw: Int32 {
        switch self {
        case .read: Int32(SHUT_RD)
        case .write: Int32(SHUT_WR)
        case .both: Int32(SHUT_RDWR)
        }
    }
}

/// Every system call the project makes on sockets, in one place (as SwiftNIO's System.swift does):
/// - errno is read at once after the failing call and turned into a ``ConnectionError`` with its name kept;
/// - EINTR is retried (except for close(2), which must not be retried on Linux);
/// - EAGAIN/EWOULDBLOCK comes back as ``IOResult/wouldBlock``, not as an error;
/// - sends always pass MSG_NOSIGNAL, so a closed peer gives EPIPE instead of killing the process;
/// - every descriptor is created close-on-exec.
public enum Syscall {
    @inline(__always)
    private static func retrying(
        _ operation: @autoclosure () -> String, _ body: () -> Int
    ) throws(ConnectionError)
        -> Int
    {
        while true {
            let result = body()
            if result >= 0 { return result }
            let code = Glibc.errno
            if code == EINTR { continue }
            throw .errno(code, operation())
        }
    }

    @inline(__always)
    static func retryingIO(
        _ operation: @autoclosure () -> String, _ body: () -> Int
    )
        throws(ConnectionError) -> IOResult<Int>
    {
        while true {
            let result = body()
            if result >= 0 { return .processed(result) }
            let code = Glibc.errno
            if code == EINTR { continue }
            if code == EAGAIN || code == EWOULDBLOCK { return .wouldBlock }
            throw .errno(code, operation())
        }
    }

    // MARK: Creating and configuring

    /// socket(2), close-on-exec, optionally non-blocking.
    public static func socket(
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
    public static func setOption(_ fd: Int32, level: Int32, name: Int32, value: Int32) throws(ConnectionError) {
        var value = value
        _ = try retrying(
            "setsockopt(\(level), \(name))",
            { Int(setsockopt(fd, level, name, &value, socklen_t(MemoryLayout<Int32>.size))) })
    }

    /// getsockopt(2) reading an `Int32`.
    public static func getOption(_ fd: Int32, level: Int32, name: Int32) throws(ConnectionError) -> Int32 {
        var value: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        _ = try retrying("getsockopt(\(level), \(name))", { Int(getsockopt(fd, level, name, &value, &length)) })
        return value
    }

    /// TCP_NODELAY on or off.
    public static func setNoDelay(_ fd: Int32, _ on: Bool) throws(ConnectionError) {
        try setOption(fd, level: Int32(IPPROTO_TCP), name: TCP_NODELAY, value: on ? 1 : 0)
    }

    /// SO_REUSEADDR on or off.
    public static func setReuseAddress(_ fd: Int32, _ on: Bool) throws(ConnectionError) {
        try setOption(fd, level: SOL_SOCKET, name: SO_REUSEADDR, value: on ? 1 : 0)
    }

    /// SO_RCVBUF / SO_SNDBUF when given.
    public static func setBufferSizes(_ fd: Int32, receive: Int?, send: Int?) throws(ConnectionError) {
        if let receive { try setOption(fd, level: SOL_SOCKET, name: SO_RCVBUF, value: Int32(clamping: receive)) }
        if let send { try setOption(fd, level: SOL_SOCKET, name: SO_SNDBUF, value: Int32(clamping: send)) }
    }

    /// IPV6_V6ONLY, so an IPv6 listener on `::` does not also take IPv4.
    public static func setIPv6Only(_ fd: Int32, _ on: Bool) throws(ConnectionError) {
        try setOption(fd, level: Int32(IPPROTO_IPV6), name: IPV6_V6ONLY, value: on ? 1 : 0)
    }

    /// The pending socket error (SO_ERROR), cleared by reading it; 0 when none.
    public static func pendingError(_ fd: Int32) throws(ConnectionError) -> Int32 {
        try getOption(fd, level: SOL_SOCKET, name: SO_ERROR)
    }

    /// Switches O_NONBLOCK.
    public static func setNonBlocking(_ fd: Int32, _ on: Bool) throws(ConnectionError) {
        let flags = try retrying("fcntl(F_GETFL)", { Int(fcntl(fd, F_GETFL)) })
        let new = on ? (Int32(flags) | O_NONBLOCK) : (Int32(flags) & ~O_NONBLOCK)
        _ = try retrying("fcntl(F_SETFL)", { Int(fcntl(fd, F_SETFL, new)) })
    }

    // MARK: Addresses

    /// bind(2).
    public static func bind(_ fd: Int32, to address: SocketAddress) throws(ConnectionError) {
        _ = try retrying("bind to \(address)", { address.withSockAddr { Int(Glibc.bind(fd, $0, $1)) } })
    }

    /// listen(2).
    public static func listen(_ fd: Int32, backlog: Int32) throws(ConnectionError) {
        _ = try retrying("listen", { Int(Glibc.listen(fd, backlog)) })
    }

    /// getsockname(2).
    public static func localAddress(_ fd: Int32) throws(ConnectionError) -> SocketAddress {
        try address(of: fd, "getsockname", getsockname)
    }

    /// getpeername(2).
    public static func peerAddress(_ fd: Int32) throws(ConnectionError) -> SocketAddress {
        try address(of: fd, "getpeername", getpeername)
    }

    private static func address(
        of fd: Int32, _ name: String,
        _ call: (Int32, UnsafeMutablePointer<sockaddr>, UnsafeMutablePointer<socklen_t>) -> Int32
    ) throws(ConnectionError) -> SocketAddress {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = try retrying(
            name,
            {
                withUnsafeMutablePointer(to: &storage) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Int(call(fd, $0, &length)) }
                }
            })
        guard let address = withUnsafeBytes(of: &storage, { SocketAddress($0.baseAddress!, length: Int(length)) })
        else { throw ConnectionError(.unsupported, "\(name): not an IP socket") }
        return address
    }

    // MARK: Connecting

    /// accept4(2), close-on-exec. Returns `nil` on EAGAIN (non-blocking listeners).
    public static func accept(
        _ fd: Int32, nonBlocking: Bool = false
    ) throws(ConnectionError)
        -> (fd: Int32, peer: SocketAddress)?
    {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        while true {
            let result = withUnsafeMutablePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    csock_accept4(fd, $0, &length, nonBlocking ? 1 : 0)
                }
            }
            if result >= 0 {
                guard let peer = withUnsafeBytes(of: &storage, { SocketAddress($0.baseAddress!, length: Int(length)) })
                else {
                    _ = Glibc.close(result)
                    throw ConnectionError(.unsupported, "accept: not an IP peer")
                }
                return (result, peer)
            }
            let code = Glibc.errno
            switch code {
            case EINTR, ECONNABORTED: continue  // a client that gave up before we accepted it: take the next one
            case EAGAIN, EWOULDBLOCK: return nil
            default: throw .errno(code, "accept")
            }
        }
    }

    /// connect(2). Returns `true` when connected, `false` when the connect is in progress (EINPROGRESS on a
    /// non-blocking socket, or EINTR on a blocking one): wait for writability, then read ``pendingError(_:)``.
    public static func connect(_ fd: Int32, to address: SocketAddress) throws(ConnectionError) -> Bool {
        let result = address.withSockAddr { Glibc.connect(fd, $0, $1) }
        if result == 0 { return true }
        let code = Glibc.errno
        if code == EINPROGRESS || code == EINTR || code == EALREADY { return false }
        throw .errno(code, "connect to \(address)")
    }

    /// poll(2) on one descriptor. Returns the revents, 0 on time-out. `timeoutMilliseconds` < 0 waits forever.
    public static func poll(_ fd: Int32, events: Int16, timeoutMilliseconds: Int32) throws(ConnectionError) -> Int16 {
        try poll(fd, events, -1, 0, timeoutMilliseconds: timeoutMilliseconds).0
    }

    /// poll(2) on two descriptors (a negative descriptor is left out, as poll does). Returns each one's revents,
    /// both 0 on time-out. `timeoutMilliseconds` < 0 (the default) waits until one of them is ready.
    public static func poll(
        _ first: Int32, _ firstEvents: Int16, _ second: Int32, _ secondEvents: Int16, timeoutMilliseconds: Int32 = -1
    ) throws(ConnectionError) -> (Int16, Int16) {
        var fds = (
            pollfd(fd: first, events: firstEvents, revents: 0), pollfd(fd: second, events: secondEvents, revents: 0)
        )
        let count = try withUnsafeMutableBytes(of: &fds) { (raw) throws(ConnectionError) -> Int in
            let pointer = raw.baseAddress!.assumingMemoryBound(to: pollfd.self)
            return try retrying("poll", { Int(Glibc.poll(pointer, 2, timeoutMilliseconds)) })
        }
        return count == 0 ? (0, 0) : (fds.0.revents, fds.1.revents)
    }

    /// POLLIN, POLLOUT, POLLERR and POLLHUP, for ``poll(_:events:timeoutMilliseconds:)``.
    public static let pollIn = Int16(POLLIN)
    public static let pollOut = Int16(POLLOUT)
    public static let pollError = Int16(POLLERR)
    public static let pollHangUp = Int16(POLLHUP)

    // MARK: Data

    /// send(2) with MSG_NOSIGNAL (and MSG_DONTWAIT when `dontWait`).
    public static func send(
        _ fd: Int32, _ buffer: UnsafeRawBufferPointer, dontWait: Bool = false
    )
        throws(ConnectionError) -> IOResult<Int>
    {
        let flags = Int32(MSG_NOSIGNAL) | (dontWait ? Int32(MSG_DONTWAIT) : 0)
        return try retryingIO("send", { Glibc.send(fd, buffer.baseAddress, buffer.count, flags) })
    }

    /// recv(2) (MSG_DONTWAIT when `dontWait`). 0 means end of stream on TCP and an empty datagram on UDP.
    public static func recv(
        _ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer, dontWait: Bool = false
    )
        throws(ConnectionError) -> IOResult<Int>
    {
        let flags = dontWait ? Int32(MSG_DONTWAIT) : 0
        return try retryingIO("recv", { Glibc.recv(fd, buffer.baseAddress, buffer.count, flags) })
    }

    /// recv(2) on a datagram socket with MSG_TRUNC: the result is the datagram's real size, which exceeds the
    /// buffer when it was truncated.
    public static func recvDatagram(
        _ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer, dontWait: Bool = false
    )
        throws(ConnectionError) -> IOResult<Int>
    {
        let flags = Int32(MSG_TRUNC) | (dontWait ? Int32(MSG_DONTWAIT) : 0)
        return try retryingIO("recv", { Glibc.recv(fd, buffer.baseAddress, buffer.count, flags) })
    }

    /// sendto(2) with MSG_NOSIGNAL (and MSG_DONTWAIT when `dontWait`).
    public static func sendTo(
        _ fd: Int32, _ buffer: UnsafeRawBufferPointer, to address: SocketAddress, dontWait: Bool = false
    ) throws(ConnectionError) -> IOResult<Int> {
        let flags = Int32(MSG_NOSIGNAL) | (dontWait ? Int32(MSG_DONTWAIT) : 0)
        return try retryingIO(
            "sendto \(address)",
            { address.withSockAddr { Glibc.sendto(fd, buffer.baseAddress, buffer.count, flags, $0, $1) } })
    }

    /// Sends `datagrams[start...]` in order, as few system calls as the kernel allows: runs of equal-sized
    /// datagrams as one segmented send (UDP GSO) when ``udpSegmentationAvailable``, the rest by sendmmsg(2).
    /// Returns how many of them left (at least one), `.wouldBlock` when none could (MSG_DONTWAIT when
    /// `dontWait`); throws only when not even the first went.
    public static func sendDatagrams(
        _ fd: Int32, _ datagrams: [UnsafeRawBufferPointer], from start: Int = 0, to address: SocketAddress? = nil,
        dontWait: Bool = false
    ) throws(ConnectionError) -> IOResult<Int> {
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
    public static var udpSegmentationAvailable: Bool { csock_udp_gso_state() == 1 }
    /// Whether this kernel can coalesce UDP receives (UDP_GRO), probed once. The backends do not use it: tried on
    /// the UDP servers (the coalesced reads split back into datagrams), it let a server take datagrams off the
    /// kernel faster than its consumers could use them, so fewer arrived (the 1,400-byte pump's sink received
    /// 31-57k of 192k datagrams with it, 45-108k without, runloop and async, same and cross placement).
    public static var udpReceiveCoalescingAvailable: Bool { csock_udp_gro_state() == 1 }

    /// recvfrom(2) with MSG_TRUNC: returns the datagram's real size (above the buffer size when truncated) and
    /// its sender.
    public static func recvFrom(
        _ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer, dontWait: Bool = false
    )
        throws(ConnectionError) -> IOResult<(count: Int, from: SocketAddress)>
    {
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
    public static func shutdown(_ fd: Int32, _ how: ShutdownHow) throws(ConnectionError) {
        if Glibc.shutdown(fd, how.raw) != 0 {
            let code = Glibc.errno
            if code != ENOTCONN { throw .errno(code, "shutdown") }
        }
    }

    /// Resets a connected TCP socket: connect(2) with `AF_UNSPEC` makes Linux send a RST at once, discard what is
    /// still queued to send, wake every thread blocked on the socket and leave it unconnected, so that the
    /// shutdown and close that follow send nothing more (SO_LINGER 0 would only reset at close(2), and only if no
    /// shutdown sent a FIN first). Not a TCP socket, or not connected: nothing happens.
    public static func resetConnection(_ fd: Int32) {
        var address = sockaddr()
        address.sa_family = sa_family_t(AF_UNSPEC)
        _ = Glibc.connect(fd, &address, socklen_t(MemoryLayout<sockaddr>.size))
    }

    /// close(2), never retried (on Linux the descriptor is gone even when EINTR is returned).
    public static func close(_ fd: Int32) {
        _ = Glibc.close(fd)
    }

    /// Writes `text` to standard error in one write(2) (a log line from a library, without Foundation).
    public static func writeStandardError(_ text: String) {
        var text = text
        text.withUTF8 { bytes in _ = Glibc.write(2, bytes.baseAddress, bytes.count) }
    }

    // MARK: TCP_INFO

    /// Round-trip time and retransmission counters of a TCP socket.
    public struct TCPInfo: Sendable, Hashable {
        /// Smoothed round-trip time in microseconds.
        public var rttMicroseconds: UInt32
        /// Round-trip time variation in microseconds.
        public var rttVarianceMicroseconds: UInt32
        /// Congestion window in segments.
        public var congestionWindow: UInt32
        /// Segments retransmitted over the connection's life.
        public var totalRetransmits: UInt32
        /// Segments currently considered lost.
        public var lost: UInt32
    }

    /// getsockopt(TCP_INFO).
    public static func tcpInfo(_ fd: Int32) throws(ConnectionError) -> TCPInfo {
        var info = csock_tcp_info()
        _ = try retrying("getsockopt(TCP_INFO)", { Int(csock_tcp_info(fd, &info)) })
        return TCPInfo(
            rttMicroseconds: info.rtt_us, rttVarianceMicroseconds: info.rttvar_us, congestionWindow: info.snd_cwnd,
            totalRetransmits: info.total_retrans, lost: info.lost)
    }

    // MARK: Name resolution

    /// getaddrinfo(3) for an endpoint: numeric hosts are parsed without any lookup; names go through the
    /// system resolver (/etc/hosts, then DNS). Names under `.invalid` fail at once without a query, as RFC 6761
    /// asks of resolver APIs.
    /// - Parameter passive: for listening (AI_PASSIVE).
    public static func resolve(_ endpoint: Endpoint, passive: Bool = false) throws(ConnectionError) -> [SocketAddress] {
        let hostText = endpoint.host.literal
        if case .name(let name) = endpoint.host {
            let trimmed = name.hasSuffix(".") ? String(name.dropLast()) : name
            if trimmed == "invalid" || trimmed.hasSuffix(".invalid") {
                throw ConnectionError(
                    .hostNotFound, "'\(name)' does not resolve (the .invalid domain never does, RFC 6761)",
                    systemCode: .init(domain: "gai", code: EAI_NONAME, name: "EAI_NONAME"))
            }
        }
        var hints = addrinfo()
        hints.ai_socktype = endpoint.transport == .udp ? Int32(SOCK_DGRAM.rawValue) : Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_ADDRCONFIG | (passive ? AI_PASSIVE : 0)
        switch endpoint.host {
        case .ipv4: hints.ai_family = AF_INET; hints.ai_flags = AI_NUMERICHOST | (passive ? AI_PASSIVE : 0)
        case .ipv6: hints.ai_family = AF_INET6; hints.ai_flags = AI_NUMERICHOST | (passive ? AI_PASSIVE : 0)
        case .name: hints.ai_family = AF_UNSPEC
        }
        var list: UnsafeMutablePointer<addrinfo>?
        var status = getaddrinfo(hostText, String(endpoint.port), &hints, &list)
        if status == EAI_SYSTEM && Glibc.errno == EINTR {
            status = getaddrinfo(hostText, String(endpoint.port), &hints, &list)
        }
        guard status == 0 else {
            let kind: ConnectionError.Kind
            switch status {
            case EAI_NONAME, EAI_AGAIN, EAI_FAIL, csock_EAI_NODATA, csock_EAI_ADDRFAMILY: kind = .hostNotFound
            case EAI_MEMORY: kind = .resourceExhausted
            default: kind = .invalidEndpoint
            }
            let name = gaiName(status)
            if case .name = endpoint.host {
                throw ConnectionError(
                    kind, "cannot resolve '\(hostText)': \(String(cString: gai_strerror(status)))",
                    systemCode: .init(domain: "gai", code: status, name: name))
            }
            throw ConnectionError(
                .invalidEndpoint, "'\(hostText)' is not a valid address: \(String(cString: gai_strerror(status)))",
                systemCode: .init(domain: "gai", code: status, name: name))
        }
        defer { freeaddrinfo(list) }
        var addresses: [SocketAddress] = []
        var cursor = list
        while let entry = cursor {
            if let address = entry.pointee.ai_addr.flatMap({ SocketAddress($0, length: Int(entry.pointee.ai_addrlen)) }
            ),
                !addresses.contains(address)
            {
                addresses.append(address)
            }
            cursor = entry.pointee.ai_next
        }
        guard !addresses.isEmpty else {
            throw ConnectionError(.hostNotFound, "'\(hostText)' has no IPv4 or IPv6 address")
        }
        return addresses
    }

    private static func gaiName(_ status: Int32) -> String {
        switch status {
        case EAI_NONAME: "EAI_NONAME"
        case EAI_AGAIN: "EAI_AGAIN"
        case EAI_FAIL: "EAI_FAIL"
        case csock_EAI_NODATA: "EAI_NODATA"
        case EAI_FAMILY: "EAI_FAMILY"
        case csock_EAI_ADDRFAMILY: "EAI_ADDRFAMILY"
        case EAI_SERVICE: "EAI_SERVICE"
        case EAI_MEMORY: "EAI_MEMORY"
        case EAI_SYSTEM: "EAI_SYSTEM"
        default: "EAI \(status)"
        }
    }

    // MARK: epoll and eventfd

    /// epoll_create1(EPOLL_CLOEXEC).
    public static func epollCreate() throws(ConnectionError) -> Int32 {
        Int32(try retrying("epoll_create1", { Int(csock_epoll_create()) }))
    }

    /// epoll_ctl(2). `operation`: ``epollAdd``, ``epollModify`` or ``epollDelete``.
    public static func epollControl(
        _ epfd: Int32, _ operation: Int32, _ fd: Int32, events: UInt32, data: UInt64
    )
        throws(ConnectionError)
    {
        _ = try retrying("epoll_ctl", { Int(csock_epoll_ctl(epfd, operation, fd, events, data)) })
    }

    /// epoll_wait(2); EINTR returns 0 events. Fills `events` and `data` pairwise.
    public static func epollWait(
        _ epfd: Int32, events: UnsafeMutablePointer<UInt32>, data: UnsafeMutablePointer<UInt64>, capacity: Int32,
        timeoutMilliseconds: Int32
    ) throws(ConnectionError) -> Int {
        let result = csock_epoll_wait(epfd, events, data, capacity, timeoutMilliseconds)
        if result >= 0 { return Int(result) }
        let code = Glibc.errno
        if code == EINTR { return 0 }
        throw .errno(code, "epoll_wait")
    }

    public static let epollAdd = csock_EPOLL_CTL_ADD
    public static let epollModify = csock_EPOLL_CTL_MOD
    public static let epollDelete = csock_EPOLL_CTL_DEL
    public static let epollIn = csock_EPOLLIN
    public static let epollOut = csock_EPOLLOUT
    public static let epollError = csock_EPOLLERR
    public static let epollHangUp = csock_EPOLLHUP
    public static let epollReadHangUp = csock_EPOLLRDHUP
    public static let epollEdgeTriggered = csock_EPOLLET
    public static let epollOneShot = csock_EPOLLONESHOT

    /// eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK).
    public static func eventFD() throws(ConnectionError) -> Int32 {
        Int32(try retrying("eventfd", { Int(csock_eventfd()) }))
    }

    /// Adds 1 to an eventfd (wakes a waiting epoll).
    public static func eventFDSignal(_ fd: Int32) {
        _ = csock_eventfd_signal(fd)
    }

    /// Reads an eventfd back to 0.
    public static func eventFDDrain(_ fd: Int32) {
        _ = csock_eventfd_drain(fd)
    }

    // MARK: Process

    /// Ignores SIGPIPE for the whole process (belt and braces: every send already passes MSG_NOSIGNAL).
    public static func ignoreSIGPIPE() {
        _ = signal(SIGPIPE, SIG_IGN)
    }

    /// The number of open file descriptors of this process (entries of /proc/self/fd, minus the one used to
    /// list them).
    public static func openDescriptorCount() -> Int {
        guard let directory = opendir("/proc/self/fd") else { return -1 }
        defer { closedir(directory) }
        var count = 0
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { $0.first }
            if name != UInt8(ascii: ".") { count += 1 }
        }
        return count - 1
    }

    /// The open descriptors of this process with what they point at, for leak reports.
    public static func openDescriptors() -> [String] {
        guard let directory = opendir("/proc/self/fd") else { return [] }
        let own = dirfd(directory)
        defer { closedir(directory) }
        var result: [String] = []
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            guard let fd = Int32(name), fd != own else { continue }
            var target = [CChar](repeating: 0, count: 256)
            let count = readlink("/proc/self/fd/\(name)", &target, 255)
            let text = count > 0 ? String(decoding: target[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self) : "?"
            result.append("\(fd) -> \(text)")
        }
        return result
    }
}

extension Syscall {
    /// Pins every thread of this process to `cpu` (threads created later inherit it from their creator).
    /// - Returns: how many threads were pinned.
    @discardableResult
    public static func pinProcess(toCPU cpu: Int) throws(ConnectionError) -> Int {
        guard let directory = opendir("/proc/self/task") else { throw .errno(Glibc.errno, "opendir /proc/self/task") }
        defer { closedir(directory) }
        var pinned = 0
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            guard let tid = Int32(name) else { continue }
            if csock_pin_thread(tid, Int32(cpu)) != 0 {
                let code = Glibc.errno
                if code == ESRCH { continue }  // the thread ended meanwhile
                throw .errno(code, "sched_setaffinity(cpu \(cpu))")
            }
            pinned += 1
        }
        return pinned
    }

    /// The number of CPUs online.
    public static var cpuCount: Int { Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))) }
}

extension Syscall {
    /// ``resolve(_:passive:)`` without blocking the caller: numeric addresses are parsed at once; host names are
    /// looked up on a thread of their own (getaddrinfo may wait for DNS), never on Swift's cooperative pool.
    public static func resolveAsync(
        _ endpoint: Endpoint, passive: Bool = false
    ) async throws(ConnectionError)
        -> [SocketAddress]
    {
        if case .name = endpoint.host {
            let result: Result<[SocketAddress], ConnectionError> = await PosixThread.spawnAndAwait(name: "resolve") {
                deliver in
                deliver(Result { () throws(ConnectionError) in try resolve(endpoint, passive: passive) })
            }
            return try result.get()
        }
        return try resolve(endpoint, passive: passive)
    }
}

extension Syscall {
    /// Pins only the calling thread to `cpu`.
    public static func pinCurrentThread(toCPU cpu: Int) throws(ConnectionError) {
        if csock_pin_thread(0, Int32(cpu)) != 0 { throw .errno(Glibc.errno, "sched_setaffinity(cpu \(cpu))") }
    }
}

extension Syscall {
    /// recv(MSG_PEEK | MSG_DONTWAIT) of one byte: 1 when data is waiting, 0 at the end of the stream,
    /// `.wouldBlock` when nothing is there yet.
    public static func peekByte(_ fd: Int32) throws(ConnectionError) -> IOResult<Int> {
        var byte: UInt8 = 0
        return try retryingIO("recv(MSG_PEEK)", { Glibc.recv(fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT)) })
    }

    /// FIONREAD: bytes waiting in the receive buffer (0 on error).
    public static func bytesReadable(_ fd: Int32) -> Int {
        var count: Int32 = 0
        return ioctl(fd, UInt(FIONREAD), &count) == 0 ? Int(count) : 0
    }

    /// TIOCOUTQ: bytes in the send buffer not yet acknowledged by the peer (0 on error).
    public static func bytesUnsent(_ fd: Int32) -> Int {
        var count: Int32 = 0
        return ioctl(fd, UInt(TIOCOUTQ), &count) == 0 ? Int(count) : 0
    }

    /// IP_ADD_MEMBERSHIP: joins an IPv4 multicast group on the interface with address `interface`.
    public static func joinMulticastGroup(
        _ fd: Int32, group: SocketAddress, interface: SocketAddress
    )
        throws(ConnectionError)
    {
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
    public static func setMulticastAll(_ fd: Int32, _ on: Bool) throws(ConnectionError) {
        try setOption(fd, level: Int32(IPPROTO_IP), name: 49 /* IP_MULTICAST_ALL */, value: on ? 1 : 0)
    }

    /// IP_MULTICAST_IF and IP_MULTICAST_LOOP for a multicast sender.
    public static func setMulticastSender(_ fd: Int32, interface: SocketAddress, loop: Bool) throws(ConnectionError) {
        var address = in_addr()
        interface.withSockAddr { pointer, _ in address = UnsafeRawPointer(pointer).load(as: sockaddr_in.self).sin_addr }
        _ = try retrying(
            "IP_MULTICAST_IF",
            { Int(setsockopt(fd, Int32(IPPROTO_IP), IP_MULTICAST_IF, &address, socklen_t(MemoryLayout<in_addr>.size))) }
        )
        var value: UInt8 = loop ? 1 : 0
        _ = try retrying("IP_MULTICAST_LOOP", { Int(setsockopt(fd, Int32(IPPROTO_IP), IP_MULTICAST_LOOP, &value, 1)) })
    }

    /// SO_RCVTIMEO: a blocking receive gives up (EAGAIN, `.wouldBlock`) after `milliseconds`.
    public static func setReceiveTimeout(_ fd: Int32, milliseconds: Int) throws(ConnectionError) {
        var timeout = timeval(tv_sec: milliseconds / 1000, tv_usec: (milliseconds % 1000) * 1000)
        _ = try retrying(
            "SO_RCVTIMEO",
            { Int(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))) })
    }
}
