public import ConnectionCore
import Synchronization

/// TLS over any backend's TCP `Connection`: the same OpenSSL code (memory BIOs, ``TLSConfiguration``) for
/// every connection style, so "TLS over libuv vs over blocking sockets" compares the styles, not four TLS
/// integrations. A byte stream, like TCP (transport `tls`); WebSocket runs over it for `wss`.
///
/// - A receive returns plaintext as records are decrypted; the peer's close_notify is the clean end (`nil`
///   once). A TCP end without close_notify is a `.tls` error unless ``TLSConfiguration/allowsTruncation``.
/// - ``closeOutput()`` sends close_notify, then half-closes TCP. ``close()`` sends close_notify when no send is
///   in progress (waiting at most a second for the kernel to take it), then closes TCP.
public final class TLSConnection: Connection, Sendable {
    public let transport: Transport = .tls
    public let localEndpoint: Endpoint
    public let remoteEndpoint: Endpoint
    public var options: ConnectionOptions { tcp.options }
    public var preferredExecutor: (any TaskExecutor)? { tcp.preferredExecutor }
    public var sendsFromAnyThread: Bool { tcp.sendsFromAnyThread }
    /// The configuration the connection was made with.
    public let configuration: TLSConfiguration
    /// The negotiated protocol version, e.g. `TLSv1.3`.
    public let negotiatedVersion: String
    /// The negotiated cipher suite, e.g. `TLS_AES_256_GCM_SHA384`.
    public let cipherSuite: String

    private let tcp: any Connection
    private let engine: TLSEngine
    private let sendGate = AsyncGate()
    private let receiveGate = AsyncGate()
    /// Open, half-closed, end reported, closing, closed: ConnectionCore's one lifecycle.
    private let life = SharedLifecycle()

    /// Plaintext per SSL_write call: four full records, so a large send streams instead of being encrypted
    /// whole into memory first.
    private static let writeChunk = 64 * 1024

    private init(tcp: any Connection, engine: TLSEngine, configuration: TLSConfiguration, remote: Endpoint) {
        self.tcp = tcp
        self.engine = engine
        self.configuration = configuration
        localEndpoint = tcp.localEndpoint.with(transport: .tls)
        remoteEndpoint = remote
        negotiatedVersion = engine.version
        cipherSuite = engine.cipher
    }

    // MARK: Handshakes

    /// Runs the client handshake over a connected TCP connection to `endpoint` (whose host is checked against
    /// the certificate and sent as SNI). On failure the caller still owns `tcp` and closes it.
    public static func client(
        over tcp: any Connection, endpoint: Endpoint, configuration: TLSConfiguration = TLSConfiguration()
    ) async throws(ConnectionError) -> TLSConnection {
        let context = try TLSContext.shared(.client, configuration)
        let engine = try TLSEngine(context: context, host: endpoint.host.literal)
        try await handshake(engine, over: tcp, timeout: configuration.handshakeTimeout, on: configuration.clock)
        return TLSConnection(
            tcp: tcp, engine: engine, configuration: configuration, remote: endpoint.with(transport: .tls))
    }

    /// Runs the server handshake over an accepted TCP connection. On failure the caller still owns `tcp`.
    public static func server(
        over tcp: any Connection, configuration: TLSConfiguration
    ) async throws(ConnectionError) -> TLSConnection {
        let context = try TLSContext.shared(.server, configuration)
        let engine = try TLSEngine(context: context, host: nil)
        try await handshake(engine, over: tcp, timeout: configuration.handshakeTimeout, on: configuration.clock)
        return TLSConnection(
            tcp: tcp, engine: engine, configuration: configuration, remote: tcp.remoteEndpoint.with(transport: .tls))
    }

    /// A `tls://` listener over a TCP listener: each accepted connection is handed out once its handshake
    /// succeeded (handshakes run concurrently; failed ones are closed and counted). Checks the certificate and
    /// key now, so a bad file fails here rather than at the first client.
    public static func listener(
        over tcp: any Listener, configuration: TLSConfiguration
    ) throws(ConnectionError) -> UpgradingListener {
        _ = try TLSContext.shared(.server, configuration)
        return UpgradingListener(tcp, transport: .tls) { connection throws(ConnectionError) in
            try await TLSConnection.server(over: connection, configuration: configuration)
        }
    }

    private static func handshake(
        _ engine: TLSEngine, over tcp: any Connection, timeout: Duration, on clock: DeadlineClock
    ) async throws(ConnectionError) {
        try await withDeadline(timeout, on: clock, closing: tcp, "the TLS handshake (does the peer speak TLS?)") {
            () throws(ConnectionError) in try await runHandshake(engine, over: tcp)
        }
    }

