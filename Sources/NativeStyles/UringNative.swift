import BenchmarkDriver
@_spi(Loop) import ConnectionCore
import Glibc
import POSIXSupport
import SocketStyles
import Synchronization

/// Style 5 by hand, in the ring's own idiom: each probe is sent with its receive linked behind it (IOSQE_IO_LINK:
/// the receive starts only once the send completed in full) and the send posting no completion when it succeeds
/// (`UringRing.sendThenReceive`), so one `io_uring_enter` submits both and sleeps until the reply is there; the
/// receive's completion handler, on the ring's thread, consumes the reply and queues the next pair. No task is
/// suspended or resumed per round trip.
enum UringNative {
    static func pingpong(
        to endpoint: Endpoint, tally: PingPongTally
    ) async throws(ConnectionError) -> PingRunner.Result {
        let socket = try await UringSocket.connect(to: endpoint)
        // The ring's operations name the number: borrowed until the exchange is over.
        let result = try await socket.withDescriptorAsync { (fd) async throws(ConnectionError) in
            let client = UringPingClient(fd: fd.number, tally: tally, thread: socket.loop.thread)
            return await withUnsafeContinuation { continuation in
                socket.loop.execute { ring in client.start(ring, continuation) }
            }
        }
        await socket.close()
        return try result.get()
    }
}

/// A `UringListener` whose clients are echoed in the ring's idiom: a receive whose handler sends the bytes back
/// with the next receive linked behind the send (into the same buffer, free again once the send completed).
final class UringNativeEchoServer: NativeEchoServer, Sendable {
    let localEndpoint: Endpoint
    private let listener: UringListener
    private let clients = TaskPerClient<UringSocket>()

    static func start(on endpoint: Endpoint) async throws(ConnectionError) -> UringNativeEchoServer {
        UringNativeEchoServer(listener: try await UringListener.listen(on: endpoint))
    }

    private init(listener: UringListener) {
        self.listener = listener
        localEndpoint = listener.localEndpoint
        clients.start(on: listener.loop, accept: { [listener] in try? await listener.accept() }) { [self] in
            await echo($0)
        }
    }

    private func echo(_ client: UringSocket) async {
        _ = try? await client.withDescriptorAsync { (fd) async throws(ConnectionError) in
            let echo = UringEcho(fd: fd.number, thread: client.loop.thread)
            await withUnsafeContinuation { continuation in
                client.loop.execute { ring in echo.start(ring, continuation) }
            }
        }
        clients.closed(client)
        await client.close()
    }

    func stop() async {
        await listener.close()
        // Ends each client's receive in flight (it completes with 0), which ends its echo; then it is closed.
        await clients.stop { client in
            _ = try? client.withDescriptor { (fd) throws(ConnectionError) in try Syscall.shutdown(fd, .both) }
        }
    }
}

/// The native ping-pong's state, touched only on the ring's thread.
final class UringPingClient: Sendable {
    private struct State {
        let fd: Int32
        let tally: PingPongTally
        let output = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
        let input = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
        var probe: [UInt8] = []
        var continuation: UnsafeContinuation<Result<PingRunner.Result, ConnectionError>, Never>?
    }
    private let state: LoopConfined<State>

    init(fd: Int32, tally: PingPongTally, thread: LoopThread) {
        // The buffers go with the last reference: a completion handler of an operation still in flight keeps them.
        state = LoopConfined(
            State(fd: fd, tally: tally), on: thread,
            release: {
                $0.output.deallocate()
                $0.input.deallocate()
            })
    }

    func start(_ ring: UringRing, _ continuation: UnsafeContinuation<Result<PingRunner.Result, ConnectionError>, Never>)
    {
        state.withValue { $0.continuation = continuation }
        nextProbe(ring)
    }

    private func finish(_ result: Result<PingRunner.Result, ConnectionError>) {
        state.withValue { state in
            state.continuation?.resume(returning: result)
            state.continuation = nil
        }
    }

    private func nextProbe(_ ring: UringRing) {
        let probe = state.withValue { state in
            state.probe = state.tally.next()
            return state.probe
        }
        send(ring, from: 0, count: probe.count)
    }

