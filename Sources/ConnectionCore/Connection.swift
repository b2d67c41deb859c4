/// One connection, whatever its backend and transport. Every backend (`bsd`, `uv`, `runloop`, `async`, `nio`)
/// implements this protocol, and the conformance suite checks each against this contract.
///
/// ## Contract
/// 1. **TCP/TLS are byte streams.** A receive returns whatever bytes have arrived, at most `maximumLength`: it
///    may return part of one send, or two sends joined. Use ``receive(exactly:)`` to read a known size.
/// 2. **UDP keeps datagram boundaries and may lose datagrams.** Each receive returns one whole datagram (an
///    empty datagram is a valid, empty message); a datagram above the transport's limit fails the send with
///    `.messageTooLarge`. Nothing is retransmitted: a program that needs every datagram must retry itself.
/// 3. **WebSocket keeps message boundaries and the text/binary kind.**
/// 4. **A clean end is reported exactly once**: the first receive after the peer finished sending returns
///    `nil`; a later receive throws `.closed`. A UDP connection has no end and never returns `nil`.
/// 5. **`close()` twice is a no-op.** `close()` returns after the connection's descriptor is closed and its
///    threads or callbacks are finished, so nothing is left open. A receive or send waiting at that moment
///    throws `.closed`.
/// 6. **Send after close throws `.closed`.** A receive after close throws `.closed`.
/// 7. **Cancelling a waiting receive returns promptly** with `.cancelled`, and loses nothing: bytes that arrive
///    later are returned by the next receive. A send that has started handing bytes to the kernel finishes
///    (or fails) rather than leave a partial message behind.
/// 8. **Errors are ``ConnectionError``s**, with the raw system code kept.
/// 9. **One receiver at a time.** Concurrent receives are served in call order; concurrent sends are written
///    in call order, each whole.
/// 10. **`abort()` resets.** On tcp, tls, ws and wss the peer, once it has read what was delivered before,
///    gets `.reset` instead of an end of stream; everything is released as by `close()`.
public protocol Connection: AnyObject, Sendable {
    /// The transport this connection speaks.
    var transport: Transport { get }
    /// The local address, with the real port.
    var localEndpoint: Endpoint { get }
    /// The peer's address.
    var remoteEndpoint: Endpoint { get }
    /// The options the connection was made with.
    var options: ConnectionOptions { get }

    /// Sends one message: for TCP, appends its bytes to the stream; for UDP, one datagram; for WebSocket, one
    /// message of the message's kind. Returns once the bytes are handed to the kernel (or the TLS layer, or a
    /// backend's bounded send queue: uring's TCP sends gather there and go to the kernel before its ring next
    /// sleeps), which may wait while the peer is not reading (backpressure). Bytes a send handed over and the kernel
    /// later fails to deliver are reported by a later call (send, `closeOutput()`), as a kernel reports a reset
    /// after its buffer took the bytes.
    func send(_ message: Message) async throws(ConnectionError)

    /// Sends bytes the caller keeps (a buffer it reuses), as ``send(_:)`` sends a binary message, without
    /// making an array of them: a backend that can hands them to the kernel from where they lie and copies only
    /// what the kernel does not take at once. The bytes must stay valid and unchanged until the call returns; after
    /// that the connection no longer refers to them.
    func send(contentsOf bytes: UnsafeRawBufferPointer) async throws(ConnectionError)

    /// Sends several messages, in order, each as ``send(contentsOf:)`` sends one (UDP: one datagram each;
    /// WebSocket: one binary message each; byte streams: the bytes of each, appended), in as few system calls as
    /// the transport allows: on UDP, bsd, uv, runloop and async hand the batch to the kernel with sendmmsg(2),
    /// and a run of equal-sized datagrams as one segmented send (UDP GSO) where the kernel has it, which is
    /// what a bulk UDP sender wants. Other transports and backends send the buffers one by one.
    ///
    /// Each buffer must stay valid and unchanged until the call returns. Another task's concurrent send may
    /// come between two messages of a batch, never inside one. When a datagram fails (ENOBUFS, say), the call
    /// throws as ``send(contentsOf:)`` would: the datagrams before it were sent, the ones after it were not.
    func send(batch: [UnsafeRawBufferPointer]) async throws(ConnectionError)

