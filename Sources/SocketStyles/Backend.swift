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

    /// The transports available on this backend: its own, plus what ``TransportStack`` layers on top of its TCP
    /// (`tls`, `ws`, and `wss` = WebSocket over TLS).
    public var transports: Set<Transport> { stack.transports }

    /// ``TransportStack`` over this backend: what the methods below use.
    public var stack: TransportStack { TransportStack(over: implementation) }

    /// Parses a backend name, with an error listing the valid ones.
    public init(name: String) throws(ConnectionError) {
        guard let backend = Backend(rawValue: name.lowercased()) else {
            let names = Backend.allCases.map(\.rawValue).joined(separator: ", ")
            throw ConnectionError(.invalidEndpoint, "unknown backend '\(name)' (available: \(names))")
        }
        self = backend
    }

    public var description: String { rawValue }

    /// Connects with this backend: ``TransportStack/connect(to:options:webSocket:tls:)``.
    public func connect(
        to endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(),
        webSocket: WebSocketOptions = WebSocketOptions(), tls: TLSConfiguration = TLSConfiguration()
    ) async throws(ConnectionError) -> any Connection {
        try await stack.connect(to: endpoint, options: options, webSocket: webSocket, tls: tls)
    }

    /// NWConnection's model on this backend: ``TransportStack/connection(to:options:webSocket:tls:policy:)``.
    public func connection(
        to endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(),
        webSocket: WebSocketOptions = WebSocketOptions(), tls: TLSConfiguration = TLSConfiguration(),
        policy: ReconnectPolicy = .never
    ) -> ReconnectingConnection {
        stack.connection(to: endpoint, options: options, webSocket: webSocket, tls: tls, policy: policy)
    }

    /// A WebSocket client on this backend: ``TransportStack/connectWebSocket(to:options:webSocket:tls:)``.
    public func connectWebSocket(
        to endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(),
        webSocket: WebSocketOptions = WebSocketOptions(), tls: TLSConfiguration = TLSConfiguration()
    ) async throws(ConnectionError) -> WebSocketConnection {
        try await stack.connectWebSocket(to: endpoint, options: options, webSocket: webSocket, tls: tls)
    }

    /// A WebSocket server on this backend: ``TransportStack/listenWebSocket(on:options:webSocket:tls:decide:)``.
    public func listenWebSocket(
        on endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(),
        webSocket: WebSocketOptions = WebSocketOptions(), tls: TLSConfiguration? = nil,
        decide: (@Sendable (WebSocketRequest) async -> WebSocketDecision)? = nil
    ) async throws(ConnectionError) -> WebSocketListener {
        try await stack.listenWebSocket(on: endpoint, options: options, webSocket: webSocket, tls: tls, decide: decide)
    }

    /// Listens with this backend: ``TransportStack/listen(on:options:webSocket:tls:)``.
    public func listen(
        on endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(),
        webSocket: WebSocketOptions = WebSocketOptions(), tls: TLSConfiguration? = nil
    ) async throws(ConnectionError) -> any Listener {
        try await stack.listen(on: endpoint, options: options, webSocket: webSocket, tls: tls)
    }
}
