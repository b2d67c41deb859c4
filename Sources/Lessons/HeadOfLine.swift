import BenchmarkDriver
import ConnectionCore
import ConnectionTestKit
import Foundation
import POSIXSupport
import SocketStyles
import Synchronization

extension Lesson {
    /// The same numbered messages over tcp, ws and udp, one of them held back by the relay.
    static let headOfLine = Lesson(
        name: "headofline",
        summary:
            "one late message, the same on tcp, ws and udp (a relay holds it): TCP and WebSocket deliver every later message behind it; UDP only that one is late"
    ) { backend, print in
        let out = LessonOutput("headofline", print)
        let count = 20
        let size = 16
        let late = 5
        let hold = Duration.milliseconds(60)
        let spacing = Duration.milliseconds(2)
        out.say(
            "\(count) numbered messages of \(size) bytes, one every \(LessonPage.duration(Double(spacing.wholeNanoseconds) / 1000)), to an echo server through a relay"
        )
        out.say(
            "(as `sockbench proxy --hold \(late * size):\(hold.wholeNanoseconds / 1_000_000)`) that holds message #\(late) for \(LessonPage.duration(Double(hold.wholeNanoseconds) / 1000)) on its way; every other message"
        )
        out.say("passes at once. The same stream over TCP, WebSocket and UDP, \(backend) backend, no root needed.")
        out.say("Each echo's arrival is timed; \"waited\" is its round trip minus the median of #0-#\(late - 1)'s.")
        out.say()
        var phases: [Transport: Int] = [:]
        var waits: [Transport: [Double]] = [:]
        for transport in [Transport.tcp, .ws, .udp] {
            let name = transport == .ws ? "WebSocket" : transport.rawValue.uppercased()
            let phase = out.trace.phase(
                "\(name): #\(late) held \(LessonPage.duration(Double(hold.wholeNanoseconds) / 1000))", transport)
            phases[transport] = phase
            let path = try await RelayedEcho.start(
                out, backend, transport, phase: phase,
                toUpstream: .with {
                    $0.hold = .init(byte: late * size, duration: hold)
                    // Datagrams are independent: the held one must not hold the others (tcp and ws keep order).
                    $0.reorder = transport == .udp
                })
            let run = try await Self.holdRun(
                path.traced(try await backend.connect(to: path.endpoint)), count: count, size: size,
                spacing: spacing, clock: out.trace)
            out.trace.mark(phase, .between, "relay held #\(late)", at: run.sentAt[late])
            out.trace.annotate(
                phase, from: .client, number: late,
                "held \(LessonPage.duration(Double(hold.wholeNanoseconds) / 1000)) by the relay")
            await path.stop()
            let held = path.relay.statistics.held
            // Arrival order: which later messages came back after the held one, and which before it.
            let lateArrival = run.arrivedAt[late]
            let later = (late + 1)..<count
            let heldSent = later.filter { index in lateArrival.map { run.sentAt[index] < $0 } ?? false }
            let behind = heldSent.filter { (run.arrivedAt[$0] ?? .infinity) > (lateArrival ?? .infinity) }.count
            let overtook = heldSent.filter { (run.arrivedAt[$0] ?? .infinity) < (lateArrival ?? 0) }.count
            let roundTrips = (0..<count).map { index in run.arrivedAt[index].map { $0 - run.sentAt[index] } }
            let baseline = median((0..<late).compactMap { roundTrips[$0] })
            let waited = roundTrips.map { $0.map { max(0, $0 - baseline) } ?? -1 }
            waits[transport] = waited
            let missing = roundTrips.filter { $0 == nil }.count
            out.say(
                "\(name): relay held \(held) message(s); #\(late) came back after \(LessonPage.duration(roundTrips[late] ?? 0)); of the \(heldSent.count) sent while it was held, \(behind) came back after it, \(overtook) before it\(missing > 0 ? "; \(missing) never came back" : "")."
            )
            out.figure("\(transport).held", Double(held))
            out.figure("\(transport).sentWhileHeld", Double(heldSent.count))
            out.figure("\(transport).behind", Double(behind))
            out.figure("\(transport).overtook", Double(overtook))
            out.figure("\(transport).lateWaitedUs", waited[late])
            out.figure(
                "\(transport).laterWaitedMedianUs", median(heldSent.map { waited[$0] }.filter { $0 >= 0 }))
            out.figure("\(transport).laterWaitedMaxUs", heldSent.map { waited[$0] }.max() ?? 0)
            out.figure("\(transport).missing", Double(missing))
        }
        out.say()
        out.say("How long each message waited, in ms (round trip minus the usual), side by side:")
        out.say("  #    TCP     WebSocket  UDP")
        for index in 0..<count {
            let cells = [Transport.tcp, .ws, .udp].map { transport -> String in
                let value = waits[transport]?[index] ?? -1
                let text = value < 0 ? "-" : fixed(value / 1000, 1)
                return text.padding(toLength: 10, withPad: " ", startingAt: 0)
            }
            out.say(
                "  \(String(index).padding(toLength: 4, withPad: " ", startingAt: 0)) \(cells.joined(separator: " "))")
        }
        out.say()
        out.say("Why: TCP delivers one ordered stream of bytes. The bytes of every message after #\(late) reached the")
        out.say("relay in time, but a byte stream cannot hand over byte N+1 before byte N: they wait for #\(late), and")
        out.say("arrive together just after it (head-of-line blocking; in the kernel, a lost segment does the same")
        out.say("until it is retransmitted). A WebSocket's messages are framed, but they ride one TCP connection in")
        out.say("order: the same wait. UDP datagrams are independent: #\(late) arrives late, and every other datagram")
        out.say("arrives on its own time. That independence is what QUIC gives each of its streams.")
        let figures = out.report.figures
        for transport in [Transport.tcp, .ws] {
            let name = transport == .ws ? "WebSocket" : "TCP"
            let sentWhileHeld = Int(figures["\(transport).sentWhileHeld"] ?? 0)
            let behind = Int(figures["\(transport).behind"] ?? 0)
            if sentWhileHeld > 0 && behind == sentWhileHeld {
                out.say(
                    "Here every one of the \(sentWhileHeld) \(name) messages sent while #\(late) was held came back after it (waiting \(fixed((figures["\(transport).laterWaitedMedianUs"] ?? 0) / 1000, 1)) ms at the median): in the picture, their arrows end together below #\(late)'s.",
                    pointingAt: phases[transport])
            } else {
                out.say(
                    "Here \(behind) of the \(sentWhileHeld) \(name) messages sent while #\(late) was held came back after it: that is NOT what an ordered stream does; see the lines above.",
                    pointingAt: phases[transport])
            }
        }
        let udpSent = Int(figures["udp.sentWhileHeld"] ?? 0)
        let udpOvertook = Int(figures["udp.overtook"] ?? 0)
        if udpSent > 0 && udpOvertook > 0 {
            out.say(
                "Here \(udpOvertook) of the \(udpSent) UDP datagrams sent while #\(late) was held came back before it: only #\(late) was late (in the picture, its arrow alone crosses the others).",
                pointingAt: phases[.udp])
            let most = (figures["udp.laterWaitedMaxUs"] ?? 0) / 1000
            if most >= 1 {
                out.say(
                    "     The most any of them waited was \(fixed(most, 1)) ms, not #\(late)'s \(LessonPage.duration(Double(hold.wholeNanoseconds) / 1000)): the relay held only #\(late) (its count"
                )
                out.say(
                    "     says \(Int(figures["udp.held"] ?? 0))); the rest is this machine scheduling client, relay and server, which share one process here."
                )
            }
        } else {
            out.say(
                "Here no UDP datagram overtook #\(late) (\(udpSent) were sent while it was held): the machine was too slow for the timing this lesson needs; run it again.",
                pointingAt: phases[.udp])
        }
        return out.report
    }

