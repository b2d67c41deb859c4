public import ConnectionCore
public import WebSocketCodec

/// Options of a WebSocket connection.
public struct WebSocketOptions: Sendable, Hashable {
    // One shared object for the values (SharedValues): every WebSocket connection keeps its options for as long as
    // it is open, and a copy of them is then one reference, not 216 bytes (docs/benchmarks.md, memory per
    // connection).
    @usableFromInline
    struct Values: Sendable, Hashable {
        @usableFromInline var maximumMessageSize: Int = 64 * 1024 * 1024
        @usableFromInline var maximumFrameSize: Int = 64 * 1024 * 1024
        @usableFromInline var fragmentSize: Int = 1024 * 1024
        @usableFromInline var subprotocols: [String] = []
        @usableFromInline var origin: String? = nil
        @usableFromInline var headers: [WebSocketRequest.Header] = []
        @usableFromInline var closeTimeout: Duration = .seconds(2)
        @usableFromInline var maximumHandshakeSize: Int = 16 * 1024
        @usableFromInline var handshakeTimeout: Duration = .seconds(5)
        @usableFromInline var keepAliveInterval: Duration? = nil
        @usableFromInline var pongDeadline: Duration = .seconds(10)
        @usableFromInline var reportsControlFrames: Bool = false
        @usableFromInline var deflate: WebSocketDeflateOptions? = nil
        @usableFromInline var clock: DeadlineClock = .continuous
        @inlinable init() {}
    }

    @usableFromInline var box: SharedValues<Values>

    @inlinable
    mutating func change(_ update: (inout Values) -> Void) { box = box.changing(update) }

    @usableFromInline static let defaults = SharedValues(Values())

    /// Largest message accepted (reassembled); a bigger one fails the connection with 1009. Default 64 MiB,
    /// which passes Autobahn's 16 MiB cases.
    @inlinable public var maximumMessageSize: Int {
        get { box.values.maximumMessageSize }
        set { change { $0.maximumMessageSize = newValue } }
    }
    /// Largest single frame accepted.
    @inlinable public var maximumFrameSize: Int {
        get { box.values.maximumFrameSize }
        set { change { $0.maximumFrameSize = newValue } }
    }
    /// Outgoing messages larger than this are sent as several frames.
    @inlinable public var fragmentSize: Int {
        get { box.values.fragmentSize }
        set { change { $0.fragmentSize = newValue } }
    }
    /// Subprotocols offered (client) or supported (server), in order of preference.
    @inlinable public var subprotocols: [String] {
        get { box.values.subprotocols }
        set { change { $0.subprotocols = newValue } }
    }
    /// Origin sent by a client.
    @inlinable public var origin: String? {
        get { box.values.origin }
        set { change { $0.origin = newValue } }
    }
    /// Extra header lines a client sends with its request (an `Authorization`, a cookie), in order.
    @inlinable public var headers: [WebSocketRequest.Header] {
        get { box.values.headers }
        set { change { $0.headers = newValue } }
    }
    /// How long ``WebSocketConnection/close(code:reason:)`` waits for the peer's close frame.
    @inlinable public var closeTimeout: Duration {
        get { box.values.closeTimeout }
        set { change { $0.closeTimeout = newValue } }
    }
    /// Largest opening-handshake head accepted; a larger one is answered 431 (server) or fails (client).
    @inlinable public var maximumHandshakeSize: Int {
        get { box.values.maximumHandshakeSize }
        set { change { $0.maximumHandshakeSize = newValue } }
    }
    /// How long the opening handshake may take, from the connection's first byte to the last of the head:
    /// a client that connects and says nothing (or too little) is let go with `.timedOut` once it passes, and a
    /// client gives up on a server that does not answer.
    @inlinable public var handshakeTimeout: Duration {
        get { box.values.handshakeTimeout }
        set { change { $0.handshakeTimeout = newValue } }
    }
    /// Keep-alive: send a ping this often (`nil`: never). iOS apps typically ping every 10 s.
    @inlinable public var keepAliveInterval: Duration? {
        get { box.values.keepAliveInterval }
        set { change { $0.keepAliveInterval = newValue } }
    }
    /// Keep-alive: fail the connection (`.timedOut`, close 1001) when a keep-alive ping gets no pong in time.
    /// Also the default deadline of ``WebSocketConnection/sendPing(_:timeout:)``. With no receive running, the
    /// ping reads the connection itself, so keep-alive works (and sees a vanished peer) either way.
    @inlinable public var pongDeadline: Duration {
        get { box.values.pongDeadline }
        set { change { $0.pongDeadline = newValue } }
    }
    /// Report each ping and pong the peer sends in ``WebSocketConnection/events`` (`.ping`, `.pong`), as
    /// NWProtocolWebSocket's per-message metadata shows their opcodes. Off by default: pings are answered either
    /// way, and an application that does not read ``WebSocketConnection/events`` loses nothing.
    @inlinable public var reportsControlFrames: Bool {
        get { box.values.reportsControlFrames }
        set { change { $0.reportsControlFrames = newValue } }
    }
    /// permessage-deflate (RFC 7692): `nil` (the default) neither offers nor accepts it. Set, a client offers it
    /// and a server accepts a client's offer; the decompressed size of a message is held to
    /// ``maximumMessageSize`` (1009 past it).
    @inlinable public var deflate: WebSocketDeflateOptions? {
        get { box.values.deflate }
        set { change { $0.deflate = newValue } }
    }
    /// The clock the deadlines and intervals above run on (handshake, pong deadline, keep-alive, close
    /// timeout): the system's by default; a test gives a clock it advances by hand (ConnectionTestKit's
    /// `ManualClock`) to reach a deadline without waiting for it.
    @inlinable public var clock: DeadlineClock {
        get { box.values.clock }
        set { change { $0.clock = newValue } }
    }

    public init() { box = Self.defaults }

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
