import BenchmarkDriver
@_spi(Loop) import ConnectionCore
import POSIXSupport
import SocketStyles

/// Style 3 by hand: input/output streams with a delegate on a run loop (here the runloop backend's own run loop
/// thread), the way Stream/CFStream code is written on Darwin.
enum RunLoopNative {
    /// The client's delegate; made and used only on the run loop's thread.
    private final class Client: SocketStreamDelegate {
        let tally: PingPongTally
        let input: SocketInputStream
        let output: SocketOutputStream
        let continuation: CheckedContinuation<Result<PingRunner.Result, ConnectionError>, Never>
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
        var opened = 0
        var pending: [UInt8] = []
        var pendingOffset = 0
        var finished = false
        /// The streams hold their delegate weakly, as on Darwin: the client keeps itself alive until it finishes.
        var keepAlive: Client?

        init(
            tally: PingPongTally, endpoint: Endpoint,
            continuation: CheckedContinuation<Result<PingRunner.Result, ConnectionError>, Never>
        ) {
            self.tally = tally
            self.continuation = continuation
            (input, output) = getStreamsToHost(endpoint)
        }

        deinit { buffer.deallocate() }

        func start(in runLoop: SocketRunLoop) {
            keepAlive = self
            for stream in [input, output] as [SocketStream] {
                stream.delegate = self
                stream.schedule(in: runLoop)
                stream.open()
            }
        }

        func stream(_ stream: SocketStream, handle event: StreamEvent) {
            guard !finished else { return }
            switch event {
            case .openCompleted:
                opened += 1
                if opened == 2 { send(tally.next()) }
            case .hasBytesAvailable:
                let count = input.read(into: buffer)
                guard count > 0 else {
                    if count < 0 { finish(.failure(input.streamError ?? .closed("read failed"))) }
                    return
                }
                do throws(ConnectionError) {
                    switch try tally.consume(UnsafeRawBufferPointer(rebasing: buffer[..<count])) {
                    case .needMore: break
                    case .echoed: send(tally.next())
                    case .finished: finish(.success(tally.result()))
                    }
                } catch {
                    finish(.failure(error))
                }
            case .hasSpaceAvailable:
                flush()
            case .endEncountered:
                finish(.failure(.closed("the server ended the connection")))
            case .errorOccurred:
                finish(.failure(stream.streamError ?? ConnectionError(.system, "stream error")))
            }
        }

        /// Writes what the stream takes now; the rest waits for `hasSpaceAvailable`.
        func send(_ bytes: [UInt8]) {
            pending = bytes
            pendingOffset = 0
            flush()
        }

        func flush() {
            guard pendingOffset < pending.count else { return }
            let written = pending.withUnsafeBytes {
                output.write(UnsafeRawBufferPointer(rebasing: $0[pendingOffset...]))
            }
            if written < 0 { return finish(.failure(output.streamError ?? .closed("write failed"))) }
            pendingOffset += written
        }

        func finish(_ result: Result<PingRunner.Result, ConnectionError>) {
            finished = true
            input.close()
            output.close()
            keepAlive = nil
            continuation.resume(returning: result)
        }
    }

    static func pingpong(
        to endpoint: Endpoint, tally: PingPongTally
    ) async throws(ConnectionError)
        -> PingRunner.Result
    {
        let runLoop = RunLoopBackend.shared.runLoop
        let result = await withCheckedContinuation {
            (continuation: CheckedContinuation<Result<PingRunner.Result, ConnectionError>, Never>) in
            runLoop.perform {
                Client(tally: tally, endpoint: endpoint, continuation: continuation).start(in: runLoop)
            }
        }
        return try result.get()
    }
}

/// A `SocketListener` whose accept callback gives each client an echoing delegate.
final class RunLoopNativeEchoServer: NativeEchoServer {
    /// One client: reads what is available and writes it back; stops reading while a write waits for space.
    private final class Session: SocketStreamDelegate {
        let input: SocketInputStream
        let output: SocketOutputStream
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
        var pending: [UInt8] = []
        let onEnd: (Session) -> Void

        init(input: SocketInputStream, output: SocketOutputStream, onEnd: @escaping (Session) -> Void) {
            self.input = input
            self.output = output
            self.onEnd = onEnd
        }

        deinit { buffer.deallocate() }

