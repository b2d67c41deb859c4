@_exported public import AsyncBackend
@_exported public import BSDSocketBackend
@_exported public import ConnectionCore
@_exported public import LibUVBackend
@_exported public import POSIXSupport
@_exported public import RunLoopBackend
@_exported public import WebSocketCodec
@_exported public import WebSocketTransport

/// Every connection style this package offers, by the name users type (`--backend bsd`).
///
/// Adding a backend is adding a case here: the compiler's exhaustive switches then show every place that must
/// learn about it, and the conformance suite runs every scenario for it.
public enum Backend: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// Blocking BSD sockets on threads of their own (``BSDBackend``).
    case bsd
    /// libuv's event loop and callbacks on one loop thread (``LibUVBackend``).
    case uv
    /// Delegate-driven input/output streams on a run loop of our own (``RunLoopBackend``), as Apple's
    /// Stream/CFStream.
    case runloop
    /// async/await over non-blocking sockets and one epoll reactor thread (``AsyncBackend``).
    case async

    /// The backend's factory.
    public var implementation: any ConnectionBackend {
        switch self {
        case .bsd: BSDBackend()
        case .uv: LibUVBackend.shared
        case .runloop: RunLoopBackend.shared
        case .async: AsyncBackend()
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
        }
    }

    /// The transports available on this backend: its own, plus what the umbrella layers on top of them
    /// (`ws` over `tcp`).
    public var transports: Set<Transport> {
        var transports = implementation.transports
        if transports.contains(.tcp) { transports.insert(.ws) }
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

    /// Connects with this backend. `ws://` runs the WebSocket client handshake over the backend's TCP.
    public func connect(
        to endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(),
        webSocket: WebSocketOptions = WebSocketOptions()
    ) async throws(ConnectionError) -> any Connection {
        guard endpoint.transport == .ws else { return try await implementation.connect(to: endpoint, options: options) }
        let tcp = try await implementation.connect(to: endpoint.with(transport: .tcp), options: options)
        do throws(ConnectionError) {
            return try await WebSocketConnection.client(over: tcp, endpoint: endpoint, options: webSocket)
        } catch {
            await tcp.close()
            throw error
        }
    }

    /// Listens with this backend. `ws://` serves WebSocket over the backend's TCP listener.
    public func listen(
        on endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(),
        webSocket: WebSocketOptions = WebSocketOptions()
    ) async throws(ConnectionError) -> any Listener {
        guard endpoint.transport == .ws else { return try await implementation.listen(on: endpoint, options: options) }
        let tcp = try await implementation.listen(on: endpoint.with(transport: .tcp), options: options)
        return WebSocketListener(tcp: tcp, transport: .ws, path: endpoint.path, options: webSocket)
    }
}
