import ConnectionCore
import Glibc
import Synchronization

/// UDP on the ``MemoryBackend``: a client end is a port in the backend's UDP table with its own receive queue;
/// a listener sorts what clients send by their address into one peer each (the ``DatagramDemultiplexer`` every
/// backend uses). As on a kernel: a send never waits (a datagram that finds the receiver's queue full is
/// dropped), a datagram is at most 65,507 bytes, and one sent where nobody listens comes back as `.refused` on the
/// sender's next receive (an ICMP port unreachable), later receives going on.
final class MemoryUDPClient: Connection, Sendable {
    /// The largest UDP payload over IPv4: 65,535 - 8 (UDP header) - 20 (IP header).
    static let largestDatagram = 65_507

    let transport = Transport.udp
    let localEndpoint: Endpoint
    let remoteEndpoint: Endpoint
    let options: ConnectionOptions
    let inbox: ReceiveQueue<[UInt8]>
    private let network: MemoryUDPNetwork
    private let closed = Atomic(false)

    init(local: Endpoint, remote: Endpoint, options: ConnectionOptions, network: MemoryUDPNetwork) {
        localEndpoint = local
        remoteEndpoint = remote
        self.options = options
        self.network = network
        inbox = .datagrams(capacity: options.receiveQueueLimit)
    }

    func send(_ message: Message) async throws(ConnectionError) {
        if closed.load(ordering: .acquiring) { throw .closed() }
        try MemoryUDPClient.checkSize(message.bytes.count)
        guard let listener = network.listener(at: remoteEndpoint) else {
            // The kernel's answer comes later: the next receive reports it.
            inbox.pushFailure(
                ConnectionError(
                    .refused, "\(remoteEndpoint): nothing listens on memory udp port \(remoteEndpoint.port)",
                    systemCode: ConnectionError.SystemCode(domain: "errno", code: ECONNREFUSED, name: "ECONNREFUSED")
                ))
            return
        }
        listener.peers.deliver(message.bytes, from: localEndpoint)
    }

    static func checkSize(_ count: Int) throws(ConnectionError) {
        guard count <= largestDatagram else {
            throw ConnectionError(
                .messageTooLarge, "a UDP datagram carries at most \(largestDatagram) bytes, not \(count)",
                systemCode: ConnectionError.SystemCode(domain: "errno", code: EMSGSIZE, name: "EMSGSIZE"))
        }
    }

    /// A datagram from a listener's peer.
    func deliver(_ bytes: [UInt8]) {
        if inbox.hasSpace { inbox.push(bytes) }  // else dropped, as a full socket buffer drops it
    }

    func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        if closed.load(ordering: .acquiring) { throw .closed() }
        return try await inbox.next().map(Message.init)
    }

    func closeOutput() async throws(ConnectionError) {
        throw ConnectionError(.unsupported, "UDP has no half-close")
    }

    func close() async {
        guard !closed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        network.remove(client: localEndpoint.port)
        inbox.close()
    }
}

/// A ``MemoryBackend`` UDP listener.
final class MemoryUDPListener: Listener {
    let transport = Transport.udp
    let localEndpoint: Endpoint
    let peers: DatagramDemultiplexer<Endpoint>
    private let onClose: @Sendable () -> Void

    init(
        endpoint: Endpoint, options: ConnectionOptions, network: MemoryUDPNetwork,
        onClose: @escaping @Sendable () -> Void
    ) {
        localEndpoint = endpoint
        self.onClose = onClose
        peers = DatagramDemultiplexer(
            localEndpoint: endpoint, options: options, endpoint: { $0 },
            send: { bytes, address throws(ConnectionError) in
                try MemoryUDPClient.checkSize(bytes.count)
                network.client(at: address.port)?.deliver(bytes)  // nobody there: lost, as over a network
            })
    }

    func accept() async throws(ConnectionError) -> any Connection {
        try await peers.accept()
    }

    func close() async {
        onClose()
        peers.close()
    }
}

/// The UDP half of a ``MemoryBackend``'s table: listeners by port, clients by their port.
final class MemoryUDPNetwork: Sendable {
    private struct Table {
        var listeners: [UInt16: MemoryUDPListener] = [:]
        var clients: [UInt16: MemoryUDPClient] = [:]
    }
    private let table = Guarded(Table())

    /// The listener a datagram to `endpoint` reaches, if any.
    func listener(at endpoint: Endpoint) -> MemoryUDPListener? {
        table.withLock { $0.listeners[endpoint.port] }.flatMap {
            MemoryListener.serves($0.localEndpoint.host, endpoint.host) ? $0 : nil
        }
    }

    func client(at port: UInt16) -> MemoryUDPClient? {
        table.withLock { $0.clients[port] }
    }

    func add(client: MemoryUDPClient) {
        table.withLock { $0.clients[client.localEndpoint.port] = client }
    }

    func remove(client port: UInt16) {
        _ = table.withLock { $0.clients.removeValue(forKey: port) }
    }

    /// Binds a listener on `port` (taken: `.addressInUse`).
    func bind(
        _ endpoint: Endpoint, options: ConnectionOptions
    ) throws(ConnectionError) -> MemoryUDPListener {
        try table.withLock { (table) throws(ConnectionError) -> MemoryUDPListener in
            guard table.listeners[endpoint.port] == nil else {
                throw ConnectionError(
                    .addressInUse, "listen on \(endpoint): memory udp port \(endpoint.port) is taken",
                    systemCode: ConnectionError.SystemCode(domain: "errno", code: EADDRINUSE, name: "EADDRINUSE"))
            }
            let port = endpoint.port
            let listener = MemoryUDPListener(
                endpoint: endpoint, options: options, network: self,
                onClose: { [weak self] in self?.table.withLock { _ = $0.listeners.removeValue(forKey: port) } })
            table.listeners[port] = listener
            return listener
        }
    }

    /// Whether a listener holds `port`.
    func isBound(_ port: UInt16) -> Bool {
        table.withLock { $0.listeners[port] != nil }
    }
}
