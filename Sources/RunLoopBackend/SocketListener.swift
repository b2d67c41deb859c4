@_spi(Loop) public import ConnectionCore
import Glibc
public import POSIXSupport

/// A listening TCP socket scheduled in a run loop that hands each accepted connection to a callback, as a
/// stream pair (the CFSocket accept-callback style). Use on the run loop's thread.
public final class SocketListener: EpollHandler, Sendable {
    /// The bound address (the real port when 0 was asked).
    public let localEndpoint: Endpoint
    private let socket: SocketDescriptor
    private let runLoop: SocketRunLoop
    private let options: ConnectionOptions
    /// Called on the run loop's thread only. The closure lives inside a struct: a bare function value as the type
    /// argument of a generic box gains one more reabstraction thunk each time it is read through the box's `inout`
    /// access (docs/architecture.md, "Function values in generic boxes").
    private let onAccept: LoopConfined<AcceptHandler>
    private struct AcceptHandler {
        let call: (SocketInputStream, SocketOutputStream) -> Void
    }
    private var isClosed: Bool { socket.isClosed }

    /// Binds, listens and starts delivering connections on `runLoop` (call on its thread).
    public init(
        on endpoint: Endpoint, runLoop: SocketRunLoop, options: ConnectionOptions = ConnectionOptions(),
        onAccept: @escaping (SocketInputStream, SocketOutputStream) -> Void
    ) throws(ConnectionError) {
        let (socket, local) = try Socket.listen(on: endpoint, options: options)
        localEndpoint = local.endpoint(.tcp)
        self.socket = socket
        self.runLoop = runLoop
        self.options = options
        self.onAccept = LoopConfined(AcceptHandler(call: onAccept), on: runLoop.loop.thread)
        try socket.withDescriptor { (fd) throws(ConnectionError) in
            try runLoop.loop.register(fd, events: Syscall.epollIn, handler: self)
        }
    }

    public func epollReady(_ events: UInt32) {
        let onAccept = self.onAccept.withValue { $0 }
        while !isClosed {
            let accepted: (socket: SocketDescriptor, peer: SocketAddress)?
            do throws(ConnectionError) {
                accepted = try socket.withDescriptor { (fd) throws(ConnectionError) in
                    try Syscall.accept(fd, nonBlocking: true)
                }
            } catch {
                if error.kind == .resourceExhausted {
                    BoundsLog.note(.descriptorLimit, "accepting paused for \(options.acceptBackoff): \(error)")
                    backOff()
                }
                return
            }
            guard let accepted else { return }
            let (client, peer) = accepted
            client.ifOpen { fd in
                try? Syscall.setOption(fd, .noDelay, options.tcpNoDelay)
                try? Syscall.setBufferSizes(fd, receive: options.receiveBufferSize, send: options.sendBufferSize)
            }
            let core = StreamPairCore(accepted: client, endpoint: peer.endpoint(.tcp), options: options)
            let (input, output) = core.makeStreams()
            input.schedule(in: runLoop)
            output.schedule(in: runLoop)
            onAccept.call(input, output)
        }
    }

    /// Out of descriptors: stop watching the socket for ``ConnectionOptions/acceptBackoff``, then look again
    /// (the socket stays readable while clients wait, so watching it now would spin).
    private func backOff() {
        guard socket.ifOpen({ try? runLoop.loop.modify($0, events: 0) }) != nil else { return }
        _ = runLoop.loop.schedule(after: options.acceptBackoff) { [weak self] in
            guard let self else { return }
            socket.ifOpen { try? runLoop.loop.modify($0, events: Syscall.epollIn) }
        }
    }

    /// Stops listening and closes the socket (call on the run loop's thread).
    public func close() {
        socket.close(beforeClosing: runLoop.loop.unregister)
    }
}

/// Receives a datagram socket's events on its run loop.
public protocol DatagramSocketDelegate: AnyObject {
    /// One datagram and its sender.
    func datagramSocket(_ socket: DatagramSocket, didReceive bytes: [UInt8], from sender: SocketAddress)
    /// A receive error (for a connected socket: `.refused` after an ICMP port-unreachable). The socket lives on.
    func datagramSocket(_ socket: DatagramSocket, didFail error: ConnectionError)
}

