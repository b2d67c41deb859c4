import CZlib
import ConnectionCore
import Testing
import WebSocketCodec

@Suite("permessage-deflate (RFC 7692)")
struct PerMessageDeflateTests {
    static let hello = Array("Hello".utf8)

    /// A state machine for `role` with deflate agreed as `agreement`.
    static func machine(
        _ role: WebSocketRole, _ agreement: WebSocketDeflateAgreement = WebSocketDeflateAgreement(),
        limit: Int = 1 << 20
    ) -> WebSocketStateMachine {
        WebSocketStateMachine(role: role, maximumMessageSize: limit, deflate: agreement)
    }

    static func delivered(_ actions: [WebSocketStateMachine.Action]) -> [UInt8]? {
        for case .deliver(_, let payload) in actions { return payload }
        return nil
    }

    static func failure(_ actions: [WebSocketStateMachine.Action]) -> WebSocketProtocolError? {
        for case .failed(let error) in actions { return error }
        return nil
    }

    // MARK: The RFC's examples (§7.2.3)

    @Test("\"Hello\" compresses to the RFC's bytes, and the RFC's compressed messages inflate to \"Hello\"")
    func rfcExamples() throws {
        let deflater = try WebSocketDeflater(
            agreement: WebSocketDeflateAgreement(), role: .server, options: WebSocketDeflateOptions())
        #expect(deflater.compress(Self.hello) == [0xF2, 0x48, 0xCD, 0xC9, 0xC9, 0x07, 0x00])
        let examples: [(String, [[UInt8]])] = [
            ("7.2.3.1 one message", [[0xF2, 0x48, 0xCD, 0xC9, 0xC9, 0x07, 0x00]]),
            (
                "7.2.3.2 the second message refers to the first",
                [
                    [0xF2, 0x48, 0xCD, 0xC9, 0xC9, 0x07, 0x00], [0xF2, 0x00, 0x11, 0x00, 0x00],
                ]
            ),
            ("7.2.3.3 a stored block", [[0x00, 0x05, 0x00, 0xFA, 0xFF, 0x48, 0x65, 0x6C, 0x6C, 0x6F, 0x00]]),
            ("7.2.3.4 BFINAL set", [[0xF3, 0x48, 0xCD, 0xC9, 0xC9, 0x07, 0x00, 0x00]]),
        ]
        for (name, messages) in examples {
            var machine = Self.machine(.client)
            for payload in messages {
                let actions = machine.receive(WebSocketFrame(opcode: .text, payload: payload, rsv1: true))
                #expect(Self.delivered(actions) == Self.hello, "\(name)")
            }
        }
        // 7.2.3.1 in two fragments: RSV1 on the first only.
        var machine = Self.machine(.client)
        #expect(
            machine.receive(WebSocketFrame(fin: false, opcode: .text, payload: [0xF2, 0x48, 0xCD], rsv1: true)) == [])
        let actions = machine.receive(WebSocketFrame(opcode: .continuation, payload: [0xC9, 0xC9, 0x07, 0x00]))
        #expect(Self.delivered(actions) == Self.hello)
    }

    // MARK: Both directions through the codec

    @Test(
        "Messages survive compression and inflation, fragmented or not, with and without context takeover",
        arguments: [false, true])
    func roundTrip(noContextTakeover: Bool) throws {
        var agreement = WebSocketDeflateAgreement()
        agreement.serverNoContextTakeover = noContextTakeover
        let deflater = try WebSocketDeflater(agreement: agreement, role: .server, options: WebSocketDeflateOptions())
        var client = Self.machine(.client, agreement)
        let json = Array(#"{"type":"book","bids":[[101.5,3],[101.25,7]],"asks":[[101.75,2]]}"#.utf8)
        var sizes: [Int] = []
        for message in [json, json, [], Array(repeating: 0x61, count: 300_000), (0..<70_000).map { UInt8($0 % 251) }] {
            let compressed = deflater.compress(message)
            sizes.append(compressed.count)
            let frames = WebSocketStateMachine.frames(
                text: false, payload: compressed, fragmentSize: 1000, compressed: true)
            #expect(frames.first?.rsv1 == true && frames.dropFirst().allSatisfy { !$0.rsv1 })
            var delivered: [UInt8]?
            for frame in frames { delivered = Self.delivered(client.receive(frame)) ?? delivered }
            #expect(delivered == message)
        }
        // With context takeover the repeated message is a back-reference to the first; without it, it is not.
        if noContextTakeover {
            #expect(sizes[1] == sizes[0])
        } else {
            #expect(sizes[1] < sizes[0] / 3)
        }
        #expect(sizes[3] < 1000)
    }

    @Test("Text is checked for UTF-8 after inflation (1007)")
    func utf8AfterInflation() throws {
        let deflater = try WebSocketDeflater(
            agreement: WebSocketDeflateAgreement(), role: .server, options: WebSocketDeflateOptions())
        var client = Self.machine(.client)
        let actions = client.receive(
            WebSocketFrame(opcode: .text, payload: deflater.compress([0x61, 0xC0, 0xAF, 0x62]), rsv1: true))
        #expect(Self.failure(actions)?.closeCode == .invalidFramePayloadData)
    }

    // MARK: What is refused

    @Test("A deflate bomb is refused with 1009 at the size limit")
    func bomb() throws {
        let deflater = try WebSocketDeflater(
            agreement: WebSocketDeflateAgreement(), role: .client, options: WebSocketDeflateOptions())
        let bomb = deflater.compress([UInt8](repeating: 0, count: 64 << 20))  // 64 MiB of zeros
        #expect(bomb.count < 100_000)
        var server = Self.machine(.server, limit: 1 << 20)
        let actions = server.receive(WebSocketFrame(opcode: .binary, payload: bomb, rsv1: true))
        #expect(Self.failure(actions)?.closeCode == .messageTooBig)
        #expect(actions.contains(.closeConnection))
        // A message just under the limit still goes through.
        var roomy = Self.machine(.server, limit: 1 << 20)
        let fits = [UInt8](repeating: 7, count: 1 << 20)
        let fresh = try WebSocketDeflater(
            agreement: WebSocketDeflateAgreement(), role: .client, options: WebSocketDeflateOptions())
        #expect(
            Self.delivered(roomy.receive(WebSocketFrame(opcode: .binary, payload: fresh.compress(fits), rsv1: true)))
                == fits)
    }

    @Test("Bytes that are not deflate data fail the connection with 1007")
    func badStream() {
        var machine = Self.machine(.client)
        let actions = machine.receive(WebSocketFrame(opcode: .binary, payload: [0xFF, 0xFF, 0xFF, 0x00], rsv1: true))
        #expect(Self.failure(actions)?.closeCode == .invalidFramePayloadData)
    }

    @Test("RSV1 without the extension, on a control frame or on a continuation, and RSV2 fail with 1002")
    func reservedBits() throws {
        var plain = WebSocketStateMachine(role: .client)
        #expect(
            Self.failure(plain.receive(WebSocketFrame(opcode: .text, payload: Self.hello, rsv1: true)))?.closeCode
                == .protocolError)
        var control = Self.machine(.client)
        #expect(Self.failure(control.receive(WebSocketFrame(opcode: .ping, rsv1: true)))?.closeCode == .protocolError)
        var continuation = Self.machine(.client)
        _ = continuation.receive(WebSocketFrame(fin: false, opcode: .text, payload: [0xF2], rsv1: true))
        #expect(
            Self.failure(continuation.receive(WebSocketFrame(opcode: .continuation, payload: [0x48], rsv1: true)))?
                .closeCode == .protocolError)
        var rsv2 = Self.machine(.client)
        #expect(
            Self.failure(rsv2.receive(WebSocketFrame(opcode: .text, payload: Self.hello, rsv2: true)))?.closeCode
                == .protocolError)
        // The parser lets RSV1 through only when compression is agreed.
        var parser = WebSocketFrameParser(role: .client)
        parser.feed([0xC1, 0x01, 0x00])
        #expect(throws: WebSocketProtocolError.self) { _ = try parser.nextFrame() }
        var allowing = WebSocketFrameParser(role: .client)
        allowing.allowsCompressedFrames = true
        allowing.feed([0xC1, 0x01, 0x00, 0xA1, 0x01, 0x00])
        #expect(try allowing.nextFrame()?.rsv1 == true)
        #expect(throws: WebSocketProtocolError.self) { _ = try allowing.nextFrame() }  // RSV2
    }

    @Test("With a 256-byte window agreed (8 bits, which zlib refuses), what we send inflates in 256 bytes")
    func window8() throws {
        var agreement = WebSocketDeflateAgreement()
        agreement.clientMaxWindowBits = 8
        // Repeats at every distance around the window's edge; zlib's 8-bit inflater refuses any reference past 256.
        var generator = SplitMix64(seed: 8)
        for period in [100, 200, 250, 255, 256, 257, 262, 300, 511, 1000] {
            let block = (0..<period).map { _ in UInt8.random(in: 0...255, using: &generator) }
            let message = Array((0..<20).map { _ in block }.joined())
            let deflater = try WebSocketDeflater(
                agreement: agreement, role: .client, options: WebSocketDeflateOptions())
            let compressed = deflater.compress(message)
            #expect(try Self.rawInflate(compressed + [0x00, 0x00, 0xFF, 0xFF], windowBits: 8) == message, "\(period)")
            if period <= 250 { #expect(compressed.count < message.count / 5, "back-references used at \(period)") }
        }
        // The check can fail: a 1024-byte window refers 300 bytes back, which the 8-bit inflater refuses.
        var wider = WebSocketDeflateAgreement()
        wider.clientMaxWindowBits = 10
        let pattern = (0..<300).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }
        let referring = try WebSocketDeflater(agreement: wider, role: .client, options: WebSocketDeflateOptions())
            .compress(Array((0..<10).map { _ in pattern }.joined()))
        #expect(throws: (any Error).self) {
            _ = try Self.rawInflate(referring + [0x00, 0x00, 0xFF, 0xFF], windowBits: 8)
        }
    }

    struct InflateFailed: Error {}

    /// zlib's own raw inflate with a given window, independent of the code under test. One byte of output per
    /// call: zlib checks a distance against its window only for bytes not in the current call's output.
    static func rawInflate(_ input: [UInt8], windowBits: Int32) throws -> [UInt8] {
        var stream = z_stream()
        guard socketstyles_inflate_init(&stream, -windowBits) == Z_OK else { throw InflateFailed() }
        defer { inflateEnd(&stream) }
        var output: [UInt8] = []
        var input = input
        var byte: UInt8 = 0
        try input.withUnsafeMutableBufferPointer { input in
            stream.next_in = input.baseAddress
            stream.avail_in = UInt32(input.count)
            while true {
                let status = withUnsafeMutablePointer(to: &byte) { byte in
                    stream.next_out = byte
                    stream.avail_out = 1
                    return CZlib.inflate(&stream, Z_SYNC_FLUSH)
                }
                if stream.avail_out == 0 { output.append(byte) }
                if status == Z_BUF_ERROR || status == Z_STREAM_END { return }
                guard status == Z_OK else { throw InflateFailed() }
            }
        }
        return output
    }

    // MARK: Negotiation (§5, §7.1)

    @Test("A server accepts the first valid offer, declines invalid ones, and answers within the offer")
    func serverNegotiation() {
        let defaults = WebSocketDeflateOptions()
        func answer(_ offers: [String], _ options: WebSocketDeflateOptions = WebSocketDeflateOptions()) -> String? {
            WebSocketDeflateAgreement.accept(offers: offers, options: options)?.responseHeader
        }
        #expect(answer(["permessage-deflate"]) == "permessage-deflate")
        #expect(answer(["permessage-deflate; client_max_window_bits"]) == "permessage-deflate")
        #expect(answer(["x-webkit-deflate-frame"]) == nil)
        #expect(
            answer(["permessage-deflate; server_max_window_bits=10"]) == "permessage-deflate; server_max_window_bits=10"
        )
        #expect(
            answer(["permessage-deflate; server_no_context_takeover; client_no_context_takeover"])
                == "permessage-deflate; server_no_context_takeover; client_no_context_takeover")
        // Quoted values, several headers, several offers: the first valid one wins.
        #expect(
            answer(["permessage-deflate; client_max_window_bits=\"10\""], .with { $0.clientMaxWindowBits = 9 })
                == "permessage-deflate; client_max_window_bits=9")
        for invalid in [
            "permessage-deflate; server_max_window_bits=16", "permessage-deflate; server_max_window_bits=08",
            "permessage-deflate; server_max_window_bits", "permessage-deflate; server_no_context_takeover=1",
            "permessage-deflate; foo", "permessage-deflate; client_no_context_takeover; client_no_context_takeover",
        ] {
            #expect(answer([invalid]) == nil, "\(invalid)")
            #expect(
                answer([invalid + ", permessage-deflate; client_no_context_takeover"])
                    == "permessage-deflate; client_no_context_takeover", "\(invalid)")
        }
        #expect(answer(["permessage-deflate; x=\"unterminated"]) == nil)
        // A client that did not offer client_max_window_bits is not asked to lower its window.
        #expect(answer(["permessage-deflate"], .with { $0.clientMaxWindowBits = 10 }) == "permessage-deflate")
        // The server's own choices.
        #expect(
            answer(["permessage-deflate"], .with { $0.serverNoContextTakeover = true })
                == "permessage-deflate; server_no_context_takeover")
        _ = defaults
    }

    @Test("A client accepts an answer within its offer and fails the handshake on anything else")
    func clientNegotiation() throws {
        let offer = WebSocketDeflateOptions()
        #expect(offer.offer == "permessage-deflate; client_max_window_bits")
        #expect(try WebSocketDeflateAgreement.validate(response: [], offered: offer).get() == nil)
        let agreed = try #require(
            try WebSocketDeflateAgreement.validate(
                response: ["permessage-deflate; server_max_window_bits=12; client_max_window_bits=10"], offered: offer
            ).get())
        #expect(agreed.serverMaxWindowBits == 12 && agreed.clientMaxWindowBits == 10)
        for bad in [
            "x-other", "permessage-deflate, permessage-deflate", "permessage-deflate; foo",
            "permessage-deflate; client_max_window_bits", "permessage-deflate; server_max_window_bits=7",
        ] {
            #expect(throws: WebSocketProtocolError.self, "\(bad)") {
                _ = try WebSocketDeflateAgreement.validate(response: [bad], offered: offer).get()
            }
        }
        // We asked for a smaller server window: a larger answer is refused.
        let asking = WebSocketDeflateOptions.with { $0.serverMaxWindowBits = 10 }
        #expect(asking.offer == "permessage-deflate; server_max_window_bits=10; client_max_window_bits")
        #expect(throws: WebSocketProtocolError.self) {
            _ = try WebSocketDeflateAgreement.validate(
                response: ["permessage-deflate; server_max_window_bits=11"], offered: asking
            ).get()
        }
        // Through the handshake functions: offer, accept, validate.
        let key = "dGhlIHNhbXBsZSBub25jZQ=="
        let request = WebSocketHandshake.clientRequest(
            host: "127.0.0.1", path: "/", key: key, headers: [("Sec-WebSocket-Extensions", offer.offer)])
        let accepted = try WebSocketHandshake.acceptRequest(request, deflate: WebSocketDeflateOptions()).get()
        #expect(accepted.response.contains("Sec-WebSocket-Extensions: permessage-deflate\r\n"))
        #expect(
            try WebSocketHandshake.validateResponse(accepted.response, key: key, offeredDeflate: offer).get().deflate
                == accepted.deflate)
        // A server that does not enable deflate ignores the offer; a client that offered nothing refuses one.
        let plain = try WebSocketHandshake.acceptRequest(request).get()
        #expect(plain.deflate == nil && !plain.response.contains("Extensions"))
        #expect(throws: WebSocketProtocolError.self) {
            _ = try WebSocketHandshake.validateResponse(accepted.response, key: key).get()
        }
    }
}
