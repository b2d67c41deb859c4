import BenchmarkDriver
import ConnectionTestKit
import Foundation
import POSIXSupport
import SocketStyles

extension Lesson {
    /// A peer that goes silent without closing: what TCP alone reports, and what a keep-alive finds.
    static let deadPeer = Lesson(
        name: "deadpeer",
        summary:
            "a path that goes silent (a black hole): TCP alone reports nothing; WebSocket keep-alive notices within its deadline"
    ) { backend, print in
        let out = LessonOutput("deadpeer", print)
        out.say(
            "A relay (as `sockbench proxy --black-hole-after BYTES`) sits between client and echo server and, after")
        out.say("the first echo, forwards nothing more toward the client, while both connections stay open: a router")
        out.say("that died, a cable pulled, a laptop gone to sleep. \(backend) backend; no root needed.")
        out.say()

        // TCP: no error, no end, for as long as we care to wait.
        let tcpPhase = out.trace.phase("TCP through a black hole", .tcp)
        let tcpServer = try await EchoServerHandle.start(backend, .tcp, traced: (out.trace, tcpPhase))
        let tcpRelay = try await Relay.start(
            listen: loopback(.tcp), upstream: tcpServer.endpoint, backend: backend,
            toClient: .with { $0.blackHoleAfterBytes = 5 })
        let tcp = out.trace.trace(
            try await backend.connect(to: tcpRelay.endpoint), side: .client, phase: tcpPhase, kernel: .afterSends)
        try await tcp.send(Array("hello".utf8))
        _ = try await tcp.receive(exactly: 5)
        try await tcp.send(Array("still there?".utf8))
        let wait = Duration.seconds(3)
        let started = MonotonicClock.nanoseconds()
        let tcpOutcome: String
        do {
            switch try await withDeadline(wait, { try await tcp.receive() }) {
            case .none: tcpOutcome = "nothing: no data, no error, no end"
            case .some(.none): tcpOutcome = "an end of stream"
            case .some(.some): tcpOutcome = "data (unexpected)"
            }
        } catch {
            tcpOutcome = "an error: \(error)"
        }
        let tcpWaited = Double(MonotonicClock.nanoseconds() - started) / 1e9
        out.trace.mark(tcpPhase, .client, "gave up waiting: \(tcpOutcome.prefix(7))")
        // The client's kernel after the wait: nothing unacknowledged (the relay acknowledged the bytes), so TCP has
        // nothing to retransmit and no reason to suspect the path.
        out.trace.kernelView(of: tcp, tcpPhase, .client)
        out.say(
            "TCP: the first echo came back; after the black hole, a receive waited \(fixed(tcpWaited, 1)) s and got \(tcpOutcome). The connection still counts as open."
        )
        out.figure("tcp.silentSeconds", tcpWaited)
        out.figure("tcp.noticed", tcpOutcome.hasPrefix("nothing") ? 0 : 1)
        await tcp.close()
        await tcpRelay.stop()
        await tcpServer.stop()

        // WebSocket with keep-alive, through a byte relay under it (pings and pongs are bytes to it too). The
        // black hole starts after the bytes a clean run takes for the handshake and one echo.
        let interval = Duration.milliseconds(500)
        let deadline = Duration.seconds(1)
        let wsPhase = out.trace.phase("WebSocket keep-alive, black hole", .ws)
        let wsServer = try await EchoServerHandle.start(backend, .ws, traced: (out.trace, wsPhase))
        let upstream = wsServer.endpoint.with(transport: .tcp)
        // Measured against a server of its own, so that the picture shows only the connection that meets the hole.
        let calibration = try await EchoServer.start(backend, on: loopback(.ws))
        let probe = try await Relay.start(
            listen: loopback(.tcp), upstream: calibration.endpoint.with(transport: .tcp), backend: backend)
        let clean = try await backend.connectWebSocket(to: probe.endpoint.with(transport: .ws))
        try await clean.send(text: "hello")
        _ = try await clean.receive()
        let bytesBeforeHole = probe.statistics.bytesToClients
        await clean.close()
        await probe.stop()
        await calibration.stop()
        let wsRelay = try await Relay.start(
            listen: loopback(.tcp), upstream: upstream, backend: backend,
            toClient: .with { $0.blackHoleAfterBytes = bytesBeforeHole })
        let ws = out.trace.trace(
            try await backend.connectWebSocket(
                to: wsRelay.endpoint.with(transport: .ws),
                webSocket: .with {
                    $0.keepAliveInterval = interval
                    $0.pongDeadline = deadline
                }), side: .client, phase: wsPhase)
        try await ws.send(.text("hello"))
        _ = try await ws.receive()
        let holeStarted = MonotonicClock.nanoseconds()
        var wsOutcome = "nothing within 10 s"
        do {
            _ = try await withDeadline(.seconds(10)) { () async throws -> Void in
                while true { _ = try await ws.receive() }
            }
        } catch {
            wsOutcome = "\(error)"
        }
        let wsNoticed = Double(MonotonicClock.nanoseconds() - holeStarted) / 1e9
        out.trace.mark(wsPhase, .client, wsOutcome == "nothing within 10 s" ? "nothing noticed" : "receive failed")
        out.say(
            "WebSocket with a ping every \(interval) and a pong deadline of \(deadline): the first echo came back; \(fixed(wsNoticed, 1)) s after the black hole began, receive failed: \(wsOutcome)"
        )
        let wsNoticedAtAll = wsOutcome != "nothing within 10 s"
        out.figure("ws.noticedSeconds", wsNoticed)
        out.figure("ws.noticed", wsNoticedAtAll ? 1 : 0)
        await ws.close()
        await wsRelay.stop()
        await wsServer.stop()
        out.say()
        out.say(
            "Why: TCP only notices a dead path when it has something to send and its retransmissions go unanswered,")
        out.say("which takes minutes (tcp_retries2: about 15 minutes on Linux); with nothing to send, never, unless")
        out.say("SO_KEEPALIVE is on, and its first probe comes after 2 hours by default. Here the client did send, but")
        out.say(
            "the relay took the bytes and acknowledged them, as a middlebox or a half-dead peer can. An application")
        out.say(
            "that must know sends its own heartbeat and gives up when the answer is late: WebSocket's ping and pong")
        out.say(
            "(URLSessionWebSocketTask users call sendPing on a timer; here keepAliveInterval and pongDeadline do it).")
        // What this run showed, against that explanation.
        if tcpOutcome.hasPrefix("nothing") {
            out.say(
                "Here TCP reported nothing for \(fixed(tcpWaited, 1)) s, as explained: the connection looked healthy.",
                pointingAt: tcpPhase)
        } else {
            out.say("Here TCP did report something (\(tcpOutcome)), so the black hole was not silent this time.")
        }
        let window = (interval + deadline).wholeNanoseconds
        if !wsNoticedAtAll {
            out.say("Here the keep-alive did NOT notice within 10 s: the pings or the deadline did not run.")
        } else if UInt64(wsNoticed * 1e9) <= window + 500_000_000 {
            out.say(
                "Here the keep-alive noticed after \(fixed(wsNoticed, 1)) s: within one ping interval plus the pong deadline (\(fixed(Double(window) / 1e9, 1)) s).",
                pointingAt: wsPhase)
        } else {
            out.say(
                "Here the keep-alive noticed, but after \(fixed(wsNoticed, 1)) s, later than one ping interval plus the pong deadline (\(fixed(Double(window) / 1e9, 1)) s): a busy machine delayed its timers."
            )
        }
        return out.report
    }
}
