public import ConnectionCore
import WebSocketCodec

/// The opening handshakes (RFC 6455 section 4): the client's request and the server's answer, each bounded by
/// `WebSocketOptions.handshakeTimeout` and `maximumHandshakeSize`, and garbage refused as it arrives.
extension WebSocketConnection {
    /// Performs the client handshake on a connected TCP connection.
    public static func client(
        over tcp: any Connection, endpoint: Endpoint, options: WebSocketOptions = WebSocketOptions()
    )
        async throws(ConnectionError) -> WebSocketConnection
    {
        var generator = SystemRandomNumberGenerator()
        let key = WebSocketHandshake.makeKey(using: &generator)
        let host =
            endpoint.port == endpoint.transport.defaultPort ? "\(endpoint.host)" : "\(endpoint.host):\(endpoint.port)"
        for header in options.headers where !WebSocketHandshake.isValidHeader(name: header.name, value: header.value) {
            throw ConnectionError(.unsupported, "'\(header.name): \(header.value)' cannot be sent as a header line")
        }
        let extensions = options.deflate.map { [("Sec-WebSocket-Extensions", $0.offer)] } ?? []
        let request = WebSocketHandshake.clientRequest(
            host: host, path: endpoint.path, key: key, protocols: options.subprotocols, origin: options.origin,
            headers: extensions + options.headers.map { ($0.name, $0.value) })
        let (head, leftover) = try await withDeadline(
            options.handshakeTimeout, on: options.clock, closing: tcp,
            "the WebSocket opening handshake with \(endpoint)"
        ) { () throws(ConnectionError) in
            try await tcp.send(Array(request.utf8))
            switch try await readHead(tcp, request: false, limit: options.maximumHandshakeSize) {
            case .success(let head): return head
            case .failure(let rejection):
                throw ConnectionError(
                    .protocolViolation, "the server's handshake answer is not HTTP: \(rejection.reason)",
                    systemCode: .init(domain: "websocket", code: 1002, name: "handshake"))
            }
        }
        switch WebSocketHandshake.validateResponse(
            head, key: key, offeredProtocols: options.subprotocols, offeredDeflate: options.deflate)
        {
        case .success(let agreed):
            let link = WebSocketFrameLink(
                over: tcp, role: .client, maximumFrameSize: options.maximumFrameSize,
                allowsCompressedFrames: agreed.deflate != nil, leftover: leftover)
            return WebSocketConnection(
                tcp: tcp, link: link, role: .client, endpoint: endpoint, subprotocol: agreed.subprotocol,
                options: options, deflate: agreed.deflate)
        case .failure(let error):
            throw ConnectionError(
                .protocolViolation, error.reason, systemCode: .init(domain: "websocket", code: 1002, name: "handshake"))
        }
    }

    /// Performs the server handshake on an accepted TCP connection. A bad request is answered with 400 or 426
    /// and the reason, and thrown as `.protocolViolation`; the caller closes the TCP connection. `decide` sees a
    /// valid request and accepts it (choosing a subprotocol and extra response headers) or refuses it with a
    /// status of its choice (also thrown as `.protocolViolation`, its system code the HTTP status).
    public static func server(
        over tcp: any Connection, transport: Transport = .ws, options: WebSocketOptions = WebSocketOptions(),
        decide: (@Sendable (WebSocketRequest) async -> WebSocketDecision)? = nil
    )
        async throws(ConnectionError) -> WebSocketConnection
    {
        let read = try await withDeadline(
            options.handshakeTimeout, on: options.clock, closing: tcp,
            "the WebSocket opening handshake from \(tcp.remoteEndpoint)"
        ) { () throws(ConnectionError) in
            try await readHead(tcp, request: true, limit: options.maximumHandshakeSize)
        }
        var leftover: [UInt8] = []
        var verdict: Result<WebSocketHandshake.Accepted, WebSocketHandshake.Rejection>
        switch read {
        case .success(let (head, rest)):
            leftover = rest
            verdict = WebSocketHandshake.acceptRequest(
                head, supportedProtocols: options.subprotocols, deflate: options.deflate)
        case .failure(let rejection):
            verdict = .failure(rejection)
        }
        var request: WebSocketRequest?
        if case .success(var accepted) = verdict {
            let seen = WebSocketRequest(accepted, remote: tcp.remoteEndpoint.with(transport: transport))
            request = seen
            switch await decide?(seen) ?? .accept {
            case .refuse(let status, let reason):
                verdict = .failure(.init(status: (400...599).contains(status) ? status : 500, reason: reason))
            case .accept(let chosen, let headers):
                if let chosen, !seen.subprotocols.contains(chosen.lowercased()) {
                    verdict = .failure(.init(status: 500, reason: "the server chose a subprotocol not offered"))
                } else if let bad = headers.first(where: {
                    !WebSocketHandshake.isValidHeader(name: $0.name, value: $0.value)
                }) {
                    verdict = .failure(.init(status: 500, reason: "the server's header '\(bad.name)' is not valid"))
                } else {
                    if let chosen { accepted.subprotocol = chosen.lowercased() }
                    accepted.response = WebSocketHandshake.switchingProtocols(
                        key: accepted.key, subprotocol: accepted.subprotocol, deflate: accepted.deflate,
                        headers: headers.map { ($0.name, $0.value) })
                    verdict = .success(accepted)
                }
            }
        }
        switch verdict {
        case .success(let accepted):
            try await tcp.send(Array(accepted.response.utf8))
            let endpoint = tcp.localEndpoint.with(transport: transport)
            let link = WebSocketFrameLink(
                over: tcp, role: .server, maximumFrameSize: options.maximumFrameSize,
                allowsCompressedFrames: accepted.deflate != nil, leftover: leftover)
            return WebSocketConnection(
                tcp: tcp, link: link, role: .server,
                endpoint: Endpoint(
                    transport: transport, host: endpoint.host, port: endpoint.port, path: request?.path ?? "/"),
                subprotocol: accepted.subprotocol, options: options, deflate: accepted.deflate, request: request)
        case .failure(let rejection):
            try? await tcp.send(Array(rejection.response.utf8))
            throw ConnectionError(
                .protocolViolation, "WebSocket handshake rejected (\(rejection.status)): \(rejection.reason)",
                systemCode: .init(domain: "http", code: Int32(rejection.status), name: "HTTP \(rejection.status)"))
        }
    }

    /// Reads an HTTP head (up to CRLF CRLF): the head and the bytes read past it, or why the bytes so far can
    /// never be a valid head (checked as they arrive: garbage is refused without waiting for more).
    static func readHead(
        _ tcp: any Connection, request: Bool, limit: Int
    ) async throws(ConnectionError) -> Result<(String, [UInt8]), WebSocketHandshake.Rejection> {
        var bytes: [UInt8] = []
        while true {
            if let rejection = WebSocketHandshake.checkPartialHead(bytes, request: request, limit: limit) {
                return .failure(rejection)
            }
            if let length = WebSocketHandshake.headLength(in: bytes) {
                return .success((String(decoding: bytes[..<length], as: UTF8.self), Array(bytes[length...])))
            }
            guard let message = try await tcp.receive() else {
                throw ConnectionError(.protocolViolation, "the peer closed during the opening handshake")
            }
            bytes += message.bytes
        }
    }
}
