public import ConnectionCore
import Synchronization
public import WebSocketCodec

/// Options of a WebSocket connection.
public struct WebSocketOptions: Sendable, Hashable {
    /// Largest message accepted (reassembled); a bigger one fails the connection with 1009. Default 64 MiB,
    /// which passes Autobahn's 16 MiB cases.
    public var maximumMessageSize = 64 * 1024 * 1024
    /// Largest single frame accepted.
    public var maximumFrameSize = 64 * 1024 * 1024
    /// Outgoing messages larger than this are sent as several frames.
    public var fragmentSize = 1024 * 1024
    /// Subprotocols offered (client) or supported (server), in order of preference.
    public var subprotocols: [String] = []
    /// Origin sent by a client.
    public var origin: String? = nil
    /// Extra header lines a client sends with its request (an `Authorization`, a cookie), in order.
    public var headers: [WebSocketRequest.Header] = []
    /// How long ``WebSocketConnection/close(code:reason:)`` waits for the peer's close frame.
    public var closeTimeout: Duration = .seconds(2)
    /// Largest opening-handshake head accepted; a larger one is answered 431 (server) or fails (client).
    public var maximumHandshakeSize = 16 * 1024
    /// How long the opening handshake may take, from the connection's first byte to the last of the head:
    /// a client that connects and says nothing (or too little) is let go with `.timedOut` once it passes, and a
    /// client gives up on a server that does not answer.
    public var handshakeTimeout: Duration = .seconds(5)
    /// Keep-alive: send a ping this often (`nil`: never). iOS apps typically ping every 10 s.
    public var keepAliveInterval: Duration? = nil
    /// Keep-alive: fail the connection (`.timedOut`, close 1001) when a keep-alive ping gets no pong in time.
    /// Also the default deadline of ``WebSocketConnection/sendPing(_:timeout:)``. With no receive running, the
    /// ping reads the connection itself, so keep-alive works (and sees a vanished peer) either way.
    public var pongDeadline: Duration = .seconds(10)
    /// Report each ping and pong the peer sends in ``WebSocketConnection/events`` (`.ping`, `.pong`), as
    /// NWProtocolWebSocket's per-message metadata shows their opcodes. Off by default: pings are answered either
    /// way, and an application that does not read ``WebSocketConnection/events`` loses nothing.
    public var reportsControlFrames = false
    /// permessage-deflate (RFC 7692): `nil` (the default) neither offers nor accepts it. Set, a client offers it
    /// and a server accepts a client's offer; the decompressed size of a message is held to
    /// ``maximumMessageSize`` (1009 past it).
    public var deflate: WebSocketDeflateOptions? = nil

    public init() {}

    /// The defaults, changed by `configure`.
    public static func with(_ configure: (inout WebSocketOptions) -> Void) -> WebSocketOptions {
        var options = WebSocketOptions()
        configure(&options)
        return options
    }
}

/// WebSocket (RFC 6455) over any backend's TCP `Connection`: the same framing code for every connection
/// style, so "WebSocket over libuv vs over blocking sockets" compares the transports, not four codecs.
///
/// What `URLSessionWebSocketTask` users know — send text or data, receive one message, ``sendPing(_:timeout:)`` with its
/// pong awaited, close with a code and reason — plus automatic pongs and the peer's close code and reason
/// (``peerCloseCode``). Control frames are handled by whoever reads: a running ``receive(maximumLength:)``, or
/// ``sendPing(_:timeout:)`` (and keep-alive) when none runs; ``close(code:reason:)`` reads until the peer's close.
public final class WebSocketConnection: Connection, @unchecked Sendable {
    public let transport: Transport
    public let localEndpoint: Endpoint
    public let remoteEndpoint: Endpoint
    public var options: ConnectionOptions { tcp.options }
    public var preferredExecutor: (any TaskExecutor)? { tcp.preferredExecutor }
    /// The subprotocol the handshake chose, if any.
    public let subprotocol: String?
    /// Server side: the client's opening handshake (path, query, headers, subprotocols, origin). `nil` on a client.
    public let request: WebSocketRequest?
    /// The WebSocket options in force.
    public let webSocketOptions: WebSocketOptions
    /// permessage-deflate as the opening handshake agreed it; `nil` when messages go uncompressed.
    public let deflate: WebSocketDeflateAgreement?

