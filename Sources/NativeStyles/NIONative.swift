import BenchmarkDriver
import ConnectionCore
import NIOBackend
import NIOCore
import NIOPosix
import NIOSSL
import POSIXSupport
import Synchronization
import TLSTransport

/// SwiftNIO by hand: a `ChannelInboundHandler` on the client writes the next probe from `channelRead`; the
/// server's handler writes back what it reads and flushes at the end of each read burst. The same one-thread
/// event loop group as the `nio` backend.
enum NIONative {
    /// What the tcp and ws ping handlers share: the tally, the promise, and finishing exactly once. Subclasses
    /// write probes (``write(_:)``) and may end differently (``finish(_:_:)``).
    class PingHandlerBase {
        let tally: PingPongTally
        let promise: EventLoopPromise<PingRunner.Result>
        private(set) var done = false

        init(tally: PingPongTally, promise: EventLoopPromise<PingRunner.Result>) {
            self.tally = tally
            self.promise = promise
        }

        /// Writes `tally.next()` in the subclass's framing.
        func write(_ context: ChannelHandlerContext) {}

        /// Echoed bytes: the next probe, or the end.
        func take(_ buffer: ByteBuffer, _ context: ChannelHandlerContext) {
            guard !done else { return }
            let step = buffer.withUnsafeReadableBytes { bytes in
                Result { () throws(ConnectionError) in try tally.consume(bytes) }
            }
            switch step {
            case .success(.needMore): break
            case .success(.echoed): write(context)
            case .success(.finished): finish(context, .success(tally.result()))
            case .failure(let error): finish(context, .failure(error))
            }
        }

        /// Settles the promise once; `false` when it already was.
        func settle(_ result: Result<PingRunner.Result, ConnectionError>) -> Bool {
            guard !done else { return false }
            done = true
            switch result {
            case .success(let value): promise.succeed(value)
            case .failure(let error): promise.fail(error)
            }
            return true
        }

        /// Settles and closes the channel.
        func finish(_ context: ChannelHandlerContext, _ result: Result<PingRunner.Result, ConnectionError>) {
            if settle(result) { context.close(promise: nil) }
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            finish(context, .failure(NIOSSLNative.error(error, "read")))
        }

        func channelInactive(context: ChannelHandlerContext) {
            finish(context, .failure(.closed("the server ended the connection")))
            context.fireChannelInactive()
        }
    }

    /// Plain tcp: each probe is written as is; `channelRead` takes the echo and writes the next.
    final class PingHandler: PingHandlerBase, ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer

        func channelActive(context: ChannelHandlerContext) {
            write(context)
            context.fireChannelActive()
        }

        override func write(_ context: ChannelHandlerContext) {
            let buffer = context.channel.allocator.buffer(bytes: tally.next())
            context.writeAndFlush(Self.wrapOutboundOut(buffer), promise: nil)
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            take(Self.unwrapInboundIn(data), context)
        }
    }

    /// tcp, or tls (swift-nio-ssl's handler in front of the ping handler, configured from `tls`).
    static func pingpong(
        to endpoint: Endpoint, tally: PingPongTally, tls: TLSTransport.TLSConfiguration
    ) async throws(ConnectionError)
        -> PingRunner.Result
    {
        let address = try nioAddress(try await Syscall.resolveAsync(endpoint)[0], doing: "connect to \(endpoint)")
        let group = NIOBackend.sharedGroup
        let promise = group.next().makePromise(of: PingRunner.Result.self)
        let secure = endpoint.transport.isSecure
        let bootstrap = ClientBootstrap(group: promise.futureResult.eventLoop)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if secure {
                        try channel.pipeline.syncOperations.addHandler(
                            try NIOSSLNative.clientHandler(for: endpoint, tls: tls))
                    }
                    try channel.pipeline.syncOperations.addHandler(PingHandler(tally: tally, promise: promise))
                }
            }
        return try await run(bootstrap, to: address, endpoint: endpoint, promise: promise)
    }

    /// Connects with `bootstrap` (whose handler completes `promise` and then closes the channel) and waits for
    /// the result and the close.
    static func run(
        _ bootstrap: ClientBootstrap, to address: NIOCore.SocketAddress, endpoint: Endpoint,
        promise: EventLoopPromise<PingRunner.Result>
    ) async throws(ConnectionError) -> PingRunner.Result {
        let channel: any Channel
        do {
            channel = try await bootstrap.connect(to: address).get()
        } catch {
            promise.fail(error)
            throw NIOSSLNative.error(error, "connect to \(endpoint)")
        }
        do {
            let result = try await promise.futureResult.get()
            try? await channel.closeFuture.get()
            return result
        } catch {
            try? await channel.closeFuture.get()
            throw NIOSSLNative.error(error, "ping-pong with \(endpoint)")
        }
    }
}

