import ConnectionTestKit
import Foundation
import POSIXSupport
import SocketStyles

extension Lesson {
    /// Datagram sizes around the limits.
    static let mtu = Lesson(
        name: "mtu",
        summary: "UDP datagram sizes around 1472 and 65507 bytes, EMSGSIZE, and what TCP does with the same bytes"
    ) { backend, print in
        let out = LessonOutput("mtu", print)
        let udpPhase = out.trace.phase("UDP: one datagram of each size", .udp)
        let server = try await EchoServerHandle.start(backend, .udp, traced: (out.trace, udpPhase))
        let client = out.trace.trace(try await backend.connect(to: server.endpoint), side: .client, phase: udpPhase)
        out.say("Sending single UDP datagrams of growing size over loopback (MTU 65536) with the \(backend) backend:")
        for size in [1, 1472, 1473, 9000, 65_507, 65_508, 70_000] {
            do {
                try await client.send([UInt8](repeating: 7, count: size))
                let echoed = try await withDeadline(.seconds(1)) { try await client.receive() }
                let got = echoed??.count
                out.say(
                    "  \(grouped(size).padding(toLength: 7, withPad: " ", startingAt: 0)) bytes: sent; echoed back \(got.map { "whole (\(grouped($0)) bytes)" } ?? "NOT (lost)")"
                )
                out.figure("udp.\(size)", got == size ? 1 : 0)
            } catch let error as ConnectionError {
                out.say(
                    "  \(grouped(size).padding(toLength: 7, withPad: " ", startingAt: 0)) bytes: refused by the kernel: \(error.kind) [\(error.systemCode?.name ?? "-")]"
                )
                out.figure("udp.\(size)", error.kind == .messageTooLarge ? -1 : -2)
                out.trace.mark(
                    udpPhase, .client, "\(grouped(size)) B refused: \(error.systemCode?.name ?? "\(error.kind)")")
            }
        }
        await client.close()
        await server.stop()

        let tcpPhase = out.trace.phase("TCP: one send of 70,000 B", .tcp)
        let tcpServer = try await EchoServerHandle.start(backend, .tcp, traced: (out.trace, tcpPhase))
        let tcpClient = out.trace.trace(
            try await backend.connect(to: tcpServer.endpoint), side: .client, phase: tcpPhase)
        let size = 70_000
        try await tcpClient.send([UInt8](repeating: 7, count: size))
        var receives = 0
        var total = 0
        while total < size, let message = try await tcpClient.receive() {
            receives += 1
            total += message.count
        }
        await tcpClient.close()
        await tcpServer.stop()
        out.say(
            "TCP with the same 70,000 bytes: one send, echoed back in \(receives) receive(s), all \(grouped(total)) bytes."
        )
        out.figure("tcp.70000.bytes", Double(total))
        out.say()
        out.say("Why: an IPv4 UDP datagram carries at most 65,507 bytes (65,535 minus 20 of IP header and 8 of UDP")
        out.say("header); a larger send fails at once with EMSGSIZE. Below that, a datagram bigger than the path's")
        out.say("MTU (1,500 on Ethernet, so 1,472 bytes of payload) is split into IP fragments; losing any fragment")
        out.say("loses the whole datagram, which is why protocols keep datagrams under ~1,400 bytes. Loopback's MTU")
        out.say("is 65,536, so here nothing fragments. TCP has no message size: it cuts the stream into segments")
        out.say("that fit the path and the receiver reassembles the bytes.")
        // What this run showed, against that explanation.
        let figures = out.report.figures
        let atLimit = figures["udp.65507"] == 1
        let overLimit = figures["udp.65508"] == -1
        if atLimit && overLimit {
            out.say(
                "Here 65,507 bytes went and came back whole, and 65,508 were refused at once: the limit, exactly.",
                pointingAt: udpPhase)
        } else {
            out.say(
                "Here the limit did not show as described: 65,507 bytes \(atLimit ? "came back whole" : "did NOT come back whole"), 65,508 were \(overLimit ? "refused" : "NOT refused with EMSGSIZE")."
            )
        }
        let lostBelow = [1, 1472, 1473, 9000].filter { figures["udp.\($0)"] != 1 }
        if !lostBelow.isEmpty {
            out.say(
                "Here \(lostBelow.map { grouped($0) }.joined(separator: ", ")) byte datagram(s) did not come back: loopback loses nothing"
            )
            out.say("by itself, so the echo server or its receive queue dropped them (a busy machine).")
        }
        if total == size {
            out.say(
                "Here TCP carried all 70,000 bytes, cut into \(receives) receive(s) that have nothing to do with the one send.",
                pointingAt: tcpPhase)
        } else {
            out.say(
                "Here TCP returned \(grouped(total)) of 70,000 bytes before the connection ended: something went wrong."
            )
        }
        return out.report
    }
}
