@_spi(Loop) import ConnectionCore
import POSIXSupport
import Synchronization

/// A TCP listener: a ``SocketListener`` whose accept callback wraps each pair as a connection.
final class RunLoopTCPListener: Listener, Sendable {
    let transport = Transport.tcp
    let localEndpoint: Endpoint
    private let listener: SocketListener
    private let runLoop: SocketRunLoop
    private let queue = ReceiveQueue<any Connection>(capacity: 1024)
    private let refused = RefusedConnections()

    init(on endpoint: Endpoint, runLoop: SocketRunLoop, options: ConnectionOptions) throws(ConnectionError) {
        let queue = queue
        let refused = refused
        let local = Late<Endpoint>()
        listener = try SocketListener(on: endpoint, runLoop: runLoop, options: options) { input, output in
            let connection = RunLoopTCPConnection(
                accepted: input, output, runLoop: runLoop, options: options, local: local.value!)
            if !queue.push(connection).accepted { refused.close(connection) }
        }
        local.set(listener.localEndpoint)
        localEndpoint = listener.localEndpoint
        self.runLoop = runLoop
    }

    func accept() async throws(ConnectionError) -> any Connection {
        guard let connection = try await queue.next() else { throw .closed("the listener is closed") }
        return connection
    }

    func close() async {
        let waiting = queue.close(.closed("the listener is closed"))
        for connection in waiting { await connection.close() }
        await withCheckedContinuation { continuation in
            runLoop.perform { [listener] in
                listener.close()
                continuation.resume()
            }
        }
        await refused.waitForAll()  // the listening socket is closed: no accept callback runs any more
    }
}
