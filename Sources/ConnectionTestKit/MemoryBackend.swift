public import ConnectionCore
import Glibc
import POSIXSupport
import Synchronization

/// A ``ConnectionBackend`` with no kernel underneath: `tcp` connections are ``MemoryConnection`` pairs, `udp`
/// datagrams go between ends in this backend's table (see `MemoryUDPClient`), and a listener is an entry in that
/// table. Ports are this backend's own (port 0 picks the next free one); hosts are IP literals, `localhost` and
/// `HostPins` names, matched against the listener's as a kernel matches addresses. What a kernel does at the
/// edges it does too: a connect to a port nobody listens on is refused (`ECONNREFUSED`), one to a listener whose
/// backlog is full waits up to `connectTimeout`, a UDP datagram to nobody comes back as `.refused` on the next
/// receive. It passes the whole conformance suite (`SOCKETSTYLES_CONFORMANCE_BACKENDS=memory`), registered as
/// ``Backend/memory``.
///
/// Through `TransportStack` it carries `tls`, `ws` and `wss` as any backend does, so the protocol layers above
/// `Connection` (TLS, WebSocket, the relay, reconnection) run on it without a socket, and a test shows what a
/// backend written outside this package gets.
public final class MemoryBackend: ConnectionBackend {
    public let name = "memory"
    public let transports: Set<Transport> = [.tcp, .udp]
    private let table = Guarded(Table())
    private let udp = MemoryUDPNetwork()

    private struct Table {
        var nextPort: UInt16 = 1
        var nextClientPort: UInt16 = 49_152
        var listeners: [UInt16: MemoryListener] = [:]
    }

    public init() {}

    private static func requireCarried(_ endpoint: Endpoint) throws(ConnectionError) {
        guard endpoint.transport == .tcp || endpoint.transport == .udp else {
            throw ConnectionError(.unsupported, "the memory backend carries tcp and udp, not \(endpoint.transport)")
        }
    }

    /// The next client port (49152 and up, as the kernel's ephemeral ports).
    private func clientPort() -> UInt16 {
        table.withLock { table in
            defer { table.nextClientPort = table.nextClientPort == .max ? 49_152 : table.nextClientPort + 1 }
            return table.nextClientPort
        }
    }

    /// The hosts a memory connect or listen may name: IP literals, `localhost` (127.0.0.1 and ::1) and names
    /// pinned with `HostPins`; anything else is not found, as no resolver is asked.
    private static func addresses(of endpoint: Endpoint) throws(ConnectionError) -> [Endpoint.Host] {
        guard case .name(let name) = endpoint.host else { return [endpoint.host] }
        if let pinned = HostPins.addresses(for: name) { return pinned }
        if name.lowercased() == "localhost" { return [.ipv4("127.0.0.1"), .ipv6("::1")] }
        throw ConnectionError(
            .hostNotFound, "resolve \(name): the memory backend knows IP literals, localhost and pinned names only")
    }

    /// Tries the endpoint's addresses in order, as a socket backend's connect does: the first that a listener
    /// serves is connected; a listener whose backlog is full makes the connect wait (up to
    /// `options.connectTimeout`), as a SYN a full backlog drops does.
    public func connect(
        to endpoint: Endpoint, options: ConnectionOptions
    ) async throws(ConnectionError)
        -> any Connection
    {
        try Self.requireCarried(endpoint)
        let hosts = try Self.addresses(of: endpoint)
        if endpoint.transport == .udp {
            // A UDP connect sends nothing: it takes the first address, and a datagram finds out.
            let host = hosts[0]
            let client = MemoryUDPClient(
                local: Endpoint(transport: .udp, host: host, port: clientPort()),
                remote: Endpoint(transport: .udp, host: host, port: endpoint.port), options: options, network: udp)
            udp.add(client: client)
            return client
        }
        let found = table.withLock { table -> (MemoryListener, Endpoint.Host)? in
            guard let listener = table.listeners[endpoint.port] else { return nil }
            return hosts.first(where: listener.serves).map { (listener, $0) }
        }
        guard let (listener, host) = found else {
            throw ConnectionError(
                .refused, "connect to \(endpoint): nothing listens on memory port \(endpoint.port)",
                systemCode: ConnectionError.SystemCode(domain: "errno", code: ECONNREFUSED, name: "ECONNREFUSED"))
        }
        let (client, server, _) = MemoryConnection.pair(
            transport: .tcp, options: options,
            client: Endpoint(transport: .tcp, host: host, port: clientPort()),
            server: Endpoint(transport: .tcp, host: host, port: endpoint.port))
        switch await listener.offer(server, within: options.connectTimeout) {
        case .queued: return client
        case .closed:
            await server.close()
            throw ConnectionError(.refused, "connect to \(endpoint): the memory listener was closed")
        case .timedOut:
            await server.close()
            throw ConnectionError(
                .timedOut, "connect to \(endpoint): not accepted within \(options.connectTimeout) (backlog full)")
        }
    }