    private let tcp: any Connection
    /// Our parser and encoder over `tcp`.
    private let link: WebSocketFrameLink
    private let role: WebSocketRole
    private let state: Guarded<Shared>
    /// Open and close events, in order: `.opened` first, then `.closed` once (one consumer); with
    /// ``WebSocketOptions/reportsControlFrames``, also each ping and pong the peer sends. The newest 8 are kept
    /// for a consumer that falls behind, so `.closed` is never lost.
    public let events: AsyncStream<WebSocketEvent>
    private let eventSink: AsyncStream<WebSocketEvent>.Continuation
    private let keepAlive = Guarded<Task<Void, Never>?>(nil)
    private let closedEvent = OnceFlag()
    private let sendLock = AsyncGate()
    private let receiveLock = AsyncGate()
    /// The compressor of outgoing messages (permessage-deflate), made with the first one; used under `sendLock`,
    /// which also keeps compressed messages in the order their shared context needs.
    private var deflater: WebSocketDeflater?

    private struct Shared: @unchecked Sendable {
        var machine: WebSocketStateMachine
        /// Pings waiting for their pong, oldest first. A waiter is registered before its ping is sent, so a pong
        /// that comes back at once always finds it.
        var pingWaiters: [UInt64: CheckedContinuation<Result<Void, ConnectionError>, Never>] = [:]
        /// Pings sent and not yet settled, oldest first: a pong settles the oldest.
        var pingsInFlight: [UInt64] = []
        /// Pings settled before their sender started waiting.
        var pingResults: [UInt64: Result<Void, ConnectionError>] = [:]
        var nextPingID: UInt64 = 0
        /// Data messages read by a ping while no receive was running, for the next receives.
        var pending: [Message] = []
        var pendingBytes = 0
        var tcpClosed = false
        var endReported = false
        var failure: ConnectionError?
        /// close() was called here: a receive that finds the end reports `.closed`, not a clean end.
        var locallyClosed = false
        var maskingKeys = MaskingKeys()
        var sent = WebSocketTrafficCounts()
        var received = WebSocketTrafficCounts()
    }

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
            Shared(
                machine: WebSocketStateMachine(
                    role: role, maximumMessageSize: options.maximumMessageSize, deflate: deflate)))
        (events, eventSink) = AsyncStream.makeStream(of: WebSocketEvent.self, bufferingPolicy: .bufferingNewest(8))
        eventSink.yield(.opened(subprotocol: subprotocol))
        if let interval = options.keepAliveInterval { startKeepAlive(every: interval, deadline: options.pongDeadline) }
    }

    /// Pings every `interval`; a ping without a pong within `deadline` fails the connection (close 1001). The ping
    /// reads the connection itself when no receive is running, so a vanished peer is seen without one.
    private func startKeepAlive(every interval: Duration, deadline: Duration) {
        let task = Task { [weak self] in
            while !Task.isCancelled {
                try? await Task.sleep(for: interval)
                guard let self, !Task.isCancelled, state.withLock({ $0.machine.state == .open && !$0.tcpClosed }) else {
                    return
                }
                let outcome: ConnectionError?
                do throws(ConnectionError) {
                    try await self.sendPing(timeout: deadline)
                    outcome = nil
                } catch {
                    outcome = error
                }
                if let outcome, outcome.kind != .timedOut {
                    return  // the connection ended or failed: the receive path reports it
                }
                if outcome != nil {
                    // No pong before the deadline.
                    fail(
                        ConnectionError(
                            .timedOut, "no pong within \(deadline) of a keep-alive ping",
                            systemCode: .init(domain: "websocket", code: 1001, name: "keep-alive")))
                    try? await sendFrames([WebSocketStateMachine.closeFrame(.goingAway, "keep-alive timeout")])
                    state.withLock { $0.tcpClosed = true }
                    await tcp.close()
                    emitClosed(code: nil, reason: "keep-alive timeout")
                    return
                }
            }
        }
        keepAlive.withLock { $0 = task }
    }

    // MARK: Handshakes

    /// Performs the client handshake on a connected TCP connection.
    public static func client(
        over tcp: any Connection, endpoint: Endpoint, options: WebSocketOptions = WebSocketOptions()
    )
        async throws(ConnectionError) -> WebSocketConnection
    {
        var generator = SystemRandomNumberGenerator()
        let key = WebSocketHandshake.makeKey(using: &generator)
        let host =
            endpoint.port == endpoint.transport.defaultPort ? "\(endpoint.host)" : "\(endpoint.host):\(endpoint.port)"
        for header in options.headers where !WebSocketHandshake.isValidHeader(name: header.name, value: header.value) {
            throw ConnectionError(.unsupported, "'\(header.name): \(header.value)' cannot be sent as a header line")
        }
        let extensions = options.deflate.map { [("Sec-WebSocket-Extensions", $0.offer)] } ?? []
        let request = WebSocketHandshake.clientRequest(
            host: host, path: endpoint.path, key: key, protocols: options.subprotocols, origin: options.origin,
            headers: extensions + options.headers.map { ($0.name, $0.value) })
        let (head, leftover) = try await withDeadline(
            options.handshakeTimeout, closing: tcp, "the WebSocket opening handshake with \(endpoint)"
        ) { () throws(ConnectionError) in
            try await tcp.send(Array(request.utf8))
            switch try await readHead(tcp, request: false, limit: options.maximumHandshakeSize) {
            case .success(let head): return head
            case .failure(let rejection):
                throw ConnectionError(
                    .protocolViolation, "the server's handshake answer is not HTTP: \(rejection.reason)",
                    systemCode: .init(domain: "websocket", code: 1002, name: "handshake"))
            }
        }
        switch WebSocketHandshake.validateResponse(
            head, key: key, offeredProtocols: options.subprotocols, offeredDeflate: options.deflate)
        {
        case .success(let agreed):
            let link = WebSocketFrameLink(
                over: tcp, role: .client, maximumFrameSize: options.maximumFrameSize,
                allowsCompressedFrames: agreed.deflate != nil, leftover: leftover)
            return WebSocketConnection(
                tcp: tcp, link: link, role: .client, endpoint: endpoint, subprotocol: agreed.subprotocol,
                options: options, deflate: agreed.deflate)
        case .failure(let error):
            throw ConnectionError(
                .protocolViolation, error.reason, systemCode: .init(domain: "websocket", code: 1002, name: "handshake"))
        }
    }

    /// Performs the server handshake on an accepted TCP connection. A bad request is answered with 400 or 426
    /// and the reason, and thrown as `.protocolViolation`; the caller closes the TCP connection. `decide` sees a
    /// valid request and accepts it (choosing a subprotocol and extra response headers) or refuses it with a
    /// status of its choice (also thrown as `.protocolViolation`, its system code the HTTP status).
    public static func server(
        over tcp: any Connection, transport: Transport = .ws, options: WebSocketOptions = WebSocketOptions(),
        decide: (@Sendable (WebSocketRequest) async -> WebSocketDecision)? = nil
    )
        async throws(ConnectionError) -> WebSocketConnection
    {
        let read = try await withDeadline(
            options.handshakeTimeout, closing: tcp, "the WebSocket opening handshake from \(tcp.remoteEndpoint)"
        ) { () throws(ConnectionError) in
            try await readHead(tcp, request: true, limit: options.maximumHandshakeSize)
        }
        var leftover: [UInt8] = []
        var verdict: Result<WebSocketHandshake.Accepted, WebSocketHandshake.Rejection>
        switch read {
        case .success(let (head, rest)):
            leftover = rest
            verdict = WebSocketHandshake.acceptRequest(
                head, supportedProtocols: options.subprotocols, deflate: options.deflate)
        case .failure(let rejection):
            verdict = .failure(rejection)
        }
        var request: WebSocketRequest?
        if case .success(var accepted) = verdict {
            let seen = WebSocketRequest(accepted, remote: tcp.remoteEndpoint.with(transport: transport))
            request = seen
            switch await decide?(seen) ?? .accept {
            case .refuse(let status, let reason):
                verdict = .failure(.init(status: (400...599).contains(status) ? status : 500, reason: reason))
            case .accept(let chosen, let headers):
                if let chosen, !seen.subprotocols.contains(chosen.lowercased()) {
                    verdict = .failure(.init(status: 500, reason: "the server chose a subprotocol not offered"))
                } else if let bad = headers.first(where: {
                    !WebSocketHandshake.isValidHeader(name: $0.name, value: $0.value)
                }) {
                    verdict = .failure(.init(status: 500, reason: "the server's header '\(bad.name)' is not valid"))
                } else {
                    if let chosen { accepted.subprotocol = chosen.lowercased() }
                    accepted.response = WebSocketHandshake.switchingProtocols(
                        key: accepted.key, subprotocol: accepted.subprotocol, deflate: accepted.deflate,
                        headers: headers.map { ($0.name, $0.value) })
                    verdict = .success(accepted)
                }
            }
        }
        switch verdict {
        case .success(let accepted):
            try await tcp.send(Array(accepted.response.utf8))
            let endpoint = tcp.localEndpoint.with(transport: transport)
            let link = WebSocketFrameLink(
                over: tcp, role: .server, maximumFrameSize: options.maximumFrameSize,
                allowsCompressedFrames: accepted.deflate != nil, leftover: leftover)
            return WebSocketConnection(
                tcp: tcp, link: link, role: .server,
                endpoint: Endpoint(
                    transport: transport, host: endpoint.host, port: endpoint.port, path: request?.path ?? "/"),
                subprotocol: accepted.subprotocol, options: options, deflate: accepted.deflate, request: request)
        case .failure(let rejection):
            try? await tcp.send(Array(rejection.response.utf8))
            throw ConnectionError(
                .protocolViolation, "WebSocket handshake rejected (\(rejection.status)): \(rejection.reason)",
                systemCode: .init(domain: "http", code: Int32(rejection.status), name: "HTTP \(rejection.status)"))
        }
    }

    /// Reads an HTTP head (up to CRLF CRLF): the head and the bytes read past it, or why the bytes so far can
    /// never be a valid head (checked as they arrive: garbage is refused without waiting for more).
    static func readHead(
        _ tcp: any Connection, request: Bool, limit: Int
    ) async throws(ConnectionError) -> Result<(String, [UInt8]), WebSocketHandshake.Rejection> {
        var bytes: [UInt8] = []
        while true {
            if let rejection = WebSocketHandshake.checkPartialHead(bytes, request: request, limit: limit) {
                return .failure(rejection)
            }
            if let length = WebSocketHandshake.headLength(in: bytes) {
                return .success((String(decoding: bytes[..<length], as: UTF8.self), Array(bytes[length...])))
            }
            guard let message = try await tcp.receive() else {
                throw ConnectionError(.protocolViolation, "the peer closed during the opening handshake")
            }
            bytes += message.bytes
        }
    }

    public func send(_ message: Message) async throws(ConnectionError) {
        let compress =
            deflate != nil && message.bytes.count >= (webSocketOptions.deflate?.minimumSize ?? .max)
        try state.withLock { (shared) throws(ConnectionError) in
            if let failure = shared.failure { throw failure }
            guard shared.machine.state == .open else { throw .closed("the WebSocket is closing or closed") }
            shared.sent.count(message.bytes.count, onWire: compress ? 0 : message.bytes.count)
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
        state.withLock { $0.sent.payloadBytes += payload.count }
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
        try state.withLock { (shared) throws(ConnectionError) in
            if let failure = shared.failure { throw failure }
            guard shared.machine.state == .open else { throw .closed("the WebSocket is closing or closed") }
            shared.sent.count(bytes.count, onWire: bytes.count)
        }
        await sendLock.enter()
        defer { sendLock.leave() }
        let key: UInt32? = role == .client ? state.withLock { $0.maskingKeys.next() } : nil
        try await link.send(binary: bytes, maskingKey: key)
    }

    /// Sends text.
    public func send(text: String) async throws(ConnectionError) {
        try await send(.text(text))
    }

    /// Sends frames in order (masked by a client). `consuming`: the caller's array is masked in place, not copied.
    private func sendFrames(_ frames: consuming [WebSocketFrame]) async throws(ConnectionError) {
        await sendLock.enter()
        defer { sendLock.leave() }
        try await sendLocked(frames)
    }

    /// ``sendFrames(_:)`` with the send lock held.
    private func sendLocked(_ frames: consuming [WebSocketFrame]) async throws(ConnectionError) {
        if role == .client {
            state.withLock { shared in
                for index in frames.indices {
                    frames[index].maskingKey = shared.maskingKeys.next()
                }
            }
        }
        try await link.send(frames)
    }

    /// Sends a ping and waits for its pong, at most `timeout` (default ``WebSocketOptions/pongDeadline``), then
    /// fails with `.timedOut`; cancelling the task ends the wait with `.cancelled`. Works whether or not a receive
    /// is running: with none, the ping reads the connection itself until its pong arrives, answering the peer's
    /// pings and keeping data messages for the next receive (at most `ConnectionOptions.receiveQueueLimit`
    /// bytes of them; beyond that it stops reading, and the peer waits, until the user receives).
    public func sendPing(_ payload: [UInt8] = [], timeout: Duration? = nil) async throws(ConnectionError) {
        guard payload.count <= 125 else { throw ConnectionError(.messageTooLarge, "a ping carries at most 125 bytes") }
        let limit = timeout ?? webSocketOptions.pongDeadline
        let id: UInt64 = try state.withLock { (shared) throws(ConnectionError) -> UInt64 in
            if let failure = shared.failure { throw failure }
            if shared.tcpClosed { throw .closed() }
            shared.nextPingID += 1
            shared.pingResults[shared.nextPingID] = nil
            shared.pingsInFlight.append(shared.nextPingID)
            return shared.nextPingID
        }
        do throws(ConnectionError) {
            try await sendFrames([WebSocketFrame(opcode: .ping, payload: payload)])
        } catch {
            resolvePing(id, .failure(error))
        }
        let result: Result<Void, ConnectionError> = await withTaskCancellationHandler {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { [self] in
                    // Cut short by cancellation: the cancellation handler settles the ping, not this timer.
                    guard (try? await Task.sleep(for: limit)) != nil else { return }
                    resolvePing(id, .failure(ConnectionError(.timedOut, "no pong within \(limit)")))
                }
                if receiveLock.tryEnter() {
                    group.addTask { [self] in
                        defer { receiveLock.leave() }
                        await pump(untilPing: id)
                    }
                }
                let result = await waitForPing(id)
                group.cancelAll()
                return result
            }
        } onCancel: {
            resolvePing(id, .failure(.cancelled()))
        }
        try result.get()
    }

    /// Settles ping `id` once (a pong, a deadline, a cancellation or a failure, whichever comes first).
    private func resolvePing(_ id: UInt64, _ result: Result<Void, ConnectionError>) {
        let waiter: CheckedContinuation<Result<Void, ConnectionError>, Never>? = state.withLock { shared in
            guard let index = shared.pingsInFlight.firstIndex(of: id) else { return nil }
            shared.pingsInFlight.remove(at: index)
            if let waiter = shared.pingWaiters.removeValue(forKey: id) { return waiter }
            shared.pingResults[id] = result
            return nil
        }
        waiter?.resume(returning: result)
    }

    private func waitForPing(_ id: UInt64) async -> Result<Void, ConnectionError> {
        await withCheckedContinuation { continuation in
            let settled: Result<Void, ConnectionError>? = state.withLock { shared in
                if let result = shared.pingResults.removeValue(forKey: id) { return result }
                shared.pingWaiters[id] = continuation
                return nil
            }
            if let settled { continuation.resume(returning: settled) }
        }
    }

    /// With the receive lock held and no receive running: reads frames until ping `id` is settled, the buffered
    /// data reaches the receive limit, or the connection ends.
    private func pump(untilPing id: UInt64) async {
        while state.withLock({ $0.pingsInFlight.contains(id) && !$0.tcpClosed && $0.failure == nil }) {
            if state.withLock({ $0.pendingBytes }) >= tcp.options.receiveQueueLimit { return }
            do throws(ConnectionError) {
                switch try await readOne(duringClose: false, placingInto: nil) {
                case .delivered(.message(let message)):
                    state.withLock { shared in
                        shared.pending.append(message)
                        shared.pendingBytes += message.bytes.count
                    }
                case .delivered(.placed), .nothing: continue
                case .end: return
                }
            } catch {
                return
            }
        }
    }

    // MARK: Receiving

    public func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        switch try await receive(duringClose: false) {
        case .message(let message): return message
        case .placed, nil: return nil  // nothing is placed without a buffer
        }
    }

    /// Receives one message into the caller's buffer. A message that comes in one frame (uncompressed) is
    /// unmasked straight from the read buffer into it: no array of its own and no second copy, which is most of
    /// what a WebSocket server's bulk receive costs over TCP's. Other messages (fragmented, compressed, or read
    /// meanwhile by a ping) are received as ``receive(maximumLength:)`` receives them and copied in. A message
    /// larger than the buffer is lost with `.messageTooLarge`, as the contract says.
    public func receive(into buffer: UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Received? {
        try Received.requireRoom(buffer)
        switch try await receive(duringClose: false, placingInto: buffer) {
        case .message(let message): return try Received.copy(message, into: buffer)
        case .placed(let received): return received
        case nil: return nil
        }
    }

    /// A message received: in an array of its own, or already in the receive's buffer.
    private enum Delivery {
        case message(Message)
        case placed(Received)
    }

    private func receive(
        duringClose: Bool, placingInto destination: UnsafeMutableRawBufferPointer? = nil
    ) async throws(ConnectionError) -> Delivery? {
        await receiveLock.enter()
        defer { receiveLock.leave() }
        while true {
            let buffered: Message? = state.withLock { shared in
                guard !shared.pending.isEmpty else { return nil }
                let message = shared.pending.removeFirst()
                shared.pendingBytes -= message.bytes.count
                return message
            }
            if let buffered { return .message(buffered) }
            switch try await readOne(duringClose: duringClose, placingInto: destination) {
            case .delivered(let delivery): return delivery
            case .nothing: continue
            case .end: return nil
            }
        }
    }

    private enum ReadOutcome {
        case delivered(Delivery)
        /// A frame that completed no message (a control frame, a fragment), or the end just seen.
        case nothing
        /// The end of the stream, reported (once; after it, receives throw).
        case end
    }

    /// Reads and handles one frame (holding the receive lock); with a `destination`, a message in one frame is
    /// placed there.
    private func readOne(
        duringClose: Bool, placingInto destination: UnsafeMutableRawBufferPointer?
    ) async throws(ConnectionError) -> ReadOutcome {
        if let failure = state.withLock({ $0.failure }) { throw failure }
        if state.withLock({ $0.tcpClosed }) {
            _ = try endOfStream(duringClose: duringClose)
            return .end
        }
        let received: WebSocketLinkInput?
        do throws(ConnectionError) {
            received = try await link.receive(placingInto: destination)
        } catch {
            // The connection may have been failed meanwhile (a keep-alive timeout closes TCP): say why.
            throw state.withLock { $0.failure } ?? error
        }
        switch received {
        case .frame(let frame):
            let actions = state.withLock { shared in
                let actions = shared.machine.receive(frame)
                if !frame.opcode.isControl { shared.received.payloadBytes += frame.payload.count }
                for case .deliver(_, let payload) in actions { shared.received.count(payload.count, onWire: 0) }
                return actions
            }
            return try await handle(actions).map { .delivered(.message($0)) } ?? .nothing
        case .placed(let text, let count):
            guard let destination else { preconditionFailure("a frame was placed without a buffer") }
            let payload = UnsafeRawBufferPointer(rebasing: destination[..<count])
            let outcome = state.withLock { shared in
                let outcome = shared.machine.receivePlaced(text: text, payload: payload)
                shared.received.payloadBytes += count
                if outcome == .deliver { shared.received.count(count, onWire: 0) }
                return outcome
            }
            switch outcome {
            case .deliver: return .delivered(.placed(Received(count: count, kind: text ? .text : .binary)))
            case .actions(let actions):
                try await handle(actions)
                return .nothing
            }
        case .invalid(let error):
            try await handle(state.withLock { $0.machine.failFromParser(error) })
            return .nothing
        case nil:
            // TCP ended: cleanly after a close handshake, abnormally otherwise (1006, never sent).
            let handshakeDone = state.withLock { shared in
                shared.tcpClosed = true
                defer { shared.machine.connectionLost() }
                return shared.machine.peerClose != nil
            }
            await tcp.close()
            if !handshakeDone {
                fail(
                    ConnectionError(
                        .reset, "the peer closed TCP without a close frame (1006)",
                        systemCode: .init(domain: "websocket", code: 1006, name: "abnormal closure")))
            }
            settlePings(.closed("the connection ended before the pong"))
            emitClosed(code: peerCloseCode, reason: peerCloseReason ?? "")
            return .nothing
        }
    }

    private func endOfStream(duringClose: Bool) throws(ConnectionError) -> Message? {
        try state.withLock { (shared) throws(ConnectionError) -> Message? in
            if let failure = shared.failure { throw failure }
            if shared.locallyClosed && !duringClose { throw .closed() }
            if shared.endReported { throw .closed("the end of the stream was already reported") }
            shared.endReported = true
            return nil
        }
    }

    /// Carries out the state machine's actions; returns a delivered message, if any.
    @discardableResult
    private func handle(_ actions: [WebSocketStateMachine.Action]) async throws(ConnectionError) -> Message? {
        var delivered: Message?
        for action in actions {
            switch action {
            case .deliver(let text, let payload):
                delivered = Message(kind: text ? .text : .binary, bytes: payload)
            case .send(let frame):
                try? await sendFrames([frame])
            case .pingReceived(let payload):
                if webSocketOptions.reportsControlFrames { eventSink.yield(.ping(payload)) }
            case .pongReceived(let payload):
                if webSocketOptions.reportsControlFrames { eventSink.yield(.pong(payload)) }
                if let oldest = state.withLock({ $0.pingsInFlight.first }) { resolvePing(oldest, .success(())) }
            case .closeReceived:
                break
            case .failed(let error):
                let kind: ConnectionError.Kind =
                    error.closeCode == .messageTooBig ? .messageTooLarge : .protocolViolation
                fail(
                    ConnectionError(
                        kind, error.reason,
                        systemCode: .init(
                            domain: "websocket", code: Int32(error.closeCode.rawValue), name: "\(error.closeCode)")))
            case .closeConnection:
                state.withLock { $0.tcpClosed = true }
                keepAlive.withLock { $0 }?.cancel()
                await tcp.close()
                settlePings(.closed("the connection closed before the pong"))
                emitClosed(code: peerCloseCode, reason: peerCloseReason ?? "")
            }
        }
        return delivered
    }

    private func fail(_ error: ConnectionError) {
        state.withLock { shared in
            if shared.failure == nil { shared.failure = error }
        }
        settlePings(error)
    }

    /// Fails every ping still waiting for its pong (the connection failed or ended).
    private func settlePings(_ error: ConnectionError) {
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
        let frames: [WebSocketFrame] = state.withLock { shared in
            shared.locallyClosed = true
            return shared.machine.close(code, reason: reason).compactMap {
                if case .send(let frame) = $0 { return frame } else { return nil }
            }
        }
        let timeout = webSocketOptions.closeTimeout
        // The close frame queues behind sends the peer is not taking (it stopped reading): that wait is bounded by
        // closeTimeout as well, and past it the TCP connection is closed under the stuck sends.
        let closeFrameSent = OnceFlag()
        if !frames.isEmpty {
            _ = await runBounded(by: timeout, onTimeout: { [tcp] in await tcp.close() }) { [self] in
                if (try? await sendFrames(frames)) != nil { _ = closeFrameSent.claim() }
            }
        }
        if closeFrameSent.isClaimed {
            // Read (discarding data) until the peer's close frame or the time limit, whichever comes first.
            await firstOf(
                { [self] in
                    while !state.withLock({ $0.tcpClosed }) {
                        guard (try? await receive(duringClose: true)) != nil else { break }
                    }
                },
                { try? await Task.sleep(for: timeout) })
        }
        fail(.closed())
        state.withLock { $0.tcpClosed = true }
        keepAlive.withLock { $0 }?.cancel()
        await tcp.close()
        emitClosed(code: peerCloseCode, reason: peerCloseReason ?? "")
    }

    /// The `.closed` event, once, then the end of ``events``.
    private func emitClosed(code: WebSocketCloseCode?, reason: String) {
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
        state.withLock { $0.locallyClosed = true }
        fail(.closed())
        state.withLock { $0.tcpClosed = true }
        keepAlive.withLock { $0 }?.cancel()
        await tcp.abort()
        emitClosed(code: nil, reason: "")
    }
}

