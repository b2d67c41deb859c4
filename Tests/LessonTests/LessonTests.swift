import ConnectionTestKit
import Foundation
import Lessons
import POSIXSupport
import SocketStyles
import Synchronization
import Testing

/// Each lesson's claims, checked on real sockets (never its timings).
@Suite("Lessons", .serialized, .timeLimit(.minutes(20)))
struct LessonTests {
    init() {
        // The namespace lessons' SIGINT/SIGTERM clean-up (Dispatch signal sources) lives as long as the process.
        SocketTest.addWarmUp { NetworkLab.installSignalCleanup() }
    }

    /// Runs a lesson, and checks the page it draws (once per lesson, backend and fault source).
    func run(_ name: String, _ backend: Backend = .bsd) async throws -> LessonReport {
        let lesson = try #require(Lesson.named(name))
        // The page is opened inside the socket-test lock: Chromium's pipes are this test's descriptors.
        return try await SocketTest.run(timeLimit: .seconds(150)) {
            let report = try await lesson.run(backend) { _ in }
            try LessonPages.check(report, lesson, backend)
            return report
        }
    }

    @Test(
        "headofline: the late message holds back every later TCP and WebSocket message, and no UDP datagram; says so",
        arguments: Backend.allCases)
    func headOfLine(_ backend: Backend) async throws {
        let report = try await run("headofline", backend)
        let figures = report.figures
        for transport in ["tcp", "ws", "udp"] {
            #expect(figures["\(transport).held"] == 1, "the relay held one \(transport) message")
            #expect(figures["\(transport).missing"] == 0, "every \(transport) message came back")
        }
        for transport in ["tcp", "ws"] {
            let sent = figures["\(transport).sentWhileHeld"] ?? 0
            #expect(sent > 0)
            #expect(figures["\(transport).behind"] == sent, "\(transport): every later message came back after #5")
            #expect(figures["\(transport).overtook"] == 0)
            #expect(report.lines.contains { $0.hasPrefix("Here every one of the \(Int(sent)) ") }, "\(report.lines)")
        }
        let udpOvertook = figures["udp.overtook"] ?? 0
        #expect(udpOvertook > 0, "no datagram overtook the held one")
        #expect(
            report.lines.contains { $0.hasPrefix("Here \(Int(udpOvertook)) of the ") } == (udpOvertook > 0),
            "\(report.lines)")
        // The picture: the late message's arrow ends after the others' in tcp and ws, before them in udp.
        for (index, phase) in report.phases.enumerated() {
            let sends = report.events.filter { $0.phase == index && $0.kind == .send && $0.side == .client }
            #expect(sends.count == 20, "\(phase.title): 20 sends drawn")
            #expect(sends.allSatisfy { $0.arrived != nil })
            #expect(
                sends.filter { $0.text != nil }.map(\.number) == [5], "\(phase.title): #5, and only #5, marked held")
        }
    }

    @Test(
        "nagle and boundaries say what their own run showed, on every backend (the stall or not, joined or not)",
        arguments: Backend.allCases)
    func textFollowsTheFigures(_ backend: Backend) async throws {
        let nagle = try await run("nagle", backend)
        let off = nagle.figures["nodelay.off.p50us"] ?? 0
        let on = nagle.figures["nodelay.on.p50us"] ?? 0
        let stalled = off >= 5_000 && off >= 10 * on
        #expect(nagle.lines.contains { $0.hasPrefix("Here the stall showed") } == stalled, "\(nagle.lines)")
        #expect(nagle.lines.contains { $0.hasPrefix("Here the stall did not show") } == !stalled)
        // The kernel's view after each write of the 3 untimed requests each way, and what it held back.
        for (index, setting) in ["off", "on"].enumerated() {
            let views = nagle.events.filter { $0.phase == index && $0.kind == .kernel }
            #expect(views.count == 6, "TCP_NODELAY \(setting): a kernel view after each untimed write")
            let held = views.filter { $0.text?.contains("not sent") == true }.count
            #expect(nagle.figures["nodelay.\(setting).heldBackWrites"] == Double(held))
        }
        #expect(
            nagle.lines.contains {
                $0.hasPrefix(
                    "Here the kernel kept a write unsent right after it was made \(Int(nagle.figures["nodelay.off.heldBackWrites"] ?? -1)) time(s) of 6 with TCP_NODELAY off, \(Int(nagle.figures["nodelay.on.heldBackWrites"] ?? -1)) with it on"
                )
            }, "\(nagle.lines)")
        let boundaries = try await run("boundaries", backend)
        let joined = (boundaries.figures["tcp.receives"] ?? 0) < (boundaries.figures["tcp.sends"] ?? 0)
        #expect(boundaries.lines.contains { $0.hasPrefix("Here TCP joined them") } == joined, "\(boundaries.lines)")
        #expect(
            boundaries.lines.contains { $0.hasPrefix("Here each send came out as a receive of its own") } == !joined)
    }

    @Test(
        "flow and mtu say what their own run showed, on every backend (held back or not, lost or not, the limit)",
        arguments: Backend.allCases)
    func flowAndMTUSelfCheck(_ backend: Backend) async throws {
        let flow = try await run("flow", backend)
        let held = (flow.figures["tcp.senderBlockedShare"] ?? 0) >= 0.5
        #expect(flow.lines.contains { $0.hasPrefix("Here the TCP sender was held back") } == held, "\(flow.lines)")
        #expect(flow.lines.contains { $0.hasPrefix("Here the TCP sender was not held back much") } == !held)
        #expect(flow.figures["tcp.deliveredBytes"] == flow.figures["tcp.sentBytes"])
        #expect(flow.lines.contains { $0.hasPrefix("     Nothing was lost") })
        let lost = (flow.figures["udp.received"] ?? 0) < (flow.figures["udp.sent"] ?? 0)
        #expect(
            flow.lines.contains { $0.hasPrefix("Here UDP lost ") && !$0.hasPrefix("Here UDP lost nothing") } == lost)
        #expect(flow.lines.contains { $0.hasPrefix("Here UDP lost nothing") } == !lost)
        // What TCP did underneath, read every millisecond: the sender's kernel sent every byte the reader got,
        // with a congestion window and a round trip, and the page draws it under the TCP diagram.
        let sender = try #require(flow.tcp.first { $0.phase == 0 && $0.side == .client }, "\(flow.tcp.count) series")
        let first = try #require(sender.samples.first)
        let last = try #require(sender.samples.last)
        // Counted from the connection's start (the first reading may come after the first sends); acknowledged
        // counts the SYN and the FIN too.
        #expect(Double(last.bytesSent) >= flow.figures["tcp.deliveredBytes"] ?? .infinity, "\(first), \(last)")
        #expect(last.bytesAcked > first.bytesAcked && last.bytesAcked <= last.bytesSent + 2)
        #expect(sender.samples.allSatisfy { $0.congestionWindow > 0 })
        #expect(sender.samples.contains { $0.rttMicroseconds > 0 })
        #expect(sender.readings >= sender.samples.count && sender.readings > 100, "\(sender.readings) readings")
        #expect(
            zip(sender.samples, sender.samples.dropFirst()).allSatisfy { $0.at < $1.at && $0.bytesSent <= $1.bytesSent }
        )
        let page = LessonPage.html(flow, summary: "flow", backend: backend.rawValue)
        for drawn in ["class=\"tcp-sent\"", "class=\"tcp-acked\"", "class=\"tcp-cwnd\"", "class=\"tcp-rtt\""] {
            #expect(page.contains(drawn), "\(drawn)")
        }

        let mtu = try await run("mtu", backend)
        let exact = mtu.figures["udp.65507"] == 1 && mtu.figures["udp.65508"] == -1
        #expect(
            mtu.lines.contains { $0.hasPrefix("Here 65,507 bytes went and came back whole") } == exact, "\(mtu.lines)")
        #expect(mtu.lines.contains { $0.hasPrefix("Here the limit did not show") } == !exact)
        let tcpWhole = mtu.figures["tcp.70000.bytes"] == 70_000
        #expect(mtu.lines.contains { $0.hasPrefix("Here TCP carried all 70,000 bytes") } == tcpWhole)
    }

    @Test("deadpeer says what its own run showed, on every backend", arguments: Backend.allCases)
    func deadPeerSelfCheck(_ backend: Backend) async throws {
        let report = try await run("deadpeer", backend)
        let tcpSilent = report.figures["tcp.noticed"] == 0
        #expect(report.lines.contains { $0.hasPrefix("Here TCP reported nothing") } == tcpSilent, "\(report.lines)")
        #expect(report.lines.contains { $0.hasPrefix("Here TCP did report something") } == !tcpSilent)
        let noticed = report.figures["ws.noticed"] == 1
        let seconds = report.figures["ws.noticedSeconds"] ?? 0
        #expect(report.lines.contains { $0.hasPrefix("Here the keep-alive did NOT notice") } == !noticed)
        #expect(
            report.lines.contains { $0.hasPrefix("Here the keep-alive noticed after") }
                == (noticed && UInt64(seconds * 1e9) <= 2_000_000_000))
        #expect(
            report.lines.contains { $0.hasPrefix("Here the keep-alive noticed, but after") }
                == (noticed && UInt64(seconds * 1e9) > 2_000_000_000))
        // The picture: the server's reply to "still there?" never reached the client (a cross), while the client's
        // kernel, after the wait, had nothing unacknowledged: the relay took and acknowledged the bytes.
        let replies = report.events.filter { $0.phase == 0 && $0.kind == .send && $0.side == .server }
        #expect(replies.count == 2 && replies[0].arrived != nil && replies[1].arrived == nil, "\(replies)")
        let views = report.events.filter { $0.phase == 0 && $0.kind == .kernel }
        #expect(views.last?.text?.hasPrefix("0 unacked") == true, "\(views.map(\.text))")
    }

    @Test("handshake says which steps showed in its own run, on every backend", arguments: Backend.allCases)
    func handshakeSelfCheck(_ backend: Backend) async throws {
        let report = try await run("handshake", backend)
        let figures = report.figures
        let tcpSlower = (figures["native.tcp.connect.p50us"] ?? 0) > (figures["native.udp.connect.p50us"] ?? 0)
        #expect(report.lines.contains { $0.hasPrefix("Here TCP's connect took") } == tcpSlower, "\(report.lines)")
        #expect(report.lines.contains { $0.hasPrefix("Here TCP's connect was not slower") } == !tcpSlower)
        for (upper, lower, what) in [
            ("ws", "tcp", "the WebSocket upgrade"), ("tls", "tcp", "the TLS handshake"),
            ("wss", "tls", "the upgrade inside TLS"),
        ] {
            let upperP50 = try #require(figures["\(upper).firstReply.p50us"])
            let lowerP50 = try #require(figures["\(lower).firstReply.p50us"])
            #expect(report.lines.contains { $0.hasPrefix("Here \(what) added") } == (upperP50 > lowerP50))
            #expect(report.lines.contains { $0.hasPrefix("Here \(what) did not show") } == !(upperP50 > lowerP50))
        }
    }

    @Test(
        "boundaries: the TCP stream keeps every byte in order; every UDP datagram arrives whole",
        arguments: [Backend.bsd, .async])
    func boundaries(_ backend: Backend) async throws {
        let report = try await run("boundaries", backend)
        #expect(report.figures["tcp.bytes"] == 1000)
        #expect(report.figures["tcp.inOrder"] == 1)
        #expect(report.figures["udp.receives"] == 100)
        #expect(report.figures["udp.whole"] == 1)
        #expect(report.figures["ws.receives"] == 100)
        #expect(report.figures["ws.whole"] == 1)
    }

    @Test("handshake: every transport measured, TLS and WSS included")
    func handshake() async throws {
        let report = try await run("handshake")
        for key in [
            "native.tcp.connect.p50us", "native.udp.connect.p50us", "tcp.connect.p50us", "udp.connect.p50us",
            "ws.connect.p50us", "tls.connect.p50us", "wss.connect.p50us",
        ] {
            #expect((report.figures[key] ?? 0) > 0, "\(key)")
        }
    }

    @Test("nagle: both settings measured")
    func nagle() async throws {
        let report = try await run("nagle")
        #expect((report.figures["nodelay.off.p50us"] ?? 0) > 0)
        #expect((report.figures["nodelay.on.p50us"] ?? 0) > 0)
    }

    @Test("mtu: 65,507 bytes go whole, 65,508 are refused; TCP carries 70,000 bytes")
    func mtu() async throws {
        let report = try await run("mtu")
        #expect(report.figures["udp.65507"] == 1)
        #expect(report.figures["udp.65508"] == -1)
        #expect(report.figures["tcp.70000.bytes"] == 70_000)
    }

    @Test("flow: a slow reader holds the TCP sender back; flat-out UDP loses some datagrams but not all")
    func flow() async throws {
        let report = try await run("flow")
        #expect((report.figures["tcp.readerMBps"] ?? 0) > 0)
        let received = report.figures["udp.received"] ?? -1
        #expect(received > 0 && received < (report.figures["udp.sent"] ?? 0))
    }

    @Test(
        "loss: UDP loses some but not all; TCP delivers every round trip and retransmits (root only); says so",
        arguments: Backend.allCases)
    func loss(_ backend: Backend) async throws {
        let report = try await run("loss", backend)
        if report.figures["skipped"] == 1 {
            print("loss lesson skipped: \(report.lines.first ?? "")")
            return
        }
        for percent in [1, 5, 20] {
            let delivered = report.figures["udp.\(percent).delivered"] ?? -1
            #expect(delivered > 0 && delivered <= (report.figures["udp.\(percent).sent"] ?? 0))
            #expect(report.figures["tcp.\(percent).delivered"] == 200)
        }
        #expect((report.figures["udp.20.delivered"] ?? 1000) < 1000)
        #expect((report.figures["tcp.20.retransmits"] ?? 0) > 0)
        try Self.checkLossVerdict(report)
        let retransmitted = [1, 5, 20].allSatisfy { (report.figures["tcp.\($0).retransmits"] ?? 0) > 0 }
        #expect(
            report.lines.contains { $0.hasPrefix("Here TCP delivered every round trip at every level") }
                == retransmitted)
        #expect(report.lines.contains { $0.hasPrefix("Here TCP delivered every round trip, but") } == !retransmitted)
        // What TCP did underneath: the client's readings are in each TCP phase, and the line on the congestion
        // window says what its own figures show.
        let tcpPhases = report.phases.indices.filter { report.phases[$0].transport == "tcp" }
        #expect(tcpPhases.count == 3)
        for phase in tcpPhases {
            #expect(report.tcp.contains { $0.phase == phase && $0.side == .client }, "phase \(phase)")
        }
        // Each level's timeout with the phase it happened in (the TCP phases are the levels in order).
        let timeouts = zip([1, 5, 20], tcpPhases).compactMap {
            percent, phase -> (phase: Int, before: Double, lowest: Double)? in
            guard let before = report.figures["tcp.\(percent).cwndBeforeTimeout"],
                let lowest = report.figures["tcp.\(percent).cwndInTimeout"]
            else { return nil }
            return (phase, before, lowest)
        }
        let fell = timeouts.last.map { $0.lowest < $0.before } ?? false
        #expect(
            report.lines.contains { $0.hasPrefix("Here, at ") && $0.contains("a retransmission timeout took") } == fell)
        #expect(report.lines.contains { $0.hasPrefix("Here no retransmission timeout fired") } == timeouts.isEmpty)
        // cwnd falls after a retransmission timeout: at 20% loss, when the readings caught a timeout (a reading in the
        // Loss state), some reading that counted one more retransmitted segment is followed within 100 ms by a
        // congestion window below the one read just before it (2-10 times a run on each backend here). Most
        // retransmissions, fast ones and tail-loss probes under BBR, leave cwnd where it was, and a timeout's Loss
        // state can end between two 4 ms readings: a run whose readings caught none (one async run in CI, 02:4x UTC
        // on 2026-12-05) has nothing to check here, and the lesson says so (the line checked above).
        let lossiest = try #require(report.tcp.first { $0.phase == tcpPhases.last && $0.side == .client })
        let samples = lossiest.samples
        let caughtTimeout = samples.contains { $0.congestionState == 4 }
        let fellAfterRetransmission = samples.indices.dropFirst().contains { index in
            guard samples[index].retransmits > samples[index - 1].retransmits else { return false }
            let before = samples[index - 1].congestionWindow
            return samples[index...].prefix { $0.at - samples[index].at <= 100_000 }.contains {
                $0.congestionWindow < before
            }
        }
        #expect(
            !caughtTimeout || fellAfterRetransmission,
            "readings caught a timeout at 20%, but none after a retransmission showed a smaller cwnd")
        // The readings agree with the figure the lesson names: a sample in the Loss state with that window, in the
        // phase of that level. (The last level with a timeout need not be 20%: a run whose 20% readings caught none
        // names 5%'s, and looking for it among 20%'s readings failed uv once in CI's tests, 2026-12-06.)
        if let last = timeouts.last,
            let series = report.tcp.first(where: { $0.phase == last.phase && $0.side == .client })
        {
            #expect(
                !fell
                    || series.samples.contains {
                        $0.congestionState == 4 && Double($0.congestionWindow) == last.lowest
                    })
        }
    }

    @Test(
        "congestion: CUBIC's flows reach fair shares through a short queue, a full deep queue delays the ping, a short one less (root only); says so",
        arguments: Backend.allCases)
    func congestion(_ backend: Backend) async throws {
        let report = try await run("congestion", backend)
        if report.figures["skipped"] == 1 {
            #expect(report.lines.contains { $0.contains("no queue") && $0.contains("that fills") })
            print("congestion lesson skipped: \(report.lines.first ?? "")")
            return
        }
        // Which congestion control ran is the kernel's word for each flow, in each diagram's title.
        #expect(report.phases.map { $0.title.prefix { $0 != "," } } == ["CUBIC", "CUBIC", "BBR", "BBR"])
        #expect(report.charts.count == 4)
        for run in ["cubic.deep", "cubic.short", "bbr.deep", "bbr.short"] {
            let figure = { (name: String) in report.figures["\(run).\(name)"] ?? -1 }
            // The flows kept the link busy, and the ping answered on the idle path.
            #expect(figure("utilisation") > 0.8, "\(run)")
            #expect(figure("idleRttUs") > 0, "\(run)")
        }
        let figure = { (name: String) in report.figures[name] ?? -1 }
        // Slow start: flow 1 alone opened its window beyond the initial ten segments before ssthresh was set.
        #expect(figure("cubic.deep.slowStartPeakCwnd") > 10)
        // Bufferbloat: the full deep queue holds the ping several times its idle round trip; the short queue less.
        #expect(figure("cubic.deep.fourFlowRttUs") >= 5 * figure("cubic.deep.idleRttUs"))
        #expect(figure("cubic.short.fourFlowRttUs") < figure("cubic.deep.fourFlowRttUs") / 2)
        // Fair shares: with CUBIC and the short queue, the four flows' shares over a second reach Jain's index 0.9
        // within the 8 s they have together (1.0-3.7 s in 12 runs here; the deep queue and BBR are reported, not
        // required: 9 of 12 and 1 of 24 of those runs reached it).
        let after = figure("cubic.short.fairAfterMs")
        #expect(after > 0 && after <= 8000, "cubic.short: \(after) ms")
        // The lines say what the figures show.
        let fair = ["cubic.deep", "cubic.short", "bbr.deep", "bbr.short"].filter {
            let after = figure("\($0).fairAfterMs")
            return after > 0 && after <= 8000
        }
        #expect(
            report.lines.contains {
                $0.hasPrefix("Here the four flows' shares over a second reached a Jain's index of 0.9 within 8 s")
                    && $0.contains("in \(fair.count) of 4 runs")
            })
        #expect(report.lines.contains { $0.hasPrefix("Here ") && $0.contains("did not reach 0.9") } == (fair.count < 4))
        #expect(report.lines.contains { $0.hasPrefix("Here CUBIC filled the deep queue") })
        let shorter = figure("bbr.deep.fourFlowRttUs") < figure("cubic.deep.fourFlowRttUs")
        #expect(report.lines.contains { $0.hasPrefix("Here BBR, with the same deep queue, held the ping") } == shorter)
        #expect(
            report.lines.contains { $0.hasPrefix("Here BBR, with the same deep queue, kept the ping as long") }
                == !shorter)
    }

    @Test(
        "c10k: a bsd server grows a thread a connection, a loop server none; idle connections cost no work; says so",
        arguments: Backend.allCases)
    func c10k(_ backend: Backend) async throws {
        let report = try await run("c10k", backend)
        let loop = backend.rawValue == "bsd" ? "async" : backend.rawValue
        let figure = { (name: String) in report.figures[name] ?? -1 }
        #expect(
            report.phases.map(\.title) == [
                "bsd server, 10,000 idle connections", "\(loop) server, 10,000 idle connections",
            ])
        // A thread per connection against one loop for all.
        // (A few of the server's own threads may come and go meanwhile: 9,998-10,000 here.)
        #expect(figure("bsd.threadsAmong") - figure("bsd.threadsAlone") >= 9_900)
        #expect(figure("\(loop).threadsAmong") - figure("\(loop).threadsAlone") < 10)
        #expect(figure("bsd.bytesPerConnection") > figure("\(loop).bytesPerConnection"))
        for server in ["bsd", loop] {
            // Every round trip was timed, alone and among the idle connections; the server read all the while.
            #expect(figure("\(server).p50usAlone") > 0 && figure("\(server).p50usAmong") > 0, "\(server)")
            #expect(figure("\(server).bytesPerConnection") > 0, "\(server)")
        }
        #expect(report.charts.count == 2)
        for chart in report.charts {
            let roundTrips = try #require(chart.panels.last?.lines.map(\.points.count))
            #expect(roundTrips == [2000, 2000], "alone, and among the idle connections")
            #expect(chart.panels[0].lines[0].points.count >= 10, "the threads were read every 50 ms")
        }
        // The lines say what the figures show.
        #expect(
            report.lines.contains {
                $0.hasPrefix("Here the bsd server grew by ") && $0.contains("threads for 10,000 connections, and")
            })
        let quiet = ["bsd", loop].allSatisfy { figure("\($0).idleSwitchesPerSecond") < 1000 }
        #expect(report.lines.contains { $0.hasPrefix("Here the idle connections cost no work") } == quiet)
        #expect(report.lines.contains { $0.hasPrefix("Here a connection cost the bsd server") && $0.contains("x)") })
    }

    /// The loss lesson's line on UDP matches its figures: about P lost at each level, or said otherwise.
    static func checkLossVerdict(_ report: LessonReport) throws {
        let followed = try [1, 5, 20].allSatisfy { percent in
            let sent = try #require(report.figures["udp.\(percent).sent"])
            let share = (sent - (report.figures["udp.\(percent).delivered"] ?? 0)) / sent
            return share >= Double(percent) / 300 && share <= Double(percent) / 50
        }
        #expect(
            report.lines.contains { $0.hasPrefix("Here UDP lost about P at each level") } == followed, "\(report.lines)"
        )
        #expect(report.lines.contains { $0.hasPrefix("Here UDP's losses did not follow P") } == !followed)
    }

    /// The ordering lesson's line on order matches its figures.
    static func checkOrderVerdict(_ report: LessonReport) {
        let figures = report.figures
        let udpDiffered = (figures["udp.outOfOrder"] ?? 0) > 0 || figures["udp.delivered"] != figures["udp.sent"]
        #expect(
            report.lines.contains {
                $0.hasPrefix("Here TCP and WebSocket delivered all 300 in order, and UDP held nothing back")
            }
                == udpDiffered, "\(report.lines)")
        #expect(
            report.lines.contains { $0.hasPrefix("Here TCP and WebSocket delivered all 300 in order, and so did UDP") }
                == !udpDiffered)
    }

    @Test(
        "ordering: TCP and WebSocket deliver all 300 in order; UDP delivers each independently (root only); says so",
        arguments: Backend.allCases)
    func ordering(_ backend: Backend) async throws {
        let report = try await run("ordering", backend)
        if report.figures["skipped"] == 1 { return }
        for transport in ["tcp", "ws"] {
            #expect(report.figures["\(transport).delivered"] == 300)
            #expect(report.figures["\(transport).outOfOrder"] == 0)
        }
        let udp = report.figures["udp.delivered"] ?? -1
        #expect(udp > 0 && udp <= 300)
        Self.checkOrderVerdict(report)
        let holes = (report.figures["tcp.retransmits"] ?? 0) + (report.figures["ws.retransmits"] ?? 0)
        #expect(
            report.lines.contains { $0.hasPrefix("Here no TCP or WebSocket segment happened to be dropped") }
                == (holes == 0))
        #expect(
            report.lines.contains { $0.hasPrefix("Here \(Int(holes)) segment(s) were retransmitted") } == (holes > 0))
    }

    @Test(
        "loss without root: the relay's drops are the datagrams the client misses; says so", arguments: Backend.allCases
    )
    func lossThroughRelay(_ backend: Backend) async throws {
        let report = try await Lesson.$faults.withValue(.relay) { try await run("loss", backend) }
        #expect(report.figures["relay"] == 1)
        for percent in [1, 5, 20] {
            let sent = report.figures["udp.\(percent).sent"] ?? 0
            let delivered = report.figures["udp.\(percent).delivered"] ?? -1
            let dropped = report.figures["udp.\(percent).dropped"] ?? -1
            #expect(sent == 1000)
            // A datagram the relay dropped never comes back. An echo later than 100 ms after the last burst (a
            // loaded machine) counts as lost too: a few more may be lost than dropped, never fewer.
            #expect(delivered + dropped <= sent, "more came back than the relay let through at \(percent)%")
            #expect(delivered + dropped >= sent * 0.97, "far more lost than the relay dropped at \(percent)%")
        }
        #expect((report.figures["udp.20.dropped"] ?? 0) > 0)
        try Self.checkLossVerdict(report)
        let exact = [1, 5, 20].allSatisfy {
            let figures = report.figures
            return (figures["udp.\($0).sent"] ?? 0) - (figures["udp.\($0).delivered"] ?? 0)
                == figures["udp.\($0).dropped"]
        }
        #expect(report.lines.contains { $0.hasPrefix("Here the client missed exactly") } == exact, "\(report.lines)")
    }

    @Test(
        "ordering without root: relay delays keep TCP and WebSocket in order and let UDP datagrams overtake; says so",
        arguments: Backend.allCases)
    func orderingThroughRelay(_ backend: Backend) async throws {
        let report = try await Lesson.$faults.withValue(.relay) { try await run("ordering", backend) }
        #expect(report.figures["relay"] == 1)
        for transport in ["tcp", "ws"] {
            #expect(report.figures["\(transport).delivered"] == 300)
            #expect(report.figures["\(transport).outOfOrder"] == 0)
        }
        #expect(report.figures["udp.delivered"] == 300)
        #expect((report.figures["udp.outOfOrder"] ?? 0) > 0)
        Self.checkOrderVerdict(report)
    }

    @Test("deadpeer: TCP alone reports nothing through a black hole; WebSocket keep-alive fails the receive")
    func deadPeer() async throws {
        let report = try await run("deadpeer", .runloop)
        #expect(report.figures["tcp.noticed"] == 0)
        #expect((report.figures["ws.noticedSeconds"] ?? 99) < 10, "keep-alive never noticed")
    }

    @Test("multicast: every joined receiver gets every datagram; a socket that did not join gets none (root only)")
    func multicast() async throws {
        let report = try await run("multicast")
        if report.figures["skipped"] == 1 { return }
        let sent = try #require(report.figures["sent"])
        #expect(sent == 10)
        for receiver in 1...3 { #expect(report.figures["receiver\(receiver)"] == sent) }
        #expect(report.figures["notJoined"] == 0)
        #expect(report.lines.contains { $0.hasPrefix("Here it showed: each of the 3 joined sockets got all 10") })
    }
}

