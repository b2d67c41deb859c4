import ConnectionCore
import Synchronization

/// Faults a ``Relay`` injects in one direction, in user space (no root, no netem): every figure is applied to
/// what the relay forwards, drawn from a seeded generator so that a run can be repeated.
public struct FaultPlan: Sendable, Hashable {
    /// Added to every message's (or chunk's) trip.
    public var delay: Duration = .zero
    /// A random extra delay from 0 to this, per message.
    public var jitter: Duration = .zero
    /// With jitter: let a message overtake an earlier one (udp, ws). A byte stream (tcp, tls) never reorders.
    public var reorder = false
    /// Probability (0-1) that a message is dropped: udp datagrams and ws messages. A byte stream cannot lose
    /// bytes without breaking, so for tcp and tls it must stay 0 (use ``blackHoleAfterBytes`` for a stall).
    public var loss = 0.0
    /// Probability (0-1) that a udp datagram is sent twice.
    public var duplication = 0.0
    /// Bytes per second at most (`nil`: no cap).
    public var bandwidth: Int? = nil
    /// After this many bytes, reset both the client's connection and the upstream one (a TCP RST each way, see
    /// `Connection.abort()`; `nil`: never).
    public var cutAfterBytes: Int? = nil
    /// After this many bytes, stop forwarding but keep both connections open: the peer sees silence, as behind
    /// a dead router (`nil`: never). What keep-alive is for.
    public var blackHoleAfterBytes: Int? = nil
    /// One message or chunk held back longer than the rest (`nil`: none): what one late or retransmitted
    /// segment does to what follows it. Unless ``reorder`` is on, everything behind it waits too.
    public var hold: Hold? = nil

    /// The message that carries byte ``byte`` (counted from 0 in this direction, over every message's bytes)
    /// waits ``duration`` more; on a byte stream, that byte and the rest of its chunk (the bytes before it go on
    /// time), as one late segment would.
    public struct Hold: Sendable, Hashable {
        public var byte: Int
        public var duration: Duration

        public init(byte: Int, duration: Duration) {
            self.byte = byte
            self.duration = duration
        }
    }

    public init() {}

    /// The defaults, changed by `configure`.
    public static func with(_ configure: (inout FaultPlan) -> Void) -> FaultPlan {
        var plan = FaultPlan()
        configure(&plan)
        return plan
    }

    /// Whether nothing is injected.
    public var isNone: Bool { self == FaultPlan() }

    /// Faults that `transport` cannot carry, as an error.
    func check(for transport: Transport) throws(ConnectionError) {
        guard (0...1).contains(loss), (0...1).contains(duplication) else {
            throw ConnectionError(.unsupported, "loss and duplication are probabilities from 0 to 1")
        }
        if transport.isByteStream && loss > 0 {
            throw ConnectionError(
                .unsupported,
                "a \(transport) byte stream cannot lose bytes without breaking; use a black hole (a stall) instead")
        }
        if transport != .udp && duplication > 0 {
            throw ConnectionError(.unsupported, "duplication applies to udp datagrams only")
        }
        if transport.isByteStream && reorder {
            throw ConnectionError(.unsupported, "a \(transport) byte stream never reorders")
        }
    }
}

/// A proxy in the style of the seeds' CFSocket proxy server: it accepts clients on one endpoint and relays each
/// to an upstream endpoint over a connection of its own, through `Connection` on any backend, injecting the
/// faults of a ``FaultPlan`` in each direction.
///
/// - tcp -> tcp: bytes, with half-close carried (a FIN one way keeps the other way open);
/// - udp -> udp: one upstream association per client address, forgotten after the listener's UDP idle timeout;
/// - tls -> tcp and tcp -> tls (terminating or originating TLS; the upstream certificate is verified unless
///   the configuration says otherwise), ws -> ws (whole messages; close codes carried; each hop answers pings).
///
/// Backpressure holds end to end: each direction forwards through a bounded queue, so a slow reader at either
/// end slows the other end's sender. A client whose upstream cannot be reached is closed (a clean end); a reset
/// on either side (or a failed send) resets the other, so a reset is carried as a reset.
public final class Relay: Sendable {
    /// Where clients connect (the real port when port 0 was asked for).
    public let endpoint: Endpoint
    /// Where each client is relayed to.
    public let upstream: Endpoint
    private let listener: any Listener
    private let acceptor = Guarded<Task<Void, Never>?>(nil)
    private let pairs = Guarded<[UInt64: (any Connection, (any Connection)?)]>([:])
    let counters = Counters()

    /// What the relay has done so far.
    public struct Statistics: Sendable, Hashable, Codable {
        public var clients = 0
        public var upstreamFailures = 0
        public var bytesToUpstream = 0
        public var bytesToClients = 0
        public var dropped = 0
        public var duplicated = 0
        /// Messages or chunks held back by ``FaultPlan/hold``.
        public var held = 0
    }

