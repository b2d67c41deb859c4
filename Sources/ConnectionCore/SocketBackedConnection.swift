/// What a socket of a loop backend offers in its own style (`AsyncSocket`, `UringSocket`):
/// the calls ``SocketBackedConnection`` presents as a ``Connection``, in the socket's own types.
package protocol StyleSocket: AnyObject, Sendable {
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
/// endpoints, and every call goes straight to the socket. The calls are inlinable so that each backend's compiler
/// specialises them for its own socket type: the price of the unified API stays one call, as it was when each
/// backend wrote the same adapter by hand.
package protocol SocketBackedConnection: Connection {
    associatedtype NativeSocket: StyleSocket
    var socket: NativeSocket { get }
    init(socket: NativeSocket)
}

extension SocketBackedConnection {
    @inlinable package var transport: Transport { socket.transport }
    @inlinable package var options: ConnectionOptions { socket.options }
    @inlinable package var preferredExecutor: (any TaskExecutor)? { socket.resumingExecutor }
    @inlinable package var sendsFromAnyThread: Bool { socket.sendsFromAnyThread }

    @inlinable package func send(_ message: Message) async throws(ConnectionError) {
        try await socket.send(message.bytes)
    }

    @inlinable package func send(contentsOf bytes: UnsafeRawBufferPointer) async throws(ConnectionError) {
        try await socket.send(contentsOf: bytes)
    }

    @inlinable package func send(batch: [UnsafeRawBufferPointer]) async throws(ConnectionError) {
        try await socket.send(batch: batch)
    }

    @inlinable package func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        try await socket.receive(maximumLength: maximumLength).map(Message.init)
    }

    @inlinable package func receive(
        into buffer: UnsafeMutableRawBufferPointer
    ) async throws(ConnectionError)
        -> Received?
    {
        try await socket.receive(into: buffer).map { Received(count: $0) }
    }

    @inlinable package func closeOutput() async throws(ConnectionError) { try await socket.closeOutput() }
    @inlinable package func close() async { await socket.close() }
    @inlinable package func abort() async { await socket.abort() }
}

/// A style's TCP listener, which accepts its style's sockets.
package protocol StyleListener: Sendable {
    associatedtype NativeSocket: StyleSocket
    var localEndpoint: Endpoint { get }
    func accept() async throws(ConnectionError) -> NativeSocket
    func close() async
}

/// A TCP ``Listener`` over a ``StyleListener``: each accepted socket comes out as its ``SocketBackedConnection``.
/// Generic and not specialised: an accept is not on a message's path.
package final class SocketBackedListener<Native: StyleListener, Accepted: SocketBackedConnection>: Listener, Sendable
where Accepted.NativeSocket == Native.NativeSocket {
    package let listener: Native

    package init(_ listener: Native, accepting: Accepted.Type) { self.listener = listener }

    package var transport: Transport { .tcp }
    package var localEndpoint: Endpoint { listener.localEndpoint }

    package func accept() async throws(ConnectionError) -> any Connection {
        Accepted(socket: try await listener.accept())
    }

    package func close() async { await listener.close() }
}
