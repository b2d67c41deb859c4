@_spi(Loop) public import ConnectionCore
import POSIXSupport
import Synchronization

/// The async/await style: a non-blocking socket whose operations are `async` functions, driven by an epoll
/// reactor (``AsyncReactor``) that resumes the waiting task when the socket becomes ready. No call ever blocks
/// a thread; there is no thread per connection.
///
/// ```swift
/// let socket = AsyncSocket(to: try Endpoint(url: "tcp://127.0.0.1:9000"))
/// try await socket.start()                 // states: setup -> preparing -> ready
/// try await socket.send(Array("hello".utf8))
/// for try await chunk in socket.messages { print(chunk) }
/// await socket.close()                     // state: cancelled
/// ```
///
/// Cancellation: cancelling the task that waits in ``start()``, ``receive(maximumLength:)`` or ``send(_:)``
/// ends the wait at once with `.cancelled`:
/// - a cancelled `start()` closes the socket (state `.cancelled`);
/// - a cancelled receive has read nothing: the socket stays ready and the next receive gets the data;
/// - a cancelled send that had written nothing leaves the socket untouched; one that had written part of its
///   bytes has left a partial message on the stream, so the socket closes its output (TCP FIN) and later sends
///   throw `.closed`. Receiving still works.
public final class AsyncSocket: Sendable {
    /// Connection states, as Network.framework's NWConnection reports them.
    public enum State: Sendable, Hashable {
        /// Created, not started.
        case setup
        /// Resolving and connecting.
        case preparing
        /// Connected: data can flow.
        case ready
        /// Connecting or the connection failed.
        case failed(ConnectionError)
        /// Closed by ``close()`` (or a cancelled start).
        case cancelled
    }

    /// The transport (`tcp` or `udp`).
    public let transport: Transport
    /// Where ``start()`` connects to.
    public let endpoint: Endpoint
    /// Options applied when connecting.
    public let options: ConnectionOptions
    /// The reactor that drives this socket. It is a `TaskExecutor`: run your task on it
    /// (`withTaskExecutorPreference(socket.reactor)`) and a ready socket resumes it with no thread hop.
    public let reactor: AsyncReactor
    /// State changes, in order, starting with the current state (one consumer).
    public let stateUpdates: AsyncStream<State>

    let readiness = SocketReadiness()
    let reads: ReceiveGate
    let writeGate = AsyncGate()
    /// Serialises `close()`: every caller returns after the one close has finished.
    private let closeGate = AsyncGate()
    private let descriptor: SocketDescriptor
    private let life: Guarded<Life>
    private let stateContinuation: AsyncStream<State>.Continuation
    /// Reads in a row that found data without waiting (inside the read gate; atomic only to stay `Sendable`).
    private let readsWithoutWait = Atomic<Int>(0)

    /// How many reads in a row may find data without the task giving up the reactor's thread. A peer that
    /// keeps the socket's buffer full (a bulk flow to an echo loop: each read finds data, each echo has room)
    /// would otherwise keep the task on the reactor's thread for as long as the peer keeps up, and the reactor
    /// would poll no other socket: an interactive connection beside two bulk ones went without its echo for
    /// 30 s (a debug build, client and server on one CPU). SwiftNIO bounds its reads per turn the same way
    /// (`maxMessagesPerRead`).
    static let readsPerTurn = 16

    private struct Life {
        /// What the user sees (NWConnection's states).
        var state: State
        /// What may run now: ConnectionCore's one lifecycle (closing, half-close, the end reported once).
        var lifecycle = ConnectionLifecycle()
        var local: Endpoint?
        var remote: Endpoint?
    }

    /// A socket that will connect to `endpoint` when started.
    public init(
        to endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(), reactor: AsyncReactor = .shared
    ) {
        self.transport = endpoint.transport
        self.endpoint = endpoint
        self.options = options
        self.reactor = reactor
        (stateUpdates, stateContinuation) = AsyncStream.makeStream(
            of: State.self, bufferingPolicy: .bufferingNewest(16))
        life = Guarded(Life(state: .setup))
        descriptor = SocketDescriptor()
        reads = ReceiveGate(transport: endpoint.transport, options: options)
        stateContinuation.yield(.setup)
    }

    /// A socket around a descriptor that is already connected or bound (accepted connections, UDP servers). It
    /// owns `socket` from here, also when it throws.
    init(
        adopting socket: SocketDescriptor, transport: Transport, local: Endpoint, remote: Endpoint?,
        options: ConnectionOptions,
        reactor: AsyncReactor
    ) throws(ConnectionError) {
        self.transport = transport
        self.endpoint = remote ?? local
        self.options = options
        self.reactor = reactor
        (stateUpdates, stateContinuation) = AsyncStream.makeStream(
            of: State.self, bufferingPolicy: .bufferingNewest(16))
        life = Guarded(Life(state: .ready, local: local, remote: remote))
        reads = ReceiveGate(transport: transport, options: options)
        descriptor = socket
        stateContinuation.yield(.ready)
        try reactor.loop.register(socket.raw, events: Self.watchedEvents(transport), handler: readiness)
    }

