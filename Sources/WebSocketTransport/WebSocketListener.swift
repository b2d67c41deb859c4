public import ConnectionCore
import Synchronization

/// The server side of WebSocket over any backend's TCP listener: TCP connections are accepted and their
/// opening handshakes run concurrently (a slow or bad client holds up no one); each connection whose handshake
/// succeeds is returned by ``accept()``. A rejected handshake is answered (400/426) and closed, and the listener
/// keeps serving.
public final class WebSocketListener: Listener, Sendable {
    public let transport: Transport
    public var localEndpoint: Endpoint {
        let bound = tcp.localEndpoint
        return Endpoint(transport: transport, host: bound.host, port: bound.port, path: path)
    }
    /// The path announced in ``localEndpoint`` (any path is accepted).
    public let path: String
    private let tcp: any Listener
    private let shared = Shared()
    private let loop = Mutex<Task<Void, Never>?>(nil)

    private final class Shared: Sendable {
        let queue = ReceiveQueue<any Connection>(capacity: 1024)
        let pending = Mutex<[ObjectIdentifier: any Connection]>([:])
        let rejected = Atomic<Int>(0)
    }

    /// Handshakes rejected so far.
    public var rejectedHandshakes: Int { shared.rejected.load(ordering: .relaxed) }

    /// Serves WebSocket on `tcp`.
    public init(
        tcp: any Listener, transport: Transport = .ws, path: String = "/",
        options: WebSocketOptions = WebSocketOptions()
    ) {
        self.tcp = tcp
        self.path = path
        self.transport = transport
        let task = Task { [shared] in
            await withDiscardingTaskGroup { group in
                while true {
                    let connection: any Connection
                    do throws(ConnectionError) {
                        connection = try await tcp.accept()
                    } catch {
                        if error.kind == .resourceExhausted { continue }
                        shared.queue.finish(.failed(error.kind == .closed ? .closed("the listener is closed") : error))
                        break
                    }
                    let id = ObjectIdentifier(connection)
                    shared.pending.withLock { $0[id] = connection }
                    group.addTask {
                        do throws(ConnectionError) {
                            let webSocket = try await WebSocketConnection.server(
                                over: connection, transport: transport, options: options)
                            shared.pending.withLock { $0[id] = nil }
                            if !shared.queue.push(webSocket).accepted { await webSocket.close() }
                        } catch {
                            shared.pending.withLock { $0[id] = nil }
                            shared.rejected.add(1, ordering: .relaxed)
                            await connection.close()
                        }
                    }
                }
            }
        }
        loop.withLock { $0 = task }
    }

    public func accept() async throws(ConnectionError) -> any Connection {
        guard let connection = try await shared.queue.next() else { throw .closed("the listener is closed") }
        return connection
    }

    public func close() async {
        await tcp.close()
        for connection in shared.pending.withLock({ Array($0.values) }) { await connection.close() }
        for connection in shared.queue.close(.closed("the listener is closed")) { await connection.close() }
        await loop.withLock { $0 }?.value
    }
}
