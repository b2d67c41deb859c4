public import ConnectionCore
import Synchronization

/// A ``ConnectionBackend`` with no kernel underneath: `tcp` connections are ``MemoryConnection`` pairs, and a
/// listener is a name in this backend's table. Ports are this backend's own (port 0 picks the next free one);
/// the host is ignored. A connect to a port nobody listens on is refused, as a closed port is.
///
/// Through `TransportStack` it carries `tls`, `ws` and `wss` as any backend does, so the protocol layers above
/// `Connection` (TLS, WebSocket, the relay, reconnection) run on it without a socket, and a test shows what a
/// backend written outside this package gets.
public final class MemoryBackend: ConnectionBackend {
    public let name = "memory"
    public let transports: Set<Transport> = [.tcp]
    private let table = Guarded(Table())

    private struct Table {
        var nextPort: UInt16 = 1
        var listeners: [UInt16: MemoryListener] = [:]
    }

    public init() {}

    private static func requireTCP(_ endpoint: Endpoint) throws(ConnectionError) {
        guard endpoint.transport == .tcp else {
            throw ConnectionError(.unsupported, "the memory backend carries tcp only, not \(endpoint.transport)")
        }
    }

    public func connect(
        to endpoint: Endpoint, options: ConnectionOptions
    ) async throws(ConnectionError)
        -> any Connection
    {
        try Self.requireTCP(endpoint)
        guard let listener = table.withLock({ $0.listeners[endpoint.port] }) else {
            throw ConnectionError(.refused, "connect to \(endpoint): nothing listens on memory port \(endpoint.port)")
        }
        let (client, server, _) = MemoryConnection.pair(transport: .tcp, options: options)
        guard listener.offer(server) else {
            await server.close()
            throw ConnectionError(.refused, "connect to \(endpoint): the memory listener was closed")
        }
        return client
    }

    public func listen(
        on endpoint: Endpoint, options: ConnectionOptions
    ) async throws(ConnectionError)
        -> any Listener
    {
        try Self.requireTCP(endpoint)
        return try table.withLock { (table) throws(ConnectionError) -> MemoryListener in
            var port = endpoint.port
            if port == 0 {
                while table.listeners[table.nextPort] != nil { table.nextPort &+= 1 }
                port = table.nextPort
                table.nextPort &+= 1
            } else if table.listeners[port] != nil {
                throw ConnectionError(.addressInUse, "listen on \(endpoint): memory port \(port) is taken")
            }
            let bound = port
            let listener = MemoryListener(
                endpoint: Endpoint(transport: .tcp, host: endpoint.host, port: bound),
                onClose: { [weak self] in self?.table.withLock { _ = $0.listeners.removeValue(forKey: bound) } })
            table.listeners[port] = listener
            return listener
        }
    }
}

/// A ``MemoryBackend`` listener: connections offered by connects wait in a bounded queue for ``accept()``.
final class MemoryListener: Listener {
    let transport = Transport.tcp
    let localEndpoint: Endpoint
    private let queue = ReceiveQueue<any Connection>(capacity: 1024)
    private let onClose: @Sendable () -> Void

    init(endpoint: Endpoint, onClose: @escaping @Sendable () -> Void) {
        localEndpoint = endpoint
        self.onClose = onClose
    }

    /// Queues a connection for ``accept()``; `false` once the listener is closed.
    func offer(_ connection: any Connection) -> Bool {
        let result = queue.push(connection)
        return result.accepted
    }

    func accept() async throws(ConnectionError) -> any Connection {
        guard let connection = try await queue.next() else { throw ConnectionError.closed() }
        return connection
    }

    func close() async {
        onClose()
        for connection in queue.close() { await connection.close() }
    }
}
