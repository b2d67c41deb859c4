import ConnectionCore
import NIOCore
import NIOPosix
import POSIXSupport
import Synchronization

/// Every option set explicitly for a UDP channel: datagrams up to maxDatagramSize (SwiftNIO's default buffer
/// is 2,048 bytes, which would truncate larger datagrams).
func configureDatagram(_ channel: any Channel, options: ConnectionOptions) throws {
    guard let sync = channel.syncOptions else { return }
    try sync.setOption(.recvAllocator, value: FixedSizeRecvByteBufferAllocator(capacity: options.maxDatagramSize))
    if let size = options.receiveBufferSize { try sync.setOption(.socketOption(.so_rcvbuf), value: size) }
    if let size = options.sendBufferSize { try sync.setOption(.socketOption(.so_sndbuf), value: size) }
}

/// A connected UDP channel.
final class NIODatagramConnection: Connection, Sendable {
    let transport = Transport.udp
    let localEndpoint: Endpoint
    let remoteEndpoint: Endpoint
    let options: ConnectionOptions
    let channel: any Channel
    let inbox: ReceiveQueue<[UInt8]>
    private let life = SharedLifecycle()

    var preferredExecutor: (any TaskExecutor)? { EventLoopTaskExecutor.of(channel.eventLoop) }

    private init(channel: any Channel, inbox: ReceiveQueue<[UInt8]>, options: ConnectionOptions) {
        self.channel = channel
        self.inbox = inbox
        self.options = options
        localEndpoint = endpoint(channel.localAddress, .udp)
        remoteEndpoint = endpoint(channel.remoteAddress, .udp)
    }

    static func connect(
        to address: NIOCore.SocketAddress, endpoint: Endpoint, options: ConnectionOptions,
        group: MultiThreadedEventLoopGroup
    ) async throws(ConnectionError) -> NIODatagramConnection {
        let inbox = ReceiveQueue<[UInt8]>.datagrams(capacity: options.receiveQueueLimit)
        let bootstrap = DatagramBootstrap(group: group)
            .channelInitializer { channel in
                do {
                    try configureDatagram(channel, options: options)
                    let handler = DatagramInboxHandler(
                        executor: .of(channel.eventLoop),
                        deliver: { envelope in
                            var data = envelope.data
                            if inbox.hasSpace { inbox.push(data.readBytes(length: data.readableBytes) ?? []) }
                        },
                        fail: { error in inbox.pushFailure(error) })
                    try channel.pipeline.syncOperations.addHandler(handler)
                    return channel.eventLoop.makeSucceededVoidFuture()
                } catch {
                    return channel.eventLoop.makeFailedFuture(error)
                }
            }
        do {
            let channel = try await bootstrap.connect(to: address).get()
            return NIODatagramConnection(channel: channel, inbox: inbox, options: options)
        } catch {
            throw connectionError(error, "connect to \(endpoint)")
        }
    }

    func send(_ message: Message) async throws(ConnectionError) {
        if case .refuse(let error) = life.handle(.send) { throw error }
        do {
            try await channel.writeAndFlush(ByteBuffer(bytes: message.bytes)).get()
        } catch {
            throw life.isOpen ? connectionError(error, "send") : .closed()
        }
    }

    /// SwiftNIO's own batching: the datagrams are written on the event loop and flushed once, which its
    /// datagram channel hands to the kernel with sendmmsg(2). (Its UDP GSO is a channel option fixing one
    /// segment size for every send, so it is not used here.)
    func send(batch: [UnsafeRawBufferPointer]) async throws(ConnectionError) {
        if case .refuse(let error) = life.handle(.send) { throw error }
        guard !batch.isEmpty else { return }
        let buffers = batch.map { ByteBuffer(bytes: $0) }
        let channel = channel
        do {
            try await channel.eventLoop.flatSubmit {
                var writes = buffers.dropLast().map { channel.write($0) }
                writes.append(channel.writeAndFlush(buffers[buffers.count - 1]))
                return EventLoopFuture.andAllSucceed(writes, on: channel.eventLoop)
            }.get()
        } catch {
            throw life.isOpen ? connectionError(error, "send") : .closed()
        }
    }

    func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        try await inbox.next().map(Message.init)
    }

    func closeOutput() async throws(ConnectionError) {
        throw ConnectionError(.unsupported, "UDP has no half-close")
    }

    func close() async {
        await life.close { [inbox, channel] finished in
            inbox.close()
            channel.close(promise: nil)
            channel.closeFuture.whenComplete { _ in finished() }
        }
    }
}
