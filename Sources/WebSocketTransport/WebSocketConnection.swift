public import ConnectionCore
import Synchronization
public import WebSocketCodec

/// WebSocket (RFC 6455) over any backend's TCP `Connection`: the same framing code for every connection
/// style, so "WebSocket over libuv vs over blocking sockets" compares the transports, not four codecs.
///
/// What `URLSessionWebSocketTask` users know — send text or data, receive one message, ``sendPing(_:timeout:)`` with its
/// pong awaited, close with a code and reason — plus automatic pongs and the peer's close code and reason
/// (``peerCloseCode``). Control frames are handled by whoever reads: a running ``receive(maximumLength:)``, or
/// ``sendPing(_:timeout:)`` (and keep-alive) when none runs; ``close(code:reason:)`` reads until the peer's close.
///
/// The connection is the I/O driver of a `WebSocketSession` (the state, with no I/O: what may be sent, pings,
/// how it ended) over a `WebSocketFrameLink` (the frames on the bytes): this file sends and closes, the
/// handshakes, receiving and pings are in the files beside it.
public final class WebSocketConnection: Connection, @unchecked Sendable {
    public let transport: Transport
    public let localEndpoint: Endpoint
    public let remoteEndpoint: Endpoint
    public var options: ConnectionOptions { tcp.options }
    public var preferredExecutor: (any TaskExecutor)? { tcp.preferredExecutor }
    public var sendsFromAnyThread: Bool { tcp.sendsFromAnyThread }
    /// The subprotocol the handshake chose, if any.
    public let subprotocol: String?
    /// Server side: the client's opening handshake (path, query, headers, subprotocols, origin). `nil` on a client.
    public let request: WebSocketRequest?
    /// The WebSocket options in force.
    public let webSocketOptions: WebSocketOptions
    /// permessage-deflate as the opening handshake agreed it; `nil` when messages go uncompressed.
    public let deflate: WebSocketDeflateAgreement?

    let tcp: any Connection
    /// Our parser and encoder over `tcp`.
    let link: WebSocketFrameLink
    let role: WebSocketRole
    typealias PingWaiter = CheckedContinuation<Result<Void, ConnectionError>, Never>
    let state: Guarded<WebSocketSession<PingWaiter>>
    /// Open and close events, in order: `.opened` first, then `.closed` once (one consumer); with
    /// ``WebSocketOptions/reportsControlFrames``, also each ping and pong the peer sends. The newest 8 are kept
    /// for a consumer that falls behind, so `.closed` is never lost.
    public let events: AsyncStream<WebSocketEvent>
    let eventSink: AsyncStream<WebSocketEvent>.Continuation
    let keepAlive = Guarded<Task<Void, Never>?>(nil)
    private let closedEvent = OnceFlag()
    let sendLock = AsyncGate()
    let receiveLock = AsyncGate()
    /// The compressor of outgoing messages (permessage-deflate), made with the first one; used under `sendLock`,
    /// which also keeps compressed messages in the order their shared context needs.
    private var deflater: WebSocketDeflater?

    /// Data messages sent so far: their bytes, and their frame payloads on the wire (after permessage-deflate).
    public var sent: WebSocketTrafficCounts { state.withLock { $0.sent } }
    /// Data messages received so far, the same way.
    public var received: WebSocketTrafficCounts { state.withLock { $0.received } }

    init(
        tcp: any Connection, link: WebSocketFrameLink, role: WebSocketRole, endpoint: Endpoint,
        subprotocol: String?, options: WebSocketOptions, deflate: WebSocketDeflateAgreement?,
        request: WebSocketRequest? = nil
    ) {
        self.tcp = tcp
        self.deflate = deflate
        self.request = request
        self.link = link
        self.role = role
        self.subprotocol = subprotocol
        self.webSocketOptions = options
        transport = endpoint.transport
        localEndpoint = tcp.localEndpoint.with(transport: endpoint.transport)
        remoteEndpoint = role == .client ? endpoint : tcp.remoteEndpoint.with(transport: endpoint.transport)
        state = Guarded(
            WebSocketSession(role: role, maximumMessageSize: options.maximumMessageSize, deflate: deflate))
        (events, eventSink) = AsyncStream.makeStream(of: WebSocketEvent.self, bufferingPolicy: .bufferingNewest(8))
        eventSink.yield(.opened(subprotocol: subprotocol))
        if let interval = options.keepAliveInterval { startKeepAlive(every: interval, deadline: options.pongDeadline) }
    }

    // MARK: Sending

    public func send(_ message: Message) async throws(ConnectionError) {
        let compress =
            deflate != nil && message.bytes.count >= (webSocketOptions.deflate?.minimumSize ?? .max)
        try state.withLock { (session) throws(ConnectionError) in
            try session.admitSend(bytes: message.bytes.count, onWire: compress ? 0 : message.bytes.count)
        }
        guard compress, let deflate, let settings = webSocketOptions.deflate else {
            try await sendFrames(
                WebSocketStateMachine.frames(
                    text: message.kind == .text, payload: message.bytes, fragmentSize: webSocketOptions.fragmentSize))
            return
        }
        // Compressed under the send lock: with context takeover, messages must reach the wire in the order their
        // compressor saw them.
        await sendLock.enter()
        defer { sendLock.leave() }
        if deflater == nil {
            do throws(WebSocketProtocolError) {
                deflater = try WebSocketDeflater(agreement: deflate, role: role, options: settings)
            } catch {
                throw ConnectionError(.unsupported, error.reason)
            }
        }
        let payload = deflater!.compress(message.bytes)
        state.withLock { $0.countCompressedPayload(payload.count) }
        try await sendLocked(
            WebSocketStateMachine.frames(
                text: message.kind == .text, payload: payload, fragmentSize: webSocketOptions.fragmentSize,
                compressed: true))
    }

