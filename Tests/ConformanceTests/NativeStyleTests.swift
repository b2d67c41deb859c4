import BenchmarkDriver
import ConnectionTestKit
import NativeStyles
import SocketStyles
import Testing

/// The native-style ping-pong and echo server of each backend (sockbench compare's `native-SIZE`): they must
/// move and check every byte, with both small probes and probes bigger than a socket buffer (partial reads and
/// writes), against their own server and against another style's.
@Suite("Native styles", .timeLimit(.minutes(20)))
struct NativeStyleTests {
    @Test("Every round trip is echoed, checked and sampled", arguments: Backend.allCases, [64, 300_000])
    func pingpong(_ backend: Backend, size: Int) async throws {
        try await SocketTest.run {
            let server = try await backend.nativeEchoServer(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let count = size > 1000 ? 20 : 300
            let result = try await backend.nativePingPong(
                to: server.localEndpoint, size: size, count: count, warmup: 10)
            #expect(result.latency.count == UInt64(count))
            #expect(result.latency.min > 0)
            #expect(result.roundTripsPerSecond > 0)
            await server.stop()
        }
    }

    @Test(
        "Native clients and servers interoperate (each client against the bsd server and the nio server)",
        arguments: Backend.allCases)
    func crossed(_ backend: Backend) async throws {
        try await SocketTest.run {
            for serverStyle in [Backend.bsd, .nio] {
                let server = try await serverStyle.nativeEchoServer(on: try Endpoint(url: "tcp://127.0.0.1:0"))
                let result = try await backend.nativePingPong(
                    to: server.localEndpoint, size: 1000, count: 50, warmup: 0)
                #expect(result.latency.count == 50)
                await server.stop()
            }
        }
    }

    @Test("A refused connection is an error, not a hang", arguments: Backend.allCases)
    func refused(_ backend: Backend) async throws {
        try await SocketTest.run {
            let refusing = try RefusingPort()
            defer { refusing.close() }
            let endpoint = try refusing.endpoint(.tcp)
            await #expect(throws: ConnectionError.self) {
                _ = try await backend.nativePingPong(to: endpoint, size: 64, count: 10, warmup: 0)
            }
        }
    }

    @Test("A server that echoes something else is caught", arguments: Backend.allCases)
    func wrongEcho(_ backend: Backend) async throws {
        try await SocketTest.run {
            // A sink answers nothing; a server that sends a fixed reply answers wrongly. Use the unified echo
            // server in sink mode plus one reply: the simplest wrong peer is a listener that sends garbage.
            let listener = try await Backend.async.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let peer = Task {
                let connection = try await listener.accept()
                _ = try await connection.receive()
                try await connection.send([UInt8](repeating: 0xEE, count: 64))
                _ = try? await connection.receive()
                await connection.close()
            }
            let error = await #expect(throws: ConnectionError.self) {
                _ = try await backend.nativePingPong(to: listener.localEndpoint, size: 64, count: 10, warmup: 0)
            }
            #expect(error?.kind == .protocolViolation)
            _ = try? await peer.value
            await listener.close()
        }
    }
}

