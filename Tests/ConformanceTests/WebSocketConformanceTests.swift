import ConnectionCore
import ConnectionTestKit
import SocketStyles
import Synchronization
import Testing

/// WebSocket over every backend's TCP: the scenarios RFC 6455 users rely on.
@Suite("WebSocket conformance", .timeLimit(.minutes(20)))
struct WebSocketConformanceTests {
    @Test(
        "Text and binary echo at 0, 125, 126, 65535, 65536 bytes and 16 MiB keep their kind and bytes",
        arguments: ConformanceCase.ws)
    func echo(_ test: ConformanceCase) async throws {
        try await SocketTest.run(timeLimit: .seconds(120)) {
            let server = try await test.echoServer()
            let client = try await test.connect(to: server.endpoint)
            for size in [0, 125, 126, 65_535, 65_536, 16 * 1024 * 1024] {
                let binary = pattern(size, seed: 4)
                try await client.send(Message(binary))
                let echoedBinary = try #require(try await client.receive())
                #expect(echoedBinary.kind == .binary && echoedBinary.bytes == binary, "binary \(size)")
                let text = String(repeating: "é", count: size / 2)
                try await client.send(.text(text))
                let echoedText = try #require(try await client.receive())
                #expect(echoedText.kind == .text && echoedText.text == text, "text \(size)")
            }
            await client.close()
            await server.stop()
        }
    }

