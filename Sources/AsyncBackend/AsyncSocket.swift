// One piece, over 450 lines: connecting, receiving, sending and closing all act on one descriptor through its
// private readiness, lifecycle and close guard, and a close must wait for each of them; the datagram server, the
// listener, the messages as an AsyncSequence and the gathering of sends are files apart.
@_spi(Loop) public import ConnectionCore
public import POSIXSupport
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
    /// State changes, in order (one consumer). A socket made to connect reports every state from `.setup` on; an
    /// accepted one from the state it is in when this is first read (no stream is kept for an accepted socket
    /// nobody asks: 10,000 idle connections would keep 10,000 streams).
    public var stateUpdates: AsyncStream<State> {
        life.withLock { life in
            if let updates = life.updates { return updates.stream }
            let updates = AsyncStream.makeStream(of: State.self, bufferingPolicy: .bufferingNewest(16))
            life.updates = updates
            updates.continuation.yield(life.state)
            if life.state == .cancelled { updates.continuation.finish() }
            return updates.stream
        }
    }

    let readiness = SocketReadiness()
    /// One receive at a time, in call order; a close takes it to wait for the receive in progress.
    let readGate = AsyncGate()
    let writeGate = AsyncGate()
    /// TCP: sends made back to back on the reactor's thread, written as one (``SendGathering``,
    /// AsyncSocket+Gathering.swift).
    let gathering = SendGathering()
    /// Serialises `close()`: every caller returns after the one close has finished.
    private let closeGate = AsyncGate()
    let descriptor: SocketDescriptor
    private let life: Guarded<Life>
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
        /// What ``stateUpdates`` hands out, once made.
        var updates: (stream: AsyncStream<State>, continuation: AsyncStream<State>.Continuation)?
    }

    /// A socket that will connect to `endpoint` when started.
    public init(
        to endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(), reactor: AsyncReactor = .shared
    ) {
        self.transport = endpoint.transport
        self.endpoint = endpoint
        self.options = options
        self.reactor = reactor
        let updates = AsyncStream.makeStream(of: State.self, bufferingPolicy: .bufferingNewest(16))
        life = Guarded(Life(state: .setup, updates: updates))
        descriptor = SocketDescriptor()
        updates.continuation.yield(.setup)
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
        life = Guarded(Life(state: .ready, local: local, remote: remote))
        descriptor = socket
        try socket.withDescriptor { [readiness] (fd) throws(ConnectionError) in
            try reactor.loop.register(fd, events: Self.watchedEvents(transport), handler: readiness)
        }
    }

    deinit {
        descriptor.close(beforeClosing: reactor.loop.unregister)
        life.withLock { $0.updates?.continuation }?.finish()
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
    func waitForRoom() async throws(ConnectionError) {
        guard transport == .udp else { return try await readiness.waitWritable() }
        try descriptor.withDescriptor { (fd) throws(ConnectionError) in
            try reactor.loop.modify(fd, events: Self.readEvents | Syscall.epollOut)
        }
        defer { descriptor.ifOpen { try? reactor.loop.modify($0, events: Self.readEvents) } }
        try await readiness.waitWritable()
    }

    /// The current state.
    public var state: State { life.withLock { $0.state } }

    /// The local address once ready.
    public var localEndpoint: Endpoint? { life.withLock { $0.local } }

    /// The peer's address once ready.
    public var remoteEndpoint: Endpoint? { life.withLock { $0.remote } }

    /// Runs `body` with the descriptor, which stays this socket's until `body` returns (for a socket option or a
    /// look with `poll` of your own); `.closed` before ``start()`` and after ``close()``.
    public func withDescriptor<R>(
        _ body: (borrowing BorrowedDescriptor) throws(ConnectionError) -> R
    ) throws(ConnectionError) -> R {
        try descriptor.withDescriptor(body)
    }

    private func set(_ state: State) {
        life.withLock { life in
            life.state = state
            life.updates?.continuation.yield(state)
        }
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
        // Registered before connect(2), as before the socket layer: registering after it made a loopback
        // connect's p50 2.7x slower (`sockbench compare --full --scenarios connect`, 55 -> 150 us; see
        // docs/benchmarks.md, session 26).
        try socket.withDescriptor { [readiness, transport] (fd) throws(ConnectionError) in
            try reactor.loop.register(fd, events: Self.watchedEvents(transport), handler: readiness)
        }
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
                        let ready = try socket.withDescriptor { (fd) throws(ConnectionError) in
                            try Syscall.poll(fd, events: Syscall.pollOut, timeoutMilliseconds: 0)
                        }
                        if ready != 0 { return }
                    }
                }
                try Socket.finishConnect(socket, to: address, endpoint: endpoint)
            }
            let (local, remote) = try socket.withDescriptor { [transport] (fd) throws(ConnectionError) in
                (try Syscall.localAddress(fd).endpoint(transport), try Syscall.peerAddress(fd).endpoint(transport))
            }
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
    ///
    /// The bytes are read into the calling thread's buffer (`ThreadReadBuffer`) and copied out at the length that
    /// arrived: an idle socket keeps no read buffer.
    public func receive(maximumLength: Int = .max) async throws(ConnectionError) -> [UInt8]? {
        gathering.noteReceive()
        if !readGate.tryEnter() { await readGate.enter() }
        defer { readGate.leave() }
        let limit = transport == .udp ? options.maxDatagramSize : min(max(1, maximumLength), options.readChunkSize)
        return try await read { (fd) throws(ConnectionError) in try self.recvCopy(fd, limit: limit) }
    }

    /// Receives into the caller's buffer (TCP: what is available, at most `buffer.count` bytes; UDP: one
    /// datagram, `.messageTooLarge` when it did not fit). No allocation. Returns `nil` once at the end (TCP).
    public func receive(into buffer: UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Int? {
        try Received.requireRoom(buffer)
        gathering.noteReceive()
        if !readGate.tryEnter() { await readGate.enter() }
        defer { readGate.leave() }
        return try await read { (fd) throws(ConnectionError) in try self.recvOnce(fd, buffer) }
    }

    /// The read loop, inside the read gate: `attempt` (one non-blocking recv(2)), and on EAGAIN a wait for
    /// readability. What does not wait is in functions that are not `async`, so that a task waiting here (an idle
    /// connection's) keeps a small frame.
    @inline(never) private func read<R: Sendable>(
        _ attempt: (borrowing BorrowedDescriptor) throws(ConnectionError) -> IOResult<R>
    ) async throws(ConnectionError) -> R {
        if try beginRead() { await letOthersRun() }
        while true {
            if case .processed(let result) = try descriptor.withDescriptor(attempt) { return result }
            readsWithoutWait.store(0, ordering: .relaxed)
            try await readiness.waitReadable()
            try checkUsable()
        }
    }

    /// Gives the reactor's thread to the other sockets (or the task's thread to other tasks) for a turn.
    @inline(never)
    private func letOthersRun() async {
        if reactor.loop.inLoop { await reactor.loop.yieldUntilPolled() } else { await Task.yield() }
    }

    /// Before a read: `true` when the reader has found data `readsPerTurn` times in a row and should let others
    /// run first.
    @inline(never)
    private func beginRead() throws(ConnectionError) -> Bool {
        try checkUsable()
        if life.withLock({ $0.lifecycle.inputEnded }) { throw .closed("the end of the stream was already reported") }
        if readsWithoutWait.add(1, ordering: .relaxed).newValue > Self.readsPerTurn {
            readsWithoutWait.store(0, ordering: .relaxed)
            return true
        }
        return false
    }

    /// One non-blocking recv(2) of at most `limit` bytes into the calling thread's buffer, copied out at the length
    /// that arrived.
    @inline(never)
    private func recvCopy(_ fd: borrowing BorrowedDescriptor, limit: Int) throws(ConnectionError) -> IOResult<[UInt8]?>
    {
        let buffer = ThreadReadBuffer.take(limit)
        guard case .processed(let count) = try recvOnce(fd, buffer) else { return .wouldBlock }
        return .processed(count.map { [UInt8](UnsafeRawBufferPointer(rebasing: buffer[..<$0])) })
    }

    /// One non-blocking recv(2) into `buffer`: the count, `nil` at the end of a TCP stream (reported to the
    /// lifecycle), `.wouldBlock` when nothing is there.
    @inline(never)
    private func recvOnce(
        _ fd: borrowing BorrowedDescriptor, _ buffer: UnsafeMutableRawBufferPointer
    ) throws(ConnectionError) -> IOResult<Int?> {
        let result =
            transport == .udp
            ? try Syscall.recvDatagram(fd, buffer, dontWait: true) : try Syscall.recv(fd, buffer, dontWait: true)
        guard case .processed(let count) = result else { return .wouldBlock }
        if count == 0 && transport != .udp {
            _ = life.withLock { $0.lifecycle.handle(.peerEnded) }
            return .processed(nil)
        }
        if count > buffer.count {
            throw ConnectionError(.messageTooLarge, "a \(count)-byte datagram did not fit in \(buffer.count) bytes")
        }
        return .processed(count)
    }

    /// Sends all of `bytes` (UDP: one datagram), waiting for room without blocking a thread.
    public func send(_ bytes: [UInt8]) async throws(ConnectionError) {
        try await send(
            count: bytes.count, gather: { turn in bytes.withUnsafeBytes { gathering.offer($0, turn: turn) } }
        ) { (fd, offset) throws(ConnectionError) in
            try bytes.withBytes { (buffer) throws(ConnectionError) in
                try Syscall.send(fd, UnsafeRawBufferPointer(rebasing: buffer[offset...]), dontWait: true)
            }
        }
    }

    /// Sends bytes the caller keeps until this returns (`Connection.send(contentsOf:)`), from where they lie.
    public func send(contentsOf bytes: UnsafeRawBufferPointer) async throws(ConnectionError) {
        try await send(count: bytes.count, gather: { gathering.offer(bytes, turn: $0) }) {
            (fd, offset) throws(ConnectionError) in
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
    /// went; otherwise a processed UDP send is one whole datagram. What does not wait is in functions that are not
    /// `async`, so that the task's frames stay small (a task keeps its deepest stack's memory while it lives).
    private func send(
        count: Int, countsDatagrams: Bool = false, gather: (UInt32) -> SendGathering.Offer = { _ in .direct },
        _ write: (borrowing BorrowedDescriptor, Int) throws(ConnectionError) -> IOResult<Int>
    ) async throws(ConnectionError) {
        if !writeGate.tryEnter() { await writeGate.enter() }
        defer { writeGate.leave() }
        try beginSend()
        if transport == .tcp {
            switch gatherStep(gather) {
            case .done: return
            case .write: break
            case .writeGatheredFirst:
                try await writeGathered()
                if case .done = gatherStep(gather) { return }
            }
        }
        // What the socket takes at once, with no async call; only a send that finds it full waits (`sendHeld`).
        guard let sent = try writeSome(from: 0, count: count, countsDatagrams: countsDatagrams, write) else {
            return
        }
        try await sendHeld(from: sent, waitFirst: true, count: count, countsDatagrams: countsDatagrams, write)
    }

    /// Inside the write gate: `write` from `start` until all `count` went, waiting for room whenever the socket is
    /// full (`waitFirst`: it was full at `start`).
    func sendHeld(
        from start: Int = 0, waitFirst: Bool = false, count: Int, countsDatagrams: Bool,
        _ write: (borrowing BorrowedDescriptor, Int) throws(ConnectionError) -> IOResult<Int>
    ) async throws(ConnectionError) {
        var offset = start
        if !waitFirst {
            guard let sent = try writeSome(from: offset, count: count, countsDatagrams: countsDatagrams, write)
            else { return }
            offset = sent
        }
        while true {
            do throws(ConnectionError) {
                try await waitForRoom()
                try checkUsable()
            } catch {
                throw sendFailed(error, partly: offset > 0)
            }
            guard let sent = try writeSome(from: offset, count: count, countsDatagrams: countsDatagrams, write)
            else { return }
            offset = sent
        }
    }

    /// Before a send: throws unless the socket is usable and the lifecycle lets a send run.
    @inline(never)
    private func beginSend() throws(ConnectionError) {
        try checkUsable()
        if case .refuse(let error) = life.withLock({ $0.lifecycle.handle(.send) }) { throw error }
    }

    /// Writes from `offset` until all `count` went (`nil`) or the socket has no room (how far it got), with the
    /// descriptor borrowed for the writes.
    @inline(never)
    private func writeSome(
        from offset: Int, count: Int, countsDatagrams: Bool,
        _ write: (borrowing BorrowedDescriptor, Int) throws(ConnectionError) -> IOResult<Int>
    ) throws(ConnectionError) -> Int? {
        try descriptor.withDescriptor { (fd) throws(ConnectionError) in
            var offset = offset
            repeat {
                guard case .processed(let written) = try write(fd, offset) else { return offset }
                if transport == .udp && !countsDatagrams { return nil }
                offset += written
            } while offset < count
            return nil
        }
    }

    /// A wait for room that failed: a cancelled send that had written part of its message closes the output, as
    /// nothing can follow a partial message sensibly.
    @inline(never)
    private func sendFailed(_ error: ConnectionError, partly: Bool) -> ConnectionError {
        if error.kind == .cancelled && partly {
            if case .shutdownOutput = life.withLock({ $0.lifecycle.handle(.closeOutput) }) {
                descriptor.ifOpen { try? Syscall.shutdown($0, .write) }
            }
        }
        return error
    }

    /// Half-close (TCP): FIN after everything sent so far.
    public func closeOutput() async throws(ConnectionError) {
        guard transport == .tcp else { throw ConnectionError(.unsupported, "half-close needs a TCP connection") }
        if !writeGate.tryEnter() { await writeGate.enter() }
        defer { writeGate.leave() }
        try checkUsable()
        try await writeGathered()
        switch life.withLock({ $0.lifecycle.handle(.closeOutput) }) {
        case .shutdownOutput:
            try descriptor.withDescriptor { (fd) throws(ConnectionError) in try Syscall.shutdown(fd, .write) }
        case .refuse(let error): throw error
        default: return
        }
    }

    /// Throws unless the socket is started and not closed (an operation then borrows the descriptor for each
    /// system call).
    func checkUsable() throws(ConnectionError) {
        let closed = descriptor.isClosed
        let open = life.withLock { $0.lifecycle.isOpen }
        if closed || !open {
            throw closed && open ? ConnectionError(.unsupported, "the socket is not started") : .closed()
        }
    }

    // MARK: Closing

    /// Closes with a reset: a connected TCP peer gets `.reset` instead of an end of stream, and what is still
    /// unsent is discarded. Otherwise as ``close()``.
    public func abort() async {
        gathering.discard()  // dropped with the rest of what is unsent
        life.withLock { life in
            // Under the lock, no close has started, so the descriptor is still ours.
            if life.lifecycle.isOpen, transport == .tcp { descriptor.ifOpen { Syscall.resetConnection($0) } }
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
        await readGate.enter()
        await writeGate.enter()
        // Sends that returned and gathered go first (what the socket takes now), as before the reactor's next wait.
        descriptor.ifOpen { fd in
            _ = try? gathering.take(
                writeNow: { (bytes) throws(ConnectionError) in try Syscall.sendAvailable(fd, bytes) }, keepBuffer: false
            )
        }
        descriptor.close(beforeClosing: reactor.loop.unregister)
        writeGate.leave()
        readGate.leave()
        _ = life.withLock { $0.lifecycle.handle(.closeFinished) }
        set(.cancelled)
        life.withLock { $0.updates?.continuation }?.finish()
    }
}