/// SwiftNIO's async/await bridge (`NIOAsyncChannel`), compare's `asyncchannel-SIZE`: its client and server move
/// and check every byte, interoperate with the other styles' servers and clients, and fail cleanly.
@Suite("Native style: NIOAsyncChannel", .timeLimit(.minutes(20)))
struct NIOAsyncChannelNativeTests {
    @Test("Client and server: every round trip echoed, small and large", arguments: [64, 300_000])
    func ownServer(size: Int) async throws {
        try await SocketTest.run {
            let server = try await Backend.nio.asyncChannelEchoServer(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let count = size > 1000 ? 20 : 300
            let result = try await Backend.nio.asyncChannelPingPong(
                to: server.localEndpoint, size: size, count: count, warmup: 10)
            #expect(result.latency.count == UInt64(count))
            #expect(result.latency.min > 0)
            await server.stop()
        }
    }

    @Test("The client against the bsd style's server, and the bsd client against its server")
    func crossed() async throws {
        try await SocketTest.run {
            let bsdServer = try await Backend.bsd.nativeEchoServer(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let first = try await Backend.nio.asyncChannelPingPong(
                to: bsdServer.localEndpoint, size: 1000, count: 50, warmup: 0)
            #expect(first.latency.count == 50)
            await bsdServer.stop()
            let server = try await Backend.nio.asyncChannelEchoServer(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let second = try await Backend.bsd.nativePingPong(
                to: server.localEndpoint, size: 1000, count: 50, warmup: 0)
            #expect(second.latency.count == 50)
            await server.stop()
        }
    }

    @Test("A refused connection is an error; other backends and transports are refused with a reason")
    func errors() async throws {
        try await SocketTest.run {
            let refusing = try RefusingPort()
            defer { refusing.close() }
            let endpoint = try refusing.endpoint(.tcp)
            let refused = await #expect(throws: ConnectionError.self) {
                _ = try await Backend.nio.asyncChannelPingPong(to: endpoint, size: 64, count: 10, warmup: 0)
            }
            #expect(refused?.kind == .refused)
            let other = await #expect(throws: ConnectionError.self) {
                _ = try await Backend.async.asyncChannelPingPong(to: endpoint, size: 64, count: 10, warmup: 0)
            }
            #expect(other?.kind == .unsupported)
        }
    }
}

/// SwiftNIO's own WebSocket (NIOWebSocket), the nio backend's native style over ws: it must interoperate with
/// our WebSocket stack both ways, and its server must turn away plain HTTP and keep serving.
@Suite("Native style: NIOWebSocket", .timeLimit(.minutes(20)))
struct NIOWebSocketNativeTests {
    @Test("NIOWebSocket client and server: every round trip echoed, small and large", arguments: [64, 300_000])
    func ownServer(size: Int) async throws {
        try await SocketTest.run {
            let server = try await Backend.nio.nativeEchoServer(on: try Endpoint(url: "ws://127.0.0.1:0/echo"))
            #expect(server.localEndpoint.transport == .ws)
            #expect(server.localEndpoint.path == "/echo")
            let result = try await Backend.nio.nativePingPong(
                to: server.localEndpoint, size: size, count: 30, warmup: 5)
            #expect(result.latency.count == 30)
            await server.stop()
        }
    }

    @Test("NIOWebSocket client against our WebSocket server, and our client against the NIOWebSocket server")
    func interop() async throws {
        try await SocketTest.run {
            let ours = try await EchoServer.start(.async, on: try Endpoint(url: "ws://127.0.0.1:0"))
            let first = try await Backend.nio.nativePingPong(to: ours.endpoint, size: 1000, count: 50, warmup: 0)
            #expect(first.latency.count == 50)
            await ours.stop()

            let theirs = try await Backend.nio.nativeEchoServer(on: try Endpoint(url: "ws://127.0.0.1:0"))
            let connection = try await Backend.bsd.connect(to: theirs.localEndpoint)
            let second = try await PingRunner(size: 1000, count: 50, warmup: 0).run(on: connection)
            #expect(second.latency.count == 50)
            await connection.close()
            await theirs.stop()
        }
    }

    @Test("Plain HTTP to the NIOWebSocket server gets 400; the next WebSocket client is served")
    func plainHTTP() async throws {
        try await SocketTest.run {
            let server = try await Backend.nio.nativeEchoServer(on: try Endpoint(url: "ws://127.0.0.1:0"))
            let tcp = try await Backend.bsd.connect(
                to: Endpoint(transport: .tcp, host: server.localEndpoint.host, port: server.localEndpoint.port))
            try await tcp.send(Array("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".utf8))
            var answer: [UInt8] = []
            while let message = try await tcp.receive() { answer += message.bytes }
            #expect(String(decoding: answer, as: UTF8.self).hasPrefix("HTTP/1.1 400"))
            await tcp.close()
            let result = try await Backend.nio.nativePingPong(to: server.localEndpoint, size: 64, count: 10, warmup: 0)
            #expect(result.latency.count == 10)
            await server.stop()
        }
    }

