import Synchronization

/// A listener that runs a handshake on each connection of an inner listener before handing it out: the shared
/// machinery of `tls://` (TLS handshake over TCP), `ws://` (HTTP upgrade over TCP) and `wss://` (both).
///
/// Handshakes run concurrently, so a slow or hostile client holds up no one. A connection whose handshake fails
/// is closed and counted in ``rejectedHandshakes``; the listener keeps serving.
public final class UpgradingListener: Listener, Sendable {
    /// The transport of the connections handed out.
    public let transport: Transport
    public var localEndpoint: Endpoint {
        let bound = inner.localEndpoint
        return Endpoint(transport: transport, host: bound.host, port: bound.port, path: path)
    }
    /// The path announced in ``localEndpoint``.
    public let path: String
    private let inner: any Listener
    private let shared = Shared()
    private let loop = Guarded<Task<Void, Never>?>(nil)

    private final class Shared: Sendable {
        let queue = ReceiveQueue<any Connection>(capacity: 1024)
        let pending = Guarded<[ObjectIdentifier: any Connection]>([:])
        let rejected = Atomic<Int>(0)
        let lastRejection = Guarded<ConnectionError?>(nil)
    }

    /// Handshakes that failed so far.
    public var rejectedHandshakes: Int { shared.rejected.load(ordering: .relaxed) }
    /// Why the most recent handshake failed, for diagnostics.
    public var lastRejection: ConnectionError? { shared.lastRejection.withLock { $0 } }

    /// Serves `transport` on `inner`, running `upgrade` on each accepted connection. `upgrade` owns the
    /// connection it is given only when it succeeds; on failure this listener closes it.
    public init(
        _ inner: any Listener, transport: Transport, path: String = "/",
        upgrade: @escaping @Sendable (any Connection) async throws(ConnectionError) -> any Connection
    ) {
        self.inner = inner
        self.transport = transport
        self.path = path
        let task = Task { [shared] in
            await withDiscardingTaskGroup { group in
                while true {
                    let connection: any Connection
                    do throws(ConnectionError) {
                        connection = try await inner.accept()
                    } catch {
                        if error.kind == .resourceExhausted { continue }
                        shared.queue.finish(.failed(error.kind == .closed ? .closed("the listener is closed") : error))
                        break
                    }
                    let id = ObjectIdentifier(connection)
                    shared.pending.withLock { $0[id] = connection }
                    group.addTask {
                        do throws(ConnectionError) {
                            let upgraded = try await upgrade(connection)
                            shared.pending.withLock { $0[id] = nil }
                            if !shared.queue.push(upgraded).accepted { await upgraded.close() }
                        } catch {
                            shared.pending.withLock { $0[id] = nil }
                            shared.rejected.add(1, ordering: .relaxed)
                            shared.lastRejection.withLock { $0 = error }
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
        await inner.close()
        for connection in shared.pending.withLock({ Array($0.values) }) { await connection.close() }
        for connection in shared.queue.close(.closed("the listener is closed")) { await connection.close() }
        await loop.withLock { $0 }?.value
    }
}
