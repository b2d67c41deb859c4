internal import CURing
public import ConnectionCore
internal import Glibc
import POSIXSupport
import Synchronization

/// A TCP listener in the completion style: one multishot IORING_OP_ACCEPT that the kernel completes once per
/// client (Linux 5.19; a few clients are accepted ahead, see `UringAcceptor`), or, where the kernel has no
/// multishot accept, one IORING_OP_ACCEPT per ``accept()``.
///
/// ```swift
/// let listener = try await UringListener.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"))
/// let client = try await listener.accept()
/// ```
public final class UringListener: Sendable {
    /// The bound address (the real port when 0 was asked).
    public let localEndpoint: Endpoint
    /// Options applied to accepted sockets.
    public let options: ConnectionOptions
    /// The ring the listener and its sockets use.
    public let loop: UringLoop
    private let descriptor: SocketDescriptor
    private let submissions = UringDescriptorGuard()
    private let gate = AsyncGate()
    /// The multishot accept's clients; `nil` where the kernel has none or `SOCKETSTYLES_URING_OFF` names it.
    private let acceptor: UringAcceptor?
    /// Set when the kernel refused the multishot at run time: one accept per client from then on.
    private let acceptsEach = Atomic<Bool>(false)

    /// Binds and listens (a blocking socket: the ring waits for clients, never the caller's thread). With
    /// `multishot` false, or where the kernel has no multishot accept (before 5.19, or `SOCKETSTYLES_URING_OFF`
    /// names `multishot-accept`), each ``accept()`` is one IORING_OP_ACCEPT.
    public static func listen(
        on endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(), loop given: UringLoop? = nil,
        multishot: Bool = true
    ) async throws(ConnectionError) -> UringListener {
        let loop: UringLoop
        if let given { loop = given } else { loop = try UringLoop.shared() }
        guard endpoint.transport == .tcp else { throw ConnectionError(.unsupported, "UringListener listens on tcp") }
        let address = try await Syscall.resolveAsync(endpoint, passive: true)[0]
        let (socket, local) = try Socket.listen(
            on: address, transport: .tcp, options: options, nonBlocking: false, describing: endpoint)
        return UringListener(
            descriptor: socket, local: local.endpoint(.tcp), options: options, loop: loop, multishot: multishot)
    }

    private init(
        descriptor: SocketDescriptor, local: Endpoint, options: ConnectionOptions, loop: UringLoop, multishot: Bool
    ) {
        self.descriptor = descriptor
        self.localEndpoint = local
        self.options = options
        self.loop = loop
        acceptor =
            multishot && UringFeatures.current.multishotAccept == .on
            ? UringAcceptor(loop: loop, descriptor: descriptor, submissions: submissions) : nil
    }

    /// Whether clients come from a multishot accept (`false`: one IORING_OP_ACCEPT per ``accept()``).
    public var acceptsMultishot: Bool { acceptor != nil && !acceptsEach.load(ordering: .relaxed) }

    deinit {
        // The multishot holds the socket open in the kernel until it is cancelled (by its id: the number may be
        // reused as soon as it is closed here).
        acceptor?.closeSoon()
        descriptor.close()
    }

    /// Waits for the next client. Throws `.closed` after ``close()``, `.cancelled` when the task is cancelled.
    public func accept() async throws(ConnectionError) -> UringSocket {
        if !gate.tryEnter() { await gate.enter() }
        defer { gate.leave() }
        if let acceptor, !acceptsEach.load(ordering: .relaxed) {
            if let socket = try await acceptMultishot(acceptor) { return socket }
            acceptsEach.store(true, ordering: .relaxed)
        }
        return try await acceptEach()
    }

    /// Clients from the multishot accept; `nil` when the kernel refused it (the caller accepts one at a time).
    private func acceptMultishot(_ acceptor: UringAcceptor) async throws(ConnectionError) -> UringSocket? {
        while true {
            guard !descriptor.isClosed, !submissions.isClosed else { throw .closed("the listener is closed") }
            let result = await acceptor.next()
            if submissions.isClosed {
                if result >= 0 { Syscall.close(result) }
                throw .closed("the listener is closed")
            }
            if result == UringAcceptor.unsupported { return nil }
            if result < 0 {
                if try await retryAfter(result) { continue }
                throw .errno(-result, "accept")
            }
            let socket = SocketDescriptor(adopting: result)
            do throws(ConnectionError) {
                // A multishot accept writes no address: each client's is asked for.
                return try adopt(socket, peer: try socket.withDescriptor(Syscall.peerAddress))
            } catch {
                socket.close()
                if error.kind == .reset { continue }  // the client left already (getpeername: ENOTCONN)
                throw error
            }
        }
    }