    @Test(
        "Other backends have no WebSocket style of their own: a clear error",
        arguments: [Backend.bsd, .uv, .runloop, .async])
    func unsupported(_ backend: Backend) async throws {
        let error = await #expect(throws: ConnectionError.self) {
            _ = try await backend.nativeEchoServer(on: try Endpoint(url: "ws://127.0.0.1:0"))
        }
        #expect(error?.kind == .unsupported)
    }
}

/// swift-nio-ssl, the nio backend's native style over tls and wss: its client and server must interoperate with
/// our OpenSSL layer both ways, verify the server's certificate, and fail clearly without a trusted one.
@Suite("Native style: swift-nio-ssl", .timeLimit(.minutes(20)))
struct NIOSSLNativeTests {
    @Test("swift-nio-ssl client and server: every round trip echoed, small and large", arguments: ["tls", "wss"])
    func ownServer(scheme: String) async throws {
        try await SocketTest.run {
            let certificates = try TestCertificates.make()
            defer { certificates.remove() }
            let server = try await Backend.nio.nativeEchoServer(
                on: try Endpoint(url: "\(scheme)://127.0.0.1:0"), tls: certificates.server.server)
            #expect(server.localEndpoint.transport.rawValue == scheme)
            for size in [64, 300_000] {
                let result = try await Backend.nio.nativePingPong(
                    to: server.localEndpoint, size: size, count: 20, warmup: 2, tls: certificates.client)
                #expect(result.latency.count == 20)
            }
            await server.stop()
        }
    }

    @Test(
        "swift-nio-ssl client against our TLS server, and our client against the swift-nio-ssl server",
        arguments: ["tls", "wss"])
    func interop(scheme: String) async throws {
        try await SocketTest.run {
            let certificates = try TestCertificates.make()
            defer { certificates.remove() }
            let ours = try await EchoServer.start(
                .async, on: try Endpoint(url: "\(scheme)://127.0.0.1:0"), tls: certificates.server.server)
            let first = try await Backend.nio.nativePingPong(
                to: ours.endpoint, size: 1000, count: 50, warmup: 0, tls: certificates.client)
            #expect(first.latency.count == 50)
            await ours.stop()

            let theirs = try await Backend.nio.nativeEchoServer(
                on: try Endpoint(url: "\(scheme)://127.0.0.1:0"), tls: certificates.server.server)
            let connection = try await Backend.bsd.connect(to: theirs.localEndpoint, tls: certificates.client)
            let second = try await PingRunner(size: 1000, count: 50, warmup: 0).run(on: connection)
            #expect(second.latency.count == 50)
            await connection.close()
            await theirs.stop()
        }
    }

    @Test(
        "An untrusted certificate fails the swift-nio-ssl client (certificate rejected); the server serves the next client"
    )
    func untrusted() async throws {
        try await SocketTest.run {
            let certificates = try TestCertificates.make()
            defer { certificates.remove() }
            let server = try await Backend.nio.nativeEchoServer(
                on: try Endpoint(url: "tls://127.0.0.1:0"), tls: certificates.selfSigned.server)
            let error = await #expect(throws: ConnectionError.self) {
                _ = try await Backend.nio.nativePingPong(
                    to: server.localEndpoint, size: 64, count: 5, warmup: 0, tls: certificates.client)
            }
            #expect(error?.kind == .certificateRejected, "\(String(describing: error))")
            var insecure = certificates.client
            insecure.verification = .insecureNoVerification
            let result = try await Backend.nio.nativePingPong(
                to: server.localEndpoint, size: 64, count: 5, warmup: 0, tls: insecure)
            #expect(result.latency.count == 5)
            await server.stop()
        }
    }

    @Test("A tls server without a certificate, or another backend over tls: a clear error")
    func misconfigured() async throws {
        let missing = await #expect(throws: ConnectionError.self) {
            _ = try await Backend.nio.nativeEchoServer(on: try Endpoint(url: "tls://127.0.0.1:0"))
        }
        #expect(missing?.kind == .tls)
        let other = await #expect(throws: ConnectionError.self) {
            _ = try await Backend.bsd.nativeEchoServer(on: try Endpoint(url: "tls://127.0.0.1:0"))
        }
        #expect(other?.kind == .unsupported)
    }
}
