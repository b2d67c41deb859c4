import BenchmarkDriver
import ConnectionTestKit
import Histogram
import POSIXSupport
import SocketStyles

extension Lesson {
    /// What it costs to start talking.
    static let handshake = Lesson(
        name: "handshake",
        summary: "the cost of starting to talk: TCP's 3-way handshake, UDP's none, TLS, the WebSocket upgrade, measured"
    ) { backend, print in
        let out = LessonOutput("handshake", print)
        let rounds = 200
        out.say(
            "First the protocols alone: \(rounds) blocking socket()+connect() calls each way, on a thread of our own.")
        let native = await nativeConnectCosts(rounds: rounds)
        out.say(
            "  TCP socket+connect: p50 \(microseconds(native.tcp.p50)) us (the SYN, SYN-ACK, ACK round trip is inside)")
        out.say(
            "  UDP socket+connect: p50 \(microseconds(native.udp.p50)) us (nothing is sent: the kernel notes the peer)")
        out.figure("native.tcp.connect.p50us", Double(native.tcp.p50) / 1000)
        out.figure("native.udp.connect.p50us", Double(native.udp.p50) / 1000)
        out.say()
        out.say(
            "Then through the \(backend) backend's Connection (its own set-up cost included), timing the first reply:")
        // TLS needs a certificate: a throwaway CA and server certificate, made now and deleted at the end.
        let certificates: TestCertificates?
        do {
            certificates = try TestCertificates.make()
        } catch {
            certificates = nil
            out.say("(TLS and WSS skipped: \(error))")
        }
        defer { certificates?.remove() }
        var transports: [Transport] = [.tcp, .udp, .ws]
        if certificates != nil { transports += [.tls, .wss] }
        var tlsDetails = ""
        for transport in transports {
            let server = try await EchoServer.start(
                backend, on: loopback(transport), tls: transport.isSecure ? certificates?.server.server : nil)
            let tls = certificates?.client ?? TLSConfiguration()
            var connectHistogram = LatencySummary.makeHistogram()
            var firstReplyHistogram = LatencySummary.makeHistogram()
            for _ in 0..<rounds {
                let start = MonotonicClock.nanoseconds()
                let connection = try await backend.connect(to: server.endpoint, tls: tls)
                let connected = MonotonicClock.nanoseconds()
                if let secure = connection as? TLSConnection {
                    tlsDetails = "\(secure.negotiatedVersion), \(secure.cipherSuite), \(TLSLibrary.version)"
                }
                try await connection.send([1])
                _ = try await connection.receive()
                let replied = MonotonicClock.nanoseconds()
                _ = connectHistogram.record(max(1, connected - start))
                _ = firstReplyHistogram.record(max(1, replied - start))
                await connection.close()
            }
            await server.stop()
            let connect = LatencySummary(connectHistogram)
            let first = LatencySummary(firstReplyHistogram)
            out.say(
                "\(transport.rawValue.uppercased()): connect() took p50 \(microseconds(connect.p50)) us; "
                    + "first byte back after p50 \(microseconds(first.p50)) us (p99 \(microseconds(first.p99)) us).")
            out.figure("\(transport).connect.p50us", Double(connect.p50) / 1000)
            out.figure("\(transport).firstReply.p50us", Double(first.p50) / 1000)
        }
        out.say()
        out.say("Why: a TCP connect() waits for the 3-way handshake (SYN, SYN-ACK, ACK): one round trip before the")
        out.say("first byte can go. A UDP \"connect\" only records the peer's address in the kernel; nothing is")
        out.say("sent, so it costs a system call and the first datagram is the first packet. On loopback the round")
        out.say("trip is microseconds; across a network it is the network's latency, paid on every new connection.")
        out.say("WebSocket adds an HTTP upgrade on top of TCP's handshake: one more round trip (GET with Upgrade,")
        out.say("101 Switching Protocols) before the first message. TLS adds its own handshake after TCP's: with")
        out.say("TLS 1.3 one more round trip (ClientHello with a key share; ServerHello, certificate, Finished),")
        out.say("but on loopback the round trips are cheap and the cost is arithmetic: an X25519 key exchange on")
        out.say("each side, the server signing and the client checking the certificate chain and its name. WSS")
        out.say("pays TCP, then TLS, then the HTTP upgrade inside TLS: three steps before the first message.")
        if !tlsDetails.isEmpty {
            out.say("(TLS here: \(tlsDetails); full certificate verification against a test CA.)")
        }
        // The picture: one more connection per transport, recorded (not timed above: recording costs a little).
        var phases: [Transport: Int] = [:]
        for transport in transports {
            let phase = out.trace.phase("\(transport.rawValue.uppercased()): connect, 1 byte, its echo", transport)
            phases[transport] = phase
            let server = try await EchoServerHandle.start(
                backend, transport, tls: transport.isSecure ? certificates?.server.server : nil,
                traced: (out.trace, phase))
            out.trace.mark(phase, .client, "connect()")
            let connection = out.trace.trace(
                try await backend.connect(to: server.endpoint, tls: certificates?.client ?? TLSConfiguration()),
                side: .client, phase: phase)
            out.trace.mark(phase, .client, "connected")
            try await connection.send([1])
            _ = try await connection.receive()
            await connection.close()
            await server.stop()
        }
        for (index, line) in handshakeVerdict(out.report.figures).enumerated() {
            // The first line is TCP against UDP; the others each name a layer.
            let shown: Transport = index == 0 ? .tcp : [Transport.ws, .tls, .wss][min(2, index - 1)]
            out.say(line, pointingAt: phases[shown])
        }
        return out.report
    }
}

