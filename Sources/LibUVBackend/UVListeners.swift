import ConnectionCore
import POSIXSupport
import Synchronization

/// A TCP listener on a libuv loop: each connection callback accepts into a new handle, which starts reading
/// at once and waits in a queue for ``accept()``.
final class UVTCPListener: Listener, Sendable {
    let transport = Transport.tcp
    let localEndpoint: Endpoint
    private let tcp: UVTCP
    private let loop: UVLoop
    private let accepted = AcceptedConnections()
    private let life = SharedLifecycle()

    /// On the loop thread.
    init(loop: UVLoop, address: SocketAddress, options: ConnectionOptions) throws(ConnectionError) {
        self.loop = loop
        do throws(UVError) {
            tcp = try UVTCP(
                loop: loop, readBufferSize: options.readChunkSize, family: options.reusePort ? address.family : nil)
        } catch {
            throw error.connectionError("uv_tcp_init")
        }
        do throws(UVError) {
            try tcp.bind(address, reusePort: options.reusePort)
            // libuv reports a bind conflict (EADDRINUSE) from uv_listen on Linux.
            try tcp.listen(backlog: options.backlog) { [accepted, tcp] error in
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
                    accepted.offer(connection)
                } catch {
                    if error.kind == .resourceExhausted {
                        // libuv closes the clients waiting in the backlog (its reserved-descriptor trick) and
                        // goes on; accept() reports the error.
                        BoundsLog.note(.descriptorLimit, "libuv dropped waiting clients: \(error)")
                        accepted.fail(error)
                    }
                }
            }
            localEndpoint = try tcp.localAddress.endpoint(.tcp)
        } catch {
            tcp.close()
            let failure = error.connectionError("listen on \(address)")
            throw failure
        }
    }

    func accept() async throws(ConnectionError) -> any Connection { try await accepted.accept() }

    func close() async {
        await accepted.close(listener: { [life, loop, tcp] in
            await life.close { finished in loop.execute { tcp.close(finished) } }
        })
    }

    deinit {
        guard life.beginCloseWithoutWaiting() else { return }
        let tcp = tcp
        let waiting = accepted.closeQueue()
        loop.execute { tcp.close() }
        for connection in waiting { Task { await connection.close() } }
    }
}

/// A UDP listener on a libuv loop: datagrams sorted by sender into per-peer connections (ConnectionCore's
/// ``DatagramDemultiplexer``, shared by every backend).
final class UVUDPListener: Listener, Sendable {
    let transport = Transport.udp
    let localEndpoint: Endpoint
    let options: ConnectionOptions
    let udp: UVUDP
    let loop: UVLoop
    private let life = SharedLifecycle()
    private let peers: DatagramDemultiplexer<SocketAddress>
    /// Datagrams dropped because a peer's queue or the accept queue was full.
    var dropped: Int { peers.dropped }

    init(loop: UVLoop, address: SocketAddress, options: ConnectionOptions) throws(ConnectionError) {
        self.loop = loop
        self.options = options
        let udp: UVUDP
        do throws(UVError) {
            udp = try UVUDP(
                loop: loop, bufferSize: options.maxDatagramSize, batch: 16,
                family: options.reusePort ? address.family : nil)
        } catch {
            throw error.connectionError("uv_udp_init")
        }
        self.udp = udp
        do throws(UVError) {
            try udp.bind(address, reusePort: options.reusePort)
            try udp.setBufferSizes(receive: options.receiveBufferSize, send: options.sendBufferSize)
            localEndpoint = try udp.localAddress.endpoint(.udp)
        } catch {
            udp.close()
            throw error.connectionError("listen on \(address)")
        }
        peers = DatagramDemultiplexer(
            localEndpoint: localEndpoint, options: options, executor: loop, endpoint: { $0.endpoint(.udp) },
            // On the loop thread (the peers' tasks prefer it): one uv_udp_try_send, no suspension.
            sendNow: { bytes, peer throws(ConnectionError) in
                guard loop.isOnLoopThread, !udp.isClosing else { return false }
                do throws(UVError) {
                    return try udp.trySend(bytes, to: peer)
                } catch {
                    throw error.connectionError("send")
                }
            },
            send: { bytes, peer throws(ConnectionError) in try await sendDatagram(bytes, on: udp, to: peer, loop: loop)
            })
        do throws(UVError) {
            try udp.receiveStart { [peers] result in
                guard case .datagram(let bytes, let from, let truncated) = result else { return }
                if truncated {
                    peers.deliverFailure(
                        ConnectionError(.messageTooLarge, "a datagram exceeded \(bytes.count) bytes"), from: from)
                } else {
                    peers.deliver([UInt8](bytes), from: from)
                }
            }
        } catch {
            udp.close()
            throw error.connectionError("uv_udp_recv_start")
        }
    }

    func accept() async throws(ConnectionError) -> any Connection { try await peers.accept() }

    func close() async {
        peers.close()
        await life.close { [loop, udp] finished in
            loop.execute { udp.close(finished) }
        }
    }
}
