import ConnectionCore
import POSIXSupport
import Synchronization

/// A UDP "listener" in the blocking style: one bound socket and one reader thread blocking in `recvmmsg(2)`.
/// Datagrams are sorted by sender: the first datagram from a new address makes a new per-peer connection
/// (returned by ``accept()``); sends on that connection go back to that address with `sendto(2)`.
///
/// UDP has no flow control, so nothing here waits for a slow consumer: a datagram for a peer whose queue is
/// full, or from a new peer while too many new peers wait to be accepted, is dropped and counted, just as the
/// kernel drops datagrams when a socket's receive buffer is full.
final class BSDUDPListener: Listener, @unchecked Sendable {
    let transport = Transport.udp
    let localEndpoint: Endpoint
    let options: ConnectionOptions
    let socket: BSDSocket
    let lease: DescriptorLease
    let writer: BSDWriter
    private let peers: DatagramDemultiplexer<SocketAddress>
    private let closing = Atomic<Bool>(false)
    /// Datagrams dropped because a peer's queue or the accept queue was full.
    var droppedDatagrams: Int { peers.dropped }

    init(socket: BSDSocket, options: ConnectionOptions) throws(ConnectionError) {
        self.socket = socket
        self.options = options
        let lease = DescriptorLease(socket: socket)
        self.lease = lease
        let writer = BSDWriter(socket: socket, lease: lease, name: "bsd-uwrite-\(socket.descriptor)")
        self.writer = writer
        let local = try socket.localAddress.endpoint(.udp)
        self.localEndpoint = local
        self.peers = DatagramDemultiplexer(
            localEndpoint: local, options: options, endpoint: { $0.endpoint(.udp) },
            send: { bytes, address throws(ConnectionError) in try await writer.send(bytes, to: address) })
        _ = lease.retain()
        PosixThread.spawn(name: "bsd-urecv-\(socket.descriptor)") { [self] in receiveLoop() }
    }

    /// Reads with recvmmsg(2), up to 16 datagrams per call (blocking until the first), and sorts them by sender.
    private func receiveLoop() {
        defer { lease.release() }
        let capacity = options.maxDatagramSize
        let batch = DatagramBatch(slotSize: capacity)
        while true {
            do {
                guard case .processed = try batch.receive(socket.descriptor, dontWait: false) else { continue }
            } catch {
                if closing.load(ordering: .acquiring) { return }
                if error.kind == .refused { continue }  // a stale ICMP error for an earlier sendto
                peers.fail(error)
                return
            }
            if closing.load(ordering: .acquiring) { return }
            for index in 0..<batch.count {
                guard let from = try? batch.sender(index) else { continue }  // not an IP sender: nobody to serve
                let length = batch.length(index)
                if length > capacity {
                    peers.deliverFailure(
                        ConnectionError(.messageTooLarge, "a \(length)-byte datagram exceeds \(capacity) bytes"),
                        from: from)
                } else {
                    peers.deliver([UInt8](batch.bytes(index)), from: from)
                }
            }
        }
    }

    func accept() async throws(ConnectionError) -> any Connection { try await peers.accept() }

    func close() async {
        guard !closing.exchange(true, ordering: .acquiringAndReleasing) else {
            await lease.closed()
            return
        }
        peers.close()
        writer.stop()
        try? socket.shutdown(.both)  // wakes the thread blocked in recvmmsg(2)
        lease.release()
        await lease.closed()
    }
}
