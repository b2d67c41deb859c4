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
    private let descriptor: Atomic<Int32>

    /// Binds and listens (non-blocking). Port 0 picks a free port.
    public init(
        on endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(), reactor: AsyncReactor = .shared
    )
        throws(ConnectionError)
    {
        guard endpoint.transport == .tcp else { throw ConnectionError(.unsupported, "AsyncListener listens on tcp") }
        let address = try Syscall.resolve(endpoint, passive: true)[0]
        let fd = try Syscall.socket(family: address.family, datagram: false, nonBlocking: true)
        do throws(ConnectionError) {
            if address.family == .ipv6 { try Syscall.setIPv6Only(fd, true) }
            try Syscall.setReuseAddress(fd, options.reuseAddress)
            do throws(ConnectionError) {
                try Syscall.bind(fd, to: address)
            } catch {
                throw ConnectionError(
                    error.kind, "listen on \(endpoint): \(error.detail)", systemCode: error.systemCode)
            }
            try Syscall.listen(fd, backlog: options.backlog)
            localEndpoint = try Syscall.localAddress(fd).endpoint(.tcp)
            try reactor.loop.register(
                fd, events: Syscall.epollIn | Syscall.epollEdgeTriggered, handler: readiness)
        } catch {
            Syscall.close(fd)
            throw error
        }
        self.options = options
        self.reactor = reactor
        self.descriptor = Atomic(fd)
    }

    deinit {
        let fd = descriptor.exchange(-1, ordering: .acquiringAndReleasing)
        if fd >= 0 {
            reactor.loop.unregister(fd)
            Syscall.close(fd)
        }
    }

    /// Waits for the next client. Throws `.closed` after ``close()``, `.cancelled` when the task is cancelled.
    public func accept() async throws(ConnectionError) -> AsyncSocket {
        await gate.enter()
        defer { gate.leave() }
        while true {
            let fd = descriptor.load(ordering: .acquiring)
            guard fd >= 0 else { throw .closed("the listener is closed") }
            let next: (fd: Int32, peer: SocketAddress)?
            do throws(ConnectionError) {
                next = try Syscall.accept(fd, nonBlocking: true)
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
            guard let (client, peer) = next else {
                try await readiness.waitReadable()
                continue
            }
            do throws(ConnectionError) {
                try Syscall.setNoDelay(client, options.tcpNoDelay)
                try Syscall.setBufferSizes(client, receive: options.receiveBufferSize, send: options.sendBufferSize)
                let local = try Syscall.localAddress(client).endpoint(.tcp)
                return try AsyncSocket(
                    adopting: client, transport: .tcp, local: local, remote: peer.endpoint(.tcp), options: options,
                    reactor: reactor)
            } catch {
                Syscall.close(client)
                if error.kind == .reset { continue }  // the client left already
                throw error
            }
        }
    }

    /// Stops listening. A waiting ``accept()`` throws `.closed`.
    public func close() async {
        readiness.close(.closed("the listener is closed"))
        await gate.enter()
        let fd = descriptor.exchange(-1, ordering: .acquiringAndReleasing)
        if fd >= 0 {
            reactor.loop.unregister(fd)
            Syscall.close(fd)
        }
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
