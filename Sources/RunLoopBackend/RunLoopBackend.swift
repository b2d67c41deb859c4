@_spi(Loop) public import ConnectionCore
import POSIXSupport
import Synchronization

/// Backend `runloop`: the delegate style (input/output streams, events on a run loop) adapted to
/// `Connection`. Every connection of the backend is scheduled in one ``SocketRunLoop`` turning on its own
/// thread; calls from tasks reach it with `perform`, and results come back by resuming continuations. The
/// native style is ``SocketInputStream``/``SocketOutputStream`` with a ``SocketStreamDelegate``,
/// ``SocketListener`` and ``DatagramSocket``.
public final class RunLoopBackend: ConnectionBackend, Sendable {
    public let name = "runloop"
    public let transports: Set<Transport> = [.tcp, .udp]
    /// The run loop every connection of this backend is scheduled in.
    public let runLoop: SocketRunLoop

    /// The process-wide instance that `Backend.runloop` uses.
    public static let shared: RunLoopBackend = {
        do {
            return try RunLoopBackend()
        } catch {
            fatalError("cannot start the run loop thread: \(error)")
        }
    }()

    /// Starts a run loop thread for this backend.
    public init(name: String = "runloop-backend") throws(ConnectionError) {
        Syscall.ignoreSIGPIPE()
        runLoop = try SocketRunLoop.startThread(name: name)
    }

    public func connect(
        to endpoint: Endpoint, options: ConnectionOptions
    ) async throws(ConnectionError)
        -> any Connection
    {
        guard transports.contains(endpoint.transport) else {
            throw ConnectionError(.unsupported, "the runloop backend provides tcp and udp")
        }
        if endpoint.transport == .udp {
            let addresses = try await Syscall.resolveAsync(endpoint)
            return try await Socket.connect(toFirstOf: addresses, endpoint: endpoint, options: options) {
                (address, _) async throws(ConnectionError) -> any Connection in
                let resolved = address.endpoint(.udp)
                return try await onRunLoop { () throws(ConnectionError) -> any Connection in
                    let socket = try DatagramSocket(resolved, connect: true, runLoop: self.runLoop, options: options)
                    return RunLoopUDPConnection(socket: socket, runLoop: self.runLoop, options: options)
                }
            }
        }
        let connection = RunLoopTCPConnection(runLoop: runLoop, options: options)
        try await connection.connect(to: endpoint)
        return connection
    }

    public func listen(
        on endpoint: Endpoint, options: ConnectionOptions
    ) async throws(ConnectionError)
        -> any Listener
    {
        guard transports.contains(endpoint.transport) else {
            throw ConnectionError(.unsupported, "the runloop backend provides tcp and udp")
        }
        let resolved = try await Syscall.resolveAsync(endpoint, passive: true)[0].endpoint(endpoint.transport)
        let runLoop = runLoop
        return try await onRunLoop { () throws(ConnectionError) -> any Listener in
            if resolved.transport == .udp {
                return try RunLoopUDPListener(on: resolved, runLoop: runLoop, options: options)
            }
            return try RunLoopTCPListener(on: resolved, runLoop: runLoop, options: options)
        }
    }

    private func onRunLoop<R: Sendable>(
        _ body: @escaping @Sendable () throws(ConnectionError) -> R
    )
        async throws(ConnectionError) -> R
    {
        let result: Result<R, ConnectionError> = await awaitHandOff { deliver in
            runLoop.perform { deliver(Result { () throws(ConnectionError) in try body() }) }
        }
        return try result.get()
    }
}

extension Backend {
    /// Delegate-driven input/output streams on a run loop of our own (`RunLoopBackend`), as Apple's
    /// Stream/CFStream.
    public static let runloop = Backend(
        name: "runloop",
        summary: "input/output streams with a delegate (openCompleted, hasBytesAvailable, ...) on one epoll run loop",
        style: "stream delegates on one run loop, as Stream/CFStream code is written",
        tooling: Backend.Tooling(module: "RunLoopBackend", colour: "#76b7b2", allocationsPerRoundTrip: 5),
        newLoop: { () throws(ConnectionError) in try RunLoopBackend(name: "runloop-backend") },
        make: { RunLoopBackend.shared })
}