    @Test("A message sent in many fragments arrives whole", arguments: ConformanceCase.ws)
    func fragmented(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            var options = WebSocketOptions()
            options.fragmentSize = 7
            let client = try await test.connect(to: server.endpoint, webSocket: options)
            let text = "fragmented: κόσμε 🎉 " + String(repeating: "x", count: 100)
            try await client.send(.text(text))  // 7-byte fragments split code points across frames
            #expect(try await client.receive()?.text == text)
            await client.close()
            await server.stop()
        }
    }

    @Test("sendPing gets its pong while the other side receives", arguments: ConformanceCase.ws)
    func pingPong(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            let client = try #require(try await test.connect(to: server.endpoint) as? WebSocketConnection)
            // The pong comes back through our receive path: keep one receive waiting meanwhile.
            let receiving = Task { try? await client.receive() }
            try await client.sendPing([1, 2, 3])
            try await client.send([9])
            #expect(await receiving.value?.bytes == [9])
            await client.close()
            await server.stop()
        }
    }

    @Test(
        "With reportsControlFrames, events show the peer's pings and pongs with their payloads; without, neither",
        arguments: ConformanceCase.ws)
    func controlFrameEvents(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let listener = try await test.listen()
            let reporting = WebSocketOptions.with { $0.reportsControlFrames = true }
            let client = try #require(
                try await test.connect(to: listener.localEndpoint, webSocket: reporting) as? WebSocketConnection)
            let server = try #require(try await listener.accept() as? WebSocketConnection)
            var events = client.events.makeAsyncIterator()
            #expect(await events.next() == .opened(subprotocol: nil))
            // The server pings (its ping reads the connection itself); the client answers while it receives.
            let clientReceives = Task { try await client.receive() }
            try await server.sendPing([7, 7])
            #expect(await events.next() == .ping([7, 7]))
            // The client pings: the server's pong is reported too (the client's receive reads it; a receive on the
            // server reads the ping).
            let serverReceives = Task { try await server.receive() }
            try await client.sendPing([1, 2, 3])
            #expect(await events.next() == .pong([1, 2, 3]))
            // The server does not report: its events hold only .opened until the close.
            try await server.send(.text("done"))
            #expect(try await clientReceives.value?.text == "done")
            await client.close()
            #expect(try await serverReceives.value == nil)
            var serverEvents: [WebSocketEvent] = []
            for await event in server.events { serverEvents.append(event) }
            #expect(serverEvents.count == 2)
            #expect(serverEvents.first == .opened(subprotocol: nil))
            await server.close()
            await listener.close()
        }
    }

    @Test(
        "Close started by the client: the server sees a clean end; codes and reasons are readable",
        arguments: ConformanceCase.ws)
    func clientCloses(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let listener = try await test.listen()
            let client = try #require(try await test.connect(to: listener.localEndpoint) as? WebSocketConnection)
            let server = try #require(try await listener.accept() as? WebSocketConnection)
            let serverEnd = Task { try await server.receive() }
            await client.close(code: .goingAway, reason: "bye")
            #expect(try await serverEnd.value == nil)
            #expect(server.peerCloseCode == .goingAway)
            #expect(server.peerCloseReason == "bye")
            #expect(client.peerCloseCode == .goingAway)  // the server echoed our code
            await server.close()
            await listener.close()
        }
    }

    @Test("Close started by the server: the client sees a clean end exactly once", arguments: ConformanceCase.ws)
    func serverCloses(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let listener = try await test.listen()
            let client = try #require(try await test.connect(to: listener.localEndpoint) as? WebSocketConnection)
            let server = try #require(try await listener.accept() as? WebSocketConnection)
            let closing = Task { await server.close(code: .normalClosure, reason: "done") }
            #expect(try await client.receive() == nil)
            await expectConnectionError(.closed) { () throws(ConnectionError) in try await client.receive() }
            await closing.value
            #expect(client.peerCloseCode == .normalClosure)
            #expect(client.peerCloseReason == "done")
            await client.close()
            await listener.close()
        }
    }

    @Test("Invalid UTF-8 in a text message is answered with close 1007", arguments: ConformanceCase.ws)
    func invalidUTF8(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            var raw = try await RawWebSocketClient.connect(test, to: server.endpoint)
            try await raw.sendFrame(WebSocketFrame(opcode: .text, payload: [0x48, 0xC3, 0x28]))
            try await raw.expectClose(.invalidFramePayloadData)
            await raw.close()
            await server.stop()
        }
    }

    @Test("A message above the limit is answered with close 1009", arguments: ConformanceCase.ws)
    func oversized(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            var small = WebSocketOptions()
            small.maximumMessageSize = 1000
            let server = try await test.echoServer(webSocket: small)
            let client = try #require(try await test.connect(to: server.endpoint) as? WebSocketConnection)
            try await client.send(pattern(1001))
            #expect(try await client.receive() == nil)
            #expect(client.peerCloseCode == .messageTooBig)
            await client.close()
            await server.stop()
        }
    }

    @Test(
        "A bad handshake, garbage, a head that never ends, too many headers: 400, close, 431; others are served",
        arguments: ConformanceCase.ws)
    func hostileHandshakes(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer(webSocket: .with { $0.handshakeTimeout = .milliseconds(500) })
            /// What the server answers to `bytes` sent where the upgrade request belongs, until it closes.
            func answer(to bytes: [UInt8]) async throws -> (String, Duration) {
                let started = ContinuousClock.now
                let tcp = try await test.connectStream(to: server.endpoint)
                try await tcp.send(bytes)
                var reply: [UInt8] = []
                while let chunk = try? await tcp.receive() { reply += chunk.bytes }
                await tcp.close()
                return (String(decoding: reply, as: UTF8.self), ContinuousClock.now - started)
            }
            // A GET that is no upgrade: 400 and the reason.
            let (notUpgrade, _) = try await answer(to: Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n".utf8))
            #expect(notUpgrade.hasPrefix("HTTP/1.1 400 Bad Request"), "\(notUpgrade)")
            #expect(notUpgrade.contains("Upgrade"))
            // 4 KiB of random bytes: refused at once, long before the handshake deadline.
            var generator = SystemRandomNumberGenerator()
            var garbage = (0..<4096).map { _ in UInt8.random(in: 0...255, using: &generator) }
            garbage[0] = 0x16  // as a TLS ClientHello would start: never a G
            let (refused, refusedAfter) = try await answer(to: garbage)
            #expect(refused.hasPrefix("HTTP/1.1 400 Bad Request"), "\(refused)")
            #expect(refusedAfter < .milliseconds(400))
            // A request line and no end: closed when the handshake deadline passes.
            let (stalled, stalledAfter) = try await answer(to: Array("GET / HTTP/1.1\r\nHost: x\r\n".utf8))
            #expect(stalled.isEmpty)
            #expect(stalledAfter >= .milliseconds(450))
            // Too many header lines: 431.
            let many = "GET / HTTP/1.1\r\n" + (0..<150).map { "X-\($0): y\r\n" }.joined()
            let (tooMany, _) = try await answer(to: Array(many.utf8))
            #expect(tooMany.hasPrefix("HTTP/1.1 431 Request Header Fields Too Large"), "\(tooMany)")
            // A header line without a colon: 400 as soon as its line ends.
            let (noColon, _) = try await answer(to: Array("GET / HTTP/1.1\r\nHost x\r\n".utf8))
            #expect(noColon.hasPrefix("HTTP/1.1 400 Bad Request"), "\(noColon)")
            let client = try await test.connect(to: server.endpoint)
            try await client.send(.text("still here"))
            #expect(try await client.receive()?.text == "still here")
            await client.close()
            await server.stop()
        }
    }

    @Test(
        "A client gives up on a server that never answers the upgrade (.timedOut) or answers garbage (at once)",
        arguments: ConformanceCase.ws)
    func clientHandshakeDeadline(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            for answer in [nil, "SSH-2.0-OpenSSH_9.2\r\n"] {
                let listener = try await test.listenStream()
                let peer = Task { () -> (any Connection)? in
                    guard let connection = try? await listener.accept() else { return nil }
                    _ = try? await connection.receive()
                    if let answer { try? await connection.send(Array(answer.utf8)) }
                    return connection
                }
                let started = ContinuousClock.now
                let error = await expectConnectionError(answer == nil ? .timedOut : .protocolViolation) {
                    () throws(ConnectionError) in
                    try await test.connect(
                        to: listener.localEndpoint.with(transport: test.transport),
                        webSocket: .with { $0.handshakeTimeout = .milliseconds(400) })
                }
                if answer != nil {
                    #expect(ContinuousClock.now - started < .milliseconds(350), "\(String(describing: error))")
                }
                await peer.value?.close()
                await listener.close()
            }
        }
    }

    @Test(
        "Frames RFC 6455 forbids (unmasked, reserved bit, unknown opcode, long or split ping) get 1002; server lives",
        arguments: ConformanceCase.ws)
    func forbiddenFrames(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            func masked(_ frame: WebSocketFrame) -> [UInt8] {
                var frame = frame
                frame.maskingKey = 0x0A0B_0C0D
                return WebSocketFrameEncoder.encode(frame)
            }
            let forbidden: [(String, [UInt8])] = [
                ("unmasked", WebSocketFrameEncoder.encode(WebSocketFrame(opcode: .text, payload: Array("hi".utf8)))),
                ("reserved bit", masked(WebSocketFrame(opcode: .text, payload: Array("hi".utf8), rsv1: true))),
                ("unknown opcode", masked(WebSocketFrame(opcode: WebSocketOpcode(rawValue: 0x3), payload: [1]))),
                ("126-byte ping", masked(WebSocketFrame(opcode: .ping, payload: pattern(126)))),
                ("fragmented ping", masked(WebSocketFrame(fin: false, opcode: .ping, payload: [1]))),
            ]
            for (name, bytes) in forbidden {
                var raw = try await RawWebSocketClient.connect(test, to: server.endpoint)
                try await raw.tcp.send(bytes)
                try await raw.expectClose(.protocolError, name)
                await raw.close()
            }
            let client = try await test.connect(to: server.endpoint)
            try await client.send(.text("still here"))
            #expect(try await client.receive()?.text == "still here")
            await client.close()
            await server.stop()
        }
    }

    @Test("A frame above maximumFrameSize is answered with close 1009", arguments: ConformanceCase.ws)
    func oversizedFrame(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            var small = WebSocketOptions()
            small.maximumFrameSize = 1000
            let server = try await test.echoServer(webSocket: small)
            var raw = try await RawWebSocketClient.connect(test, to: server.endpoint)
            try await raw.sendFrame(WebSocketFrame(opcode: .binary, payload: pattern(1000)))
            #expect(try await raw.nextFrame().payload == pattern(1000))
            try await raw.sendFrame(WebSocketFrame(opcode: .binary, payload: pattern(1001)))
            try await raw.expectClose(.messageTooBig)
            await raw.close()
            await server.stop()
        }
    }

    @Test(
        "A client masks every frame with a key of its own (300 frames: past a refill of the key buffer)",
        arguments: ConformanceCase.ws)
    func clientMaskingKeys(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let listener = try await test.listenStream()
            let count = 300
            let rawServer = Task { () throws -> [UInt32?] in
                let tcp = try await listener.accept()
                var parser = WebSocketFrameParser(role: .server)
                parser.feed(try await answerWebSocketHandshake(on: tcp))
                var keys: [UInt32?] = []
                receiving: while let chunk = try await tcp.receive() {
                    parser.feed(chunk.bytes)
                    while let frame = try parser.nextFrame() {
                        if frame.opcode == .close {
                            try await tcp.send(
                                WebSocketFrameEncoder.encode(WebSocketFrame(opcode: .close, payload: [])))
                            break receiving
                        }
                        keys.append(frame.maskingKey)
                    }
                }
                await tcp.close()
                return keys
            }
            let client = try await test.connect(to: listener.localEndpoint.with(transport: test.transport))
            for index in 0..<count { try await client.send(.text("message \(index)")) }
            await client.close()
            let keys = try await rawServer.value
            #expect(keys.count == count)
            #expect(keys.allSatisfy { $0 != nil }, "a client frame went unmasked")
            // 300 keys of 32 random bits: two equal ones happen about once in 100,000 runs, three never.
            #expect(Set(keys.compactMap { $0 }).count >= count - 1)
            await listener.close()
        }
    }

    @Test(
        "Frames sent in the same segment as the handshake request or response are not lost",
        arguments: ConformanceCase.ws)
    func framesWithTheHandshake(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            // Server side: the request and a first frame in one send.
            let server = try await test.echoServer()
            var early = WebSocketFrame(opcode: .text, payload: Array("early".utf8))
            early.maskingKey = 0x0102_0304
            var raw = try await RawWebSocketClient.connect(
                test, to: server.endpoint, withRequest: WebSocketFrameEncoder.encode(early))
            #expect(try await raw.nextFrame().payload == Array("early".utf8))
            await raw.close()
            await server.stop()

            // Client side: a raw server sends the response and a first frame in one send, then answers the close.
            let listener = try await test.listenStream()
            let rawServer = Task { () throws -> Void in
                let tcp = try await listener.accept()
                let first = WebSocketFrameEncoder.encode(WebSocketFrame(opcode: .text, payload: Array("hello".utf8)))
                var parser = WebSocketFrameParser(role: .server)
                parser.feed(try await answerWebSocketHandshake(on: tcp, along: first))
                while let chunk = try await tcp.receive() {
                    parser.feed(chunk.bytes)
                    if let frame = try parser.nextFrame(), frame.opcode == .close {
                        try await tcp.send(WebSocketFrameEncoder.encode(WebSocketFrame(opcode: .close, payload: [])))
                        break
                    }
                }
                await tcp.close()
            }
            let client = try await test.connect(to: listener.localEndpoint.with(transport: test.transport))
            #expect(try await client.receive()?.text == "hello")
            await client.close()
            try await rawServer.value
            await listener.close()
        }
    }

    @Test(
        "A slow reader slows the sender: what is in flight stays bounded, every message arrives in order",
        arguments: ConformanceCase.ws)
    func slowReader(_ test: ConformanceCase) async throws {
        try await SocketTest.run(timeLimit: .seconds(120)) {
            let listener = try await test.listen()
            let accepting = Task { try await listener.accept() }
            // The server sends (unmasked frames: the sender is fast on every backend), the client reads.
            let reader = try await test.connect(to: listener.localEndpoint)
            let sender = try await accepting.value
            let count = 512
            let size = 64 * 1024
            let sent = Atomic<Int>(0)
            let received = Atomic<Int>(0)
            let maxInFlight = Atomic<Int>(0)
            // One pattern, each message numbered in its first bytes (a lost or reordered message shows).
            let base = pattern(size)
            let numbered = { @Sendable (index: Int) -> [UInt8] in
                var bytes = base
                withUnsafeBytes(of: UInt32(index).bigEndian) { bytes.replaceSubrange(0..<4, with: $0) }
                return bytes
            }
            async let sending: Void = {
                for index in 0..<count {
                    try await sender.send(Message(numbered(index)))
                    let now = sent.add(size, ordering: .relaxed).newValue
                    _ = maxInFlight.max(now - received.load(ordering: .relaxed), ordering: .relaxed)
                }
            }()
            // The slow reader: a pause of 1 ms after every message (64 MB/s at most; the sender could go 10 times faster).
            for index in 0..<count {
                let message = try #require(try await reader.receive())
                #expect(message.bytes == numbered(index), "message \(index)")
                received.add(size, ordering: .relaxed)
                try await Task.sleep(for: .milliseconds(1))
            }
            try await sending
            // 32 MiB went out; without backpressure nearly all of it would be in flight at once. What may be: the
            // receive queues (256 KiB a side) and the kernel's socket buffers (a few MiB each way).
            #expect(
                maxInFlight.load(ordering: .relaxed) < 16 * 1024 * 1024,
                "in flight: \(maxInFlight.load(ordering: .relaxed))")
            let closing = Task { try await reader.receive() }
            await sender.close()
            #expect(try await closing.value == nil)
            await reader.close()
            await listener.close()
        }
    }
}

