public import Synchronization

/// The UDP server side every backend shares: one bound socket's datagrams sorted by sender into one
/// ``Connection`` per peer (made on the first datagram from that address and handed out by ``accept()``).
/// A backend feeds datagrams in with ``deliver(_:from:)`` and says how to answer a peer with `send`.
///
/// A datagram that finds its peer's queue (or the accept queue) full is dropped and counted, as the kernel
/// drops a datagram that finds a socket's receive buffer full. Closing a peer forgets it: a later datagram from
/// the same address is a new peer.
///
/// The per-datagram path (``deliver(_:from:)``) is `@inlinable`, so each backend's module compiles it for its own
/// address type: unspecialised, every datagram looked up the metadata of `[Address: Known]` and its tuples in the
/// Swift runtime's caches (about 5% of a bsd UDP echo server's CPU under perf, session 25).
public final class DatagramDemultiplexer<Address: Hashable & Sendable>: Sendable {
    /// Sends one datagram to a peer.
    public typealias Send = @Sendable ([UInt8], Address) async throws(ConnectionError) -> Void
    /// Sends one datagram to a peer when that takes no waiting (`false`: `Send` it). A peer's echo then costs no
    /// `async` call below its own `send`: each one allocates a frame from the task's allocator and frees it, the
    /// largest item of a UDP echo server's user time under perf (session 42).
    public typealias SendNow = @Sendable ([UInt8], Address) throws(ConnectionError) -> Bool

    @usableFromInline let accepted = ReceiveQueue<any Connection>(capacity: 1024)
    @usableFromInline let peers = Guarded<[Address: Known]>([:])

    /// A peer and when its last datagram came.
    @usableFromInline
    struct Known {
        @usableFromInline let peer: DatagramPeer
        @usableFromInline var lastHeard: ContinuousClock.Instant

        @inlinable
        init(peer: DatagramPeer, lastHeard: ContinuousClock.Instant) {
            self.peer = peer
            self.lastHeard = lastHeard
        }
    }
    @usableFromInline let droppedCount: Atomic<Int> = Atomic(0)
    private let evictedCount = Atomic<Int>(0)
    private let lastSweep = Guarded(ContinuousClock.now)
    let localEndpoint: Endpoint
    let options: ConnectionOptions
    @usableFromInline let send: Send
    @usableFromInline let sendNow: SendNow?
    let endpoint: @Sendable (Address) -> Endpoint
    let executor: (any TaskExecutor)?

    /// - Parameters:
    ///   - localEndpoint: the bound address.
    ///   - options: the listener's options (the peer limit and idle timeout, the receive queue limit).
    ///   - endpoint: a peer address as an endpoint (for ``Connection/remoteEndpoint``).
    ///   - executor: where the peers' operations complete, if on an event loop.
    ///   - sendNow: writes one datagram to a peer if that takes no waiting (optional).
    ///   - send: writes one datagram to a peer.
    public init(
        localEndpoint: Endpoint, options: ConnectionOptions, executor: (any TaskExecutor)? = nil,
        endpoint: @escaping @Sendable (Address) -> Endpoint, sendNow: SendNow? = nil, send: @escaping Send
    ) {
        self.localEndpoint = localEndpoint
        self.options = options
        self.executor = executor
        self.endpoint = endpoint
        self.sendNow = sendNow
        self.send = send
    }

    /// The bound address, for the listener's ``Listener/localEndpoint``.
    public var localEndpointForListener: Endpoint { localEndpoint }

    /// Datagrams dropped because a peer's queue or the accept queue was full.
    public var dropped: Int { droppedCount.load(ordering: .relaxed) }

    /// The peer for `address`, made (and the peer list kept within its bounds) when it is new.
    @inlinable
    func peer(for address: Address) -> (DatagramPeer, Bool) {
        let now = ContinuousClock.now
        let known = peers.withLock { peers -> DatagramPeer? in
            guard let index = peers.index(forKey: address) else { return nil }
            peers.values[index].lastHeard = now
            return peers.values[index].peer
        }
        if let known { return (known, false) }
        return newPeer(for: address, now: now)
    }

