import Synchronization

/// The UDP server side every backend shares: one bound socket's datagrams sorted by sender into one
/// ``Connection`` per peer (made on the first datagram from that address and handed out by ``accept()``).
/// A backend feeds datagrams in with ``deliver(_:from:)`` and says how to answer a peer with `send`.
///
/// A datagram that finds its peer's queue (or the accept queue) full is dropped and counted, as the kernel
/// drops a datagram that finds a socket's receive buffer full. Closing a peer forgets it: a later datagram from
/// the same address is a new peer.
public final class DatagramDemultiplexer<Address: Hashable & Sendable>: Sendable {
    /// Sends one datagram to a peer.
    public typealias Send = @Sendable ([UInt8], Address) async throws(ConnectionError) -> Void

    private let accepted = ReceiveQueue<any Connection>(capacity: 1024)
    private let peers = Guarded<[Address: Known]>([:])

    /// A peer and when its last datagram came.
    private struct Known {
        let peer: DatagramPeer<Address>
        var lastHeard: ContinuousClock.Instant
    }
    private let droppedCount = Atomic<Int>(0)
    private let evictedCount = Atomic<Int>(0)
    private let lastSweep = Guarded(ContinuousClock.now)
    let localEndpoint: Endpoint
    let options: ConnectionOptions
    let send: Send
    let endpoint: @Sendable (Address) -> Endpoint
    let executor: (any TaskExecutor)?

    /// - Parameters:
    ///   - localEndpoint: the bound address.
    ///   - options: the listener's options (the peer limit and idle timeout, the receive queue limit).
    ///   - endpoint: a peer address as an endpoint (for ``Connection/remoteEndpoint``).
    ///   - executor: where the peers' operations complete, if on an event loop.
    ///   - send: writes one datagram to a peer.
    public init(
        localEndpoint: Endpoint, options: ConnectionOptions, executor: (any TaskExecutor)? = nil,
        endpoint: @escaping @Sendable (Address) -> Endpoint, send: @escaping Send
    ) {
        self.localEndpoint = localEndpoint
        self.options = options
        self.executor = executor
        self.endpoint = endpoint
        self.send = send
    }

    /// The bound address, for the listener's ``Listener/localEndpoint``.
    public var localEndpointForListener: Endpoint { localEndpoint }

    /// Datagrams dropped because a peer's queue or the accept queue was full.
    public var dropped: Int { droppedCount.load(ordering: .relaxed) }

    /// The peer for `address`, made (and the peer list kept within its bounds) when it is new.
    private func peer(for address: Address) -> (DatagramPeer<Address>, Bool) {
        let now = ContinuousClock.now
        let (peer, isNew, forgotten) = peers.withLock {
            peers -> (DatagramPeer<Address>, Bool, [(DatagramPeer<Address>, ConnectionError)]) in
            if let peer = peers[address]?.peer {
                peers[address]?.lastHeard = now
                return (peer, false, [])
            }
            let forgotten = evict(&peers, now: now)
            let peer = DatagramPeer(demultiplexer: self, address: address)
            peers[address] = Known(peer: peer, lastHeard: now)
            return (peer, true, forgotten)
        }
        for (old, error) in forgotten { old.inbox.close(error) }
        return (peer, isNew)
    }

    /// Called with a new peer coming: forgets the peers quiet for longer than the idle timeout (looked for at
    /// most four times per timeout), then, at the cap, the quietest one.
    private func evict(
        _ peers: inout [Address: Known], now: ContinuousClock.Instant
    ) -> [(DatagramPeer<Address>, ConnectionError)] {
        var forgotten: [(DatagramPeer<Address>, ConnectionError)] = []
        let idle = options.udpPeerIdleTimeout
        if now - lastSweep.withLock({ $0 }) >= idle / 4 || peers.count >= options.maximumUDPPeers {
            lastSweep.withLock { $0 = now }
            for (address, known) in peers where now - known.lastHeard >= idle {
                let peer = known.peer
                peers[address] = nil
                forgotten.append(
                    (peer, ConnectionError(.timedOut, "no datagram from \(peer.remoteEndpoint) for \(idle)")))
            }
        }
        if peers.count >= max(1, options.maximumUDPPeers),
            let (address, known) = peers.min(by: { $0.value.lastHeard < $1.value.lastHeard })
        {
            let quietest = known.peer
            peers[address] = nil
            forgotten.append(
                (
                    quietest,
                    ConnectionError(
                        .resourceExhausted,
                        "the listener keeps at most \(options.maximumUDPPeers) UDP peers; \(quietest.remoteEndpoint) was the quietest"
                    )
                ))
        }
        evictedCount.add(forgotten.count, ordering: .relaxed)
        if let (_, capped) = forgotten.last, capped.kind == .resourceExhausted {
            BoundsLog.note(.udpPeerLimit, capped.detail)
        }
        return forgotten
    }