    /// Sends the probe from `offset`, a buffer-full at a time; the last piece with the receive linked behind it, so
    /// that the round trip completes once, with the echo.
    private func send(_ ring: UringRing, from offset: Int, count: Int) {
        let (fd, piece, input) = state.withValue { state in
            let length = min(state.output.count, count - offset)
            state.probe.withUnsafeBytes {
                state.output.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[offset..<offset + length]))
            }
            return (state.fd, UnsafeRawBufferPointer(rebasing: state.output[..<length]), state.input)
        }
        guard offset + piece.count == count else {
            ring.send(fd, piece) { [self] sent in
                if sent < 0 { return finish(.failure(.errno(-sent, "send"))) }
                send(ring, from: offset + Int(sent), count: count)
            }
            return
        }
        ring.sendThenReceive(fd, piece, into: input) { [self] in received(ring, fd: fd, into: input, $0) }
    }

    private func received(_ ring: UringRing, fd: Int32, into input: UnsafeMutableRawBufferPointer, _ received: Int32) {
        if received < 0 { return finish(.failure(.errno(-received, "send or recv"))) }
        if received == 0 { return finish(.failure(.closed("the server ended the connection"))) }
        let step: PingPongTally.Step
        do throws(ConnectionError) {
            step = try state.withValue { state throws(ConnectionError) in
                try state.tally.consume(UnsafeRawBufferPointer(rebasing: input[..<Int(received)]))
            }
        } catch {
            return finish(.failure(error))
        }
        switch step {
        case .needMore: ring.receive(fd, into: input) { [self] in self.received(ring, fd: fd, into: input, $0) }
        case .finished: finish(.success(state.withValue { $0.tally.result() }))
        default: nextProbe(ring)
        }
    }
}

/// One echoed client's state, on the ring's thread: a buffer that is received into and sent from in turn.
final class UringEcho: Sendable {
    private struct State {
        let fd: Int32
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
        var done: UnsafeContinuation<Void, Never>?
    }
    private let state: LoopConfined<State>

    init(fd: Int32, thread: LoopThread) {
        state = LoopConfined(State(fd: fd), on: thread, release: { $0.buffer.deallocate() })
    }

    func start(_ ring: UringRing, _ done: UnsafeContinuation<Void, Never>) {
        state.withValue { $0.done = done }
        receive(ring)
    }

    private func end() {
        state.withValue { state in
            state.done?.resume()
            state.done = nil
        }
    }

    private func receive(_ ring: UringRing) {
        let (fd, buffer) = state.withValue { ($0.fd, $0.buffer) }
        ring.receive(fd, into: buffer) { [self] in echo(ring, $0) }
    }

    /// Sends back what was received, the next receive linked behind it (into the same buffer: it starts once the
    /// send took every byte): one completion per message, the next one's.
    private func echo(_ ring: UringRing, _ received: Int32) {
        if received <= 0 { return end() }  // the end, or an error (the send's or the receive's)
        let (fd, buffer) = state.withValue { ($0.fd, $0.buffer) }
        ring.sendThenReceive(fd, UnsafeRawBufferPointer(rebasing: buffer[..<Int(received)]), into: buffer) {
            [self] in echo(ring, $0)
        }
    }
}

/// A relay in the completion style: per client an upstream `UringSocket` and a task per direction that receives
/// into its buffer and sends from it. A send completes when the kernel took the bytes, so a slow reader holds
/// that direction's next receive back through TCP flow control.
final class UringNativeRelay: NativeRelay, Sendable {
    let localEndpoint: Endpoint
    private let listener: UringListener
    private let sockets = TaskPerClient<UringSocket>()

    var clients: Int { sockets.acceptedCount }

    static func start(listen: Endpoint, upstream: Endpoint) async throws(ConnectionError) -> UringNativeRelay {
        UringNativeRelay(listener: try await UringListener.listen(on: listen), upstream: upstream)
    }

    private init(listener: UringListener, upstream: Endpoint) {
        self.listener = listener
        localEndpoint = listener.localEndpoint
        sockets.start(on: listener.loop, accept: { [listener] in try? await listener.accept() }) { [self] in
            await relay($0, to: upstream)
        }
    }

    private func relay(_ client: UringSocket, to upstream: Endpoint) async {
        defer { sockets.closed(client) }
        guard let server = try? await UringSocket.connect(to: upstream, loop: listener.loop) else {
            await client.close()
            return
        }
        sockets.opened(server)
        defer { sockets.closed(server) }
        await withDiscardingTaskGroup { group in
            group.addTask { await relayOneWay(from: client, to: server) }
            group.addTask { await relayOneWay(from: server, to: client) }
        }
        await client.close()
        await server.close()
    }

    func stop() async {
        await listener.close()
        await sockets.stop { await $0.close() }
    }
}
