@_spi(Loop) public import ConnectionCore
import POSIXSupport
import Synchronization

/// Backend `uv`: libuv's event loop and callbacks, adapted to `Connection`.
///
/// Every connection and listener of one backend instance lives on one ``UVLoop`` (one thread, many clients).
/// Calls from async tasks reach the loop through an eventfd it polls (``UVLoop/execute(_:)``); results come back
/// by resuming continuations. The native style is ``UVLoop``, ``UVTCP``, ``UVUDP`` and ``UVTimer``.
public final class LibUVBackend: ConnectionBackend, Sendable {
    public let name = "uv"
    public let transports: Set<Transport> = [.tcp, .udp]
    /// The loop every connection of this backend runs on.
    public let loop: UVLoop

    /// The process-wide instance that `Backend.uv` uses (its loop lives as long as the process).
    public static let shared: LibUVBackend = {
        do {
            return try LibUVBackend(loopName: "uv-loop")
        } catch {
            fatalError("cannot start the libuv loop: \(error)")
        }
    }()

    /// Creates a backend with a loop of its own; ``shutdown()`` closes it.
    public init(loopName: String = "uv-loop") throws(ConnectionError) {
        Syscall.ignoreSIGPIPE()
        loop = try UVLoop(name: loopName)
    }

    /// Stops the loop and closes it with `uv_loop_close`; throws if a handle was left open.
    public func shutdown() async throws(ConnectionError) {
        try await loop.shutdown()
    }

    public func connect(
        to endpoint: Endpoint, options: ConnectionOptions
    ) async throws(ConnectionError)
        -> any Connection
    {
        try requireTransport(of: endpoint)
        let addresses = try await Syscall.resolveAsync(endpoint)
        return try await Socket.connect(toFirstOf: addresses, endpoint: endpoint, options: options) {
            (address, deadline) async throws(ConnectionError) -> any Connection in
            if endpoint.transport == .udp { return try await connectUDP(to: address, options: options) }
            return try await connectTCP(to: address, endpoint: endpoint, options: options, deadline: deadline)
        }
    }

    /// Loop-confined state of one connect attempt.
    private final class Attempt: Sendable {
        struct State {
            var finished = false
            var timedOut = false
            var cancelled = false
            var tcp: UVTCP?
            var timer: UVTimer?
            var deliver: (@Sendable (Result<any Connection, ConnectionError>) -> Void)?
        }
        let state: LoopConfined<State>

        init(loop: UVLoop) { state = LoopConfined(State(), on: loop.thread) }

        func finish(_ result: Result<any Connection, ConnectionError>) {
            let ending = state.withValue {
                state -> (UVTimer?, (@Sendable (Result<any Connection, ConnectionError>) -> Void)?)? in
                guard !state.finished else { return nil }
                state.finished = true
                defer {
                    state.timer = nil
                    state.deliver = nil
                }
                return (state.timer, state.deliver)
            }
            guard let (timer, deliver) = ending else { return }
            timer?.close()
            deliver?(result)
        }
    }

