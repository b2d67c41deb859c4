@_spi(Loop) import ConnectionCore
import POSIXSupport
import Synchronization

/// A connected UDP socket in the delegate style.
final class RunLoopUDPConnection: Connection, DatagramSocketDelegate, Sendable {
    let transport = Transport.udp
    let localEndpoint: Endpoint
    let remoteEndpoint: Endpoint
    let options: ConnectionOptions
    private let socket: DatagramSocket
    private let runLoop: SocketRunLoop
    private let inbox: ReceiveQueue<[UInt8]>
    private let life = SharedLifecycle()

    init(socket: DatagramSocket, runLoop: SocketRunLoop, options: ConnectionOptions) {
        self.socket = socket
        self.runLoop = runLoop
        self.options = options
        localEndpoint = socket.localEndpoint
        remoteEndpoint = socket.peer!.endpoint(.udp)
        inbox = .datagrams(capacity: options.receiveQueueLimit)
        socket.delegate = self
    }

    var preferredExecutor: (any TaskExecutor)? { runLoop.loop }

    /// A send from off the run loop goes straight to the connected socket when it has room
    /// (`DatagramSocket.sendFromAnyThread`).
    var sendsFromAnyThread: Bool { true }

    func datagramSocket(_ socket: DatagramSocket, didReceive bytes: [UInt8], from sender: SocketAddress) {
        if inbox.hasSpace { inbox.push(bytes) }
    }

    func datagramSocket(_ socket: DatagramSocket, didFail error: ConnectionError) {
        inbox.pushFailure(error)
    }

    func send(_ message: Message) async throws(ConnectionError) {
        if case .refuse(let error) = life.handle(.send) { throw error }
        // On the run loop's thread (a task that prefers it) the socket is ours to use: no hop, no suspension.
        if runLoop.isCurrent { return try socket.send(message.bytes) }
        if try socket.sendFromAnyThread(message.bytes) { return }
        try await runDatagramSend { [socket] () throws(ConnectionError) in try socket.send(message.bytes) }
    }

    func send(batch: [UnsafeRawBufferPointer]) async throws(ConnectionError) {
        if case .refuse(let error) = life.handle(.send) { throw error }
        if runLoop.isCurrent { return try socket.send(batch: batch) }
        try await sendEach(batch)
    }

    private func runDatagramSend(
        _ body: @escaping @Sendable () throws(ConnectionError) -> Void
    )
        async throws(ConnectionError)
    {
        let result: Result<Void, ConnectionError> = await withCheckedContinuation { continuation in
            runLoop.perform { continuation.resume(returning: Result { () throws(ConnectionError) in try body() }) }
        }
        try result.get()
    }

    func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        try await inbox.next().map(Message.init)
    }

    func closeOutput() async throws(ConnectionError) {
        throw ConnectionError(.unsupported, "UDP has no half-close")
    }

    func close() async {
        await life.close { [inbox, runLoop, socket] finished in
            inbox.close()
            runLoop.perform {
                socket.close()
                finished()
            }
        }
    }
}

/// The UDP server side in the delegate style: one bound ``DatagramSocket``, datagrams sorted by sender
/// (ConnectionCore's ``DatagramDemultiplexer``, shared by every backend).
final class RunLoopUDPListener: Listener, DatagramSocketDelegate, Sendable {
    let transport = Transport.udp
    let localEndpoint: Endpoint
    let options: ConnectionOptions
    let socket: DatagramSocket
    let runLoop: SocketRunLoop
    private let peers: DatagramDemultiplexer<SocketAddress>

    init(on endpoint: Endpoint, runLoop: SocketRunLoop, options: ConnectionOptions) throws(ConnectionError) {
        let socket = try DatagramSocket(endpoint, connect: false, runLoop: runLoop, options: options)
        self.socket = socket
        localEndpoint = socket.localEndpoint
        self.options = options
        self.runLoop = runLoop
        peers = DatagramDemultiplexer(
            localEndpoint: socket.localEndpoint, options: options, executor: runLoop.loop,
            endpoint: { $0.endpoint(.udp) },
            // On the run loop's thread (the peers' tasks prefer it) the socket is ours to use: sent, or queued in
            // order for room, with no hop and no suspension.
            sendNow: { bytes, address throws(ConnectionError) in
                guard runLoop.isCurrent else { return false }
                try socket.send(bytes, to: address)
                return true
            },
            send: { bytes, address throws(ConnectionError) in
                let result: Result<Void, ConnectionError> = await withCheckedContinuation { continuation in
                    runLoop.perform {
                        continuation.resume(
                            returning: Result { () throws(ConnectionError) in try socket.send(bytes, to: address) })
                    }
                }
                try result.get()
            })
        socket.delegate = self
    }

    func datagramSocket(_ socket: DatagramSocket, didReceive bytes: [UInt8], from sender: SocketAddress) {
        peers.deliver(bytes, from: sender)
    }

    func datagramSocket(_ socket: DatagramSocket, didFail error: ConnectionError) {}

    func accept() async throws(ConnectionError) -> any Connection { try await peers.accept() }

    func close() async {
        peers.close()
        await withCheckedContinuation { continuation in
            runLoop.perform { [socket] in
                socket.close()
                continuation.resume()
            }
        }
    }
}
