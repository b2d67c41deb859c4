import BenchmarkDriver
import ConnectionCore
import SocketStyles
import Synchronization

/// Style 4 by hand: `AsyncSocket` send and receive in a task that prefers the reactor's executor (so a ready
/// socket resumes it on the reactor thread, no hop).
enum AsyncNative {
    static func pingpong(
        to endpoint: Endpoint, tally: PingPongTally
    ) async throws(ConnectionError)
        -> PingRunner.Result
    {
        let socket = AsyncSocket(to: endpoint)
        let result: Result<PingRunner.Result, ConnectionError> = await withTaskExecutorPreference(socket.reactor) {
            do throws(ConnectionError) {
                try await socket.start()
                while true {
                    try await socket.send(tally.next())
                    var step = PingPongTally.Step.needMore
                    while step == .needMore {
                        guard let bytes = try await socket.receive() else {
                            throw .closed("the server ended the connection")
                        }
                        step = try tally.consume(bytes)
                    }
                    if step == .finished { return .success(tally.result()) }
                }
            } catch {
                return .failure(error)
            }
        }
        await socket.close()
        return try result.get()
    }
}

/// An `AsyncListener` and a task per client that sends back what it receives.
final class AsyncNativeEchoServer: NativeEchoServer, Sendable {
    let localEndpoint: Endpoint
    private let listener: AsyncListener
    private let clients = TaskPerClient<AsyncSocket>()

    init(on endpoint: Endpoint) throws(ConnectionError) {
        listener = try AsyncListener(on: endpoint)
        localEndpoint = listener.localEndpoint
        clients.start(on: listener.reactor, accept: { [listener] in try? await listener.accept() }) { [self] in
            await echo($0)
        }
    }

    private func echo(_ client: AsyncSocket) async {
        do throws(ConnectionError) {
            while let bytes = try await client.receive() {
                try await client.send(bytes)
            }
        } catch {}
        clients.closed(client)
        await client.close()
    }

    func stop() async {
        await listener.close()
        await clients.stop { await $0.close() }
    }
}

/// A relay as async/await code: an `AsyncListener`, and per client an upstream `AsyncSocket` and a task per
/// direction that receives and sends on. A send that waits for room keeps that direction from receiving, so
/// a slow reader slows the other end through TCP flow control.
final class AsyncNativeRelay: NativeRelay, Sendable {
    let localEndpoint: Endpoint
    private let listener: AsyncListener
    private let sockets = TaskPerClient<AsyncSocket>()

    var clients: Int { sockets.acceptedCount }

    init(listen: Endpoint, upstream: Endpoint) throws(ConnectionError) {
        listener = try AsyncListener(on: listen)
        localEndpoint = listener.localEndpoint
        sockets.start(on: listener.reactor, accept: { [listener] in try? await listener.accept() }) { [self] in
            await relay($0, to: upstream)
        }
    }

    private func relay(_ client: AsyncSocket, to upstream: Endpoint) async {
        let server = AsyncSocket(to: upstream, reactor: listener.reactor)
        let both = [client, server]
        sockets.opened(server)
        defer { for socket in both { sockets.closed(socket) } }
        do throws(ConnectionError) {
            try await server.start()
            await withDiscardingTaskGroup { group in
                group.addTask { await relayOneWay(from: client, to: server) }
                group.addTask { await relayOneWay(from: server, to: client) }
            }
        } catch {}
        for socket in both { await socket.close() }
    }

    /// One direction: what `source` sends goes to `sink`; its FIN becomes `sink`'s FIN. An error ends both.
    private static func pump(from source: AsyncSocket, to sink: AsyncSocket) async {
        do throws(ConnectionError) {
            while let bytes = try await source.receive(maximumLength: 64 * 1024) {
                try await sink.send(bytes)
            }
            try await sink.closeOutput()
        } catch {
            await source.close()
            await sink.close()
        }
    }

    func stop() async {
        await listener.close()
        await sockets.stop { await $0.close() }
    }
}
