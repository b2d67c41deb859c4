import BenchmarkDriver
@_spi(Loop) import ConnectionCore
import POSIXSupport
import SocketStyles

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
