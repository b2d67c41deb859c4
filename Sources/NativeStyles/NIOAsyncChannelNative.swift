import BenchmarkDriver
import ConnectionCore
import NIOBackend
import NIOCore
import NIOPosix
import POSIXSupport
import Synchronization

/// SwiftNIO through its own async/await bridge, as its documentation shows a new user: `NIOAsyncChannel` on both
/// ends, the client a task that writes each probe with the outbound writer and reads the echo from the inbound
/// sequence, the server a task per connection that writes back what it reads. The tasks run where Swift puts
/// them (the global executor); NIO's event loop hands each read to them through the bridge's buffer. This is
/// the reference for `async` written by hand, and the `asyncchannel-SIZE` scenario of `sockbench compare`.
enum NIOAsyncChannelNative {
    typealias Bridged = NIOAsyncChannel<ByteBuffer, ByteBuffer>

    static func pingpong(
        to endpoint: Endpoint, tally: PingPongTally
    ) async throws(ConnectionError)
        -> PingRunner.Result
    {
        let address = try nioAddress(try await Syscall.resolveAsync(endpoint)[0], doing: "connect to \(endpoint)")
        let channel: Bridged
        do {
            channel = try await ClientBootstrap(group: NIOBackend.sharedGroup)
                .channelOption(.socketOption(.tcp_nodelay), value: 1)
                .connect(to: address) { channel in
                    channel.eventLoop.makeCompletedFuture { try Bridged(wrappingChannelSynchronously: channel) }
                }
        } catch {
            throw connectionError(error, "connect to \(endpoint)")
        }
        do {
            return try await channel.executeThenClose { inbound, outbound in
                var echoes = inbound.makeAsyncIterator()
                while !tally.isFinished {
                    try await outbound.write(ByteBuffer(bytes: tally.next()))
                    var step = PingPongTally.Step.needMore
                    while step == .needMore {
                        guard let buffer = try await echoes.next() else {
                            throw ConnectionError(.closed, "the server ended the connection")
                        }
                        step = try buffer.withUnsafeReadableBytes { bytes in try tally.consume(bytes) }
                    }
                }
                return tally.result()
            }
        } catch {
            throw connectionError(error, "ping-pong with \(endpoint)")
        }
    }
}

/// The echo server of ``NIOAsyncChannelNative``: the server channel's inbound sequence of connections, a child
/// task per connection in a discarding task group.
final class NIOAsyncChannelEchoServer: NativeEchoServer, Sendable {
    let localEndpoint: Endpoint
    private let serverChannel: any Channel
    private let serving: Task<Void, Never>

    private init(serverChannel: any Channel, serving: Task<Void, Never>, endpoint asked: Endpoint) {
        self.serverChannel = serverChannel
        self.serving = serving
        localEndpoint = endpoint(serverChannel.localAddress, asked.transport)
    }

    static func start(on endpoint: Endpoint) async throws(ConnectionError) -> NIOAsyncChannelEchoServer {
        let address = try nioAddress(
            try await Syscall.resolveAsync(endpoint, passive: true)[0], doing: "listen on \(endpoint)")
        let server: NIOAsyncChannel<NIOAsyncChannelNative.Bridged, Never>
        do {
            server = try await ServerBootstrap(group: NIOBackend.sharedGroup)
                .serverChannelOption(.backlog, value: 511)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
                .bind(to: address) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try NIOAsyncChannelNative.Bridged(wrappingChannelSynchronously: channel)
                    }
                }
        } catch {
            throw connectionError(error, "listen on \(endpoint)")
        }
        let serverChannel = server.channel
        let serving = Task<Void, Never> {
            // Ends when the server channel closes (stop()): its inbound sequence finishes, the group waits for
            // the connections, which stop() has closed too.
            _ = try? await withThrowingDiscardingTaskGroup { group in
                try await server.executeThenClose { connections in
                    for try await connection in connections {
                        group.addTask {
                            try? await connection.executeThenClose { inbound, outbound in
                                for try await buffer in inbound { try await outbound.write(buffer) }
                            }
                        }
                    }
                }
            }
        }
        return NIOAsyncChannelEchoServer(serverChannel: serverChannel, serving: serving, endpoint: endpoint)
    }

    func stop() async {
        try? await serverChannel.close().get()
        serving.cancel()
        await serving.value
    }
}
