/// Options every backend applies the same way, so that comparisons are fair. Each backend sets every option
/// explicitly instead of relying on its library's default (SwiftNIO, for example, enables TCP_NODELAY by default
/// while raw sockets and libuv do not).
public struct ConnectionOptions: Sendable, Hashable {
    /// TCP_NODELAY: send small segments at once instead of waiting (Nagle's algorithm). Default `true`, since
    /// this toolkit measures latency; the `nagle` lesson shows what `false` costs.
    public var tcpNoDelay: Bool = true
    /// How long a connect (name resolution plus handshake) may take before failing with `.timedOut`.
    public var connectTimeout: Duration = .seconds(10)
    /// SO_RCVBUF in bytes, or `nil` for the system default.
    public var receiveBufferSize: Int? = nil
    /// SO_SNDBUF in bytes, or `nil` for the system default.
    public var sendBufferSize: Int? = nil
    /// The most bytes one stream receive returns, and the size of each read from the socket.
    public var readChunkSize: Int = 64 * 1024
    /// The largest datagram a UDP receive can return; larger datagrams are truncated by the kernel and
    /// reported as `.messageTooLarge`. 65,536 covers every IPv4 datagram (at most 65,507 bytes of payload).
    public var maxDatagramSize: Int = 65_536
    /// How many bytes (stream) or datagrams (UDP) a connection reads ahead of its user before it stops reading
    /// and lets the kernel's buffers, then the peer, wait. Bounds memory per connection.
    public var receiveQueueLimit: Int = 256 * 1024
    /// Listen backlog for TCP listeners.
    public var backlog: Int32 = 511
    /// SO_REUSEADDR on TCP listeners (lets a restarted server bind while old connections are in TIME_WAIT).
    /// Never set on UDP sockets, where Linux would let two sockets share a port.
    public var reuseAddress: Bool = true
    /// SO_REUSEPORT on listeners (TCP and UDP): several sockets, one per loop, bind the same address and the
    /// kernel spreads new connections (and UDP peers, by their address) over them. What a server on several
    /// threads sets (`Backend.listen(on:options:webSocket:tls:threads:)` sets it for each of its loops).
    public var reusePort: Bool = false
    /// How long a TCP listener that is out of descriptors (EMFILE, ENFILE) waits before it tries to accept
    /// again. Meanwhile new clients wait in the listen backlog and the connections already open go on being
    /// served; without the pause, a level-triggered listener would retry at once and burn a core.
    public var acceptBackoff: Duration = .milliseconds(100)
    /// A UDP listener forgets a peer that sent nothing for this long: the peer's connection then fails its
    /// receive with `.timedOut`, and a later datagram from that address is a new peer. Without it, every source
    /// address ever seen would keep its state (a connection, a queue, a server task) for good.
    public var udpPeerIdleTimeout: Duration = .seconds(60)
    /// The most peers a UDP listener keeps at once; a datagram from a new address beyond it makes the listener
    /// forget the peer that has been quiet longest (its receive fails with `.resourceExhausted`).
    public var maximumUDPPeers: Int = 4096
    /// The most connections a stream listener (tcp, tls, ws, wss) keeps open at once. A client beyond it is
    /// accepted and closed at once (before any TLS or WebSocket handshake) and the bound is logged
    /// (``BoundsLog``); the connections already open are not disturbed. UDP listeners use ``maximumUDPPeers``.
    public var maximumConnections: Int = 16_384
    /// A connection accepted by a listener that neither sends nor receives for this long is closed; its pending
    /// receive fails with `.timedOut`. `nil` (the default) never closes an idle connection (`sockbench serve`
    /// uses 300 s). Clients are not affected: they choose when to give up.
    public var idleTimeout: Duration? = nil

    /// The defaults described on each property.
    public init() {}

    /// The defaults, changed by `configure`.
    public static func with(_ configure: (inout ConnectionOptions) -> Void) -> ConnectionOptions {
        var options = ConnectionOptions()
        configure(&options)
        return options
    }
}
