@_spi(Loop) import ConnectionCore
import POSIXSupport
import Synchronization

/// A TCP connection on a libuv loop. Reads go into a bounded ``ReceiveQueue``: when it is full the handle
/// stops reading (`uv_read_stop`) until a receive makes room. Sends try `uv_try_write` first (from another thread:
/// send(2) on that thread) and queue the rest with `uv_write`; each send returns when its bytes are written, so a
/// fast sender waits for a slow peer.
final class UVTCPConnection: Connection, Sendable {
    let transport = Transport.tcp
    let localEndpoint: Endpoint
    let remoteEndpoint: Endpoint
    let options: ConnectionOptions
    private let tcp: UVTCP
    private let loop: UVLoop
    private let inbox: ReceiveQueue<[UInt8]>
    private let life = SharedLifecycle()
    /// Reading stopped because the queue was full. Read and written on the loop thread only; an atomic (relaxed: a
    /// plain load and store) rather than a `LoopConfined`, which is two allocations per connection for one flag.
    private let readingPaused = Atomic<Bool>(false)

    /// One send at a time, each until libuv has written all of it: a send from off the loop writes on its own
    /// thread, and what the socket does not take then must reach libuv's queue before a later send's bytes.
    private let writes = WriteThrough()

    /// The loop thread: a task there is resumed by read callbacks without a hop, and sends without a wake-up.
    var preferredExecutor: (any TaskExecutor)? { loop }

    /// A send from off the loop writes on its own thread when the socket has room (`UVTCP.writeFromAnyThread`).
    var sendsFromAnyThread: Bool { true }

    /// On the loop thread: wraps a connected handle and starts reading.
    init(tcp: UVTCP, options: ConnectionOptions) throws(ConnectionError) {
        self.tcp = tcp
        self.loop = tcp.loop
        self.options = options
        do throws(UVError) {
            localEndpoint = try tcp.localAddress.endpoint(.tcp)
            remoteEndpoint = try tcp.peerAddress.endpoint(.tcp)
        } catch {
            throw error.connectionError("getpeername")
        }
        let loop = tcp.loop
        inbox = .byteStream(capacity: options.receiveQueueLimit)
        inbox.setOnSpaceAvailable { [weak self] in
            guard let self else { return }
            loop.execute { self.resumeReading() }
        }
        tcp.allowWritesFromAnyThread()
        do throws(UVError) {
            try tcp.readStart(makeReadCallback())
        } catch {
            throw error.connectionError("uv_read_start")
        }
    }

    private func pauseReading() {
        readingPaused.store(true, ordering: .relaxed)
        tcp.readStop()
    }

    private func resumeReading() {
        guard readingPaused.load(ordering: .relaxed), !tcp.isClosing, inbox.hasSpace else { return }
        readingPaused.store(false, ordering: .relaxed)
        try? tcp.readStart(makeReadCallback())
    }

    /// The read callback: copies each read into the queue, stops reading when it is full, and turns the end
    /// of the stream or an error into the queue's end.
    private func makeReadCallback() -> (UVReadResult) -> Void {
        { [inbox, tcp, weak self] result in
            switch result {
            case .data(let bytes):
                let drained = bytes.count < tcp.readBufferSize
                if !inbox.push([UInt8](bytes), sourceDrained: drained).hasSpace { self?.pauseReading() }
            case .endOfStream:
                inbox.finish(.finished)
                tcp.readStop()
            case .failure(let error):
                inbox.finish(.failed(error.connectionError("read")))
                tcp.readStop()
            }
        }
    }

    deinit {
        if life.beginCloseWithoutWaiting() {
            let tcp = tcp
            let inbox = inbox
            loop.execute {
                inbox.close()
                tcp.close()
            }
        }
    }

    func send(_ message: Message) async throws(ConnectionError) {
        if case .refuse(let error) = life.handle(.send) { throw error }
        try await writes.send(
            message.bytes, turn: loop.isOnLoopThread ? loop.turn : nil, askFlush: askFlush, writeNow: writeNow,
            queue: queueOnLoop)
    }

    func send(contentsOf bytes: UnsafeRawBufferPointer) async throws(ConnectionError) {
        if case .refuse(let error) = life.handle(.send) { throw error }
        try await writes.send(
            contentsOf: bytes, turn: loop.isOnLoopThread ? loop.turn : nil, askFlush: askFlush, writeNow: writeNow,
            queue: queueOnLoop)
    }

    /// Sends gathered in this turn of the loop (`WriteThrough`): written before the loop next polls. What the socket
    /// does not take then goes to libuv's write queue as any send's rest does, the write gate held until it is
    /// written.
    private func askFlush() {
        loop.beforeSleep { [self] in
            guard let rest = writes.writeGatheredNow(writeNow: writeNow) else { return }
            Task { [self] in
                try? await queueOnLoop(rest)
                writes.gate.leave()
            }
        }
    }

