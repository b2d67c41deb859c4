import BenchmarkDriver
import ConnectionCore
import NIOBackend
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOWebSocket
import POSIXSupport
import TLSTransport

/// SwiftNIO's own WebSocket (NIOHTTP1's upgrade handlers + NIOWebSocket's frame codec) by hand: what a SwiftNIO
/// user would write for ws://. The reference row for our WebSocket stack in `native-SIZE` over ws.
///
/// Both ends accept frames up to 64 MiB (NIOWebSocket's default is 16 KiB) to match ``WebSocketOptions``.
enum NIOWebSocketNative {
    static let maximumFrameSize = 64 << 20

    /// Sends the upgrade request once the channel is active; a response that reaches it means the server
    /// refused the upgrade.
    final class UpgradeRequester: ChannelInboundHandler, RemovableChannelHandler {
        typealias InboundIn = HTTPClientResponsePart
        typealias OutboundOut = HTTPClientRequestPart
        let host: String
        let path: String
        let promise: EventLoopPromise<PingRunner.Result>

        init(host: String, path: String, promise: EventLoopPromise<PingRunner.Result>) {
            self.host = host
            self.path = path
            self.promise = promise
        }

        func channelActive(context: ChannelHandlerContext) {
            var headers = HTTPHeaders()
            headers.add(name: "Host", value: host)
            headers.add(name: "Content-Length", value: "0")
            let head = HTTPRequestHead(version: .http1_1, method: .GET, uri: path, headers: headers)
            context.write(Self.wrapOutboundOut(.head(head)), promise: nil)
            context.writeAndFlush(Self.wrapOutboundOut(.end(nil)), promise: nil)
            context.fireChannelActive()
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            if case .head(let response) = Self.unwrapInboundIn(data) {
                promise.fail(
                    ConnectionError(
                        .protocolViolation, "the server refused the WebSocket upgrade: \(response.status.code)"))
                context.close(promise: nil)
            }
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            promise.fail(NIOSSLNative.error(error, "WebSocket upgrade"))
            context.close(promise: nil)
        }
    }

    /// After the upgrade: sends each probe as one masked binary frame, times its echo (which may come back in
    /// several frames), answers pings, and ends with a close handshake.
    final class PingHandler: NIONative.PingHandlerBase, ChannelInboundHandler {
        typealias InboundIn = WebSocketFrame
        typealias OutboundOut = WebSocketFrame

        func handlerAdded(context: ChannelHandlerContext) {
            write(context)
        }

        override func write(_ context: ChannelHandlerContext) {
            let frame = WebSocketFrame(
                fin: true, opcode: .binary, maskKey: .random(),
                data: context.channel.allocator.buffer(bytes: tally.next()))
            context.writeAndFlush(Self.wrapOutboundOut(frame), promise: nil)
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            guard !done else { return }
            let frame = Self.unwrapInboundIn(data)
            switch frame.opcode {
            case .binary, .continuation, .text:
                take(frame.unmaskedData, context)
            case .ping:
                let pong = WebSocketFrame(fin: true, opcode: .pong, maskKey: .random(), data: frame.unmaskedData)
                context.writeAndFlush(Self.wrapOutboundOut(pong), promise: nil)
            case .connectionClose:
                finish(context, .failure(.closed("the server closed the WebSocket")))
            default:
                break
            }
        }

        /// On success, the close handshake (1000) before closing; on failure, close at once.
        override func finish(_ context: ChannelHandlerContext, _ result: Result<PingRunner.Result, ConnectionError>) {
            guard settle(result) else { return }
            guard case .success = result else { return context.close(promise: nil) }
            var payload = context.channel.allocator.buffer(capacity: 2)
            payload.writeInteger(UInt16(1000))
            let close = WebSocketFrame(fin: true, opcode: .connectionClose, maskKey: .random(), data: payload)
            let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
            context.writeAndFlush(Self.wrapOutboundOut(close)).whenComplete { _ in bound.value.close(promise: nil) }
        }
    }

