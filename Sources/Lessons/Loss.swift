import BenchmarkDriver
import ConnectionTestKit
import Foundation
import POSIXSupport
import SocketStyles

extension Lesson {
    /// Real kernel packet loss between two namespaces.
    static let loss = Lesson(
        name: "loss",
        summary:
            "packet loss at 1%, 5%, 20%: UDP loses that share; TCP retransmits (kernel loss between namespaces as root, else a relay and UDP only)"
    ) { backend, print in
        let out = LessonOutput("loss", print)
        if case .relay(let reason) = faultSource { return try await lossThroughRelay(backend, out, reason) }
        if let reason = NetworkLab.unavailableReason() {
            out.say("This lesson needs two network namespaces with iptables packet loss, and \(reason).")
            out.say(
                "Run it as root on Linux with iproute2 and iptables (scripts/ensure-deps installs them). Without them")
            out.say("TCP's retransmissions cannot be shown: loss in user space would hide them from the kernel.")
            out.figure("skipped", 1)
            return out.report
        }
        let lab = try NetworkLab()
        defer { lab.remove() }
        out.say("Two hosts in network namespaces joined by a veth pair; iptables on host B drops each arriving packet")
        out.say("with probability P. Client on host A, echo server on host B, \(backend) backend on both.")
        out.say()
        var tcpPhases: [Int] = []
        for transport in [Transport.udp, .tcp] {
            let serverTrace = ServerTrace()
            defer { serverTrace.remove() }
            let child = try lab.start(
                in: lab.serverNamespace,
                [
                    "serve", "\(transport)://\(lab.serverAddress):0", "--backend", backend.rawValue,
                    "--exit-on-stdin-eof", "--quiet", "--trace", serverTrace.path,
                ])
            var stopped = false
            defer { if !stopped { NetworkLab.stop(child) } }
            let url = String(child.readLine().dropFirst("listening on ".count))
            var runs: [(phase: Int, result: LessonProbe.Result, from: UInt64, to: UInt64)] = []
            for probability in [0.01, 0.05, 0.20] {
                try lab.setLoss(probability)
                let from = MonotonicClock.nanoseconds()
                let json = try lab.runToEnd(
                    in: lab.clientNamespace,
                    ["lesson-probe", transport == .udp ? "udp-loss" : "tcp-rtt", url, "--backend", backend.rawValue])
                let result = try JSONDecoder().decode(LessonProbe.Result.self, from: Data(json.utf8))
                let percent = Int(probability * 100)
                let phase = out.trace.phase(
                    "\(transport == .udp ? "UDP datagrams" : "TCP round trips"), \(percent)% of packets dropped",
                    transport)
                if transport == .tcp { tcpPhases.append(phase) }
                runs.append((phase, result, from, MonotonicClock.nanoseconds()))
                if transport == .udp {
                    let lost = result.sent - result.delivered
                    out.say(
                        "UDP at \(percent)% loss: \(result.sent) datagrams, \(result.delivered) came back, \(lost) lost (\(fixed(Double(lost) * 100 / Double(result.sent), 1))%)."
                    )
                    out.figure("udp.\(percent).sent", Double(result.sent))
                    out.figure("udp.\(percent).delivered", Double(result.delivered))
                } else {
                    out.say(
                        "TCP at \(percent)% loss: \(result.delivered)/\(result.sent) round trips, all bytes delivered; p50 \(fixed(result.p50us, 0)) us, p99 \(fixed(result.p99us / 1000, 1)) ms, max \(fixed(result.maxus / 1000, 1)) ms; \(result.retransmittedSegments) segments retransmitted."
                    )
                    out.figure("tcp.\(percent).delivered", Double(result.delivered))
                    out.figure("tcp.\(percent).retransmits", Double(result.retransmittedSegments))
                    out.figure("tcp.\(percent).maxus", result.maxus)
                    // What the client's TCP did underneath, read every millisecond: the congestion window just
                    // before its first retransmission timeout, and the lowest it fell to in one.
                    if let series = result.tcp.first(where: { $0.side == .client }),
                        let first = series.samples.firstIndex(where: { $0.congestionState == 4 })
                    {
                        let before = first > 0 ? series.samples[first - 1].congestionWindow : 0
                        let lowest =
                            series.samples[first...].filter { $0.congestionState == 4 }.map(\.congestionWindow)
                            .min() ?? 0
                        out.figure("tcp.\(percent).cwndBeforeTimeout", Double(before))
                        out.figure("tcp.\(percent).cwndInTimeout", Double(lowest))
                    }
                }
            }
            try lab.setLoss(0)
            NetworkLab.stop(child)
            stopped = true
            let served = serverTrace.observations()
            for run in runs {
                out.trace.replay(
                    run.result.observations + served.filter { (run.from...run.to).contains($0.at) }, into: run.phase,
                    byteStream: transport.isByteStream)
                out.trace.replayTCP(run.result.tcp, into: run.phase)
            }
        }
        out.say()
        out.say("Why: UDP does not retransmit: a dropped datagram is gone, and about P of them are. TCP numbers every")
        out.say("byte, and the receiver acknowledges what it got; a segment that is not acknowledged is sent again")
        out.say("after a retransmission timeout (at least 200 ms on Linux) or after three duplicate ACKs. So every")
        out.say("byte arrives, but the round trips that met a loss take hundreds of milliseconds: the loss moved from")
        out.say("the data into the tail latency (p99, max).")
        sayLossVerdict(out, relay: false, phase: tcpPhases.last)
        return out.report
    }

