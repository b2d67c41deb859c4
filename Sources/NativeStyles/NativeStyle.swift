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
/// One backend's own style: what `nativePingPong` and `nativeEchoServer` run for it. The styles are written here,
/// beside the package's backends, not in their modules (they measure against BenchmarkDriver's tally, and nio's
/// uses swift-nio-ssl); a backend without an entry has no native style, and compare leaves its native rows out.
struct NativeStyleEntry: Sendable {
    /// How the native ping-pong is written, in a line.
    let line: String
    /// The transports it has a style of its own for.
    let transports: [Transport]
    let pingpong:
        @Sendable (_ endpoint: Endpoint, _ tally: PingPongTally, _ tls: TLSConfiguration) async throws(ConnectionError)
            -> PingRunner.Result
    let echoServer:
        @Sendable (_ endpoint: Endpoint, _ tls: TLSConfiguration?) async throws(ConnectionError) ->
            any NativeEchoServer
    /// How its TCP relay is written, in a line.
    let relayLine: String
    let relay: @Sendable (_ listen: Endpoint, _ upstream: Endpoint) async throws(ConnectionError) -> any NativeRelay

    static let entries: [Backend: NativeStyleEntry] = [
        .bsd: NativeStyleEntry(
            line: "a blocking send/recv loop on a thread of its own; the server a thread per client",
            transports: [.tcp],
            pingpong: { endpoint, tally, _ throws(ConnectionError) in
                try await BSDNative.pingpong(to: endpoint, tally: tally)
            },
            echoServer: { endpoint, _ throws(ConnectionError) in try BSDNativeEchoServer(on: endpoint) },
            relayLine: "two threads per client, each a blocking recv -> send loop; shutdown(SHUT_WR) carries a FIN",
            relay: { listen, upstream throws(ConnectionError) in
                try await BSDNativeRelay.start(listen: listen, upstream: upstream)
            }),
        .uv: NativeStyleEntry(
            line: "uv_write and the read callback on a libuv loop thread; the next probe is written from the callback",
            transports: [.tcp],
            pingpong: { endpoint, tally, _ throws(ConnectionError) in
                try await UVNative.pingpong(to: endpoint, tally: tally)
            },
            echoServer: { endpoint, _ throws(ConnectionError) in try await UVNativeEchoServer.start(on: endpoint) },
            relayLine:
                "read callbacks write to the other handle; uv_read_stop while its write queue is long; uv_shutdown",
            relay: { listen, upstream throws(ConnectionError) in
                try await UVNativeRelay.start(listen: listen, upstream: upstream)
            }),
        .runloop: NativeStyleEntry(
            line:
                "stream delegates on the calling thread's run loop (hasBytesAvailable -> read -> write); the server a delegate per client",
            transports: [.tcp],
            pingpong: { endpoint, tally, _ throws(ConnectionError) in
                try await RunLoopNative.pingpong(to: endpoint, tally: tally)
            },
            echoServer: { endpoint, _ throws(ConnectionError) in
                try await RunLoopNativeEchoServer.start(on: endpoint)
            },
            relayLine:
                "stream delegates: hasBytesAvailable reads and writes on, hasSpaceAvailable flushes what was left",
            relay: { listen, upstream throws(ConnectionError) in
                try await RunLoopNativeRelay.start(listen: listen, upstream: upstream)
            }),
        .async: NativeStyleEntry(
            line: "AsyncSocket send/receive in a task on the reactor's executor; the server a task per client",
            transports: [.tcp],
            pingpong: { endpoint, tally, _ throws(ConnectionError) in
                try await AsyncNative.pingpong(to: endpoint, tally: tally)
            },
            echoServer: { endpoint, _ throws(ConnectionError) in try AsyncNativeEchoServer(on: endpoint) },
            relayLine: "AsyncSocket: a task per direction, receive -> send, then closeOutput",
            relay: { listen, upstream throws(ConnectionError) in
                try AsyncNativeRelay(listen: listen, upstream: upstream)
            }),
        .uring: NativeStyleEntry(
            line:
                "UringSocket: send from a buffer it owns, receive into another, each one ring entry awaited to completion",
            transports: [.tcp],
            pingpong: { endpoint, tally, _ throws(ConnectionError) in
                try await UringNative.pingpong(to: endpoint, tally: tally)
            },
            echoServer: { endpoint, _ throws(ConnectionError) in try await UringNativeEchoServer.start(on: endpoint) },
            relayLine: "UringSocket: a task per direction, receive into a buffer -> send from it, then closeOutput",
            relay: { listen, upstream throws(ConnectionError) in
                try await UringNativeRelay.start(listen: listen, upstream: upstream)
            }),
        .nio: NativeStyleEntry(
            line: "ChannelInboundHandlers: channelRead writes the next probe; the server an echo handler",
            transports: [.tcp, .ws, .tls, .wss],
            pingpong: { endpoint, tally, tls throws(ConnectionError) in
                endpoint.transport == .ws || endpoint.transport == .wss
                    ? try await NIOWebSocketNative.pingpong(to: endpoint, tally: tally, tls: tls)
                    : try await NIONative.pingpong(to: endpoint, tally: tally, tls: tls)
            },
            echoServer: { endpoint, tls throws(ConnectionError) in
                endpoint.transport == .ws || endpoint.transport == .wss
                    ? try await NIOWebSocketNativeEchoServer.start(on: endpoint, tls: tls)
                    : try await NIONativeEchoServer.start(on: endpoint, tls: tls)
            },
            relayLine:
                "a glue handler per channel: channelRead writes to the partner, read() only while it is writable",
            relay: { listen, upstream throws(ConnectionError) in
                try await NIONativeRelay.start(listen: listen, upstream: upstream)
            }),
    ]
}