    /// After a failed accept: `true` to try again (a client that left; out of descriptors, after a pause), `false`
    /// for an error the caller throws.
    private func retryAfter(_ result: Int32) async throws(ConnectionError) -> Bool {
        if result == -ECANCELED { throw .cancelled("accept was cancelled") }
        if result == -ECONNABORTED || result == -EINTR { return true }  // a client that left before it was taken
        if result == -EMFILE || result == -ENFILE || result == -ENOBUFS || result == -ENOMEM {
            // Out of descriptors: clients wait in the backlog; try again after a pause, on the ring's timer.
            BoundsLog.note(
                .descriptorLimit,
                "accepting paused for \(options.acceptBackoff): \(ConnectionError.errno(-result, "accept"))")
            _ = await loop.run(.sleep, timeout: options.acceptBackoff)
            if Task.isCancelled { throw .cancelled() }
            return true
        }
        return false
    }

    /// The connection for an accepted descriptor, with the options applied.
    private func adopt(_ socket: SocketDescriptor, peer address: SocketAddress) throws(ConnectionError) -> UringSocket {
        let local = try socket.withDescriptor { [options] (fd) throws(ConnectionError) in
            try Syscall.setOption(fd, .noDelay, options.tcpNoDelay)
            try Syscall.setBufferSizes(fd, receive: options.receiveBufferSize, send: options.sendBufferSize)
            return try Syscall.localAddress(fd).endpoint(.tcp)
        }
        return UringSocket(
            adopting: socket, transport: .tcp, local: local, remote: address.endpoint(.tcp), options: options,
            loop: loop)
    }

    /// One IORING_OP_ACCEPT per client, each with its peer's address.
    private func acceptEach() async throws(ConnectionError) -> UringSocket {
        // Where the kernel writes the peer's address: this call's own, alive until its accept completed.
        let peer = UnsafeMutableRawPointer.allocate(byteCount: MemoryLayout<sockaddr_storage>.size, alignment: 8)
        let peerLength = UnsafeMutablePointer<socklen_t>.allocate(capacity: 1)
        defer {
            peer.deallocate()
            peerLength.deallocate()
        }
        while true {
            guard !submissions.isClosed else { throw .closed("the listener is closed") }
            peerLength.pointee = socklen_t(MemoryLayout<sockaddr_storage>.size)
            let result = try await descriptor.withDescriptorAsync { (fd) async throws(ConnectionError) in
                await loop.run(
                    .accept(fd: fd.number, address: UInt(bitPattern: peer), length: UInt(bitPattern: peerLength)),
                    guardedBy: submissions)
            }
            if submissions.isClosed {
                if result >= 0 { Syscall.close(result) }
                throw .closed("the listener is closed")
            }
            if result < 0 {
                if try await retryAfter(result) { continue }
                throw .errno(-result, "accept")
            }
            let socket = SocketDescriptor(adopting: result)
            do throws(ConnectionError) {
                guard let address = SocketAddress(peer, length: Int(peerLength.pointee)) else {
                    throw ConnectionError(.unsupported, "accept: not an IP peer")
                }
                return try adopt(socket, peer: address)
            } catch {
                socket.close()
                if error.kind == .reset { continue }  // the client left already
                throw error
            }
        }
    }

    /// Stops listening. A waiting ``accept()`` throws `.closed`.
    public func close() async {
        submissions.close()
        await acceptor?.close()
        loop.cancelAll(on: descriptor)
        await gate.enter()
        descriptor.close()
        gate.leave()
    }
}

/// The UDP server side: one bound socket whose datagrams arrive by IORING_OP_RECVMSG (with the sender's address),
/// sorted by sender into per-peer connections by ConnectionCore's `DatagramDemultiplexer`, as on every backend;
/// replies go out by IORING_OP_SENDMSG.
final class UringUDPListener: Listener, Sendable {
    let transport = Transport.udp
    let localEndpoint: Endpoint
    let options: ConnectionOptions
    let loop: UringLoop
    private let descriptor: SocketDescriptor
    /// The owner and each reply that waits for its sendmsg (which holds the number until it completed): close()
    /// returns once the last of them is done and the descriptor closed.
    private let lease: DescriptorLease
    private let closing = Atomic<Bool>(false)
    private let submissions = UringDescriptorGuard()
    private let gate = AsyncGate()
    private let peers: DatagramDemultiplexer<SocketAddress>
    private let pump = Guarded<Task<Void, Never>?>(nil)
    /// What became of the echoes sent without waiting.
    private let failures = UringSendFailures()

