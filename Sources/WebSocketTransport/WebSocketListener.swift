public import ConnectionCore

/// The server side of WebSocket over any backend's TCP (or TLS) listener: connections are accepted and their
/// opening handshakes run concurrently (a slow or bad client holds up no one); each connection whose handshake
/// succeeds is returned by ``accept()``. A rejected handshake is answered (400/426) and closed, and the listener
/// keeps serving.
public final class WebSocketListener: Listener, Sendable {
    public var transport: Transport { upgrading.transport }
    public var localEndpoint: Endpoint { upgrading.localEndpoint }
    /// The path announced in ``localEndpoint`` (any path is accepted).
    public var path: String { upgrading.path }
    private let upgrading: UpgradingListener

    /// Handshakes rejected so far.
    public var rejectedHandshakes: Int { upgrading.rejectedHandshakes }

    /// Serves WebSocket on `tcp` (a TCP listener for `ws`, a TLS one for `wss`).
    public init(
        tcp: any Listener, transport: Transport = .ws, path: String = "/",
        options: WebSocketOptions = WebSocketOptions()
    ) {
        upgrading = UpgradingListener(tcp, transport: transport, path: path) { connection throws(ConnectionError) in
            try await WebSocketConnection.server(over: connection, transport: transport, options: options)
        }
    }

    public func accept() async throws(ConnectionError) -> any Connection { try await upgrading.accept() }

    public func close() async { await upgrading.close() }
}
