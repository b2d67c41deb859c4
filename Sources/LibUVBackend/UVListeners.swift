import ConnectionCore
import POSIXSupport
import Synchronization

/// A TCP listener on a libuv loop: each connection callback accepts into a new handle, which starts reading
/// at once and waits in a queue for ``accept()``.
final class UVTCPListener: Listener, @unchecked Sendable {
    let transport = Transport.tcp
    let localEndpoint: Endpoint
    private let tcp: UVTCP
    private let loop: UVLoop
    private let queue = ReceiveQueue<any Connection>(capacity: 1024)
    private let gate = UVCloseGate()
    private let closed = Atomic<Bool>(false)

    /// On the loop thread.
    init(loop: UVLoop, address: SocketAddress, options: ConnectionOptions) throws(ConnectionError) {
        self.loop = loop
        do throws(UVError) {
            tcp = try UVTCP(loop: loop, readBufferSize: options.readChunkSize)
        } catch {
            throw error.connectionError("uv_tcp_init")
        }
        do throws(UVError) {
            try tcp.bind(address)
            // libuv reports a bind conflict (EADDRINUSE) from uv_listen on Linux.
            try tcp.listen(backlog: options.backlog) { [queue, tcp] error in
                guard error == nil, !tcp.isClosing else { return }
                do throws(ConnectionError) {
                    let client: UVTCP
                    do throws(UVError) {
                        client = try tcp.accept()
                        try client.setNoDelay(options.tcpNoDelay)
                        try client.setBufferSizes(receive: options.receiveBufferSize, send: options.sendBufferSize)
                    } catch {
                        throw error.connectionError("accept")
                    }
                    let connection: UVTCPConnection
                    do throws(ConnectionError) {
                        connection = try UVTCPConnection(tcp: client, options: options)
                    } catch {
                        client.close()
                        throw error
                    }
                    if !queue.push(connection).accepted {
                        Task { await connection.close() }
                    }
                } catch {
                    if error.kind == .resourceExhausted { queue.pushFailure(error) }
                }
            }
            localEndpoint = try tcp.localAddress.endpoint(.tcp)
        } catch {
            tcp.close()
            let failure = error.connectionError("listen on \(address)")
            throw failure
        }
    }

    func accept() async throws(ConnectionError) -> any Connection {
        guard let connection = try await queue.next() else { throw .closed("the listener is closed") }
        return connection
    }

    func close() async {
        closed.store(true, ordering: .relaxed)
        let waiting = queue.close(.closed("the listener is closed"))
        for connection in waiting { await connection.close() }
        await withCheckedContinuation { continuation in
            loop.execute { [self] in
                gate.close({ finished in tcp.close(finished) }, waiter: continuation)
            }
        }
    }

    deinit {
        guard !closed.load(ordering: .relaxed) else { return }
        let tcp = tcp
        let waiting = queue.close()
        loop.execute { tcp.close() }
        for connection in waiting { Task { await connection.close() } }
    }
}

/// A UDP listener on a libuv loop: datagrams sorted by sender into per-peer connections, as in every backend.
final class UVUDPListener: Listener, @unchecked Sendable {
    let transport = Transport.udp
    let localEndpoint: Endpoint
    let options: ConnectionOptions
    let udp: UVUDP
    let loop: UVLoop
    private let queue = ReceiveQueue<any Connection>(capacity: 1024)
    private let gate = UVCloseGate()
    // Loop-confined.
    private var peers: [SocketAddress: UVUDPPeerConnection] = [:]
    /// Datagrams dropped because a peer's queue or the accept queue was full.
    let dropped = Atomic<Int>(0)

    init(loop: UVLoop, address: SocketAddress, options: ConnectionOptions) throws(ConnectionError) {
        self.loop = loop
        self.options = options
        do throws(UVError) {
            udp = try UVUDP(loop: loop, bufferSize: options.maxDatagramSize)
        } catch {
            throw error.connectionError("uv_udp_init")
        }
        do throws(UVError) {
            try udp.bind(address)
            try udp.setBufferSizes(receive: options.receiveBufferSize, send: options.sendBufferSize)
            localEndpoint = try udp.localAddress.endpoint(.udp)
        } catch {
            udp.close()
            throw error.connectionError("listen on \(address)")
        }
        do throws(UVError) {
            try udp.receiveStart { [unowned(unsafe) self] result in
                guard case .datagram(let bytes, let from, let truncated) = result else { return }
                deliver(bytes, from: from, truncated: truncated)
            }
        } catch {
            udp.close()
            throw error.connectionError("uv_udp_recv_start")
        }
    }

    private func deliver(_ bytes: UnsafeRawBufferPointer, from: SocketAddress, truncated: Bool) {
        var isNew = false
        let peer: UVUDPPeerConnection
        if let existing = peers[from] {
            peer = existing
        } else {
            peer = UVUDPPeerConnection(listener: self, address: from)
            peers[from] = peer
            isNew = true
        }
        if truncated {
            peer.inbox.pushFailure(ConnectionError(.messageTooLarge, "a datagram exceeded \(bytes.count) bytes"))
        } else if peer.inbox.hasSpace {
            peer.inbox.push([UInt8](bytes))
        } else {
            dropped.add(1, ordering: .relaxed)
        }
        if isNew && !queue.push(peer).accepted {
            forget(peer)
        }
    }

    /// On the loop thread.
    func forget(_ peer: UVUDPPeerConnection) {
        if peers[peer.address] === peer { peers[peer.address] = nil }
        peer.inbox.close()
    }

    func accept() async throws(ConnectionError) -> any Connection {
        guard let connection = try await queue.next() else { throw .closed("the listener is closed") }
        return connection
    }

    func close() async {
        _ = queue.close(.closed("the listener is closed"))
        await withCheckedContinuation { continuation in
            loop.execute { [self] in
                gate.close(
                    { finished in
                        for peer in peers.values { peer.inbox.close(.closed("the listener is closed")) }
                        peers.removeAll()
                        udp.close(finished)
                    }, waiter: continuation)
            }
        }
    }
}

/// One peer of a ``UVUDPListener``.
final class UVUDPPeerConnection: Connection, @unchecked Sendable {
    let transport = Transport.udp
    let address: SocketAddress
    let localEndpoint: Endpoint
    let remoteEndpoint: Endpoint
    let options: ConnectionOptions
    let inbox: ReceiveQueue<[UInt8]>
    private let listener: UVUDPListener
    private let closed = Atomic<Bool>(false)

    init(listener: UVUDPListener, address: SocketAddress) {
        self.listener = listener
        self.address = address
        self.options = listener.options
        self.localEndpoint = listener.localEndpoint
        self.remoteEndpoint = address.endpoint(.udp)
        self.inbox = .datagrams(capacity: listener.options.receiveQueueLimit)
    }

    func send(_ message: Message) async throws(ConnectionError) {
        if closed.load(ordering: .relaxed) || inbox.isEnded { throw .closed() }
        try await sendDatagram(message.bytes, on: listener.udp, to: address, loop: listener.loop)
    }

    func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        guard let bytes = try await inbox.next() else { return nil }
        return Message(bytes)
    }

    func closeOutput() async throws(ConnectionError) {
        throw ConnectionError(.unsupported, "UDP has no half-close")
    }

    func close() async {
        guard !closed.exchange(true, ordering: .relaxed) else { return }
        let listener = listener
        await withCheckedContinuation { continuation in
            listener.loop.execute { [self] in
                listener.forget(self)
                continuation.resume()
            }
        }
    }
}
