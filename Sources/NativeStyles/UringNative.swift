import BenchmarkDriver
import ConnectionCore
import SocketStyles
import Synchronization

/// Style 5 by hand: `UringSocket` in a task that prefers the ring's executor. Each probe is copied into a buffer
/// the client owns and sent from there (one IORING_OP_SEND), and each reply is received into another (one
/// IORING_OP_RECV the kernel completes with the bytes in place).
enum UringNative {
    static func pingpong(
        to endpoint: Endpoint, tally: PingPongTally
    ) async throws(ConnectionError) -> PingRunner.Result {
        let socket = try await UringSocket.connect(to: endpoint)
        let output = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
        let input = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
        defer {
            output.deallocate()
            input.deallocate()
        }
        let result: Result<PingRunner.Result, ConnectionError> = await withTaskExecutorPreference(socket.loop) {
            do throws(ConnectionError) {
                while true {
                    let probe = tally.next()
                    var sent = 0
                    while sent < probe.count {
                        let chunk = min(output.count, probe.count - sent)
                        probe.withUnsafeBytes {
                            output.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[sent..<sent + chunk]))
                        }
                        try await socket.send(contentsOf: UnsafeRawBufferPointer(rebasing: output[..<chunk]))
                        sent += chunk
                    }
                    var step = PingPongTally.Step.needMore
                    while step == .needMore {
                        guard let count = try await socket.receive(into: input) else {
                            throw .closed("the server ended the connection")
                        }
                        step = try tally.consume(UnsafeRawBufferPointer(rebasing: input[..<count]))
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

    /// One direction or an echo: what `source` receives into `buffer` is sent to `sink` from there, with no copy.
    static func forward(
        from source: UringSocket, to sink: UringSocket, buffer: UnsafeMutableRawBufferPointer
    ) async throws(ConnectionError) {
        while let count = try await source.receive(into: buffer) {
            try await sink.send(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[..<count]))
        }
    }
}

/// A `UringListener` and a task per client that sends back what it receives, from the buffer it received into.
final class UringNativeEchoServer: NativeEchoServer, Sendable {
    let localEndpoint: Endpoint
    private let listener: UringListener
    private let acceptor: Guarded<Task<Void, Never>?> = Guarded(nil)
    private let clients = Guarded<[ObjectIdentifier: UringSocket]>([:])

    static func start(on endpoint: Endpoint) async throws(ConnectionError) -> UringNativeEchoServer {
        UringNativeEchoServer(listener: try await UringListener.listen(on: endpoint))
    }

    private init(listener: UringListener) {
        self.listener = listener
        localEndpoint = listener.localEndpoint
        let task = Task(executorPreference: listener.loop) { [self] in
            await withDiscardingTaskGroup { group in
                while let client = try? await listener.accept() {
                    clients.withLock { $0[ObjectIdentifier(client)] = client }
                    group.addTask { await self.echo(client) }
                }
            }
        }
        acceptor.withLock { $0 = task }
    }

    private func echo(_ client: UringSocket) async {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
        try? await UringNative.forward(from: client, to: client, buffer: buffer)
        buffer.deallocate()
        clients.withLock { _ = $0.removeValue(forKey: ObjectIdentifier(client)) }
        await client.close()
    }

    func stop() async {
        await listener.close()
        for client in clients.withLock({ Array($0.values) }) { await client.close() }
        await acceptor.withLock { $0 }?.value
    }
}

/// A relay in the completion style: per client an upstream `UringSocket` and a task per direction that receives
/// into its buffer and sends from it. A send completes when the kernel took the bytes, so a slow reader holds
/// that direction's next receive back through TCP flow control.
final class UringNativeRelay: NativeRelay, Sendable {
    let localEndpoint: Endpoint
    private let listener: UringListener
    private let acceptor: Guarded<Task<Void, Never>?> = Guarded(nil)
    private let sockets = Guarded<[ObjectIdentifier: UringSocket]>([:])
    private let accepted = ClientCounter()

    var clients: Int { accepted.value }

    static func start(listen: Endpoint, upstream: Endpoint) async throws(ConnectionError) -> UringNativeRelay {
        UringNativeRelay(listener: try await UringListener.listen(on: listen), upstream: upstream)
    }

    private init(listener: UringListener, upstream: Endpoint) {
        self.listener = listener
        localEndpoint = listener.localEndpoint
        let task = Task(executorPreference: listener.loop) { [self] in
            await withDiscardingTaskGroup { group in
                while let client = try? await listener.accept() {
                    accepted.increment()
                    group.addTask { await self.relay(client, to: upstream) }
                }
            }
        }
        acceptor.withLock { $0 = task }
    }

    private func relay(_ client: UringSocket, to upstream: Endpoint) async {
        sockets.withLock { $0[ObjectIdentifier(client)] = client }
        defer { sockets.withLock { $0[ObjectIdentifier(client)] = nil } }
        guard let server = try? await UringSocket.connect(to: upstream, loop: listener.loop) else {
            await client.close()
            return
        }
        sockets.withLock { $0[ObjectIdentifier(server)] = server }
        defer { sockets.withLock { $0[ObjectIdentifier(server)] = nil } }
        await withDiscardingTaskGroup { group in
            group.addTask { await Self.pump(from: client, to: server) }
            group.addTask { await Self.pump(from: server, to: client) }
        }
        await client.close()
        await server.close()
    }

    /// One direction: what `source` sends goes to `sink`; its FIN becomes `sink`'s FIN. An error ends both.
    private static func pump(from source: UringSocket, to sink: UringSocket) async {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
        defer { buffer.deallocate() }
        do throws(ConnectionError) {
            try await UringNative.forward(from: source, to: sink, buffer: buffer)
            try await sink.closeOutput()
        } catch {
            await source.close()
            await sink.close()
        }
    }

    func stop() async {
        await listener.close()
        for socket in sockets.withLock({ Array($0.values) }) { await socket.close() }
        await acceptor.withLock { $0 }?.value
    }
}