/// Each lesson's page, opened in headless Chromium: the diagram drew one arrow per send recorded, a bar per
/// receive and a dot per mark, and the browser fetched nothing.
enum LessonPages {
    static let checked = Mutex<Set<String>>([])

    static func check(_ report: LessonReport, _ lesson: Lesson, _ backend: Backend) throws {
        let key = "\(lesson.name)|\(backend.rawValue)|\(report.figures["relay"] ?? 0)|\(report.figures["skipped"] ?? 0)"
        guard checked.withLock({ $0.insert(key).inserted }) else { return }
        let sends = report.events.filter { $0.kind == .send }.count
        let receives = report.events.filter { $0.kind == .receive }.count
        let marks = report.events.filter { $0.kind == .mark }.count
        let kernel = report.events.filter { $0.kind == .kernel }.count
        if report.figures["skipped"] != 1 {
            #expect(sends > 0 || !report.charts.isEmpty, "\(key): the lesson recorded no send and drew no chart")
            #expect(!report.phases.isEmpty)
        }
        #expect(report.events.allSatisfy { $0.phase < report.phases.count })
        #expect(report.pointers.values.allSatisfy { $0 < report.phases.count })
        let html = LessonPage.html(report, summary: lesson.summary, backend: backend.rawValue)
        for external in ["<script", "<link", "<img", "<iframe", "src=", "url(", "http://", "https://"] {
            #expect(!html.contains(external), "\(key): the page refers to \(external)")
        }
        guard let chromium = HeadlessChromium.path else { return }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "lesson-page-\(getpid())-\(lesson.name)-\(backend.rawValue)")
        defer { try? FileManager.default.removeItem(at: directory) }
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let page = directory.appendingPathComponent("\(lesson.name).html")
        try html.write(to: page, atomically: true, encoding: .utf8)
        let netLog = directory.appendingPathComponent("netlog.json")
        let flags = HeadlessChromium.flags(profile: directory.appendingPathComponent("profile"), netLog: netLog)
        let render = try ChildProcess.run([chromium] + flags + ["--dump-dom", page.absoluteString])
        #expect(render.status == 0)
        func drawn(_ element: String) -> Int { render.output.components(separatedBy: element).count - 1 }
        #expect(drawn("<path class=\"arrow") == sends, "\(key): arrows drawn = sends recorded")
        #expect(drawn("<line class=\"receive\"") == receives, "\(key): bars drawn = receives recorded")
        #expect(drawn("<circle class=\"mark\"") == marks, "\(key): dots drawn = marks recorded")
        #expect(drawn("<rect class=\"kernel\"") == kernel, "\(key): squares drawn = kernel views recorded")
        #expect(drawn("<figure id=\"phase-") == report.phases.count)
        // Every chart, and in it a line for every series with points.
        #expect(drawn("<figure class=\"chart\"") == report.charts.count, "\(key): charts drawn = charts made")
        let lines = report.charts.flatMap(\.panels).flatMap(\.lines).filter { !$0.points.isEmpty }.count
        #expect(drawn("<polyline class=\"chart-") == lines, "\(key): chart lines drawn = series with points")
        let notANumber = render.output.range(of: #"[ML,"]-?(nan|inf)"#, options: .regularExpression)
        #expect(notANumber == nil, "\(key): a coordinate is not a number")
        let remote = HeadlessChromium.trafficBeyondLoopback(netLog: netLog)
        #expect(remote.isEmpty, "\(key): Chromium sent traffic beyond loopback: \(remote)")
        print("lesson page \(key): Chromium drew \(drawn("<path class=\"arrow")) arrows for \(sends) sends")
    }
}