extension WebSocketStateMachine {
    /// A parser error fails the connection like any other protocol error.
    mutating func failFromParser(_ error: WebSocketProtocolError) -> [Action] {
        failConnection(error)
    }
}

/// Data messages through one direction of a ``WebSocketConnection``.
public struct WebSocketTrafficCounts: Sendable, Hashable {
    /// Messages.
    public var messages = 0
    /// Their bytes.
    public var messageBytes = 0
    /// Their frames' payload bytes on the wire: after permessage-deflate, frame headers not counted.
    public var payloadBytes = 0

    public init() {}

    mutating func count(_ bytes: Int, onWire: Int) {
        messages += 1
        messageBytes += bytes
        payloadBytes += onWire
    }
}

/// What ``WebSocketConnection/events`` reports.
public enum WebSocketEvent: Sendable, Hashable {
    /// The handshake completed (with the chosen subprotocol, if any).
    case opened(subprotocol: String?)
    /// The connection ended: the peer's close code and reason when it sent a close frame (`nil` code otherwise).
    case closed(code: WebSocketCloseCode?, reason: String)
    /// The peer sent a ping with this payload (already answered). Only with
    /// ``WebSocketOptions/reportsControlFrames``.
    case ping([UInt8])
    /// The peer sent a pong with this payload (an answer to one of our pings, or unsolicited). Only with
    /// ``WebSocketOptions/reportsControlFrames``.
    case pong([UInt8])
}
