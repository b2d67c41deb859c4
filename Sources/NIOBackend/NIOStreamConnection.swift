import ConnectionCore
import NIOCore
import NIOPosix
import POSIXSupport
import Synchronization

/// What a connection's sends on its event loop reuse (touched on that thread only, within one synchronous stretch
/// of a send, so sends never share it across a suspension): the buffer the bytes are copied into, and the slot the
/// write's future reports its result to when the socket took the bytes at once.
private struct LoopWriter {
    /// Reused while SwiftNIO holds no other reference to it (the write before completed): no allocation per send.
    var buffer = ByteBuffer()
    var result: Result<Void, any Error>?
}

/// A TCP connection on a SwiftNIO channel.
final class NIOStreamConnection: Connection, Sendable {
    let transport = Transport.tcp
    let localEndpoint: Endpoint
    let remoteEndpoint: Endpoint
    let options: ConnectionOptions
    let channel: any Channel
    let inbox: ReceiveQueue<[UInt8]>
    /// Touched on the channel's event loop only (its `context`).
    private let handler: StreamInboxHandler
    private let life = SharedLifecycle()
    /// In SwiftNIO's loop-bound box: touched on the channel's loop only (each access checks).
    private let loopWriter: NIOLoopBoundBox<LoopWriter>

    var preferredExecutor: (any TaskExecutor)? { EventLoopTaskExecutor.of(channel.eventLoop) }

    /// Wraps an active channel whose pipeline holds `handler`, the ``StreamInboxHandler`` that fills its inbox.
    init(channel: any Channel, handler: StreamInboxHandler, options: ConnectionOptions) {
        self.channel = channel
        self.handler = handler
        self.inbox = handler.inbox
        self.options = options
        localEndpoint = endpoint(channel.localAddress, .tcp)
        remoteEndpoint = endpoint(channel.remoteAddress, .tcp)
        loopWriter = .makeBoxSendingValue(LoopWriter(), eventLoop: channel.eventLoop)
    }

    /// The queue for a new channel: room again turns reading back on.
    static func makeInbox(for channel: any Channel, options: ConnectionOptions) -> ReceiveQueue<[UInt8]> {
        .byteStream(capacity: options.receiveQueueLimit) {
            channel.setOption(ChannelOptions.autoRead, value: true).whenComplete { _ in }
        }
    }

    /// Every option set explicitly (SwiftNIO's own defaults differ from the other backends').
    static func configure(_ channel: any Channel, options: ConnectionOptions) throws {
        guard let sync = channel.syncOptions else { return }
        try sync.setOption(.socketOption(.tcp_nodelay), value: options.tcpNoDelay ? 1 : 0)
        try sync.setOption(.allowRemoteHalfClosure, value: true)
        if let size = options.receiveBufferSize { try sync.setOption(.socketOption(.so_rcvbuf), value: size) }
        if let size = options.sendBufferSize { try sync.setOption(.socketOption(.so_sndbuf), value: size) }
        // A channel keeps its last receive buffer for the next read (SwiftNIO's pooled receive allocator), so the
        // initial size is what every idle connection holds: 512 bytes, not SwiftNIO's 2,048 (1.5 KiB less per idle
        // connection; docs/benchmarks.md, memory per connection). The allocator doubles it as soon as a read fills
        // it, up to the read chunk size.
        try sync.setOption(
            .recvAllocator,
            value: AdaptiveRecvByteBufferAllocator(minimum: 64, initial: 512, maximum: options.readChunkSize))
    }