        func stream(_ stream: SocketStream, handle event: StreamEvent) {
            switch event {
            case .openCompleted: break
            case .hasBytesAvailable:
                guard pending.isEmpty else { return }  // read again once the last echo is out
                let count = input.read(into: buffer)
                guard count > 0 else { return count < 0 ? end() : () }
                let written = output.write(UnsafeRawBufferPointer(rebasing: buffer[..<count]))
                if written < 0 { return end() }
                if written < count { pending = Array(buffer[written..<count]) }
            case .hasSpaceAvailable:
                guard !pending.isEmpty else { return }
                let written = output.write(pending)
                if written < 0 { return end() }
                pending.removeFirst(written)
                if pending.isEmpty, input.hasBytesAvailable { self.stream(input, handle: .hasBytesAvailable) }
            case .endEncountered, .errorOccurred:
                end()
            }
        }

        func end() {
            input.close()
            output.close()
            onEnd(self)
        }
    }

    let localEndpoint: Endpoint
    private let runLoop: SocketRunLoop
    private struct State {
        var listener: SocketListener?
        var sessions: [ObjectIdentifier: Session] = [:]
    }
    private let state: LoopConfined<State>

    private init(runLoop: SocketRunLoop, localEndpoint: Endpoint) {
        self.runLoop = runLoop
        self.localEndpoint = localEndpoint
        state = LoopConfined(State(), on: runLoop.loop.thread)
    }

    static func start(on endpoint: Endpoint) async throws(ConnectionError) -> RunLoopNativeEchoServer {
        let runLoop = RunLoopBackend.shared.runLoop
        let resolved = try await Syscall.resolveAsync(endpoint, passive: true)[0].endpoint(.tcp)
        let result = await withCheckedContinuation {
            (continuation: CheckedContinuation<Result<RunLoopNativeEchoServer, ConnectionError>, Never>) in
            runLoop.perform {
                continuation.resume(
                    returning: Result { () throws(ConnectionError) in
                        let late = Late<RunLoopNativeEchoServer>()
                        let listener = try SocketListener(on: resolved, runLoop: runLoop) { input, output in
                            late.value?.accepted(input, output)
                        }
                        let server = RunLoopNativeEchoServer(runLoop: runLoop, localEndpoint: listener.localEndpoint)
                        server.state.withValue { $0.listener = listener }
                        late.set(server)
                        return server
                    })
            }
        }
        return try result.get()
    }

    private func accepted(_ input: SocketInputStream, _ output: SocketOutputStream) {
        let session = Session(input: input, output: output) { [weak self] session in
            self?.state.withValue { $0.sessions[ObjectIdentifier(session)] = nil }
        }
        state.withValue { $0.sessions[ObjectIdentifier(session)] = session }
        input.delegate = session
        output.delegate = session
        input.open()
        output.open()
    }

    func stop() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            runLoop.perform { [self] in
                let (listener, sessions) = state.withValue { state in
                    defer { state = State() }
                    return (state.listener, Array(state.sessions.values))
                }
                listener?.close()
                for session in sessions {
                    session.input.close()
                    session.output.close()
                }
                continuation.resume()
            }
        }
    }
}

/// A relay as stream delegates, on the run loop's thread: the listener hands each client's stream pair over,
/// the relay opens a pair to the upstream (getStreamsToHost) and, once it is open, the client's. Each direction is
/// the delegate of the input it reads and the output it writes: `hasBytesAvailable` reads once and writes on,
/// and while a write is left over it stops reading until `hasSpaceAvailable` has flushed it. The end of one input
/// closes the other side's output, which is a FIN (half-close).
final class RunLoopNativeRelay: NativeRelay {
    let localEndpoint: Endpoint
    private let runLoop: SocketRunLoop
    private let upstream: Endpoint
    private let accepted = ClientCounter()
    private struct State {
        var listener: SocketListener?
        var pairs: [ObjectIdentifier: Pair] = [:]
    }
    private let state: LoopConfined<State>

    var clients: Int { accepted.value }

    private init(runLoop: SocketRunLoop, localEndpoint: Endpoint, upstream: Endpoint) {
        self.runLoop = runLoop
        self.localEndpoint = localEndpoint
        self.upstream = upstream
        state = LoopConfined(State(), on: runLoop.loop.thread)
    }

    static func start(listen: Endpoint, upstream: Endpoint) async throws(ConnectionError) -> RunLoopNativeRelay {
        let runLoop = RunLoopBackend.shared.runLoop
        let resolved = try await Syscall.resolveAsync(listen, passive: true)[0].endpoint(.tcp)
        let result = await withCheckedContinuation {
            (continuation: CheckedContinuation<Result<RunLoopNativeRelay, ConnectionError>, Never>) in
            runLoop.perform {
                continuation.resume(
                    returning: Result { () throws(ConnectionError) in
                        let late = Late<RunLoopNativeRelay>()
                        let listener = try SocketListener(on: resolved, runLoop: runLoop) { input, output in
                            late.value?.accepted(input, output)
                        }
                        let relay = RunLoopNativeRelay(
                            runLoop: runLoop, localEndpoint: listener.localEndpoint, upstream: upstream)
                        relay.state.withValue { $0.listener = listener }
                        late.set(relay)
                        return relay
                    })
            }
        }
        return try result.get()
    }

