import ConnectionCore
import POSIXSupport
import Synchronization

/// A UDP "listener" in the blocking style: one bound socket and one reader thread blocking in `recvfrom(2)`.
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
    private let queue: ReceiveQueue<any Connection>
    private let peers = Mutex<[SocketAddress: BSDUDPPeerConnection]>([:])
    private let closing = Atomic<Bool>(false)
    /// Datagrams dropped because a peer's queue or the accept queue was full.
    let droppedDatagrams = Atomic<Int>(0)

    init(socket: BSDSocket, options: ConnectionOptions) throws(ConnectionError) {
        self.socket = socket
        self.options = options
        let lease = DescriptorLease(socket: socket)
        self.lease = lease
        self.writer = BSDWriter(socket: socket, lease: lease, name: "bsd-uwrite-\(socket.descriptor)")
        self.localEndpoint = try socket.localAddress.endpoint(.udp)
        self.queue = ReceiveQueue(capacity: 1024)
        _ = lease.retain()
        PosixThread.spawn(name: "bsd-urecv-\(socket.descriptor)") { [self] in receiveLoop() }
    }

    private func receiveLoop() {
        defer { lease.release() }
        let capacity = options.maxDatagramSize
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: capacity, alignment: 16)
        defer { buffer.deallocate() }
        while true {
            let received: (count: Int, from: SocketAddress)
            do {
                guard case .processed(let result) = try Syscall.recvFrom(socket.descriptor, buffer) else { continue }
                received = result
            } catch {
                if closing.load(ordering: .acquiring) { return }
                if error.kind == .refused { continue }  // a stale ICMP error for an earlier sendto
                queue.finish(.failed(error))
                return
            }
            if closing.load(ordering: .acquiring) { return }
            let (peer, isNew) = peers.withLock { peers -> (BSDUDPPeerConnection, Bool) in
                if let peer = peers[received.from] { return (peer, false) }
                let peer = BSDUDPPeerConnection(listener: self, address: received.from)
                peers[received.from] = peer
                return (peer, true)
            }
            if received.count > capacity {
                peer.inbox.pushFailure(
                    ConnectionError(.messageTooLarge, "a \(received.count)-byte datagram exceeds \(capacity) bytes"))
            } else if peer.inbox.hasSpace {
                peer.inbox.push([UInt8](UnsafeRawBufferPointer(rebasing: buffer[..<received.count])))
            } else {
                droppedDatagrams.add(1, ordering: .relaxed)
            }
            if isNew && !queue.push(peer).accepted {
                forget(peer)
                droppedDatagrams.add(1, ordering: .relaxed)
            }
        }
    }

    func forget(_ peer: BSDUDPPeerConnection) {
        peers.withLock { peers in
            if peers[peer.address] === peer { peers[peer.address] = nil }
        }
        peer.inbox.close()
    }

    func accept() async throws(ConnectionError) -> any Connection {
        guard let connection = try await queue.next() else { throw .closed("the listener is closed") }
        return connection
    }

    func close() async {
        guard !closing.exchange(true, ordering: .acquiringAndReleasing) else {
            await lease.closed()
            return
        }
        _ = queue.close(.closed("the listener is closed"))
        let all = peers.withLock { peers in
            defer { peers.removeAll() }
            return Array(peers.values)
        }
        for peer in all { peer.inbox.close(.closed("the listener is closed")) }
        writer.stop()
        try? socket.shutdown(.both)  // wakes the thread blocked in recvfrom(2)
        lease.release()
        await lease.closed()
    }
}

/// One peer of a ``BSDUDPListener``: its datagrams, and sends back to its address on the listener's socket.
final class BSDUDPPeerConnection: Connection, @unchecked Sendable {
    let transport = Transport.udp
    let address: SocketAddress
    let localEndpoint: Endpoint
    let remoteEndpoint: Endpoint
    let options: ConnectionOptions
    let inbox: ReceiveQueue<[UInt8]>
    private let listener: BSDUDPListener
    private let closed = Atomic<Bool>(false)

    init(listener: BSDUDPListener, address: SocketAddress) {
        self.listener = listener
        self.address = address
        self.options = listener.options
        self.localEndpoint = listener.localEndpoint
        self.remoteEndpoint = address.endpoint(.udp)
        self.inbox = .datagrams(capacity: listener.options.receiveQueueLimit)
    }

    func send(_ message: Message) async throws(ConnectionError) {
        if closed.load(ordering: .relaxed) || inbox.isEnded { throw .closed() }
        try await listener.writer.send(message.bytes, to: address)
    }

    func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        guard let bytes = try await inbox.next() else { return nil }
        return Message(bytes)
    }

    func closeOutput() async throws(ConnectionError) {
        throw ConnectionError(.unsupported, "UDP has no half-close")
    }

    func close() async {
        guard !closed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        listener.forget(self)
    }
}