/// Receives into a caller's buffer over WebSocket: a message in one frame is unmasked straight into it.
@Suite("WebSocket receive(into:)", .timeLimit(.minutes(20)))
struct WebSocketReceiveIntoTests {
    @Test(
        "Whole messages land in the buffer; a ping between them is answered; invalid UTF-8 in placed text gets 1007",
        arguments: ConformanceCase.ws)
    func placed(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let (server, _, listener, rawClient) = try await Self.serverOverObservedStream(test)
            var raw = rawClient
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 2000, alignment: 1)
            defer { buffer.deallocate() }
            // Three frames in one send: the parser has the ping waiting when the second message's header comes.
            let frames = [
                WebSocketFrame(opcode: .binary, payload: pattern(1500, seed: 1)),
                WebSocketFrame(opcode: .ping, payload: [7]),
                WebSocketFrame(opcode: .text, payload: Array("héllo".utf8)),
                WebSocketFrame(opcode: .binary, payload: pattern(2000, seed: 2)),
            ]
            try await raw.tcp.send(frames.flatMap { RawWebSocketClient.masked($0) })
            for (frame, kind) in [(frames[0], Message.Kind.binary), (frames[2], .text), (frames[3], .binary)] {
                let got = try #require(try await server.receive(into: buffer))
                #expect(got.kind == kind)
                #expect(Array(UnsafeRawBufferPointer(rebasing: buffer[..<got.count])) == frame.payload)
            }
            let pong = try await raw.nextFrame()
            #expect(pong.opcode == .pong && pong.payload == [7])
            #expect(server.received.messages == 3 && server.received.messageBytes == 1500 + 6 + 2000)
            #expect(server.received.payloadBytes == 1500 + 6 + 2000)
            try await raw.sendFrame(WebSocketFrame(opcode: .text, payload: [0x48, 0xC3, 0x28]))
            await expectConnectionError(.protocolViolation) { () throws(ConnectionError) in
                try await server.receive(into: buffer)
            }
            try await raw.expectClose(.invalidFramePayloadData)
            await raw.close()
            await server.abort()
            await listener.close()
        }
    }

    @Test(
        "A receive(into:) cancelled with a message partly in its buffer loses nothing: the next receive gets it whole",
        arguments: ConformanceCase.ws)
    func cancelledMidMessage(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let (server, stream, listener, raw) = try await Self.serverOverObservedStream(test)
            let owned = UnsafeMutableRawBufferPointer.allocate(byteCount: 4000, alignment: 1)
            defer { owned.deallocate() }
            let buffer = SendableBuffer(owned)
            let payload = pattern(3000, seed: 3)
            let bytes = RawWebSocketClient.masked(WebSocketFrame(opcode: .binary, payload: payload))
            let half = 8 + 1200  // the header (2 + 2 + 4) and 1,200 bytes of payload
            let deliveredBefore = stream.delivered
            var entries = stream.entered.makeAsyncIterator()
            let waiting = Task { try await server.receive(into: buffer.pointer) }
            try await raw.tcp.send(Array(bytes[..<half]))
            // The receive took the first part and waits for more: what it holds is in its buffer now.
            while let delivered = await entries.next(), delivered < deliveredBefore + half {}
            waiting.cancel()
            await expectConnectionError(.cancelled) { () throws(ConnectionError) in
                do { return try await waiting.value } catch let error as ConnectionError { throw error } catch {
                    throw ConnectionError(.closed, "\(error)")
                }
            }
            owned.initializeMemory(as: UInt8.self, repeating: 0xEE)  // its owner reuses the buffer meanwhile
            try await raw.tcp.send(Array(bytes[half...]))
            let got = try #require(try await server.receive(into: owned))
            #expect(got.count == payload.count)
            #expect(Array(UnsafeRawBufferPointer(rebasing: owned[..<got.count])) == payload)
            await raw.close()
            await server.abort()
            await listener.close()
        }
    }

    /// A WebSocket server connection whose stream reports each receive it enters, and a raw client for it.
    static func serverOverObservedStream(
        _ test: ConformanceCase
    ) async throws -> (
        server: WebSocketConnection, stream: ObservedStream, listener: any Listener, raw: RawWebSocketClient
    ) {
        let listener = try await test.listenStream()
        let endpoint = listener.localEndpoint.with(transport: test.transport)
        async let raw = RawWebSocketClient.connect(test, to: endpoint)
        let stream = ObservedStream(try await listener.accept())
        let server = try await WebSocketConnection.server(over: stream, transport: test.transport)
        return (server, stream, listener, try await raw)
    }
}

