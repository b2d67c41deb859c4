import ConnectionTestKit
import POSIXSupport
import SocketStyles
import Testing

extension ConformanceCase {
    /// TLS over every backend's TCP.
    static let tls = all.filter { $0.transport == .tls }
}

/// Runs blocking work (reading a child process's output) on a thread of its own, off the cooperative pool.
func onThread<R: Sendable>(_ body: @escaping @Sendable () throws -> R) async throws -> R {
    try await withCheckedThrowingContinuation { continuation in
        PosixThread.spawn(name: "blocking") { continuation.resume(with: Result { try body() }) }
    }
}

/// TLS failure cases: each gives its documented error, and the server keeps serving.
@Suite("TLS", .timeLimit(.minutes(20)))
struct TLSTests {
    static let certificates = ConformanceCase.certificates

    /// Starts a TLS echo server presenting `pair`, runs `body` with it, stops it.
    func withServer(
        _ test: ConformanceCase, presenting pair: TestCertificates.Pair? = nil,
        _ body: (EchoServer) async throws -> Void
    ) async throws {
        let server = try await EchoServer.start(
            test.backend, on: test.anyPort, tls: (pair ?? Self.certificates.server).server)
        do {
            try await body(server)
        } catch {
            await server.stop()
            throw error
        }
        await server.stop()
    }

    func connect(
        _ test: ConformanceCase, to endpoint: Endpoint, _ configure: (inout TLSConfiguration) -> Void = { _ in }
    ) async throws(ConnectionError) -> any Connection {
        var tls = Self.certificates.client
        configure(&tls)
        return try await test.backend.connect(to: endpoint, tls: tls)
    }

    func expectEcho(_ client: any Connection) async throws {
        try await client.send(Array("hello".utf8))
        #expect(try await client.receive(exactly: 5) == Array("hello".utf8))
    }

