import CZlib

/// permessage-deflate (RFC 7692) as a user enables it: what to offer (client) or accept (server).
///
/// Off unless set (`WebSocketOptions` in WebSocketTransport holds it as an optional). The defaults compress
/// with context takeover and the full 32 KiB window both ways, as browsers and Python `websockets` do.
public struct WebSocketDeflateOptions: Sendable, Hashable {
    /// Client: ask the server to reset its compressor after every message. Server: always do so (and say so).
    public var serverNoContextTakeover = false
    /// Client: reset our compressor after every message (and say so). Server: ask the client to (it must comply).
    public var clientNoContextTakeover = false
    /// The largest LZ77 window (8-15 bits) the server compresses with. Client: asked for when below 15.
    /// Server: the most it uses, whatever the client allows.
    public var serverMaxWindowBits = 15
    /// The largest window the client compresses with. Client: the most it uses (the offer always says that a
    /// server may lower it). Server: asked of clients that allow it, when below 15.
    public var clientMaxWindowBits = 15
    /// zlib's compression level, 0 (store) to 9 (best); 6 is zlib's default.
    public var compressionLevel = 6
    /// zlib's memory level, 1-9: the compressor's hash table is 2^(level+9) bytes (8: 128 KiB, 5: 16 KiB).
    public var memoryLevel = 8
    /// Messages shorter than this go out uncompressed (RSV1 clear): deflate cannot shrink a handful of bytes.
    public var minimumSize = 32

    public init() {}

    /// The defaults, changed by `configure`.
    public static func with(_ configure: (inout WebSocketDeflateOptions) -> Void) -> WebSocketDeflateOptions {
        var options = WebSocketDeflateOptions()
        configure(&options)
        return options
    }

    /// The client's offer: one `permessage-deflate` extension for `Sec-WebSocket-Extensions`.
    public var offer: String {
        var parts = [WebSocketDeflateAgreement.extensionName]
        if serverNoContextTakeover { parts.append("server_no_context_takeover") }
        if clientNoContextTakeover { parts.append("client_no_context_takeover") }
        if Self.clampedBits(serverMaxWindowBits) < 15 {
            parts.append("server_max_window_bits=\(Self.clampedBits(serverMaxWindowBits))")
        }
        // Always present: the server may lower the window we compress with (we honour any value 8-15).
        parts.append(
            Self.clampedBits(clientMaxWindowBits) < 15
                ? "client_max_window_bits=\(Self.clampedBits(clientMaxWindowBits))" : "client_max_window_bits")
        return parts.joined(separator: "; ")
    }

    static func clampedBits(_ bits: Int) -> Int { min(15, max(8, bits)) }
}

/// What the opening handshake agreed for permessage-deflate (both directions).
public struct WebSocketDeflateAgreement: Sendable, Hashable, CustomStringConvertible {
    /// The extension's registered name.
    public static let extensionName = "permessage-deflate"

    /// The server resets its compressor after every message.
    public var serverNoContextTakeover = false
    /// The client resets its compressor after every message.
    public var clientNoContextTakeover = false
    /// The server's largest window (8-15).
    public var serverMaxWindowBits = 15
    /// The client's largest window (8-15).
    public var clientMaxWindowBits = 15
    /// Whether the server's answer names its window: only when the client's offer had server_max_window_bits
    /// (RFC 7692 §7.1.2.1 forbids it otherwise; a server may still use a smaller window unannounced).
    var announcesServerWindow = false

    public init() {}

    /// The agreement as the server's answer states it.
    public var description: String { responseHeader }

    /// Whether `role`'s compressor resets after every message.
    public func resetsAfterSending(_ role: WebSocketRole) -> Bool {
        role == .server ? serverNoContextTakeover : clientNoContextTakeover
    }

    /// Whether the peer's compressor resets after every message (so ours, inflating, must too).
    public func resetsAfterReceiving(_ role: WebSocketRole) -> Bool {
        role == .server ? clientNoContextTakeover : serverNoContextTakeover
    }

    /// The window `role` compresses with.
    public func sendingWindowBits(_ role: WebSocketRole) -> Int {
        role == .server ? serverMaxWindowBits : clientMaxWindowBits
    }

