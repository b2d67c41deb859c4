import BenchmarkDriver
import ConnectionCore
import SocketStyles

/// Style 2 by hand: a libuv loop thread; everything happens in callbacks.
enum UVNative {
    /// The client's state, touched only on the loop thread.
    private final class Client: @unchecked Sendable {
        let tally: PingPongTally
        let continuation: CheckedContinuation<Result<PingRunner.Result, ConnectionError>, Never>
        var tcp: UVTCP?
        var finished = false

        init(
            tally: PingPongTally, continuation: CheckedContinuation<Result<PingRunner.Result, ConnectionError>, Never>
        ) {
            self.tally = tally
            self.continuation = continuation
        }

        func finish(_ result: Result<PingRunner.Result, ConnectionError>) {
            guard !finished else { return }
            finished = true
            guard let tcp else { return continuation.resume(returning: result) }
            tcp.readStop()
            tcp.close { [continuation] in continuation.resume(returning: result) }
        }

        func write() {
            do throws(UVError) {
                try tcp?.write(tally.next()) { [self] error in
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
                self.tcp = tcp
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
            let client = Client(tally: tally, continuation: continuation)
            loop.execute { client.start(loop: loop, address: address) }
        }
        try? await loop.shutdown()
        return try result.get()
    }
}

/// A libuv TCP server: the connection callback accepts, each client's read callback writes the bytes back.
final class UVNativeEchoServer: NativeEchoServer, @unchecked Sendable {
    private let loop: UVLoop
    // Loop thread only.
    private var listener: UVTCP?
    private var clients: [ObjectIdentifier: UVTCP] = [:]
    private(set) var localEndpoint = Endpoint(transport: .tcp, host: .ipv4("0.0.0.0"), port: 0)

    private init(loop: UVLoop) { self.loop = loop }

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
            self.listener = listener
            try listener.bind(address)
            try listener.listen(backlog: 511) { [self] error in
                guard error == nil, let client = try? listener.accept() else { return }
                serve(client)
            }
            localEndpoint = try listener.localAddress.endpoint(.tcp)
            return .success(())
        } catch {
            return .failure(error.connectionError("listen on \(address)"))
        }
    }

    private func serve(_ client: UVTCP) {
        let key = ObjectIdentifier(client)
        clients[key] = client
        let drop = { [self] in
            clients[key] = nil
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
                for client in clients.values { client.close() }
                clients = [:]
                guard let listener else { return continuation.resume() }
                self.listener = nil
                listener.close { continuation.resume() }
            }
        }
        try? await loop.shutdown()
    }
}