    /// The loss lesson's "Here" lines: what this run's figures show of the claim above.
    private static func sayLossVerdict(_ out: LessonOutput, relay: Bool, phase: Int? = nil) {
        let figures = out.report.figures
        let levels = [1, 5, 20]
        let shares = levels.map { percent -> Double in
            let sent = figures["udp.\(percent).sent"] ?? 0
            return sent > 0 ? (sent - (figures["udp.\(percent).delivered"] ?? 0)) / sent : 0
        }
        let listed = zip(levels, shares).map { "\(fixed($1 * 100, 1))% at \($0)%" }.joined(separator: ", ")
        // Each level sends 1,000 datagrams: within a third to twice P is what chance allows (Poisson, about 1% outside).
        if zip(levels, shares).allSatisfy({ $1 >= Double($0) / 300 && $1 <= Double($0) / 50 }) {
            out.say(
                "Here UDP lost about P at each level (\(listed)), and nothing brought those datagrams back: the crosses in the picture.",
                pointingAt: phase)
        } else {
            out.say("Here UDP's losses did not follow P (\(listed)): 1,000 datagrams a level leave room for")
            out.say("chance, but not this much; something else dropped or kept datagrams.")
        }
        if relay {
            let missed = levels.map { Int((figures["udp.\($0).sent"] ?? 0) - (figures["udp.\($0).delivered"] ?? 0)) }
            let dropped = levels.map { Int(figures["udp.\($0).dropped"] ?? 0) }
            if missed == dropped {
                out.say(
                    "Here the client missed exactly the datagrams the relay dropped (\(dropped.map(String.init).joined(separator: ", ")))."
                )
            } else {
                out.say(
                    "Here the client missed \(missed.map(String.init).joined(separator: ", ")) while the relay dropped \(dropped.map(String.init).joined(separator: ", ")): the difference was lost elsewhere (a full receive buffer) or came back late."
                )
            }
            return
        }
        let delivered = levels.allSatisfy { (figures["tcp.\($0).delivered"] ?? 0) > 0 }
        let retransmits = levels.map { Int(figures["tcp.\($0).retransmits"] ?? 0) }
        let slowest = levels.map { fixed((figures["tcp.\($0).maxus"] ?? 0) / 1000, 0) }.joined(separator: ", ")
        if !delivered {
            out.say("Here TCP did NOT finish its round trips at some level: the probe gave up before TCP recovered.")
        } else if retransmits.allSatisfy({ $0 > 0 }) {
            out.say(
                "Here TCP delivered every round trip at every level, retransmitting \(retransmits.map(String.init).joined(separator: ", ")) segments; its slowest round trips took \(slowest) ms: the long arrows in the picture.",
                pointingAt: phase)
        } else {
            out.say(
                "Here TCP delivered every round trip, but retransmitted \(retransmits.map(String.init).joined(separator: ", ")) segments: where it is 0, no segment of its happened to be dropped."
            )
        }
        // The congestion window in a retransmission timeout, from the client's TCP_INFO readings.
        let timeouts = levels.compactMap { percent -> (Int, Int, Int)? in
            guard let before = figures["tcp.\(percent).cwndBeforeTimeout"],
                let lowest = figures["tcp.\(percent).cwndInTimeout"]
            else { return nil }
            return (percent, Int(before), Int(lowest))
        }
        if let (percent, before, lowest) = timeouts.last, lowest < before {
            out.say(
                "Here, at \(percent)%, a retransmission timeout took TCP's congestion window from \(before) segments to \(lowest): after a timeout the sender starts again from almost nothing (the cwnd graph above the TCP diagram).",
                pointingAt: phase)
        } else if timeouts.isEmpty {
            out.say("Here no retransmission timeout fired: every lost segment was repaired by a fast retransmit.")
        } else {
            out.say(
                "Here a retransmission timeout fired, but the congestion window did not fall below its value before it."
            )
        }
    }

