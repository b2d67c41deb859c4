public import ConnectionCore
public import POSIXSupport
import Synchronization

/// The blocking style: a BSD socket used from your own thread. Every call blocks that thread until done, as
/// `socket(2)`, `connect(2)`, `send(2)` and `recv(2)` do; nothing here is async.
///
/// ```swift
/// let socket = try BSDSocket.connect(to: Endpoint(url: "tcp://127.0.0.1:9000"))
/// defer { socket.close() }
/// try socket.sendAll(Array("hello".utf8))
/// let reply = try socket.receive(maximumLength: 5)   // [] means the peer closed
/// ```
///
/// Rules, as for any descriptor:
/// 1. One thread may receive while another sends; two threads must not both send (or both receive) at once.
/// 2. To wake a thread blocked in ``receive(into:)`` or `accept()`, call ``shutdown(_:)`` from another
///    thread. ``close()`` may come from any thread at any time: a call under way keeps the descriptor number
///    until it returns (the `close(2)` waits for it), and calls after it throw `.closed`.
/// 3. Sends never raise SIGPIPE (MSG_NOSIGNAL): a vanished peer is a `.reset` error.
public final class BSDSocket: Sendable {
    /// `.tcp` or `.udp`.
    public let transport: Transport
    /// IPv4 or IPv6.
    public let family: SocketAddress.Family
    private let owner: SocketDescriptor

    init(_ owner: SocketDescriptor, transport: Transport, family: SocketAddress.Family) {
        self.owner = owner
        self.transport = transport
        self.family = family
    }

    // MARK: Making sockets

    /// Resolves `endpoint` and connects, blocking until connected or `options.connectTimeout` has passed.
    /// Tries each resolved address in order. For UDP, fixes the peer address (no packet is sent).
    public static func connect(
        to endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions()
    )
        throws(ConnectionError) -> BSDSocket
    {
        try connect(to: endpoint, options: options, attempt: ConnectAttempt())
    }

    static func connect(
        to endpoint: Endpoint, options: ConnectionOptions, attempt: ConnectAttempt
    )
        throws(ConnectionError) -> BSDSocket
    {
        guard endpoint.transport == .tcp || endpoint.transport == .udp else {
            throw ConnectionError(.unsupported, "BSDSocket speaks tcp and udp, not \(endpoint.transport)")
        }
        let addresses = try Syscall.resolve(endpoint)
        return try Socket.connect(toFirstOf: addresses, endpoint: endpoint, options: options) {
            (address, deadline) throws(ConnectionError) in
            let (owner, connected) = try Socket.startConnect(
                to: address, transport: endpoint.transport, options: options)
            if !connected {
                try attempt.begin(owner)
                defer { attempt.end() }
                try Socket.waitConnected(
                    owner, to: address, endpoint: endpoint, deadline: deadline, isCancelled: { attempt.isCancelled })
            }
            // Non-blocking while connecting so that the wait can be bounded; blocking from here, in this style.
            try owner.withDescriptor { (fd) throws(ConnectionError) in try Syscall.setNonBlocking(fd, false) }
            return BSDSocket(owner, transport: endpoint.transport, family: address.family)
        }
    }

    /// Resolves `endpoint` and binds: for TCP also listens (SO_REUSEADDR per `options`); for UDP, a socket
    /// ready for ``receiveFrom(maximumLength:)`` and ``send(_:to:)``. Port 0 picks a free port: read it back
    /// from ``localAddress``.
    public static func listen(
        on endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions()
    )
        throws(ConnectionError) -> BSDSocket
    {
        guard endpoint.transport == .tcp || endpoint.transport == .udp else {
            throw ConnectionError(.unsupported, "BSDSocket speaks tcp and udp, not \(endpoint.transport)")
        }
        let (owner, local) = try Socket.listen(on: endpoint, options: options, nonBlocking: false)
        return BSDSocket(owner, transport: endpoint.transport, family: local.family)
    }

    private func apply(_ options: ConnectionOptions) throws(ConnectionError) {
        try withDescriptor { [transport] (fd) throws(ConnectionError) in
            if transport == .tcp { try Syscall.setOption(fd, .noDelay, options.tcpNoDelay) }
            try Syscall.setBufferSizes(fd, receive: options.receiveBufferSize, send: options.sendBufferSize)
        }
    }

