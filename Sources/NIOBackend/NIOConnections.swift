import ConnectionCore
import NIOCore
import NIOPosix
import POSIXSupport
import Synchronization

/// A SwiftNIO event loop as a `TaskExecutor`, so a task that prefers it runs on the loop thread and is resumed
/// by channel events without a thread hop (what ``Connection/preferredExecutor`` is for; SwiftNIO 2.101 has no
/// such conformance of its own).
///
/// A job enqueued while a handler of ours delivers a read on the loop thread (``delivering(_:)``: a read resumes
/// the task waiting in a receive) is kept in a loop-local list and run when that delivery returns, still inside
/// the handler's `channelRead`: the task continues at once, as a native handler would, instead of going through
/// the loop's task queue (a lock, a closure allocated per job, and the run of the queue after the tick's
/// events). A job never runs inside `enqueue`. Any other job goes through `EventLoop.execute`.
final class EventLoopTaskExecutor: TaskExecutor, Sendable {
    let loop: any EventLoop
    /// Jobs made ready during a delivery, and whether one is in progress.
    private struct Collected {
        var jobs: [UnownedJob] = []
        var collecting = false
    }
    /// SwiftNIO's loop-bound box: touched on the loop thread only (each access checks).
    private let collected: NIOLoopBoundBox<Collected>

    init(_ loop: any EventLoop) {
        self.loop = loop
        collected = .makeBoxSendingValue(Collected(), eventLoop: loop)
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        // `collected` is only touched on the loop thread: test the thread first.
        if loop.inEventLoop
            && collected.withValue({ collected in
                guard collected.collecting else { return false }
                collected.jobs.append(job)
                return true
            })
        {
            return
        }
        loop.execute { [self] in job.runSynchronously(on: asUnownedTaskExecutor()) }
    }

    /// Runs `body` (a handler handing over what it read, on the loop thread), then the jobs it made ready and
    /// those they make ready in turn, before returning.
    func delivering<Result>(_ body: () -> Result) -> Result {
        let outermost = collected.withValue { collected in
            defer { collected.collecting = true }
            return !collected.collecting
        }
        guard outermost else { return body() }
        let result = body()
        var index = 0
        // Each job copied out first: it may enqueue more (an access to the list held across it would overlap).
        while let job = collected.withValue({ index < $0.jobs.count ? $0.jobs[index] : nil }) {
            job.runSynchronously(on: asUnownedTaskExecutor())
            index += 1
        }
        collected.withValue { collected in
            collected.jobs.removeAll(keepingCapacity: true)
            collected.collecting = false
        }
        return result
    }

    private static let executors = Guarded<[ObjectIdentifier: EventLoopTaskExecutor]>([:])

    /// One executor per loop.
    static func of(_ loop: any EventLoop) -> EventLoopTaskExecutor {
        executors.withLock { executors in
            let key = ObjectIdentifier(loop)
            if let executor = executors[key] { return executor }
            let executor = EventLoopTaskExecutor(loop)
            executors[key] = executor
            return executor
        }
    }
}

/// Reads of a TCP channel into a bounded queue; reading stops (autoRead off) while the queue is full.
/// Made in a channel initializer and handed to its connection, which touches `context` only on the channel's
/// event loop, as the pipeline does.
final class StreamInboxHandler: ChannelInboundHandler, RemovableChannelHandler, Sendable {
    typealias InboundIn = ByteBuffer
    /// Its name in the pipeline (a WebSocket replaces it with frame handlers after the handshake).
    static let name = "socketstyles.inbox"
    let inbox: ReceiveQueue<[UInt8]>
    let executor: EventLoopTaskExecutor

    /// Its context while it is in the pipeline (loop thread only): a send on the loop writes there, to the head of
    /// the pipeline, instead of through the channel (which checks the thread and starts from the tail).
    let context: NIOLoopBoundBox<ChannelHandlerContext?>

    init(inbox: ReceiveQueue<[UInt8]>, executor: EventLoopTaskExecutor) {
        self.inbox = inbox
        self.executor = executor
        context = .makeEmptyBox(eventLoop: executor.loop)
    }

    func handlerAdded(context: ChannelHandlerContext) { self.context.value = context }

    func handlerRemoved(context: ChannelHandlerContext) { self.context.value = nil }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = Self.unwrapInboundIn(data)
        let bytes = buffer.readBytes(length: buffer.readableBytes) ?? []
        // Reading stops before the waiting task runs: room it then makes turns reading back on.
        executor.delivering {
            if !inbox.push(bytes).hasSpace { try? context.channel.syncOptions?.setOption(.autoRead, value: false) }
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed { inbox.finish(.finished) }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        inbox.finish(.failed(connectionError(error, "read")))
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        inbox.finish(.finished)
        context.fireChannelInactive()
    }
}

/// On a server channel: an accept that fails (out of descriptors) turns reading off for a pause, then on again.
/// SwiftNIO would otherwise retry the accept on every turn of its loop while clients wait in the backlog, one
/// core at 100% (its own AcceptBackoffHandler did not stop that here).
final class AcceptPause: ChannelInboundHandler {
    typealias InboundIn = any Channel
    let pause: TimeAmount
    private var paused = false

    init(pause: TimeAmount) { self.pause = pause }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        context.fireChannelRead(data)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if !paused, let options = context.channel.syncOptions {
            paused = true
            BoundsLog.note(.descriptorLimit, "accepting paused for \(pause.nanoseconds / 1_000_000) ms: \(error)")
            try? options.setOption(.autoRead, value: false)
            let channel = context.channel
            context.eventLoop.assumeIsolated().scheduleTask(in: pause) { [self] in
                paused = false
                try? channel.syncOptions?.setOption(.autoRead, value: true)
            }
        }
        context.fireErrorCaught(error)
    }
}

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
        try sync.setOption(
            .recvAllocator,
            value: AdaptiveRecvByteBufferAllocator(minimum: 64, initial: 2048, maximum: options.readChunkSize))
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

/// Datagrams of a UDP channel into a bounded queue (a datagram that finds it full is dropped), or, for a
/// listener, into a demultiplexer by sender.
final class DatagramInboxHandler: ChannelInboundHandler {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    let deliver: (AddressedEnvelope<ByteBuffer>) -> Void
    let fail: (ConnectionError) -> Void
    let executor: EventLoopTaskExecutor

    init(
        executor: EventLoopTaskExecutor, deliver: @escaping (AddressedEnvelope<ByteBuffer>) -> Void,
        fail: @escaping (ConnectionError) -> Void
    ) {
        self.executor = executor
        self.deliver = deliver
        self.fail = fail
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        executor.delivering { deliver(Self.unwrapInboundIn(data)) }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // ECONNREFUSED (an ICMP port unreachable) leaves the channel open, as it leaves the socket usable.
        fail(connectionError(error, "receive"))
    }
}

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