    /// Head-of-line blocking.
    static let ordering = Lesson(
        name: "ordering",
        summary:
            "head-of-line blocking: one lost or late TCP segment delays every message behind it, WebSocket's too; UDP datagrams overtake (5% loss as root, else relay delays)"
    ) { backend, print in
        let out = LessonOutput("ordering", print)
        if case .relay(let reason) = faultSource { return try await orderingThroughRelay(backend, out, reason) }
        if let reason = NetworkLab.unavailableReason() {
            out.say("This lesson needs two network namespaces with iptables packet loss, and \(reason).")
            out.say("Run it as root on Linux with iproute2 and iptables.")
            out.figure("skipped", 1)
            return out.report
        }
        let lab = try NetworkLab()
        defer { lab.remove() }
        out.say(
            "300 numbered messages, in bursts of 10 a millisecond apart, from host A to an echo server on host B, with 5% of"
        )
        out.say("the packets arriving at B dropped (\(backend) backend). Each message's round trip is timed.")
        out.say()
        try lab.setLoss(0.05)
        var phases: [Transport: Int] = [:]
        for transport in [Transport.tcp, .ws, .udp] {
            let serverTrace = ServerTrace()
            defer { serverTrace.remove() }
            let child = try lab.start(
                in: lab.serverNamespace,
                [
                    "serve", "\(transport)://\(lab.serverAddress):0", "--backend", backend.rawValue,
                    "--exit-on-stdin-eof", "--quiet", "--trace", serverTrace.path,
                ])
            var stopped = false
            defer { if !stopped { NetworkLab.stop(child) } }
            let url = String(child.readLine().dropFirst("listening on ".count))
            let json = try lab.runToEnd(
                in: lab.clientNamespace, ["lesson-probe", "ordering-\(transport)", url, "--backend", backend.rawValue])
            let result = try JSONDecoder().decode(LessonProbe.Result.self, from: Data(json.utf8))
            NetworkLab.stop(child)
            stopped = true
            let name = transport == .ws ? "WebSocket" : transport.rawValue.uppercased()
            let phase = out.trace.phase("\(name), 5% of packets dropped", transport)
            phases[transport] = phase
            out.trace.replay(
                result.observations + serverTrace.observations(), into: phase, byteStream: transport.isByteStream)
            out.say(
                "\(name): \(result.delivered)/\(result.sent) delivered, \(result.outOfOrder) out of order; round trip p50 \(roundTrip(result.p50us)), max \(fixed(result.maxus / 1000, 1)) ms; \(result.delayedOver10ms) message(s) took over 1 ms."
            )
            // Show the stretch around the worst delay (TCP, WebSocket) or the first loss (UDP).
            let values = result.perMessageMicroseconds
            let worst = values.indices.max { values[$0] < values[$1] } ?? 0
            let trouble = transport != .udp ? worst : (values.firstIndex { $0 < 0 } ?? 0)
            let from = max(0, min(trouble - 5, values.count - 30))
            out.say(
                "     messages \(from)-\(from + 29), round trip in ms (- = lost): "
                    + result.perMessageMicroseconds[from..<min(result.perMessageMicroseconds.count, from + 30)].map {
                        $0 < 0 ? "-" : fixed($0 / 1000, 1)
                    }.joined(separator: " "))
            out.figure("\(transport).delivered", Double(result.delivered))
            out.figure("\(transport).sent", Double(result.sent))
            out.figure("\(transport).outOfOrder", Double(result.outOfOrder))
            out.figure("\(transport).delayedOver10ms", Double(result.delayedOver10ms))
            out.figure("\(transport).maxus", result.maxus)
            if transport != .udp { out.figure("\(transport).retransmits", Double(result.retransmittedSegments)) }
        }
        out.say()
        let retransmits = Int(
            (out.report.figures["tcp.retransmits"] ?? 0) + (out.report.figures["ws.retransmits"] ?? 0))
        let tcpMax = (out.report.figures["tcp.maxus"] ?? 0) / 1000
        let wsMax = (out.report.figures["ws.maxus"] ?? 0) / 1000
        let slowest = "TCP \(fixed(tcpMax, 1)) ms, WebSocket \(fixed(wsMax, 1)) ms"
        out.say("Why: TCP delivers bytes in order. When one segment is lost, the ones after it arrive but wait in the")
        out.say("receiver's buffer until the lost one is retransmitted: every message behind the hole is delayed")
        out.say("together (head-of-line blocking), a run of slow messages. A WebSocket is framed on one TCP")
        out.say("connection: its messages wait behind the same holes, message boundaries or not.")
        if retransmits == 0 {
            out.say("Here no TCP or WebSocket segment happened to be dropped (0 retransmitted; slowest round trips:")
            out.say("\(slowest)), so no hole showed in this run: run it again to see one.")
        } else if max(tcpMax, wsMax) >= 100 {
            out.say(
                "Here \(retransmits) segment(s) were retransmitted and a retransmission timeout fired (slowest round trips: \(slowest); Linux waits at least 200 ms)",
                pointingAt: phases[.tcp])
            out.say("and every message sent meanwhile queued behind the hole: one lost segment, a long run.")
        } else {
            out.say(
                "Here \(retransmits) segment(s) were retransmitted, and Linux noticed each hole within a few milliseconds (duplicate ACKs, RACK; slowest round trips:",
                pointingAt: phases[.tcp])
            out.say("\(slowest)), so the runs are short; on a real network each lasts at least a round trip, or")
            out.say("200 ms and more when the retransmission timeout has to fire.")
        }
        out.say(
            "UDP hands each datagram over as it arrives: a lost one is a gap, and the others are not delayed by it.")
        sayOrderVerdict(out, udpPhase: phases[.udp])
        out.say(
            "Protocols that need both reliability and independence (QUIC, SCTP) retransmit per stream or per message.")
        return out.report
    }