    final class Counters: Sendable {
        let statistics = Guarded(Statistics())
        func update(_ change: (inout Statistics) -> Void) { statistics.withLock { change(&$0) } }
    }

    /// What the relay has done so far.
    public var statistics: Statistics { counters.statistics.withLock { $0 } }

    /// Starts relaying `listen` to `upstream` with `backend` on both sides.
    public static func start(
        listen: Endpoint, upstream: Endpoint, backend: Backend, options: ConnectionOptions = ConnectionOptions(),
        serverTLS: TLSConfiguration? = nil, upstreamTLS: TLSConfiguration = TLSConfiguration(),
        toUpstream: FaultPlan = FaultPlan(), toClient: FaultPlan = FaultPlan(), seed: UInt64 = 1
    ) async throws(ConnectionError) -> Relay {
        try await start(
            listen: listen, upstream: upstream, backend: backend.implementation, options: options,
            serverTLS: serverTLS, upstreamTLS: upstreamTLS, toUpstream: toUpstream, toClient: toClient, seed: seed)
    }

    /// Starts relaying with any `ConnectionBackend` (a user's own included) on both sides, through
    /// ``TransportStack``: tls, ws and wss over its tcp.
    public static func start(
        listen: Endpoint, upstream: Endpoint, backend: any ConnectionBackend,
        options: ConnectionOptions = ConnectionOptions(), serverTLS: TLSConfiguration? = nil,
        upstreamTLS: TLSConfiguration = TLSConfiguration(), toUpstream: FaultPlan = FaultPlan(),
        toClient: FaultPlan = FaultPlan(), seed: UInt64 = 1
    ) async throws(ConnectionError) -> Relay {
        let stack = TransportStack(over: backend)
        guard listen.transport.isByteStream == upstream.transport.isByteStream,
            (listen.transport == .udp) == (upstream.transport == .udp)
        else {
            throw ConnectionError(
                .unsupported,
                "relaying \(listen.transport) to \(upstream.transport) would change the kind of transport (byte stream, datagrams, messages)"
            )
        }
        try toUpstream.check(for: listen.transport)
        try toClient.check(for: listen.transport)
        let listener = try await stack.listen(on: listen, options: options, tls: serverTLS)
        let relay = Relay(listener: listener, upstream: upstream)
        let task = Task {
            await withDiscardingTaskGroup { group in
                var nextID: UInt64 = 0
                while let client = try? await listener.accept() {
                    nextID += 1
                    let id = nextID
                    relay.pairs.withLock { $0[id] = (client, nil) }
                    relay.counters.update { $0.clients += 1 }
                    group.addTask {
                        await relay.serve(
                            client, id: id, stack: stack, options: options, tls: upstreamTLS,
                            plans: (toUpstream, toClient), seed: seed &+ id)
                    }
                }
            }
        }
        relay.acceptor.withLock { $0 = task }
        return relay
    }

    private init(listener: any Listener, upstream: Endpoint) {
        self.listener = listener
        self.endpoint = listener.localEndpoint
        self.upstream = upstream
    }

    private func serve(
        _ client: any Connection, id: UInt64, stack: TransportStack, options: ConnectionOptions,
        tls: TLSConfiguration,
        plans: (toUpstream: FaultPlan, toClient: FaultPlan), seed: UInt64
    ) async {
        defer { pairs.withLock { _ = $0.removeValue(forKey: id) } }
        let server: any Connection
        do throws(ConnectionError) {
            server = try await stack.connect(to: upstream, options: options, tls: tls)
        } catch {
            counters.update { $0.upstreamFailures += 1 }
            await client.close()
            return
        }
        let known = pairs.withLock { pairs in
            guard pairs[id] != nil else { return false }
            pairs[id] = (client, server)
            return true
        }
        guard known else {  // stopped meanwhile
            await server.close()
            await client.close()
            return
        }
        // A reset on either side, a failed send or an injected cut: both sides are reset, as a TCP proxy that
        // loses one side must tell the other that bytes may have been lost (an end of stream would claim that
        // everything arrived).
        let cut = OnceFlag()
        let cutBoth: @Sendable () async -> Void = {
            guard cut.claim() else { return }
            await client.abort()
            await server.abort()
        }
        await withDiscardingTaskGroup { group in
            group.addTask {
                await Self.forward(
                    from: client, to: server, plan: plans.toUpstream, seed: seed, counters: self.counters,
                    upstreamBound: true, cut: cutBoth)
            }
            group.addTask {
                await Self.forward(
                    from: server, to: client, plan: plans.toClient, seed: seed &* 31, counters: self.counters,
                    upstreamBound: false, cut: cutBoth)
            }
        }
        await client.close()
        await server.close()
    }