    @Test(
        "A small record read with a large limit is held in an array of its size; large records arrive whole, within the limit",
        arguments: ConformanceCase.tls)
    func readSizes(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let (listener, client, server) = try await test.connectedPair(sending: pattern(64))
            // receive() asks for the read chunk size (64 KiB); the array must not be made at that size.
            let small = try #require(try await server.receive())
            #expect(small.bytes == pattern(64))
            #expect(small.bytes.capacity < 4096, "a 64-byte message held \(small.bytes.capacity) bytes")
            let large = pattern(100_000, seed: 7)
            try await client.send(large)
            let first = try #require(try await server.receive(maximumLength: 3000))
            #expect(first.bytes.count <= 3000 && first.bytes == Array(large[..<first.bytes.count]))
            let rest = try await server.receive(exactly: large.count - first.bytes.count)
            #expect(first.bytes + rest == large)
            await closeBoth(client, server)
            await listener.close()
        }
    }

    @Test("A missing certificate, key or CA file is named in the error, with the reason")
    func missingFiles() async throws {
        try await SocketTest.run {
            let endpoint = try Endpoint(url: "tls://127.0.0.1:0")
            let server = TLSConfiguration.server(
                certificateChainFile: "/nonexistent/cert.pem", privateKeyFile: "/nonexistent/key.pem")
            let error = await expectConnectionError(.tls) { () throws(ConnectionError) in
                _ = try await Backend.bsd.listen(on: endpoint, tls: server)
            }
            #expect(
                error?.detail == "cannot read the certificate chain /nonexistent/cert.pem: No such file or directory")
            let listener = try await Backend.bsd.listen(on: ConformanceCase(backend: .bsd, transport: .tcp).anyPort)
            var client = TLSConfiguration()
            client.trustRoots = .file("/nonexistent/ca.pem")
            let caError = await expectConnectionError(.tls) { () throws(ConnectionError) in
                _ = try await Backend.bsd.connect(to: listener.localEndpoint.with(transport: .tls), tls: client)
            }
            #expect(caError?.detail.contains("cannot read the CA file /nonexistent/ca.pem") == true)
            await listener.close()
        }
    }

    @Test("Verified by default: the system trust store does not know the test CA", arguments: ConformanceCase.tls)
    func secureByDefault(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            try await withServer(test) { server in
                let error = await expectConnectionError(.certificateRejected) { () throws(ConnectionError) in
                    try await test.backend.connect(to: server.endpoint)  // TLSConfiguration() defaults
                }
                #expect(error?.systemCode?.domain == "x509")
                // The same server, trusted through its CA, works: the rejection was the client's choice.
                let client = try await connect(test, to: server.endpoint)
                try await expectEcho(client)
                #expect((client as? TLSConnection)?.negotiatedVersion == "TLSv1.3")
                await client.close()
            }
        }
    }

    @Test("A self-signed certificate is untrusted; --insecure accepts it", arguments: ConformanceCase.tls)
    func untrusted(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            try await withServer(test, presenting: Self.certificates.selfSigned) { server in
                let error = await expectConnectionError(.certificateRejected) { () throws(ConnectionError) in
                    try await connect(test, to: server.endpoint)
                }
                #expect(
                    error?.systemCode?.name == "X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT", "\(String(describing: error))")
                let insecure = try await connect(test, to: server.endpoint) {
                    $0.verification = .insecureNoVerification
                }
                try await expectEcho(insecure)
                await insecure.close()
            }
        }
    }

    @Test("An expired certificate is rejected", arguments: ConformanceCase.tls)
    func expired(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            try await withServer(test, presenting: Self.certificates.expired) { server in
                let error = await expectConnectionError(.certificateRejected) { () throws(ConnectionError) in
                    try await connect(test, to: server.endpoint)
                }
                #expect(error?.systemCode?.name == "X509_V_ERR_CERT_HAS_EXPIRED", "\(String(describing: error))")
            }
        }
    }

    @Test("A certificate for another host is rejected, by name and by address", arguments: ConformanceCase.tls)
    func wrongHost(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            try await withServer(test, presenting: Self.certificates.wrongHost) { server in
                let byAddress = await expectConnectionError(.certificateRejected) { () throws(ConnectionError) in
                    try await connect(test, to: server.endpoint)
                }
                #expect(
                    byAddress?.systemCode?.name == "X509_V_ERR_IP_ADDRESS_MISMATCH", "\(String(describing: byAddress))")
                let named = try Endpoint(url: "tls://localhost:\(server.endpoint.port)")
                let byName = await expectConnectionError(.certificateRejected) { () throws(ConnectionError) in
                    try await connect(test, to: named)
                }
                #expect(byName?.systemCode?.name == "X509_V_ERR_HOSTNAME_MISMATCH", "\(String(describing: byName))")
                // The chain itself is good: skipping only the name check connects.
                let unnamed = try await connect(test, to: named) { $0.verification = .skipHostnameCheck }
                try await expectEcho(unnamed)
                await unnamed.close()
                // serverName overrides the URL's host for SNI and the check.
                let overridden = try await connect(test, to: named) { $0.serverName = "wrong.example" }
                try await expectEcho(overridden)
                await overridden.close()
            }
        }
    }

    @Test(
        "A peer that does not speak TLS: a clear error, and the TLS server keeps serving",
        arguments: ConformanceCase.tls)
    func notTLS(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            // Client side: a plain TCP echo server sends our ClientHello back.
            let plain = try await EchoServer.start(test.backend, on: try Endpoint(url: "tcp://127.0.0.1:0"))
            await expectConnectionError(.tls) { () throws(ConnectionError) in
                try await connect(test, to: plain.endpoint.with(transport: .tls))
            }
            await plain.stop()
            // A server that says nothing: the handshake times out.
            let silent = try await test.backend.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            await expectConnectionError(.timedOut) { () throws(ConnectionError) in
                try await connect(test, to: silent.localEndpoint.with(transport: .tls)) {
                    $0.handshakeTimeout = .milliseconds(300)
                }
            }
            if let accepted = try? await silent.accept() { await accepted.close() }
            await silent.close()
            // Server side: plain HTTP to a TLS listener is rejected; the next client is served.
            try await withServer(test) { server in
                let tcp = try await test.backend.connect(to: server.endpoint.with(transport: .tcp))
                try await tcp.send(Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n".utf8))
                // The server answers with an alert or nothing, then closes.
                while (try? await tcp.receive()) != nil {}
                await tcp.close()
                let client = try await connect(test, to: server.endpoint)
                try await expectEcho(client)
                await client.close()
                let listener = try #require(server.listener as? UpgradingListener)
                #expect(listener.rejectedHandshakes == 1)
                #expect(listener.lastRejection?.kind == .tls, "\(String(describing: listener.lastRejection))")
            }
        }
    }

    @Test("A TCP end without close_notify is reported as truncation, unless allowed", arguments: ConformanceCase.tls)
    func truncation(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            for allowed in [false, true] {
                var serverTLS = Self.certificates.server.server
                serverTLS.allowsTruncation = allowed
                let listener = try await test.backend.listen(on: test.anyPort, tls: serverTLS)
                let tcp = try await test.backend.connect(to: listener.localEndpoint.with(transport: .tcp))
                let client = try await TLSConnection.client(
                    over: tcp, endpoint: listener.localEndpoint, configuration: Self.certificates.client)
                let server = try await listener.accept()
                try await client.send([1, 2, 3])
                #expect(try await server.receive(exactly: 3) == [1, 2, 3])
                // Read the reply, and with it the TLS 1.3 session tickets that came before it: a socket closed
                // with unread bytes sends a reset, not the FIN this test is about.
                try await server.send([4])
                #expect(try await client.receive(exactly: 1) == [4])
                await tcp.close()  // under the TLS layer: FIN without close_notify
                if allowed {
                    #expect(try await server.receive() == nil)
                } else {
                    let error = await expectConnectionError(.tls) { () throws(ConnectionError) in
                        try await server.receive()
                    }
                    #expect(error?.detail.contains("close_notify") == true)
                }
                await client.close()
                await server.close()
                await listener.close()
            }
        }
    }

    @Test("A server without a certificate, or with a missing file, fails at listen with a clear error")
    func serverNeedsCertificate() async throws {
        try await SocketTest.run {
            let endpoint = try Endpoint(url: "tls://127.0.0.1:0")
            let missing = await expectConnectionError(.tls) { () throws(ConnectionError) in
                try await Backend.bsd.listen(on: endpoint)
            }
            #expect(missing?.detail.contains("certificate") == true)
            let badFile = await expectConnectionError(.tls) { () throws(ConnectionError) in
                try await Backend.bsd.listen(
                    on: endpoint,
                    tls: .server(certificateChainFile: "/nonexistent/cert.pem", privateKeyFile: "/nonexistent/key.pem"))
            }
            #expect(badFile?.detail.contains("/nonexistent/cert.pem") == true)
            let mismatched = await expectConnectionError(.tls) { () throws(ConnectionError) in
                try await Backend.bsd.listen(
                    on: endpoint,
                    tls: .server(
                        certificateChainFile: Self.certificates.server.certificate,
                        privateKeyFile: Self.certificates.selfSigned.key))
            }
            #expect(mismatched?.detail.contains(Self.certificates.selfSigned.key) == true)
        }
    }
}