    /// A round trip in microseconds, in us below a millisecond and in ms above.
    private static func roundTrip(_ microseconds: Double) -> String {
        microseconds < 1000 ? "\(fixed(microseconds, 0)) us" : "\(fixed(microseconds / 1000, 1)) ms"
    }

    /// Says which version runs and why.
    private static func sayRelay(_ out: LessonOutput, _ reason: String?) {
        out.say(
            "Faults from a user-space relay (Relay, as `sockbench proxy`) between client and echo server, no root needed"
                + (reason.map { "; the network-namespace version needs more: \($0)." } ?? " (--faults relay)."))
        out.figure("relay", 1)
    }

    /// The loss lesson without root: the relay drops datagrams on their way to the server.
    static func lossThroughRelay(
        _ backend: Backend, _ out: LessonOutput, _ reason: String?
    ) async throws
        -> LessonReport
    {
        sayRelay(out, reason)
        out.say("Client, relay and echo server on loopback, \(backend) backend; the relay drops each datagram going to")
        out.say("the server with probability P (seeded, so a run can be repeated).")
        out.say()
        var phases: [Int] = []
        for probability in [0.01, 0.05, 0.20] {
            let phase = out.trace.phase("UDP through the relay, \(Int(probability * 100))% dropped", .udp)
            phases.append(phase)
            let path = try await RelayedEcho.start(
                out, backend, .udp, phase: phase, toUpstream: .with { $0.loss = probability }, seed: 7)
            let result = try await LessonProbe.udpLoss(backend, path.endpoint, wrap: path.traced)
            await path.stop()
            let relay = path.relay
            let percent = Int(probability * 100)
            let lost = result.sent - result.delivered
            out.say(
                "UDP at \(percent)% loss: \(result.sent) datagrams, \(result.delivered) came back, \(lost) lost (\(fixed(Double(lost) * 100 / Double(max(1, result.sent)), 1))%); the relay dropped \(relay.statistics.dropped)."
            )
            out.figure("udp.\(percent).sent", Double(result.sent))
            out.figure("udp.\(percent).delivered", Double(result.delivered))
            out.figure("udp.\(percent).dropped", Double(relay.statistics.dropped))
        }
        out.say()
        out.say(
            "Why: UDP does not retransmit: a dropped datagram is gone, and about P of them are (the relay's count and")
        out.say("the client's agree). TCP is not shown here: a relay in user space reads bytes the kernel has already")
        out.say("delivered reliably, so it cannot lose a segment, only stall or corrupt the stream (`sockbench proxy`")
        out.say(
            "refuses --loss for tcp). To see TCP retransmit under loss, run this lesson as root (--faults namespaces):")
        out.say("the kernel then drops real packets between two network namespaces.")
        sayLossVerdict(out, relay: true, phase: phases.last)
        return out.report
    }