/// A caller's buffer handed to the task that receives into it while the test waits (never both at once).
struct SendableBuffer: @unchecked Sendable {
    let pointer: UnsafeMutableRawBufferPointer
    init(_ pointer: UnsafeMutableRawBufferPointer) { self.pointer = pointer }
}

/// A stream that reports each receive as it enters it, with the bytes its receives have returned so far: a test
/// sees a reader that took some bytes and now waits for more, without sleeping.
final class ObservedStream: Connection, Sendable {
    private let inner: any Connection
    private let deliveredBytes = Guarded(0)
    let entered: AsyncStream<Int>
    private let enteredSink: AsyncStream<Int>.Continuation

    init(_ inner: any Connection) {
        self.inner = inner
        (entered, enteredSink) = AsyncStream.makeStream(of: Int.self)
    }

    var delivered: Int { deliveredBytes.withLock { $0 } }
    var transport: Transport { inner.transport }
    var localEndpoint: Endpoint { inner.localEndpoint }
    var remoteEndpoint: Endpoint { inner.remoteEndpoint }
    var options: ConnectionOptions { inner.options }
    var preferredExecutor: (any TaskExecutor)? { inner.preferredExecutor }

    func send(_ message: Message) async throws(ConnectionError) { try await inner.send(message) }
    func send(contentsOf bytes: UnsafeRawBufferPointer) async throws(ConnectionError) {
        try await inner.send(contentsOf: bytes)
    }
    func send(batch: [UnsafeRawBufferPointer]) async throws(ConnectionError) { try await inner.send(batch: batch) }

