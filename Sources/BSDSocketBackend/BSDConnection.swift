import ConnectionCore
import POSIXSupport
import Synchronization

/// The blocking style adapted to ``Connection`` (TCP, and connected UDP) without ever blocking Swift's
/// cooperative thread pool:
/// - a **reader thread** per connection blocks in `recv(2)` and hands each chunk (or datagram) to a bounded
///   ``ReceiveQueue``; when the queue is full it sleeps until `receive` makes room, so a slow consumer slows
///   the peer through TCP flow control instead of growing memory;
/// - sends go through ``BSDWriter`` (a non-blocking attempt first, then a writer thread);
/// - `close()` shuts the socket down (which wakes both threads), waits until they have finished, and only
///   then closes the descriptor.
final class BSDConnection: Connection, @unchecked Sendable {
    let transport: Transport
    let localEndpoint: Endpoint
    let remoteEndpoint: Endpoint
    let options: ConnectionOptions
    private let core: Core

    /// The part shared with the threads. The user-facing object can go away (its deinit starts a close) while
    /// the threads finish with the core.
    final class Core: @unchecked Sendable {
        let socket: BSDSocket
        let lease: DescriptorLease
        let inbox: ReceiveQueue<[UInt8]>
        let writer: BSDWriter
        let readGate = ConditionLock()
        let closing = Atomic<Bool>(false)
        let chunkSize: Int

        init(socket: BSDSocket, options: ConnectionOptions) {
            self.socket = socket
            let lease = DescriptorLease(socket: socket)
            self.lease = lease
            let gate = readGate
            let onSpace: @Sendable () -> Void = { gate.withLock { gate.signal() } }
            self.inbox =
                socket.transport == .udp
                ? .datagrams(capacity: options.receiveQueueLimit, onSpaceAvailable: onSpace)
                : .byteStream(capacity: options.receiveQueueLimit, onSpaceAvailable: onSpace)
            self.writer = BSDWriter(socket: socket, lease: lease, name: "bsd-write-\(socket.descriptor)")
            self.chunkSize = socket.transport == .udp ? options.maxDatagramSize : options.readChunkSize
        }

        /// The reader thread's loop. Runs until end of stream, error or close.
        func readLoop() {
            defer { lease.release() }
            let datagram = socket.transport == .udp
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: chunkSize, alignment: 16)
            defer { buffer.deallocate() }
            while true {
                readGate.withLock { readGate.wait(until: { inbox.hasSpace || closing.load(ordering: .relaxed) }) }
                if closing.load(ordering: .acquiring) { return }
                let count: Int
                do {
                    count = try socket.receive(into: buffer)
                } catch {
                    if closing.load(ordering: .acquiring) { return }
                    if datagram && (error.kind == .refused || error.kind == .messageTooLarge) {
                        // ICMP port unreachable or an oversized datagram: reported, but the socket lives on.
                        inbox.pushFailure(error)
                        continue
                    }
                    inbox.finish(.failed(error))
                    return
                }
                if closing.load(ordering: .acquiring) { return }
                if count == 0 && !datagram {
                    inbox.finish(.finished)
                    return
                }
                let chunk = [UInt8](UnsafeRawBufferPointer(rebasing: buffer[..<count]))
                _ = inbox.push(chunk)
            }
        }

        /// Starts closing: no new operations, waiting ones fail with `.closed`, threads are woken.
        func beginClose() -> Bool {
            guard !closing.exchange(true, ordering: .acquiringAndReleasing) else { return false }
            inbox.close()
            writer.stop()
            readGate.withLock { readGate.broadcast() }
            try? socket.shutdown(.both)
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
        startReader(onCurrentThread: false)
    }

    /// Wraps a connected socket; the caller's thread will run the read loop (see ``runReaderHere()``).
    init(socket: BSDSocket, options: ConnectionOptions, readerOnCallingThread: Void) throws(ConnectionError) {
        self.transport = socket.transport
        self.options = options
        self.localEndpoint = try socket.localAddress.endpoint(socket.transport)
        self.remoteEndpoint = try socket.remoteAddress.endpoint(socket.transport)
        self.core = Core(socket: socket, options: options)
        startReader(onCurrentThread: true)
    }

    private func startReader(onCurrentThread: Bool) {
        _ = core.lease.retain()
        if !onCurrentThread {
            let core = core
            PosixThread.spawn(name: "bsd-read-\(core.socket.descriptor)") { core.readLoop() }
        }
    }

    /// Runs the read loop on the calling thread (the thread that connected), until the connection ends.
    func runReaderHere() { core.readLoop() }

    deinit {
        _ = core.beginClose()
    }

    func send(_ message: Message) async throws(ConnectionError) {
        if core.closing.load(ordering: .relaxed) { throw .closed() }
        try await core.writer.send(message.bytes)
    }

    func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        guard let bytes = try await core.inbox.next(maximumLength: maximumLength) else { return nil }
        return Message(bytes)
    }

    func closeOutput() async throws(ConnectionError) {
        guard transport == .tcp else { throw ConnectionError(.unsupported, "half-close needs a TCP connection") }
        if core.closing.load(ordering: .relaxed) { throw .closed() }
        try await core.writer.shutdownOutput()
    }

    func close() async {
        _ = core.beginClose()
        await core.lease.closed()
    }
}