    deinit {
        descriptor.close(beforeClosing: reactor.loop.unregister)
        stateContinuation.finish()
    }

    private static let readEvents = Syscall.epollIn | Syscall.epollReadHangUp | Syscall.epollEdgeTriggered

    /// What the reactor watches for: readability always; writability always for TCP, whose write-space edge
    /// comes only after a send found the buffer full, but for UDP only while a send waits for room
    /// (``waitForRoom(_:)``). A datagram socket's write space changes with every datagram it sends, and each
    /// change is an EPOLLOUT edge: watched all the time, it woke the reactor's thread once per datagram sent from
    /// another thread (an open-loop sender on its pacing thread: the reactor switched in and out for nothing
    /// before the server could answer, 4 us of scheduler trace per message, docs/benchmarks.md session 41), and
    /// after a send on the reactor's own thread it made the next epoll_wait return at once.
    private static func watchedEvents(_ transport: Transport) -> UInt32 {
        transport == .udp ? readEvents : readEvents | Syscall.epollOut
    }

    /// Waits until a send may find room. A UDP socket watches writability only for this wait: arming it
    /// (EPOLL_CTL_MOD) makes epoll look at the socket at once, so room that came since the send failed is
    /// reported too.
    func waitForRoom(_ fd: Int32) async throws(ConnectionError) {
        guard transport == .udp else { return try await readiness.waitWritable() }
        try reactor.loop.modify(fd, events: Self.readEvents | Syscall.epollOut)
        defer { try? reactor.loop.modify(fd, events: Self.readEvents) }
        try await readiness.waitWritable()
    }

    /// The current state.
    public var state: State { life.withLock { $0.state } }

    /// The local address once ready.
    public var localEndpoint: Endpoint? { life.withLock { $0.local } }

    /// The peer's address once ready.
    public var remoteEndpoint: Endpoint? { life.withLock { $0.remote } }

    /// The descriptor (-1 before ``start()`` and after ``close()``).
    public var fileDescriptor: Int32 { descriptor.raw }

    private func set(_ state: State) {
        life.withLock { $0.state = state }
        stateContinuation.yield(state)
    }

    // MARK: Connecting

    /// Resolves, connects (bounded by `options.connectTimeout`) and becomes `.ready`; on failure the state is
    /// `.failed` and the error is thrown.
    public func start() async throws(ConnectionError) {
        guard case .setup = state else { throw ConnectionError(.unsupported, "start() was already called") }
        set(.preparing)
        do throws(ConnectionError) {
            let addresses = try await Syscall.resolveAsync(endpoint)
            try await Socket.connect(toFirstOf: addresses, endpoint: endpoint, options: options) {
                (address, deadline) async throws(ConnectionError) in
                try await connect(to: address, deadline: deadline)
            }
            set(.ready)
        } catch {
            if error.kind == .cancelled {
                // Nothing to release (no descriptor was adopted): closed at once.
                life.withLock { life in
                    if case .beginClose = life.lifecycle.handle(.close) { _ = life.lifecycle.handle(.closeFinished) }
                }
                set(.cancelled)
            } else {
                set(.failed(error))
            }
            throw error
        }
    }

    private func connect(to address: SocketAddress, deadline: UInt64) async throws(ConnectionError) {
        let socket = try Socket.connectingSocket(for: address, transport: transport, options: options)
        let fd = socket.raw
        // Registered before connect(2), as before the socket layer: registering after it made a loopback
        // connect's p50 2.7x slower (`sockbench compare --full --scenarios connect`, 55 -> 150 us; see
        // docs/benchmarks.md, session 26).
        try reactor.loop.register(fd, events: Self.watchedEvents(transport), handler: readiness)
        do throws(ConnectionError) {
            if try !Socket.startConnect(socket, to: address) {
                try await withDeadline(
                    Socket.timeLeft(until: deadline, atLeast: .zero), what: "connect to \(endpoint) (\(address))"
                ) {
                    (expired) async throws(ConnectionError) in
                    // Writability may be remembered from before; the handshake is over only when poll agrees.
                    while true {
                        try await readiness.waitWritable()
                        if expired() { return }
                        if try Syscall.poll(fd, events: Syscall.pollOut, timeoutMilliseconds: 0) != 0 { return }
                    }
                }
                try Socket.finishConnect(socket, to: address, endpoint: endpoint)
            }
            let local = try Syscall.localAddress(fd).endpoint(transport)
            let remote = try Syscall.peerAddress(fd).endpoint(transport)
            life.withLock {
                $0.local = local
                $0.remote = remote
            }
        } catch {
            socket.close(beforeClosing: reactor.loop.unregister)
            throw error
        }
        guard let owned = socket.release() else { return }
        descriptor.adopt(owned)
    }