    /// ws, or wss (swift-nio-ssl's handler in front of the HTTP handlers, configured from `tls`).
    static func pingpong(
        to endpoint: Endpoint, tally: PingPongTally, tls: TLSTransport.TLSConfiguration
    ) async throws(ConnectionError)
        -> PingRunner.Result
    {
        let address = try nioAddress(try await Syscall.resolveAsync(endpoint)[0], doing: "connect to \(endpoint)")
        let loop = NIOBackend.sharedGroup.next()
        let promise = loop.makePromise(of: PingRunner.Result.self)
        let hostHeader = "\(endpoint.host):\(endpoint.port)"
        let path = endpoint.path
        let secure = endpoint.transport.isSecure
        let bootstrap = ClientBootstrap(group: loop)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if secure {
                        try channel.pipeline.syncOperations.addHandler(
                            try NIOSSLNative.clientHandler(for: endpoint, tls: tls))
                    }
                    let requester = UpgradeRequester(host: hostHeader, path: path, promise: promise)
                    let boundRequester = NIOLoopBound(requester, eventLoop: channel.eventLoop)
                    let upgrader = NIOWebSocketClientUpgrader(maxFrameSize: maximumFrameSize) { channel, _ in
                        channel.eventLoop.makeCompletedFuture {
                            try channel.pipeline.syncOperations.addHandler(PingHandler(tally: tally, promise: promise))
                        }
                    }
                    try channel.pipeline.syncOperations.addHTTPClientHandlers(
                        withClientUpgrade: (
                            upgraders: [upgrader],
                            completionHandler: { context in
                                context.pipeline.syncOperations.removeHandler(boundRequester.value, promise: nil)
                            }
                        ))
                    try channel.pipeline.syncOperations.addHandler(requester)
                }
            }
        return try await NIONative.run(bootstrap, to: address, endpoint: endpoint, promise: promise)
    }
}

/// NIOHTTP1's server pipeline and NIOWebSocket's upgrader on each accepted channel; an echo handler per
/// upgraded channel. Requests that are not upgrades get 400 and are closed.
enum NIOWebSocketNativeEchoServer {
    /// Plain HTTP (no upgrade): 400, then close.
    final class RejectHandler: ChannelInboundHandler, RemovableChannelHandler {
        typealias InboundIn = HTTPServerRequestPart
        typealias OutboundOut = HTTPServerResponsePart

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            guard case .end = Self.unwrapInboundIn(data) else { return }
            var headers = HTTPHeaders()
            headers.add(name: "Content-Length", value: "0")
            headers.add(name: "Connection", value: "close")
            context.write(
                Self.wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .badRequest, headers: headers))),
                promise: nil)
            let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
            context.writeAndFlush(Self.wrapOutboundOut(.end(nil))).whenComplete { _ in bound.value.close(promise: nil) }
        }
    }

    /// Echoes data frames as they come (same opcode and fin), answers pings, and answers a close with a close.
    final class EchoHandler: ChannelInboundHandler {
        typealias InboundIn = WebSocketFrame
        typealias OutboundOut = WebSocketFrame
        var closing = false

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let frame = Self.unwrapInboundIn(data)
            switch frame.opcode {
            case .binary, .text, .continuation:
                guard !closing else { return }
                context.write(
                    Self.wrapOutboundOut(
                        WebSocketFrame(fin: frame.fin, opcode: frame.opcode, data: frame.unmaskedData)),
                    promise: nil)
            case .ping:
                context.write(
                    Self.wrapOutboundOut(WebSocketFrame(fin: true, opcode: .pong, data: frame.unmaskedData)),
                    promise: nil)
            case .connectionClose:
                guard !closing else { return context.close(promise: nil) }
                closing = true
                var payload = frame.unmaskedData
                let code = payload.readSlice(length: min(2, payload.readableBytes)) ?? ByteBuffer()
                let close = WebSocketFrame(fin: true, opcode: .connectionClose, data: code)
                let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
                context.writeAndFlush(Self.wrapOutboundOut(close)).whenComplete { _ in bound.value.close(promise: nil) }
            default:
                break
            }
        }

        func channelReadComplete(context: ChannelHandlerContext) {
            context.flush()
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            context.close(promise: nil)
        }
    }

    static func start(
        on endpoint: Endpoint, tls: TLSTransport.TLSConfiguration?
    ) async throws(ConnectionError) -> NIONativeEchoServer {
        try await NIONativeEchoServer.start(on: endpoint, tls: tls) { channel in
            let reject = RejectHandler()
            let boundReject = NIOLoopBound(reject, eventLoop: channel.eventLoop)
            let upgrader = NIOWebSocketServerUpgrader(
                maxFrameSize: NIOWebSocketNative.maximumFrameSize,
                shouldUpgrade: { channel, _ in channel.eventLoop.makeSucceededFuture(HTTPHeaders()) },
                upgradePipelineHandler: { channel, _ in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(EchoHandler())
                    }
                })
            try channel.pipeline.syncOperations.configureHTTPServerPipeline(
                withServerUpgrade: (
                    upgraders: [upgrader],
                    completionHandler: { context in
                        context.pipeline.syncOperations.removeHandler(boundReject.value, promise: nil)
                    }
                ))
            try channel.pipeline.syncOperations.addHandler(reject)
        }
    }
}
