import BenchmarkDriver
import ConnectionCore
public import SocketStyles
import Synchronization

/// An echo server over any backend and transport: every message (TCP chunk, UDP datagram, WebSocket message)
/// is sent back as it came. Used by `sockbench serve`, by the conformance suite and by the benchmarks.
///
/// ``stop()`` closes the listener and every open connection and returns when every task it started has
/// finished, so a test can check right after it that no descriptor is left open.
public final class EchoServer: Sendable {
    /// The listener (its ``Listener/localEndpoint`` has the real port).
    public let listener: any Listener
    private let connections = Guarded<[ObjectIdentifier: any Connection]>([:])
    private let served = Atomic<Int>(0)
    private let acceptLoop = Guarded<Task<Void, Never>?>(nil)
    /// What the server does with what it receives.
    public let mode: Mode

    /// Echo every message back, count and discard (the receiving end of a one-way `pump`), or send what one client
    /// asks for to every other client (``Broadcast``: the server of `broadcast-N`).
    public enum Mode: String, Sendable {
        case echo
        case sink
        case broadcast
    }

    /// Listens on `endpoint` with `backend` and starts serving.
    public static func start(
        _ backend: Backend, on endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(),
        webSocket: WebSocketOptions = WebSocketOptions(), tls: TLSConfiguration? = nil, mode: Mode = .echo
    ) async throws(ConnectionError) -> EchoServer {
        let listener = try await backend.listen(on: endpoint, options: options, webSocket: webSocket, tls: tls)
        let server = EchoServer(listener: listener, mode: mode)
        server.begin()
        return server
    }

    /// Serves an existing listener.
    public init(listener: any Listener, mode: Mode = .echo) {
        self.listener = listener
        self.mode = mode
    }

    /// The address clients should use.
    public var endpoint: Endpoint { listener.localEndpoint }

    /// How many connections (UDP: peers) were accepted so far.
    public var connectionsServed: Int { served.load(ordering: .relaxed) }

    public func begin() {
        let task = Task { [self] in
            await withDiscardingTaskGroup { group in
                while true {
                    let connection: any Connection
                    do throws(ConnectionError) {
                        connection = try await listener.accept()
                    } catch {
                        // Out of descriptors is transient (the listener keeps serving); anything else ends it.
                        if error.kind == .resourceExhausted { continue }
                        break
                    }
                    served.add(1, ordering: .relaxed)
                    let id = ObjectIdentifier(connection)
                    connections.withLock { $0[id] = connection }
                    // Run each echo where the connection's I/O completes (an event loop), when it has such a place.
                    group.addTask(executorPreference: connection.preferredExecutor) { [self] in
                        await serve(connection, id: id)
                    }
                }
            }
        }
        acceptLoop.withLock { $0 = task }
    }

    /// One connection's task, until it ends. Inlined into the task's closure, and the echo loop into it: a task keeps
    /// the frames of its deepest stack for as long as it lives, and each async call level is a frame of its own, so
    /// an idle connection's task waiting in `receive` holds fewer of them (docs/benchmarks.md, memory per connection).
    @inline(__always) private func serve(_ connection: any Connection, id: ObjectIdentifier) async {
        switch mode {
        case .echo: await Self.echoLoop(connection)
        case .sink: await PumpSink.serve(connection)
        case .broadcast:
            await Broadcast.serve(connection) { [self] in
                connections.withLock { Array($0.values) }
            }
        }
        connections.withLock { $0[id] = nil }
        await connection.close()
    }

    /// Echoes until the peer finishes, an error occurs, or the connection is closed.
    @inline(never) public static func echo(_ connection: any Connection) async {
        await echoLoop(connection)
    }

    @inline(__always) private static func echoLoop(_ connection: any Connection) async {
        // `receive(maximumLength:)` called here, not through the `receive()` extension: that generic
        // function's frame (224 bytes) would stay on an idle connection's task stack while it waits.
        let chunk = readChunkSize(of: connection)
        do {
            while let message = try await connection.receive(maximumLength: chunk) {
                try await connection.send(message)
            }
        } catch {
            // The peer vanished or the server is stopping: this connection is done, the others go on.
        }
    }

    /// Out of `echo`: the options read in an async function would take room in its frame.
    @inline(never) private static func readChunkSize(of connection: any Connection) -> Int {
        connection.options.readChunkSize
    }

    /// Stops: closes the listener and every connection, and waits for every task to finish.
    public func stop() async {
        await listener.close()
        let open = connections.withLock { Array($0.values) }
        for connection in open { await connection.close() }
        let task = acceptLoop.withLock { $0 }
        await task?.value
    }
}