    /// A peer for an address not heard from (or forgotten): made once per peer, so not inlined.
    @usableFromInline
    func newPeer(for address: Address, now: ContinuousClock.Instant) -> (DatagramPeer, Bool) {
        let (peer, isNew, forgotten) = peers.withLock {
            peers -> (DatagramPeer, Bool, [(DatagramPeer, ConnectionError)]) in
            if let peer = peers[address]?.peer {  // made by another thread since the look above
                peers[address]?.lastHeard = now
                return (peer, false, [])
            }
            let forgotten = evict(&peers, now: now)
            let peer = DatagramPeer(
                options: options, localEndpoint: localEndpoint, remoteEndpoint: endpoint(address),
                executor: executor,
                sendNow: Self.bind(sendNow, to: address),
                send: { [send] bytes throws(ConnectionError) in try await send(bytes, address) },
                forget: { [self] peer in forget(peer, at: address) })
            peers[address] = Known(peer: peer, lastHeard: now)
            return (peer, true, forgotten)
        }
        for (old, error) in forgotten { old.inbox.close(error) }
        return (peer, isNew)
    }

    /// `sendNow` for one peer's address.
    @usableFromInline
    static func bind(
        _ sendNow: SendNow?, to address: Address
    ) -> (@Sendable ([UInt8]) throws(ConnectionError) -> Bool)? {
        guard let sendNow else { return nil }
        return { bytes throws(ConnectionError) in try sendNow(bytes, address) }
    }

    /// Called with a new peer coming: forgets the peers quiet for longer than the idle timeout (looked for at
    /// most four times per timeout), then, at the cap, the quietest one.
    private func evict(
        _ peers: inout [Address: Known], now: ContinuousClock.Instant
    ) -> [(DatagramPeer, ConnectionError)] {
        var forgotten: [(DatagramPeer, ConnectionError)] = []
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
    @inlinable
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

    @usableFromInline
    func forget(_ peer: DatagramPeer) {
        peer.forget(peer)
    }

    func forget(_ peer: DatagramPeer, at address: Address) {
        peers.withLock { peers in
            if peers[address]?.peer === peer { peers[address] = nil }
        }
        peer.inbox.close()
    }
}

/// One peer of a UDP listener: receives the datagrams from its address, sends to it. Not generic over the
/// address (the two closures hold it), so its `Connection` methods run specialised code whatever the backend.
@usableFromInline
final class DatagramPeer: Connection, Sendable {
    @usableFromInline let transport = Transport.udp
    @usableFromInline let localEndpoint: Endpoint
    @usableFromInline let remoteEndpoint: Endpoint
    @usableFromInline let options: ConnectionOptions
    @usableFromInline let inbox: ReceiveQueue<[UInt8]>
    @usableFromInline let preferredExecutor: (any TaskExecutor)?
    private let sendDatagram: @Sendable ([UInt8]) async throws(ConnectionError) -> Void
    private let sendDatagramNow: (@Sendable ([UInt8]) throws(ConnectionError) -> Bool)?
    /// Removes this peer from its demultiplexer (if still there) and ends its receives.
    let forget: @Sendable (DatagramPeer) -> Void
    private let life = SharedLifecycle()

    init(
        options: ConnectionOptions, localEndpoint: Endpoint, remoteEndpoint: Endpoint, executor: (any TaskExecutor)?,
        sendNow: (@Sendable ([UInt8]) throws(ConnectionError) -> Bool)?,
        send: @escaping @Sendable ([UInt8]) async throws(ConnectionError) -> Void,
        forget: @escaping @Sendable (DatagramPeer) -> Void
    ) {
        self.options = options
        self.localEndpoint = localEndpoint
        self.remoteEndpoint = remoteEndpoint
        self.preferredExecutor = executor
        self.sendDatagramNow = sendNow
        self.sendDatagram = send
        self.forget = forget
        inbox = .datagrams(capacity: options.receiveQueueLimit)
    }

    @usableFromInline func send(_ message: Message) async throws(ConnectionError) {
        if inbox.isEnded { throw .closed() }
        if case .refuse(let error) = life.handle(.send) { throw error }
        if let sendDatagramNow, try sendDatagramNow(message.bytes) { return }
        try await sendDatagram(message.bytes)
    }

    @usableFromInline func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        try await inbox.next().map(Message.init)
    }

    @usableFromInline func closeOutput() async throws(ConnectionError) {
        throw ConnectionError(.unsupported, "UDP has no half-close")
    }

    @usableFromInline func close() async {
        await life.close { [self] finished in
            forget(self)
            finished()
        }
    }
}
