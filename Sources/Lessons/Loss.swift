import BenchmarkDriver
import Foundation
import POSIXSupport
import SocketStyles

extension Lesson {
    /// Real kernel packet loss between two namespaces.
    static let loss = Lesson(
        name: "loss",
        summary: "real packet loss (1%, 5%, 20%) between two network namespaces: UDP loses that share, TCP retransmits"
    ) { backend, print in
        let out = LessonOutput("loss", print)
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
        for transport in [Transport.udp, .tcp] {
            let child = try lab.start(
                in: lab.serverNamespace,
                [
                    "serve", "\(transport)://\(lab.serverAddress):0", "--backend", backend.rawValue,
                    "--exit-on-stdin-eof",
                ])
            defer { NetworkLab.stop(child) }
            let url = String(child.readLine().dropFirst("listening on ".count))
            for probability in [0.01, 0.05, 0.20] {
                try lab.setLoss(probability)
                let json = try lab.runToEnd(
                    in: lab.clientNamespace,
                    ["lesson-probe", transport == .udp ? "udp-loss" : "tcp-rtt", url, "--backend", backend.rawValue])
                let result = try JSONDecoder().decode(LessonProbe.Result.self, from: Data(json.utf8))
                let percent = Int(probability * 100)
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
                }
            }
            try lab.setLoss(0)
        }
        out.say()
        out.say("Why: UDP does not retransmit: a dropped datagram is gone, and about P of them are. TCP numbers every")
        out.say("byte, and the receiver acknowledges what it got; a segment that is not acknowledged is sent again")
        out.say("after a retransmission timeout (at least 200 ms on Linux) or after three duplicate ACKs. So every")
        out.say("byte arrives, but the round trips that met a loss take hundreds of milliseconds: the loss moved from")
        out.say("the data into the tail latency (p99, max).")
        return out.report
    }

    /// Head-of-line blocking.
    static let ordering = Lesson(
        name: "ordering",
        summary: "head-of-line blocking under 5% loss: one lost TCP segment delays every message behind it"
    ) { backend, print in
        let out = LessonOutput("ordering", print)
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
        for transport in [Transport.tcp, .udp] {
            let child = try lab.start(
                in: lab.serverNamespace,
                [
                    "serve", "\(transport)://\(lab.serverAddress):0", "--backend", backend.rawValue,
                    "--exit-on-stdin-eof",
                ])
            defer { NetworkLab.stop(child) }
            let url = String(child.readLine().dropFirst("listening on ".count))
            let json = try lab.runToEnd(
                in: lab.clientNamespace, ["lesson-probe", "ordering-\(transport)", url, "--backend", backend.rawValue])
            let result = try JSONDecoder().decode(LessonProbe.Result.self, from: Data(json.utf8))
            let name = transport.rawValue.uppercased()
            out.say(
                "\(name): \(result.delivered)/\(result.sent) delivered, \(result.outOfOrder) out of order; round trip p50 \(fixed(result.p50us, 0)) us, max \(fixed(result.maxus / 1000, 1)) ms; \(result.delayedOver10ms) message(s) took over 1 ms."
            )
            // Show the stretch around the worst delay (TCP) or the first loss (UDP).
            let values = result.perMessageMicroseconds
            let worst = values.indices.max { values[$0] < values[$1] } ?? 0
            let trouble = transport == .tcp ? worst : (values.firstIndex { $0 < 0 } ?? 0)
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
        }
        out.say()
        out.say("Why: TCP delivers bytes in order. When one segment is lost, the ones after it arrive but wait in the")
        out.say("receiver's buffer until the lost one is retransmitted: every message behind the hole is delayed")
        out.say("together (head-of-line blocking), a run of slow messages. Here the path is so short that Linux")
        out.say("notices the hole within a millisecond or two (duplicate ACKs, RACK) and the runs are short; on a")
        out.say(
            "real network each run lasts at least a round trip, or 200 ms when the timeout has to fire. UDP hands each datagram over as it"
        )
        out.say("arrives: a lost one is a gap, and the others are not delayed by it. Protocols that need both")
        out.say("reliability and independence (QUIC, SCTP) retransmit per stream or per message.")
        return out.report
    }
}
