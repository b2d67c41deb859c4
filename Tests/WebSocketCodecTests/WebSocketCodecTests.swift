import Testing
import WebSocketCodec

@Suite("WebSocket codec (RFC 6455)")
struct WebSocketCodecTests {
    // MARK: RFC 6455 §5.7 examples, byte for byte

    static let maskedHello: [UInt8] = [0x81, 0x85, 0x37, 0xFA, 0x21, 0x3D, 0x7F, 0x9F, 0x4D, 0x51, 0x58]

    @Test("A single-frame unmasked text message encodes as in the RFC")
    func unmaskedHello() {
        let bytes = WebSocketFrameEncoder.encode(WebSocketFrame(opcode: .text, payload: Array("Hello".utf8)))
        #expect(bytes == [0x81, 0x05, 0x48, 0x65, 0x6C, 0x6C, 0x6F])
    }

    @Test("A single-frame masked text message encodes and parses as in the RFC")
    func maskedHello() throws {
        let frame = WebSocketFrame(opcode: .text, payload: Array("Hello".utf8), maskingKey: 0x37FA_213D)
        #expect(WebSocketFrameEncoder.encode(frame) == Self.maskedHello)
        var parser = WebSocketFrameParser(role: .server)
        parser.feed(Self.maskedHello)
        let parsed = try #require(try parser.nextFrame())
        #expect(parsed.payload == Array("Hello".utf8))
        #expect(parsed.maskingKey == 0x37FA_213D)
        #expect(parsed.fin && parsed.opcode == .text)
    }

    @Test("A fragmented unmasked text message parses as in the RFC")
    func fragmented() throws {
        var parser = WebSocketFrameParser(role: .client)
        parser.feed([0x01, 0x03, 0x48, 0x65, 0x6C, 0x80, 0x02, 0x6C, 0x6F])
        let first = try #require(try parser.nextFrame())
        let second = try #require(try parser.nextFrame())
        #expect(!first.fin && first.opcode == .text && first.payload == Array("Hel".utf8))
        #expect(second.fin && second.opcode == .continuation && second.payload == Array("lo".utf8))
        var machine = WebSocketStateMachine(role: .client)
        #expect(machine.receive(first) == [])
        #expect(machine.receive(second) == [.deliver(text: true, payload: Array("Hello".utf8))])
    }