    /// Runs `body`, failing it with `.timedOut` after `timeout` (a reactor timer wakes the waiting task).
    private func withDeadline(
        _ timeout: Duration, what: String,
        _ body: (_ expired: () -> Bool) async throws(ConnectionError) -> Void
    ) async throws(ConnectionError) {
        let fired = Atomic<Bool>(false)
        let timer = Guarded<UInt64?>(nil)
        let loop = reactor.loop
        let readiness = readiness
        loop.perform {
            let id = loop.schedule(after: timeout) {
                fired.store(true, ordering: .relaxed)
                readiness.epollReady(Syscall.epollOut)  // wake the waiter; it sees `fired`
            }
            timer.withLock { $0 = id }
        }
        defer {
            loop.perform {
                if let id = timer.withLock({ $0 }) { loop.cancelTimer(id) }
            }
        }
        try await body { fired.load(ordering: .relaxed) }
        if fired.load(ordering: .relaxed) { throw ConnectionError(.timedOut, "\(what) took longer than \(timeout)") }
    }

    // MARK: Data

    /// Receives what is available (TCP: at most `maximumLength` bytes; UDP: one datagram), waiting for it
    /// without blocking a thread. Returns `nil` once when the peer finished sending (TCP).
    public func receive(maximumLength: Int = .max) async throws(ConnectionError) -> [UInt8]? {
        try await reads.receive(maximumLength: maximumLength, read: read(into:))
    }