extension Backend {
    /// How this backend's native ping-pong is written, in a line (empty when it has no native style).
    public var nativeStyle: String { NativeStyleEntry.entries[self]?.line ?? "" }

    /// The transports this backend has a style of its own for: tcp for the package's backends; for nio also ws
    /// (NIOWebSocket), tls and wss (swift-nio-ssl); none for a backend registered from outside.
    public var nativeTransports: [Transport] { NativeStyleEntry.entries[self]?.transports ?? [] }

    func nativeUnsupported(_ transport: Transport) -> ConnectionError {
        guard NativeStyleEntry.entries[self] != nil else {
            return ConnectionError(.unsupported, "\(name) has no native style of its own")
        }
        return ConnectionError(
            .unsupported,
            "native style over \(transport): every backend has one for tcp; only nio has WebSocket and TLS of its own (NIOWebSocket, swift-nio-ssl)"
        )
    }

    /// `warmup` then `count` round trips of `size` bytes to an echo server, written in this backend's own style,
    /// timed by a ``PingPongTally``. `tls` configures the client of tls:// and wss:// (nio only: swift-nio-ssl).
    public func nativePingPong(
        to endpoint: Endpoint, size: Int, count: Int, warmup: Int, tls: TLSConfiguration = TLSConfiguration()
    ) async throws(ConnectionError) -> PingRunner.Result {
        guard let entry = NativeStyleEntry.entries[self], entry.transports.contains(endpoint.transport) else {
            throw nativeUnsupported(endpoint.transport)
        }
        return try await entry.pingpong(endpoint, PingPongTally(size: size, count: count, warmup: warmup), tls)
    }

    /// Whether this backend has the async/await-bridge style (`asyncchannel-SIZE` rows): nio, over tcp.
    public var hasAsyncChannelStyle: Bool { self == .nio }

    /// nio only: `warmup` then `count` TCP round trips of `size` bytes written with SwiftNIO's async/await bridge
    /// (`NIOAsyncChannel`), against ``asyncChannelEchoServer(on:)``.
    public func asyncChannelPingPong(
        to endpoint: Endpoint, size: Int, count: Int, warmup: Int
    ) async throws(ConnectionError) -> PingRunner.Result {
        guard hasAsyncChannelStyle, endpoint.transport == .tcp else { throw Self.asyncChannelUnsupported }
        return try await NIOAsyncChannelNative.pingpong(
            to: endpoint, tally: PingPongTally(size: size, count: count, warmup: warmup))
    }

    /// nio only: a TCP echo server written with `NIOAsyncChannel` (a task per connection).
    public func asyncChannelEchoServer(on endpoint: Endpoint) async throws(ConnectionError) -> any NativeEchoServer {
        guard hasAsyncChannelStyle, endpoint.transport == .tcp else { throw Self.asyncChannelUnsupported }
        return try await NIOAsyncChannelEchoServer.start(on: endpoint)
    }

    static let asyncChannelUnsupported = ConnectionError(
        .unsupported, "NIOAsyncChannel is SwiftNIO's: the asyncchannel style is nio over tcp only")

    /// An echo server written in this backend's own style (tcp; for nio also ws, tls and wss).
    /// `tls` names the certificate chain and key of a tls:// or wss:// server (nio only: swift-nio-ssl).
    public func nativeEchoServer(
        on endpoint: Endpoint, tls: TLSConfiguration? = nil
    ) async throws(ConnectionError) -> any NativeEchoServer {
        guard let entry = NativeStyleEntry.entries[self], entry.transports.contains(endpoint.transport) else {
            throw nativeUnsupported(endpoint.transport)
        }
        return try await entry.echoServer(endpoint, tls)
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