    /// Receives what is available, waiting for at least one byte (stream) or one message (UDP, WebSocket).
    ///
    /// - Parameter maximumLength: the most bytes a stream receive returns; message transports ignore it and
    ///   always return whole messages.
    /// - Returns: the message, or `nil` once when the peer has cleanly finished sending.
    func receive(maximumLength: Int) async throws(ConnectionError) -> Message?

    /// Receives into a buffer the caller owns, so that a loop of receives allocates nothing per message (what a
    /// pump, a proxy or a framing layer wants). Waits as ``receive(maximumLength:)`` does, with the same
    /// guarantees (order, one receiver at a time, cancellation losing nothing, the end reported once).
    ///
    /// - Byte streams (tcp, tls): fills the buffer with what has arrived, at most `buffer.count` bytes.
    /// - Message transports (udp, ws, wss): one whole message. A message larger than the buffer is discarded and
    ///   reported by throwing `.messageTooLarge` (as recvmsg(2) truncates a datagram); a buffer of the
    ///   connection's largest message (`options.maxDatagramSize` for UDP) never loses one.
    ///
    /// The buffer must stay valid, and untouched by anyone else, until the call returns.
    /// - Returns: the byte count and the message's kind, or `nil` once when the peer has cleanly finished.
    func receive(into buffer: UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Received?

    /// Half-close: tells the peer that nothing more will be sent (TCP FIN) while still receiving.
    /// Throws `.unsupported` on UDP.
    func closeOutput() async throws(ConnectionError)

    /// Closes the connection and releases everything it holds. Calling it again does nothing.
    func close() async

    /// Closes at once, without the orderly end: what is still queued to send is discarded and a TCP peer (tcp,
    /// tls, ws, wss) sees a reset (`.reset`) where ``close()`` would give it an end of stream (no TLS
    /// close_notify, no WebSocket close frame). What a relay does to carry a reset across, and what "RST after N
    /// bytes" fault injection needs. On UDP it is ``close()``. Releases everything as ``close()`` does.
    func abort() async

    /// The executor on which this connection completes its operations, when it has one (an event loop that
    /// is also a `TaskExecutor`). A task that runs there (`withTaskExecutorPreference`) is resumed by I/O
    /// without hopping threads. `nil` (the default) when any executor serves equally well.
    var preferredExecutor: (any TaskExecutor)? { get }

    /// Whether a send from any thread makes its system call on that thread when the socket has room, with no
    /// hand-over (bsd, async, and TLS or WebSocket over them; uv, runloop and uring, which send around their loop
    /// while it holds nothing of that socket's, and hand it only what the socket did not take). `false` (the
    /// default) when a send from off
    /// ``preferredExecutor`` hands its bytes to the connection's own thread (a loop's), so a task that sends often
    /// is best run there. An open-loop sender uses it to choose its thread: its own pacing thread, as the C floor's
    /// client sends, or the connection's.
    var sendsFromAnyThread: Bool { get }
}

extension Connection {
    /// No preference by default.
    public var preferredExecutor: (any TaskExecutor)? { nil }

    /// A send hands over to the connection's thread by default.
    public var sendsFromAnyThread: Bool { false }

    /// A connection with nothing to reset (UDP) closes.
    public func abort() async { await close() }

    /// Sends a binary message.
    public func send(_ bytes: [UInt8]) async throws(ConnectionError) {
        try await send(Message(bytes))
    }

    /// The portable form of ``send(contentsOf:)``: copies the bytes into a message.
    public func send(contentsOf bytes: UnsafeRawBufferPointer) async throws(ConnectionError) {
        try await send(Message(Array(bytes)))
    }

    /// The portable form of ``send(batch:)``: one ``send(contentsOf:)`` per buffer.
    public func send(batch: [UnsafeRawBufferPointer]) async throws(ConnectionError) {
        try await sendEach(batch)
    }