/// A UDP socket scheduled in a run loop: one read event per datagram, with the sender's address. A bound socket
/// (a server) reads up to 16 datagrams per recvmmsg(2); a connected one, two (so that one datagram, the usual
/// answer to a request, shows the socket drained). Use on the run loop's thread.
public final class DatagramSocket: EpollHandler, Sendable {
    /// Receives the datagrams (held weakly). Set it on the run loop's thread.
    public var delegate: (any DatagramSocketDelegate)? {
        get { state.withValue { $0.delegate } }
        set { state.withValue { $0.delegate = newValue } }
    }
    /// The bound address.
    public let localEndpoint: Endpoint
    /// The fixed peer, for a connected socket.
    public let peer: SocketAddress?
    private let socket: SocketDescriptor
    private let runLoop: SocketRunLoop
    private let batch: DatagramBatch
    /// The run loop thread's only.
    private struct State {
        weak var delegate: (any DatagramSocketDelegate)?
        /// Datagrams waiting for room in the socket buffer, in order.
        var pending: [(bytes: [UInt8], to: SocketAddress?)] = []
        /// Whether to read before the run loop waits.
        var reads = ReadBeforeWait()
    }
    private let state: LoopConfined<State>
    private var isClosed: Bool { socket.isClosed }
    /// Sends from other threads on a connected socket (``sendFromAnyThread(_:)``).
    private let direct = DirectSend()

    /// A socket bound to `endpoint` (a server), or connected to it when `connect` is true (a client).
    public init(
        _ endpoint: Endpoint, connect: Bool, runLoop: SocketRunLoop, options: ConnectionOptions = ConnectionOptions()
    ) throws(ConnectionError) {
        let address = try Syscall.resolve(endpoint, passive: !connect)[0]
        let socket: SocketDescriptor
        if connect {
            socket = try Socket.startConnect(to: address, transport: .udp, options: options).descriptor
        } else {
            socket = try Socket.listen(on: address, transport: .udp, options: options, describing: endpoint).descriptor
        }
        localEndpoint = try socket.withDescriptor { (fd) throws(ConnectionError) in
            try Syscall.localAddress(fd).endpoint(.udp)
        }
        self.socket = socket
        self.peer = connect ? address : nil
        self.runLoop = runLoop
        // Level-triggered epoll: a batch may read single datagrams one at a time (see DatagramBatch).
        self.batch = DatagramBatch(
            capacity: connect ? 2 : 16, slotSize: options.maxDatagramSize, singlesAfterSingles: true)
        state = LoopConfined(State(), on: runLoop.loop.thread)
        try socket.withDescriptor { (fd) throws(ConnectionError) in
            try runLoop.loop.register(fd, events: Syscall.epollIn, handler: self)
            if connect { direct.open(fd.number) }
        }
    }

    deinit {
        close()
    }

    public func epollReady(_ events: UInt32) {
        if events & Syscall.epollOut != 0 { flush() }
        guard events & (Syscall.epollIn | Syscall.epollError) != 0 else { return }
        readDatagrams(afterWait: true)
    }

