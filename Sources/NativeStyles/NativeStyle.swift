public import BenchmarkDriver
public import ConnectionCore
import POSIXSupport
public import SocketStyles

/// An echo server written in one backend's own style (no `Connection`, no `Listener`).
public protocol NativeEchoServer: AnyObject, Sendable {
    /// Where it listens (the real port when 0 was asked).
    var localEndpoint: Endpoint { get }
    /// Stops listening, closes every client, and waits until its threads or loop are gone.
    func stop() async
}

/// Each backend in the style its users would write by hand, for `sockbench compare`'s `native-SIZE`: the same
/// TCP ping-pong as `pingpong-SIZE` with the unified `Connection` taken out on both ends, so the difference is
/// the price of the unified API. Both ends set TCP_NODELAY, as the unified backends do. For nio there is also
/// ws: SwiftNIO's own WebSocket (NIOHTTP1 upgrade + NIOWebSocket frames), the reference for our WebSocket stack.
extension Backend {
    /// How this backend's native ping-pong is written, in a line.
    public var nativeStyle: String {
        switch self {
        case .bsd: "a blocking send/recv loop on a thread of its own; the server a thread per client"
        case .uv: "uv_write and the read callback on a libuv loop thread; the next probe is written from the callback"
        case .runloop:
            "stream delegates on the calling thread's run loop (hasBytesAvailable -> read -> write); the server a delegate per client"
        case .async: "AsyncSocket send/receive in a task on the reactor's executor; the server a task per client"
        case .nio: "ChannelInboundHandlers: channelRead writes the next probe; the server an echo handler"
        }
    }

    /// The transports this backend has a style of its own for: tcp for all; for nio also ws (NIOWebSocket), tls
    /// and wss (swift-nio-ssl).
    public var nativeTransports: [Transport] { self == .nio ? [.tcp, .ws, .tls, .wss] : [.tcp] }

    static func nativeUnsupported(_ transport: Transport) -> ConnectionError {
        ConnectionError(
            .unsupported,
            "native style over \(transport): every backend has one for tcp; only nio has WebSocket and TLS of its own (NIOWebSocket, swift-nio-ssl)"
        )
    }

    /// `warmup` then `count` round trips of `size` bytes to an echo server, written in this backend's own style,
    /// timed by a ``PingPongTally``. `tls` configures the client of tls:// and wss:// (nio only: swift-nio-ssl).
    public func nativePingPong(
        to endpoint: Endpoint, size: Int, count: Int, warmup: Int, tls: TLSConfiguration = TLSConfiguration()
    ) async throws(ConnectionError) -> PingRunner.Result {
        guard nativeTransports.contains(endpoint.transport) else { throw Self.nativeUnsupported(endpoint.transport) }
        let tally = PingPongTally(size: size, count: count, warmup: warmup)
        switch self {
        case .bsd: return try await BSDNative.pingpong(to: endpoint, tally: tally)
        case .uv: return try await UVNative.pingpong(to: endpoint, tally: tally)
        case .runloop: return try await RunLoopNative.pingpong(to: endpoint, tally: tally)
        case .async: return try await AsyncNative.pingpong(to: endpoint, tally: tally)
        case .nio:
            return endpoint.transport == .ws || endpoint.transport == .wss
                ? try await NIOWebSocketNative.pingpong(to: endpoint, tally: tally, tls: tls)
                : try await NIONative.pingpong(to: endpoint, tally: tally, tls: tls)
        }
    }

    /// nio only: `warmup` then `count` TCP round trips of `size` bytes written with SwiftNIO's async/await bridge
    /// (`NIOAsyncChannel`), against ``asyncChannelEchoServer(on:)``.
    public func asyncChannelPingPong(
        to endpoint: Endpoint, size: Int, count: Int, warmup: Int
    ) async throws(ConnectionError) -> PingRunner.Result {
        guard self == .nio, endpoint.transport == .tcp else { throw Self.asyncChannelUnsupported }
        return try await NIOAsyncChannelNative.pingpong(
            to: endpoint, tally: PingPongTally(size: size, count: count, warmup: warmup))
    }

    /// nio only: a TCP echo server written with `NIOAsyncChannel` (a task per connection).
    public func asyncChannelEchoServer(on endpoint: Endpoint) async throws(ConnectionError) -> any NativeEchoServer {
        guard self == .nio, endpoint.transport == .tcp else { throw Self.asyncChannelUnsupported }
        return try await NIOAsyncChannelEchoServer.start(on: endpoint)
    }

    static let asyncChannelUnsupported = ConnectionError(
        .unsupported, "NIOAsyncChannel is SwiftNIO's: the asyncchannel style is nio over tcp only")

    /// An echo server written in this backend's own style (tcp; for nio also ws, tls and wss).
    /// `tls` names the certificate chain and key of a tls:// or wss:// server (nio only: swift-nio-ssl).
    public func nativeEchoServer(
        on endpoint: Endpoint, tls: TLSConfiguration? = nil
    ) async throws(ConnectionError) -> any NativeEchoServer {
        guard nativeTransports.contains(endpoint.transport) else { throw Self.nativeUnsupported(endpoint.transport) }
        switch self {
        case .bsd: return try BSDNativeEchoServer(on: endpoint)
        case .uv: return try await UVNativeEchoServer.start(on: endpoint)
        case .runloop: return try await RunLoopNativeEchoServer.start(on: endpoint)
        case .async: return try AsyncNativeEchoServer(on: endpoint)
        case .nio:
            return endpoint.transport == .ws || endpoint.transport == .wss
                ? try await NIOWebSocketNativeEchoServer.start(on: endpoint, tls: tls)
                : try await NIONativeEchoServer.start(on: endpoint, tls: tls)
        }
    }
}

/// Runs `body` on a new thread and returns what it returned (for styles that block or turn a loop).
func onOwnThread<T: Sendable>(
    name: String, _ body: @escaping @Sendable () -> Result<T, ConnectionError>
) async throws(ConnectionError) -> T {
    let result = await withCheckedContinuation {
        (continuation: CheckedContinuation<Result<T, ConnectionError>, Never>) in
        PosixThread.spawn(name: name) { continuation.resume(returning: body()) }
    }
    return try result.get()
}
