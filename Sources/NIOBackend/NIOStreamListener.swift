import ConnectionCore
import NIOCore
import NIOPosix
import POSIXSupport
import Synchronization

/// The TCP server side: accepted channels become connections, handed out by ``accept()``.
final class NIOStreamListener: Listener, Sendable {
    let transport = Transport.tcp
    let localEndpoint: Endpoint
    private let serverChannel: any Channel
    private let accepted: ReceiveQueue<any Connection>

    private init(serverChannel: any Channel, accepted: ReceiveQueue<any Connection>) {
        self.serverChannel = serverChannel
        self.accepted = accepted
        localEndpoint = endpoint(serverChannel.localAddress, .tcp)
    }

    /// Hands a socket bound and listening (``Socket/listen(on:transport:options:nonBlocking:describing:)``) to
    /// SwiftNIO's server channel.
    static func adopt(
        _ socket: SocketDescriptor, endpoint: Endpoint, options: ConnectionOptions,
        group: MultiThreadedEventLoopGroup
    ) async throws(ConnectionError) -> NIOStreamListener {
        let accepted = ReceiveQueue<any Connection>(capacity: 1024)
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(
                        AcceptPause(pause: .nanoseconds(Int64(options.acceptBackoff.wholeNanoseconds))))
                }
            }
            .childChannelInitializer { channel in
                do {
                    try NIOStreamConnection.configure(channel, options: options)
                    let handler = StreamInboxHandler(
                        inbox: NIOStreamConnection.makeInbox(for: channel, options: options),
                        executor: .of(channel.eventLoop))
                    try channel.pipeline.syncOperations.addHandler(handler, name: StreamInboxHandler.name)
                    let connection = NIOStreamConnection(channel: channel, handler: handler, options: options)
                    if !accepted.push(connection).accepted { channel.close(promise: nil) }
                    return channel.eventLoop.makeSucceededVoidFuture()
                } catch {
                    return channel.eventLoop.makeFailedFuture(error)
                }
            }
        guard let fd = socket.release() else { throw .closed("the listening socket was closed") }
        do {
            // From here SwiftNIO owns the descriptor, and closes it also when this fails.
            let channel = try await bootstrap.withBoundSocket(fd).get()
            return NIOStreamListener(serverChannel: channel, accepted: accepted)
        } catch {
            throw connectionError(error, "listen on \(endpoint)")
        }
    }

    func accept() async throws(ConnectionError) -> any Connection {
        guard let connection = try await accepted.next() else { throw .closed("the listener is closed") }
        return connection
    }

    func close() async {
        try? await serverChannel.close().get()
        for connection in accepted.close(.closed("the listener is closed")) { await connection.close() }
    }
}