    /// Inside the write gate: writes what the socket takes now, with no suspension: `uv_try_write` on the loop
    /// thread (a task that prefers the loop), a send(2) on any other (`UVTCP.writeFromAnyThread`). Returns the
    /// count written.
    private func writeNow(_ bytes: UnsafeRawBufferPointer) throws(ConnectionError) -> Int {
        do throws(UVError) {
            if loop.isOnLoopThread { return tcp.isClosing ? 0 : try tcp.tryWrite(bytes) }
            return try tcp.writeFromAnyThread(bytes)
        } catch {
            throw error.connectionError("write")
        }
    }

    /// Inside the write gate: `rest` to the loop, which writes what the kernel takes and queues the remainder with
    /// `uv_write`; returns once it is written.
    private func queueOnLoop(_ rest: [UInt8]) async throws(ConnectionError) {
        let result: Result<Void, ConnectionError> = await withCheckedContinuation { continuation in
            loop.executeHere { [tcp] in
                guard !tcp.isClosing else { return continuation.resume(returning: .failure(.closed())) }
                do throws(UVError) {
                    let now = try tcp.tryWrite(rest)
                    if now == rest.count { return continuation.resume(returning: .success(())) }
                    try tcp.write(now == 0 ? rest : Array(rest[now...])) { error in
                        continuation.resume(
                            returning: error.map {
                                .failure($0.isCanceled ? .closed() : $0.connectionError("write"))
                            } ?? .success(()))
                    }
                } catch {
                    continuation.resume(returning: .failure(error.connectionError("write")))
                }
            }
        }
        try result.get()
    }

    func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        writes.gathering.noteReceive()
        let bytes: [UInt8]?
        if loop.isOnLoopThread {
            // On the loop (a task that prefers it): bytes already in the kernel are read here, without waiting
            // for the loop's next epoll and read callback.
            bytes = try await inbox.next(maximumLength: maximumLength) { [tcp] in
                do throws(ConnectionError) {
                    switch try tcp.readNow() {
                    case .wouldBlock: return .nothing
                    case .processed(let read?): return .element(read.bytes, drained: read.drained)
                    case .processed(nil): return .end(.finished)
                    }
                } catch {
                    return .end(.failed(error))
                }
            }
        } else {
            bytes = try await inbox.next(maximumLength: maximumLength)
        }
        guard let bytes else { return nil }
        return Message(bytes)
    }

    func receive(into buffer: UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Received? {
        writes.gathering.noteReceive()
        let count: Int?
        if loop.isOnLoopThread {
            count = try await inbox.next(into: buffer) { [tcp] buffer in
                DirectReadCount { () throws(ConnectionError) in try tcp.readNow(into: buffer) }
            }
        } else {
            count = try await inbox.next(into: buffer)
        }
        return count.map { Received(count: $0) }
    }

    func closeOutput() async throws(ConnectionError) {
        switch life.handle(.closeOutput) {
        case .refuse(let error): throw error
        case .shutdownOutput: break
        default: return
        }
        // After the send in progress, if any (one from another thread writes around libuv's queue).
        if !writes.gate.tryEnter() { await writes.gate.enter() }
        defer { writes.gate.leave() }
        try await writes.writeGathered(writeNow: writeNow, queue: queueOnLoop)
        let result: Result<Void, ConnectionError> = await withCheckedContinuation { continuation in
            loop.executeHere { [tcp] in
                guard !tcp.isClosing else { return continuation.resume(returning: .failure(.closed())) }
                do throws(UVError) {
                    // uv_shutdown waits for the writes queued before it.
                    try tcp.shutdown { error in
                        continuation.resume(
                            returning: error.map { .failure($0.connectionError("shutdown")) } ?? .success(()))
                    }
                } catch {
                    continuation.resume(returning: .failure(error.connectionError("shutdown")))
                }
            }
        }
        try result.get()
    }

    func close() async {
        await life.close { [self] finished in
            loop.execute { [self] in
                // Sends that returned and gathered go first (what the socket takes now), as they would have before
                // the loop's next poll.
                if writes.writeGatheredNow(writeNow: writeNow) != nil { writes.gate.leave() }
                inbox.close()
                tcp.close(finished)
            }
        }
    }

    func abort() async {
        writes.gathering.discard()  // dropped with the rest of what is unsent
        if life.isOpen { loop.execute { [tcp] in tcp.resetConnection() } }
        await close()
    }
}