/// A `ServerBootstrap` whose child channels get the pipeline `configure` builds: an echo handler (tcp) or
/// NIOHTTP1 + NIOWebSocket's upgrader (ws). Tracks the children so that ``stop()`` closes them.
final class NIONativeEchoServer: NativeEchoServer, Sendable {
    final class EchoHandler: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            context.write(data, promise: nil)
        }

        func channelReadComplete(context: ChannelHandlerContext) {
            context.flush()
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            context.close(promise: nil)
        }
    }

    let localEndpoint: Endpoint
    private let serverChannel: any Channel
    private let children: ChannelGroup

    private init(serverChannel: any Channel, children: ChannelGroup, endpoint asked: Endpoint) {
        self.serverChannel = serverChannel
        self.children = children
        let bound = endpoint(serverChannel.localAddress, .tcp)
        localEndpoint = Endpoint(transport: asked.transport, host: bound.host, port: bound.port, path: asked.path)
    }

    /// The accepted channels, so that ``stop()`` can close them.
    final class ChannelGroup: Sendable {
        private let channels = Guarded<[ObjectIdentifier: any Channel]>([:])

        func add(_ channel: any Channel) {
            let key = ObjectIdentifier(channel)
            channels.withLock { $0[key] = channel }
            channel.closeFuture.whenComplete { [self] _ in channels.withLock { $0[key] = nil } }
        }

        var all: [any Channel] { channels.withLock { Array($0.values) } }
    }

    /// The tcp echo server, or the tls one (swift-nio-ssl with the chain and key `tls` names).
    static func start(
        on endpoint: Endpoint, tls: TLSTransport.TLSConfiguration?
    ) async throws(ConnectionError) -> NIONativeEchoServer {
        try await start(on: endpoint, tls: tls) { channel in
            try channel.pipeline.syncOperations.addHandler(EchoHandler())
        }
    }

    /// Listens on `endpoint`; `configure` sets up each accepted channel's pipeline (on its event loop), behind a
    /// swift-nio-ssl server handler when the transport is tls or wss.
    static func start(
        on endpoint: Endpoint, tls: TLSTransport.TLSConfiguration?,
        configure: @escaping @Sendable (any Channel) throws -> Void
    ) async throws(ConnectionError) -> NIONativeEchoServer {
        let sslContext: NIOSSLContext?
        if endpoint.transport.isSecure {
            guard let tls else {
                throw ConnectionError(.tls, "a \(endpoint.transport):// server needs a certificate and a key")
            }
            sslContext = try NIOSSLNative.serverContext(tls)
        } else {
            sslContext = nil
        }
        let address = try nioAddress(
            try await Syscall.resolveAsync(endpoint, passive: true)[0], doing: "listen on \(endpoint)")
        let children = ChannelGroup()
        let bootstrap = ServerBootstrap(group: NIOBackend.sharedGroup)
            .serverChannelOption(.backlog, value: 511)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                children.add(channel)
                return channel.eventLoop.makeCompletedFuture {
                    if let sslContext {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: sslContext))
                    }
                    try configure(channel)
                }
            }
        do {
            let channel = try await bootstrap.bind(to: address).get()
            return NIONativeEchoServer(serverChannel: channel, children: children, endpoint: endpoint)
        } catch {
            throw connectionError(error, "listen on \(endpoint)")
        }
    }

    func stop() async {
        try? await serverChannel.close().get()
        for channel in children.all {
            try? await channel.close().get()
        }
    }
}