    /// The ordering lesson without root: the relay delays every message by a random 0-8 ms, in order for TCP (a
    /// byte stream cannot overtake itself), each on its own for UDP.
    static func orderingThroughRelay(
        _ backend: Backend, _ out: LessonOutput, _ reason: String?
    ) async throws
        -> LessonReport
    {
        sayRelay(out, reason)
        var phases: [Transport: Int] = [:]
        out.say(
            "300 numbered messages, in bursts of 10 a millisecond apart, to an echo server through a relay that holds")
        out.say(
            "each chunk, WebSocket message or datagram for a random 0-8 ms on its way to the server (\(backend) backend)."
        )
        out.say("Each message's round trip is timed.")
        out.say()
        for transport in [Transport.tcp, .ws, .udp] {
            let name = transport == .ws ? "WebSocket" : transport.rawValue.uppercased()
            let phase = out.trace.phase("\(name) through the relay (0-8 ms each)", transport)
            phases[transport] = phase
            let path = try await RelayedEcho.start(
                out, backend, transport, phase: phase,
                toUpstream: .with {
                    $0.jitter = .milliseconds(8)
                    $0.reorder = transport == .udp
                }, seed: 7)
            let result = try await LessonProbe.ordering(backend, path.endpoint, wrap: path.traced)
            await path.stop()
            let values = result.perMessageMicroseconds.filter { $0 >= 0 }.sorted()
            let median = values.isEmpty ? 0 : values[values.count / 2]
            out.say(
                "\(name): \(result.delivered)/\(result.sent) delivered, \(result.outOfOrder) out of order; round trip p50 \(fixed(median / 1000, 1)) ms, max \(fixed(result.maxus / 1000, 1)) ms."
            )
            out.say(
                "     messages 0-29, round trip in ms: "
                    + result.perMessageMicroseconds.prefix(30).map { $0 < 0 ? "-" : fixed($0 / 1000, 1) }.joined(
                        separator: " "))
            out.figure("\(transport).delivered", Double(result.delivered))
            out.figure("\(transport).sent", Double(result.sent))
            out.figure("\(transport).outOfOrder", Double(result.outOfOrder))
            out.figure("\(transport).p50us", median)
        }
        out.say()
        let tcpOut = Int(out.report.figures["tcp.outOfOrder"] ?? 0)
        let wsOut = Int(out.report.figures["ws.outOfOrder"] ?? 0)
        let udpOut = Int(out.report.figures["udp.outOfOrder"] ?? 0)
        let tcpMedian = (out.report.figures["tcp.p50us"] ?? 0) / 1000
        let wsMedian = (out.report.figures["ws.p50us"] ?? 0) / 1000
        let udpMedian = (out.report.figures["udp.p50us"] ?? 0) / 1000
        out.say(
            "Measured: TCP kept order (\(tcpOut) of 300 out of order), WebSocket too (\(wsOut)), UDP did not (\(udpOut) of 300 overtaken or overtaking); median round trip TCP \(fixed(tcpMedian, 1)) ms, WebSocket \(fixed(wsMedian, 1)) ms, UDP \(fixed(udpMedian, 1)) ms."
        )
        out.say()
        out.say(
            "Why: TCP delivers bytes in order, so a chunk the relay holds holds back every byte behind it, even bytes")
        out.say(
            "that were ready sooner: round trips come in runs (the messages of a burst travel in one chunk and share")
        out.say("its wait, and a chunk cannot leave before the one ahead of it). That is head-of-line blocking. A")
        out.say("WebSocket carries whole messages, but in order on one TCP connection, so each message waits for the")
        out.say("one ahead of it just the same. UDP datagrams are independent: one held longer is overtaken, and the")
        out.say("others arrive after their own delay.")
        sayOrderVerdict(out, udpPhase: phases[.udp])
        if tcpMedian > udpMedian * 1.1 {
            out.say("Here, waiting in order cost TCP \(fixed(tcpMedian - udpMedian, 1)) ms at the median over UDP.")
        } else if udpMedian > tcpMedian * 1.1 {
            out.say(
                "Here UDP's median came out higher: the relay handles each datagram on its own, while a TCP burst moves"
            )
            out.say("as one chunk, so this run does not show the cost of order at the median; the runs above show it.")
        } else {
            out.say(
                "Here the medians are close: with delays this even, waiting for the chunk ahead rarely costs more than")
            out.say(
                "a chunk's own delay. Over a lossy path (--faults namespaces, as root) a hole costs a retransmission.")
        }
        return out.report
    }

