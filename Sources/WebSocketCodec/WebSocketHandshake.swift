/// The opening handshake (RFC 6455 §4), both roles, as text in and text out (no I/O).
public enum WebSocketHandshake {
    /// The GUID appended to the key before hashing.
    static let guid = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

    /// Sec-WebSocket-Accept for a Sec-WebSocket-Key: base64(SHA-1(key + GUID)).
    public static func acceptValue(forKey key: String) -> String {
        Base64.encode(SHA1.hash(Array((key + guid).utf8)))
    }

    /// A fresh Sec-WebSocket-Key from 16 random bytes.
    public static func makeKey<G: RandomNumberGenerator>(using generator: inout G) -> String {
        Base64.encode((0..<16).map { _ in UInt8.random(in: 0...255, using: &generator) })
    }

    /// The client's request; `headers` are extra header lines (name, value), sent in order after the others.
    public static func clientRequest(
        host: String, path: String, key: String, protocols: [String] = [], origin: String? = nil,
        headers: [(name: String, value: String)] = []
    ) -> String {
        var lines = [
            "GET \(path) HTTP/1.1", "Host: \(host)", "Upgrade: websocket", "Connection: Upgrade",
            "Sec-WebSocket-Key: \(key)", "Sec-WebSocket-Version: 13",
        ]
        if !protocols.isEmpty { lines.append("Sec-WebSocket-Protocol: \(protocols.joined(separator: ", "))") }
        if let origin { lines.append("Origin: \(origin)") }
        lines += headers.map { "\($0.name): \($0.value)" }
        return lines.joined(separator: "\r\n") + "\r\n\r\n"
    }

    /// The server's 101 for a request with `key`: the chosen subprotocol and extension (permessage-deflate), if
    /// any, and extra header lines.
    public static func switchingProtocols(
        key: String, subprotocol: String? = nil, deflate: WebSocketDeflateAgreement? = nil,
        headers: [(name: String, value: String)] = []
    ) -> String {
        var lines = [
            "HTTP/1.1 101 Switching Protocols", "Upgrade: websocket", "Connection: Upgrade",
            "Sec-WebSocket-Accept: \(acceptValue(forKey: key))",
        ]
        if let subprotocol { lines.append("Sec-WebSocket-Protocol: \(subprotocol)") }
        if let deflate { lines.append("Sec-WebSocket-Extensions: \(deflate.responseHeader)") }
        lines += headers.map { "\($0.name): \($0.value)" }
        return lines.joined(separator: "\r\n") + "\r\n\r\n"
    }

