import ConnectionTestKit
import Glibc
import POSIXSupport
import SocketStyles
import Testing

/// One backend x transport combination. Every scenario runs for each case that exists; a new backend joins the
/// suite by its registration (`Backend.builtIn`, or `Backend.register(_:)` before the suite is planned), with no
/// change here.
struct ConformanceCase: Sendable, CustomTestStringConvertible {
    let backend: Backend
    let transport: Transport
    /// The loops the server side listens on (`Backend.listen(on:options:webSocket:tls:threads:)`): every socket
    /// backend runs the suite on 1 and on 2.
    var serverThreads = 1

    var testDescription: String {
        serverThreads == 1 ? "\(backend) x \(transport)" : "\(backend) x \(transport), \(serverThreads) server threads"
    }

    /// The loopback address to listen on, port 0.
    var anyPort: Endpoint { try! Endpoint(url: "\(transport)://127.0.0.1:0") }

    /// Every registered backend and the in-memory one, or those named in `SOCKETSTYLES_CONFORMANCE_BACKENDS`
    /// (comma-separated, e.g. `memory,bsd`) to run the suite on some of them.
    static let backends: [Backend] = {
        let every = Backend.allCases + [.memory]
        guard let names = getenv("SOCKETSTYLES_CONFORMANCE_BACKENDS").map({ String(cString: $0) }) else { return every }
        let chosen = Set(names.split(separator: ",").map(String.init))
        return every.filter { chosen.contains($0.name) }
    }()

    /// Every backend x transport, the server on one thread.
    static let all: [ConformanceCase] = backends.flatMap { backend in
        [Transport.tcp, .udp, .ws, .tls, .wss].filter(backend.transports.contains).map {
            ConformanceCase(backend: backend, transport: $0)
        }
    }
    /// Every backend that can serve on more than one thread (every socket backend) x transport, the server on two:
    /// the contract suite (`ConformanceTests`) runs these beside ``all``; the suites of what is layered per
    /// connection (TLS, WebSocket, deflate, relays) do not, since a connection's code is the same on either loop.
    /// The second loops are made here, as the suite is planned: they live as long as the process, as each
    /// backend's shared loop does, so no test finds their descriptors open after it.
    static let onTwoServerThreads: [ConformanceCase] = all.filter { (try? $0.backend.loops(2)) != nil }.map {
        ConformanceCase(backend: $0.backend, transport: $0.transport, serverThreads: 2)
    }

    /// Cases whose connections are the kernel's, which other processes (openssl, Python, Chromium) can reach:
    /// every backend but the in-memory one.
    static let withSockets = all.filter(\.usesSockets)
    var usesSockets: Bool { !(backend.implementation is MemoryBackend) }

    /// Byte streams: TCP and TLS.
    static let streams = all.filter { $0.transport.isByteStream }
    static let udp = all.filter { $0.transport == .udp }
    /// WebSocket, plain and over TLS.
    static let ws = all.filter { $0.transport == .ws || $0.transport == .wss }
    /// Transports that keep message boundaries (UDP datagrams, WebSocket messages).
    static let messages = all.filter { !$0.transport.isByteStream }

    /// Throwaway certificates for this test process (made with `openssl` on first use, deleted at exit).
    static let certificates: TestCertificates = {
        let certificates = try! TestCertificates.make(extraServerHosts: [twoAddresses])
        atexit { ConformanceCase.certificates.remove() }
        return certificates
    }()

    /// A name that resolves to two loopback addresses, 127.0.0.2 first, then 127.0.0.1 (pinned for the whole
    /// process on first use; the test certificate names it).
    static let twoAddresses: String = {
        let name = "two-addresses.test"
        try! HostPins.pin(name, to: ["127.0.0.2", "127.0.0.1"])
        return name
    }()

    /// The client's TLS configuration: full verification against the test CA.
    var clientTLS: TLSConfiguration { Self.certificates.client }
    /// The server's TLS configuration (for tls and wss), `nil` otherwise.
    var serverTLS: TLSConfiguration? { transport.isSecure ? Self.certificates.server.server : nil }

    func connect(
        to endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(),
        webSocket: WebSocketOptions = WebSocketOptions()
    )
        async throws(ConnectionError) -> any Connection
    {
        try await backend.connect(to: endpoint, options: options, webSocket: webSocket, tls: clientTLS)
    }

    /// The stream under a WebSocket (or any) endpoint: TCP for ws, TLS for wss.
    func connectStream(to endpoint: Endpoint) async throws(ConnectionError) -> any Connection {
        try await connect(to: endpoint.with(transport: endpoint.transport.isSecure ? .tls : .tcp))
    }