    private func connectTCP(
        to address: SocketAddress, endpoint: Endpoint, options: ConnectionOptions, deadline: UInt64
    )
        async throws(ConnectionError) -> any Connection
    {
        let loop = loop
        let attempt = Attempt(loop: loop)
        let result = await withTaskCancellationHandler {
            await awaitHandOff { deliver in
                loop.execute {
                    let cancelled = attempt.state.withValue { state in
                        state.deliver = deliver
                        return state.cancelled
                    }
                    if cancelled { return attempt.finish(.failure(.cancelled("connect was cancelled"))) }
                    do throws(UVError) {
                        let tcp = try UVTCP(loop: loop, readBufferSize: options.readChunkSize)
                        attempt.state.withValue { $0.tcp = tcp }
                        do throws(UVError) {
                            try tcp.setNoDelay(options.tcpNoDelay)
                            try tcp.connect(to: address) { error in
                                if let error {
                                    tcp.close()
                                    let (timedOut, cancelled) = attempt.state.withValue { ($0.timedOut, $0.cancelled) }
                                    let failure: ConnectionError =
                                        timedOut
                                        ? ConnectionError(.timedOut, "connect to \(endpoint) (\(address)) timed out")
                                        : cancelled
                                            ? .cancelled("connect was cancelled")
                                            : error.connectionError("connect to \(endpoint) (\(address))")
                                    return attempt.finish(.failure(failure))
                                }
                                do throws(ConnectionError) {
                                    try attempt.finish(.success(UVTCPConnection(tcp: tcp, options: options)))
                                } catch {
                                    tcp.close()
                                    attempt.finish(.failure(error))
                                }
                            }
                            try tcp.setBufferSizes(receive: options.receiveBufferSize, send: options.sendBufferSize)
                        } catch {
                            tcp.close()
                            throw error
                        }
                        let timer = try UVTimer(loop: loop)
                        attempt.state.withValue { $0.timer = timer }
                        let milliseconds = Socket.timeLeft(until: deadline).milliseconds
                        try timer.start(milliseconds: milliseconds) {
                            // libuv has no connect timeout: closing the handle cancels the connect request.
                            attempt.state.withValue { $0.timedOut = true }
                            tcp.close()
                        }
                    } catch {
                        attempt.finish(.failure(error.connectionError("connect to \(endpoint)")))
                    }
                }
            }
        } onCancel: {
            loop.execute {
                let tcp = attempt.state.withValue { state in
                    state.cancelled = true
                    return state.finished ? nil : state.tcp
                }
                tcp?.close()
            }
        }
        return try result.get()
    }

    private func connectUDP(
        to address: SocketAddress, options: ConnectionOptions
    ) async throws(ConnectionError)
        -> any Connection
    {
        try await onLoop { () throws(ConnectionError) -> any Connection in
            do throws(UVError) {
                let udp = try UVUDP(loop: self.loop, bufferSize: options.maxDatagramSize)
                do throws(UVError) {
                    try udp.connect(address)
                    try udp.setBufferSizes(receive: options.receiveBufferSize, send: options.sendBufferSize)
                    return try UVUDPConnection(udp: udp, peer: address, options: options)
                } catch {
                    udp.close()
                    throw error
                }
            } catch {
                throw error.connectionError("connect udp to \(address)")
            }
        }
    }

    public func listen(
        on endpoint: Endpoint, options: ConnectionOptions
    ) async throws(ConnectionError)
        -> any Listener
    {
        try requireTransport(of: endpoint)
        let address = try await Syscall.resolveAsync(endpoint, passive: true)[0]
        return try await onLoop { () throws(ConnectionError) -> any Listener in
            if endpoint.transport == .udp {
                return try UVUDPListener(loop: self.loop, address: address, options: options)
            }
            return try UVTCPListener(loop: self.loop, address: address, options: options)
        }
    }

    /// Runs `body` on the loop thread and returns its result.
    func onLoop<R: Sendable>(
        _ body: @escaping @Sendable () throws(ConnectionError) -> R
    ) async throws(ConnectionError)
        -> R
    {
        let result: Result<R, ConnectionError> = await awaitHandOff { deliver in
            loop.execute { deliver(Result { () throws(ConnectionError) in try body() }) }
        }
        return try result.get()
    }

}

extension Duration {
    /// Whole milliseconds, rounded up.
    var milliseconds: UInt64 {
        let (seconds, attoseconds) = components
        guard seconds >= 0 else { return 0 }
        return UInt64(seconds) * 1000 + UInt64((attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000)
    }
}

extension Backend {
    /// libuv's event loop and callbacks on one loop thread (`LibUVBackend`).
    public static let uv = Backend(
        name: "uv",
        summary: "libuv 1.44 loop and callbacks; every connection on one loop thread, an eventfd to reach it",
        style: "libuv callbacks on one loop thread: every buffer's lifetime managed by hand",
        tooling: Backend.Tooling(module: "LibUVBackend", colour: "#e15759", allocationsPerRoundTrip: 5),
        newLoop: { () throws(ConnectionError) in try LibUVBackend(loopName: "uv-loop") },
        make: { LibUVBackend.shared })
}