    func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        enteredSink.yield(delivered)
        let message = try await inner.receive(maximumLength: maximumLength)
        deliveredBytes.withLock { $0 += message?.bytes.count ?? 0 }
        return message
    }

    func receive(into buffer: UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Received? {
        enteredSink.yield(delivered)
        let received = try await inner.receive(into: buffer)
        deliveredBytes.withLock { $0 += received?.count ?? 0 }
        return received
    }

    func closeOutput() async throws(ConnectionError) { try await inner.closeOutput() }
    func close() async {
        enteredSink.finish()
        await inner.close()
    }
    func abort() async {
        enteredSink.finish()
        await inner.abort()
    }
}

/// The server's side of a WebSocket opening handshake done by hand on a raw stream (TCP or TLS), for tests whose
/// server misbehaves on purpose: reads the request head, accepts it (agreeing to permessage-deflate when `deflate`
/// is given), and sends the response with `along` in the same send. Returns the bytes read past the head.
@discardableResult
func answerWebSocketHandshake(
    on stream: any Connection, deflate: WebSocketDeflateOptions? = nil, along: [UInt8] = []
) async throws -> [UInt8] {
    let (request, rest) = try await readHTTPHead(from: stream)
    let accepted = try WebSocketHandshake.acceptRequest(request, deflate: deflate).get()
    try await stream.send(Array(accepted.response.utf8) + along)
    return rest
}