    func listen(
        options: ConnectionOptions = ConnectionOptions(), webSocket: WebSocketOptions = WebSocketOptions()
    ) async throws(ConnectionError) -> any Listener {
        try await backend.listen(
            on: anyPort, options: options, webSocket: webSocket, tls: serverTLS, threads: serverThreads)
    }

    /// A listener for the stream under a WebSocket transport: TCP for ws, TLS for wss.
    func listenStream() async throws(ConnectionError) -> any Listener {
        try await backend.listen(
            on: anyPort.with(transport: transport.isSecure ? .tls : .tcp), tls: serverTLS, threads: serverThreads)
    }

    /// A TCP listener that never accepts, with this backlog: once its queue is full, a further connect cannot
    /// complete. On sockets a raw listening socket (the backends accept as connections come, so their kernel
    /// queue would never fill); on the memory backend, its own listener (which holds connects until accepted).
    func listenerNobodyAccepts(backlog: Int32) async throws -> (endpoint: Endpoint, close: @Sendable () async -> Void) {
        let options = ConnectionOptions.with { $0.backlog = backlog }
        guard usesSockets else {
            let listener = try await backend.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"), options: options)
            return (listener.localEndpoint, { await listener.close() })
        }
        let listener = try BSDSocket.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"), options: options)
        return (try listener.localAddress.endpoint(.tcp), { listener.close() })
    }

    /// A TCP client below the backend under test, for what `Connection` cannot do: put bytes where the receiver
    /// has them (its kernel's buffer, or the memory backend's side of the wire), then reset.
    func rawPeer(to endpoint: Endpoint) async throws -> any RawPeer {
        if usesSockets { return try SocketRawPeer(to: endpoint) }
        guard let connection = try await backend.connect(to: endpoint) as? MemoryConnection else {
            throw SocketTest.Failure(description: "the memory backend made something else than a MemoryConnection")
        }
        return MemoryRawPeer(connection: connection)
    }

    func echoServer() async throws(ConnectionError) -> EchoServer {
        try await echoServer(on: anyPort)
    }

    /// An echo server on `endpoint` (this case's server threads, its TLS).
    func echoServer(
        on endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions()
    ) async throws(ConnectionError) -> EchoServer {
        let server = EchoServer(
            listener: try await backend.listen(on: endpoint, options: options, tls: serverTLS, threads: serverThreads))
        server.begin()
        return server
    }

    /// A listener, a client connected to it, and the server's end, accepted after the client sent `first`: a
    /// UDP listener yields a peer only on its first datagram, so every transport opens the same way. `first` is
    /// still to be received at the server's end.
    func connectedPair(
        sending first: [UInt8] = [0]
    ) async throws -> (listener: any Listener, client: any Connection, server: any Connection) {
        let listener = try await listen()
        let client = try await connect(to: listener.localEndpoint)
        try await client.send(first)
        return (listener, client, try await listener.accept())
    }

    /// An echo server with these WebSocket options.
    func echoServer(webSocket: WebSocketOptions) async throws(ConnectionError) -> EchoServer {
        let server = EchoServer(listener: try await listen(webSocket: webSocket))
        server.begin()
        return server
    }
}

/// Expects `body` to throw a ``ConnectionError`` of `kind`, and returns it.
@discardableResult
func expectConnectionError<R>(
    _ kind: ConnectionError.Kind, sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () async throws(ConnectionError) -> R
) async -> ConnectionError? {
    do {
        _ = try await body()
        Issue.record("expected \(kind), but the call succeeded", sourceLocation: sourceLocation)
        return nil
    } catch {
        #expect(error.kind == kind, "expected \(kind), got \(error)", sourceLocation: sourceLocation)
        return error
    }
}