    static func connect(
        to address: NIOCore.SocketAddress, endpoint: Endpoint, options: ConnectionOptions,
        group: MultiThreadedEventLoopGroup
    ) async throws(ConnectionError) -> NIOStreamConnection {
        let handlerBox = Guarded<StreamInboxHandler?>(nil)
        let bootstrap = ClientBootstrap(group: group)
            .connectTimeout(.nanoseconds(Int64(options.connectTimeout.wholeNanoseconds)))
            .channelInitializer { channel in
                do {
                    try configure(channel, options: options)
                    let handler = StreamInboxHandler(
                        inbox: makeInbox(for: channel, options: options), executor: .of(channel.eventLoop))
                    handlerBox.withLock { $0 = handler }
                    try channel.pipeline.syncOperations.addHandler(handler, name: StreamInboxHandler.name)
                    return channel.eventLoop.makeSucceededVoidFuture()
                } catch {
                    return channel.eventLoop.makeFailedFuture(error)
                }
            }
        do {
            let channel = try await bootstrap.connect(to: address).get()
            guard let handler = handlerBox.withLock({ $0 }) else { throw ConnectionError(.system, "no inbox") }
            return NIOStreamConnection(channel: channel, handler: handler, options: options)
        } catch {
            throw connectionError(error, "connect to \(endpoint)")
        }
    }

    func send(_ message: Message) async throws(ConnectionError) {
        try await write(message.bytes)
    }

    func send(contentsOf bytes: UnsafeRawBufferPointer) async throws(ConnectionError) {
        try await write(bytes)
    }

    /// On the event loop (a task that prefers it) the bytes are copied into the connection's reused buffer and
    /// the write's result is read right after `writeAndFlush`, which has completed the promise when the socket took
    /// the bytes at once: one allocation per send (the promise) and no suspension. Elsewhere, a buffer of its own
    /// and a wait on the future.
    private func write<Bytes: Sequence<UInt8>>(_ bytes: Bytes) async throws(ConnectionError) {
        try checkOpen()
        guard channel.eventLoop.inEventLoop else {
            return try await written(channel.writeAndFlush(ByteBuffer(bytes: bytes)))
        }
        let writer = loopWriter
        let buffer = writer.withValue { writer in
            writer.buffer.clear()
            writer.buffer.writeBytes(bytes)
            writer.result = nil
            return writer.buffer
        }
        let promise = channel.eventLoop.makePromise(of: Void.self)
        if let context = handler.context.value {
            context.writeAndFlush(NIOAny(buffer), promise: promise)
        } else {
            channel.writeAndFlush(buffer, promise: promise)
        }
        promise.futureResult.whenComplete { [writer] in writer.value.result = $0 }
        switch writer.value.result {
        case .success?: return
        case .failure(let error)?: throw writeError(error)
        case nil: try await written(promise.futureResult)
        }
    }

    private func checkOpen() throws(ConnectionError) {
        if case .refuse(let error) = life.handle(.send) { throw error }
    }

    private func written(_ future: EventLoopFuture<Void>) async throws(ConnectionError) {
        do {
            try await future.get()
        } catch {
            throw writeError(error)
        }
    }

    private func writeError(_ error: any Error) -> ConnectionError {
        life.isOpen ? connectionError(error, "write") : .closed()
    }

    func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        guard let bytes = try await inbox.next(maximumLength: maximumLength) else { return nil }
        return Message(bytes)
    }

    func closeOutput() async throws(ConnectionError) {
        switch life.handle(.closeOutput) {
        case .refuse(let error): throw error
        case .shutdownOutput: break
        default: return
        }
        do {
            try await channel.close(mode: .output).get()
        } catch {
            throw connectionError(error, "shutdown")
        }
    }

    func close() async {
        await life.close { [inbox, channel] finished in
            inbox.close()
            channel.close(promise: nil)
            channel.closeFuture.whenComplete { _ in finished() }
        }
    }

    /// SO_LINGER 0: SwiftNIO closes the descriptor without a shutdown first, so the close sends a reset.
    func abort() async {
        if life.isOpen, let provider = channel as? any SocketOptionProvider {
            try? await provider.setSoLinger(linger(l_onoff: 1, l_linger: 0)).get()
        }
        await close()
    }
}
