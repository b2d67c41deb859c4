// Fuzz target: the permessage-deflate inflater (RFC 7692), which every compressed WebSocket message goes through
// before anything else reads it. Built by scripts/fuzz together with Sources/WebSocketCodec as one module (hence no
// import).
//
// The first byte sets the message size limit (1 to 16,321 bytes) and whether the agreement resets the window after
// each message; the rest is one compressed message. Checked beyond "no crash": the output never passes the limit;
// the same bytes give the same result (the same output, or the same error) in one frame or cut into two at a point
// the input chooses; a failure is "too big" (1009) or "not deflate data" (1007), nothing else; what inflated, once
// compressed again by our deflater, inflates back to the same bytes.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzInflate(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    guard let control = bytes.first else { return 0 }
    let payload = Array(bytes.dropFirst())
    let limit = 1 + Int(control) * 64
    var agreement = WebSocketDeflateAgreement()
    agreement.clientNoContextTakeover = control & 1 == 1
    let whole = inflate([payload], agreement, limit)
    let cut = payload.isEmpty ? 0 : Int(control) % payload.count
    let split = inflate([Array(payload[..<cut]), Array(payload[cut...])], agreement, limit)
    precondition(whole == split, "cutting the message into two frames changed the result")
    switch whole {
    case .inflated(let output):
        precondition(output.count <= limit, "a message above the limit was inflated")
        let deflater = try! WebSocketDeflater(agreement: agreement, role: .client, options: WebSocketDeflateOptions())
        let again = inflate([deflater.compress(output)], agreement, limit)
        precondition(again == .inflated(output), "our own compression of the output did not inflate back to it")
    case .failed(let code):
        precondition(
            code == WebSocketCloseCode.messageTooBig.rawValue
                || code == WebSocketCloseCode.invalidFramePayloadData.rawValue,
            "an unexpected failure: \(code)")
    }
    return 0
}

private enum Outcome: Equatable {
    case inflated([UInt8])
    case failed(UInt16)
}

/// The server's inflater (it receives the client's messages) over `frames`, the last one final.
private func inflate(_ frames: [[UInt8]], _ agreement: WebSocketDeflateAgreement, _ limit: Int) -> Outcome {
    let inflater = try! WebSocketInflater(agreement: agreement, role: .server)
    var output: [UInt8] = []
    do {
        for (index, frame) in frames.enumerated() {
            try inflater.inflate(frame, final: index == frames.count - 1, into: &output, limit: limit)
        }
        return .inflated(output)
    } catch {
        return .failed(error.closeCode.rawValue)
    }
}