    public func listen(
        on endpoint: Endpoint, options: ConnectionOptions
    ) async throws(ConnectionError)
        -> any Listener
    {
        try Self.requireCarried(endpoint)
        guard let host = try Self.addresses(of: endpoint).first else { throw .closed() }
        if endpoint.transport == .udp {
            var port = endpoint.port
            if port == 0 {
                port = table.withLock { table in
                    while udp.isBound(table.nextPort) { table.nextPort &+= 1 }
                    defer { table.nextPort &+= 1 }
                    return table.nextPort
                }
            }
            return try udp.bind(Endpoint(transport: .udp, host: host, port: port), options: options)
        }
        return try table.withLock { (table) throws(ConnectionError) -> MemoryListener in
            var port = endpoint.port
            if port == 0 {
                while table.listeners[table.nextPort] != nil { table.nextPort &+= 1 }
                port = table.nextPort
                table.nextPort &+= 1
            } else if table.listeners[port] != nil {
                throw ConnectionError(
                    .addressInUse, "listen on \(endpoint): memory port \(port) is taken",
                    systemCode: ConnectionError.SystemCode(domain: "errno", code: EADDRINUSE, name: "EADDRINUSE"))
            }
            let bound = port
            let listener = MemoryListener(
                endpoint: Endpoint(transport: .tcp, host: host, port: bound), backlog: Int(options.backlog),
                onClose: { [weak self] in self?.table.withLock { _ = $0.listeners.removeValue(forKey: bound) } })
            table.listeners[port] = listener
            return listener
        }
    }
}

/// A ``MemoryBackend`` listener: connections offered by connects wait in a queue of `backlog + 1` (what Linux
/// keeps for a backlog) for ``accept()``; a connect that finds it full waits for room.
final class MemoryListener: Listener {
    enum Offer { case queued, closed, timedOut }

    let transport = Transport.tcp
    let localEndpoint: Endpoint
    private let queue: ReceiveQueue<any Connection>
    /// Connects waiting for room in the backlog, by id.
    private final class Rooms: Sendable {
        let state = Guarded<(next: Int, waiting: [Int: CheckedContinuation<Bool, Never>])>((0, [:]))

        /// Wakes every waiting connect with `true`.
        func wakeAll() {
            let waiting = state.withLock { rooms in
                defer { rooms.waiting.removeAll() }
                return rooms.waiting.values
            }
            for waiter in waiting { waiter.resume(returning: true) }
        }
    }

    private let rooms = Rooms()
    private let onClose: @Sendable () -> Void

    init(endpoint: Endpoint, backlog: Int, onClose: @escaping @Sendable () -> Void) {
        localEndpoint = endpoint
        self.onClose = onClose
        let rooms = rooms
        queue = ReceiveQueue(
            capacity: max(1, backlog) + 1,
            onSpaceAvailable: { rooms.wakeAll() })
    }

    /// Whether a connect to `host` reaches this listener: the same address, or any address of its family when
    /// it listens on the unspecified one.
    func serves(_ host: Endpoint.Host) -> Bool {
        Self.serves(localEndpoint.host, host)
    }

    /// Whether a listener on `bound` is reached by a connect to `host`.
    static func serves(_ bound: Endpoint.Host, _ host: Endpoint.Host) -> Bool {
        switch (bound, host) {
        case (.ipv4("0.0.0.0"), .ipv4), (.ipv6("::"), .ipv6): true
        default: bound == host
        }
    }

    /// Queues a connection for ``accept()``, waiting up to `limit` while the backlog is full.
    func offer(_ connection: any Connection, within limit: Duration) async -> Offer {
        let deadline = ContinuousClock.now + limit
        while !queue.hasSpace && !queue.isEnded {
            guard await waitForRoom(until: deadline) else { return .timedOut }
        }
        return queue.push(connection).accepted ? .queued : .closed
    }

    /// `true` when room came (or the listener closed) before `deadline`.
    private func waitForRoom(until deadline: ContinuousClock.Instant) async -> Bool {
        let id = rooms.state.withLock { rooms in
            defer { rooms.next += 1 }
            return rooms.next
        }
        return await withTaskGroup(of: Bool?.self) { group in
            group.addTask { [rooms, queue] in
                await withCheckedContinuation { continuation in
                    let now = rooms.state.withLock { rooms in
                        if queue.hasSpace || queue.isEnded { return true }
                        rooms.waiting[id] = continuation
                        return false
                    }
                    if now { continuation.resume(returning: true) }
                }
            }
            group.addTask {
                try? await Task.sleep(until: deadline)
                return nil
            }
            let first = await group.next() ?? nil
            // The timer won: take the waiter back (or, had room just come, let it be resumed), then end.
            rooms.state.withLock { $0.waiting.removeValue(forKey: id) }?.resume(returning: false)
            group.cancelAll()
            return first ?? false
        }
    }

    func accept() async throws(ConnectionError) -> any Connection {
        guard let connection = try await queue.next() else { throw ConnectionError.closed() }
        return connection
    }

    func close() async {
        onClose()
        for connection in queue.close() { await connection.close() }
        rooms.wakeAll()
    }
}

extension Backend {
    /// The in-memory backend as a registration: one ``MemoryBackend`` (one port table) for the process, so a
    /// listener made through it is found by a connect made through it.
    public static let memory = Backend(
        name: "memory", summary: "in-process pairs, no kernel (ConnectionTestKit)",
        style: "the test owns the wire: hold, release, drop, reset", make: { MemoryBackend.shared })
}

extension MemoryBackend {
    /// The instance ``Backend/memory`` hands out.
    public static let shared = MemoryBackend()
}
