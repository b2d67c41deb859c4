public import ConnectionCore
import Synchronization

/// Two connected ends that never touch the kernel: what one end sends, the other receives, in order, through
/// the same bounded receive queues the backends use. The test owns the wire between them: it can hold what is
/// sent and let it go later (``MemoryWire/hold(toward:)``, ``MemoryWire/release(toward:)``), drop what it holds,
/// or reset it (``MemoryWire/reset()``). How a byte stream's receives split and join the bytes is the
/// receiver's `maximumLength` and the queue's, as on a socket. Protocol code above `Connection` (TLS, WebSocket, the
/// relay) is tested on it without a socket, as SwiftNIO's `EmbeddedChannel` lets a pipeline be tested without a
/// kernel.
///
/// Byte streams (`.tcp`): sends are joined on the way, as TCP's may be; `closeOutput()` is a FIN that
/// follows the bytes before it; `close()` ends the peer's stream after what was sent; `abort()` and `reset()`
/// are a reset (`.reset` on the peer). Datagrams (`.udp`): each send arrives whole or, held and dropped, not at
/// all. A sender waits while the peer's queue is full (`ConnectionOptions.receiveQueueLimit`), as over TCP.
public final class MemoryConnection: Connection, Sendable {
    /// Which way the bytes go, for the wire's controls.
    public enum Direction: Sendable { case toFirst, toSecond }

    public let transport: Transport
    public let localEndpoint: Endpoint
    public let remoteEndpoint: Endpoint
    public let options: ConnectionOptions
    private let wire: Wire
    private let side: Int

    /// A connected pair: `first` is the client's end, `second` the server's.
    /// `client` and `server` are the ends' addresses (by default `memory-client:1` and `memory-server:2`).
    public static func pair(
        transport: Transport = .tcp, options: ConnectionOptions = ConnectionOptions(), client: Endpoint? = nil,
        server: Endpoint? = nil
    ) -> (first: MemoryConnection, second: MemoryConnection, wire: MemoryWire) {
        let wire = Wire(datagrams: transport == .udp, capacity: options.receiveQueueLimit)
        let client = client ?? Endpoint(transport: transport, host: .name("memory-client"), port: 1)
        let server = server ?? Endpoint(transport: transport, host: .name("memory-server"), port: 2)
        return (
            MemoryConnection(transport, local: client, remote: server, options, wire, side: 0),
            MemoryConnection(transport, local: server, remote: client, options, wire, side: 1),
            MemoryWire(wire)
        )
    }

    private init(
        _ transport: Transport, local: Endpoint, remote: Endpoint, _ options: ConnectionOptions, _ wire: Wire,
        side: Int
    ) {
        self.transport = transport
        self.localEndpoint = local
        self.remoteEndpoint = remote
        self.options = options
        self.wire = wire
        self.side = side
    }

    /// The test's hand on the wire this end is on (the same for both ends).
    public var controls: MemoryWire { MemoryWire(wire) }

    /// The direction toward this end's peer.
    public var towardPeer: Direction { side == 0 ? .toSecond : .toFirst }

    public func send(_ message: Message) async throws(ConnectionError) {
        try await wire.send(message.bytes, from: side)
    }

    public func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        try await wire.inboxes[side].next(maximumLength: maximumLength).map { Message($0) }
    }

    public func receive(into buffer: UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Received? {
        try await wire.inboxes[side].next(into: buffer).map { Received(count: $0) }
    }

    public func closeOutput() async throws(ConnectionError) {
        guard transport != .udp else { throw ConnectionError(.unsupported, "UDP has no half-close") }
        try wire.endOutput(of: side)
    }

    public func close() async {
        wire.close(side, reset: false)
    }

    public func abort() async {
        wire.close(side, reset: transport != .udp)
    }
}

/// The test's hand on the wire of a ``MemoryConnection`` pair.
public struct MemoryWire: Sendable {
    fileprivate let wire: Wire
    fileprivate init(_ wire: Wire) { self.wire = wire }

    /// From now on, what is sent toward that end waits on the wire (in order) until ``release(toward:)``.
    public func hold(toward direction: MemoryConnection.Direction) {
        wire.state.withLock { $0.lanes[direction.index].held = true }
    }

    /// Delivers what was held toward that end, and what comes after at once.
    public func release(toward direction: MemoryConnection.Direction) {
        wire.release(direction.index)
    }

    /// Throws away what is held toward that end (datagrams lost on the way; on a byte stream a gap, which only
    /// a test of a protocol's own checks should make). Returns how many sends were dropped.
    @discardableResult
    public func dropHeld(toward direction: MemoryConnection.Direction) -> Int {
        wire.state.withLock { state in
            defer { state.lanes[direction.index].pending.removeAll() }
            return state.lanes[direction.index].pending.count { if case .bytes = $0 { true } else { false } }
        }
    }

    /// A reset in the middle of the wire: both ends fail with `.reset`.
    public func reset() {
        wire.reset()
    }

    /// Senders waiting for room in that end's receive queue.
    public func waitingSenders(toward direction: MemoryConnection.Direction) -> Int {
        wire.rooms.waiters.withLock { $0[direction.index].count }
    }

    /// Sends held toward that end.
    public func heldCount(toward direction: MemoryConnection.Direction) -> Int {
        wire.state.withLock { $0.lanes[direction.index].pending.count }
    }
}

extension MemoryConnection.Direction {
    /// The lane (and the inbox) of the end that receives.
    fileprivate var index: Int { self == .toFirst ? 0 : 1 }
}

/// Both directions of a pair: lane i carries what is sent toward end i, into `inboxes[i]`.
private final class Wire: Sendable {
    enum Item {
        case bytes([UInt8])
        case end
    }

