public import ConnectionCore
public import WebSocketCodec

/// Options of a WebSocket connection.
public struct WebSocketOptions: Sendable, Hashable {
    /// Largest message accepted (reassembled); a bigger one fails the connection with 1009. Default 64 MiB,
    /// which passes Autobahn's 16 MiB cases.
    public var maximumMessageSize = 64 * 1024 * 1024
    /// Largest single frame accepted.
    public var maximumFrameSize = 64 * 1024 * 1024
    /// Outgoing messages larger than this are sent as several frames.
    public var fragmentSize = 1024 * 1024
    /// Subprotocols offered (client) or supported (server), in order of preference.
    public var subprotocols: [String] = []
    /// Origin sent by a client.
    public var origin: String? = nil
    /// Extra header lines a client sends with its request (an `Authorization`, a cookie), in order.
    public var headers: [WebSocketRequest.Header] = []
    /// How long ``WebSocketConnection/close(code:reason:)`` waits for the peer's close frame.
    public var closeTimeout: Duration = .seconds(2)
    /// Largest opening-handshake head accepted; a larger one is answered 431 (server) or fails (client).
    public var maximumHandshakeSize = 16 * 1024
    /// How long the opening handshake may take, from the connection's first byte to the last of the head:
    /// a client that connects and says nothing (or too little) is let go with `.timedOut` once it passes, and a
    /// client gives up on a server that does not answer.
    public var handshakeTimeout: Duration = .seconds(5)
    /// Keep-alive: send a ping this often (`nil`: never). iOS apps typically ping every 10 s.
    public var keepAliveInterval: Duration? = nil
    /// Keep-alive: fail the connection (`.timedOut`, close 1001) when a keep-alive ping gets no pong in time.
    /// Also the default deadline of ``WebSocketConnection/sendPing(_:timeout:)``. With no receive running, the
    /// ping reads the connection itself, so keep-alive works (and sees a vanished peer) either way.
    public var pongDeadline: Duration = .seconds(10)
    /// Report each ping and pong the peer sends in ``WebSocketConnection/events`` (`.ping`, `.pong`), as
    /// NWProtocolWebSocket's per-message metadata shows their opcodes. Off by default: pings are answered either
    /// way, and an application that does not read ``WebSocketConnection/events`` loses nothing.
    public var reportsControlFrames = false
    /// permessage-deflate (RFC 7692): `nil` (the default) neither offers nor accepts it. Set, a client offers it
    /// and a server accepts a client's offer; the decompressed size of a message is held to
    /// ``maximumMessageSize`` (1009 past it).
    public var deflate: WebSocketDeflateOptions? = nil
    /// The clock the deadlines and intervals above run on (handshake, pong deadline, keep-alive, close
    /// timeout): the system's by default; a test gives a clock it advances by hand (ConnectionTestKit's
    /// `ManualClock`) to reach a deadline without waiting for it.
    public var clock: DeadlineClock = .continuous

    public init() {}

    /// The defaults, changed by `configure`.
    public static func with(_ configure: (inout WebSocketOptions) -> Void) -> WebSocketOptions {
        var options = WebSocketOptions()
        configure(&options)
        return options
    }
}

/// Data messages through one direction of a ``WebSocketConnection``.
public struct WebSocketTrafficCounts: Sendable, Hashable {
    /// Messages.
    public var messages = 0
    /// Their bytes.
    public var messageBytes = 0
    /// Their frames' payload bytes on the wire: after permessage-deflate, frame headers not counted.
    public var payloadBytes = 0

    public init() {}

    mutating func count(_ bytes: Int, onWire: Int) {
        messages += 1
        messageBytes += bytes
        payloadBytes += onWire
    }
}

/// What ``WebSocketConnection/events`` reports.
public enum WebSocketEvent: Sendable, Hashable {
    /// The handshake completed (with the chosen subprotocol, if any).
    case opened(subprotocol: String?)
    /// The connection ended: the peer's close code and reason when it sent a close frame (`nil` code otherwise).
    case closed(code: WebSocketCloseCode?, reason: String)
    /// The peer sent a ping with this payload (already answered). Only with
    /// ``WebSocketOptions/reportsControlFrames``.
    case ping([UInt8])
    /// The peer sent a pong with this payload (an answer to one of our pings, or unsolicited). Only with
    /// ``WebSocketOptions/reportsControlFrames``.
    case pong([UInt8])
}