    /// Sends one binary message from bytes the caller keeps: masked (client) straight from them into the frame
    /// link's reused send buffer, with no array of the message made. A message that is compressed
    /// (permessage-deflate) or split into fragments (``WebSocketOptions/fragmentSize``) goes the way
    /// ``send(_:)`` sends it.
    public func send(contentsOf bytes: UnsafeRawBufferPointer) async throws(ConnectionError) {
        let compress = deflate != nil && bytes.count >= (webSocketOptions.deflate?.minimumSize ?? .max)
        guard !compress, bytes.count <= max(1, webSocketOptions.fragmentSize) else {
            return try await send(Message(Array(bytes)))
        }
        try state.withLock { (session) throws(ConnectionError) in
            try session.admitSend(bytes: bytes.count, onWire: bytes.count)
        }
        await sendLock.enter()
        defer { sendLock.leave() }
        let key: UInt32? = role == .client ? state.withLock { $0.nextMaskingKey() } : nil
        try await link.send(binary: bytes, maskingKey: key)
    }

    /// Sends text.
    public func send(text: String) async throws(ConnectionError) {
        try await send(.text(text))
    }

    /// Sends frames in order (masked by a client). `consuming`: the caller's array is masked in place, not copied.
    func sendFrames(_ frames: consuming [WebSocketFrame]) async throws(ConnectionError) {
        await sendLock.enter()
        defer { sendLock.leave() }
        try await sendLocked(frames)
    }

    /// ``sendFrames(_:)`` with the send lock held.
    private func sendLocked(_ frames: consuming [WebSocketFrame]) async throws(ConnectionError) {
        if role == .client {
            state.withLock { session in
                for index in frames.indices {
                    frames[index].maskingKey = session.nextMaskingKey()
                }
            }
        }
        try await link.send(frames)
    }

    // MARK: Failing

    /// Fails the connection (the first failure stays) and every ping still waiting for its pong.
    func fail(_ error: ConnectionError) {
        for id in state.withLock({ $0.fail(error) }) { resolvePing(id, .failure(error)) }
    }

    /// Fails every ping still waiting for its pong (the connection ended).
    func settlePings(_ error: ConnectionError) {
        for id in state.withLock({ $0.pingsInFlight }) { resolvePing(id, .failure(error)) }
    }

    // MARK: Closing

    /// The peer's close code (1005 when its close frame had none), once its close frame arrived.
    public var peerCloseCode: WebSocketCloseCode? { state.withLock { $0.machine.peerClose?.code } }

    /// The peer's close reason.
    public var peerCloseReason: String? { state.withLock { $0.machine.peerClose?.reason } }

    public func closeOutput() async throws(ConnectionError) {
        throw ConnectionError(
            .unsupported, "WebSocket has no half-close; close(code:reason:) starts the close handshake")
    }

    /// The close handshake: sends a close frame, waits (at most `closeTimeout`) for the peer's, then closes TCP.
    public func close(code: WebSocketCloseCode, reason: String = "") async {
        let frames = state.withLock { $0.beginClose(code, reason: reason) }
        let timeout = webSocketOptions.closeTimeout
        // The close frame queues behind sends the peer is not taking (it stopped reading): that wait is bounded by
        // closeTimeout as well, and past it the TCP connection is closed under the stuck sends.
        let closeFrameSent = OnceFlag()
        if !frames.isEmpty {
            _ = await runBounded(by: timeout, on: webSocketOptions.clock, onTimeout: { [tcp] in await tcp.close() }) {
                [self] in
                if (try? await sendFrames(frames)) != nil { _ = closeFrameSent.claim() }
            }
        }
        if closeFrameSent.isClaimed {
            // Read (discarding data) until the peer's close frame or the time limit, whichever comes first: past
            // it, TCP is closed under the read.
            _ = await runBounded(by: timeout, on: webSocketOptions.clock, onTimeout: { [tcp] in await tcp.close() }) {
                [self] in
                while !state.withLock({ $0.tcpClosed }) {
                    guard (try? await receive(duringClose: true)) != nil else { break }
                }
            }
        }
        await closeTCP(failing: .closed())
        emitClosed(code: peerCloseCode, reason: peerCloseReason ?? "")
    }

    /// Fails the connection with `failure` (when given), stops keep-alive and closes TCP.
    func closeTCP(failing failure: ConnectionError? = nil) async {
        if let failure { fail(failure) }
        state.withLock { $0.closeTCP() }
        keepAlive.withLock { $0 }?.cancel()
        await tcp.close()
    }

    /// The `.closed` event, once, then the end of ``events``.
    func emitClosed(code: WebSocketCloseCode?, reason: String) {
        guard closedEvent.claim() else { return }
        eventSink.yield(.closed(code: code, reason: reason))
        eventSink.finish()
    }

    public func close() async {
        await close(code: .normalClosure)
    }

    /// No close frame: the TCP connection is reset (see `Connection.abort()`), and ``events`` reports a close
    /// without a code.
    public func abort() async {
        state.withLock { $0.markLocallyClosed() }
        fail(.closed())
        state.withLock { $0.closeTCP() }
        keepAlive.withLock { $0 }?.cancel()
        await tcp.abort()
        emitClosed(code: nil, reason: "")
    }
}