/// Reads an HTTP head (request or response, up to CRLF CRLF) off a raw stream: the head and the bytes read past it.
func readHTTPHead(from stream: any Connection) async throws -> (head: String, rest: [UInt8]) {
    var bytes: [UInt8] = []
    while true {
        if let length = WebSocketHandshake.headLength(in: bytes) {
            return (String(decoding: bytes[..<length], as: UTF8.self), Array(bytes[length...]))
        }
        guard let chunk = try await stream.receive() else { throw ConnectionError(.closed) }
        bytes += chunk.bytes
    }
}

/// A WebSocket client that sends raw frames (to break the protocol on purpose) over a backend's TCP.
struct RawWebSocketClient {
    let tcp: any Connection
    var parser = WebSocketFrameParser(role: .client)

    /// permessage-deflate as the server agreed it (when `deflate` was offered).
    var deflate: WebSocketDeflateAgreement?

    /// Connects and completes the handshake; `withRequest` is sent in the same send as the request. With
    /// `deflate`, offers permessage-deflate (the frames sent and read stay raw: compress them yourself).
    static func connect(
        _ test: ConformanceCase, to endpoint: Endpoint, withRequest: [UInt8] = [],
        deflate: WebSocketDeflateOptions? = nil
    ) async throws -> RawWebSocketClient {
        let tcp = try await test.connectStream(to: endpoint)
        let key = "dGhlIHNhbXBsZSBub25jZQ=="
        let extensions = deflate.map { [("Sec-WebSocket-Extensions", $0.offer)] } ?? []
        try await tcp.send(
            Array(WebSocketHandshake.clientRequest(host: "127.0.0.1", path: "/", key: key, headers: extensions).utf8)
                + withRequest)
        let (response, rest) = try await readHTTPHead(from: tcp)
        let agreed = try WebSocketHandshake.validateResponse(response, key: key, offeredDeflate: deflate).get()
        var client = RawWebSocketClient(tcp: tcp)
        client.deflate = agreed.deflate
        client.parser.allowsCompressedFrames = agreed.deflate != nil
        client.parser.feed(rest)
        return client
    }

    func sendFrame(_ frame: WebSocketFrame) async throws {
        try await tcp.send(Self.masked(frame))
    }

    /// A frame as a client sends it: masked (with a fixed key).
    static func masked(_ frame: WebSocketFrame) -> [UInt8] {
        var masked = frame
        masked.maskingKey = 0x1234_5678
        return WebSocketFrameEncoder.encode(masked)
    }

    mutating func nextFrame() async throws -> WebSocketFrame {
        while true {
            if let frame = try parser.nextFrame() { return frame }
            guard let chunk = try await tcp.receive() else { throw ConnectionError(.closed) }
            parser.feed(chunk.bytes)
        }
    }

    /// Expects the next frame to be a close frame with `code`.
    mutating func expectClose(
        _ code: WebSocketCloseCode, _ comment: String = "", sourceLocation: SourceLocation = #_sourceLocation
    ) async throws {
        let frame = try await nextFrame()
        #expect(frame.opcode == .close, "\(comment)", sourceLocation: sourceLocation)
        let received = frame.payload.count >= 2 ? UInt16(frame.payload[0]) << 8 | UInt16(frame.payload[1]) : nil
        #expect(received == code.rawValue, "\(comment)", sourceLocation: sourceLocation)
    }

    func close() async { await tcp.close() }
}

