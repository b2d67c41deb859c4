// One piece, over 400 lines: one connection whose sending, receiving and reconnecting share its state and its
// one reconnect loop; its states and policy are in ReconnectPolicy.swift.

import ConnectionCore
import Synchronization

/// A client connection that connects again when it is lost, as the seed apps do by hand: the states show
/// `.waiting(error)` between attempts (backoff with jitter, a cap, an optional limit on attempts), sends while
/// disconnected are queued (bounded; each `send` returns once its message went out, or throws what lost it) or
/// refused, and `receive` waits across reconnections. Messages in flight
/// when a connection is lost are lost with it: the application protocol decides what to resend.
///
/// ```swift
/// let chat = ReconnectingConnection(backend: .async, endpoint: try Endpoint(url: "ws://127.0.0.1:9000/chat"))
/// Task { for await state in chat.states { print("state:", state) } }
/// try await chat.send(.text("hello"))          // waits for the connection, returns once sent
/// let reply = try await chat.receive()
/// await chat.close()
/// ```
public final class ReconnectingConnection: Connection, Sendable {
    public let transport: Transport
    public let options: ConnectionOptions
    /// Where it connects.
    public let endpoint: Endpoint
    public let policy: ReconnectPolicy
    /// State changes, in order, starting with `.setup` (one consumer; the newest 32 are kept).
    public let states: AsyncStream<ConnectionState>
    /// WebSocket only: every connection's `WebSocketEvent`s in turn (`opened`, then `ping`/`pong` when
    /// `WebSocketOptions.reportsControlFrames` is set, as NWProtocolWebSocket's metadata shows control frames,
    /// then `closed`; again for each reconnection). Finishes after ``close()``. One consumer; the newest 64 are
    /// kept.
    public let webSocketEvents: AsyncStream<WebSocketEvent>

    private let stateSink: AsyncStream<ConnectionState>.Continuation
    private let eventSink: AsyncStream<WebSocketEvent>.Continuation
    private let open: @Sendable () async throws(ConnectionError) -> any Connection
    private let shared = Guarded(Shared())

    private struct Shared {
        var state = ConnectionState.setup
        var current: (any Connection)?
        var generation = 0
        /// Sends waiting for a connection, each with the sender waiting for its outcome.
        var queue: [QueuedSend] = []
        var waiters: [CheckedContinuation<(any Connection)?, Never>] = []
        var connector: Task<Void, Never>?
        /// Forwards the current WebSocket's events to ``webSocketEvents``; ends after its `closed`.
        var forwarder: Task<Void, Never>?
        /// Under ``ReconnectPolicy/never``: the peer's end was returned by a receive (a later one throws).
        var endReported = false
    }

    /// A send made while disconnected: its message, and its sender, resumed when the message has been handed to
    /// a connection (`nil`) or can no longer be (the error that lost it).
    private struct QueuedSend {
        var message: Message
        var sender: CheckedContinuation<SendRoute, Never>

        func finish(_ error: ConnectionError?) { sender.resume(returning: .finished(error)) }
    }

    /// Where a send goes: onto the current connection, or already done (queued and handed over: `nil`) or
    /// refused (the error).
    private enum SendRoute {
        case connection(any Connection)
        case finished(ConnectionError?)
    }

    /// Takes every queued send out of `shared`, to be finished with an error outside the lock.
    private static func dropQueue(_ shared: inout Shared) -> [QueuedSend] {
        defer { shared.queue.removeAll() }
        return shared.queue
    }

    /// Connects (in the background, at once) with `backend` to `endpoint`, and again whenever the connection is
    /// lost, following `policy`.
    public convenience init(
        backend: Backend, endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(),
        webSocket: WebSocketOptions = WebSocketOptions(), tls: TLSConfiguration = TLSConfiguration(),
        policy: ReconnectPolicy = ReconnectPolicy()
    ) {
        self.init(
            backend: backend.implementation, endpoint: endpoint, options: options, webSocket: webSocket, tls: tls,
            policy: policy)
    }

