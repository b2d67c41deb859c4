@_spi(Loop) import ConnectionCore
import POSIXSupport
import Synchronization

/// The blocking style adapted to ``Connection`` (TCP, and connected UDP) without ever blocking Swift's
/// cooperative thread pool:
/// - a **reader thread** per connection blocks in `poll(2)` until its socket is readable, reads, and hands each
///   chunk (or datagram) to a bounded ``ReceiveQueue``; when the queue is full it stops reading until `receive`
///   makes room, so a slow consumer slows the peer through TCP flow control instead of growing memory;
/// - the reader thread is also the connection's ``preferredExecutor`` (``ReaderExecutor``): a task that prefers
///   it runs between reads on that thread, so a message the reader queues is taken without a thread hop, and a
///   TCP receive there with nothing queued reads the socket itself: at once when its last read did not empty
///   the socket, otherwise after waiting right there in the reader's poll (``Core/waitInPlace()``), so the task
///   goes on in the same job as a blocking recv(2) would, with no suspension;
/// - sends go through ``BSDWriter`` (a non-blocking attempt first, then a writer thread);
/// - `close()` shuts the socket down (which wakes both threads), waits until they have finished, and only
///   then closes the descriptor.
final class BSDConnection: Connection, Sendable {
    let transport: Transport
    let localEndpoint: Endpoint
    let remoteEndpoint: Endpoint
    let options: ConnectionOptions
    private let core: Core

    /// The part shared with the threads. The user-facing object can go away (its deinit starts a close) while
    /// the threads finish with the core.
    final class Core: Sendable {
        let socket: BSDSocket
        let lease: DescriptorLease
        let inbox: ReceiveQueue<[UInt8]>
        let writer: BSDWriter
        let executor: ReaderExecutor
        /// Open, closing, closed: the connection's life (ConnectionCore's one state machine).
        let life = SharedLifecycle()
        let chunkSize: Int
        /// The reader thread's read buffer; also used by a receive running on that thread (``readNow(_:)``).
        let scratch: LoopConfined<UnsafeMutableRawBufferPointer>

        init(socket: BSDSocket, options: ConnectionOptions) {
            self.socket = socket
            let lease = DescriptorLease(closing: socket.close)
            self.lease = lease
            let executor = ReaderExecutor()
            self.executor = executor
            let onSpace: @Sendable () -> Void = { executor.wake() }
            self.inbox =
                socket.transport == .udp
                ? .datagrams(capacity: options.receiveQueueLimit, onSpaceAvailable: onSpace)
                : .byteStream(capacity: options.receiveQueueLimit, onSpaceAvailable: onSpace)
            self.writer = BSDWriter(
                socket: socket, lease: lease, name: "bsd-write-\(socket.label)", executor: executor)
            self.chunkSize = socket.transport == .udp ? options.maxDatagramSize : options.readChunkSize
            self.scratch = LoopConfined(
                .allocate(byteCount: chunkSize, alignment: 16), on: executor.thread, release: { $0.deallocate() })
        }

        /// A receive on the reader thread (TCP, empty queue) reads the socket itself: one non-blocking recv(2) of
        /// up to a chunk, so a reply that is already in the kernel is taken without suspending or polling.
        func readNow() -> ReceiveQueue<[UInt8]>.DirectRead {
            if !life.isOpen { return .nothing }
            do {
                let scratch = self.scratch.withValue { $0 }
                switch try socket.tryReceive(into: scratch) {
                case .wouldBlock: return .nothing
                case .processed(0): return .end(.finished)
                case .processed(let count):
                    return .element(
                        [UInt8](UnsafeRawBufferPointer(rebasing: scratch[..<count])), drained: count < scratch.count)
                }
            } catch {
                return .end(.failed(error))
            }
        }

        /// A receive on the reader thread that would wait (the queue is idle and the last read emptied the
        /// socket) waits right here, in the poll the reader loop would make, instead of suspending the task and
        /// letting the loop poll, read, queue and resume it: the task goes on in the same job, as a blocking
        /// recv(2) would. A job for this executor, a ``ReaderExecutor/wake()`` (close, room) or the task's
        /// cancellation ends the poll early; the receive then waits as usual.
        @inline(__always) func waitInPlace() async {
            guard inbox.sourceDrained, !Task.isCancelled, life.isOpen, inbox.isIdle else {
                return
            }
            let executor = executor
            let socket = socket
            let revents = await withTaskCancellationHandler {
                socket.ifOpen { (try? executor.wait(socket: $0, events: Syscall.pollIn)) ?? 0 } ?? 0
            } onCancel: {
                executor.wake()
            }
            if revents != 0 { inbox.sourceDrained = false }
        }

        /// ``readNow()`` into the caller's buffer (`Connection.receive(into:)`): no allocation, no copy.
        func readNow(into buffer: UnsafeMutableRawBufferPointer) -> DirectReadCount {
            if !life.isOpen { return .nothing }
            return DirectReadCount { () throws(ConnectionError) in try socket.tryReceive(into: buffer) }
        }

