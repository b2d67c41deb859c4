import BenchmarkDriver
import Histogram
import POSIXSupport
import SocketStyles

extension Lesson {
    /// Write-write-read with and without TCP_NODELAY.
    static let nagle = Lesson(
        name: "nagle",
        summary: "write-write-read with TCP_NODELAY off and on: the Nagle / delayed-ACK stall appears and disappears"
    ) { backend, print in
        let out = LessonOutput("nagle", print)
        let rounds = 20
        let shown = 3
        out.say("A client sends a request as two small writes (a 40-byte header, then a 60-byte body) and waits for")
        out.say(
            "a 1-byte reply; the server replies once it has all 100 bytes. \(rounds) requests each way (\(backend)),")
        out.say("timed; then \(shown) more, untimed, reading the kernel's view of the connection after each write.")
        out.say()
        var phases: [Int] = []
        for noDelay in [false, true] {
            let options = ConnectionOptions.with { $0.tcpNoDelay = noDelay }
            let phase = out.trace.phase("TCP_NODELAY \(noDelay ? "on" : "off")", .tcp)
            phases.append(phase)
            let listener = try await backend.listen(on: loopback(.tcp), options: options)
            let connection = try await backend.connect(to: listener.localEndpoint, options: options)
            let client = out.trace.trace(connection, side: .client, phase: phase)
            let server = out.trace.trace(try await listener.accept(), side: .server, phase: phase)
            let serving = Task {
                while let request = try? await server.receive(exactly: 100), request.count == 100 {
                    try? await server.send([1])
                }
            }
            var histogram = LatencySummary.makeHistogram()
            for _ in 0..<rounds {
                let start = MonotonicClock.nanoseconds()
                try await client.send([UInt8](repeating: 1, count: 40))
                try await client.send([UInt8](repeating: 2, count: 60))
                _ = try await client.receive(exactly: 1)
                _ = histogram.record(max(1, MonotonicClock.nanoseconds() - start))
            }
            // Then `shown` more, untimed, with the kernel's view read after each write: reading it takes tens of
            // microseconds, which the timed requests above must not include.
            let sampled = out.trace.trace(connection, side: .client, phase: phase, kernel: .afterSends)
            for _ in 0..<shown {
                try await sampled.send([UInt8](repeating: 1, count: 40))
                try await sampled.send([UInt8](repeating: 2, count: 60))
                _ = try await sampled.receive(exactly: 1)
            }
            await client.close()
            await server.close()
            await listener.close()
            _ = await serving.value
            let summary = LatencySummary(histogram)
            out.say(
                "TCP_NODELAY \(noDelay ? "on " : "off"): request p50 \(readable(summary.p50)), max \(readable(summary.max))"
            )
            out.figure("nodelay.\(noDelay ? "on" : "off").p50us", Double(summary.p50) / 1000)
            out.figure("nodelay.\(noDelay ? "on" : "off").maxus", Double(summary.max) / 1000)
        }
        out.say()
        out.say("Why: with Nagle's algorithm (TCP_NODELAY off) a small write is held back while earlier data is not")
        out.say("yet acknowledged. The body waits for the ACK of the header; the server delays that ACK (hoping to")
        out.say("piggyback it on a reply it cannot send yet, since it has only half the request). Each side waits")
        out.say("for the other until the delayed-ACK timer fires, tens of milliseconds later. TCP_NODELAY sends")
        out.say("the body at once. Better still: one write per request.")
        // What the kernel said after each write (TCP_INFO): a body it kept unsent is Nagle holding it back.
        let events = out.report.events
        for (phase, setting) in zip(phases, ["off", "on"]) {
            let held = events.filter {
                $0.phase == phase && $0.kind == .kernel && $0.text?.contains("not sent") == true
            }
            out.figure("nodelay.\(setting).heldBackWrites", Double(held.count))
        }
        let heldOff = Int(out.report.figures["nodelay.off.heldBackWrites"] ?? 0)
        let heldOn = Int(out.report.figures["nodelay.on.heldBackWrites"] ?? 0)
        out.say(
            "Here the kernel kept a write unsent right after it was made \(heldOff) time(s) of \(shown * 2) with TCP_NODELAY off, \(heldOn) with it on (TCP_INFO's notsent bytes: the grey squares in the picture).",
            pointingAt: phases[0])
        let off = out.report.figures["nodelay.off.p50us"] ?? 0
        let on = out.report.figures["nodelay.on.p50us"] ?? 0
        if off >= 5_000 && off >= 10 * on {
            out.say(
                "Here the stall showed: \(fixed(off / 1000, 1)) ms at the median with TCP_NODELAY off, \(fixed(on / 1000, 2)) ms with it on: in the picture, the gap before each 60-byte body arrives.",
                pointingAt: phases[0])
        } else {
            out.say(
                "Here the stall did not show (median \(fixed(off / 1000, 2)) ms off, \(fixed(on / 1000, 2)) ms on): in the picture, each body arrives at once. Nagle holds a write back",
                pointingAt: phases[0])
            out.say("only while earlier data is unacknowledged, so either the header's ACK came back before the body")
            out.say("was written (Linux acknowledges at once while in its quick-ACK mode) or both writes left in one")
            out.say("segment. Timing decides which; run it again, or with another backend, to see the stall.")
        }
        return out.report
    }
}

/// Microseconds below 10 ms, milliseconds above.
func readable(_ nanoseconds: UInt64) -> String {
    nanoseconds >= 10_000_000 ? fixed(Double(nanoseconds) / 1e6, 1) + " ms" : microseconds(nanoseconds) + " us"
}