    /// Connects with any `ConnectionBackend` (a user's own included), through ``TransportStack``: tls, ws
    /// and wss over its tcp.
    public init(
        backend: any ConnectionBackend, endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(),
        webSocket: WebSocketOptions = WebSocketOptions(), tls: TLSConfiguration = TLSConfiguration(),
        policy: ReconnectPolicy = ReconnectPolicy()
    ) {
        let stack = TransportStack(over: backend)
        self.transport = endpoint.transport
        self.options = options
        self.endpoint = endpoint
        self.policy = policy
        (states, stateSink) = AsyncStream.makeStream(of: ConnectionState.self, bufferingPolicy: .bufferingNewest(32))
        (webSocketEvents, eventSink) = AsyncStream.makeStream(
            of: WebSocketEvent.self, bufferingPolicy: .bufferingNewest(64))
        open = { () throws(ConnectionError) in
            try await stack.connect(to: endpoint, options: options, webSocket: webSocket, tls: tls)
        }
        stateSink.yield(.setup)
        startConnecting(after: nil)
    }

    /// The current state.
    public var state: ConnectionState { shared.withLock { $0.state } }

    public var localEndpoint: Endpoint { shared.withLock { $0.current?.localEndpoint } ?? endpoint }
    public var remoteEndpoint: Endpoint { shared.withLock { $0.current?.remoteEndpoint } ?? endpoint }

    private func set(_ state: ConnectionState, _ shared: inout Shared) {
        shared.state = state
        stateSink.yield(state)
    }

    /// Starts the connect loop unless one runs or the connection is closed; `error` is what ended the last one.
    private func startConnecting(after error: ConnectionError?) {
        shared.withLock { shared in
            guard shared.connector == nil, shared.current == nil else { return }
            switch shared.state {
            case .cancelled, .failed: return
            default: break
            }
            if let error { set(.waiting(error), &shared) }
            shared.generation += 1
            let generation = shared.generation
            shared.connector = Task { [weak self] in await self?.connectLoop(generation, first: error == nil) }
        }
    }

    private func connectLoop(_ generation: Int, first: Bool) async {
        var attempt = first ? 0 : 1
        while !Task.isCancelled {
            if attempt > 0 { try? await Task.sleep(for: policy.delay(before: attempt)) }
            if Task.isCancelled { return }
            shared.withLock { shared in
                if shared.generation == generation && shared.state != .cancelled { set(.preparing, &shared) }
            }
            do throws(ConnectionError) {
                let connection = try await open()
                // Queued sends go first, in order, each finished once the connection took it; the connection is
                // adopted (and others may send on it) only when the queue is empty, so a send queued while these
                // went out is not left behind.
                var adopted: [CheckedContinuation<(any Connection)?, Never>]?
                while true {
                    enum Step {
                        case send(QueuedSend)
                        case adopted([CheckedContinuation<(any Connection)?, Never>])
                        case abandoned
                    }
                    let step: Step = shared.withLock { shared in
                        guard shared.generation == generation, shared.state != .cancelled else { return .abandoned }
                        if !shared.queue.isEmpty { return .send(shared.queue.removeFirst()) }
                        shared.current = connection
                        shared.connector = nil
                        if let webSocket = connection as? WebSocketConnection {
                            // Made with the adoption, so that a close() that finds this connection finds its
                            // forwarder too, and waits for it to pass the `closed` event on.
                            shared.forwarder = Task { [eventSink] in
                                for await event in webSocket.events { eventSink.yield(event) }
                            }
                        }
                        set(.ready, &shared)
                        defer { shared.waiters.removeAll() }
                        return .adopted(shared.waiters)
                    }
                    switch step {
                    case .send(let queued):
                        do throws(ConnectionError) {
                            try await connection.send(queued.message)
                            queued.finish(nil)
                        } catch {
                            // This message is lost with the connection; the ones behind it wait for the next.
                            queued.finish(error)
                            await connection.close()
                            throw error
                        }
                        continue
                    case .adopted(let waiters): adopted = waiters
                    case .abandoned: adopted = nil
                    }
                    break
                }
                guard let adopted else {
                    await connection.close()
                    return
                }
                for waiter in adopted { waiter.resume(returning: connection) }
                return
            } catch {
                attempt += 1
                let gaveUp: ([CheckedContinuation<(any Connection)?, Never>], [QueuedSend])? = shared.withLock {
                    shared in
                    guard shared.generation == generation, shared.state != .cancelled else { return nil }
                    if let limit = policy.maximumAttempts, attempt >= limit {
                        set(.failed(error), &shared)
                        shared.connector = nil
                        defer { shared.waiters.removeAll() }
                        return (shared.waiters, Self.dropQueue(&shared))
                    }
                    set(.waiting(error), &shared)
                    return nil
                }
                if let (waiters, queued) = gaveUp {
                    for waiter in waiters { waiter.resume(returning: nil) }
                    // Queued sends fail with the error that ended the last attempt, as NWConnection's send
                    // completions do when the connection fails.
                    for send in queued { send.finish(error) }
                    return
                }
            }
        }
    }