    /// One ``send(contentsOf:)`` per buffer, in order: what ``send(batch:)`` does where nothing batches.
    public func sendEach(_ batch: [UnsafeRawBufferPointer]) async throws(ConnectionError) {
        for bytes in batch { try await send(contentsOf: bytes) }
    }

    /// The portable form of ``receive(into:)``: receives a message and copies it into the buffer. A backend
    /// that can read straight into the caller's buffer implements ``receive(into:)`` itself.
    public func receive(into buffer: UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Received? {
        try Received.requireRoom(buffer)
        guard let message = try await receive(maximumLength: buffer.count) else { return nil }
        return try Received.copy(message, into: buffer)
    }

    /// Receives with the connection's read chunk size as the limit. See ``receive(maximumLength:)``.
    public func receive() async throws(ConnectionError) -> Message? {
        try await receive(maximumLength: options.readChunkSize)
    }

    /// Reads exactly `count` bytes from a byte stream, however the stream splits or joins them.
    ///
    /// - Throws: `.closed` when the stream ends before `count` bytes arrived (the bytes read so far are lost
    ///   with the error, which says how many there were); `.unsupported` on a message transport.
    public func receive(exactly count: Int) async throws(ConnectionError) -> [UInt8] {
        guard transport.isByteStream else {
            throw ConnectionError(.unsupported, "receive(exactly:) needs a byte stream, not \(transport)")
        }
        if count <= 0 { return [] }
        guard let first = try await receive(maximumLength: count) else {
            throw ConnectionError(.closed, "stream ended after 0 of \(count) bytes")
        }
        // The common case (the bytes came in one piece) returns the received array itself: no copy.
        if first.bytes.count == count { return first.bytes }
        var bytes = first.bytes
        bytes.reserveCapacity(count)
        while bytes.count < count {
            guard let message = try await receive(maximumLength: count - bytes.count) else {
                throw ConnectionError(.closed, "stream ended after \(bytes.count) of \(count) bytes")
            }
            bytes.append(contentsOf: message.bytes)
        }
        return bytes
    }
}

/// What ``Connection/receive(into:)`` put into the caller's buffer.
public struct Received: Sendable, Hashable {
    /// Bytes written at the start of the buffer.
    public var count: Int
    /// Text or binary (WebSocket); binary on every other transport.
    public var kind: Message.Kind

    @inlinable
    public init(count: Int, kind: Message.Kind = .binary) {
        self.count = count
        self.kind = kind
    }

    /// An empty buffer cannot tell a byte from the end of a stream: refused before anything is received.
    @inlinable
    public static func requireRoom(_ buffer: UnsafeMutableRawBufferPointer) throws(ConnectionError) {
        if buffer.isEmpty { throw ConnectionError(.unsupported, "receive(into:) needs a buffer of at least one byte") }
    }

    /// Copies a received message into `buffer`: `.messageTooLarge` when it does not fit (then it is lost, as the
    /// contract of ``Connection/receive(into:)`` says for message transports; a byte-stream receive never returns
    /// more than it was asked for).
    @inlinable
    public static func copy(
        _ message: Message, into buffer: UnsafeMutableRawBufferPointer
    ) throws(ConnectionError)
        -> Received
    {
        let count = message.bytes.count
        guard count <= buffer.count else {
            throw ConnectionError(
                .messageTooLarge, "a \(count)-byte message did not fit in a \(buffer.count)-byte buffer")
        }
        if count > 0 { message.bytes.withUnsafeBytes { buffer.copyMemory(from: $0) } }
        return Received(count: count, kind: message.kind)
    }
}

extension Connection {
    /// Received messages as an `AsyncSequence`, until the peer ends (whole datagrams or WebSocket messages, chunks
    /// of a byte stream), as `URLSessionWebSocketTask.receive()` in a loop or NWConnection's `receiveMessage`
    /// would give them:
    ///
    /// ```swift
    /// for try await message in connection.messages { print(message.bytes.count) }
    /// ```
    ///
    /// One iteration at a time (receives are served in call order). The sequence ends normally when the peer
    /// ends the connection and when this side closes it (a receive waiting in `close()` ends the loop; a
    /// WebSocket close handshake from either side ends it); an abnormal end (reset, timed out, a protocol
    /// violation, a TLS failure) ends it by being thrown.
    public var messages: ConnectionMessages { ConnectionMessages(connection: self) }
}

/// ``Connection/messages``: each element is one ``Connection/receive()``.
public struct ConnectionMessages: AsyncSequence, Sendable {
    public typealias Element = Message
    public typealias Failure = ConnectionError