    /// Receives into the caller's buffer (TCP: what is available, at most `buffer.count` bytes; UDP: one
    /// datagram, `.messageTooLarge` when it did not fit). No allocation. Returns `nil` once at the end (TCP).
    public func receive(into buffer: UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Int? {
        try await reads.receive(into: buffer, read: read(into:))
    }

    /// The read itself, inside the read gate: non-blocking recv(2), and on EAGAIN a wait for readability.
    private func read(into buffer: UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Int? {
        let fd = try usableDescriptor()
        if life.withLock({ $0.lifecycle.inputEnded }) { throw .closed("the end of the stream was already reported") }
        if readsWithoutWait.add(1, ordering: .relaxed).newValue > Self.readsPerTurn {
            readsWithoutWait.store(0, ordering: .relaxed)
            if reactor.loop.inLoop { await reactor.loop.yieldUntilPolled() } else { await Task.yield() }
        }
        while true {
            let result =
                transport == .udp
                ? try Syscall.recvDatagram(fd, buffer, dontWait: true) : try Syscall.recv(fd, buffer, dontWait: true)
            switch result {
            case .processed(let count):
                if count == 0 && transport != .udp {
                    _ = life.withLock { $0.lifecycle.handle(.peerEnded) }
                    return nil
                }
                if count > buffer.count {
                    throw ConnectionError(
                        .messageTooLarge, "a \(count)-byte datagram did not fit in \(buffer.count) bytes")
                }
                return count
            case .wouldBlock:
                readsWithoutWait.store(0, ordering: .relaxed)
                try await readiness.waitReadable()
                _ = try usableDescriptor()
            }
        }
    }

    /// Sends all of `bytes` (UDP: one datagram), waiting for room without blocking a thread.
    public func send(_ bytes: [UInt8]) async throws(ConnectionError) {
        try await send(count: bytes.count) { (fd, offset) throws(ConnectionError) in
            try bytes.withBytes { (buffer) throws(ConnectionError) in
                try Syscall.send(fd, UnsafeRawBufferPointer(rebasing: buffer[offset...]), dontWait: true)
            }
        }
    }

    /// Sends bytes the caller keeps until this returns (`Connection.send(contentsOf:)`), from where they lie.
    public func send(contentsOf bytes: UnsafeRawBufferPointer) async throws(ConnectionError) {
        try await send(count: bytes.count) { (fd, offset) throws(ConnectionError) in
            try Syscall.send(fd, UnsafeRawBufferPointer(rebasing: bytes[offset...]), dontWait: true)
        }
    }

    /// Sends datagrams (a connected UDP socket), as few system calls as the kernel allows
    /// (`Syscall.sendDatagrams`: sendmmsg, UDP GSO), waiting for room when the socket buffer is full. TCP: the
    /// buffers' bytes, one after the other.
    public func send(batch datagrams: [UnsafeRawBufferPointer]) async throws(ConnectionError) {
        if transport != .udp {
            for bytes in datagrams { try await send(contentsOf: bytes) }
            return
        }
        try await send(count: datagrams.count, countsDatagrams: true) { (fd, sent) throws(ConnectionError) in
            try Syscall.sendDatagrams(fd, datagrams, from: sent, dontWait: true)
        }
    }

    /// The send loop, inside the write gate: non-blocking send(2) from `offset` (`write`), and on EAGAIN a wait
    /// for room. With `countsDatagrams`, `write` sends datagrams from the `offset`-th on and returns how many
    /// went; otherwise a processed UDP send is one whole datagram.
    private func send(
        count: Int, countsDatagrams: Bool = false, _ write: (Int32, Int) throws(ConnectionError) -> IOResult<Int>
    ) async throws(ConnectionError) {
        if !writeGate.tryEnter() { await writeGate.enter() }
        defer { writeGate.leave() }
        let fd = try usableDescriptor()
        if case .refuse(let error) = life.withLock({ $0.lifecycle.handle(.send) }) { throw error }
        var offset = 0
        repeat {
            switch try write(fd, offset) {
            case .processed(let written):
                if transport == .udp && !countsDatagrams { return }
                offset += written
            case .wouldBlock:
                do throws(ConnectionError) {
                    try await waitForRoom(fd)
                    _ = try usableDescriptor()
                } catch {
                    if error.kind == .cancelled && offset > 0 {
                        // Part of the message is on the wire: nothing can follow it sensibly.
                        if case .shutdownOutput = life.withLock({ $0.lifecycle.handle(.closeOutput) }) {
                            try? Syscall.shutdown(fd, .write)
                        }
                    }
                    throw error
                }
            }
        } while offset < count
    }

    /// Half-close (TCP): FIN after everything sent so far.
    public func closeOutput() async throws(ConnectionError) {
        guard transport == .tcp else { throw ConnectionError(.unsupported, "half-close needs a TCP connection") }
        if !writeGate.tryEnter() { await writeGate.enter() }
        defer { writeGate.leave() }
        let fd = try usableDescriptor()
        switch life.withLock({ $0.lifecycle.handle(.closeOutput) }) {
        case .shutdownOutput: try Syscall.shutdown(fd, .write)
        case .refuse(let error): throw error
        default: return
        }
    }

    func usableDescriptor() throws(ConnectionError) -> Int32 {
        let fd = descriptor.raw
        let open = life.withLock { $0.lifecycle.isOpen }
        if fd < 0 || !open {
            throw fd < 0 && open ? ConnectionError(.unsupported, "the socket is not started") : .closed()
        }
        return fd
    }

    // MARK: Closing

    /// Closes with a reset: a connected TCP peer gets `.reset` instead of an end of stream, and what is still
    /// unsent is discarded. Otherwise as ``close()``.
    public func abort() async {
        life.withLock { life in
            // Under the lock, no close has started, so the descriptor is still ours.
            let fd = descriptor.raw
            if life.lifecycle.isOpen, transport == .tcp, fd >= 0 { Syscall.resetConnection(fd) }
        }
        await close()
    }

    /// Closes the socket: waiting operations fail with `.closed`, the descriptor is closed once no operation is
    /// inside a system call, and the state becomes `.cancelled`. A second call closes nothing more, but it too
    /// returns only once the descriptor is closed (a close already under way, say a timeout's, is waited for).
    public func close() async {
        await closeGate.enter()
        defer { closeGate.leave() }
        // The gate lets one close run at a time: a second one finds the first finished (`.none`).
        guard case .beginClose = life.withLock({ $0.lifecycle.handle(.close) }) else { return }
        readiness.close()
        // Wait for operations inside a system call to leave, so the descriptor number is not reused under them.
        await reads.gate.enter()
        await writeGate.enter()
        descriptor.close(beforeClosing: reactor.loop.unregister)
        writeGate.leave()
        reads.gate.leave()
        _ = life.withLock { $0.lifecycle.handle(.closeFinished) }
        set(.cancelled)
        stateContinuation.finish()
    }

    // MARK: Messages as an AsyncSequence

    /// Incoming messages (TCP chunks or UDP datagrams) until the peer finishes; one iterator at a time.
    public var messages: Messages { Messages(socket: self) }

    /// The AsyncSequence of ``messages``.
    public struct Messages: AsyncSequence, Sendable {
        public typealias Element = [UInt8]
        let socket: AsyncSocket

        public struct AsyncIterator: AsyncIteratorProtocol {
            let socket: AsyncSocket
            public mutating func next() async throws -> [UInt8]? {
                try await socket.receive()
            }
        }

        public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(socket: socket) }
    }
}
