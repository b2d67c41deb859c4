import BenchmarkDriver
@_spi(Loop) import ConnectionCore
import POSIXSupport
import SocketStyles

/// Style 2 by hand: a libuv loop thread; everything happens in callbacks.
enum UVNative {
    /// The client: made on the caller's thread, then used only in the loop's callbacks.
    private final class Client: Sendable {
        let tally: PingPongTally
        let continuation: CheckedContinuation<Result<PingRunner.Result, ConnectionError>, Never>
        private struct State {
            var tcp: UVTCP?
            var finished = false
        }
        private let state: LoopConfined<State>

        init(
            tally: PingPongTally, continuation: CheckedContinuation<Result<PingRunner.Result, ConnectionError>, Never>,
            loop: UVLoop
        ) {
            self.tally = tally
            self.continuation = continuation
            state = LoopConfined(State(), on: loop.thread)
        }

        func finish(_ result: Result<PingRunner.Result, ConnectionError>) {
            let (first, tcp) = state.withValue { state in
                defer { state.finished = true }
                return (!state.finished, state.tcp)
            }
            guard first else { return }
            guard let tcp else { return continuation.resume(returning: result) }
            tcp.readStop()
            tcp.close { [continuation] in continuation.resume(returning: result) }
        }

        func write() {
            do throws(UVError) {
                try state.withValue { $0.tcp }?.write(tally.next()) { [self] error in
                    if let error { finish(.failure(error.connectionError("uv_write"))) }
                }
            } catch {
                finish(.failure(error.connectionError("uv_write")))
            }
        }

        func read(_ read: UVReadResult) {
            switch read {
            case .data(let bytes):
                do throws(ConnectionError) {
                    switch try tally.consume(bytes) {
                    case .needMore: break
                    case .echoed: write()
                    case .finished: finish(.success(tally.result()))
                    }
                } catch {
                    finish(.failure(error))
                }
            case .endOfStream: finish(.failure(.closed("the server ended the connection")))
            case .failure(let error): finish(.failure(error.connectionError("read")))
            }
        }

        func start(loop: UVLoop, address: SocketAddress) {
            do throws(UVError) {
                let tcp = try UVTCP(loop: loop)
                state.withValue { $0.tcp = tcp }
                try tcp.connect(to: address) { [self] error in
                    if let error { return finish(.failure(error.connectionError("connect"))) }
                    do throws(UVError) {
                        try tcp.setNoDelay(true)
                        try tcp.readStart { [self] result in read(result) }
                        write()
                    } catch {
                        finish(.failure(error.connectionError("start")))
                    }
                }
            } catch {
                finish(.failure(error.connectionError("connect")))
            }
        }
    }

    static func pingpong(
        to endpoint: Endpoint, tally: PingPongTally
    ) async throws(ConnectionError)
        -> PingRunner.Result
    {
        let address = try await Syscall.resolveAsync(endpoint)[0]
        let loop = try UVLoop(name: "uv-native-ping")
        let result = await withCheckedContinuation {
            (continuation: CheckedContinuation<Result<PingRunner.Result, ConnectionError>, Never>) in
            let client = Client(tally: tally, continuation: continuation, loop: loop)
            loop.execute { client.start(loop: loop, address: address) }
        }
        try? await loop.shutdown()
        return try result.get()
    }
}

/// A libuv TCP server: the connection callback accepts, each client's read callback writes the bytes back.
final class UVNativeEchoServer: NativeEchoServer {
    private let loop: UVLoop
    private struct State {
        var listener: UVTCP?
        var clients: [ObjectIdentifier: UVTCP] = [:]
    }
    private let state: LoopConfined<State>
    private let boundEndpoint = Late<Endpoint>()
    var localEndpoint: Endpoint { boundEndpoint.value ?? Endpoint(transport: .tcp, host: .ipv4("0.0.0.0"), port: 0) }

