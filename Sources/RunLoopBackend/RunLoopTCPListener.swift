@_spi(Loop) import ConnectionCore
import POSIXSupport
import Synchronization

/// A TCP listener: a ``SocketListener`` whose accept callback wraps each pair as a connection.
final class RunLoopTCPListener: Listener, Sendable {
    let transport = Transport.tcp
    let localEndpoint: Endpoint
    private let listener: SocketListener
    private let runLoop: SocketRunLoop
    private let accepted = AcceptedConnections()

    init(on endpoint: Endpoint, runLoop: SocketRunLoop, options: ConnectionOptions) throws(ConnectionError) {
        let accepted = accepted
        let local = Late<SharedValues<Endpoint>>()
        listener = try SocketListener(on: endpoint, runLoop: runLoop, options: options) { input, output in
            let connection = RunLoopTCPConnection(
                accepted: input, output, runLoop: runLoop, options: options, local: local.value!)
            accepted.offer(connection)
        }
        local.set(SharedValues(listener.localEndpoint))
        localEndpoint = listener.localEndpoint
        self.runLoop = runLoop
    }

    func accept() async throws(ConnectionError) -> any Connection { try await accepted.accept() }

    func close() async {
        await accepted.close(listener: { [runLoop, listener] in
            await withCheckedContinuation { continuation in
                runLoop.perform {
                    listener.close()
                    continuation.resume()
                }
            }
        })
    }
}
