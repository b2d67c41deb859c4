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
