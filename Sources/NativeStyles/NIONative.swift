import BenchmarkDriver
import ConnectionCore
import NIOBackend
import NIOCore
import NIOPosix
import POSIXSupport
import Synchronization

/// SwiftNIO by hand: a `ChannelInboundHandler` on the client writes the next probe from `channelRead`; the
/// server's handler writes back what it reads and flushes at the end of each read burst. The same one-thread
/// event loop group as the `nio` backend.
enum NIONative {
    final class PingHandler: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer
        let tally: PingPongTally
        let promise: EventLoopPromise<PingRunner.Result>
        var done = false

        init(tally: PingPongTally, promise: EventLoopPromise<PingRunner.Result>) {
            self.tally = tally
            self.promise = promise
        }

        func channelActive(context: ChannelHandlerContext) {
            write(context)
            context.fireChannelActive()
        }

        func write(_ context: ChannelHandlerContext) {
            let buffer = context.channel.allocator.buffer(bytes: tally.next())
            context.writeAndFlush(Self.wrapOutboundOut(buffer), promise: nil)
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            guard !done else { return }
            let buffer = Self.unwrapInboundIn(data)
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

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            finish(context, .failure(connectionError(error, "read")))
        }

        func channelInactive(context: ChannelHandlerContext) {
            finish(context, .failure(.closed("the server ended the connection")))
            context.fireChannelInactive()
        }

        func finish(_ context: ChannelHandlerContext, _ result: Result<PingRunner.Result, ConnectionError>) {
            guard !done else { return }
            done = true
            switch result {
            case .success(let value): promise.succeed(value)
            case .failure(let error): promise.fail(error)
            }
            context.close(promise: nil)
        }
    }

    static func pingpong(
        to endpoint: Endpoint, tally: PingPongTally
    ) async throws(ConnectionError)
        -> PingRunner.Result
    {
        let address = try nioAddress(try await Syscall.resolveAsync(endpoint)[0], doing: "connect to \(endpoint)")
        let group = NIOBackend.sharedGroup
        let promise = group.next().makePromise(of: PingRunner.Result.self)
        let bootstrap = ClientBootstrap(group: promise.futureResult.eventLoop)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(PingHandler(tally: tally, promise: promise))
                }
            }
        let channel: any Channel
        do {
            channel = try await bootstrap.connect(to: address).get()
        } catch {
            promise.fail(error)
            throw connectionError(error, "connect to \(endpoint)")
        }
        do {
            let result = try await promise.futureResult.get()
            try? await channel.closeFuture.get()
            return result
        } catch {
            try? await channel.closeFuture.get()
            throw connectionError(error, "ping-pong")
        }
    }
}

/// `ServerBootstrap` with an echo handler per child channel.
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

    private init(serverChannel: any Channel, children: ChannelGroup) {
        self.serverChannel = serverChannel
        self.children = children
        localEndpoint = endpoint(serverChannel.localAddress, .tcp)
    }

    /// The accepted channels, so that ``stop()`` can close them.
    final class ChannelGroup: Sendable {
        private let channels = Mutex<[ObjectIdentifier: any Channel]>([:])

        func add(_ channel: any Channel) {
            let key = ObjectIdentifier(channel)
            channels.withLock { $0[key] = channel }
            channel.closeFuture.whenComplete { [self] _ in channels.withLock { $0[key] = nil } }
        }

        var all: [any Channel] { channels.withLock { Array($0.values) } }
    }

    static func start(on endpoint: Endpoint) async throws(ConnectionError) -> NIONativeEchoServer {
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
                    try channel.pipeline.syncOperations.addHandler(EchoHandler())
                }
            }
        do {
            let channel = try await bootstrap.bind(to: address).get()
            return NIONativeEchoServer(serverChannel: channel, children: children)
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