    // MARK: Negotiation (RFC 7692 §5, §7.1)

    /// One extension from a `Sec-WebSocket-Extensions` list: its name and parameters (value `nil` when absent).
    struct Offer {
        var name: String
        var parameters: [(name: String, value: String?)]
    }

    /// Parses `Sec-WebSocket-Extensions` values (RFC 6455 §9.1: `name; param; param=value, name2 ...`, values
    /// tokens or quoted strings). `nil` when malformed.
    static func parse(_ values: [String]) -> [Offer]? {
        var offers: [Offer] = []
        for value in values {
            // Split on commas and semicolons outside quoted strings.
            var elements: [[String]] = [[]]
            var current = ""
            var quoted = false
            var escaped = false
            for character in value {
                if quoted {
                    if escaped {
                        current.append(character)
                        escaped = false
                    } else if character == "\\" {
                        escaped = true
                    } else if character == "\"" {
                        quoted = false
                    } else {
                        current.append(character)
                    }
                    continue
                }
                switch character {
                case "\"": quoted = true
                case ";":
                    elements[elements.count - 1].append(current)
                    current = ""
                case ",":
                    elements[elements.count - 1].append(current)
                    current = ""
                    elements.append([])
                default: current.append(character)
                }
            }
            if quoted { return nil }
            elements[elements.count - 1].append(current)
            for element in elements {
                let parts = element.map { $0.trimmingSpaces() }
                if parts.count == 1 && parts[0].isEmpty { continue }  // an empty list element is allowed
                guard let name = parts.first, isToken(name) else { return nil }
                var parameters: [(String, String?)] = []
                for part in parts.dropFirst() {
                    if let equals = part.firstIndex(of: "=") {
                        let key = part[..<equals].trimmingSpaces()
                        let value = part[part.index(after: equals)...].trimmingSpaces()
                        guard isToken(key), !value.isEmpty else { return nil }
                        parameters.append((key.lowercased(), value))
                    } else {
                        guard isToken(part) else { return nil }
                        parameters.append((part.lowercased(), nil))
                    }
                }
                offers.append(Offer(name: name.lowercased(), parameters: parameters))
            }
        }
        return offers
    }