/// The cancellation rule of every receive: on a connection that has delivered a first byte, a receive that is
/// waiting (`receive`, in a task on the connection's own executor when `onItsExecutor`) is cancelled; it must end with `.cancelled`, and the
/// bytes sent after it must reach the next receives (`readBack`, asked for 3 bytes): cancelling lost nothing.
func expectCancelledReceiveLosesNothing(
    _ test: ConformanceCase, onItsExecutor: Bool = false,
    receive: @escaping @Sendable (any Connection) async throws -> Void,
    readBack: (any Connection) async throws -> [UInt8], sourceLocation: SourceLocation = #_sourceLocation
) async throws {
    let (listener, client, server) = try await test.connectedPair()
    #expect(try await server.receive()?.bytes == [0], sourceLocation: sourceLocation)
    let waiting = Task(executorPreference: onItsExecutor ? server.preferredExecutor : nil) {
        try await receive(server)
    }
    waiting.cancel()
    if case .failure(let error) = await waiting.result {
        #expect((error as? ConnectionError)?.kind == .cancelled, "\(error)", sourceLocation: sourceLocation)
    } else {
        Issue.record("a cancelled receive returned instead of throwing", sourceLocation: sourceLocation)
    }
    try await client.send([9, 8, 7])
    #expect(try await readBack(server) == [9, 8, 7], sourceLocation: sourceLocation)
    await closeBoth(client, server)
    await listener.close()
}

/// Closes both ends at once: each answers the other's WebSocket close frame (or TLS close_notify) while it waits
/// for its own answer, instead of one waiting out its close timeout (2 s) for a peer that is not reading.
func closeBoth(_ one: any Connection, _ other: any Connection) async {
    async let first: Void = one.close()
    await other.close()
    await first
}

/// A deterministic payload in which every byte depends on its position and the seed, so that a lost, repeated
/// or reordered byte shows.
func pattern(_ count: Int, seed: UInt8 = 0) -> [UInt8] {
    [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
        for index in 0..<count { buffer[index] = UInt8(truncatingIfNeeded: (index &* 31) ^ (index >> 8) ^ Int(seed)) }
        initialized = count
    }
}

/// Sends a UDP request and waits for the reply, sending again when none comes in time: UDP may lose datagrams,
/// so a client that needs an answer retries (as DNS does). Bounded: `attempts` tries.
func udpRequest(
    _ connection: any Connection, _ payload: [UInt8], attempts: Int = 10, wait: Duration = .milliseconds(500)
) async throws -> [UInt8] {
    for _ in 0..<attempts {
        try await connection.send(payload)
        let reply: [UInt8]?? = try? await withTimeLimit(wait) { try await connection.receive()?.bytes }
        if let reply, let bytes = reply, bytes == payload { return bytes }
    }
    throw SocketTest.Failure(description: "no UDP reply after \(attempts) attempts")
}

/// A peer written below `Connection` (see ``ConformanceCase/rawPeer(to:)``).
protocol RawPeer: Sendable {
    /// Sends `bytes` and returns once the receiving end holds all of them, then resets the connection.
    func deliverThenReset(_ bytes: [UInt8]) async throws
    func close() async
}

/// A raw socket: sends until the kernel has every byte acknowledged, then SO_LINGER 0 and close (a RST).
struct SocketRawPeer: RawPeer {
    let socket: SocketDescriptor

    init(to endpoint: Endpoint) throws {
        let address = try Syscall.resolve(endpoint)[0]
        socket = try Syscall.socket(family: address.family, datagram: false)
        do {
            _ = try socket.withDescriptor { (fd) throws(ConnectionError) in try Syscall.connect(fd, to: address) }
        } catch {
            socket.close()
            throw error
        }
    }

    func deliverThenReset(_ bytes: [UInt8]) async throws {
        var offset = 0
        while offset < bytes.count {
            let result = try bytes[offset...].withUnsafeBytes { (bytes) throws(ConnectionError) in
                try socket.withDescriptor { (fd) throws(ConnectionError) in try Syscall.send(fd, bytes) }
            }
            if case .processed(let count) = result { offset += count }
        }
        // Every byte acknowledged: all of it is in the receiver's kernel or its queue. Then the reset.
        let deadline = ContinuousClock.now + .seconds(20)
        while try socket.withDescriptor({ (fd) throws(ConnectionError) in Syscall.bytesUnsent(fd) }) > 0 {
            try #require(ContinuousClock.now < deadline, "the receiver's kernel never took the bytes")
            try await Task.sleep(for: .milliseconds(2))
        }
        socket.ifOpen { Syscall.resetConnection($0) }
    }

    func close() async { socket.close() }
}

/// A memory connection: the bytes are held on the wire, then released into the receiver's queue at once (as a
/// kernel's buffer takes them beyond what the receiver reads), then the wire is reset.
struct MemoryRawPeer: RawPeer {
    let connection: MemoryConnection

    func deliverThenReset(_ bytes: [UInt8]) async throws {
        let wire = connection.controls
        wire.hold(toward: connection.towardPeer)
        try await connection.send(bytes)
        wire.release(toward: connection.towardPeer)
        wire.reset()
    }

    func close() async { await connection.close() }
}