/// `sockbench compare --server HOST:PORT` against `sockbench serve --agent` on another host: two network
/// namespaces joined by a veth pair play the hosts (root only; removed afterwards, also on failure).
@Suite("Across hosts", .serialized, .timeLimit(.minutes(20)))
struct AcrossHostsTests {
    init() {
        SocketTest.addWarmUp { NetworkLab.installSignalCleanup() }
    }

    @Test(
        "compare --server: every server on the other host, the client here, results for each row",
        .enabled(
            if: NetworkLab.unavailableReason() == nil,
            "skipped: \(NetworkLab.unavailableReason() ?? "") (the cross-host test makes two network namespaces)"))
    func compareAcrossNamespaces() async throws {
        try await SocketTest.run(timeLimit: .seconds(300)) {
            let lab = try NetworkLab()
            defer { lab.remove() }
            let agent = try lab.start(
                in: lab.serverNamespace, ["serve", "--agent", "tcp://\(lab.serverAddress):0", "--exit-on-stdin-eof"])
            defer { NetworkLab.stop(agent) }
            let line = try await blocking { agent.readLine() }
            let prefix = "listening on tcp://"
            try #require(line.hasPrefix(prefix), "the agent said: \(line)")
            let address = String(line.dropFirst(prefix.count))
            #expect(address.hasPrefix(lab.serverAddress + ":"))
            let out = "/tmp/socketstyles-across-\(getpid())"
            defer { _ = try? FileManager.default.removeItem(atPath: out) }
            _ = try await blocking {
                try lab.runToEnd(
                    in: lab.clientNamespace,
                    [
                        "compare", "--server", address, "--backends", "bsd,async", "--transports", "tcp,udp,tls",
                        "--scenarios", "pingpong-64,native-64,pump-64k", "--count", "200", "--warmup", "20",
                        "--repetitions", "1", "--placement", "none", "--out", out,
                    ])
            }
            let data = try Data(contentsOf: URL(fileURLWithPath: out + "/results.json"))
            let json = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
            let plan = try #require(json["plan"] as? [String: Any])
            #expect(plan["servers"] as? String == address)
            let rows = try #require(json["rows"] as? [[String: Any]])
            let names = Set(rows.map { "\($0["scenario"]!)|\($0["backend"]!)|\($0["transport"]!)" })
            for expected in [
                "pingpong-64|c-floor|tcp", "pingpong-64|bsd|tcp", "pingpong-64|async|udp", "pingpong-64|bsd|tls",
                "native-64|async|tcp", "pump-65536|c-floor|tcp", "pump-65536|bsd|tls",
            ] {
                #expect(names.contains(expected), "\(expected) missing from \(names.sorted())")
            }
            for row in rows where (row["scenario"] as? String) == "pingpong-64" {
                let median = try #require(row["median"] as? [String: Any])
                let latency = try #require(median["latency"] as? [String: Any])
                #expect(latency["count"] as? Int == 200)
                // The server's usage came from the agent over the control connection.
                #expect(median["server"] != nil)
            }
        }
    }
}

