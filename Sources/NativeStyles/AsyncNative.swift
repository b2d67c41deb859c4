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
    private let acceptor: Mutex<Task<Void, Never>?> = Mutex(nil)
    private let clients = Mutex<[ObjectIdentifier: AsyncSocket]>([:])

    init(on endpoint: Endpoint) throws(ConnectionError) {
        listener = try AsyncListener(on: endpoint)
        localEndpoint = listener.localEndpoint
        let task = Task(executorPreference: listener.reactor) { [self] in
            await withDiscardingTaskGroup { group in
                while let client = try? await listener.accept() {
                    clients.withLock { $0[ObjectIdentifier(client)] = client }
                    group.addTask { await self.echo(client) }
                }
            }
        }
        acceptor.withLock { $0 = task }
    }

    private func echo(_ client: AsyncSocket) async {
        do throws(ConnectionError) {
            while let bytes = try await client.receive() {
                try await client.send(bytes)
            }
        } catch {}
        clients.withLock { _ = $0.removeValue(forKey: ObjectIdentifier(client)) }
        await client.close()
    }

    func stop() async {
        await listener.close()
        for client in clients.withLock({ Array($0.values) }) { await client.close() }
        await acceptor.withLock { $0 }?.value
    }
}
