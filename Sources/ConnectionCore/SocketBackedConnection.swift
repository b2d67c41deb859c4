/// What a socket of a loop backend offers in its own style (`AsyncSocket`, `UringSocket`):
/// the calls ``SocketBackedConnection`` presents as a ``Connection``, in the socket's own types.
@_spi(Loop) public protocol StyleSocket: AnyObject, Sendable {
    var transport: Transport { get }
    var options: ConnectionOptions { get }
    /// The executor a task waiting on this socket is resumed on (the reactor, the ring's loop).
    var resumingExecutor: any TaskExecutor { get }
    var sendsFromAnyThread: Bool { get }
    func send(_ bytes: [UInt8]) async throws(ConnectionError)
    func send(contentsOf bytes: UnsafeRawBufferPointer) async throws(ConnectionError)
    /// UDP: the datagrams in as few system calls as the socket can; TCP: the bytes in order.
    func send(batch: [UnsafeRawBufferPointer]) async throws(ConnectionError)
    func receive(maximumLength: Int) async throws(ConnectionError) -> [UInt8]?
    func receive(into buffer: UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Int?
    func closeOutput() async throws(ConnectionError)
    func close() async
    func abort() async
}

/// A ``Connection`` that is its style's socket and nothing more: a conforming class stores the socket and its two
/// endpoints, and every call goes straight to the socket. The default methods are public to the `Loop` SPI,
/// inlinable and always-inline, so that each backend's compiler specialises its witnesses for its own socket: in the
/// release objects, `AsyncConnection`'s and `UringConnection`'s witnesses call their socket directly. (Declared
/// `package`, they were not inlined across modules, and the generic calls cost uring a fifth of its pump-1400.)
@_spi(Loop) public protocol SocketBackedConnection: Connection {
    associatedtype NativeSocket: StyleSocket
    var socket: NativeSocket { get }
    init(socket: NativeSocket)
}

extension SocketBackedConnection {
    @inlinable @inline(__always) public var transport: Transport { socket.transport }
    @inlinable @inline(__always) public var options: ConnectionOptions { socket.options }
    @inlinable @inline(__always) public var preferredExecutor: (any TaskExecutor)? { socket.resumingExecutor }
    @inlinable @inline(__always) public var sendsFromAnyThread: Bool { socket.sendsFromAnyThread }

    @inlinable @inline(__always) public func send(_ message: Message) async throws(ConnectionError) {
        try await socket.send(message.bytes)
    }

    @inlinable @inline(__always) public func send(
        contentsOf bytes: UnsafeRawBufferPointer
    ) async throws(ConnectionError) {
        try await socket.send(contentsOf: bytes)
    }

    @inlinable @inline(__always) public func send(batch: [UnsafeRawBufferPointer]) async throws(ConnectionError) {
        try await socket.send(batch: batch)
    }

    @inlinable @inline(__always) public func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        try await socket.receive(maximumLength: maximumLength).map(Message.init)
    }

    @inlinable @inline(__always) public func receive(
        into buffer: UnsafeMutableRawBufferPointer
    ) async throws(ConnectionError)
        -> Received?
    {
        try await socket.receive(into: buffer).map { Received(count: $0) }
    }

    @inlinable @inline(__always) public func closeOutput() async throws(ConnectionError) {
        try await socket.closeOutput()
    }
    @inlinable @inline(__always) public func close() async { await socket.close() }
    @inlinable @inline(__always) public func abort() async { await socket.abort() }
}

/// A style's TCP listener, which accepts its style's sockets.
@_spi(Loop) public protocol StyleListener: Sendable {
    associatedtype NativeSocket: StyleSocket
    var localEndpoint: Endpoint { get }
    func accept() async throws(ConnectionError) -> NativeSocket
    func close() async
}

/// A TCP ``Listener`` over a ``StyleListener``: each accepted socket comes out as its ``SocketBackedConnection``.
/// Generic and not specialised: an accept is not on a message's path.
@_spi(Loop)
public final class SocketBackedListener<Native: StyleListener, Accepted: SocketBackedConnection>: Listener, Sendable
where Accepted.NativeSocket == Native.NativeSocket {
    public let listener: Native

    public init(_ listener: Native, accepting: Accepted.Type) { self.listener = listener }

    public var transport: Transport { .tcp }
    public var localEndpoint: Endpoint { listener.localEndpoint }

    public func accept() async throws(ConnectionError) -> any Connection {
        Accepted(socket: try await listener.accept())
    }

    public func close() async { await listener.close() }
}
