// Fuzz target: the WebSocket frame parser and the state machine behind it, in both roles.
// Built by scripts/fuzz together with Sources/WebSocketCodec as one module (hence no import).
//
// Checked beyond "no crash": the same bytes give the same frames (or the same error) whether they arrive at once
// or in two pieces; every frame parsed re-encodes to bytes that parse to the same frame; the state machine never
// puts a frame on the wire that the peer's parser would refuse.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzFrames(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    for role in [WebSocketRole.server, .client] {
        let whole = parse(bytes, role: role, splitAt: bytes.count)
        let split = parse(bytes, role: role, splitAt: bytes.isEmpty ? 0 : Int(bytes[0]) % bytes.count)
        precondition(whole.frames == split.frames && whole.error == split.error, "chunking changed the result")
        var machine = WebSocketStateMachine(role: role, maximumMessageSize: 4096)
        for frame in whole.frames {
            let again = parse(WebSocketFrameEncoder.encode(frame), role: role, splitAt: 0)
            precondition(again.frames == [frame] && again.error == nil, "a parsed frame did not survive re-encoding")
            for action in machine.receive(frame) {
                guard case .send(var reply) = action else { continue }
                // What we send goes to the other role's parser, masked if we are the client.
                if role == .client { reply.maskingKey = 0x1234_5678 }
                let sent = parse(
                    WebSocketFrameEncoder.encode(reply), role: role == .server ? .client : .server, splitAt: 0)
                precondition(sent.error == nil && sent.frames.count == 1, "the state machine sent an invalid frame")
            }
        }
    }
    return 0
}

private func parse(
    _ bytes: [UInt8], role: WebSocketRole, splitAt cut: Int
) -> (frames: [WebSocketFrame], error: String?) {
    var parser = WebSocketFrameParser(role: role, maximumFrameSize: 2048)
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