/// A connected UDP socket on a libuv loop: one datagram per receive callback, into a bounded queue (a datagram
/// that finds the queue full is dropped, as the kernel would drop it).
final class UVUDPConnection: Connection, Sendable {
    let transport = Transport.udp
    let localEndpoint: Endpoint
    let remoteEndpoint: Endpoint
    let options: ConnectionOptions
    private let udp: UVUDP
    private let loop: UVLoop
    private let inbox: ReceiveQueue<[UInt8]>
    private let life = SharedLifecycle()
    /// Datagrams dropped because the queue was full.
    let dropped = Atomic<Int>(0)

    var preferredExecutor: (any TaskExecutor)? { loop }

    /// A send from off the loop goes straight to the connected socket when it has room (`UVUDP.sendFromAnyThread`).
    var sendsFromAnyThread: Bool { true }

    init(udp: UVUDP, peer: SocketAddress, options: ConnectionOptions) throws(UVError) {
        self.udp = udp
        self.loop = udp.loop
        self.options = options
        localEndpoint = try udp.localAddress.endpoint(.udp)
        remoteEndpoint = peer.endpoint(.udp)
        let inbox = ReceiveQueue<[UInt8]>.datagrams(capacity: options.receiveQueueLimit)
        self.inbox = inbox
        try udp.receiveStart { [weak self] result in
            switch result {
            case .datagram(let bytes, _, let truncated):
                if truncated {
                    inbox.pushFailure(ConnectionError(.messageTooLarge, "a datagram exceeded \(bytes.count) bytes"))
                } else if inbox.hasSpace {
                    inbox.push([UInt8](bytes))
                } else {
                    self?.dropped.add(1, ordering: .relaxed)
                }
            case .failure(let error):
                // ECONNREFUSED after an ICMP port-unreachable: reported, the socket lives on.
                inbox.pushFailure(error.connectionError("receive"))
            }
        }
    }

    deinit {
        if life.beginCloseWithoutWaiting() {
            let udp = udp
            let inbox = inbox
            loop.execute {
                inbox.close()
                udp.close()
            }
        }
    }

    func send(_ message: Message) async throws(ConnectionError) {
        if case .refuse(let error) = life.handle(.send) { throw error }
        if !loop.isOnLoopThread {
            let sent = message.bytes.withUnsafeBytes { raw in
                Result { () throws(UVError) in try udp.sendFromAnyThread(raw) }
            }
            do throws(UVError) {
                if try sent.get() { return }
            } catch {
                throw error.connectionError("send")
            }
        }
        try await sendDatagram(message.bytes, on: udp, to: nil, loop: loop)
    }

    func send(batch: [UnsafeRawBufferPointer]) async throws(ConnectionError) {
        if case .refuse(let error) = life.handle(.send) { throw error }
        // On the loop thread, straight to the socket; what it does not take then goes the way of every send.
        let sent = loop.isOnLoopThread ? try udp.trySend(batch: batch, from: 0) : 0
        for bytes in batch[sent...] { try await sendDatagram(Array(bytes), on: udp, to: nil, loop: loop) }
    }

    func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        guard let bytes = try await inbox.next() else { return nil }
        return Message(bytes)
    }

    func closeOutput() async throws(ConnectionError) {
        throw ConnectionError(.unsupported, "UDP has no half-close")
    }

    func close() async {
        await life.close { [loop, inbox, udp] finished in
            loop.execute {
                inbox.close()
                udp.close(finished)
            }
        }
    }
}

/// Sends one datagram on the loop: `uv_udp_try_send`, then `uv_udp_send` when the socket buffer is full.
/// Called on the loop thread, it tries at once.
func sendDatagram(
    _ bytes: [UInt8], on udp: UVUDP, to address: SocketAddress?, loop: UVLoop
)
    async throws(ConnectionError)
{
    // On the loop thread (a task that prefers it), the common case is one uv_udp_try_send and no suspension
    // (it returns EAGAIN while earlier sends are queued, so order is kept).
    if loop.isOnLoopThread, !udp.isClosing {
        do throws(UVError) {
            if try udp.trySend(bytes, to: address) { return }
        } catch {
            throw error.connectionError("send")
        }
    }
    let result: Result<Void, ConnectionError> = await withCheckedContinuation { continuation in
        loop.executeHere {
            guard !udp.isClosing else { return continuation.resume(returning: .failure(.closed())) }
            do throws(UVError) {
                let sent = try udp.trySend(bytes, to: address)
                if sent { return continuation.resume(returning: .success(())) }
                try udp.send(bytes, to: address) { error in
                    continuation.resume(
                        returning: error.map { .failure($0.isCanceled ? .closed() : $0.connectionError("send")) }
                            ?? .success(()))
                }
            } catch {
                continuation.resume(returning: .failure(error.connectionError("send")))
            }
        }
    }
    try result.get()
}