    private init(loop: UVLoop) {
        self.loop = loop
        state = LoopConfined(State(), on: loop.thread)
    }

    static func start(on endpoint: Endpoint) async throws(ConnectionError) -> UVNativeEchoServer {
        let address = try await Syscall.resolveAsync(endpoint, passive: true)[0]
        let server = UVNativeEchoServer(loop: try UVLoop(name: "uv-native-echo"))
        let started = await withCheckedContinuation {
            (continuation: CheckedContinuation<Result<Void, ConnectionError>, Never>) in
            server.loop.execute { continuation.resume(returning: server.listen(address)) }
        }
        do throws(ConnectionError) {
            try started.get()
        } catch {
            await server.stop()
            throw error
        }
        return server
    }

    private func listen(_ address: SocketAddress) -> Result<Void, ConnectionError> {
        do throws(UVError) {
            let listener = try UVTCP(loop: loop)
            state.withValue { $0.listener = listener }
            try listener.bind(address)
            try listener.listen(backlog: 511) { [self] error in
                guard error == nil, let client = try? listener.accept() else { return }
                serve(client)
            }
            boundEndpoint.set(try listener.localAddress.endpoint(.tcp))
            return .success(())
        } catch {
            return .failure(error.connectionError("listen on \(address)"))
        }
    }

    private func serve(_ client: UVTCP) {
        let key = ObjectIdentifier(client)
        state.withValue { $0.clients[key] = client }
        let drop = { [self] in
            state.withValue { $0.clients[key] = nil }
            client.close()
        }
        do throws(UVError) {
            try client.setNoDelay(true)
            try client.readStart { result in
                guard case .data(let bytes) = result else { return drop() }
                do throws(UVError) {
                    try client.write([UInt8](bytes)) { error in if error != nil { drop() } }
                } catch {
                    drop()
                }
            }
        } catch {
            drop()
        }
    }

    func stop() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            loop.execute { [self] in
                let (clients, listener) = state.withValue { state in
                    defer { state = State() }
                    return (Array(state.clients.values), state.listener)
                }
                for client in clients { client.close() }
                guard let listener else { return continuation.resume() }
                listener.close { continuation.resume() }
            }
        }
        try? await loop.shutdown()
    }
}

/// A relay in libuv callbacks, all on one loop thread: each client's connection callback connects upstream; each
/// read callback writes the bytes to the other handle and, when more than ``nativeRelayWindow`` bytes wait to be
/// written there, stops reading (`uv_read_stop`) until the write callbacks have drained half of it. End of stream
/// becomes `uv_shutdown` on the other handle.
final class UVNativeRelay: NativeRelay {
    private let loop: UVLoop
    private let accepted = ClientCounter()
    private struct State {
        var listener: UVTCP?
        var pairs: [ObjectIdentifier: Pair] = [:]
    }
    private let state: LoopConfined<State>
    private let boundEndpoint = Late<Endpoint>()
    var localEndpoint: Endpoint { boundEndpoint.value ?? Endpoint(transport: .tcp, host: .ipv4("0.0.0.0"), port: 0) }

    var clients: Int { accepted.value }

    private init(loop: UVLoop) {
        self.loop = loop
        state = LoopConfined(State(), on: loop.thread)
    }

    static func start(listen: Endpoint, upstream: Endpoint) async throws(ConnectionError) -> UVNativeRelay {
        let address = try await Syscall.resolveAsync(listen, passive: true)[0]
        let upstreamAddress = try await Syscall.resolveAsync(upstream)[0]
        let relay = UVNativeRelay(loop: try UVLoop(name: "uv-native-relay"))
        let started = await withCheckedContinuation {
            (continuation: CheckedContinuation<Result<Void, ConnectionError>, Never>) in
            relay.loop.execute { continuation.resume(returning: relay.listen(address, upstream: upstreamAddress)) }
        }
        do throws(ConnectionError) {
            try started.get()
        } catch {
            await relay.stop()
            throw error
        }
        return relay
    }

