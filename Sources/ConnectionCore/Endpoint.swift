/// A transport address written as a URL: `tcp://127.0.0.1:9000`, `udp://[::1]:53`, `ws://localhost:8080/echo`,
/// `wss://example.test/chat`, `tls://127.0.0.1:8443`.
///
/// Parsing is pure (no name resolution): a host name is kept as written and resolved by the backend layer
/// with `getaddrinfo` when connecting or listening. IPv6 literals are written in brackets. Port 0 asks the
/// system for a free port when listening; the listener's ``Listener/localEndpoint`` then carries the real one.
public struct Endpoint: Sendable, Hashable, CustomStringConvertible {
    /// How the host part was written.
    public enum Host: Sendable, Hashable, CustomStringConvertible {
        /// A dotted-quad IPv4 literal such as `127.0.0.1`.
        case ipv4(String)
        /// An IPv6 literal without its brackets, such as `::1`.
        case ipv6(String)
        /// A host name to be resolved, such as `localhost`.
        case name(String)

        /// The host as it appears in a URL (IPv6 in brackets).
        public var description: String {
            switch self {
            case .ipv4(let text), .name(let text): text
            case .ipv6(let text): "[\(text)]"
            }
        }

        /// The host without brackets, as name resolution takes it.
        public var literal: String {
            switch self {
            case .ipv4(let text), .ipv6(let text), .name(let text): text
            }
        }
    }

    /// The wire protocol, from the URL scheme.
    public var transport: Transport
    /// The host part.
    public var host: Host
    /// The port; 0 means "any free port" when listening.
    public var port: UInt16
    /// The path (WebSocket only); always starts with `/`. `/` for other transports.
    public var path: String

    /// Creates an endpoint from its parts.
    public init(transport: Transport, host: Host, port: UInt16, path: String = "/") {
        self.transport = transport
        self.host = host
        self.port = port
        self.path = path.hasPrefix("/") ? path : "/" + path
    }

    /// Parses a URL such as `tcp://127.0.0.1:9000` or `ws://[::1]:8080/echo`.
    ///
    /// - Throws: ``ConnectionError`` of kind ``ConnectionError/Kind/invalidEndpoint`` naming what is wrong: an
    ///   unknown scheme, a missing or out-of-range port, an empty host, an unclosed `[`, a path on a transport
    ///   that has none.
    public init(url: String) throws(ConnectionError) {
        func invalid(_ why: String) -> ConnectionError {
            ConnectionError(.invalidEndpoint, "\(why) in '\(url)'")
        }
        let parts = url.split(separator: "://", maxSplits: 1, omittingEmptySubsequences: false)
        guard parts.count == 2 else {
            throw invalid("missing scheme (expected tcp://, udp://, ws://, wss:// or tls://)")
        }
        let schemeText = parts[0].lowercased()
        guard let transport = Transport(rawValue: schemeText) else {
            throw invalid("unknown scheme '\(schemeText)' (expected tcp, udp, ws, wss or tls)")
        }
        var rest = parts[1]
        var path = "/"
        if let slash = rest.firstIndex(of: "/") {
            path = String(rest[slash...])
            rest = rest[..<slash]
        }
        let hasPath = transport == Transport.ws || transport == Transport.wss
        if path != "/" && !hasPath {
            throw invalid("a path is only meaningful for ws:// and wss://")
        }
        if rest.contains("@") { throw invalid("user information is not supported") }

        let host: Host
        var portText: Substring?
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]") else { throw invalid("unclosed '[' in IPv6 address") }
            let literal = rest[rest.index(after: rest.startIndex)..<close]
            guard !literal.isEmpty, literal.contains(":"), literal.allSatisfy(Self.isIPv6Character) else {
                throw invalid("'\(literal)' is not an IPv6 address")
            }
            host = .ipv6(String(literal))
            let after = rest[rest.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { throw invalid("unexpected text after ']'") }
                portText = after.dropFirst()
            }
        } else {
            if let colon = rest.lastIndex(of: ":") {
                if rest[..<colon].contains(":") { throw invalid("IPv6 addresses must be written in brackets") }
                portText = rest[rest.index(after: colon)...]
                rest = rest[..<colon]
            }
            guard !rest.isEmpty else { throw invalid("empty host") }
            let text = String(rest)
            if Self.isIPv4Literal(text) {
                host = .ipv4(text)
            } else {
                guard Self.isHostName(text) else { throw invalid("'\(text)' is not a valid host name") }
                host = .name(text.lowercased())
            }
        }
        let port: UInt16
        if let portText {
            guard !portText.isEmpty, portText.allSatisfy(\.isASCII), let value = UInt16(portText) else {
                throw invalid("port '\(portText)' is not a number from 0 to 65535")
            }
            port = value
        } else if let defaultPort = transport.defaultPort {
            port = defaultPort
        } else {
            throw invalid("missing port (\(transport)://host:port)")
        }
        self.init(transport: transport, host: host, port: port, path: path)
    }

    /// The endpoint written as a URL.
    public var description: String {
        let base = "\(transport.scheme)://\(host):\(port)"
        return (transport == .ws || transport == .wss) ? base + path : base
    }

    /// The same address with another transport (for example the TCP endpoint under a `ws://` URL).
    public func with(transport: Transport) -> Endpoint {
        Endpoint(transport: transport, host: host, port: port, path: path)
    }

    /// The same address with another port.
    public func with(port: UInt16) -> Endpoint {
        Endpoint(transport: transport, host: host, port: port, path: path)
    }

    static func isIPv6Character(_ character: Character) -> Bool {
        if character == ":" || character == "." || character == "%" { return true }
        return character.isASCII && (character.isHexDigit || character.isLetter || character.isNumber)
    }

    static func isIPv4Literal(_ text: String) -> Bool {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4 else { return false }
        return parts.allSatisfy { part in
            !part.isEmpty && part.count <= 3 && part.allSatisfy { $0.isASCII && $0.isNumber } && Int(part)! <= 255
        }
    }

    static func isHostNameCharacter(_ character: Character) -> Bool {
        character.isASCII && (character.isLetter || character.isNumber || character == "-" || character == "_")
    }

    static func isHostName(_ text: String) -> Bool {
        guard text.utf8.count <= 253 else { return false }
        let labels = text.split(separator: ".", omittingEmptySubsequences: false)
        for (index, label) in labels.enumerated() {
            // A single trailing dot (fully qualified name) is allowed.
            if label.isEmpty {
                if index == labels.count - 1 && index > 0 { continue }
                return false
            }
            if label.count > 63 || label.hasPrefix("-") || label.hasSuffix("-") { return false }
            if !label.allSatisfy(Self.isHostNameCharacter) { return false }
        }
        return true
    }
}
