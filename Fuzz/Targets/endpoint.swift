// Fuzz target: the URL parser of Endpoint, built with Sources/ConnectionCore.
//
// Checked beyond "no crash": a URL that parses prints as a URL that parses to the same endpoint.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzEndpoint(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let text = String(decoding: UnsafeBufferPointer(start: data, count: size), as: UTF8.self)
    guard let endpoint = try? Endpoint(url: text) else { return 0 }
    guard let again = try? Endpoint(url: endpoint.description) else {
        preconditionFailure("'\(text)' parsed, but its description '\(endpoint)' did not")
    }
    precondition(again == endpoint, "'\(text)' -> '\(endpoint)' -> '\(again)'")
    return 0
}
