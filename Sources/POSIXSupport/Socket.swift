public import ConnectionCore

/// The socket recipes every backend that makes its own sockets shares (bsd, async, runloop, and nio's UDP and TCP
/// listeners, whose bound socket SwiftNIO then adopts). libuv makes its sockets itself (`uv_tcp_bind`,
/// `uv_tcp_connect`): the uv backend uses only ``ConnectAttempts`` from here.
///
/// ```swift
/// let addresses = try Syscall.resolve(endpoint)
/// let (socket, _) = try Socket.connect(toFirstOf: addresses, endpoint: endpoint, options: options) {
///     socket, address, deadline throws(ConnectionError) in
///     try Socket.waitConnected(socket, to: address, endpoint: endpoint, deadline: deadline)  // poll(2)
/// }
/// ```
public enum Socket {
    // MARK: Listening

    /// The listen recipe: a socket for `address` (non-blocking when asked), IPV6_V6ONLY on IPv6 (so that `[::]`
    /// and `0.0.0.0` can be bound side by side, as on every backend), SO_REUSEADDR on TCP and SO_REUSEPORT per
    /// `options`, the buffer sizes of `options`, bind (its failure reads "listen on `endpoint`: ..."), and for TCP
    /// listen(2) with `options.backlog`. Returns the descriptor and the bound address (the real port when 0 was asked).
    public static func listen(
        on address: SocketAddress, transport: Transport, options: ConnectionOptions = ConnectionOptions(),
        nonBlocking: Bool = true, describing endpoint: Endpoint
    ) throws(ConnectionError) -> (descriptor: SocketDescriptor, local: SocketAddress) {
        let datagram = transport == .udp
        let socket = try Syscall.socket(family: address.family, datagram: datagram, nonBlocking: nonBlocking)
        let local = try socket.withDescriptor { (fd) throws(ConnectionError) in
            if address.family == .ipv6 { try Syscall.setOption(fd, .ipv6Only, true) }
            if !datagram { try Syscall.setOption(fd, .reuseAddress, options.reuseAddress) }
            if options.reusePort { try Syscall.setOption(fd, .reusePort, true) }
            try Syscall.setBufferSizes(fd, receive: options.receiveBufferSize, send: options.sendBufferSize)
            do throws(ConnectionError) {
                try Syscall.bind(fd, to: address)
            } catch {
                throw ConnectionError(
                    error.kind, "listen on \(endpoint): \(error.detail)", systemCode: error.systemCode)
            }
            if !datagram { try Syscall.listen(fd, backlog: options.backlog) }
            return try Syscall.localAddress(fd)
        }
        return (socket, local)
    }

    /// ``listen(on:transport:options:nonBlocking:describing:)`` on the first address `endpoint` resolves to for
    /// listening (`endpoint.transport` is tcp or udp).
    public static func listen(
        on endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(), nonBlocking: Bool = true
    ) throws(ConnectionError) -> (descriptor: SocketDescriptor, local: SocketAddress) {
        let address = try Syscall.resolve(endpoint, passive: true)[0]
        return try listen(
            on: address, transport: endpoint.transport, options: options, nonBlocking: nonBlocking,
            describing: endpoint)
    }

    // MARK: Connecting

    /// Starts one connect: a non-blocking socket for `address` with `options` applied (TCP_NODELAY on TCP, buffer
    /// sizes) and connect(2). Returns the socket and whether it is connected already (UDP and some loopback
    /// connects); otherwise wait for writability and call ``finishConnect(_:to:endpoint:)``.
    public static func startConnect(
        to address: SocketAddress, transport: Transport, options: ConnectionOptions
    ) throws(ConnectionError) -> (descriptor: SocketDescriptor, connected: Bool) {
        let socket = try connectingSocket(for: address, transport: transport, options: options)
        return (socket, try startConnect(socket, to: address))
    }

    /// The first half of ``startConnect(to:transport:options:)``: the non-blocking socket with `options` applied,
    /// not yet connecting. For an event loop that registers the socket before connect(2) (the async backend: see
    /// `AsyncSocket`).
    public static func connectingSocket(
        for address: SocketAddress, transport: Transport, options: ConnectionOptions
    ) throws(ConnectionError) -> SocketDescriptor {
        let datagram = transport == .udp
        let socket = try Syscall.socket(family: address.family, datagram: datagram, nonBlocking: true)
        try socket.withDescriptor { (fd) throws(ConnectionError) in
            if !datagram { try Syscall.setOption(fd, .noDelay, options.tcpNoDelay) }
            try Syscall.setBufferSizes(fd, receive: options.receiveBufferSize, send: options.sendBufferSize)
        }
        return socket
    }

    /// The second half: connect(2) on a socket from ``connectingSocket(for:transport:options:)``. `true` when it
    /// is connected already; otherwise wait for writability and call ``finishConnect(_:to:endpoint:)``.
    public static func startConnect(
        _ socket: SocketDescriptor, to address: SocketAddress
    ) throws(ConnectionError)
        -> Bool
    {
        try socket.withDescriptor { (fd) throws(ConnectionError) in try Syscall.connect(fd, to: address) }
    }