    /// Sends `count` numbered messages `spacing` apart and times each echo: when each was sent and came back
    /// (microseconds since the lesson began, on `clock`; `nil`: never, within a second of the last send).
    static func holdRun(
        _ connection: any Connection, count: Int, size: Int, spacing: Duration, clock: LessonTrace
    ) async throws -> (sentAt: [Double], arrivedAt: [Double?]) {
        let arrivals = Guarded([Double?](repeating: nil, count: count))
        let stream = connection.transport.isByteStream
        let reader = Task {
            var seen = 0
            while seen < count {
                let bytes: [UInt8]
                if stream {
                    guard let record = try? await connection.receive(exactly: size) else { return }
                    bytes = record
                } else {
                    guard let message = try? await connection.receive() else { return }
                    bytes = message.bytes
                }
                let now = clock.now()
                guard let number = LessonTrace.leadingNumber(bytes), number < count else { continue }
                arrivals.withLock { $0[number] = now }
                seen += 1
            }
        }
        var sentAt: [Double] = []
        for number in 0..<count {
            var record = [UInt8](repeating: 0, count: size)
            record.withUnsafeMutableBytes { $0.storeBytes(of: UInt32(number), as: UInt32.self) }
            sentAt.append(clock.now())
            try await connection.send(record)
            try await Task.sleep(for: spacing)
        }
        // Everything comes back within the hold; a datagram may not (bounded wait).
        _ = try await withDeadline(.seconds(2)) { await reader.value }
        reader.cancel()
        await connection.close()
        _ = await reader.value
        return (sentAt, arrivals.withLock { $0 })
    }
}

/// The median of `values` (0 when empty).
func median(_ values: [Double]) -> Double {
    guard !values.isEmpty else { return 0 }
    let sorted = values.sorted()
    return sorted[sorted.count / 2]
}