    /// Peers forgotten for being idle, or quietest at the cap.
    public var evicted: Int { evictedCount.load(ordering: .relaxed) }

    /// Peers kept now.
    public var peerCount: Int { peers.withLock { $0.count } }

    /// One datagram from `address`.
    public func deliver(_ bytes: [UInt8], from address: Address) {
        let (peer, isNew) = peer(for: address)
        if peer.inbox.hasSpace {
            peer.inbox.push(bytes)
        } else {
            droppedCount.add(1, ordering: .relaxed)
        }
        if isNew && !accepted.push(peer).accepted {
            droppedCount.add(1, ordering: .relaxed)
            forget(peer)
        }
    }

    /// A datagram from `address` that could not be delivered (larger than the receive buffer, for example):
    /// that peer's next receive throws `error`.
    public func deliverFailure(_ error: ConnectionError, from address: Address) {
        let (peer, isNew) = peer(for: address)
        peer.inbox.pushFailure(error)
        if isNew && !accepted.push(peer).accepted { forget(peer) }
    }

    /// The socket failed for good: ``accept()`` throws `error` from now on.
    public func fail(_ error: ConnectionError) {
        accepted.finish(.failed(error))
    }

    /// The next new peer. Throws `.closed` after ``close()``.
    public func accept() async throws(ConnectionError) -> any Connection {
        guard let connection = try await accepted.next() else { throw .closed("the listener is closed") }
        return connection
    }

    /// Ends every peer's receive with `.closed` and stops handing out peers.
    public func close() {
        _ = accepted.close(.closed("the listener is closed"))
        let all = peers.withLock { peers in
            defer { peers.removeAll() }
            return peers.values.map(\.peer)
        }
        for peer in all { peer.inbox.close(.closed("the listener is closed")) }
    }

    func forget(_ peer: DatagramPeer<Address>) {
        peers.withLock { peers in
            if peers[peer.address]?.peer === peer { peers[peer.address] = nil }
        }
        peer.inbox.close()
    }
}

/// One peer of a UDP listener: receives the datagrams from its address, sends to it.
final class DatagramPeer<Address: Hashable & Sendable>: Connection, Sendable {
    let transport = Transport.udp
    let address: Address
    let localEndpoint: Endpoint
    let remoteEndpoint: Endpoint
    let options: ConnectionOptions
    let inbox: ReceiveQueue<[UInt8]>
    private let demultiplexer: DatagramDemultiplexer<Address>
    private let life = SharedLifecycle()

    init(demultiplexer: DatagramDemultiplexer<Address>, address: Address) {
        self.demultiplexer = demultiplexer
        self.address = address
        options = demultiplexer.options
        localEndpoint = demultiplexer.localEndpoint
        remoteEndpoint = demultiplexer.endpoint(address)
        inbox = .datagrams(capacity: demultiplexer.options.receiveQueueLimit)
    }

    var preferredExecutor: (any TaskExecutor)? { demultiplexer.executor }

    func send(_ message: Message) async throws(ConnectionError) {
        if inbox.isEnded { throw .closed() }
        if case .refuse(let error) = life.handle(.send) { throw error }
        try await demultiplexer.send(message.bytes, address)
    }

    func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        try await inbox.next().map(Message.init)
    }

    func closeOutput() async throws(ConnectionError) {
        throw ConnectionError(.unsupported, "UDP has no half-close")
    }

    func close() async {
        await life.close { [self] finished in
            demultiplexer.forget(self)
            finished()
        }
    }
}