    /// The connection when ready, waiting through reconnection; `nil` once closed or failed.
    private func connection() async -> (any Connection)? {
        await withCheckedContinuation { continuation in
            let now: (any Connection)?? = shared.withLock { shared in
                if let current = shared.current { return .some(current) }
                switch shared.state {
                case .cancelled, .failed: return .some(nil)
                case .closed where !policy.reconnects: return .some(nil)
                default:
                    shared.waiters.append(continuation)
                    return nil
                }
            }
            if let now { continuation.resume(returning: now) }
        }
    }

    /// `connection` was lost (its receive or send failed with `error`, or the peer ended it: `error` is `nil`):
    /// reconnect, unless the policy says ``ReconnectPolicy/never``.
    private func lost(_ connection: any Connection, _ error: ConnectionError?) async {
        let webSocket = connection as? WebSocketConnection
        let ended: ([CheckedContinuation<(any Connection)?, Never>], [QueuedSend])? = shared.withLock { shared in
            guard let current = shared.current, current === connection else { return nil }
            shared.current = nil
            if error == nil {
                set(.closed(code: webSocket?.peerCloseCode, reason: webSocket?.peerCloseReason ?? ""), &shared)
            }
            guard !policy.reconnects else { return ([], []) }
            if let error { set(.failed(error), &shared) }
            defer { shared.waiters.removeAll() }
            return (shared.waiters, Self.dropQueue(&shared))
        }
        guard let (waiters, queued) = ended else { return }
        for send in queued {
            send.finish(error ?? .closed("the peer ended the connection before the message was sent"))
        }
        await connection.close()
        if policy.reconnects {
            startConnecting(after: error ?? ConnectionError(.closed, "the server ended the connection"))
        } else {
            for waiter in waiters { waiter.resume(returning: nil) }
        }
    }

    /// What a send or receive throws once the connection has ended for good (from inside the lock: it must not
    /// read ``state``, which takes it).
    private static func endError(_ state: ConnectionState) -> ConnectionError {
        if case .failed(let error) = state { return error }
        return .closed()
    }

    /// Sends on the current connection; while disconnected, queues or refuses as ``ReconnectPolicy`` says. A send
    /// that fails because the connection was lost starts a reconnection and throws.
    ///
    /// A queued send returns when its message has been handed to a new connection, in order, as NWConnection's
    /// send completion fires when the content is processed: it throws the error that lost the message when
    /// the connection fails or gives up first (``ConnectionState/failed(_:)``), or `.cancelled` when ``close()``
    /// comes first. A queued send never reports success for a message that was dropped.
    public func send(_ message: Message) async throws(ConnectionError) {
        let route: SendRoute = await withCheckedContinuation { sender in
            let now: SendRoute? = shared.withLock { shared in
                if let current = shared.current { return .connection(current) }
                switch shared.state {
                case .cancelled, .failed: return .finished(Self.endError(shared.state))
                case .closed where !policy.reconnects: return .finished(Self.endError(shared.state))
                default: break
                }
                switch policy.whileDisconnected {
                case .refuse:
                    return .finished(ConnectionError(.closed, "disconnected from \(endpoint); reconnecting"))
                case .queue(let limit):
                    guard shared.queue.count < limit else {
                        return .finished(
                            ConnectionError(.resourceExhausted, "\(limit) messages already wait for the connection"))
                    }
                    shared.queue.append(QueuedSend(message: message, sender: sender))
                    return nil
                }
            }
            if let now { sender.resume(returning: now) }
        }
        switch route {
        case .finished(nil): return
        case .finished(let error?): throw error
        case .connection(let current):
            do throws(ConnectionError) {
                try await current.send(message)
            } catch {
                if error.kind != .cancelled { await lost(current, error) }
                throw error
            }
        }
    }