    /// One direction: receive, apply the plan, send, through a bounded queue so that a delay does not stop the
    /// flow (messages in flight overlap) and a slow reader slows the sender.
    private static func forward(
        from source: any Connection, to sink: any Connection, plan: FaultPlan, seed: UInt64, counters: Counters,
        upstreamBound: Bool, cut: @escaping @Sendable () async -> Void
    ) async {
        let line = FaultLine(plan: plan, seed: seed, capacity: 256)
        await withDiscardingTaskGroup { group in
            group.addTask {
                // However this side ends, the receiving side must not wait for room that nobody will make.
                defer { line.abandon() }
                var forwarded = 0
                while true {
                    guard let item = await line.next() else { break }
                    guard case .message(let message) = item else {
                        // The source ended: carry the end across.
                        if source.transport.isByteStream {
                            try? await sink.closeOutput()
                        } else if let webSocket = source as? WebSocketConnection,
                            let target = sink as? WebSocketConnection,
                            let code = webSocket.peerCloseCode
                        {
                            await target.close(code: code, reason: webSocket.peerCloseReason ?? "")
                        } else {
                            await sink.close()
                        }
                        return
                    }
                    if let limit = plan.blackHoleAfterBytes, forwarded >= limit { continue }
                    var outgoing = message
                    if let limit = plan.cutAfterBytes, source.transport.isByteStream,
                        forwarded + message.bytes.count > limit
                    {
                        // A byte stream is cut at the byte asked for; a message (udp, ws) cannot be split and goes
                        // whole before the cut.
                        outgoing = Message(
                            kind: message.kind, bytes: Array(message.bytes.prefix(max(0, limit - forwarded))))
                    }
                    // Counted before the send, so that whoever receives these bytes finds them in the statistics
                    // (the deadpeer lesson sizes its black hole from them); a failed send ends the pair anyway.
                    forwarded += outgoing.bytes.count
                    counters.update {
                        if upstreamBound {
                            $0.bytesToUpstream += outgoing.bytes.count
                        } else {
                            $0.bytesToClients += outgoing.bytes.count
                        }
                    }
                    do throws(ConnectionError) {
                        try await sink.send(outgoing)
                    } catch {
                        await cut()
                        return
                    }
                    if let limit = plan.cutAfterBytes, forwarded >= limit {
                        await cut()
                        return
                    }
                    if let bandwidth = plan.bandwidth, bandwidth > 0 {
                        try? await Task.sleep(
                            for: .nanoseconds(Int64(outgoing.bytes.count) * 1_000_000_000 / Int64(bandwidth)))
                    }
                }
            }
            while true {
                let message: Message?
                do throws(ConnectionError) {
                    message = try await source.receive()
                } catch {
                    // A reset (or any failure) is carried as a reset before the line can carry a clean end.
                    if error.kind != .closed { await cut() }
                    await line.finish()
                    return
                }
                guard let message else {
                    await line.finish()
                    return
                }
                switch line.admit(message, byteStream: source.transport.isByteStream) {
                case .dropped: counters.update { $0.dropped += 1 }
                case .duplicated: counters.update { $0.duplicated += 1 }
                case .held: counters.update { $0.held += 1 }
                case .queued: break
                }
                await line.waitForSpace()
            }
        }
    }

    /// Stops accepting and closes every relayed pair.
    public func stop() async {
        await listener.close()
        let open = pairs.withLock { pairs in
            defer { pairs.removeAll() }
            return Array(pairs.values)
        }
        for (client, server) in open {
            await client.close()
            await server?.close()
        }
        await acceptor.withLock { $0 }?.value
    }
}

/// One direction's queue of a ``Relay``: messages with the time each may leave (delay plus jitter), dropped or
/// duplicated as the plan says, in order unless the plan lets them reorder; bounded, so the receiving side waits
/// when it is full.
final class FaultLine: Sendable {
    enum Item: Sendable {
        case message(Message)
        case end
    }

    enum Admission { case queued, dropped, duplicated, held }

    private struct Entry {
        var due: ContinuousClock.Instant
        var order: UInt64
        var item: Item
    }

    private struct State {
        var entries: [Entry] = []
        var order: UInt64 = 0
        var bytes = 0
        var lastDue: ContinuousClock.Instant?
        var ended = false
        var abandoned = false
        var random: SplitMix64
        var reader: CheckedContinuation<Void, Never>?
        var writer: CheckedContinuation<Void, Never>?
    }

    private let plan: FaultPlan
    private let capacity: Int
    private let state: Guarded<State>

    init(plan: FaultPlan, seed: UInt64, capacity: Int) {
        self.plan = plan
        self.capacity = capacity
        state = Guarded(State(random: SplitMix64(seed: seed)))
    }