    private static func isToken(_ text: String) -> Bool {
        let separators = Set("()<>@,;:\\\"/[]?={} \t".utf8)
        return !text.isEmpty && text.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7F && !separators.contains($0) }
    }

    /// A window size parameter's value: 8-15 in decimal, no leading zero.
    private static func windowBits(_ value: String?) -> Int? {
        guard let value, let bits = Int(value), (8...15).contains(bits), String(bits) == value else { return nil }
        return bits
    }

    /// Server: the first acceptable `permessage-deflate` offer among `values` (each `Sec-WebSocket-Extensions`
    /// header), agreed with what `options` allow; `nil` declines them all (the connection goes on uncompressed).
    /// An offer with an unknown, repeated or invalid parameter is declined (RFC 7692 §5).
    public static func accept(offers values: [String], options: WebSocketDeflateOptions) -> WebSocketDeflateAgreement? {
        guard let offers = parse(values) else { return nil }
        for offer in offers where offer.name == extensionName {
            var agreement = WebSocketDeflateAgreement()
            var seen = Set<String>()
            var valid = true
            var clientWindowOffered = false
            var clientWindowLimit = 15
            var serverWindowLimit = 15
            for (name, value) in offer.parameters {
                guard seen.insert(name).inserted else {
                    valid = false
                    break
                }
                switch name {
                case "server_no_context_takeover" where value == nil: agreement.serverNoContextTakeover = true
                case "client_no_context_takeover" where value == nil: agreement.clientNoContextTakeover = true
                case "server_max_window_bits":
                    guard let bits = windowBits(value) else {
                        valid = false
                        break
                    }
                    serverWindowLimit = bits
                case "client_max_window_bits":
                    clientWindowOffered = true
                    if value != nil {
                        guard let bits = windowBits(value) else {
                            valid = false
                            break
                        }
                        clientWindowLimit = bits
                    }
                default: valid = false
                }
                if !valid { break }
            }
            guard valid else { continue }
            if options.serverNoContextTakeover { agreement.serverNoContextTakeover = true }
            if options.clientNoContextTakeover { agreement.clientNoContextTakeover = true }
            // Our window: at most what the client allows and what we want. Stated only when the client asked.
            agreement.serverMaxWindowBits = min(
                serverWindowLimit, WebSocketDeflateOptions.clampedBits(options.serverMaxWindowBits))
            // The client's window: only a client that said it can may be asked to use a smaller one.
            if clientWindowOffered {
                agreement.clientMaxWindowBits = min(
                    clientWindowLimit, WebSocketDeflateOptions.clampedBits(options.clientMaxWindowBits))
            } else {
                agreement.clientMaxWindowBits = 15
            }
            agreement.announcesServerWindow = serverWindowLimit < 15
            return agreement
        }
        return nil
    }

    /// Client: checks the server's `Sec-WebSocket-Extensions` answer against our offer (`options`). No
    /// extension: uncompressed (`nil`). Anything but one valid `permessage-deflate` within the offer fails the
    /// handshake.
    public static func validate(
        response values: [String], offered options: WebSocketDeflateOptions
    ) -> Result<WebSocketDeflateAgreement?, WebSocketProtocolError> {
        func fail(_ reason: String) -> Result<WebSocketDeflateAgreement?, WebSocketProtocolError> {
            .failure(WebSocketProtocolError(.protocolError, "handshake: \(reason)"))
        }
        guard let offers = parse(values) else { return fail("a malformed Sec-WebSocket-Extensions answer") }
        if offers.isEmpty { return .success(nil) }
        guard offers.count == 1, offers[0].name == extensionName else {
            return fail("the server chose an extension we did not offer (\(values.joined(separator: ", ")))")
        }
        var agreement = WebSocketDeflateAgreement()
        var seen = Set<String>()
        for (name, value) in offers[0].parameters {
            guard seen.insert(name).inserted else { return fail("permessage-deflate parameter \(name) is repeated") }
            switch name {
            case "server_no_context_takeover" where value == nil: agreement.serverNoContextTakeover = true
            case "client_no_context_takeover" where value == nil: agreement.clientNoContextTakeover = true
            case "server_max_window_bits":
                guard let bits = windowBits(value) else { return fail("server_max_window_bits=\(value ?? "")") }
                let asked = WebSocketDeflateOptions.clampedBits(options.serverMaxWindowBits)
                guard bits <= asked else { return fail("server_max_window_bits=\(bits) is above the \(asked) asked") }
                agreement.serverMaxWindowBits = bits
                agreement.announcesServerWindow = true
            case "client_max_window_bits":
                guard let bits = windowBits(value) else { return fail("client_max_window_bits=\(value ?? "")") }
                agreement.clientMaxWindowBits = bits
            default:
                return fail("unknown permessage-deflate parameter \(name)")
            }
        }
        if options.serverNoContextTakeover && !agreement.serverNoContextTakeover {
            return fail("the server did not agree to server_no_context_takeover")
        }
        // Our own choices hold whatever the server said.
        if options.clientNoContextTakeover { agreement.clientNoContextTakeover = true }
        agreement.clientMaxWindowBits = min(
            agreement.clientMaxWindowBits, WebSocketDeflateOptions.clampedBits(options.clientMaxWindowBits))
        return .success(agreement)
    }

    /// The server's `Sec-WebSocket-Extensions` answer for this agreement.
    public var responseHeader: String {
        var parts = [Self.extensionName]
        if serverNoContextTakeover { parts.append("server_no_context_takeover") }
        if clientNoContextTakeover { parts.append("client_no_context_takeover") }
        if announcesServerWindow && serverMaxWindowBits < 15 {
            parts.append("server_max_window_bits=\(serverMaxWindowBits)")
        }
        if clientMaxWindowBits < 15 { parts.append("client_max_window_bits=\(clientMaxWindowBits)") }
        return parts.joined(separator: "; ")
    }
}

/// The empty stored block a sync flush ends with: stripped from every compressed message and put back before
/// inflating (RFC 7692 §7.2.1, §7.2.2).
let deflateTail: [UInt8] = [0x00, 0x00, 0xFF, 0xFF]