        /// The reader thread's loop: runs the jobs of tasks that prefer this connection, waits in poll(2) for the
        /// socket (for jobs only while the receive queue is full), reads. Runs until end of stream, error or close.
        func readLoop() {
            defer {
                executor.stop()
                lease.release()
            }
            executor.bindReaderThread()
            let datagram = socket.transport == .udp
            let buffer = scratch.withValue { $0 }
            while true {
                executor.runJobs()
                if !life.isOpen { return }
                let reading = inbox.hasSpace
                let count: Int
                do {
                    // The descriptor is borrowed for the wait: a close meanwhile wakes it (`ReaderExecutor.wake`).
                    guard reading else {
                        try executor.waitForJobs()
                        continue
                    }
                    let ready = try socket.withDescriptor { (fd) throws(ConnectionError) in
                        try executor.wait(socket: fd, events: Syscall.pollIn)
                    }
                    if !life.isOpen { return }
                    guard ready != 0, case .processed(let received) = try socket.tryReceive(into: buffer)
                    else { continue }
                    count = received
                } catch {
                    if !life.isOpen { return }
                    if datagram && (error.kind == .refused || error.kind == .messageTooLarge) {
                        // ICMP port unreachable or an oversized datagram: reported, but the socket lives on.
                        inbox.pushFailure(error)
                        continue
                    }
                    inbox.finish(.failed(error))
                    return
                }
                if !life.isOpen { return }
                if count == 0 && !datagram {
                    inbox.finish(.finished)
                    return
                }
                let chunk = [UInt8](UnsafeRawBufferPointer(rebasing: buffer[..<count]))
                _ = inbox.push(chunk, sourceDrained: !datagram && count < buffer.count)
            }
        }

        /// Starts closing: no new operations, waiting ones fail with `.closed`, threads are woken.
        func beginClose() -> Bool {
            guard life.beginCloseWithoutWaiting() else { return false }
            inbox.close()
            writer.stop()
            try? socket.shutdown(.both)
            executor.wake()
            lease.release()  // the owner's use
            return true
        }
    }

    /// Wraps a connected socket and starts its reader thread.
    init(socket: BSDSocket, options: ConnectionOptions) throws(ConnectionError) {
        self.transport = socket.transport
        self.options = options
        self.localEndpoint = try socket.localAddress.endpoint(socket.transport)
        self.remoteEndpoint = try socket.remoteAddress.endpoint(socket.transport)
        self.core = Core(socket: socket, options: options)
        try startReader(onCurrentThread: false)
    }

    /// Wraps a connected socket; the caller's thread will run the read loop (see ``runReaderHere()``).
    init(socket: BSDSocket, options: ConnectionOptions, readerOnCallingThread: Void) throws(ConnectionError) {
        self.transport = socket.transport
        self.options = options
        self.localEndpoint = try socket.localAddress.endpoint(socket.transport)
        self.remoteEndpoint = try socket.remoteAddress.endpoint(socket.transport)
        self.core = Core(socket: socket, options: options)
        try startReader(onCurrentThread: true)
    }

    /// Gives the reader its use of the descriptor and, unless the calling thread will read, a thread. When the
    /// system has no thread left (a thread per connection meets the process's or the system's limit), the
    /// connection is closed and the error thrown: the caller (a listener, a connect) fails that one connection.
    private func startReader(onCurrentThread: Bool) throws(ConnectionError) {
        _ = core.lease.retain()
        if !onCurrentThread {
            let core = core
            if let error = PosixThread.trySpawn(name: "bsd-read-\(core.socket.label)", { core.readLoop() }) {
                core.executor.stop()
                core.lease.release()  // the reader's use
                _ = core.beginClose()  // the owner's: the descriptor is closed
                throw error
            }
        }
    }

    /// Runs the read loop on the calling thread (the thread that connected), until the connection ends.
    func runReaderHere() { core.readLoop() }

    deinit {
        _ = core.beginClose()
    }

    var preferredExecutor: (any TaskExecutor)? { core.executor }
    /// A send tries the non-blocking send(2) on the calling thread first (``BSDWriter``).
    var sendsFromAnyThread: Bool { true }

    func send(_ message: Message) async throws(ConnectionError) {
        if !core.life.isOpen { throw .closed() }
        try await core.writer.send(message.bytes)
    }

    func send(contentsOf bytes: UnsafeRawBufferPointer) async throws(ConnectionError) {
        if !core.life.isOpen { throw .closed() }
        try await core.writer.send(contentsOf: bytes)
    }

    func send(batch: [UnsafeRawBufferPointer]) async throws(ConnectionError) {
        guard transport == .udp else { return try await sendEach(batch) }
        if !core.life.isOpen { throw .closed() }
        try await core.writer.send(batch: batch)
    }

    func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        core.writer.noteReceive()
        let core = core
        let bytes: [UInt8]?
        if transport == .tcp, core.executor.isCurrent {
            await core.waitInPlace()
            bytes = try await core.inbox.next(maximumLength: maximumLength) { core.readNow() }
        } else {
            bytes = try await core.inbox.next(maximumLength: maximumLength)
        }
        guard let bytes else { return nil }
        return Message(bytes)
    }

    func receive(into buffer: UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Received? {
        core.writer.noteReceive()
        let core = core
        let count: Int?
        if transport == .tcp, core.executor.isCurrent {
            await core.waitInPlace()
            count = try await core.inbox.next(into: buffer) { core.readNow(into: $0) }
        } else {
            count = try await core.inbox.next(into: buffer)
        }
        return count.map { Received(count: $0) }
    }

    func closeOutput() async throws(ConnectionError) {
        guard transport == .tcp else { throw ConnectionError(.unsupported, "half-close needs a TCP connection") }
        if !core.life.isOpen { throw .closed() }
        try await core.writer.shutdownOutput()
    }

    func close() async {
        _ = core.beginClose()
        await core.lease.closed()
        core.life.closeFinished()
    }

    func abort() async {
        core.writer.discardGathered()  // dropped with the rest of what is unsent
        // The lease keeps the descriptor number ours while the reset is sent.
        if transport == .tcp, core.life.isOpen, core.lease.retain() {
            core.socket.ifOpen { Syscall.resetConnection($0) }
            core.lease.release()
        }
        await close()
    }
}