@Suite("WebSocket keep-alive and events", .timeLimit(.minutes(20)))
struct WebSocketKeepAliveTests {
    @Test("Keep-alive pings are answered: the connection stays up; events report open then close")
    func keepAliveAnswered() async throws {
        try await SocketTest.run {
            let server = try await EchoServer.start(.async, on: try Endpoint(url: "ws://127.0.0.1:0/"))
            var options = WebSocketOptions()
            options.keepAliveInterval = .milliseconds(20)
            options.pongDeadline = .seconds(5)
            let client = try #require(
                try await Backend.async.connect(to: server.endpoint, webSocket: options) as? WebSocketConnection)
            // A receive that waits while several keep-alive pings go out and their pongs come back.
            let receiving = Task { try await client.receive() }
            try await Task.sleep(for: .milliseconds(150))
            try await client.send(.text("still up"))
            #expect(try await receiving.value?.text == "still up")
            await client.close()
            var events: [WebSocketEvent] = []
            for await event in client.events { events.append(event) }
            #expect(events.first == .opened(subprotocol: nil))
            #expect(events.count == 2)
            await server.stop()
        }
    }

    @Test("A peer that never answers pings fails the connection with .timedOut after the pong deadline")
    func keepAliveTimeout() async throws {
        try await SocketTest.run {
            // A server that completes the handshake and then ignores every frame.
            let listener = try await Backend.bsd.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let mute = Task { () -> (any Connection)? in
                guard let tcp = try? await listener.accept() else { return nil }
                _ = try? await answerWebSocketHandshake(on: tcp)
                return tcp
            }
            var options = WebSocketOptions()
            options.keepAliveInterval = .milliseconds(20)
            options.pongDeadline = .milliseconds(100)
            let endpoint = listener.localEndpoint.with(transport: .ws)
            let client = try await Backend.bsd.connect(to: endpoint, webSocket: options)
            let error = await expectConnectionError(.timedOut) { () throws(ConnectionError) in
                while true { _ = try await client.receive() }
            }
            #expect(error?.systemCode?.code == 1001)
            await client.close()
            await (await mute.value)?.close()
            await listener.close()
        }
    }
}

@Suite("WebSocket requests, routing and typed entry points", .timeLimit(.minutes(20)))
struct WebSocketRequestTests {
    @Test(
        "The server sees the request (path, query, headers, subprotocols, origin) and picks the subprotocol",
        arguments: ConformanceCase.ws)
    func requestSeen(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let listener = try await test.backend.listenWebSocket(
                on: try Endpoint(url: "\(test.transport)://127.0.0.1:0/chat"), tls: test.serverTLS
            ) { request in
                request.header("x-token") == "abc"
                    ? .accept(subprotocol: "v2", headers: [.init(name: "X-Served-By", value: "test")])
                    : .refuse(status: 401, reason: "no token")
            }
            let endpoint = try Endpoint(url: "\(test.transport)://127.0.0.1:\(listener.localEndpoint.port)/chat?room=7")
            let client = try await test.backend.connectWebSocket(
                to: endpoint,
                webSocket: .with {
                    $0.subprotocols = ["v1", "v2"]
                    $0.origin = "http://example.test"
                    $0.headers = [.init(name: "X-Token", value: "abc")]
                }, tls: test.clientTLS)
            let served = try await listener.acceptWebSocket()
            let request = try #require(served.request)
            #expect(request.path == "/chat")
            #expect(request.query == "room=7")
            #expect(request.subprotocols == ["v1", "v2"])
            #expect(request.origin == "http://example.test")
            #expect(request.header("X-TOKEN") == "abc")
            #expect(client.subprotocol == "v2" && served.subprotocol == "v2")
            #expect(client.request == nil)
            // The connection works as usual, through the typed values and through `messages`.
            try await client.send(text: "hello")
            var iterator = served.messages.makeAsyncIterator()
            #expect(try await iterator.next()?.text == "hello")
            // The server reads while the client closes, so the close handshake completes at once.
            async let closed: Void = client.close()
            #expect(try await iterator.next() == nil)
            await closed
            await served.close()
            await listener.close()
        }
    }

    @Test(
        "A refused handshake gets the status the server chose; a path not served gets 404; others go on",
        arguments: ConformanceCase.ws)
    func refusals(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let listener = try await test.backend.listenWebSocket(
                on: try Endpoint(url: "\(test.transport)://127.0.0.1:0/chat"), tls: test.serverTLS
            ) { request in
                request.query == "banned" ? .refuse(status: 403, reason: "banned") : .accept
            }
            let port = listener.localEndpoint.port
            let serving = Task {
                while let connection = try? await listener.acceptWebSocket() {
                    try? await connection.send(text: connection.request?.path ?? "?")
                    await connection.close()
                }
            }
            for (target, status) in [("/chat?banned", "403"), ("/elsewhere", "404")] {
                let error = await expectConnectionError(.protocolViolation) { () throws(ConnectionError) in
                    _ = try await test.backend.connectWebSocket(
                        to: try Endpoint(url: "\(test.transport)://127.0.0.1:\(port)\(target)"), tls: test.clientTLS)
                }
                #expect(error?.detail.contains(status) == true, "\(target): \(String(describing: error))")
            }
            let client = try await test.backend.connectWebSocket(
                to: try Endpoint(url: "\(test.transport)://127.0.0.1:\(port)/chat"), tls: test.clientTLS)
            #expect(try await client.receive()?.text == "/chat")
            await client.close()
            // Counted once each refusing handshake task has ended: the client can read a refusal before the
            // server's task that sent it has counted it, and `close()` waits for every handshake task.
            await listener.close()
            #expect(listener.rejectedHandshakes == 2)
            await serving.value
        }
    }

    @Test("messages: an AsyncSequence of what arrives, ending with the peer", arguments: ConformanceCase.all)
    func messagesSequence(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let listener = try await test.listen()
            let client = try await test.connect(to: listener.localEndpoint)
            try await client.send(Array("first".utf8))
            let served = try await listener.accept()
            var received: [UInt8] = []
            for try await message in served.messages {
                received += message.bytes
                if received.count >= 5 { break }
            }
            #expect(received == Array("first".utf8))
            if test.transport != .udp {
                // The peer's end ends the sequence (read while the client closes: a WebSocket close is a handshake).
                async let closed: Void = client.close()
                var after = 0
                for try await _ in served.messages { after += 1 }
                #expect(after == 0)
                await closed
            } else {
                await client.close()
            }
            await served.close()
            await listener.close()
        }
    }
}

