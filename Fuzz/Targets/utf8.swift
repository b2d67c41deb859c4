// Fuzz target: the incremental UTF-8 validator, built with Sources/WebSocketCodec.
//
// Checked against the standard library's validation: the same verdict for the whole input, fed at once, fed in two
// pieces at any cut, and through the raw-buffer path.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzUTF8(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    let expected = String(validating: bytes, as: UTF8.self) != nil
    precondition(UTF8Validator.isValid(bytes) == expected, "isValid disagrees with the standard library")
    let cut = bytes.isEmpty ? 0 : Int(bytes[0]) % (bytes.count + 1)
    var validator = UTF8Validator()
    var ok = validator.feed(bytes[..<cut])
    ok = ok && validator.feed(bytes[cut...])
    ok = ok && validator.isComplete
    precondition(ok == expected, "feeding in two pieces (cut at \(cut)) disagrees with the standard library")
    var raw = UTF8Validator()
    let rawOK = bytes.withUnsafeBytes { raw.feed($0) } && raw.isComplete
    precondition(rawOK == expected, "the raw-buffer path disagrees with the standard library")
    return 0
}
