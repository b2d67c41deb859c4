import BenchmarkDriver
import ConnectionCore
import ConnectionTestKit
import Foundation
import POSIXSupport
import SocketStyles

extension Lesson {
    /// TCP flows sharing one bottleneck: slow start, fair shares, and the queue's delay (bufferbloat), under CUBIC
    /// and BBR.
    static let congestion = Lesson(
        name: "congestion",
        summary:
            "one, two, then four TCP flows through one 20 Mbit/s bottleneck: slow start, fair shares (Jain's index), a ping delayed by the queue; CUBIC and BBR, deep and short queues (root: namespaces)"
    ) { backend, print in
        let out = LessonOutput("congestion", print)
        if let reason = NetworkLab.unavailableReason(bottleneck: true) {
            out.say("This lesson needs three network namespaces, a router between two of them, and a rate limit with a")
            out.say("queue (tc tbf) on the router's link, and \(reason). Run it as root on Linux with iproute2.")
            out.say(
                "Without them the flows could only share loopback, which has no bottleneck but the CPU and no queue")
            out.say("that fills: no slow start against a limit, no fair share of a link, no ping delayed by a queue.")
            out.figure("skipped", 1)
            return out.report
        }
        let rate = CongestionLesson.rate
        out.say(
            "Host A sends to host B through router R, whose link toward B carries at most \(rate / 1_000_000) Mbit/s and"
        )
        out.say(
            "queues what waits (tc tbf; what finds the queue full is dropped). From A, TCP flows send as fast as they")
        out.say("can to a sink on B: flow 1 at 0 s, flow 2 at 0.5 s, flows 3 and 4 at 2.5 s, all stopping at 10.5 s;")
        out.say("a UDP ping every 10 ms beside them times the path. \(backend) backend at both ends; each flow's TCP")
        out.say("state read every 4 ms. The path has no delay of its own (veth): every millisecond of a round trip")
        out.say("past the idle one is time spent waiting in R's queue. Four such paths at once, each its own three")
        out.say("namespaces: CUBIC and BBR (set on A's route), each with a deep queue and a short one.")
        out.say()
        let configurations = ["cubic", "bbr"].flatMap { algorithm in
            CongestionLesson.Queue.allCases.map { (algorithm, $0) }
        }
        var labs: [NetworkLab] = []
        defer { for lab in labs { lab.remove() } }
        var servers: [ChildProcess] = []
        defer { for child in servers { NetworkLab.stop(child) } }
        var probes: [[String]] = []
        for (algorithm, queue) in configurations {
            let lab = try NetworkLab(routed: true)
            labs.append(lab)
            try lab.setBottleneck(bitsPerSecond: rate, queueBytes: queue.bytes)
            try lab.setCongestionControl(algorithm)
            var urls: [String] = []
            for (transport, sink) in [(Transport.tcp, true), (.udp, false)] {
                let child = try lab.start(
                    in: lab.serverNamespace,
                    [
                        "serve", "\(transport)://\(lab.serverAddress):0", "--backend", backend.rawValue,
                        "--exit-on-stdin-eof", "--quiet",
                    ] + (sink ? ["--sink"] : []))
                servers.append(child)
                urls.append(String(child.readLine().dropFirst("listening on ".count)))
            }
            probes.append(["lesson-probe", "congestion", urls[0], "--backend", backend.rawValue, "--ping", urls[1]])
        }
        // The four paths at once, each probe waited for on a thread of its own.
        let outputs = try await withThrowingTaskGroup(of: (Int, String).self) { group in
            for (index, lab) in labs.enumerated() {
                let arguments = probes[index]
                group.addTask { (index, try await blocking { try lab.runToEnd(in: lab.clientNamespace, arguments) }) }
            }
            var outputs = [String](repeating: "", count: labs.count)
            for try await (index, output) in group { outputs[index] = output }
            return outputs
        }
        var results: [CongestionLesson.Result] = []
        for (index, (_, queue)) in configurations.enumerated() {
            let run = try JSONDecoder().decode(CongestionProbe.Run.self, from: Data(outputs[index].utf8))
            let phase = out.trace.phase("\(run.algorithm.uppercased()), \(queue.title)", .tcp)
            let result = CongestionLesson.Result(run: run, queue: queue, phase: phase)
            result.record(out)
            results.append(result)
        }
        out.say()
        CongestionLesson.explain(results, out)
        return out.report
    }
}