    static func start(
        on endpoint: Endpoint, options: ConnectionOptions, loop: UringLoop
    ) async throws(ConnectionError) -> UringUDPListener {
        let address = try await Syscall.resolveAsync(endpoint, passive: true)[0]
        let (bound, local) = try Socket.listen(
            on: address, transport: .udp, options: options, nonBlocking: false, describing: endpoint)
        let listener = UringUDPListener(descriptor: bound, local: local.endpoint(.udp), options: options, loop: loop)
        let task = Task(executorPreference: loop) { await listener.run() }
        listener.pump.withLock { $0 = task }
        return listener
    }

    private init(descriptor: SocketDescriptor, local: Endpoint, options: ConnectionOptions, loop: UringLoop) {
        self.descriptor = descriptor
        self.localEndpoint = local
        self.options = options
        self.loop = loop
        let lease = DescriptorLease(closing: { descriptor.close() })
        self.lease = lease
        let submissions = submissions
        let failures = failures
        peers = DatagramDemultiplexer(
            localEndpoint: local, options: options, executor: loop,
            endpoint: { $0.endpoint(.udp) },
            sendNow: { [failures] bytes, address throws(ConnectionError) in
                if let failure = failures.take(for: address) { throw failure }
                return bytes.count <= 65_507
                    && descriptor.ifOpen { fd in
                        loop.sendDatagram(bytes, to: address, fd: fd, failures: failures, gate: submissions)
                    } == true
            },
            send: { [failures] bytes, address throws(ConnectionError) in
                if let failure = failures.take(for: address) { throw failure }
                // Within IPv4's largest datagram: a larger one goes the waiting way, which reports EMSGSIZE at once.
                if bytes.count <= 65_507,
                    descriptor.ifOpen({ fd in
                        loop.sendDatagram(bytes, to: address, fd: fd, failures: failures, gate: submissions)
                    }) == true
                {
                    return
                }
                guard lease.retain() else { throw .closed() }
                defer { lease.release() }
                try await descriptor.withDescriptorAsync { (fd) async throws(ConnectionError) in
                    try await Self.send(bytes, to: address, fd: fd, loop: loop, submissions: submissions)
                }
            })
    }

    deinit {
        descriptor.close()
    }

    /// Receives datagrams and sorts them by sender until the listener closes: with a multishot recvmsg into a
    /// provided buffer ring where the kernel has them (6.0+), one datagram per recvmsg otherwise.
    private func run() async {
        await gate.enter()
        defer { gate.leave() }
        if await receiveMultishot() { return }
        await receiveEach()
    }

    /// One multishot recvmsg: the kernel picks a buffer for each datagram and completes with it, with no entry per
    /// datagram; each payload is copied out and its buffer given back at once. When the buffers ran out (every one
    /// waiting to be given back) the kernel ends the multishot, and it is armed again. Returns `false` at once when
    /// the kernel has no buffer rings or no multishot recvmsg.
    private func receiveMultishot() async -> Bool {
        guard UringFeatures.current.multishotReceive == .on, loop.inLoop,
            let buffers = loop.makeBuffers(count: 64, size: options.maxDatagramSize + 16 + 128)
        else { return false }
        let supported = await withUnsafeContinuation { (done: UnsafeContinuation<Bool, Never>) in
            let receiving = MultishotReceiver(done: done)
            receiving.arm = { [self] in
                // The multishot names the number until close() cancels it, before the descriptor is closed.
                let armed = descriptor.ifOpen { fd in
                    loop.receiveMessages(on: fd, buffers: buffers, guardedBy: submissions) { [self] result, flags in
                        let id = csur_buffer_id(flags)
                        if id >= 0 {
                            if result >= 0 { deliver(from: buffers, id: UInt32(id), result: result) }
                            csur_buffers_recycle(buffers, UInt32(id))
                            receiving.received = true
                        }
                        guard csur_more(flags) == 0 else { return }
                        // The multishot ended: closed, out of buffers, or never supported (EINVAL before anything
                        // came).
                        if submissions.isClosed || result == -ECANCELED {
                            receiving.finish(true)
                        } else if result == -EINVAL && !receiving.received {
                            receiving.finish(false)
                        } else {
                            receiving.arm()
                        }
                    }
                }
                if armed != true { receiving.finish(true) }
            }
            receiving.arm()
        }
        loop.destroyBuffers(buffers)
        return supported
    }

