// Fuzz target: the opening-handshake parsers (request and response heads), built with Sources/WebSocketCodec.
//
// Checked beyond "no crash": a head the incremental check refuses is never accepted once complete; every prefix of
// a head that the incremental check lets through is let through too (three cuts per input) (so garbage is refused at its first bad
// byte, never later); an accepted request's 101 response passes the client's validation with the same key.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzHandshake(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    for request in [true, false] {
        let refusal = WebSocketHandshake.checkPartialHead(bytes, request: request, limit: 8192)
        if refusal == nil, !bytes.isEmpty {
            // Three prefixes per input (one chosen by the input itself): over many runs, every cut is tried.
            for length in [Int(bytes[0]) % bytes.count, bytes.count / 2, bytes.count - 1] {
                precondition(
                    WebSocketHandshake.checkPartialHead(Array(bytes[..<length]), request: request, limit: 8192) == nil,
                    "a prefix of an acceptable head was refused")
            }
        }
        guard let length = WebSocketHandshake.headLength(in: bytes) else { continue }
        let text = String(decoding: bytes[..<length], as: UTF8.self)
        if request {
            if case .success(let accepted) = WebSocketHandshake.acceptRequest(
                text, supportedProtocols: ["chat"], deflate: WebSocketDeflateOptions())
            {
                let head = WebSocketHandshake.parseHead(text)!
                let key = head.value("sec-websocket-key")!
                let offered = head.tokens("sec-websocket-protocol")
                // Our own 101 (with whatever permessage-deflate it agreed to) passes our own client's check.
                let check = WebSocketHandshake.validateResponse(
                    accepted.response, key: key, offeredProtocols: offered, offeredDeflate: WebSocketDeflateOptions())
                guard case .success = check else { preconditionFailure("our 101 failed our own validation: \(check)") }
                precondition(
                    WebSocketHandshake.checkPartialHead(Array(accepted.response.utf8), request: false, limit: 8192)
                        == nil,
                    "our 101 failed the incremental check")
            }
        } else {
            _ = WebSocketHandshake.validateResponse(
                text, key: "dGhlIHNhbXBsZSBub25jZQ==", offeredProtocols: ["chat"],
                offeredDeflate: WebSocketDeflateOptions())
        }
        _ = refusal
    }
    return 0
}