/// The congestion lesson's measures, taken from one run of ``CongestionProbe``.
enum CongestionLesson {
    /// The bottleneck's rate, bits a second.
    static let rate = 20_000_000
    /// The window over which the flows' shares are compared, microseconds: a second, several of CUBIC's cycles of
    /// growth and loss here, so that an index of 1 means equal shares, not flows caught at the same point.
    static let window = 1_000_000.0
    /// How long after flows 3 and 4 join the lesson looks for the four flows' index to reach 0.9, milliseconds:
    /// until they stop.
    static let fairWithin = (CongestionProbe.end - (CongestionProbe.joins.last ?? 0)) / 1000

    enum Queue: String, CaseIterable {
        case deep, short

        /// Bytes the bottleneck's queue holds.
        var bytes: Int { self == .deep ? 250_000 : 30_000 }

        var title: String {
            let drain = Double(bytes) * 8 / Double(CongestionLesson.rate) * 1000
            return "\(self == .deep ? "deep" : "short") queue (\(grouped(bytes)) B, \(fixed(drain, 0)) ms to drain)"
        }
    }

    struct Result {
        let run: CongestionProbe.Run
        let queue: Queue
        let phase: Int

        var name: String { "\(run.algorithm).\(queue.rawValue)" }

        /// Bytes `flow` had acknowledged at `at` (its last reading at or before).
        func acked(_ flow: CongestionProbe.Flow, _ at: Double) -> Double {
            let samples = flow.series.samples
            var low = 0
            var high = samples.count
            while low < high {
                let middle = (low + high) / 2
                if samples[middle].at <= at { low = middle + 1 } else { high = middle }
            }
            return low == 0 ? 0 : Double(samples[low - 1].bytesAcked)
        }

        /// `flow`'s goodput over [from, to), bits a second.
        func rate(_ flow: CongestionProbe.Flow, _ from: Double, _ to: Double) -> Double {
            (acked(flow, to) - acked(flow, from)) * 8 / ((to - from) / 1e6)
        }

        /// Flows that sent over all of [from, to).
        func active(_ from: Double, _ to: Double) -> [CongestionProbe.Flow] {
            run.flows.filter { $0.joined <= from && $0.left >= to }
        }

        /// Jain's fairness index of the active flows' goodputs over [from, to): 1 when equal, 1/n when one flow has
        /// everything; `nil` with fewer than two flows.
        func jain(_ from: Double, _ to: Double) -> Double? {
            let rates = active(from, to).map { rate($0, from, to) }
            let sum = rates.reduce(0, +)
            let squares = rates.map { $0 * $0 }.reduce(0, +)
            guard rates.count >= 2, squares > 0 else { return nil }
            return sum * sum / (Double(rates.count) * squares)
        }

        /// How long after the last flow joined all the flows' shares over a second first had an index of 0.9 or
        /// more (the end of the first such window, sliding by 100 ms), milliseconds; `nil` if never before the flows
        /// stopped.
        var fairAfter: Double? {
            guard let join = run.flows.map(\.joined).max() else { return nil }
            var from = join
            while from + CongestionLesson.window <= run.end {
                if active(from, from + CongestionLesson.window).count == run.flows.count,
                    let index = jain(from, from + CongestionLesson.window), index >= 0.9
                {
                    return ((from + CongestionLesson.window - join) / 1000).rounded()
                }
                from += 100_000
            }
            return nil
        }

