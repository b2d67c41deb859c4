/// The wire protocol a ``Connection`` speaks, named by its URL scheme.
///
/// - `tcp`: a reliable, ordered **byte stream**. Message boundaries are not kept: one `send` may arrive as
///   several receives, and several sends may arrive joined in one receive.
/// - `udp`: **datagrams**. Each send arrives whole or not at all; datagrams may be lost, duplicated or reordered.
/// - `ws` / `wss`: WebSocket (RFC 6455) messages over TCP (wss: over TLS). Boundaries and the text/binary kind
///   are kept.
/// - `tls`: a TLS byte stream over TCP.
public enum Transport: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    case tcp
    case udp
    case ws
    case wss
    case tls

    /// The URL scheme, e.g. `tcp`.
    public var scheme: String { rawValue }

    /// `true` when the transport is a byte stream (TCP, TLS) and so does not keep message boundaries.
    public var isByteStream: Bool { self == .tcp || self == .tls }

    /// `true` when each receive returns exactly one message sent by the peer (UDP datagrams, WebSocket messages).
    public var keepsMessageBoundaries: Bool { !isByteStream }

    /// `true` when the transport runs over a TCP connection (everything but UDP).
    public var runsOverTCP: Bool { self != .udp }

    /// `true` when the transport is encrypted with TLS.
    public var isSecure: Bool { self == .wss || self == .tls }

    /// The port used when a URL names none; `nil` when a port is required.
    public var defaultPort: UInt16? {
        switch self {
        case .ws: 80
        case .wss: 443
        case .tcp, .udp, .tls: nil
        }
    }

    public var description: String { rawValue }
}
