import Synchronization

/// Connections a listener accepted but could not hand over, because it was closing meanwhile: each is closed in
/// the background, and the listener's `close()` waits for those closes (``waitForAll()``) after its accepting
/// side has stopped, so a closed listener leaves no descriptor open behind it. (Found by the conformance suite's
/// descriptor check: a client accepted by bsd's acceptor thread in the instant its listener closed was still open
/// when `close()` returned.)
package final class RefusedConnections: Sendable {
    private let closing = Guarded<[Task<Void, Never>]>([])

    package init() {}

    /// Closes `connection` in the background.
    package func close(_ connection: any Connection) {
        let task = Task { await connection.close() }
        closing.withLock { $0.append(task) }
    }

    /// Waits until every connection given to ``close(_:)`` so far is closed.
    package func waitForAll() async {
        for task in closing.withLock({ $0 }) { await task.value }
    }
}