    struct Lane {
        var held = false
        var pending: [Item] = []
        /// The sender toward this lane's end has half-closed or closed: nothing more may be sent.
        var outputEnded = false
        /// This lane's end was closed (its own receives end with `.closed`).
        var receiverClosed = false
    }

    /// Senders waiting for room in inbox i (apart from `state`: the inboxes' room callbacks need them first).
    final class Rooms: Sendable {
        let waiters = Guarded<[[CheckedContinuation<Void, Never>]]>([[], []])

        func resumeAll(_ index: Int) {
            let waiting = waiters.withLock { waiters in
                defer { waiters[index].removeAll() }
                return waiters[index]
            }
            for waiter in waiting { waiter.resume() }
        }
    }

    struct State {
        var lanes = [Lane(), Lane()]
        var wasReset = false
    }

    let inboxes: [ReceiveQueue<[UInt8]>]
    let state = Guarded(State())
    let rooms = Rooms()
    let datagrams: Bool

    init(datagrams: Bool, capacity: Int) {
        self.datagrams = datagrams
        let rooms = rooms
        inboxes = (0..<2).map { index in
            let room: @Sendable () -> Void = { rooms.resumeAll(index) }
            return datagrams
                ? .datagrams(capacity: capacity, onSpaceAvailable: room)
                : .byteStream(capacity: capacity, onSpaceAvailable: room)
        }
    }

    /// Sends from end `side` toward the other: queued on the wire when held, else delivered (and waiting for
    /// room while the receiver's queue is full).
    func send(_ bytes: [UInt8], from side: Int) async throws(ConnectionError) {
        let lane = 1 - side
        let deliverNow: Bool = try state.withLock { (state) throws(ConnectionError) -> Bool in
            if state.wasReset && !state.lanes[side].receiverClosed {
                throw ConnectionError(.reset, "the connection was reset")
            }
            if state.lanes[lane].outputEnded {
                throw state.lanes[side].receiverClosed ? .closed() : .closed("the output was closed (half-close)")
            }
            if state.lanes[lane].receiverClosed { throw ConnectionError(.reset, "the peer closed its end") }
            if state.lanes[lane].held || !state.lanes[lane].pending.isEmpty {
                state.lanes[lane].pending.append(.bytes(bytes))
                return false
            }
            return true
        }
        guard deliverNow else { return }
        try await deliver(bytes, lane: lane)
    }

    private func deliver(_ bytes: [UInt8], lane: Int) async throws(ConnectionError) {
        if bytes.isEmpty && !datagrams { return }  // an empty write carries nothing on a byte stream
        let result = inboxes[lane].push(bytes)
        if !result.accepted { throw ConnectionError(.reset, "the peer closed its end") }
        if !result.hasSpace { await waitForSpace(lane) }
    }

    private func waitForSpace(_ lane: Int) async {
        await withCheckedContinuation { continuation in
            let now = rooms.waiters.withLock { waiters in
                if inboxes[lane].hasSpace || inboxes[lane].isEnded { return true }
                waiters[lane].append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    func release(_ lane: Int) {
        let items = state.withLock { state in
            state.lanes[lane].held = false
            defer { state.lanes[lane].pending.removeAll() }
            return state.lanes[lane].pending
        }
        for item in items {
            switch item {
            case .bytes(let bytes):
                // The test releases what it held, room or not (the queue's limit is the senders' to respect).
                if datagrams || !bytes.isEmpty { _ = inboxes[lane].push(bytes) }
            case .end: inboxes[lane].finish(.finished)
            }
        }
    }

    /// A FIN from `side`: after what it sent.
    func endOutput(of side: Int) throws(ConnectionError) {
        let lane = 1 - side
        let now: Bool = try state.withLock { (state) throws(ConnectionError) -> Bool in
            if state.lanes[side].receiverClosed { throw .closed() }
            guard !state.lanes[lane].outputEnded else { return false }
            state.lanes[lane].outputEnded = true
            if state.lanes[lane].held || !state.lanes[lane].pending.isEmpty {
                state.lanes[lane].pending.append(.end)
                return false
            }
            return true
        }
        if now { inboxes[lane].finish(.finished) }
    }

    /// Both directions fail with `.reset`, what was on the wire lost; the ends stay to be closed.
    func reset() {
        state.withLock { state in
            state.wasReset = true
            for lane in 0..<2 {
                state.lanes[lane].outputEnded = true
                state.lanes[lane].pending.removeAll()
            }
        }
        for lane in 0..<2 {
            inboxes[lane].finish(.failed(ConnectionError(.reset, "the connection was reset")))
            rooms.resumeAll(lane)
        }
    }

    /// Closes end `side`: its receives end with `.closed`; the peer gets the end after what was sent (or, with
    /// `reset`, fails with `.reset` at once, what was on the wire lost).
    func close(_ side: Int, reset: Bool) {
        let lane = 1 - side
        let (first, endPeer) = state.withLock { state -> (Bool, Bool) in
            let first = !state.lanes[side].receiverClosed
            state.lanes[side].receiverClosed = true
            let ended = state.lanes[lane].outputEnded
            state.lanes[lane].outputEnded = true
            if reset { state.lanes[lane].pending.removeAll() }
            let later = !reset && (state.lanes[lane].held || !state.lanes[lane].pending.isEmpty)
            if later && !ended { state.lanes[lane].pending.append(.end) }
            return (first, !later && (!ended || reset))
        }
        guard first || reset else { return }
        _ = inboxes[side].close()
        if endPeer {
            if reset {
                inboxes[lane].finish(.failed(ConnectionError(.reset, "the connection was reset")))
            } else {
                inboxes[lane].finish(.finished)
            }
        }
        rooms.resumeAll(lane)
        rooms.resumeAll(side)
    }
}
