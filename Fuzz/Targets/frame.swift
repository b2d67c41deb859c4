// Fuzz target: the WebSocket frame parser and the state machine behind it, in both roles.
// Built by scripts/fuzz together with Sources/WebSocketCodec as one module (hence no import).
//
// Checked beyond "no crash": the same bytes give the same frames (or the same error) whether they arrive at once
// or in two pieces; every frame parsed re-encodes to bytes that parse to the same frame; the state machine never
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