        /// The median ping round trip over pings sent in [from, to), microseconds (lost pings left out).
        func ping(_ from: Double, _ to: Double) -> Double {
            median(run.pings.filter { $0.at >= from && $0.at < to }.compactMap(\.rtt))
        }

        var idle: Double { ping(-CongestionProbe.idle, 0) }
        /// The four flows' index over the last second.
        var figureJain4: Double { jain(run.end - 1_000_000, run.end) ?? 0 }
        var twoFlows: Double { ping(1_500_000, 2_500_000) }
        var fourFlows: Double { ping(4_500_000, run.end) }
        var lostPings: Int { run.pings.filter { $0.at >= 0 && $0.at < run.end && $0.rtt == nil }.count }
        var retransmits: Int { run.flows.map { Int($0.series.samples.last?.retransmits ?? 0) }.reduce(0, +) }
        /// The share of the bottleneck's rate the flows used from 1 s to the end.
        var utilisation: Double {
            run.flows.map { rate($0, 1_000_000, run.end) * 1 }.reduce(0, +) / Double(CongestionLesson.rate)
        }

        /// Flow 1 alone: the window its slow start reached, when slow start ended (ssthresh first set), and whether
        /// a loss ended it (else the round trip growing did: CUBIC's HyStart). Slow start here lasts a few
        /// milliseconds, about as long as two readings apart, so the window reached is also taken from ssthresh,
        /// which the exit sets to it (HyStart) or to 70% of it (a loss): the larger of the two.
        var slowStart: (peak: Int, ended: Double, byLoss: Bool)? {
            guard let first = run.flows.first else { return nil }
            let samples = first.series.samples.filter { $0.at < CongestionProbe.joins[1] }
            guard let end = samples.firstIndex(where: { $0.slowStartThreshold != nil }),
                let threshold = samples[end].slowStartThreshold
            else { return nil }
            let byLoss = samples[end].retransmits > 0
            let before = samples[..<end].map(\.congestionWindow).max() ?? 0
            let reached = byLoss ? UInt32((Double(threshold) / 0.7).rounded()) : threshold
            return (Int(max(before, reached)), samples[end].at - first.joined, byLoss)
        }

        func record(_ out: LessonOutput) {
            let jain2 = jain(1_500_000, 2_500_000) ?? 0
            let jain4 = jain(run.end - 1_000_000, run.end) ?? 0
            let fair = fairAfter
            out.figure("\(name).jain2", jain2)
            out.figure("\(name).jain4", jain4)
            out.figure("\(name).fairAfterMs", fair ?? -1)
            out.figure("\(name).idleRttUs", idle)
            out.figure("\(name).twoFlowRttUs", twoFlows)
            out.figure("\(name).fourFlowRttUs", fourFlows)
            out.figure("\(name).lostPings", Double(lostPings))
            out.figure("\(name).retransmits", Double(retransmits))
            out.figure("\(name).utilisation", utilisation)
            // (What ssthresh says of the window is CUBIC's rule; BBR sets it otherwise.)
            if run.algorithm == "cubic", let slowStart {
                out.figure("\(name).slowStartPeakCwnd", Double(slowStart.peak))
                out.figure("\(name).slowStartEndMs", slowStart.ended / 1000)
            }
            out.say(
                "\(run.algorithm.uppercased()), \(queue.title): goodput \(Int(utilisation * 100))% of the link's rate; Jain's index \(fixed(jain2, 2)) for two flows (1.5-2.5 s), \(fixed(jain4, 2)) for four (9.5-10.5 s), \(fair.map { "0.9 reached \(Int($0)) ms after flows 3 and 4 joined" } ?? "0.9 not reached after flows 3 and 4 joined"); ping \(ms(idle)) idle, \(ms(twoFlows)) beside two flows (1.5-2.5 s), \(ms(fourFlows)) beside four (4.5-10.5 s; \(lostPings) lost); \(grouped(retransmits)) segments sent again."
            )
            out.chart(chart)
        }