    /// The ordering lesson's "Here" line on order itself: TCP and WebSocket must deliver every message in order;
    /// UDP's datagrams may overtake each other (through the relay's delays) or go missing (with loss).
    private static func sayOrderVerdict(_ out: LessonOutput, udpPhase: Int? = nil) {
        let figures = out.report.figures
        let inOrder = [Transport.tcp, .ws].allSatisfy {
            figures["\($0).outOfOrder"] == 0 && figures["\($0).delivered"] == figures["\($0).sent"]
        }
        let udpOut = Int(figures["udp.outOfOrder"] ?? 0)
        let udpLost = Int((figures["udp.sent"] ?? 0) - (figures["udp.delivered"] ?? 0))
        if !inOrder {
            out.say(
                "Here TCP or WebSocket did NOT deliver all 300 in order: that breaks their promise; see the lines above."
            )
        } else if udpOut > 0 || udpLost > 0 {
            out.say(
                "Here TCP and WebSocket delivered all 300 in order, and UDP held nothing back: \(udpOut) datagram(s) arrived out of order, \(udpLost) were lost.",
                pointingAt: udpPhase)
        } else {
            out.say("Here TCP and WebSocket delivered all 300 in order, and so did UDP this time: no datagram was lost")
            out.say("or overtaken, which UDP allows but does not promise.")
        }
    }
}