    /// Blocks until a client connects (TCP listening sockets), and returns its socket with `options` applied.
    /// Throws once the socket is shut down from another thread.
    public func accept(options: ConnectionOptions = ConnectionOptions()) throws(ConnectionError) -> BSDSocket {
        guard let (client, peer) = try withDescriptor({ (fd) throws(ConnectionError) in try Syscall.accept(fd) })
        else {
            throw ConnectionError(.system, "accept on a blocking socket returned EAGAIN")
        }
        let socket = BSDSocket(client, transport: .tcp, family: peer.family)
        try socket.apply(options)
        return socket
    }

    // MARK: Data

    /// One send(2): blocks until at least one byte is taken; returns how many were (a partial write is
    /// possible). UDP: the whole datagram or an error (`.messageTooLarge` above 65,507 bytes on IPv4).
    public func send(_ bytes: UnsafeRawBufferPointer) throws(ConnectionError) -> Int {
        switch try withDescriptor({ (fd) throws(ConnectionError) in try Syscall.send(fd, bytes) }) {
        case .processed(let count): return count
        case .wouldBlock: throw ConnectionError(.timedOut, "send timed out (SO_SNDTIMEO)")
        }
    }

    /// Sends every byte, looping over partial writes.
    public func sendAll(_ bytes: [UInt8]) throws(ConnectionError) {
        try bytes.withBytes { (buffer) throws(ConnectionError) in
            var offset = 0
            repeat {
                offset += try send(UnsafeRawBufferPointer(rebasing: buffer[offset...]))
            } while offset < buffer.count
        }
    }

    /// One non-blocking send(2) (MSG_DONTWAIT): `.wouldBlock` instead of waiting when the send buffer is full.
    public func trySend(_ bytes: UnsafeRawBufferPointer) throws(ConnectionError) -> IOResult<Int> {
        try withDescriptor { (fd) throws(ConnectionError) in try Syscall.send(fd, bytes, dontWait: true) }
    }

    /// What the socket takes of `bytes` now, without blocking (the gathered sends' write: `Syscall.sendAvailable`).
    func sendAvailable(_ bytes: UnsafeRawBufferPointer) throws(ConnectionError) -> Int {
        try withDescriptor { (fd) throws(ConnectionError) in try Syscall.sendAvailable(fd, bytes) }
    }

    /// One recv(2): blocks until data arrives. Returns the count; 0 is the end of the stream on TCP (and an
    /// empty datagram on UDP).
    public func receive(into buffer: UnsafeMutableRawBufferPointer) throws(ConnectionError) -> Int {
        switch try receive(into: buffer, dontWait: false) {
        case .processed(let count): return count
        case .wouldBlock: throw ConnectionError(.timedOut, "receive timed out (SO_RCVTIMEO)")
        }
    }

    /// One non-blocking recv(2) (MSG_DONTWAIT): `.wouldBlock` when nothing is waiting.
    public func tryReceive(into buffer: UnsafeMutableRawBufferPointer) throws(ConnectionError) -> IOResult<Int> {
        try receive(into: buffer, dontWait: true)
    }

    private func receive(
        into buffer: UnsafeMutableRawBufferPointer, dontWait: Bool
    ) throws(ConnectionError) -> IOResult<Int> {
        let result = try withDescriptor { [transport] (fd) throws(ConnectionError) in
            transport == .udp
                ? try Syscall.recvDatagram(fd, buffer, dontWait: dontWait)
                : try Syscall.recv(fd, buffer, dontWait: dontWait)
        }
        if case .processed(let count) = result, transport == .udp, count > buffer.count {
            throw ConnectionError(.messageTooLarge, "a \(count)-byte datagram did not fit in \(buffer.count) bytes")
        }
        return result
    }

    /// Receives into a new array: empty means the peer closed (TCP).
    public func receive(maximumLength: Int = 65_536) throws(ConnectionError) -> [UInt8] {
        try [UInt8](unsafeUninitializedCapacity: maximumLength) { (buffer, count) throws(ConnectionError) in
            count = try receive(into: UnsafeMutableRawBufferPointer(buffer))
        }
    }

    /// sendto(2) of one datagram (UDP).
    public func send(_ bytes: [UInt8], to address: SocketAddress) throws(ConnectionError) {
        _ = try bytes.withBytes { (buffer) throws(ConnectionError) in
            try withDescriptor { (fd) throws(ConnectionError) in try Syscall.sendTo(fd, buffer, to: address) }
        }
    }