/// The agent on loopback (no root needed): its control protocol turns bad requests into `error` answers and
/// keeps serving, and the servers it starts answer.
@Suite("Agent control protocol", .timeLimit(.minutes(20)))
struct AgentProtocolTests {

    @Test("Bad requests get `error ...`; the session goes on; a started server echoes")
    func badRequests() async throws {
        try await SocketTest.run(timeLimit: .seconds(120)) {
            let agent = try ChildProcess(
                [NetworkLab.selfPath(), "serve", "--agent", "tcp://127.0.0.1:0", "--exit-on-stdin-eof"],
                mergeErrors: false)
            defer { NetworkLab.stop(agent) }
            let line = try await blocking { agent.readLine() }
            try #require(line.hasPrefix("listening on "), "the agent said: \(line)")
            let control = try await Backend.async.connect(to: try Endpoint(url: String(line.dropFirst(13))))
            var buffer: [UInt8] = []
            func ask(_ request: String) async throws -> String {
                try await control.send(Array((request + "\n").utf8))
                while !buffer.contains(UInt8(ascii: "\n")) {
                    guard let message = try await control.receive() else { return "" }
                    buffer += message.bytes
                }
                let end = buffer.firstIndex(of: UInt8(ascii: "\n"))!
                defer { buffer.removeSubrange(...end) }
                return String(decoding: buffer[..<end], as: UTF8.self)
            }
            #expect(try await ask("teleport").hasPrefix("error "))
            #expect(try await ask("start nosuch tcp echo").hasPrefix("error "))
            #expect(try await ask("start bsd carrier-pigeon echo").hasPrefix("error "))
            #expect(try await ask("usage 7").hasPrefix("error "))
            let started = try await ask("start async tcp echo").split(separator: " ")
            try #require(started.count == 3 && started[0] == "ok", "\(started)")
            let server = try await Backend.bsd.connect(to: try Endpoint(url: String(started[2])))
            try await server.send([1, 2, 3])
            #expect(try await server.receive(exactly: 3) == [1, 2, 3])
            await server.close()
            #expect(try await ask("usage 0").hasPrefix("ok {"))
            // A load host's requests (`sockbench fleet`): out of order, unknown or unreachable loads are refused.
            #expect(try await ask("go 0 100").hasPrefix("error "))
            #expect(try await ask("load fanin-0 async \(started[2])").hasPrefix("error "))
            #expect(try await ask("load burst-9 async \(started[2])").hasPrefix("error "))
            #expect(try await ask("load fanin-2 async tls://127.0.0.1:1").hasPrefix("error "))
            #expect(try await ask("load fanin-2 async tcp://127.0.0.1:1").hasPrefix("error "))
            #expect(try await ask("clock").hasPrefix("ok "))
            #expect(try await ask("load fanin-2 bsd \(started[2])") == "ok ready fanin-2")
            #expect(try await ask("go 0 0").hasPrefix("error "))
            let window = try await ask("go 1000000 200")
            #expect(window.hasPrefix("ok {"), "\(window)")
            #expect(try await ask("go 0 100").hasPrefix("error "), "a load is measured once")
            // A udp sink with its receive buffer (compare's --udp-sink-buffer); a size that is no size is refused.
            #expect(try await ask("start bsd udp sink:0").hasPrefix("error "))
            #expect(try await ask("start bsd udp sink:lots").hasPrefix("error "))
            let sink = try await ask("start bsd udp sink:1048576").split(separator: " ")
            try #require(sink.count == 3 && sink[0] == "ok", "\(sink)")
            let port = Int(try Endpoint(url: String(sink[2])).port)
            if let buffer = try SocketMemory.receiveBuffer(udpPort: port) {
                #expect(buffer >= 1_048_576, "the agent's udp sink has a receive buffer of \(buffer) bytes")
            }
            await control.close()
        }
    }

