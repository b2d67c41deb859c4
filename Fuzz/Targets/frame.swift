// Fuzz target: the WebSocket frame parser and the state machine behind it, in both roles.
// Built by scripts/fuzz together with Sources/WebSocketCodec as one module (hence no import).
//
// Checked beyond "no crash": the same bytes give the same frames (or the same error) whether they arrive at once
// or in two pieces, and whether or not messages are placed into a caller's buffer (`feed(_:placingInto:)`, with
// placing stopped between the pieces when the second byte is odd, as a cancelled receive stops it); every frame
// parsed re-encodes to bytes that parse to the same frame; the state machine never
// puts a frame on the wire that the peer's parser would refuse. When the last byte is odd, permessage-deflate is
// agreed (RSV1 allowed, compressed messages inflated): no message is ever delivered above the size limit, however
// far its compressed bytes would inflate.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzFrames(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    let deflate = (bytes.last ?? 0) & 1 == 1
    for role in [WebSocketRole.server, .client] {
        let whole = parse(bytes, role: role, splitAt: bytes.count, deflate: deflate)
        let split = parse(
            bytes, role: role, splitAt: bytes.isEmpty ? 0 : Int(bytes[0]) % bytes.count, deflate: deflate)
        precondition(whole.frames == split.frames && whole.error == split.error, "chunking changed the result")
        let placed = parsePlacing(bytes, role: role, deflate: deflate)
        precondition(
            placed.frames == whole.frames.map(Parsed.init) && placed.error == whole.error,
            "placing into a caller's buffer changed the result")
        var machine = WebSocketStateMachine(
            role: role, maximumMessageSize: 4096, deflate: deflate ? WebSocketDeflateAgreement() : nil)
        for frame in whole.frames {
            let again = parse(WebSocketFrameEncoder.encode(frame), role: role, splitAt: 0, deflate: deflate)
            precondition(again.frames == [frame] && again.error == nil, "a parsed frame did not survive re-encoding")
            for action in machine.receive(frame) {
                if case .deliver(_, let payload) = action {
                    precondition(payload.count <= 4096, "a message above the limit was delivered")
                }
                guard case .send(var reply) = action else { continue }
                // What we send goes to the other role's parser, masked if we are the client.
                if role == .client { reply.maskingKey = 0x1234_5678 }
                let sent = parse(
                    WebSocketFrameEncoder.encode(reply), role: role == .server ? .client : .server, splitAt: 0,
                    deflate: deflate)
                precondition(sent.error == nil && sent.frames.count == 1, "the state machine sent an invalid frame")
            }
        }
    }
    return 0
}

private func parse(
    _ bytes: [UInt8], role: WebSocketRole, splitAt cut: Int, deflate: Bool
) -> (frames: [WebSocketFrame], error: String?) {
    var parser = WebSocketFrameParser(role: role, maximumFrameSize: 2048)
    parser.allowsCompressedFrames = deflate
    var frames: [WebSocketFrame] = []
    for piece in [bytes[..<cut], bytes[cut...]] {
        parser.feed(Array(piece))
        do {
            while let frame = try parser.nextFrame() { frames.append(frame) }
        } catch {
            return (frames, "\(error)")
        }
    }
    return (frames, nil)
}

/// A frame as a receive sees it (a placed message has no masking key to compare).
private struct Parsed: Equatable {
    var fin: Bool
    var opcode: WebSocketOpcode
    var rsv1: Bool
    var payload: [UInt8]

    init(_ frame: WebSocketFrame) {
        self.init(fin: frame.fin, opcode: frame.opcode, rsv1: frame.rsv1, payload: frame.payload)
    }

    init(fin: Bool, opcode: WebSocketOpcode, rsv1: Bool, payload: [UInt8]) {
        self.fin = fin
        self.opcode = opcode
        self.rsv1 = rsv1
        self.payload = payload
    }
}

/// ``parse`` in two pieces cut at `bytes[0]`, placing messages into a buffer of `bytes[1] * 8` bytes.
private func parsePlacing(
    _ bytes: [UInt8], role: WebSocketRole, deflate: Bool
) -> (frames: [Parsed], error: String?) {
    var parser = WebSocketFrameParser(role: role, maximumFrameSize: 2048)
    parser.allowsCompressedFrames = deflate
    let cut = bytes.isEmpty ? 0 : Int(bytes[0]) % bytes.count
    let room = bytes.count > 1 ? Int(bytes[1]) * 8 : 0
    let stops = bytes.count > 1 && bytes[1] & 1 == 1
    let destination = UnsafeMutableRawBufferPointer.allocate(byteCount: max(room, 1), alignment: 1)
    defer { destination.deallocate() }
    let buffer = UnsafeMutableRawBufferPointer(rebasing: destination[..<room])
    // Odd inputs feed each piece only up to the end of a placed message and feed the rest again after taking it
    // (`feedUntilPlaced`, as the frame link does); even ones feed each piece whole.
    let untilPlaced = bytes.count > 2 && bytes[2] & 1 == 1
    var frames: [Parsed] = []
    for piece in [Array(bytes[..<cut]), Array(bytes[cut...])] {
        var offset = 0
        repeat {
            let taken = piece[offset...].withUnsafeBytes { input in
                guard untilPlaced else {
                    parser.feed(input, placingInto: buffer)
                    return input.count
                }
                return parser.feedUntilPlaced(input, placingInto: buffer)
            }
            offset += taken
            if let message = parser.takePlaced() {
                frames.append(
                    Parsed(fin: true, opcode: message.opcode, rsv1: false, payload: Array(buffer[..<message.count])))
            } else if taken == 0 && offset < piece.count {
                return (frames, "feedUntilPlaced took nothing with no placed message waiting")
            }
            do {
                while let frame = try parser.nextFrame() { frames.append(Parsed(frame)) }
            } catch {
                return (frames, "\(error)")
            }
        } while offset < piece.count
        if stops {
            parser.stopPlacing(copyingFrom: UnsafeRawBufferPointer(buffer))
            buffer.initializeMemory(as: UInt8.self, repeating: 0xEE)
        }
    }
    return (frames, nil)
}