    /// recvfrom(2): blocks for one datagram and its sender (UDP).
    public func receiveFrom(
        maximumLength: Int = 65_536
    ) throws(ConnectionError) -> (bytes: [UInt8], from: SocketAddress) {
        var sender: SocketAddress?
        let bytes = try [UInt8](unsafeUninitializedCapacity: maximumLength) {
            (buffer, count) throws(ConnectionError) in
            let received = try withDescriptor { (fd) throws(ConnectionError) in
                try Syscall.recvFrom(fd, UnsafeMutableRawBufferPointer(buffer))
            }
            switch received {
            case .processed(let result):
                guard result.count <= buffer.count else {
                    throw ConnectionError(
                        .messageTooLarge, "a \(result.count)-byte datagram did not fit in \(buffer.count) bytes")
                }
                count = result.count
                sender = result.from
            case .wouldBlock:
                throw ConnectionError(.timedOut, "receive timed out (SO_RCVTIMEO)")
            }
        }
        return (bytes, sender!)
    }

    // MARK: Ending

    /// shutdown(2): `.write` sends FIN (half-close); `.both` also wakes threads blocked on this socket.
    public func shutdown(_ how: ShutdownHow) throws(ConnectionError) {
        try withDescriptor { (fd) throws(ConnectionError) in try Syscall.shutdown(fd, how) }
    }

    /// Runs `body` with the descriptor (for `poll` or socket options of your own), which stays this socket's until
    /// `body` returns; `.closed` after ``close()``.
    public func withDescriptor<R>(
        _ body: (borrowing BorrowedDescriptor) throws(ConnectionError) -> R
    ) throws(ConnectionError) -> R {
        try owner.withDescriptor(body)
    }

    /// As ``withDescriptor(_:)``, `nil` without running `body` after ``close()``.
    public func ifOpen<R, E: Error>(_ body: (borrowing BorrowedDescriptor) throws(E) -> R) throws(E) -> R? {
        try owner.ifOpen(body)
    }

    /// As ``withDescriptor(_:)``, for a body that awaits (a thread of your own on the number, awaited): ``close()``
    /// meanwhile closes the number only once `body` returned.
    public func withDescriptorAsync<R>(
        _ body: (borrowing BorrowedDescriptor) async throws(ConnectionError) -> R
    ) async throws(ConnectionError) -> R {
        try await owner.withDescriptorAsync(body)
    }

    /// A short name for threads and logs ("fd 7").
    public var label: String { owner.description }

    /// Closes the descriptor. A second call does nothing.
    public func close() {
        owner.close()
    }

    /// `true` once ``close()`` was called.
    public var isClosed: Bool { owner.isClosed }

    /// The bound address (with the real port). Throws as getsockname(2) does: `.closed` after ``close()`` (a
    /// closed descriptor, EBADF), `.system` otherwise; a bound or connected open socket always has one.
    public var localAddress: SocketAddress {
        get throws(ConnectionError) {
            try withDescriptor { (fd) throws(ConnectionError) in try Syscall.localAddress(fd) }
        }
    }

    /// The connected peer's address. Throws as getpeername(2) does: `.reset` when the socket is not connected
    /// (ENOTCONN: never connected, or a UDP socket without a default peer), `.closed` after ``close()``.
    public var remoteAddress: SocketAddress {
        get throws(ConnectionError) {
            try withDescriptor { (fd) throws(ConnectionError) in try Syscall.peerAddress(fd) }
        }
    }
}

/// Lets another thread cancel a blocking connect: it marks the attempt cancelled and shuts the socket down,
/// which wakes the `poll` the connecting thread sleeps in.
final class ConnectAttempt: Sendable {
    private struct State {
        var socket: SocketDescriptor?
        var cancelled = false
    }
    private let state = Guarded(State())

    var isCancelled: Bool { state.withLock { $0.cancelled } }

    /// The socket being connected, for ``cancel()`` to shut down; not kept when the attempt was cancelled already
    /// (then the caller's throw lets it go and closes it at once).
    func begin(_ socket: SocketDescriptor) throws(ConnectionError) {
        let cancelled = state.withLock { state in
            if !state.cancelled { state.socket = socket }
            return state.cancelled
        }
        if cancelled { throw .cancelled("connect was cancelled") }
    }

    func end() { state.withLock { $0.socket = nil } }

    func cancel() {
        state.withLock { state in
            state.cancelled = true
            state.socket?.ifOpen { try? Syscall.shutdown($0, .both) }
        }
    }
}