    /// Loop thread: hands the datagram in buffer `id` to its sender's connection.
    private func deliver(from buffers: OpaquePointer, id: UInt32, result: Int32) {
        var address: UnsafeRawPointer?
        var addressLength: socklen_t = 0
        var payload: UnsafeRawPointer?
        var length = 0
        var truncated: Int32 = 0
        guard
            csur_recvmsg_parse(buffers, id, result, &address, &addressLength, &payload, &length, &truncated) == 0,
            let address, let from = SocketAddress(address, length: Int(addressLength))
        else { return }  // not an IP sender: nobody to serve
        if truncated != 0 {
            peers.deliverFailure(
                ConnectionError(.messageTooLarge, "a datagram exceeds \(options.maxDatagramSize) bytes"), from: from)
        } else {
            peers.deliver([UInt8](UnsafeRawBufferPointer(start: payload, count: length)), from: from)
        }
    }

    /// One datagram per IORING_OP_RECVMSG, each awaited.
    private func receiveEach() async {
        guard let message = csur_message_create() else { return }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: options.maxDatagramSize, alignment: 16)
        defer {
            csur_message_destroy(message)
            buffer.deallocate()
        }
        while !submissions.isClosed {
            csur_message_prepare(message, buffer.baseAddress, buffer.count, nil, 0)
            let received = try? await descriptor.withDescriptorAsync { (fd) async throws(ConnectionError) in
                await loop.run(
                    .receiveMessage(fd: fd.number, message: UInt(bitPattern: message), flags: 0), guardedBy: submissions
                )
            }
            guard let result = received else { return }
            if submissions.isClosed || result == -ECANCELED { return }
            if result < 0 { continue }  // a stale ICMP error: the socket lives on
            var addressLength: socklen_t = 0
            let address = csur_message_address(message, &addressLength)
            // Not an IP sender: nobody to serve.
            guard let address, let from = SocketAddress(address, length: Int(addressLength)) else { continue }
            if csur_message_truncated(message) != 0 {
                peers.deliverFailure(
                    ConnectionError(.messageTooLarge, "a datagram exceeds \(buffer.count) bytes"), from: from)
            } else {
                peers.deliver([UInt8](UnsafeRawBufferPointer(rebasing: buffer[..<Int(result)])), from: from)
            }
        }
    }

    /// sendmsg to one peer, from a copy that lives until the ring has completed the send.
    private static func send(
        _ bytes: [UInt8], to address: SocketAddress, fd: borrowing BorrowedDescriptor, loop: UringLoop,
        submissions: UringDescriptorGuard
    ) async throws(ConnectionError) {
        guard let datagram = UringDatagram(copying: bytes, to: address), let message = datagram.message else {
            throw ConnectionError(.resourceExhausted, "out of memory")
        }
        defer { datagram.free() }
        let result = await loop.run(
            .sendMessage(fd: fd.number, message: UInt(bitPattern: message), flags: UInt32(MSG_NOSIGNAL)),
            guardedBy: submissions)
        if result == -ECANCELED { throw submissions.isClosed ? .closed() : .cancelled() }
        if result < 0 { throw .errno(-result, "sendmsg to \(address)") }
    }

    func accept() async throws(ConnectionError) -> any Connection { try await peers.accept() }

    func close() async {
        peers.close()
        submissions.close()
        loop.cancelAll(on: descriptor)
        await pump.withLock { $0 }?.value
        await gate.enter()
        // The owner's use, once; replies in flight were cancelled above.
        if !closing.exchange(true, ordering: .acquiringAndReleasing) { lease.release() }
        await lease.closed()
        gate.leave()
    }
}

/// The state of one multishot receive, on the ring's thread only: how to arm it again and whom to tell when it ends.
private final class MultishotReceiver {
    var arm: () -> Void = {}
    var received = false
    private var done: UnsafeContinuation<Bool, Never>?

    init(done: UnsafeContinuation<Bool, Never>) { self.done = done }

    func finish(_ supported: Bool) {
        done?.resume(returning: supported)
        done = nil
        arm = {}  // breaks the cycle through the handler
    }
}
