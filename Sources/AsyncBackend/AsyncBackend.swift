@_spi(Loop) public import ConnectionCore
import POSIXSupport
import Synchronization

/// Backend `async`: async/await over non-blocking sockets and one epoll reactor thread (``AsyncReactor``). No
/// thread per connection, and no blocking call on Swift's cooperative pool. The native style is
/// ``AsyncSocket`` and ``AsyncListener``.
///
/// Each connection reports the reactor as its `preferredExecutor`: a task that runs on it is resumed by
/// readiness directly on the reactor thread.
public struct AsyncBackend: ConnectionBackend {
    public let name = "async"
    public let transports: Set<Transport> = [.tcp, .udp]
    /// The reactor every socket of this backend registers with.
    public let reactor: AsyncReactor

    /// A backend on the shared reactor, or on `reactor`.
    public init(reactor: AsyncReactor = .shared) {
        Syscall.ignoreSIGPIPE()
        self.reactor = reactor
    }

    public func connect(
        to endpoint: Endpoint, options: ConnectionOptions
    ) async throws(ConnectionError)
        -> any Connection
    {
        try requireTransport(of: endpoint)
        let socket = AsyncSocket(to: endpoint, options: options, reactor: reactor)
        try await socket.start()
        return AsyncConnection(socket: socket)
    }

    public func listen(
        on endpoint: Endpoint, options: ConnectionOptions
    ) async throws(ConnectionError)
        -> any Listener
    {
        try requireTransport(of: endpoint)
        if endpoint.transport == .udp {
            return try await AsyncUDPListener.start(on: endpoint, options: options, reactor: reactor)
        }
        let resolved = try await Syscall.resolveAsync(endpoint, passive: true)[0]
        let listener = try AsyncListener(on: resolved.endpoint(.tcp), options: options, reactor: reactor)
        return SocketBackedListener(listener, accepting: AsyncConnection.self)
    }
}

extension AsyncBackend: HandOffListening {
    /// One listening socket on this backend's reactor, its accepted connections handed to `loops`' reactors in
    /// turn (tcp; udp keeps one socket on this reactor).
    public func listen(
        on endpoint: Endpoint, options: ConnectionOptions, handingOffTo loops: [any ConnectionBackend]
    ) async throws(ConnectionError) -> any Listener {
        let reactors = loops.compactMap { ($0 as? AsyncBackend)?.reactor }
        guard endpoint.transport == .tcp, reactors.count == loops.count else {
            return try await listen(on: endpoint, options: options)
        }
        try requireTransport(of: endpoint)
        let resolved = try await Syscall.resolveAsync(endpoint, passive: true)[0]
        let listener = try AsyncListener(
            on: resolved.endpoint(.tcp), options: options, reactor: reactor, handingOffTo: reactors)
        return SocketBackedListener(listener, accepting: AsyncConnection.self)
    }
}

/// ``AsyncSocket`` as a ``Connection``: the socket and its endpoints; every call goes straight to the socket
/// (`SocketBackedConnection`), so the price of the unified API is one call.
final class AsyncConnection: SocketBackedConnection, Sendable {
    let socket: AsyncSocket
    let localEndpoint: Endpoint
    let remoteEndpoint: Endpoint

    init(socket: AsyncSocket) {
        self.socket = socket
        localEndpoint = socket.localEndpoint ?? socket.endpoint
        remoteEndpoint = socket.remoteEndpoint ?? socket.endpoint
    }
}

@_spi(Loop) extension AsyncSocket: StyleSocket {
    public var resumingExecutor: any TaskExecutor { reactor }
    /// A send tries the non-blocking send(2) on the calling thread first.
    public var sendsFromAnyThread: Bool { true }
}

@_spi(Loop) extension AsyncListener: StyleListener {}

/// The UDP server side: one bound socket, read on the reactor's thread, whose datagrams are sorted by sender into
/// per-peer connections, as every backend does.
final class AsyncUDPListener: Listener, Sendable {
    let transport = Transport.udp
    let localEndpoint: Endpoint
    let options: ConnectionOptions
    let socket: AsyncSocket
    private let peers: DatagramDemultiplexer<SocketAddress>

    static func start(
        on endpoint: Endpoint, options: ConnectionOptions, reactor: AsyncReactor
    )
        async throws(ConnectionError) -> AsyncUDPListener
    {
        let address = try await Syscall.resolveAsync(endpoint, passive: true)[0]
        let (bound, local) = try Socket.listen(on: address, transport: .udp, options: options, describing: endpoint)
        let socket = try AsyncSocket(
            adopting: bound, transport: .udp, local: local.endpoint(.udp), remote: nil, options: options,
            reactor: reactor)
        let listener = AsyncUDPListener(socket: socket, options: options)
        let peers = listener.peers
        // Up to 16 datagrams per recvmmsg(2), sorted by sender where they were read: the peer's waiting task is
        // the one task resumed per datagram.
        socket.receiveOnReactor(into: DatagramBatch(slotSize: options.maxDatagramSize)) { batch in
            peers.deliver(batch)
        }
        return listener
    }

    private init(socket: AsyncSocket, options: ConnectionOptions) {
        self.socket = socket
        self.options = options
        self.localEndpoint = socket.localEndpoint!
        peers = DatagramDemultiplexer(
            localEndpoint: socket.localEndpoint!, options: options, executor: socket.reactor,
            endpoint: { $0.endpoint(.udp) },
            send: { bytes, address throws(ConnectionError) in try await socket.send(bytes, to: address) })
    }

    func accept() async throws(ConnectionError) -> any Connection { try await peers.accept() }

    func close() async {
        peers.close()
        await socket.close()
    }
}

extension Backend {
    /// async/await over non-blocking sockets and one epoll reactor thread (`AsyncBackend`).
    public static let `async` = Backend(
        name: "async",
        summary: "async/await on non-blocking sockets; one epoll reactor thread resumes waiting tasks",
        style: "async/await and AsyncSequences on one reactor thread: Swift's own cancellation",
        tooling: Backend.Tooling(
            module: "AsyncBackend", colour: "#59a14f", autobahn: .wss, autobahnDeflate: [.client],
            allocationsPerRoundTrip: 5
        ),
        newLoop: { () throws(ConnectionError) in AsyncBackend(reactor: try AsyncReactor(name: "async-reactor")) },
        make: { AsyncBackend() })
}