/// What this run of the handshake lesson showed against its explanation: one line per step (TCP's handshake
/// against UDP's none, then each layer's extra cost to the first reply), saying plainly when a step did not
/// cost more than the one under it.
func handshakeVerdict(_ figures: [String: Double]) -> [String] {
    var lines: [String] = []
    if let tcp = figures["native.tcp.connect.p50us"], let udp = figures["native.udp.connect.p50us"] {
        lines.append(
            tcp > udp
                ? "Here TCP's connect took \(fixed(tcp / max(udp, 0.001), 1))x as long as UDP's: the handshake's round trip showed."
                : "Here TCP's connect was not slower than UDP's (\(fixed(tcp, 1)) vs \(fixed(udp, 1)) us): on loopback the round trip is so short that system-call costs decide."
        )
    }
    let steps: [(upper: String, lower: String, what: String)] = [
        ("ws", "tcp", "the WebSocket upgrade"), ("tls", "tcp", "the TLS handshake"),
        ("wss", "tls", "the upgrade inside TLS"),
    ]
    for step in steps {
        guard let upper = figures["\(step.upper).firstReply.p50us"],
            let lower = figures["\(step.lower).firstReply.p50us"]
        else { continue }
        let name = "\(step.upper.uppercased()) over \(step.lower.uppercased())"
        lines.append(
            upper > lower
                ? "Here \(step.what) added \(fixed(upper - lower, 1)) us to the first reply (\(name))."
                : "Here \(step.what) did not show (\(name): \(fixed(upper, 1)) vs \(fixed(lower, 1)) us): its round trip is within the noise of these connections."
        )
    }
    return lines
}

/// Blocking socket()+connect() for TCP (to a listener of our own) and UDP, timed on a thread of our own.
func nativeConnectCosts(rounds: Int) async -> (tcp: LatencySummary, udp: LatencySummary) {
    await withCheckedContinuation { continuation in
        PosixThread.spawn(name: "handshake") {
            var tcp = LatencySummary.makeHistogram()
            var udp = LatencySummary.makeHistogram()
            if let listener = try? BSDSocket.listen(
                on: loopback(.tcp), options: .with { $0.backlog = Int32(rounds) * 2 }),
                let address = try? listener.localAddress
            {
                for _ in 0..<rounds {
                    let start = MonotonicClock.nanoseconds()
                    if let socket = try? Syscall.socket(family: .ipv4, datagram: false) {
                        _ = socket.ifOpen { try? Syscall.connect($0, to: address) }
                        _ = tcp.record(max(1, MonotonicClock.nanoseconds() - start))
                        socket.close()
                    }
                    if let accepted = try? listener.accept() { accepted.close() }
                }
                listener.close()
            }
            let target = SocketAddress.loopbackIPv4(port: 9)
            for _ in 0..<rounds {
                let start = MonotonicClock.nanoseconds()
                if let socket = try? Syscall.socket(family: .ipv4, datagram: true) {
                    _ = socket.ifOpen { try? Syscall.connect($0, to: target) }
                    _ = udp.record(max(1, MonotonicClock.nanoseconds() - start))
                    socket.close()
                }
            }
            continuation.resume(returning: (LatencySummary(tcp), LatencySummary(udp)))
        }
    }
}

/// An echo server for lessons: ConnectionTestKit's, whose stop() returns once every connection is closed; with
/// `traced`, every connection it accepts is recorded as the server's in that phase.
enum EchoServerHandle {
    static func start(
        _ backend: Backend, _ transport: Transport, options: ConnectionOptions = ConnectionOptions(),
        tls: TLSConfiguration? = nil, traced: (LessonTrace, Int)? = nil,
        number: (@Sendable ([UInt8]) -> Int?)? = nil
    )
        async throws -> EchoServer
    {
        let listener = try await backend.listen(on: loopback(transport), options: options, tls: tls)
        let server = EchoServer(listener: traced.map { $0.0.trace(listener, phase: $0.1, number: number) } ?? listener)
        server.begin()
        return server
    }
}