    private func listen(_ address: SocketAddress, upstream: SocketAddress) -> Result<Void, ConnectionError> {
        do throws(UVError) {
            let listener = try UVTCP(loop: loop)
            state.withValue { $0.listener = listener }
            try listener.bind(address)
            try listener.listen(backlog: 511) { [self] error in
                guard error == nil, let client = try? listener.accept() else { return }
                accepted.increment()
                let pair = Pair(client: client, relay: self)
                state.withValue { $0.pairs[ObjectIdentifier(pair)] = pair }
                pair.connect(to: upstream)
            }
            boundEndpoint.set(try listener.localAddress.endpoint(.tcp))
            return .success(())
        } catch {
            return .failure(error.connectionError("listen on \(address)"))
        }
    }

    /// One client and its upstream connection (loop thread only).
    private final class Pair {
        let client: UVTCP
        var server: UVTCP?
        let loop: UVLoop
        weak var relay: UVNativeRelay?
        var ended = 0
        var closed = false

        init(client: UVTCP, relay: UVNativeRelay) {
            self.client = client
            self.loop = relay.loop
            self.relay = relay
        }

        func connect(to address: SocketAddress) {
            do throws(UVError) {
                let server = try UVTCP(loop: loop)
                self.server = server
                try server.connect(to: address) { [self] error in
                    guard error == nil, !closed else { return close() }
                    do throws(UVError) {
                        try client.setNoDelay(true)
                        try server.setNoDelay(true)
                        try Direction(from: client, to: server, pair: self).start()
                        try Direction(from: server, to: client, pair: self).start()
                    } catch {
                        close()
                    }
                }
            } catch {
                close()
            }
        }

        func directionEnded() {
            ended += 1
            if ended == 2 { close() }
        }

        func close() {
            guard !closed else { return }
            closed = true
            client.close()
            server?.close()
            relay?.state.withValue { $0.pairs[ObjectIdentifier(self)] = nil }
        }
    }

    /// One way through a pair: reads `source`, writes `sink`, pauses reading while too much waits in `sink`.
    private final class Direction {
        let source: UVTCP
        let sink: UVTCP
        let pair: Pair
        var waiting = 0
        var paused = false

        init(from source: UVTCP, to sink: UVTCP, pair: Pair) {
            self.source = source
            self.sink = sink
            self.pair = pair
        }

        /// The read callback keeps this object alive for as long as the handle reads.
        func start() throws(UVError) {
            try source.readStart { [self] result in read(result) }
        }

        func read(_ result: UVReadResult) {
            guard !pair.closed else { return }
            switch result {
            case .data(let bytes):
                let count = bytes.count
                waiting += count
                do throws(UVError) {
                    try sink.write([UInt8](bytes)) { [self] error in written(count, error) }
                } catch {
                    return pair.close()
                }
                if waiting >= nativeRelayWindow {
                    paused = true
                    source.readStop()
                }
            case .endOfStream:
                source.readStop()
                do throws(UVError) {
                    try sink.shutdown { [self] error in
                        if error != nil { return pair.close() }
                        pair.directionEnded()
                    }
                } catch {
                    pair.close()
                }
            case .failure:
                pair.close()
            }
        }

        func written(_ count: Int, _ error: UVError?) {
            waiting -= count
            guard error == nil else { return pair.close() }
            if paused, waiting <= nativeRelayWindow / 2, !pair.closed {
                paused = false
                do throws(UVError) { try start() } catch { pair.close() }
            }
        }
    }

    func stop() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            loop.execute { [self] in
                let (pairs, listener) = state.withValue { state in
                    defer { state.listener = nil }
                    return (Array(state.pairs.values), state.listener)
                }
                for pair in pairs { pair.close() }
                guard let listener else { return continuation.resume() }
                listener.close { continuation.resume() }
            }
        }
        try? await loop.shutdown()
    }
}
