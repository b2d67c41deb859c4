import POSIXSupport
import Synchronization

/// The list of connection styles: the six this package ships, in the order reports show them, then any a program
/// registered. Each backend module declares its own `Backend` value (its name, summary and factory); this is
/// the one place that lists them. Adding a backend is its module, its registration value (with its `Tooling`:
/// module, colour, Autobahn runs, allocation threshold, which the scripts read), one entry here and its
/// Package.swift lines: the CLI, compare, the report, the conformance suite and the scripts iterate the list.
extension Backend {
    /// The package's own styles.
    public static let builtIn: [Backend] = [.bsd, .uv, .runloop, .async, .nio, .uring]

    private static let registered = Guarded<[Backend]>([])

    /// Every backend: `builtIn`, then those added with `register(_:)`, also those that cannot run here.
    public static var everyCase: [Backend] { builtIn + registered.withLock { $0 } }

    /// Every backend that can run on this machine: what compare, the CLI's lists and the test suites iterate. One
    /// that cannot (io_uring forbidden by the kernel or a sandbox) is left out; `sockbench backends` lists it with
    /// its `unavailableReason`.
    public static var allCases: [Backend] { everyCase.filter { $0.unavailableReason == nil } }

    /// Adds a backend written outside the package to `allCases` (what `Backend(name:)` finds and the conformance
    /// suite runs). Fails when the name is taken.
    public static func register(_ backend: Backend) throws(ConnectionError) {
        try registered.withLock { (list) throws(ConnectionError) in
            guard !(builtIn + list).contains(where: { $0.name == backend.name }) else {
                throw ConnectionError(.invalidEndpoint, "a backend named '\(backend.name)' is registered already")
            }
            list.append(backend)
        }
    }

    /// The reference the others are set against (SwiftNIO's), if the list has one.
    public static var reference: Backend? { allCases.first(where: \.isReference) }

    /// Looks a backend up by name (as `--backend` takes it), `nil` when none has it.
    public init?(rawValue: String) {
        guard let found = Backend.allCases.first(where: { $0.name == rawValue.lowercased() }) else { return nil }
        self = found
    }

    /// The transports available on this backend: its own, plus what ``TransportStack`` layers on top of its TCP
    /// (`tls`, `ws`, and `wss` = WebSocket over TLS).
    public var transports: Set<Transport> { stack.transports }

    /// ``TransportStack`` over this backend: what the methods below use.
    public var stack: TransportStack { TransportStack(over: implementation) }

    /// Parses a backend name, with an error listing the valid ones.
    public init(name: String) throws(ConnectionError) {
        if let known = Backend.everyCase.first(where: { $0.name == name.lowercased() }),
            let reason = known.unavailableReason
        {
            throw ConnectionError(.unsupported, "backend '\(known.name)' is unavailable here: \(reason)")
        }
        guard let backend = Backend(rawValue: name) else {
            let names = Backend.allCases.map(\.name).joined(separator: ", ")
            throw ConnectionError(.invalidEndpoint, "unknown backend '\(name)' (available: \(names))")
        }
        self = backend
    }

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
