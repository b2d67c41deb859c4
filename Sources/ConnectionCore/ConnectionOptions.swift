/// Options every backend applies the same way, so that comparisons are fair. Each backend sets every option
/// explicitly instead of relying on its library's default (SwiftNIO, for example, enables TCP_NODELAY by default
/// while raw sockets and libuv do not).
public struct ConnectionOptions: Sendable, Hashable {
    // The values live in one immutable object that every copy shares (SharedValues), so a connection object that
    // keeps the options it was made with holds one reference, not 153 bytes: a server's idle connection keeps two or
    // three copies (its backend's objects and the listener's bookkeeping) for as long as it is open.
    @usableFromInline
    struct Values: Sendable, Hashable {
        @usableFromInline var tcpNoDelay: Bool = true
        @usableFromInline var connectTimeout: Duration = .seconds(10)
        @usableFromInline var receiveBufferSize: Int? = nil
        @usableFromInline var sendBufferSize: Int? = nil
        @usableFromInline var readChunkSize: Int = 64 * 1024
        @usableFromInline var maxDatagramSize: Int = 65_536
        @usableFromInline var receiveQueueLimit: Int = 256 * 1024
        @usableFromInline var backlog: Int32 = 511
        @usableFromInline var reuseAddress: Bool = true
        @usableFromInline var reusePort: Bool = false
        @usableFromInline var acceptBackoff: Duration = .milliseconds(100)
        @usableFromInline var udpPeerIdleTimeout: Duration = .seconds(60)
        @usableFromInline var maximumUDPPeers: Int = 4096
        @usableFromInline var maximumConnections: Int = 16_384
        @usableFromInline var idleTimeout: Duration? = nil
        @inlinable init() {}
    }

    @usableFromInline var box: SharedValues<Values>

    @inlinable
    mutating func change(_ update: (inout Values) -> Void) { box = box.changing(update) }

    @usableFromInline static let defaults = SharedValues(Values())

    /// TCP_NODELAY: send small segments at once instead of waiting (Nagle's algorithm). Default `true`, since
    /// this toolkit measures latency; the `nagle` lesson shows what `false` costs.
    @inlinable public var tcpNoDelay: Bool {
        get { box.values.tcpNoDelay }
        set { change { $0.tcpNoDelay = newValue } }
    }
    /// How long a connect (name resolution plus handshake) may take before failing with `.timedOut`.
    @inlinable public var connectTimeout: Duration {
        get { box.values.connectTimeout }
        set { change { $0.connectTimeout = newValue } }
    }
    /// SO_RCVBUF in bytes, or `nil` for the system default.
    @inlinable public var receiveBufferSize: Int? {
        get { box.values.receiveBufferSize }
        set { change { $0.receiveBufferSize = newValue } }
    }
    /// SO_SNDBUF in bytes, or `nil` for the system default.
    @inlinable public var sendBufferSize: Int? {
        get { box.values.sendBufferSize }
        set { change { $0.sendBufferSize = newValue } }
    }
    /// The most bytes one stream receive returns, and the size of each read from the socket.
    @inlinable public var readChunkSize: Int {
        get { box.values.readChunkSize }
        set { change { $0.readChunkSize = newValue } }
    }
    /// The largest datagram a UDP receive can return; larger datagrams are truncated by the kernel and
    /// reported as `.messageTooLarge`. 65,536 covers every IPv4 datagram (at most 65,507 bytes of payload).
    @inlinable public var maxDatagramSize: Int {
        get { box.values.maxDatagramSize }
        set { change { $0.maxDatagramSize = newValue } }
    }
    /// How many bytes (stream) or datagrams (UDP) a connection reads ahead of its user before it stops reading
    /// and lets the kernel's buffers, then the peer, wait. Bounds memory per connection.
    @inlinable public var receiveQueueLimit: Int {
        get { box.values.receiveQueueLimit }
        set { change { $0.receiveQueueLimit = newValue } }
    }
    /// Listen backlog for TCP listeners.
    @inlinable public var backlog: Int32 {
        get { box.values.backlog }
        set { change { $0.backlog = newValue } }
    }
    /// SO_REUSEADDR on TCP listeners (lets a restarted server bind while old connections are in TIME_WAIT).
    /// Never set on UDP sockets, where Linux would let two sockets share a port.
    @inlinable public var reuseAddress: Bool {
        get { box.values.reuseAddress }
        set { change { $0.reuseAddress = newValue } }
    }
    /// SO_REUSEPORT on listeners (TCP and UDP): several sockets, one per loop, bind the same address and the
    /// kernel spreads new connections (and UDP peers, by their address) over them. What a server on several
    /// threads sets (`Backend.listen(on:options:webSocket:tls:threads:)` sets it for each of its loops).
    @inlinable public var reusePort: Bool {
        get { box.values.reusePort }
        set { change { $0.reusePort = newValue } }
    }
    /// How long a TCP listener that is out of descriptors (EMFILE, ENFILE) waits before it tries to accept
    /// again. Meanwhile new clients wait in the listen backlog and the connections already open go on being
    /// served; without the pause, a level-triggered listener would retry at once and burn a core.
    @inlinable public var acceptBackoff: Duration {
        get { box.values.acceptBackoff }
        set { change { $0.acceptBackoff = newValue } }
    }
    /// A UDP listener forgets a peer that sent nothing for this long: the peer's connection then fails its
    /// receive with `.timedOut`, and a later datagram from that address is a new peer. Without it, every source
    /// address ever seen would keep its state (a connection, a queue, a server task) for good.
    @inlinable public var udpPeerIdleTimeout: Duration {
        get { box.values.udpPeerIdleTimeout }
        set { change { $0.udpPeerIdleTimeout = newValue } }
    }
    /// The most peers a UDP listener keeps at once; a datagram from a new address beyond it makes the listener
    /// forget the peer that has been quiet longest (its receive fails with `.resourceExhausted`).
    @inlinable public var maximumUDPPeers: Int {
        get { box.values.maximumUDPPeers }
        set { change { $0.maximumUDPPeers = newValue } }
    }
    /// The most connections a stream listener (tcp, tls, ws, wss) keeps open at once. A client beyond it is
    /// accepted and closed at once (before any TLS or WebSocket handshake) and the bound is logged
    /// (``BoundsLog``); the connections already open are not disturbed. UDP listeners use ``maximumUDPPeers``.
    @inlinable public var maximumConnections: Int {
        get { box.values.maximumConnections }
        set { change { $0.maximumConnections = newValue } }
    }
    /// A connection accepted by a listener that neither sends nor receives for this long is closed; its pending
    /// receive fails with `.timedOut`. `nil` (the default) never closes an idle connection (`sockbench serve`
    /// uses 300 s). Clients are not affected: they choose when to give up.
    @inlinable public var idleTimeout: Duration? {
        get { box.values.idleTimeout }
        set { change { $0.idleTimeout = newValue } }
    }

    /// The defaults described on each property.
    public init() { box = Self.defaults }

    /// The defaults, changed by `configure`.
    public static func with(_ configure: (inout ConnectionOptions) -> Void) -> ConnectionOptions {
        var options = ConnectionOptions()
        configure(&options)
        return options
    }
}
