public import ConnectionCore
import POSIXSupport
import Synchronization

/// Backend `bsd`: blocking BSD sockets, each connection served by threads of its own, adapted to the async
/// `Connection` protocol. The native style is ``BSDSocket``.
///
/// Threads: per connection one reader thread (started at once) and one writer thread (started the first time a
/// send cannot complete without waiting); per listener one acceptor (TCP) or receiver (UDP) thread. Connecting
/// (name resolution and the handshake) runs on the connection's future reader thread. No blocking call runs on
/// Swift's cooperative pool.
public struct BSDBackend: ConnectionBackend {
    public let name = "bsd"
    public let transports: Set<Transport> = [.tcp, .udp]

    /// Creates the backend. It holds no state: every connection owns its threads.
    public init() {
        Syscall.ignoreSIGPIPE()
    }

    public func connect(
        to endpoint: Endpoint, options: ConnectionOptions
    ) async throws(ConnectionError)
        -> any Connection
    {
        try requireTransport(of: endpoint)
        let attempt = ConnectAttempt()
        let result: Result<BSDConnection, ConnectionError> = await withTaskCancellationHandler {
            await PosixThread.spawnAndAwait(name: "bsd-connect") { deliver in
                let connection: BSDConnection
                do throws(ConnectionError) {
                    let socket = try BSDSocket.connect(to: endpoint, options: options, attempt: attempt)
                    connection = try BSDConnection(socket: socket, options: options, readerOnCallingThread: ())
                } catch {
                    deliver(.failure(error))
                    return
                }
                deliver(.success(connection))
                // This thread becomes the connection's reader.
                connection.runReaderHere()
            }
        } onCancel: {
            attempt.cancel()
        }
        return try result.get()
    }

    public func listen(
        on endpoint: Endpoint, options: ConnectionOptions
    ) async throws(ConnectionError)
        -> any Listener
    {
        try requireTransport(of: endpoint)
        // Name resolution may block: do it on a thread of ours.
        let result: Result<any Listener, ConnectionError> = await PosixThread.spawnAndAwait(name: "bsd-listen") {
            deliver in
            do throws(ConnectionError) {
                let socket = try BSDSocket.listen(on: endpoint, options: options)
                let listener: any Listener =
                    endpoint.transport == .udp
                    ? try BSDUDPListener(socket: socket, options: options)
                    : try BSDTCPListener(socket: socket, options: options)
                deliver(.success(listener))
            } catch {
                deliver(.failure(error))
            }
        }
        return try result.get()
    }

}

extension Backend {
    /// Blocking BSD sockets on threads of their own (`BSDBackend`).
    public static let bsd = Backend(
        name: "bsd",
        summary: "blocking BSD sockets; a reader thread (and a writer thread when needed) per connection",
        style: "blocking calls on a thread per connection: the simplest code, and a thread per client",
        tooling: Backend.Tooling(
            module: "BSDSocketBackend", colour: "#f28e2b", autobahn: .ws, autobahnDeflate: [.server],
            allocationsPerRoundTrip: 5),
        // A thread per connection already: a listener per server thread only adds an acceptor thread.
        newLoop: { BSDBackend() },
        make: { BSDBackend() })
}
