public import ConnectionCore

/// The server side of WebSocket over any backend's TCP (or TLS) listener: connections are accepted and their
/// opening handshakes run concurrently (a slow or bad client holds up no one); each connection whose handshake
/// succeeds is returned by ``acceptWebSocket()`` (or ``accept()``) with the client's request attached. A rejected
/// handshake is answered (400/404/426/431, or the status `decide` chose) and closed, and the listener keeps
/// serving.
///
/// Paths: a listener on `/` accepts any path; a listener on another path (`ws://host:port/chat`) accepts that
/// path only (whatever the query) and answers any other with 404.
public final class WebSocketListener: Listener, Sendable {
    public var transport: Transport { upgrading.transport }
    public var localEndpoint: Endpoint { upgrading.localEndpoint }
    /// The path served: `/` serves every path.
    public var path: String { upgrading.path }
    private let upgrading: UpgradingListener

    /// Handshakes rejected so far.
    public var rejectedHandshakes: Int { upgrading.rejectedHandshakes }

    /// Serves WebSocket on `tcp` (a TCP listener for `ws`, a TLS one for `wss`). `decide`, when given, sees each
    /// valid request for the served path and accepts or refuses it.
    public init(
        tcp: any Listener, transport: Transport = .ws, path: String = "/",
        options: WebSocketOptions = WebSocketOptions(),
        decide: (@Sendable (WebSocketRequest) async -> WebSocketDecision)? = nil
    ) {
        let served = path.isEmpty ? "/" : path
        let route: @Sendable (WebSocketRequest) async -> WebSocketDecision = { request in
            if served != "/" && request.path != served {
                return .refuse(status: 404, reason: "no WebSocket is served at \(request.path)")
            }
            return await decide?(request) ?? .accept
        }
        upgrading = UpgradingListener(tcp, transport: transport, path: served) { connection throws(ConnectionError) in
            try await WebSocketConnection.server(
                over: connection, transport: transport, options: options, decide: route)
        }
    }

    /// The next accepted WebSocket, its ``WebSocketConnection/request`` attached.
    public func acceptWebSocket() async throws(ConnectionError) -> WebSocketConnection {
        // Every connection the upgrade above hands out is a WebSocketConnection.
        try await upgrading.accept() as! WebSocketConnection
    }

    public func accept() async throws(ConnectionError) -> any Connection { try await acceptWebSocket() }

    public func close() async { await upgrading.close() }
}
