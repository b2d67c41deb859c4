import ConnectionCore
import Synchronization

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