    @Test("Ping and masked pong as in the RFC; a ping is answered with a pong of the same payload")
    func pingPong() throws {
        let ping: [UInt8] = [0x89, 0x05, 0x48, 0x65, 0x6C, 0x6C, 0x6F]
        #expect(WebSocketFrameEncoder.encode(WebSocketFrame(opcode: .ping, payload: Array("Hello".utf8))) == ping)
        let pong = WebSocketFrame(opcode: .pong, payload: Array("Hello".utf8), maskingKey: 0x37FA_213D)
        #expect(
            WebSocketFrameEncoder.encode(pong) == [0x8A, 0x85, 0x37, 0xFA, 0x21, 0x3D, 0x7F, 0x9F, 0x4D, 0x51, 0x58])
        var parser = WebSocketFrameParser(role: .client)
        parser.feed(ping)
        var machine = WebSocketStateMachine(role: .client)
        let actions = machine.receive(try #require(try parser.nextFrame()))
        #expect(
            actions == [
                .pingReceived(Array("Hello".utf8)), .send(WebSocketFrame(opcode: .pong, payload: Array("Hello".utf8))),
            ])
    }

    @Test(
        "Lengths 0, 125, 126, 65535, 65536 use the 7-bit, 16-bit and 64-bit forms",
        arguments: [0, 125, 126, 65_535, 65_536])
    func lengths(size: Int) throws {
        let payload = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 13) }
        let bytes = WebSocketFrameEncoder.encode(
            WebSocketFrame(opcode: .binary, payload: payload, maskingKey: 0x0102_0304))
        let header = size < 126 ? 2 : size <= 65_535 ? 4 : 10
        #expect(bytes.count == header + 4 + size)
        if size == 126 { #expect(Array(bytes[0..<4]) == [0x82, 0xFE, 0x00, 0x7E]) }
        if size == 65_536 { #expect(Array(bytes[1..<10]) == [0xFF, 0, 0, 0, 0, 0, 1, 0, 0]) }
        var parser = WebSocketFrameParser(role: .server)
        parser.feed(bytes)
        #expect(try parser.nextFrame()?.payload == payload)
    }

    @Test("Pieces of any size, fed from a reused buffer, give the same frames as the whole stream, in both roles")
    func randomPieces() throws {
        var state: UInt64 = 42
        func nextPiece() -> Int {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return Int(state >> 33) % 3000 + 1
        }
        for role in [WebSocketRole.server, .client] {
            let frames = [0, 1, 125, 126, 1000, 70_000, 300_000, 3].enumerated().map { index, size in
                WebSocketFrame(
                    fin: index != 5, opcode: index == 6 ? .continuation : .binary,
                    payload: (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ index) },
                    maskingKey: role == .server ? UInt32(truncatingIfNeeded: 0x9E37_79B9 &* (index + 1)) : nil)
            }
            let stream = frames.flatMap(WebSocketFrameEncoder.encode)
            for _ in 0..<20 {
                var parser = WebSocketFrameParser(role: role)
                var parsed: [WebSocketFrame] = []
                var reused = [UInt8](repeating: 0, count: 4096)
                var offset = 0
                while offset < stream.count {
                    let piece = min(nextPiece(), stream.count - offset)
                    reused.replaceSubrange(0..<piece, with: stream[offset..<(offset + piece)])
                    reused.withUnsafeBytes { parser.feed(UnsafeRawBufferPointer(rebasing: $0[..<piece])) }
                    for index in 0..<piece { reused[index] = 0xEE }  // the parser must have copied what it keeps
                    while let frame = try parser.nextFrame() { parsed.append(frame) }
                    offset += piece
                }
                #expect(parsed == frames)
                #expect(parser.bufferedCount == 0)
            }
        }
    }

    @Test(
        "Placing into a caller's buffer: whole messages that fit are placed, the rest parsed as frames, in order, across any pieces and interruptions",
        arguments: [false, true])
    func placing(untilPlaced: Bool) throws {
        var state: UInt64 = 7
        func next(_ bound: Int) -> Int {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return Int(state >> 33) % bound
        }
        struct Seen: Equatable {
            var fin: Bool
            var opcode: WebSocketOpcode
            var payload: [UInt8]
        }
        for role in [WebSocketRole.server, .client] {
            // Sizes around the buffer's 5,000 bytes; a fragmented message (3-4), a ping between whole ones, text.
            let shapes: [(Int, WebSocketOpcode, Bool)] = [
                (0, .binary, true), (5_000, .binary, true), (5_001, .binary, true), (1_200, .text, true),
                (700, .binary, false), (900, .continuation, true), (4, .ping, true), (70_000, .binary, true),
                (3_000, .binary, true), (1, .binary, true),
            ]
            let frames = shapes.enumerated().map { index, shape in
                WebSocketFrame(
                    fin: shape.2, opcode: shape.1,
                    payload: (0..<shape.0).map {
                        UInt8(truncatingIfNeeded: shape.1 == .text ? 97 + $0 % 26 : $0 &* 7 &+ index)
                    },
                    maskingKey: role == .server ? UInt32(truncatingIfNeeded: 0x9E37_79B9 &* (index + 1)) : nil)
            }
            let expected = frames.map { Seen(fin: $0.fin, opcode: $0.opcode, payload: $0.payload) }
            let stream = frames.flatMap(WebSocketFrameEncoder.encode)
            for round in 0..<30 {
                var parser = WebSocketFrameParser(role: role)
                var seen: [Seen] = []
                var placedCount = 0
                let destination = UnsafeMutableRawBufferPointer.allocate(byteCount: 5_000, alignment: 1)
                defer { destination.deallocate() }
                var offset = 0
                while offset < stream.count {
                    var piece = min(round == 0 ? 1 : next(9_000) + 1, stream.count - offset)
                    stream[offset..<(offset + piece)].withUnsafeBytes { bytes in
                        // feedUntilPlaced takes the piece only up to the end of a placed message: the rest is fed
                        // again (as the frame link keeps it in its read buffer for the next receive).
                        if untilPlaced {
                            piece = parser.feedUntilPlaced(bytes, placingInto: destination)
                        } else {
                            parser.feed(bytes, placingInto: destination)
                        }
                    }
                    offset += piece
                    if let placed = parser.takePlaced() {
                        placedCount += 1
                        seen.append(
                            Seen(fin: true, opcode: placed.opcode, payload: Array(destination[..<placed.count])))
                    }
                    while let frame = try parser.nextFrame() {
                        seen.append(Seen(fin: frame.fin, opcode: frame.opcode, payload: frame.payload))
                    }
                    if next(3) == 0 {
                        // A receive that ends (cancelled) with a frame partly placed: the parser keeps its bytes,
                        // and the buffer is reused and scribbled on by someone else meanwhile.
                        parser.stopPlacing(copyingFrom: UnsafeRawBufferPointer(destination))
                        destination.initializeMemory(as: UInt8.self, repeating: 0xEE)
                    }
                }
                #expect(seen == expected, "role \(role), round \(round)")
                #expect(placedCount >= 1)
                #expect(parser.bufferedCount == 0)
            }
        }
    }

    @Test("A placed message gets the state machine's checks: UTF-8, size, a fragmented message in progress")
    func placedChecks() {
        var machine = WebSocketStateMachine(role: .server, maximumMessageSize: 10)
        let good: [UInt8] = Array("héllo".utf8)
        good.withUnsafeBytes { #expect(machine.receivePlaced(text: true, payload: $0) == .deliver) }
        [UInt8]([0xC3, 0x28]).withUnsafeBytes { bytes in
            guard case .actions(let actions) = machine.receivePlaced(text: true, payload: bytes) else {
                Issue.record("invalid UTF-8 was delivered")
                return
            }
            #expect(
                actions.contains(
                    .send(WebSocketStateMachine.closeFrame(.invalidFramePayloadData, "invalid UTF-8 in a text message"))
                ))
        }
        var sized = WebSocketStateMachine(role: .server, maximumMessageSize: 10)
        [UInt8](repeating: 1, count: 11).withUnsafeBytes { bytes in
            guard case .actions(let actions) = sized.receivePlaced(text: false, payload: bytes) else {
                Issue.record("a message above the limit was delivered")
                return
            }
            #expect(
                actions.contains {
                    if case .failed(let error) = $0 { error.closeCode == .messageTooBig } else { false }
                })
        }
        var fragmented = WebSocketStateMachine(role: .server)
        #expect(fragmented.receive(WebSocketFrame(fin: false, opcode: .binary, payload: [1], maskingKey: 1)) == [])
        [UInt8]([2]).withUnsafeBytes { bytes in
            guard case .actions(let actions) = fragmented.receivePlaced(text: false, payload: bytes) else {
                Issue.record("a new message inside a fragmented one was delivered")
                return
            }
            #expect(
                actions.contains {
                    if case .failed(let error) = $0 { error.closeCode == .protocolError } else { false }
                })
        }
    }

    @Test("Bytes fed one at a time give the same frames")
    func dripFeed() throws {
        var stream: [UInt8] = []
        let frames = [
            WebSocketFrame(opcode: .text, payload: Array("héllo".utf8), maskingKey: 0xDEAD_BEEF),
            WebSocketFrame(opcode: .binary, payload: [UInt8](repeating: 9, count: 300), maskingKey: 0x1234_5678),
            WebSocketFrame(opcode: .ping, payload: [], maskingKey: 0x0BAD_F00D),
        ]
        for frame in frames { stream += WebSocketFrameEncoder.encode(frame) }
        var parser = WebSocketFrameParser(role: .server)
        var parsed: [WebSocketFrame] = []
        for byte in stream {
            parser.feed([byte])
            while let frame = try parser.nextFrame() { parsed.append(frame) }
        }
        #expect(parsed.map(\.payload) == frames.map(\.payload))
        #expect(parsed.map(\.opcode) == frames.map(\.opcode))
        #expect(parser.bufferedCount == 0)
    }

    @Test(
        "Masking 8 bytes at a time (in place, or in one pass while copying) equals byte-by-byte masking at any offset and length"
    )
    func masking() {
        let key: UInt32 = 0xA1B2_C3D4
        let keyBytes: [UInt8] = [0xA1, 0xB2, 0xC3, 0xD4]
        for length in [0, 1, 3, 7, 8, 9, 15, 16, 17, 100, 1023] {
            for offset in 0..<4 {
                var fast = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 1) }
                let expected = fast.enumerated().map { $0.element ^ keyBytes[($0.offset + offset) & 3] }
                let source = fast
                WebSocketMasking.apply(key: key, to: &fast, offset: offset)
                #expect(fast == expected, "length \(length) offset \(offset)")
                // The one-pass copy, from an odd address into a larger buffer: same bytes, nothing past the end.
                var padded = [UInt8](repeating: 0xEE, count: length + 9)
                ([0x55] + source).withUnsafeBytes { from in
                    padded.withUnsafeMutableBytes { to in
                        WebSocketMasking.copy(
                            UnsafeRawBufferPointer(rebasing: from[1...]),
                            to: UnsafeMutableRawBufferPointer(rebasing: to[1...]),
                            key: key, offset: offset)
                    }
                }
                #expect(Array(padded[1..<(1 + length)]) == expected, "copy: length \(length) offset \(offset)")
                #expect(padded[0] == 0xEE && padded[(length + 1)...].allSatisfy { $0 == 0xEE })
            }
        }
    }

    // MARK: Rejections

    @Test(
        "Framing violations are rejected with 1002",
        arguments: [
            ([0xC1, 0x80, 0, 0, 0, 0] as [UInt8], "reserved"),  // RSV1 without an extension
            ([0x83, 0x80, 0, 0, 0, 0], "unknown"),  // opcode 3
            ([0x09, 0x80, 0, 0, 0, 0], "fragmented"),  // a ping without FIN
            ([0x89, 0xFE, 0x00, 0x7E, 0, 0, 0, 0], "125"),  // a 126-byte ping
            ([0x81, 0x05, 0x48, 0x65, 0x6C, 0x6C, 0x6F], "masked"),  // an unmasked frame to a server
        ])
    func framingViolations(bytes: [UInt8], reason: String) {
        var parser = WebSocketFrameParser(role: .server)
        parser.feed(bytes)
        #expect {
            _ = try parser.nextFrame()
        } throws: { error in
            guard let error = error as? WebSocketProtocolError else { return false }
            return error.closeCode == .protocolError && error.reason.contains(reason)
        }
    }

    @Test("A frame above the size limit is rejected with 1009 before its payload arrives")
    func frameTooBig() {
        var parser = WebSocketFrameParser(role: .client, maximumFrameSize: 1000)
        parser.feed([0x82, 0x7E, 0x03, 0xE9])  // 1001 bytes announced, none sent
        #expect(throws: WebSocketProtocolError(.messageTooBig, "a 1001-byte frame exceeds the limit of 1000")) {
            _ = try parser.nextFrame()
        }
    }

    // MARK: UTF-8

    @Test("UTF-8: valid text, split code points, and invalid sequences caught at their first bad byte")
    func utf8() {
        #expect(UTF8Validator.isValid(Array("κόσμε 日本 🎉".utf8)))
        let emoji = Array("🎉".utf8)
        var split = UTF8Validator()
        let firstPart = split.feed(emoji[0..<1])
        #expect(firstPart)
        #expect(!split.isComplete)
        let rest = split.feed(emoji[1...])
        #expect(rest)
        #expect(split.isComplete)
        for invalid: [UInt8] in [
            [0xC0, 0x80], [0xE0, 0x80, 0x80], [0xED, 0xA0, 0x80], [0xF4, 0x90, 0x80, 0x80], [0xFF], [0x80],
        ] {
            #expect(!UTF8Validator.isValid(invalid), "\(invalid)")
        }
        // Fail fast: the bad byte is the second of a 4-byte sequence, seen before the rest arrives.
        var fast = UTF8Validator()
        let accepted = fast.feed([0xF0, 0x80])
        #expect(!accepted)
    }

    @Test("UTF-8: the 8-bytes-at-a-time path, the byte path and Swift's own decoder agree on random input")
    func utf8Differential() {
        var generator = SystemRandomNumberGenerator()
        let pieces: [[UInt8]] = [
            Array("plain ascii text ".utf8), Array("é".utf8), Array("日".utf8), Array("🎉".utf8), [0xED, 0xA0, 0x80],
            [0xC0], [0x80], [0xF4, 0x90], [0xFF], Array(repeating: 0x61, count: 13),
        ]
        for round in 0..<2000 {
            var bytes: [UInt8] = []
            for _ in 0..<Int.random(in: 0...12, using: &generator) {
                // Mostly valid pieces, now and then a broken one.
                let index = Int.random(in: 0..<pieces.count, using: &generator)
                if index >= 4 && index <= 8 && round % 3 != 0 { continue }
                bytes += pieces[index]
            }
            let expected = String(validating: bytes, as: UTF8.self) != nil
            #expect(UTF8Validator.isValid(bytes) == expected, "\(bytes)")
            // A non-contiguous sequence takes the byte-by-byte path.
            #expect(UTF8Validator.isValid(bytes.lazy.map { $0 }) == expected, "\(bytes)")
            // Split anywhere, fed in two pieces.
            let cut = Int.random(in: 0...bytes.count, using: &generator)
            var validator = UTF8Validator()
            let whole = validator.feed(bytes[..<cut]) && validator.feed(bytes[cut...]) && validator.isComplete
            #expect(whole == expected, "\(bytes) cut at \(cut)")
        }
    }

    @Test("Invalid UTF-8 in a text message fails with 1007; a code point split across fragments is fine")
    func textValidation() {
        var machine = WebSocketStateMachine(role: .server)
        let emoji = Array("🎉".utf8)
        #expect(machine.receive(WebSocketFrame(fin: false, opcode: .text, payload: Array(emoji[0..<2]))) == [])
        #expect(
            machine.receive(WebSocketFrame(fin: true, opcode: .continuation, payload: Array(emoji[2...])))
                == [.deliver(text: true, payload: emoji)])
        let actions = machine.receive(WebSocketFrame(fin: false, opcode: .text, payload: [0xCE, 0xBA, 0xFF]))
        guard case .failed(let error) = actions.first else {
            Issue.record("expected a failure, got \(actions)")
            return
        }
        #expect(error.closeCode == .invalidFramePayloadData)
        #expect(actions.contains(.send(WebSocketStateMachine.closeFrame(.invalidFramePayloadData, error.reason))))
        #expect(actions.last == .closeConnection)
    }

    @Test("A message above the limit fails with 1009")
    func messageTooBig() {
        var machine = WebSocketStateMachine(role: .server, maximumMessageSize: 10)
        #expect(
            machine.receive(WebSocketFrame(fin: false, opcode: .binary, payload: [UInt8](repeating: 0, count: 6))) == []
        )
        let actions = machine.receive(
            WebSocketFrame(fin: true, opcode: .continuation, payload: [UInt8](repeating: 0, count: 6)))
        guard case .failed(let error) = actions.first else {
            Issue.record("expected a failure, got \(actions)")
            return
        }
        #expect(error.closeCode == .messageTooBig)
    }

    // MARK: Close handshake

    @Test("Close started by the peer: we echo its code and close the connection")
    func peerCloses() {
        var machine = WebSocketStateMachine(role: .server)
        let actions = machine.receive(WebSocketStateMachine.closeFrame(.goingAway, "bye"))
        #expect(
            actions == [
                .closeReceived(.goingAway, "bye"), .send(WebSocketStateMachine.closeFrame(.goingAway, "")),
                .closeConnection,
            ])
        #expect(machine.state == .closed)
        #expect(machine.peerClose?.code == .goingAway)
    }

    @Test("A close with no code is reported as 1005 but answered with 1000: 1005 never goes on the wire")
    func emptyClose() {
        var machine = WebSocketStateMachine(role: .client)
        let actions = machine.receive(WebSocketFrame(opcode: .close))
        #expect(actions.contains(.closeReceived(.noStatusReceived, "")))
        #expect(actions.contains(.send(WebSocketStateMachine.closeFrame(.normalClosure, ""))))
    }

    @Test("Close started by us: the peer's reply completes the handshake")
    func weClose() {
        var machine = WebSocketStateMachine(role: .client)
        #expect(
            machine.close(.normalClosure, reason: "done") == [
                .send(WebSocketStateMachine.closeFrame(.normalClosure, "done"))
            ])
        #expect(machine.state == .closing)
        // Data after our close is ignored; the peer's close completes it.
        #expect(machine.receive(WebSocketFrame(opcode: .text, payload: Array("late".utf8))) == [])
        #expect(
            machine.receive(WebSocketStateMachine.closeFrame(.normalClosure, "")) == [
                .closeReceived(.normalClosure, ""), .closeConnection,
            ])
        #expect(machine.state == .closed)
    }

    @Test(
        "Close frames with a 1-byte payload, a forbidden code or a bad reason are protocol errors",
        arguments: [
            ([0x03] as [UInt8], 1002 as UInt16), ([0x03, 0xED] as [UInt8], 1002 as UInt16),
            ([0x03, 0xE8, 0xFF] as [UInt8], 1007 as UInt16), ([0x00, 0x00] as [UInt8], 1002 as UInt16),
        ])
    func badClose(payload: [UInt8], code: UInt16) {
        var machine = WebSocketStateMachine(role: .server)
        let actions = machine.receive(WebSocketFrame(opcode: .close, payload: payload))
        guard case .failed(let error) = actions.first else {
            Issue.record("expected a failure, got \(actions)")
            return
        }
        #expect(error.closeCode.rawValue == code)
    }

    @Test("A continuation with nothing to continue, or a new message inside a fragmented one, is 1002")
    func fragmentationErrors() {
        var machine = WebSocketStateMachine(role: .server)
        if case .failed(let error) = machine.receive(WebSocketFrame(opcode: .continuation, payload: [1])).first {
            #expect(error.closeCode == .protocolError)
        } else {
            Issue.record("a lone continuation was accepted")
        }
        var other = WebSocketStateMachine(role: .server)
        _ = other.receive(WebSocketFrame(fin: false, opcode: .text, payload: [0x41]))
        if case .failed(let error) = other.receive(WebSocketFrame(opcode: .binary, payload: [1])).first {
            #expect(error.closeCode == .protocolError)
        } else {
            Issue.record("a new message inside a fragmented one was accepted")
        }
    }

    @Test("Sending fragments a message into frames of the chosen size")
    func fragmentOnSend() {
        let frames = WebSocketStateMachine.frames(
            text: false, payload: [UInt8](repeating: 1, count: 10), fragmentSize: 4)
        #expect(frames.map(\.payload.count) == [4, 4, 2])
        #expect(frames.map(\.opcode) == [.binary, .continuation, .continuation])
        #expect(frames.map(\.fin) == [false, false, true])
    }

    // MARK: Opening handshake

    @Test("The RFC's example key gives its example accept value")
    func acceptValue() {
        #expect(WebSocketHandshake.acceptValue(forKey: "dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    }

    @Test("A client request is accepted with 101 and the negotiated subprotocol; the client validates it")
    func handshakeRoundTrip() throws {
        let key = "dGhlIHNhbXBsZSBub25jZQ=="
        let request = WebSocketHandshake.clientRequest(
            host: "127.0.0.1:9000", path: "/chat", key: key, protocols: ["chat", "superchat"],
            origin: "http://example.test")
        let accepted = try WebSocketHandshake.acceptRequest(request, supportedProtocols: ["superchat"]).get()
        #expect(accepted.path == "/chat")
        #expect(accepted.subprotocol == "superchat")
        #expect(accepted.origin == "http://example.test")
        #expect(accepted.response.hasPrefix("HTTP/1.1 101 Switching Protocols\r\n"))
        #expect(accepted.response.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"))
        let chosen = try WebSocketHandshake.validateResponse(
            accepted.response, key: key, offeredProtocols: ["chat", "superchat"]
        ).get().subprotocol
        #expect(chosen == "superchat")
    }

    @Test("A valid request and response pass the partial-head check at every length; garbage fails at its first byte")
    func partialHead() throws {
        let key = "dGhlIHNhbXBsZSBub25jZQ=="
        let request = Array(
            WebSocketHandshake.clientRequest(
                host: "127.0.0.1:9000", path: "/chat", key: key, protocols: ["chat"], origin: "http://example.test"
            ).utf8)
        let response = Array(
            try WebSocketHandshake.acceptRequest(String(decoding: request, as: UTF8.self)).get().response.utf8)
        for (head, isRequest) in [(request, true), (response, false)] {
            for length in 0...head.count {
                #expect(
                    WebSocketHandshake.checkPartialHead(Array(head[..<length]), request: isRequest, limit: 16_384)
                        == nil)
            }
        }
        #expect(WebSocketHandshake.checkPartialHead([0x16], request: true, limit: 16_384)?.status == 400)
        #expect(
            WebSocketHandshake.checkPartialHead(Array("GET / HTTP/1.1\n".utf8), request: true, limit: 16_384)?.status
                == 400)
        #expect(
            WebSocketHandshake.checkPartialHead(Array("GET /\u{01}".utf8), request: true, limit: 16_384)?.status == 400)
        #expect(WebSocketHandshake.checkPartialHead(request, request: true, limit: 64)?.status == 431)
        #expect(
            WebSocketHandshake.checkPartialHead(Array("HTTP/1.0 200".utf8), request: false, limit: 16_384)?.status
                == 400)
    }

    @Test(
        "Wrong or missing headers are rejected with a reason and 400 or 426",
        arguments: [
            (
                "POST / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
                400, "GET"
            ),
            (
                "GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
                400, "Host"
            ),
            (
                "GET / HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
                400, "Upgrade"
            ),
            (
                "GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: keep-alive\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
                400, "Connection"
            ),
            (
                "GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: short\r\nSec-WebSocket-Version: 13\r\n\r\n",
                400, "16 bytes"
            ),
            (
                "GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n",
                426, "13"
            ),
        ])
    func rejectedRequests(request: String, status: Int, reason: String) {
        switch WebSocketHandshake.acceptRequest(request) {
        case .success: Issue.record("accepted a bad request")
        case .failure(let rejection):
            #expect(rejection.status == status)
            #expect(rejection.reason.contains(reason))
            #expect(rejection.response.hasPrefix("HTTP/1.1 \(status) "))
        }
    }

    @Test("A response with the wrong accept value is refused by the client")
    func badAccept() {
        let response =
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: AAAA\r\n\r\n"
        guard case .failure(let error) = WebSocketHandshake.validateResponse(response, key: "dGhlIHNhbXBsZSBub25jZQ==")
        else {
            Issue.record("accepted a wrong Sec-WebSocket-Accept")
            return
        }
        #expect(error.reason.contains("Sec-WebSocket-Accept"))
    }

    @Test("Base64 round-trips and rejects malformed input")
    func base64() {
        for length in 0..<20 {
            let bytes = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 37) }
            #expect(Base64.decode(Base64.encode(bytes)) == bytes)
        }
        #expect(Base64.encode(Array("foobar".utf8)) == "Zm9vYmFy")
        #expect(Base64.decode("Zm9v!mFy") == nil)
        #expect(Base64.decode("Zm9") == nil)
    }
}
