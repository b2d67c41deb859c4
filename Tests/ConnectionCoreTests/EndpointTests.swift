import ConnectionCore
import Testing

@Suite("Endpoint parsing")
struct EndpointTests {
    @Test(
        "Valid URLs parse into their parts",
        arguments: [
            ("tcp://127.0.0.1:9000", Transport.tcp, Endpoint.Host.ipv4("127.0.0.1"), UInt16(9000), "/"),
            ("udp://[::1]:53", .udp, .ipv6("::1"), 53, "/"),
            ("ws://localhost:8080/echo", .ws, .name("localhost"), 8080, "/echo"),
            ("wss://Example.TEST/chat?room=1", .wss, .name("example.test"), 443, "/chat?room=1"),
            ("ws://[fe80::1%eth0]", .ws, .ipv6("fe80::1%eth0"), 80, "/"),
            ("tls://10.0.0.1:0", .tls, .ipv4("10.0.0.1"), 0, "/"),
            ("TCP://host-name.local.:65535", .tcp, .name("host-name.local."), 65535, "/"),
        ])
    func parses(url: String, transport: Transport, host: Endpoint.Host, port: UInt16, path: String) throws {
        let endpoint = try Endpoint(url: url)
        #expect(endpoint.transport == transport)
        #expect(endpoint.host == host)
        #expect(endpoint.port == port)
        #expect(endpoint.path == path)
        // The description parses back to the same endpoint.
        #expect(try Endpoint(url: endpoint.description) == endpoint)
    }

    @Test(
        "Invalid URLs are rejected with the reason",
        arguments: [
            ("127.0.0.1:9000", "missing scheme"),
            ("http://127.0.0.1:80", "unknown scheme 'http'"),
            ("tcp://127.0.0.1", "missing port"),
            ("udp://127.0.0.1:65536", "port '65536'"),
            ("tcp://127.0.0.1:-1", "port '-1'"),
            ("tcp://127.0.0.1:", "port ''"),
            ("tcp://:80", "empty host"),
            ("tcp://[::1:80", "unclosed '['"),
            ("tcp://::1:80", "in brackets"),
            ("tcp://[nothex]:80", "not an IPv6 address"),
            ("tcp://bad host:80", "not a valid host name"),
            ("tcp://-bad.example:80", "not a valid host name"),
            ("tcp://127.0.0.1:80/path", "only meaningful for ws"),
            ("tcp://user@host:80", "user information"),
        ])
    func rejects(url: String, reason: String) {
        #expect {
            try Endpoint(url: url)
        } throws: { error in
            guard let error = error as? ConnectionError else { return false }
            return error.kind == .invalidEndpoint && error.detail.contains(reason)
        }
    }

    @Test("999.1.1.1 is not taken for an IPv4 address")
    func notIPv4() throws {
        #expect(try Endpoint(url: "tcp://999.1.1.1:1").host == .name("999.1.1.1"))
    }

    @Test("Transports know their nature")
    func transports() {
        #expect(Transport.tcp.isByteStream && Transport.tls.isByteStream)
        #expect(!Transport.udp.isByteStream && Transport.udp.keepsMessageBoundaries)
        #expect(Transport.ws.keepsMessageBoundaries && Transport.ws.runsOverTCP && !Transport.udp.runsOverTCP)
        #expect(Transport.wss.isSecure && !Transport.ws.isSecure)
    }
}

@Suite("ConnectionError")
struct ConnectionErrorTests {
    @Test("Describes kind, detail and raw code on one line")
    func description() {
        let error = ConnectionError(
            .refused, "connect to tcp://127.0.0.1:9",
            systemCode: .init(domain: "errno", code: 111, name: "ECONNREFUSED"))
        #expect(error.description == "connection refused: connect to tcp://127.0.0.1:9 [ECONNREFUSED (errno 111)]")
        #expect(!error.description.contains("\n"))
    }

    @Test("Maps Swift's CancellationError to .cancelled")
    func cancellation() {
        #expect(ConnectionError.from(CancellationError()).kind == .cancelled)
        #expect(ConnectionError.from(ConnectionError(.reset)).kind == .reset)
    }
}
