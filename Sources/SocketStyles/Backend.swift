import POSIXSupport

/// Every connection style this package offers, by the name users type (`--backend bsd`).
///
/// Adding a backend is adding a case here: the compiler's exhaustive switches then show every place that must
/// learn about it, and the conformance suite runs every scenario for it.
public enum Backend: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// Blocking BSD sockets on threads of their own (`BSDBackend`).
    case bsd
    /// libuv's event loop and callbacks on one loop thread (`LibUVBackend`).
    case uv
    /// Delegate-driven input/output streams on a run loop of our own (`RunLoopBackend`), as Apple's
    /// Stream/CFStream.
    case runloop
    /// async/await over non-blocking sockets and one epoll reactor thread (`AsyncBackend`).
    case async
    /// SwiftNIO channels on one event-loop thread (`NIOBackend`): the reference a user would otherwise pick.
    case nio

    /// The backend's factory.
    public var implementation: any ConnectionBackend {
        switch self {
        case .bsd: BSDBackend()
        case .uv: LibUVBackend.shared
        case .runloop: RunLoopBackend.shared
        case .async: AsyncBackend()
        case .nio: NIOBackend()
        }
    }

    /// One line on the style, for `sockbench` listings.
    public var summary: String {
        switch self {
        case .bsd: "blocking BSD sockets; a reader thread (and a writer thread when needed) per connection"
        case .uv: "libuv 1.44 loop and callbacks; every connection on one loop thread, uv_async_send to reach it"
        case .runloop:
            "input/output streams with a delegate (openCompleted, hasBytesAvailable, ...) on one epoll run loop"
        case .async: "async/await on non-blocking sockets; one epoll reactor thread resumes waiting tasks"
        case .nio: "SwiftNIO 2.101 channels and handlers on one event-loop thread; the reference to beat"
        }
    }

    /// The transports available on this backend: its own, plus what the umbrella layers on top of its TCP
    /// (`tls`, `ws`, and `wss` = WebSocket over TLS).
    public var transports: Set<Transport> {
        var transports = implementation.transports
        if transports.contains(.tcp) { transports.formUnion([.tls, .ws, .wss]) }
        return transports
    }

    /// Parses a backend name, with an error listing the valid ones.
    public init(name: String) throws(ConnectionError) {
        guard let backend = Backend(rawValue: name.lowercased()) else {
            let names = Backend.allCases.map(\.rawValue).joined(separator: ", ")
            throw ConnectionError(.invalidEndpoint, "unknown backend '\(name)' (available: \(names))")
        }
        self = backend
    }

    public var description: String { rawValue }

    /// Connects with this backend. `tls://` runs the TLS handshake over the backend's TCP, `ws://` the WebSocket
    /// handshake, `wss://` both. `tls` applies to `tls://` and `wss://` (secure defaults: the certificate is
    /// verified against the system trust store and must name the host).
    public func connect(
        to endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(),
        webSocket: WebSocketOptions = WebSocketOptions(), tls: TLSConfiguration = TLSConfiguration()
    ) async throws(ConnectionError) -> any Connection {
        let transport = endpoint.transport
        guard transport.runsOverTCP, transport != .tcp else {
            return try await implementation.connect(to: endpoint, options: options)
        }
        let tcp = endpoint.with(transport: .tcp)
        var stream: any Connection
        do throws(ConnectionError) {
            stream = try await implementation.connect(to: tcp, options: options)
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

    /// NWConnection's model on this backend, any transport: a connection object that starts connecting at once
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
            backend: self, endpoint: endpoint, options: options, webSocket: webSocket, tls: tls, policy: policy)
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

    /// Listens with this backend. `tls://` and `wss://` need `tls` with a certificate chain and key
    /// (`TLSConfiguration.server(certificateChainFile:privateKeyFile:)`); `ws://` and `wss://` serve
    /// WebSocket. Handshakes run concurrently; failed ones are closed and the listener keeps serving.
    public func listen(
        on endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(),
        webSocket: WebSocketOptions = WebSocketOptions(), tls: TLSConfiguration? = nil
    ) async throws(ConnectionError) -> any Listener {
        let transport = endpoint.transport
        BoundsLog.setHandlerIfUnset { _, line in Syscall.writeStandardError("socketstyles: \(line)\n") }
        guard transport.runsOverTCP else {
            return try await implementation.listen(on: endpoint, options: options)
        }
        if transport == .tcp {
            return BoundedListener(try await implementation.listen(on: endpoint, options: options), options: options)
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
            try await implementation.listen(on: endpoint.with(transport: .tcp), options: options), options: options)
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