    /// After a started connect became writable: its result (SO_ERROR), thrown when the connect failed.
    public static func finishConnect(
        _ socket: SocketDescriptor, to address: SocketAddress, endpoint: Endpoint
    ) throws(ConnectionError) {
        let code = try socket.withDescriptor { (fd) throws(ConnectionError) in try Syscall.pendingError(fd) }
        if code != 0 { throw .errno(code, "connect to \(endpoint) (\(address))") }
    }

    /// Waits in poll(2), on the calling thread, until a started connect completes or `deadline` (a
    /// ``MonotonicClock`` reading) passes, then checks its result. `isCancelled` is asked after every wake-up (a
    /// canceller shuts the socket down to wake it).
    public static func waitConnected(
        _ socket: SocketDescriptor, to address: SocketAddress, endpoint: Endpoint, deadline: UInt64,
        isCancelled: () -> Bool = { false }
    ) throws(ConnectionError) {
        while true {
            let now = MonotonicClock.nanoseconds()
            guard now < deadline else {
                throw ConnectionError(.timedOut, "connect to \(endpoint) (\(address)) took longer than the timeout")
            }
            let waitMilliseconds = Int32(clamping: (deadline - now + 999_999) / 1_000_000)
            let events = try socket.withDescriptor { (fd) throws(ConnectionError) in
                try Syscall.poll(fd, events: Syscall.pollOut, timeoutMilliseconds: waitMilliseconds)
            }
            if isCancelled() { throw .cancelled("connect to \(endpoint) was cancelled") }
            if events != 0 { break }
        }
        try finishConnect(socket, to: address, endpoint: endpoint)
    }

    /// Tries `attempt` on each address in order until one succeeds (see ``ConnectAttempts`` for which failures
    /// stop the search and which error is reported). `attempt` gets the deadline of the whole connect.
    public static func connect<R>(
        toFirstOf addresses: [SocketAddress], endpoint: Endpoint, options: ConnectionOptions,
        _ attempt: (SocketAddress, _ deadline: UInt64) throws(ConnectionError) -> R
    ) throws(ConnectionError) -> R {
        var attempts = ConnectAttempts(addresses, endpoint: endpoint, timeout: options.connectTimeout)
        while let address = try attempts.next() {
            do {
                return try attempt(address, attempts.deadline)
            } catch {
                try attempts.failed(error)
            }
        }
        throw attempts.lastError
    }

    /// The async form of ``connect(toFirstOf:endpoint:options:_:)-swift.type.method``.
    public static func connect<R>(
        toFirstOf addresses: [SocketAddress], endpoint: Endpoint, options: ConnectionOptions,
        _ attempt: (SocketAddress, _ deadline: UInt64) async throws(ConnectionError) -> R
    ) async throws(ConnectionError) -> R {
        var attempts = ConnectAttempts(addresses, endpoint: endpoint, timeout: options.connectTimeout)
        while let address = try attempts.next() {
            do {
                return try await attempt(address, attempts.deadline)
            } catch {
                try attempts.failed(error)
            }
        }
        throw attempts.lastError
    }
}

/// The rule for a name that resolves to several addresses, the same on every backend: try them in the order the
/// resolver gave, move on when one fails (refused, unreachable, reset), report the last failure when none is
/// left. A cancelled connect and the deadline stop the search: `options.connectTimeout` bounds the whole connect,
/// not each address. For callback styles (runloop) that cannot loop: call ``next()`` for each attempt and
/// ``failed(_:)`` when one fails.
public struct ConnectAttempts: Sendable {
    private let addresses: [SocketAddress]
    private var index = 0
    private let endpoint: Endpoint
    /// The ``MonotonicClock`` reading by which the whole connect must be done.
    public let deadline: UInt64
    /// The error to report when every address failed.
    public private(set) var lastError: ConnectionError

    public init(_ addresses: [SocketAddress], endpoint: Endpoint, timeout: Duration) {
        self.addresses = addresses
        self.endpoint = endpoint
        deadline = MonotonicClock.nanoseconds() &+ timeout.wholeNanoseconds
        lastError = ConnectionError(.hostNotFound, "no address for \(endpoint)")
    }

    /// The next address to try, `nil` when none is left. Throws `.timedOut` when the deadline has passed.
    public mutating func next() throws(ConnectionError) -> SocketAddress? {
        guard index < addresses.count else { return nil }
        if index > 0, MonotonicClock.nanoseconds() >= deadline {
            throw ConnectionError(.timedOut, "connect to \(endpoint) took longer than the timeout")
        }
        defer { index += 1 }
        return addresses[index]
    }

    /// Records a failed attempt; rethrows it when it must end the search (cancelled, timed out).
    public mutating func failed(_ error: ConnectionError) throws(ConnectionError) {
        if error.kind == .cancelled || error.kind == .timedOut { throw error }
        lastError = error
    }
}

extension Socket {
    /// Time left until `deadline` (a ``MonotonicClock`` reading, as ``ConnectAttempts/deadline``), never less than
    /// `atLeast`: what one connect attempt may still take (timers and SwiftNIO's connect timeout want a positive
    /// duration).
    public static func timeLeft(until deadline: UInt64, atLeast: Duration = .milliseconds(1)) -> Duration {
        let now = MonotonicClock.nanoseconds()
        return max(.nanoseconds(Int64(clamping: deadline > now ? deadline - now : 0)), atLeast)
    }
}