        func ms(_ microseconds: Double) -> String {
            microseconds >= 10_000 ? "\(Int(microseconds / 1000)) ms" : "\(fixed(microseconds / 1000, 2)) ms"
        }

        /// The picture: each flow's goodput, the flows' fairness, their congestion windows, the round trips, and
        /// each flow's acknowledged bytes, on one time axis.
        var chart: LessonChart {
            let start = -CongestionProbe.idle
            let end = run.end + 300_000
            func flowLine(
                _ index: Int, _ flow: CongestionProbe.Flow, _ value: (LessonTCPSample) -> Double
            )
                -> LessonChart.Line
            {
                // One point each 20 ms at most (the last reading in it): the readings come every 4 ms.
                var points: [LessonChart.Point] = []
                for sample in flow.series.samples {
                    let point = LessonChart.Point(at: sample.at, value: value(sample))
                    if let last = points.last, Int(last.at / 20_000) == Int(point.at / 20_000) {
                        points[points.count - 1] = point
                    } else {
                        points.append(point)
                    }
                }
                return .init(name: "flow \(index + 1)", style: index, steps: true, points: points)
            }
            let windows = stride(from: 0.0, to: run.end, by: 100_000).map { ($0, $0 + 100_000) }
            let goodput = run.flows.enumerated().map { index, flow in
                LessonChart.Line(
                    name: "flow \(index + 1)", style: index, steps: true,
                    points: windows.filter { $0.0 >= flow.joined - 100_000 && $0.1 <= flow.left + 100_000 }.map {
                        .init(at: $0.1, value: rate(flow, $0.0, $0.1))
                    })
            }
            let link = LessonChart.Line(
                name: "the bottleneck's rate", style: 5, steps: false,
                points: [
                    .init(at: start, value: Double(CongestionLesson.rate)),
                    .init(at: end, value: Double(CongestionLesson.rate)),
                ])
            let fairness = LessonChart.Line(
                name: "Jain's index", style: 4, steps: false,
                points: stride(from: 0.0, through: run.end - CongestionLesson.window, by: 100_000).compactMap { from in
                    jain(from, from + CongestionLesson.window).map {
                        .init(at: from + CongestionLesson.window, value: $0)
                    }
                })
            let ping = LessonChart.Line(
                name: "UDP ping", style: 4, steps: false,
                points: run.pings.compactMap { ping in ping.rtt.map { .init(at: ping.at, value: $0) } })
            let flows = Array(run.flows.enumerated())
            return LessonChart(
                phase: phase, start: start, end: end,
                panels: [
                    .init(
                        label: "goodput per flow, 100 ms windows", unit: .bitsPerSecond, maximum: nil,
                        lines: goodput + [link]),
                    .init(
                        label: "Jain's fairness index, 1 s windows", unit: .ratio, maximum: 1, lines: [fairness]),
                    .init(
                        label: "congestion window per flow, segments", unit: .segments, maximum: nil,
                        lines: flows.map { flowLine($0, $1) { Double($0.congestionWindow) } }),
                    .init(
                        label: "round trip: UDP ping, each flow's smoothed RTT", unit: .microseconds, maximum: nil,
                        lines: [ping] + flows.map { flowLine($0, $1) { Double($0.rttMicroseconds) } }),
                    .init(
                        label: "bytes acknowledged per flow (sequence)", unit: .bytes, maximum: nil,
                        lines: flows.map { flowLine($0, $1) { Double($0.bytesAcked) } }),
                ],
                marks: [
                    .init(at: CongestionProbe.joins[1], text: "flow 2 joins"),
                    .init(at: CongestionProbe.joins[2], text: "flows 3 and 4 join"),
                ])
        }
    }