    private func accepted(_ input: SocketInputStream, _ output: SocketOutputStream) {
        accepted.increment()
        let (serverInput, serverOutput) = getStreamsToHost(upstream)
        let pair = Pair(client: (input, output), server: (serverInput, serverOutput)) { [weak self] pair in
            self?.state.withValue { $0.pairs[ObjectIdentifier(pair)] = nil }
        }
        state.withValue { $0.pairs[ObjectIdentifier(pair)] = pair }
        pair.connect(in: runLoop)
    }

    /// A client, its upstream, and the two directions between them.
    private final class Pair {
        let client: (input: SocketInputStream, output: SocketOutputStream)
        let server: (input: SocketInputStream, output: SocketOutputStream)
        var directions: [Direction] = []
        var opened = 0
        var ended = 0
        var closed = false
        let onClose: (Pair) -> Void

        init(
            client: (SocketInputStream, SocketOutputStream), server: (SocketInputStream, SocketOutputStream),
            onClose: @escaping (Pair) -> Void
        ) {
            self.client = client
            self.server = server
            self.onClose = onClose
        }

        var streams: [SocketStream] { [client.input, client.output, server.input, server.output] }

        /// Opens the upstream pair; the client's streams open once it is connected (see ``streamOpened()``).
        func connect(in runLoop: SocketRunLoop) {
            directions = [
                Direction(from: client.input, to: server.output, pair: self),
                Direction(from: server.input, to: client.output, pair: self),
            ]
            for direction in directions {
                direction.input.delegate = direction
                direction.output.delegate = direction
            }
            for stream in [server.input, server.output] as [SocketStream] {
                stream.schedule(in: runLoop)
                stream.open()
            }
        }

        func streamOpened() {
            opened += 1
            if opened == 2 {
                client.input.open()
                client.output.open()
            }
        }

        func directionEnded() {
            ended += 1
            if ended == 2 { close() }
        }

        func close() {
            guard !closed else { return }
            closed = true
            for stream in streams { stream.close() }
            onClose(self)
        }
    }

    /// One way through a pair.
    private final class Direction: SocketStreamDelegate {
        let input: SocketInputStream
        let output: SocketOutputStream
        unowned let pair: Pair
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
        var pending: [UInt8] = []
        var inputEnded = false

        init(from input: SocketInputStream, to output: SocketOutputStream, pair: Pair) {
            self.input = input
            self.output = output
            self.pair = pair
        }

        deinit { buffer.deallocate() }

        func stream(_ stream: SocketStream, handle event: StreamEvent) {
            guard !pair.closed else { return }
            switch event {
            case .openCompleted:
                if stream === pair.server.input || stream === pair.server.output { pair.streamOpened() }
            case .hasBytesAvailable:
                pump()
            case .hasSpaceAvailable:
                guard !pending.isEmpty else { return }
                let written = output.write(pending)
                if written < 0 { return pair.close() }
                pending.removeFirst(written)
                guard pending.isEmpty else { return }
                if inputEnded { return finish() }
                if input.hasBytesAvailable { pump() }
            case .endEncountered:
                inputEnded = true
                if pending.isEmpty { finish() }
            case .errorOccurred:
                pair.close()
            }
        }

        /// One read, written on; what the output does not take waits for `hasSpaceAvailable`, and reading waits
        /// with it.
        private func pump() {
            guard pending.isEmpty else { return }
            let count = input.read(into: buffer)
            guard count > 0 else { return count < 0 ? pair.close() : () }
            let written = output.write(UnsafeRawBufferPointer(rebasing: buffer[..<count]))
            if written < 0 { return pair.close() }
            if written < count { pending = Array(buffer[written..<count]) }
        }

        /// The input ended and everything it gave is written: the output's close is the FIN.
        private func finish() {
            output.close()
            pair.directionEnded()
        }
    }

    func stop() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            runLoop.perform { [self] in
                let (listener, pairs) = state.withValue { state in
                    defer { state.listener = nil }
                    return (state.listener, Array(state.pairs.values))
                }
                listener?.close()
                for pair in pairs { pair.close() }
                state.withValue { $0.pairs = [:] }
                continuation.resume()
            }
        }
    }
}