    /// Queues a received message (or not: loss), at its due time. A chunk of a byte stream (`byteStream`) that
    /// carries the held byte is split there: the bytes before it go on time, the rest is held.
    func admit(_ message: Message, byteStream: Bool = false) -> Admission {
        let (admission, reader) = state.withLock { state -> (Admission, CheckedContinuation<Void, Never>?) in
            let first = state.bytes
            state.bytes += message.bytes.count
            if plan.loss > 0, state.random.unit() < plan.loss { return (.dropped, nil) }
            let copies = plan.duplication > 0 && state.random.unit() < plan.duplication ? 2 : 1
            var extra = Duration.zero
            if let hold = plan.hold, (first..<state.bytes).contains(hold.byte) {
                extra = hold.duration
                if byteStream && hold.byte > first {
                    let split = hold.byte - first
                    enqueue(.message(Message(kind: message.kind, bytes: Array(message.bytes[..<split]))), &state)
                    enqueue(
                        .message(Message(kind: message.kind, bytes: Array(message.bytes[split...]))), &state,
                        extra: extra)
                    defer { state.reader = nil }
                    return (.held, state.reader)
                }
            }
            for _ in 0..<copies { enqueue(.message(message), &state, extra: extra) }
            defer { state.reader = nil }
            return (extra > .zero ? .held : copies == 2 ? .duplicated : .queued, state.reader)
        }
        reader?.resume()
        return admission
    }

    private func enqueue(_ item: Item, _ state: inout State, extra: Duration = .zero) {
        var due = ContinuousClock.now + plan.delay + extra
        if plan.jitter > .zero {
            due += .nanoseconds(Int64(state.random.unit() * Double(plan.jitter.wholeNanoseconds)))
        }
        if !plan.reorder, let last = state.lastDue, due < last { due = last }
        state.lastDue = due
        state.order += 1
        state.entries.append(Entry(due: due, order: state.order, item: item))
    }

    /// The source ended: after everything queued, ``next()`` returns `.end`.
    func finish() async {
        let reader = state.withLock { state -> CheckedContinuation<Void, Never>? in
            enqueue(.end, &state)
            state.ended = true
            defer { state.reader = nil }
            return state.reader
        }
        reader?.resume()
    }

    /// The sending side stopped (the sink failed, was cut or the end was carried): nothing will be taken any more,
    /// so a receiving side waiting for room goes on (and finds its source closed).
    func abandon() {
        let writer = state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.abandoned = true
            defer { state.writer = nil }
            return state.writer
        }
        writer?.resume()
    }

    /// Waits while the queue is full (not once the sending side has stopped).
    func waitForSpace() async {
        await withCheckedContinuation { continuation in
            let now = state.withLock { state -> Bool in
                if state.entries.count < capacity || state.abandoned { return true }
                state.writer = continuation
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Waits `duration`, or less when ``admit(_:)`` or ``finish()`` queues something meanwhile (with reordering, a
    /// new item can be due before the one waited for; a plain sleep held it back until then). A wake-up for an
    /// item that is not due yet only makes ``next()`` look again.
    private func sleep(for duration: Duration) async {
        let deadline = ContinuousClock.now + duration
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let parked = state.withLock { state -> Bool in
                // Something may have come between the look and here.
                if state.entries.contains(where: { $0.due < deadline }) { return false }
                state.reader = continuation
                return true
            }
            guard parked else { return continuation.resume() }
            Task { [self] in
                try? await Task.sleep(until: deadline)
                state.withLock { state -> CheckedContinuation<Void, Never>? in
                    defer { state.reader = nil }
                    return state.reader
                }?.resume()
            }
        }
    }

    /// The next item once due (the earliest due first), or `nil` after the end.
    func next() async -> Item? {
        while true {
            let (ready, wait, writer) = state.withLock {
                state -> (Item?, Duration?, CheckedContinuation<Void, Never>?) in
                guard
                    let index = state.entries.indices.min(by: {
                        (state.entries[$0].due, state.entries[$0].order) < (
                            state.entries[$1].due, state.entries[$1].order
                        )
                    })
                else { return (nil, nil, nil) }
                let entry = state.entries[index]
                let now = ContinuousClock.now
                if entry.due > now { return (nil, entry.due - now, nil) }
                state.entries.remove(at: index)
                defer { state.writer = nil }
                return (entry.item, nil, state.writer)
            }
            writer?.resume()
            if let ready { return ready }
            if let wait {
                await sleep(for: wait)
                continue
            }
            // Empty: wait for an item.
            await withCheckedContinuation { continuation in
                let now = state.withLock { state -> Bool in
                    if !state.entries.isEmpty { return true }
                    state.reader = continuation
                    return false
                }
                if now { continuation.resume() }
            }
        }
    }
}