    /// The next message from whichever connection is current, waiting through reconnections; `nil` only once
    /// closed (or failed for good).
    public func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        while true {
            guard let current = await connection() else {
                if case .failed(let error) = state { throw error }
                let again = shared.withLock { shared in
                    defer { shared.endReported = true }
                    guard case .closed = shared.state else { return false }
                    return shared.endReported
                }
                if again { throw ConnectionError(.closed, "the end of the stream was already reported") }
                return nil
            }
            do throws(ConnectionError) {
                if let message = try await current.receive(maximumLength: maximumLength) { return message }
                await lost(current, nil)
            } catch {
                if error.kind == .cancelled || state == .cancelled { throw error }
                await lost(current, error)
            }
        }
    }

    /// Sends a WebSocket ping and returns when its pong arrives, as NWConnection's ping (a send with
    /// NWProtocolWebSocket metadata `.ping` and a `pongHandler`) does: waits for a connection first (as
    /// ``receive(maximumLength:)`` does), then for the pong up to `timeout` (default
    /// `WebSocketOptions.pongDeadline`), and throws `.timedOut` past it. A connection lost on the way starts a
    /// reconnection and throws; `.unsupported` for transports other than ws and wss.
    public func sendPing(_ payload: [UInt8] = [], timeout: Duration? = nil) async throws(ConnectionError) {
        guard transport == .ws || transport == .wss else {
            throw ConnectionError(.unsupported, "ping is WebSocket's (ws, wss), not \(transport)'s")
        }
        guard let current = await connection() else { throw Self.endError(state) }
        guard let webSocket = current as? WebSocketConnection else {
            throw ConnectionError(.unsupported, "the \(transport) connection is not a WebSocketConnection")
        }
        do throws(ConnectionError) {
            try await webSocket.sendPing(payload, timeout: timeout)
        } catch {
            if error.kind != .cancelled && error.kind != .timedOut { await lost(current, error) }
            throw error
        }
    }

    public func closeOutput() async throws(ConnectionError) {
        guard let current = shared.withLock({ $0.current }) else { throw ConnectionError(.closed, "not connected") }
        try await current.closeOutput()
    }

    /// Stops reconnecting and closes the current connection; waiting receives return `nil`.
    public func close() async {
        await close { await $0.close() }
    }

    /// Stops reconnecting and resets the current connection (see `Connection.abort()`).
    public func abort() async {
        await close { await $0.abort() }
    }

    /// Stops reconnecting and closes the current WebSocket with `code` and `reason`, as
    /// `URLSessionWebSocketTask.cancel(with:reason:)` does (other transports close as ``close()`` does).
    public func close(code: WebSocketCloseCode, reason: String = "") async {
        await close { connection in
            if let webSocket = connection as? WebSocketConnection {
                await webSocket.close(code: code, reason: reason)
            } else {
                await connection.close()
            }
        }
    }

    private func close(_ closing: (any Connection) async -> Void) async {
        let (current, connector, forwarder, waiters, queued) = shared.withLock { shared in
            defer {
                shared.current = nil
                shared.connector = nil
                shared.forwarder = nil
                shared.waiters.removeAll()
            }
            if shared.state != .cancelled { set(.cancelled, &shared) }
            return (
                shared.current, shared.connector, shared.forwarder, shared.waiters, Self.dropQueue(&shared)
            )
        }
        connector?.cancel()
        // An attempt in flight ends before close() returns, so that no socket of it outlives the close.
        await connector?.value
        for waiter in waiters { waiter.resume(returning: nil) }
        for send in queued { send.finish(ConnectionError(.cancelled, "closed before the message could be sent")) }
        if let current { await closing(current) }
        // The closed connection's events end with its `closed` event: passed on before the stream ends.
        await forwarder?.value
        stateSink.finish()
        eventSink.finish()
    }

    deinit {
        shared.withLock { $0.connector }?.cancel()
    }
}