    @Test("serve --socket-buffer: every backend's udp sink gets the receive buffer asked for")
    func sinkReceiveBuffer() async throws {
        try await SocketTest.run(timeLimit: .seconds(120)) {
            for backend in Backend.allCases {
                for asked in [nil, 1_048_576] as [Int?] {
                    let server = try ChildProcess(
                        [
                            NetworkLab.selfPath(), "serve", "udp://127.0.0.1:0", "--backend", backend.name, "--sink",
                            "--exit-on-stdin-eof",
                        ] + (asked.map { ["--socket-buffer", "\($0)"] } ?? []),
                        mergeErrors: false)
                    defer { NetworkLab.stop(server) }
                    let line = try await blocking { server.readLine() }
                    try #require(line.hasPrefix("listening on "), "\(backend.name) said: \(line)")
                    let port = Int(try Endpoint(url: String(line.dropFirst(13))).port)
                    guard let buffer = try SocketMemory.receiveBuffer(udpPort: port) else { return }  // no ss here
                    if let asked {
                        // Linux doubles the size asked for (its bookkeeping), capped at net.core.rmem_max.
                        let expected = 2 * min(asked, Syscall.receiveBufferLimit ?? asked)
                        #expect(buffer == expected, "\(backend.name): \(buffer) bytes, not \(expected)")
                    } else {
                        #expect(buffer < 1_048_576, "\(backend.name) without --socket-buffer: \(buffer) bytes")
                    }
                }
            }
        }
    }
}

/// A socket's buffers as `ss` (iproute2) reads them from the kernel (sock_diag): what a process asked with
/// SO_RCVBUF, seen from outside it.
enum SocketMemory {
    /// The receive buffer (`rb`) of the udp socket bound to `udpPort` on 127.0.0.1, or `nil` when `ss` is not
    /// installed.
    static func receiveBuffer(udpPort: Int) throws -> Int? {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/ss") else { return nil }
        let (status, output) = try ChildProcess.run(["/usr/bin/ss", "-uamnH", "sport = :\(udpPort)"])
        guard status == 0 else { return nil }
        guard let range = output.range(of: #"rb[0-9]+"#, options: .regularExpression) else { return nil }
        return Int(output[range].dropFirst(2))
    }
}