    let connection: any Connection

    public struct AsyncIterator: AsyncIteratorProtocol {
        let connection: any Connection
        var finished = false

        public mutating func next() async throws(ConnectionError) -> Message? {
            try await next(isolation: nil)
        }

        public mutating func next(isolation actor: isolated (any Actor)?) async throws(ConnectionError) -> Message? {
            guard !finished else { return nil }
            do throws(ConnectionError) {
                guard let message = try await connection.receive() else {
                    finished = true
                    return nil
                }
                return message
            } catch {
                finished = true
                // `.closed` is what a receive throws once this side has closed the connection (`close()`, or a
                // WebSocket close handshake this side started): an end the user asked for, not a failure, as the
                // peer's end is. Abnormal ends (reset, timed out, protocol violation, TLS) still throw.
                if error.kind == .closed { return nil }
                throw error
            }
        }

    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(connection: connection) }
}

/// The server side: a bound socket that yields one ``Connection`` per client.
///
/// For TCP each accepted connection is a TCP connection. For UDP the listener owns one bound socket and yields
/// one connection per peer address (on the first datagram from that address); sends on it go back to that
/// peer's address, and closing it forgets the peer (a later datagram from it is accepted again).
public protocol Listener: AnyObject, Sendable {
    /// The transport served.
    var transport: Transport { get }
    /// The bound address, with the real port when port 0 was asked for.
    var localEndpoint: Endpoint { get }

    /// Waits for the next client. Throws `.closed` once the listener is closed, `.cancelled` when the waiting
    /// task is cancelled (the listener keeps serving).
    func accept() async throws(ConnectionError) -> any Connection

    /// Stops listening, closes the connections accepted but not yet taken, and releases the socket. Connections
    /// already returned by ``accept()`` stay open. Calling it again does nothing.
    func close() async
}

/// A connection style: the factory that makes connections and listeners of one backend.
public protocol ConnectionBackend: Sendable {
    /// The backend's name as users type it: `bsd`, `uv`, `runloop`, `async`, `nio`.
    var name: String { get }
    /// The transports this backend provides itself (WebSocket is layered on top of `tcp` by the umbrella).
    var transports: Set<Transport> { get }

    /// Resolves the endpoint and connects (TCP handshake; for UDP, fixes the peer address).
    func connect(to endpoint: Endpoint, options: ConnectionOptions) async throws(ConnectionError) -> any Connection

    /// Resolves the endpoint and binds (and for TCP, listens).
    func listen(on endpoint: Endpoint, options: ConnectionOptions) async throws(ConnectionError) -> any Listener
}

/// A backend whose listener can accept on its own loop and hand each connection to one of several loops of its
/// style, in turn: the alternative to a listening socket per loop (SO_REUSEPORT) for a server on several threads.
public protocol HandOffListening: ConnectionBackend {
    func listen(
        on endpoint: Endpoint, options: ConnectionOptions, handingOffTo loops: [any ConnectionBackend]
    ) async throws(ConnectionError) -> any Listener
}

extension ConnectionBackend {
    /// Fails with `.unsupported` when the backend does not provide `endpoint`'s transport itself (tls, ws and wss
    /// are layered on top of its tcp by the umbrella's `TransportStack`).
    public func requireTransport(of endpoint: Endpoint) throws(ConnectionError) {
        guard transports.contains(endpoint.transport) else {
            let own = transports.map(\.rawValue).sorted().joined(separator: " and ")
            throw ConnectionError(
                .unsupported, "the \(name) backend provides \(own); \(endpoint.transport) is layered on top")
        }
    }
}