    private static func runHandshake(_ engine: TLSEngine, over tcp: any Connection) async throws(ConnectionError) {
        while true {
            let (step, output) = engine.handshake()
            switch step {
            case .done:
                if !output.isEmpty { try await tcp.send(Message(output)) }
                return
            case .failed(let error):
                // The alert telling the peer why, if OpenSSL made one.
                if !output.isEmpty { try? await tcp.send(Message(output)) }
                throw error
            case .needsInput:
                if !output.isEmpty { try await tcp.send(Message(output)) }
                if let incoming = try await tcp.receive() {
                    engine.feed(incoming.bytes)
                } else {
                    engine.feedEnd()
                }
            }
        }
    }

    // MARK: Sending

    public func send(_ message: Message) async throws(ConnectionError) {
        let bytes = message.bytes
        try await sendEncrypted(count: bytes.count) { (range) throws(ConnectionError) in
            try engine.encrypt(bytes[range])
        }
    }

    /// Encrypts straight from the caller's bytes: no array of the plaintext is made.
    public func send(contentsOf bytes: UnsafeRawBufferPointer) async throws(ConnectionError) {
        try await sendEncrypted(count: bytes.count) { (range) throws(ConnectionError) in
            try engine.encrypt(UnsafeRawBufferPointer(rebasing: bytes[range]))
        }
    }

    /// Sends `count` bytes of plaintext, `writeChunk` at a time: `encrypt` turns a range of them into records.
    private func sendEncrypted(
        count: Int, _ encrypt: (Range<Int>) throws(ConnectionError) -> [UInt8]
    ) async throws(ConnectionError) {
        await sendGate.enter()
        defer { sendGate.leave() }
        if case .refuse(let error) = life.handle(.send) { throw error }
        var offset = 0
        repeat {
            let end = min(offset + Self.writeChunk, count)
            let ciphertext = try encrypt(offset..<end)
            if !ciphertext.isEmpty { try await tcp.send(Message(ciphertext)) }
            offset = end
        } while offset < count
    }

    /// Sends ciphertext OpenSSL produced while reading (replies to post-handshake messages).
    private func flushOutput() async throws(ConnectionError) {
        await sendGate.enter()
        defer { sendGate.leave() }
        let output = engine.takeOutput()
        if !output.isEmpty { try await tcp.send(Message(output)) }
    }

    public func closeOutput() async throws(ConnectionError) {
        await sendGate.enter()
        defer { sendGate.leave() }
        switch life.handle(.closeOutput) {
        case .refuse(let error): throw error
        case .shutdownOutput: break
        default: return  // already half-closed
        }
        let closeNotify = engine.shutdown()
        if !closeNotify.isEmpty { try await tcp.send(Message(closeNotify)) }
        try await tcp.closeOutput()
    }

    // MARK: Receiving

    public func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        await receiveGate.enter()
        defer { receiveGate.leave() }
        while true {
            let state = life.current
            if !state.isOpen { throw .closed() }
            if state.inputEnded { throw .closed("the end of the stream was already reported") }
            let (result, hasOutput) = engine.read(maximumLength: maximumLength)
            if hasOutput { try? await flushOutput() }
            switch result {
            case .data(let bytes):
                return Message(bytes)
            case .end:
                _ = life.handle(.peerEnded)
                return nil
            case .failed(let error):
                throw error
            case .needsInput:
                let incoming: Message?
                do throws(ConnectionError) {
                    incoming = try await tcp.receive(maximumLength: options.readChunkSize)
                } catch {
                    if !life.isOpen { throw .closed() }
                    throw error
                }
                if let incoming {
                    engine.feed(incoming.bytes)
                } else {
                    engine.feedEnd()
                }
            }
        }
    }

    // MARK: Closing

    /// Closes once; a second close returns when the first has finished.
    public func close() async {
        await life.close(running: { [self] in
            // close_notify, unless a send is under way (its record must not be cut by ours) or already sent.
            if sendGate.tryEnter() {
                let closeNotify = life.current.outputClosed ? [] : engine.shutdown()
                if !closeNotify.isEmpty {
                    _ = await runBounded(by: .seconds(1), onTimeout: { [tcp] in await tcp.close() }) { [tcp] in
                        try? await tcp.send(Message(closeNotify))
                    }
                }
                sendGate.leave()
            }
            await tcp.close()
        })
    }

    /// No close_notify: the TCP connection is reset (see `Connection.abort()`), also under a close that is
    /// still sending its close_notify.
    public func abort() async {
        let first = life.beginCloseWithoutWaiting()
        await tcp.abort()
        if first { life.closeFinished() }
    }
}