    /// Whether `text` may go in a header line as a name (a token) or a value (no CR, LF or other control byte).
    public static func isValidHeader(name: String, value: String) -> Bool {
        let separators = Set("()<>@,;:\\\"/[]?={} \t".utf8)
        return !name.isEmpty && name.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7F && !separators.contains($0) }
            && value.utf8.allSatisfy { ($0 >= 0x20 && $0 != 0x7F) || $0 == 9 }
    }

    /// A parsed HTTP head (request or response).
    public struct Head: Sendable, Hashable {
        /// The first line's parts: method, target, version (request) or version, status, reason (response).
        public var startLine: [String]
        /// Header fields, names lowercased, in order.
        public var fields: [(name: String, value: String)]

        public func value(_ name: String) -> String? {
            fields.first { $0.name == name }?.value
        }

        /// Comma-separated tokens of a field, lowercased, across repeated fields.
        public func tokens(_ name: String) -> [String] {
            fields.filter { $0.name == name }.flatMap { $0.value.split(separator: ",") }.map {
                $0.trimmingSpaces().lowercased()
            }
        }

        public static func == (lhs: Head, rhs: Head) -> Bool {
            lhs.startLine == rhs.startLine && lhs.fields.map(\.name) == rhs.fields.map(\.name)
                && lhs.fields.map(\.value) == rhs.fields.map(\.value)
        }

        public func hash(into hasher: inout Hasher) {
            hasher.combine(startLine)
            for field in fields {
                hasher.combine(field.name)
                hasher.combine(field.value)
            }
        }
    }

    /// Finds the end of an HTTP head (CRLF CRLF) in `bytes`: the head's length including it, or `nil`.
    public static func headLength(in bytes: [UInt8]) -> Int? {
        guard bytes.count >= 4 else { return nil }
        for index in 3..<bytes.count
        where bytes[index] == 10 && bytes[index - 1] == 13 && bytes[index - 2] == 10 && bytes[index - 3] == 13 {
            return index + 1
        }
        return nil
    }

    /// The most header lines an opening handshake may carry; more is answered with 431.
    public static let maximumHeaderCount = 100

    /// Checks the start of an HTTP head while it is still arriving, so that garbage is refused at once instead
    /// of waiting for a CRLF CRLF that may never come: the start line must begin as a request's (`GET `) or a
    /// response's (`HTTP/1.1 `); no control byte but CR, LF and tab may appear; every complete header line
    /// needs a `name:`; lines are CRLF-ended; at most ``maximumHeaderCount`` header lines and `limit` bytes
    /// (both answered 431). Returns the reason to refuse, or `nil` while the bytes so far could still be a
    /// valid head.
    public static func checkPartialHead(_ bytes: [UInt8], request: Bool, limit: Int) -> Rejection? {
        let expected = Array((request ? "GET " : "HTTP/1.1 ").utf8)
        for index in 0..<min(expected.count, bytes.count) where bytes[index] != expected[index] {
            return Rejection(
                status: 400, reason: request ? "not an HTTP GET request" : "not an HTTP/1.1 response")
        }
        let end = headLength(in: bytes) ?? bytes.count
        if end > limit {
            return Rejection(status: 431, reason: "the handshake head is larger than \(limit) bytes")
        }
        var lineStart = 0
        var lines = 0
        for index in 0..<end {
            let byte = bytes[index]
            if byte < 0x20 && byte != 9 && byte != 10 && byte != 13 || byte == 0x7F {
                return Rejection(status: 400, reason: "a control byte (\(byte)) in the handshake head")
            }
            guard byte == 10 else { continue }
            guard index > 0, bytes[index - 1] == 13 else {
                return Rejection(status: 400, reason: "a handshake line not ended by CRLF")
            }
            let line = bytes[lineStart..<(index - 1)]
            if lines > 0 && !line.isEmpty {
                guard let colon = line.firstIndex(of: UInt8(ascii: ":")), colon > line.startIndex,
                    !line[..<colon].contains(where: { $0 == 32 || $0 == 9 })
                else {
                    return Rejection(status: 400, reason: "a header line without a name and a colon")
                }
            }
            lines += 1
            if lines > maximumHeaderCount + 1 {
                return Rejection(status: 431, reason: "more than \(maximumHeaderCount) header lines")
            }
            lineStart = index + 1
        }
        return nil
    }

    /// Parses an HTTP head (without the final empty line needed; CRLF line ends).
    public static func parseHead(_ text: String) -> Head? {
        let lines = text.split(separator: "\r\n", omittingEmptySubsequences: true)
        guard let first = lines.first else { return nil }
        let startLine = first.split(separator: " ", maxSplits: 2).map(String.init)
        guard startLine.count >= 2 else { return nil }
        var fields: [(String, String)] = []
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { return nil }
            let name = line[..<colon].lowercased()
            guard !name.isEmpty, !name.contains(" ") else { return nil }
            fields.append((name, String(line[line.index(after: colon)...]).trimmingSpaces()))
        }
        return Head(startLine: startLine, fields: fields)
    }

    /// Why a server rejects a request: the reason and the HTTP status to answer with.
    public struct Rejection: Error, Sendable, Hashable, CustomStringConvertible {
        /// 400 Bad Request, 426 Upgrade Required for a wrong version, 431 for a head too large; a server's own
        /// refusal may use any 4xx or 5xx (404 for a path it does not serve, for example).
        public var status: Int
        public var reason: String

        /// The HTTP response to send before closing.
        public var response: String {
            let phrase =
                switch status {
                case 401: "Unauthorized"
                case 403: "Forbidden"
                case 404: "Not Found"
                case 426: "Upgrade Required"
                case 429: "Too Many Requests"
                case 431: "Request Header Fields Too Large"
                case 500: "Internal Server Error"
                case 503: "Service Unavailable"
                default: status >= 500 ? "Server Error" : "Bad Request"
                }
            var lines = [
                "HTTP/1.1 \(status) \(phrase)", "Content-Type: text/plain", "Content-Length: \(reason.utf8.count + 1)",
                "Connection: close",
            ]
            if status == 426 { lines.append("Sec-WebSocket-Version: 13") }
            return lines.joined(separator: "\r\n") + "\r\n\r\n" + reason + "\n"
        }

        public var description: String { "\(status): \(reason)" }

        /// A refusal with `status` and `reason`.
        public init(status: Int, reason: String) {
            self.status = status
            self.reason = reason
        }
    }

    /// What a server learns from a valid request.
    public struct Accepted: Sendable, Hashable {
        public var path: String
        public var host: String
        public var origin: String?
        /// The subprotocol chosen (the first of the client's that the server supports), if any.
        public var subprotocol: String?
        /// permessage-deflate as agreed (the first acceptable offer), if the server enables it and the client offered.
        public var deflate: WebSocketDeflateAgreement?
        /// The 101 response to send.
        public var response: String
        /// The client's Sec-WebSocket-Key.
        public var key: String
        /// The whole request head (every header, for the server's own checks).
        public var head: Head
    }

    /// Checks a client's request (RFC 6455 §4.2.1) and builds the 101 response; with `deflate`, agrees
    /// permessage-deflate when the client offers it (RFC 7692).
    public static func acceptRequest(
        _ text: String, supportedProtocols: [String] = [], deflate: WebSocketDeflateOptions? = nil
    ) -> Result<Accepted, Rejection> {
        guard let head = parseHead(text) else {
            return .failure(Rejection(status: 400, reason: "malformed HTTP request"))
        }
        guard head.startLine.count == 3, head.startLine[0] == "GET" else {
            return .failure(Rejection(status: 400, reason: "the opening handshake must be a GET request"))
        }
        guard head.startLine[2] == "HTTP/1.1" else {
            return .failure(Rejection(status: 400, reason: "HTTP/1.1 is required, not \(head.startLine[2])"))
        }
        guard let host = head.value("host"), !host.isEmpty else {
            return .failure(Rejection(status: 400, reason: "missing Host header"))
        }
        guard head.tokens("upgrade").contains("websocket") else {
            return .failure(Rejection(status: 400, reason: "missing 'Upgrade: websocket'"))
        }
        guard head.tokens("connection").contains("upgrade") else {
            return .failure(Rejection(status: 400, reason: "missing 'Connection: Upgrade'"))
        }
        guard head.value("sec-websocket-version") == "13" else {
            return .failure(Rejection(status: 426, reason: "Sec-WebSocket-Version must be 13"))
        }
        guard let key = head.value("sec-websocket-key"), let decoded = Base64.decode(key), decoded.count == 16 else {
            return .failure(Rejection(status: 400, reason: "Sec-WebSocket-Key must be 16 bytes in base64"))
        }
        let offered = head.tokens("sec-websocket-protocol")
        let chosen = offered.first { supportedProtocols.map { $0.lowercased() }.contains($0) }
        let agreed = deflate.flatMap {
            WebSocketDeflateAgreement.accept(
                offers: head.fields.filter { $0.name == "sec-websocket-extensions" }.map(\.value), options: $0)
        }
        return .success(
            Accepted(
                path: head.startLine[1], host: host, origin: head.value("origin"), subprotocol: chosen, deflate: agreed,
                response: switchingProtocols(key: key, subprotocol: chosen, deflate: agreed), key: key, head: head))
    }

    /// What a valid server response agreed.
    public struct Validated: Sendable, Hashable {
        /// The subprotocol the server chose, if any.
        public var subprotocol: String?
        /// permessage-deflate, if we offered it and the server agreed.
        public var deflate: WebSocketDeflateAgreement?
    }

    /// Checks a server's response to our request with `key` (RFC 6455 §4.1), and its extension against what we
    /// offered (`offeredDeflate`; RFC 7692).
    public static func validateResponse(
        _ text: String, key: String, offeredProtocols: [String] = [], offeredDeflate: WebSocketDeflateOptions? = nil
    )
        -> Result<Validated, WebSocketProtocolError>
    {
        func fail(_ reason: String) -> Result<Validated, WebSocketProtocolError> {
            .failure(WebSocketProtocolError(.protocolError, "handshake: \(reason)"))
        }
        guard let head = parseHead(text), head.startLine.count >= 2 else { return fail("malformed HTTP response") }
        guard head.startLine[1] == "101" else {
            return fail("the server answered \(head.startLine.dropFirst().joined(separator: " ")), not 101")
        }
        guard head.tokens("upgrade").contains("websocket") else { return fail("missing 'Upgrade: websocket'") }
        guard head.tokens("connection").contains("upgrade") else { return fail("missing 'Connection: Upgrade'") }
        guard head.value("sec-websocket-accept") == acceptValue(forKey: key) else {
            return fail("wrong or missing Sec-WebSocket-Accept")
        }
        let chosen = head.value("sec-websocket-protocol")
        if let chosen, !offeredProtocols.map({ $0.lowercased() }).contains(chosen.lowercased()) {
            return fail("the server chose subprotocol '\(chosen)', which was not offered")
        }
        let extensions = head.fields.filter { $0.name == "sec-websocket-extensions" }.map(\.value)
        var deflate: WebSocketDeflateAgreement?
        if let offeredDeflate {
            switch WebSocketDeflateAgreement.validate(response: extensions, offered: offeredDeflate) {
            case .success(let agreed): deflate = agreed
            case .failure(let error): return .failure(error)
            }
        } else if !extensions.isEmpty {
            return fail("the server chose an extension we did not offer")
        }
        return .success(Validated(subprotocol: chosen, deflate: deflate))
    }
}

extension StringProtocol {
    /// Without leading and trailing spaces and tabs. Slices the string once (building it from a doubly reversed
    /// sequence, as before, cost most of a handshake's parse time, found by fuzzing).
    func trimmingSpaces() -> String {
        guard let first = firstIndex(where: { $0 != " " && $0 != "\t" }),
            let last = lastIndex(where: { $0 != " " && $0 != "\t" })
        else { return "" }
        return String(self[first...last])
    }
}