/// A relay as SwiftNIO channel handlers: each accepted channel connects a client channel upstream on the same
/// event loop, and a pair of ``Glue`` handlers joins the two pipelines: what one reads the other writes, a read
/// is only asked for while the partner is writable (so a slow reader at either end stops reading at the other,
/// within NIO's write-buffer watermarks), and half-closure is allowed on both, so an input closed on one side
/// becomes `close(mode: .output)` (a FIN) on the other.
final class NIONativeRelay: NativeRelay, Sendable {
    /// One end of the glue; the pair is made together and each lives in its own channel's pipeline, on the same
    /// event loop.
    final class Glue: ChannelDuplexHandler {
        typealias InboundIn = NIOAny
        typealias OutboundIn = NIOAny
        typealias OutboundOut = NIOAny

        private var partner: Glue?
        private var context: ChannelHandlerContext?
        private var readWanted = false

        static func pair() -> (Glue, Glue) {
            let (first, second) = (Glue(), Glue())
            first.partner = second
            second.partner = first
            return (first, second)
        }

        func handlerAdded(context: ChannelHandlerContext) { self.context = context }

        func handlerRemoved(context: ChannelHandlerContext) {
            self.context = nil
            partner = nil
        }

        // What the partner asks of this end.
        private var isWritable: Bool { context?.channel.isWritable ?? false }
        private func write(_ data: NIOAny) { context?.write(data, promise: nil) }
        private func flush() { context?.flush() }
        private func closeOutput() { context?.close(mode: .output, promise: nil) }
        private func close() { context?.close(promise: nil) }
        private func partnerBecameWritable() {
            guard readWanted, let context else { return }
            readWanted = false
            context.read()
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) { partner?.write(data) }
        func channelReadComplete(context: ChannelHandlerContext) { partner?.flush() }
        func channelInactive(context: ChannelHandlerContext) { partner?.close() }
        func errorCaught(context: ChannelHandlerContext, error: any Error) { context.close(promise: nil) }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if case .some(ChannelEvent.inputClosed) = event as? ChannelEvent {
                partner?.closeOutput()
            }
            context.fireUserInboundEventTriggered(event)
        }

        func channelWritabilityChanged(context: ChannelHandlerContext) {
            if context.channel.isWritable { partner?.partnerBecameWritable() }
        }

        func read(context: ChannelHandlerContext) {
            if partner?.isWritable ?? false {
                context.read()
            } else {
                readWanted = true
            }
        }
    }

    let localEndpoint: Endpoint
    private let serverChannel: any Channel
    private let children: NIONativeEchoServer.ChannelGroup
    private let accepted: ClientCounter

    var clients: Int { accepted.value }

    private init(
        serverChannel: any Channel, children: NIONativeEchoServer.ChannelGroup, accepted: ClientCounter
    ) {
        self.serverChannel = serverChannel
        self.children = children
        self.accepted = accepted
        localEndpoint = endpoint(serverChannel.localAddress, .tcp)
    }

    static func start(listen: Endpoint, upstream: Endpoint) async throws(ConnectionError) -> NIONativeRelay {
        let address = try nioAddress(
            try await Syscall.resolveAsync(listen, passive: true)[0], doing: "listen on \(listen)")
        let upstreamAddress = try nioAddress(
            try await Syscall.resolveAsync(upstream)[0], doing: "resolve \(upstream)")
        let children = NIONativeEchoServer.ChannelGroup()
        let accepted = ClientCounter()
        let bootstrap = ServerBootstrap(group: NIOBackend.sharedGroup)
            .serverChannelOption(.backlog, value: 511)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelInitializer { client in
                accepted.increment()
                children.add(client)
                return ClientBootstrap(group: client.eventLoop)
                    .channelOption(.socketOption(.tcp_nodelay), value: 1)
                    .channelOption(.allowRemoteHalfClosure, value: true)
                    .connect(to: upstreamAddress)
                    .flatMapThrowing { server in
                        children.add(server)
                        let (clientSide, serverSide) = Glue.pair()
                        try client.pipeline.syncOperations.addHandler(clientSide)
                        try server.pipeline.syncOperations.addHandler(serverSide)
                    }
            }
        do {
            let channel = try await bootstrap.bind(to: address).get()
            return NIONativeRelay(serverChannel: channel, children: children, accepted: accepted)
        } catch {
            throw connectionError(error, "listen on \(listen)")
        }
    }

    func stop() async {
        try? await serverChannel.close().get()
        for channel in children.all {
            try? await channel.close().get()
        }
    }
}