    /// Reads and hands over what is there; after datagrams (their answers are the work the run loop does next),
    /// reads once more before the loop waits, as ``ReadBeforeWait`` decides. Returns whether it found datagrams.
    @discardableResult
    private func readDatagrams(afterWait: Bool) -> Bool {
        let delegate = self.delegate
        // At most 32 datagrams per readiness (as libuv reads): a flood must not keep the run loop from the
        // rest of its work (the tasks that consume these datagrams among it). Level-triggered: epoll reports
        // what is left on the next turn.
        var taken = 0
        reading: while !isClosed && taken < 32 {
            do throws(ConnectionError) {
                let received = try socket.withDescriptor { (fd) throws(ConnectionError) in
                    try batch.receive(fd, dontWait: true)
                }
                guard case .processed = received else { break reading }
            } catch {
                delegate?.datagramSocket(self, didFail: error)
                if error.kind != .refused { break reading }
                continue
            }
            taken += max(1, batch.count)
            for index in 0..<batch.count where !isClosed {
                let length = batch.length(index)
                if length > batch.slotSize {
                    delegate?.datagramSocket(
                        self, didFail: ConnectionError(.messageTooLarge, "a \(length)-byte datagram was truncated"))
                    continue
                }
                do throws(ConnectionError) {
                    delegate?.datagramSocket(
                        self, didReceive: [UInt8](batch.bytes(index)), from: try batch.sender(index))
                } catch {
                    delegate?.datagramSocket(self, didFail: error)
                }
            }
            // The socket was (most likely) drained, and a read now would only find EAGAIN. Whatever arrives
            // meanwhile, level-triggered epoll reports on the next turn.
            if batch.drained { break }
        }
        let again = state.withValue { state in
            if taken > 0 {
                state.reads.found(afterWait: afterWait)
            } else if !afterWait {
                state.reads.missed()
            }
            return taken > 0 && state.reads.readsFirst
        }
        if again && !isClosed {
            runLoop.loop.beforeNextWait(for: self) { [weak self] in self?.readDatagrams(afterWait: false) ?? false }
        }
        return taken > 0
    }

    /// Sends one datagram (to `address`, or to the connected peer). Queued, in order, while the socket buffer
    /// is full. Throws `.messageTooLarge` and other immediate errors.
    public func send(_ bytes: [UInt8], to address: SocketAddress? = nil) throws(ConnectionError) {
        guard !isClosed else { throw .closed() }
        if state.withValue({ $0.pending.isEmpty }), try trySend(bytes, to: address) { return }
        state.withValue { $0.pending.append((bytes, address)) }
        direct.loopHolds(1)
        try socket.withDescriptor { (fd) throws(ConnectionError) in
            try runLoop.loop.modify(fd, events: Syscall.epollIn | Syscall.epollOut)
        }
    }

    /// Sends datagrams to the connected peer, as few system calls as the kernel allows
    /// (`Syscall.sendDatagrams`: sendmmsg, UDP GSO); what the socket buffer does not take is queued, in order,
    /// as ``send(_:to:)`` queues it.
    public func send(batch: [UnsafeRawBufferPointer]) throws(ConnectionError) {
        guard !isClosed else { throw .closed() }
        var sent = 0
        if state.withValue({ $0.pending.isEmpty }),
            case .processed(let count) = try socket.withDescriptor({ (fd) throws(ConnectionError) in
                try Syscall.sendDatagrams(fd, batch, dontWait: true)
            })
        {
            sent = count
        }
        for bytes in batch[sent...] { try send(Array(bytes)) }
    }

    private func trySend(_ bytes: [UInt8], to address: SocketAddress?) throws(ConnectionError) -> Bool {
        let result = try socket.withDescriptor { (fd) throws(ConnectionError) in
            try bytes.withBytes { (raw) throws(ConnectionError) in
                if let address { return try Syscall.sendTo(fd, raw, to: address, dontWait: true) }
                return try Syscall.send(fd, raw, dontWait: true)
            }
        }
        if case .processed = result { return true }
        return false
    }

    private func flush() {
        while let first = state.withValue({ $0.pending.first }) {
            guard (try? trySend(first.bytes, to: first.to)) != false else { return }
            state.withValue { _ = $0.pending.removeFirst() }
            direct.loopHolds(-1)
        }
        socket.ifOpen { try? runLoop.loop.modify($0, events: Syscall.epollIn) }
    }

    /// Off the run loop's thread, on a connected socket: sends the datagram on the calling thread when the
    /// socket has room and nothing queued is ahead of it (`false`: hand it to the run loop). Closing waits for
    /// such a send to finish.
    public func sendFromAnyThread(_ bytes: [UInt8]) throws(ConnectionError) -> Bool {
        switch bytes.withUnsafeBytes({ direct.send($0) }) {
        case .sent: return true
        case .handOver: return false
        case .failed(let code): throw .errno(code, "send")
        }
    }

    /// Closes the socket.
    public func close() {
        direct.close()
        socket.close(beforeClosing: runLoop.loop.unregister)
    }
}
