import ConnectionCore
import POSIXSupport
import Synchronization

/// A UDP "listener" in the blocking style: one bound socket and one reader thread that waits in poll(2) and reads
/// with `recvmmsg(2)`. Datagrams are sorted by sender: the first datagram from a new address makes a new per-peer
/// connection (returned by ``accept()``); sends on that connection go back to that address with `sendto(2)`.
///
/// The reader thread is the peers' executor (as a TCP connection's reader is its connection's): a task that
/// prefers it consumes the datagrams on the thread that read them. With the consumer on Swift's pool instead,
/// every batch woke a pool thread: on one CPU shared with a sender, the pump's sink received about 42k 1,400-byte
/// datagrams a second where the C sink received 54k; on the reader thread, 142k (docs/benchmarks.md, session 21).
///
/// UDP has no flow control, so nothing here waits for a slow consumer: a datagram for a peer whose queue is
/// full, or from a new peer while too many new peers wait to be accepted, is dropped and counted, just as the
/// kernel drops datagrams when a socket's receive buffer is full.
final class BSDUDPListener: Listener, Sendable {
    let transport = Transport.udp
    let localEndpoint: Endpoint
    let options: ConnectionOptions
    let socket: BSDSocket
    let lease: DescriptorLease
    let writer: BSDWriter
    private let peers: DatagramDemultiplexer<SocketAddress>
    private let executor: ReaderExecutor
    private let life = SharedLifecycle()
    /// Datagrams dropped because a peer's queue or the accept queue was full.
    var droppedDatagrams: Int { peers.dropped }

    init(socket: BSDSocket, options: ConnectionOptions) throws(ConnectionError) {
        self.socket = socket
        self.options = options
        let lease = DescriptorLease(closing: socket.close)
        self.lease = lease
        let writer = BSDWriter(socket: socket, lease: lease, name: "bsd-uwrite-\(socket.label)")
        self.writer = writer
        let local = try socket.localAddress.endpoint(.udp)
        self.localEndpoint = local
        let executor = ReaderExecutor()
        self.executor = executor
        self.peers = DatagramDemultiplexer(
            localEndpoint: local, options: options, executor: executor, endpoint: { $0.endpoint(.udp) },
            send: { bytes, address throws(ConnectionError) in try await writer.send(bytes, to: address) })
        _ = lease.retain()
        PosixThread.spawn(name: "bsd-urecv-\(socket.label)") { [self] in receiveLoop() }
    }

    /// Runs the peers' jobs, waits in poll(2) for datagrams (or a job), reads up to 16 per recvmmsg(2) and sorts
    /// them by sender.
    private func receiveLoop() {
        defer {
            executor.stop()
            lease.release()
        }
        executor.bindReaderThread()
        // poll(2) is level-triggered, so single datagrams may be read one at a time.
        let batch = DatagramBatch(slotSize: options.maxDatagramSize, singlesAfterSingles: true)
        let socket = socket
        // After an answer the next request is often there already (``ReadBeforeWait``).
        var policy = ReadBeforeWait()
        while true {
            executor.runJobs()
            if !life.isOpen { return }
            do {
                if policy.readsFirst {
                    let received = try socket.withDescriptor { (fd) throws(ConnectionError) in
                        try batch.receive(fd, dontWait: true)
                    }
                    if case .processed = received {
                        policy.found(afterWait: false)
                        peers.deliver(batch)
                        continue
                    }
                    policy.missed()
                }
                guard
                    try socket.withDescriptor({ (fd) throws(ConnectionError) in
                        try executor.wait(socket: fd, events: Syscall.pollIn)
                    }) != 0,
                    life.isOpen,
                    case .processed = try socket.withDescriptor({ (fd) throws(ConnectionError) in
                        try batch.receive(fd, dontWait: true)
                    })
                else { continue }
                policy.found(afterWait: true)
            } catch {
                if !life.isOpen { return }
                if error.kind == .refused { continue }  // a stale ICMP error for an earlier sendto
                peers.fail(error)
                return
            }
            if !life.isOpen { return }
            peers.deliver(batch)
        }
    }

    func accept() async throws(ConnectionError) -> any Connection { try await peers.accept() }

    func close() async {
        await life.close { [self] in
            peers.close()
            writer.stop()
            executor.wake()  // the reader thread, waiting in poll(2), sees the listener closing
            lease.release()
            await lease.closed()
        }
    }
}