@Suite("WebSocket pings and peers without a receive running", .timeLimit(.minutes(20)))
struct WebSocketPingTests {
    /// A server that completes the opening handshake over `test`'s stream (TCP or TLS), then calls `then`.
    private func rawServer(
        _ test: ConformanceCase, then: @escaping @Sendable (any Connection) async -> Void
    ) async throws -> (Endpoint, any Listener, Task<Void, Never>) {
        let listener = try await test.listenStream()
        let task = Task {
            guard let stream = try? await listener.accept() else { return }
            _ = try? await answerWebSocketHandshake(on: stream)
            await then(stream)
        }
        return (listener.localEndpoint.with(transport: test.transport), listener, task)
    }

    @Test(
        "sendPing gets its pong with no receive running; data read meanwhile waits for the next receive",
        arguments: ConformanceCase.ws)
    func pingWithoutReceive(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            let client = try await test.backend.connectWebSocket(to: server.endpoint, tls: test.clientTLS)
            try await client.send(text: "before the ping")
            try await client.sendPing([1, 2, 3], timeout: .seconds(10))
            #expect(try await client.receive()?.text == "before the ping")
            try await client.sendPing()
            async let closed: Void = client.close()
            await closed
            await server.stop()
        }
    }

    @Test(
        "sendPing to a peer that never answers fails with .timedOut at its deadline; cancelling it ends it",
        arguments: ConformanceCase.ws)
    func pingDeadlineAndCancellation(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let (endpoint, listener, server) = try await rawServer(test) { stream in
                while (try? await stream.receive()) != nil {}  // reads, never answers
                await stream.close()
            }
            let client = try await test.backend.connectWebSocket(
                to: endpoint, webSocket: .with { $0.closeTimeout = .milliseconds(100) }, tls: test.clientTLS)
            let started = ContinuousClock.now
            await expectConnectionError(.timedOut) { () throws(ConnectionError) in
                try await client.sendPing(timeout: .milliseconds(200))
            }
            #expect(ContinuousClock.now - started >= .milliseconds(200))
            let waiting = Task { () -> ConnectionError? in
                do throws(ConnectionError) {
                    try await client.sendPing(timeout: .seconds(60))
                    return nil
                } catch {
                    return error
                }
            }
            waiting.cancel()
            let error = try await withTimeLimit(.seconds(10)) { await waiting.value }
            #expect(error?.kind == .cancelled)
            // The connection is still usable after both.
            try await client.send(text: "still open")
            await client.close(code: .goingAway, reason: "done")
            await listener.close()
            await server.value
        }
    }

    @Test(
        "A peer that drops TCP without a close frame is seen within 1 s by keep-alive, no receive running",
        arguments: ConformanceCase.ws)
    func vanishedPeer(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let (endpoint, listener, server) = try await rawServer(test) { stream in await stream.close() }
            let client = try await test.backend.connectWebSocket(
                to: endpoint, webSocket: .with { $0.keepAliveInterval = .milliseconds(50) }, tls: test.clientTLS)
            await server.value  // the server has dropped the connection
            let closed = try await withTimeLimit(.seconds(1)) { () -> WebSocketEvent? in
                for await event in client.events { if case .closed = event { return event } }
                return nil
            }
            #expect(closed == .closed(code: nil, reason: ""))
            await expectConnectionError(.reset) { () throws(ConnectionError) in _ = try await client.receive() }
            await client.close()
            await listener.close()
        }
    }
}
