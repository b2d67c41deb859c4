public import ConnectionCore
import WebSocketCodec

/// A client's opening handshake as the server sees it: what `accept` code decides on, and what stays attached to
/// the accepted ``WebSocketConnection`` (``WebSocketConnection/request``).
public struct WebSocketRequest: Sendable, Hashable {
    /// The request target's path, without the query (`/chat` for `GET /chat?room=1`).
    public var path: String
    /// The query after `?`, if any (`room=1`).
    public var query: String?
    /// The Host header.
    public var host: String
    /// The Origin header, if any (browsers send it).
    public var origin: String?
    /// The subprotocols the client offered, in its order of preference.
    public var subprotocols: [String]
    /// Every header line, names lowercased, in the order received.
    public var headers: [Header]
    /// The client's address.
    public var remoteEndpoint: Endpoint

    /// One header line.
    public struct Header: Sendable, Hashable {
        public var name: String
        public var value: String

        public init(name: String, value: String) {
            self.name = name
            self.value = value
        }
    }

    /// The first value of header `name` (any case), if present.
    public func header(_ name: String) -> String? {
        let name = name.lowercased()
        return headers.first { $0.name == name }?.value
    }

    init(_ accepted: WebSocketHandshake.Accepted, remote: Endpoint) {
        let target = accepted.path.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        path = String(target[0])
        query = target.count > 1 ? String(target[1]) : nil
        host = accepted.host
        origin = accepted.origin
        subprotocols = accepted.head.tokens("sec-websocket-protocol")
        headers = accepted.head.fields.map { Header(name: $0.name, value: $0.value) }
        remoteEndpoint = remote
    }
}

/// What the accepting code answers to a ``WebSocketRequest``.
public enum WebSocketDecision: Sendable, Hashable {
    /// Upgrade: with a subprotocol (one the client offered; `nil` picks the first of the client's that
    /// ``WebSocketOptions/subprotocols`` supports) and extra header lines for the 101 response.
    case accept(subprotocol: String? = nil, headers: [WebSocketRequest.Header] = [])
    /// Answer with an HTTP status (4xx, 5xx) and a reason, then close.
    case refuse(status: Int, reason: String)

    /// Accepts with the defaults.
    public static var accept: WebSocketDecision { .accept(subprotocol: nil, headers: []) }
}