    /// What the runs showed, each claim with the figures behind it.
    static func explain(_ results: [Result], _ out: LessonOutput) {
        func result(_ algorithm: String, _ queue: Queue) -> Result? {
            results.first { $0.run.algorithm == algorithm && $0.queue == queue }
        }
        out.say("Why: a TCP sender does not know the path's rate; it learns it. In slow start its window doubles every")
        out.say("round trip until a loss (or, for BBR, a round trip that stops growing); then CUBIC cuts it by 30% and")
        out.say("grows it again, filling whatever queue the path has before each loss, while BBR paces at the rate it")
        out.say("measured and keeps about one round trip of data in flight. Flows that lose and grow alike end with")
        out.say("alike shares. A queue that is always full adds its length to every packet's trip, a ping's too.")
        if let cubic = result("cubic", .deep), let slowStart = cubic.slowStart {
            out.say(
                "Here flow 1, alone under CUBIC, opened its window to \(slowStart.peak) segments in slow start, which ended after \(Int(slowStart.ended / 1000)) ms \(slowStart.byLoss ? "with a loss" : "before any loss, the round trip having grown (HyStart)"): the first ramp of its cwnd graph.",
                pointingAt: cubic.phase)
        }
        let within = CongestionLesson.fairWithin
        let after = { (result: Result) in result.fairAfter }
        let fair = results.filter { (after($0) ?? .infinity) <= within }
        if !fair.isEmpty {
            out.say(
                "Here the four flows' shares over a second reached a Jain's index of 0.9 within \(Int(within / 1000)) s of flows 3 and 4 joining in \(fair.count) of \(results.count) runs (\(fair.map { "\($0.run.algorithm.uppercased()) \($0.queue.rawValue) after \(fixed((after($0) ?? 0) / 1000, 1)) s, \(fixed($0.figureJain4, 2)) over the last second" }.joined(separator: "; "))): the Jain's index graphs; a run can pass 0.9 while the newcomers' windows grow and drift off again.",
                pointingAt: fair[0].phase)
        }
        let unfair = results.filter { (after($0) ?? .infinity) > within }
        if !unfair.isEmpty {
            out.say(
                "Here \(unfair.map { "\($0.run.algorithm.uppercased()) \($0.queue.rawValue) (\(fixed($0.figureJain4, 2)) at the end)" }.joined(separator: ", ")) did not reach 0.9 within \(Int(within / 1000)) s of the last flows joining: its goodput graph shows who kept more.",
                pointingAt: unfair[0].phase)
        }
        if let deep = result("cubic", .deep), let short = result("cubic", .short), deep.idle > 0 {
            out.say(
                "Here CUBIC filled the deep queue: the ping took \(deep.ms(deep.fourFlows)) beside four flows against \(deep.ms(deep.idle)) on the idle path (\(Int(deep.fourFlows / deep.idle))x), and \(short.ms(short.fourFlows)) with the short queue: the delay is the queue, not the link (bufferbloat).",
                pointingAt: deep.phase)
        }
        if let bbr = result("bbr", .deep), let cubic = result("cubic", .deep), bbr.fourFlows >= cubic.fourFlows {
            out.say(
                "Here BBR, with the same deep queue, kept the ping as long as CUBIC did (\(bbr.ms(bbr.fourFlows)) beside four flows, CUBIC \(cubic.ms(cubic.fourFlows))): its pacing did not keep this queue shorter.",
                pointingAt: bbr.phase)
        } else if let bbr = result("bbr", .deep), let cubic = result("cubic", .deep) {
            out.say(
                "Here BBR, with the same deep queue, held the ping at \(bbr.ms(bbr.twoFlows)) beside two flows and \(bbr.ms(bbr.fourFlows)) beside four (CUBIC: \(cubic.ms(cubic.twoFlows)) and \(cubic.ms(cubic.fourFlows))) and sent \(grouped(bbr.retransmits)) segments again (CUBIC: \(grouped(cubic.retransmits))): it paces at the rate it measured rather than filling the queue until a loss, though four BBR flows together still kept a queue.",
                pointingAt: bbr.phase)
        }
    }
}