/// Interop with OpenSSL's own command-line peers: `openssl s_server` and `openssl s_client`.
@Suite("TLS interop with openssl s_server / s_client", .timeLimit(.minutes(20)))
struct TLSOpenSSLInteropTests {
    static let openssl = "/usr/bin/openssl"

    @Test(
        "Our client against openssl s_server (-rev: it sends each line back reversed)",
        arguments: ConformanceCase.tls.filter(\.usesSockets))
    func ourClient(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let certificates = ConformanceCase.certificates
            let server = try ChildProcess([
                Self.openssl, "s_server", "-accept", "127.0.0.1:0", "-cert", certificates.server.certificate, "-key",
                certificates.server.key, "-rev", "-naccept", "1", "-tls1_2",
            ])
            defer {
                server.terminate()
                _ = try? server.wait()
            }
            var line = ""
            while !line.hasPrefix("ACCEPT") {
                line = try await onThread { server.readLine() }
                try #require(!line.isEmpty, "s_server did not start")
            }
            let port = try #require(line.split(separator: ":").last.flatMap { UInt16($0) })
            let client = try await test.backend.connect(
                to: try Endpoint(url: "tls://localhost:\(port)"), tls: certificates.client)
            #expect((client as? TLSConnection)?.negotiatedVersion == "TLSv1.2")
            try await client.send(Array("socket styles\n".utf8))
            var reply: [UInt8] = []
            while !reply.contains(UInt8(ascii: "\n")) {
                reply += try #require(try await client.receive()).bytes
            }
            #expect(String(decoding: reply, as: UTF8.self) == "selyts tekcos\n")
            await client.close()
            // A client that requires TLS 1.3 refuses a TLS 1.2-only server.
        }
    }

    @Test("openssl s_client against our server: verified, echoed", arguments: ConformanceCase.tls.filter(\.usesSockets))
    func ourServer(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let certificates = ConformanceCase.certificates
            let server = try await EchoServer.start(test.backend, on: test.anyPort, tls: certificates.server.server)
            let client = try ChildProcess([
                Self.openssl, "s_client", "-connect", "127.0.0.1:\(server.endpoint.port)", "-CAfile",
                certificates.caFile,
                "-verify_return_error", "-verify_hostname", "localhost", "-servername", "localhost", "-no_ign_eof",
            ])
            try client.write("interop line\n")
            var output: [String] = []
            while output.last != "interop line" {
                let line = try await onThread { client.readLine() }
                try #require(!line.isEmpty || output.count < 200, "s_client: \(output.joined(separator: "\n"))")
                output.append(line)
            }
            client.closeInput()
            let rest = try await onThread { client.readToEnd() }
            let status = try await onThread { try client.wait() }
            let all = output.joined(separator: "\n") + rest
            #expect(status == 0, "\(all)")
            #expect(all.contains("Verify return code: 0 (ok)"), "\(all)")
            #expect(all.contains("TLSv1.3"), "\(all)")
            await server.stop()
        }
    }

    @Test("TLS 1.2 minimum: a TLS 1.1 client is refused; minimumVersion .tls13 refuses a TLS 1.2 server")
    func versions() async throws {
        try await SocketTest.run {
            let certificates = ConformanceCase.certificates
            let server = try await EchoServer.start(
                .async, on: try Endpoint(url: "tls://127.0.0.1:0"), tls: certificates.server.server)
            let (status, output) = try await onThread {
                try ChildProcess.run([
                    Self.openssl, "s_client", "-connect", "127.0.0.1:\(server.endpoint.port)", "-tls1_1", "-CAfile",
                    certificates.caFile,
                ])
            }
            #expect(status != 0, "\(output)")
            #expect(output.contains("alert protocol version"), "\(output)")
            await server.stop()

            let old = try ChildProcess([
                Self.openssl, "s_server", "-accept", "127.0.0.1:0", "-cert", certificates.server.certificate, "-key",
                certificates.server.key, "-naccept", "1", "-tls1_2",
            ])
            defer {
                old.terminate()
                _ = try? old.wait()
            }
            var line = ""
            while !line.hasPrefix("ACCEPT") {
                line = try await onThread { old.readLine() }
                try #require(!line.isEmpty, "s_server did not start")
            }
            let port = try #require(line.split(separator: ":").last.flatMap { UInt16($0) })
            var modern = certificates.client
            modern.minimumVersion = .tls13
            await expectConnectionError(.tls) { () throws(ConnectionError) in
                try await Backend.async.connect(to: try! Endpoint(url: "tls://127.0.0.1:\(port)"), tls: modern)
            }
        }
    }
}
