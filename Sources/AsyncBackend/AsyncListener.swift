public import ConnectionCore
import POSIXSupport
import Synchronization

/// A TCP listener as an AsyncSequence of connected ``AsyncSocket``s.
///
/// ```swift
/// let listener = try AsyncListener(on: try Endpoint(url: "tcp://127.0.0.1:0"))
/// for try await client in listener {
///     Task { for try await chunk in client.messages { try await client.send(chunk) } }
/// }
/// ```
public final class AsyncListener: AsyncSequence, Sendable {
    public typealias Element = AsyncSocket

    /// The bound address (the real port when 0 was asked).
    public let localEndpoint: Endpoint
    /// Options applied to accepted sockets.
    public let options: ConnectionOptions
    /// The reactor the listener and its sockets use.
    public let reactor: AsyncReactor
    private let readiness = SocketReadiness()
    private let gate = AsyncGate()
    private let descriptor: SocketDescriptor
    /// Where accepted sockets go: the listener's own reactor, or these in turn (one acceptor handing connections
    /// over, the alternative to a listening socket per reactor that `ServerSpread` measures).
    private let handOff: [AsyncReactor]
    private let handed = Atomic<Int>(0)

    /// Binds and listens (non-blocking). Port 0 picks a free port.
    public init(
        on endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(), reactor: AsyncReactor = .shared,
        handingOffTo handOff: [AsyncReactor] = []
    )
        throws(ConnectionError)
    {
        self.handOff = handOff
        guard endpoint.transport == .tcp else { throw ConnectionError(.unsupported, "AsyncListener listens on tcp") }
        let (socket, local) = try Socket.listen(on: endpoint, options: options)
        try socket.withDescriptor { [readiness] (fd) throws(ConnectionError) in
            try reactor.loop.register(fd, events: Syscall.epollIn | Syscall.epollEdgeTriggered, handler: readiness)
        }
        localEndpoint = local.endpoint(.tcp)
        self.options = options
        self.reactor = reactor
        self.descriptor = socket
    }

    deinit {
        descriptor.close(beforeClosing: reactor.loop.unregister)
    }

    /// Waits for the next client. Throws `.closed` after ``close()``, `.cancelled` when the task is cancelled.
    public func accept() async throws(ConnectionError) -> AsyncSocket {
        await gate.enter()
        defer { gate.leave() }
        while true {
            let next: (socket: SocketDescriptor, peer: SocketAddress)?
            do throws(ConnectionError) {
                guard
                    let accepted = try descriptor.ifOpen({ (fd) throws(ConnectionError) in
                        try Syscall.accept(fd, nonBlocking: true)
                    })
                else { throw .closed("the listener is closed") }
                next = accepted
            } catch {
                guard error.kind == .resourceExhausted else { throw error }
                BoundsLog.note(.descriptorLimit, "accepting paused for \(options.acceptBackoff): \(error)")
                // Out of descriptors: clients wait in the backlog; try again after a pause instead of at once.
                // The pause is the reactor's own timer: Task.sleep would need Dispatch to make a descriptor,
                // and Dispatch traps when it cannot.
                let loop = reactor.loop
                let pause = options.acceptBackoff
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    loop.perform { _ = loop.schedule(after: pause) { continuation.resume() } }
                }
                if Task.isCancelled { throw .cancelled() }
                continue
            }
            guard let (socket, peer) = next else {
                try await readiness.waitReadable()
                continue
            }
            do throws(ConnectionError) {
                let local = try socket.withDescriptor { (client) throws(ConnectionError) in
                    try Syscall.setOption(client, .noDelay, options.tcpNoDelay)
                    try Syscall.setBufferSizes(
                        client, receive: options.receiveBufferSize, send: options.sendBufferSize)
                    return try Syscall.localAddress(client).endpoint(.tcp)
                }
                let owner =
                    handOff.isEmpty
                    ? reactor : handOff[handed.add(1, ordering: .relaxed).oldValue % handOff.count]
                return try AsyncSocket(
                    adopting: socket, transport: .tcp, local: local, remote: peer.endpoint(.tcp), options: options,
                    reactor: owner)
            } catch {
                socket.close()
                if error.kind == .reset { continue }  // the client left already
                throw error
            }
        }
    }

    /// Stops listening. A waiting ``accept()`` throws `.closed`.
    public func close() async {
        readiness.close(.closed("the listener is closed"))
        await gate.enter()
        descriptor.close(beforeClosing: reactor.loop.unregister)
        gate.leave()
    }

    public struct AsyncIterator: AsyncIteratorProtocol {
        let listener: AsyncListener
        /// The next client; `nil` once the listener is closed.
        public mutating func next() async throws -> AsyncSocket? {
            do throws(ConnectionError) {
                return try await listener.accept()
            } catch {
                if error.kind == .closed { return nil }
                throw error
            }
        }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(listener: self) }
}
