import Synchronization

/// The connections a listener has accepted and its user has not taken yet, for the listeners that accept on a
/// thread or loop of their own (bsd's acceptor thread, uv's loop, the run loop): ``accept()`` takes them in order;
/// one that finds the queue full or closed is closed in the background (a refused connection), and
/// ``close(listener:)`` closes those still waiting, then the listener's own socket, then waits until every
/// refused one is closed, so that no descriptor outlives the listener's close.
package final class AcceptedConnections: Sendable {
    private let queue: ReceiveQueue<any Connection>
    private let refused = Guarded<[Task<Void, Never>]>([])

    /// At most `capacity` waiting; `onSpaceAvailable` runs when an accept makes room in a full queue.
    package init(capacity: Int = 1024, onSpaceAvailable: (@Sendable () -> Void)? = nil) {
        queue = ReceiveQueue(capacity: capacity, onSpaceAvailable: onSpaceAvailable)
    }

    /// Room for one more.
    package var hasSpace: Bool { queue.hasSpace }

    /// Queues `connection` for ``accept()``, or closes it when the queue is full or closed; `false` then.
    @discardableResult
    package func offer(_ connection: any Connection) -> Bool {
        if queue.push(connection).accepted { return true }
        let task = Task { await connection.close() }
        refused.withLock { $0.append(task) }
        return false
    }

    /// The next ``accept()`` throws `error` (after the connections queued before it); later ones go on.
    package func fail(_ error: ConnectionError) { queue.pushFailure(error) }

    /// Every later ``accept()`` throws `error`, once those queued are taken.
    package func finish(_ error: ConnectionError) { queue.finish(.failed(error)) }

    /// The next accepted connection, in order.
    package func accept() async throws(ConnectionError) -> any Connection {
        guard let connection = try await queue.next() else { throw .closed("the listener is closed") }
        return connection
    }

    /// Ends every ``accept()`` and returns the connections nobody took, for the caller to close.
    package func closeQueue() -> [any Connection] { queue.close(.closed("the listener is closed")) }

    /// Closes the queue and the connections nobody took, then the listener's own socket (`listener`, after which
    /// no connection is offered any more), then waits until every refused connection is closed.
    package func close(listener: () async -> Void) async {
        for connection in closeQueue() { await connection.close() }
        await listener()
        for task in refused.withLock({ $0 }) { await task.value }
    }
}
