import ConnectionCore
import NIOCore
import NIOPosix
import POSIXSupport
import Synchronization

/// The UDP server side: one bound channel, datagrams sorted by sender into per-peer connections.
final class NIODatagramListener: Listener, Sendable {
    let transport = Transport.udp
    let localEndpoint: Endpoint
    private let channel: any Channel
    private let demultiplexer: DatagramDemultiplexer<NIOCore.SocketAddress>

    private init(channel: any Channel, demultiplexer: DatagramDemultiplexer<NIOCore.SocketAddress>) {
        self.channel = channel
        self.demultiplexer = demultiplexer
        localEndpoint = demultiplexer.localEndpointForListener
    }

    /// Hands a bound socket (``Socket/listen(on:transport:options:nonBlocking:describing:)``) to SwiftNIO.
    static func adopt(
        _ socket: SocketDescriptor, endpoint requested: Endpoint, options: ConnectionOptions,
        group: MultiThreadedEventLoopGroup
    ) async throws(ConnectionError) -> NIODatagramListener {
        guard let fd = socket.release() else { throw .closed("the bound socket was closed") }
        let box = Guarded<DatagramDemultiplexer<NIOCore.SocketAddress>?>(nil)
        let bootstrap = DatagramBootstrap(group: group)
            .channelInitializer { channel in
                do {
                    try configureDatagram(channel, options: options)
                    let handler = DatagramInboxHandler(
                        executor: .of(channel.eventLoop),
                        deliver: { envelope in
                            var data = envelope.data
                            box.withLock { $0 }?.deliver(
                                data.readBytes(length: data.readableBytes) ?? [], from: envelope.remoteAddress)
                        },
                        fail: { _ in })  // a stale ICMP error or an oversized datagram: the socket lives on
                    try channel.pipeline.syncOperations.addHandler(handler)
                    return channel.eventLoop.makeSucceededVoidFuture()
                } catch {
                    return channel.eventLoop.makeFailedFuture(error)
                }
            }
        let channel: any Channel
        do {
            channel = try await bootstrap.withBoundSocket(fd).get()
        } catch {
            throw connectionError(error, "listen on \(requested)")
        }
        let executor = EventLoopTaskExecutor.of(channel.eventLoop)
        let demultiplexer = DatagramDemultiplexer<NIOCore.SocketAddress>(
            localEndpoint: endpoint(channel.localAddress, .udp), options: options, executor: executor,
            endpoint: { endpoint($0, .udp) },
            send: { bytes, peer throws(ConnectionError) in
                do {
                    try await channel.writeAndFlush(
                        AddressedEnvelope(remoteAddress: peer, data: ByteBuffer(bytes: bytes))
                    )
                    .get()
                } catch {
                    throw connectionError(error, "send to \(peer)")
                }
            })
        box.withLock { $0 = demultiplexer }
        return NIODatagramListener(channel: channel, demultiplexer: demultiplexer)
    }

    func accept() async throws(ConnectionError) -> any Connection { try await demultiplexer.accept() }

    func close() async {
        demultiplexer.close()
        try? await channel.close().get()
    }
}
