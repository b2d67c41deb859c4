import POSIXSupport

/// The transports stacked over a backend's own: `tls` (TLS over its TCP), `ws` (WebSocket over its TCP) and
/// `wss` (WebSocket over TLS over its TCP), client and server, with their handshake deadlines. Any
/// `ConnectionBackend` gets them, a user's own included: a backend provides `tcp` (and `udp` if it can), and
/// the stack does the rest, as `Backend`'s methods, ``Relay`` and ``ReconnectingConnection`` use it.
///
/// ```swift
/// let stack = TransportStack(over: MyBackend())
/// let chat = try await stack.connectWebSocket(to: try Endpoint(url: "ws://127.0.0.1:9000/chat"))
/// ```
public struct TransportStack: Sendable {
    /// The backend underneath.
    public let backend: any ConnectionBackend

    /// The stack over `backend`.
    public init(over backend: any ConnectionBackend) {
        self.backend = backend
    }

    /// The transports available: the backend's own, plus `tls`, `ws` and `wss` when it has `tcp`.
    public var transports: Set<Transport> {
        var transports = backend.transports
        if transports.contains(.tcp) { transports.formUnion([.tls, .ws, .wss]) }
        return transports
    }

    /// Connects with the backend. `tls://` runs the TLS handshake over the backend's TCP, `ws://` the WebSocket
    /// handshake, `wss://` both. `tls` applies to `tls://` and `wss://` (secure defaults: the certificate is
    /// verified against the system trust store and must name the host).
    public func connect(
        to endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(),
        webSocket: WebSocketOptions = WebSocketOptions(), tls: TLSConfiguration = TLSConfiguration()
    ) async throws(ConnectionError) -> any Connection {
        let transport = endpoint.transport
        guard transport.runsOverTCP, transport != .tcp else {
            return try await backend.connect(to: endpoint, options: options)
        }
        let tcp = endpoint.with(transport: .tcp)
        var stream: any Connection
        do throws(ConnectionError) {
            stream = try await backend.connect(to: tcp, options: options)
        } catch {
            // The user asked for ws://, wss:// or tls://: the error names that URL, not the TCP one under it.
            var named = error
            named.detail = error.detail.replacing(tcp.description, with: endpoint.description)
            throw named
        }
        do throws(ConnectionError) {
            if transport.isSecure {
                stream = try await TLSConnection.client(over: stream, endpoint: endpoint, configuration: tls)
            }
            if transport == .ws || transport == .wss {
                stream = try await WebSocketConnection.client(over: stream, endpoint: endpoint, options: webSocket)
            }
            return stream
        } catch {
            await stream.close()
            throw error
        }
    }

    /// NWConnection's model on the backend, any transport: a connection object that starts connecting at once
    /// and reports its ``ConnectionState``s in ``ReconnectingConnection/states`` (`setup`, `preparing`, `ready`,
    /// then the peer's `closed` with a WebSocket's code and reason, `failed(error)` or, after `close()`,
    /// `cancelled`). Sends before `ready` wait in a bounded queue. With `policy` other than
    /// ``ReconnectPolicy/never`` it also connects again when the connection is lost (`waiting(error)` between
    /// attempts).
    public func connection(
        to endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(),
        webSocket: WebSocketOptions = WebSocketOptions(), tls: TLSConfiguration = TLSConfiguration(),
        policy: ReconnectPolicy = .never
    ) -> ReconnectingConnection {
        ReconnectingConnection(
            backend: backend, endpoint: endpoint, options: options, webSocket: webSocket, tls: tls, policy: policy)
    }

    /// Connects to a `ws://` or `wss://` endpoint and returns the `WebSocketConnection` itself (pings, close codes,
    /// events), no cast needed.
    public func connectWebSocket(
        to endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(),
        webSocket: WebSocketOptions = WebSocketOptions(), tls: TLSConfiguration = TLSConfiguration()
    ) async throws(ConnectionError) -> WebSocketConnection {
        guard endpoint.transport == .ws || endpoint.transport == .wss else {
            throw ConnectionError(.unsupported, "connectWebSocket needs a ws:// or wss:// endpoint, not \(endpoint)")
        }
        // connect(to:) layers a WebSocketConnection on top for ws and wss.
        return try await connect(to: endpoint, options: options, webSocket: webSocket, tls: tls) as! WebSocketConnection
    }

    /// Listens on a `ws://` or `wss://` endpoint and returns the `WebSocketListener` itself: its
    /// `WebSocketListener.acceptWebSocket()` gives each connection with its request, and `decide` (optional)
    /// accepts or refuses each request. The endpoint's path is the one served (`/`: every path; another: that
    /// path only, others answered 404).
    public func listenWebSocket(
        on endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(),
        webSocket: WebSocketOptions = WebSocketOptions(), tls: TLSConfiguration? = nil,
        decide: (@Sendable (WebSocketRequest) async -> WebSocketDecision)? = nil
    ) async throws(ConnectionError) -> WebSocketListener {
        guard endpoint.transport == .ws || endpoint.transport == .wss else {
            throw ConnectionError(.unsupported, "listenWebSocket needs a ws:// or wss:// endpoint, not \(endpoint)")
        }
        let stream = try await listen(
            on: endpoint.with(transport: endpoint.transport == .wss ? .tls : .tcp), options: options, tls: tls)
        return WebSocketListener(
            tcp: stream, transport: endpoint.transport, path: endpoint.path, options: webSocket, decide: decide)
    }

    /// Listens with the backend. `tls://` and `wss://` need `tls` with a certificate chain and key
    /// (`TLSConfiguration.server(certificateChainFile:privateKeyFile:)`); `ws://` and `wss://` serve
    /// WebSocket. Handshakes run concurrently; failed ones are closed and the listener keeps serving.
    public func listen(
        on endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(),
        webSocket: WebSocketOptions = WebSocketOptions(), tls: TLSConfiguration? = nil
    ) async throws(ConnectionError) -> any Listener {
        let transport = endpoint.transport
        BoundsLog.setHandlerIfUnset { _, line in Syscall.writeStandardError("socketstyles: \(line)\n") }
        guard transport.runsOverTCP else {
            return try await backend.listen(on: endpoint, options: options)
        }
        if transport == .tcp {
            return BoundedListener(try await backend.listen(on: endpoint, options: options), options: options)
        }
        if transport == .ws || transport == .wss {
            return try await listenWebSocket(on: endpoint, options: options, webSocket: webSocket, tls: tls)
        }
        var tlsServer: TLSConfiguration?
        if transport.isSecure {
            guard let tls, tls.certificateChainFile != nil, tls.privateKeyFile != nil else {
                throw ConnectionError(
                    .tls, "\(transport):// needs a certificate chain and a private key (PEM files; --cert and --key)")
            }
            tlsServer = tls
        }
        var listener: any Listener = BoundedListener(
            try await backend.listen(on: endpoint.with(transport: .tcp), options: options), options: options)
        if let tlsServer {
            do throws(ConnectionError) {
                listener = try TLSConnection.listener(over: listener, configuration: tlsServer)
            } catch {
                await listener.close()
                throw error
            }
        }
        return listener
    }
}
