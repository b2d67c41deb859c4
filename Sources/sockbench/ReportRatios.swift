import BenchmarkDriver
import SocketStyles

/// One row's figure over another's, over the repetitions they share. Rows of one run are measured back to back in
/// each repetition (backends interleaved), so repetition i of one row is paired with repetition i of the other:
/// the ratio is the interquartile mean of those paired ratios (the mean of the middle half), and the range their
/// lowest and highest.
///
/// Not the median: some rows are bimodal pass to pass (async tcp's pingpong-64 p50 sits near 23.5 us in some
/// passes and 25.8 us in others, each connection keeping its mode), and the median of such a row jumps from one
/// mode to the other between runs (1.37x in one run, 1.48x in the next) while the mean of the middle half moves
/// with the share of passes in each mode; it still leaves out the passes the machine slowed down.
struct Ratio: Equatable {
    var center: Double
    var low: Double
    var high: Double

    init?(_ values: [Double]) {
        let sorted = values.filter(\.isFinite).sorted()
        guard !sorted.isEmpty else { return nil }
        center = Self.interquartileMean(sorted)
        low = sorted.first!
        high = sorted.last!
    }

    /// The mean of the middle half of `sorted` (ascending), the quartiles' edge values weighted by the part of
    /// them inside it; the median of one or two values.
    static func interquartileMean(_ sorted: [Double]) -> Double {
        let count = Double(sorted.count)
        guard sorted.count > 2 else { return sorted.reduce(0, +) / count }
        let from = count / 4
        let to = count * 3 / 4
        var total = 0.0
        for (index, value) in sorted.enumerated() {
            let start = Double(index)
            let inside = min(start + 1, to) - max(start, from)
            if inside > 0 { total += inside * value }
        }
        return total / (to - from)
    }

    /// `1.21x`, or `1.21x (1.19-1.23)` when the repetitions differ.
    var text: String {
        fixed(low) == fixed(high) ? "\(fixed(center))x" : "\(fixed(center))x (\(fixed(low))-\(fixed(high)))"
    }

    /// Whether `limit` lies inside the range: the run cannot say on which side of it the ratio is.
    func straddles(_ limit: Double) -> Bool { low <= limit && limit <= high }
}

extension Report {
    /// The row of one backend x transport x scenario.
    func row(_ backend: String, _ transport: String, _ scenario: Scenario) -> ReportRow? {
        rows.first { $0.backend == backend && $0.transport == transport && $0.scenario == scenario }
    }

    /// `figure` of `row` over `figure` of `reference`, repetition by repetition (a reference measured once, as
    /// iperf3's row, is used for every repetition; a row measured once is set against the reference's median).
    func ratio(_ row: ReportRow?, over reference: ReportRow?, _ figure: (ScenarioResult) -> Double?) -> Ratio? {
        guard let row, let reference, !row.repetitions.isEmpty, !reference.repetitions.isEmpty else { return nil }
        if row.repetitions.count == 1, reference.repetitions.count > 1 {
            // Measured once, apart from the passes (iperf3, sockperf): against the reference's median.
            guard let mine = figure(row.repetitions[0]), let theirs = figure(reference.median), theirs > 0 else {
                return nil
            }
            return Ratio([mine / theirs])
        }
        let values = row.repetitions.indices.compactMap { index -> Double? in
            let other = reference.repetitions[min(index, reference.repetitions.count - 1)]
            guard let mine = figure(row.repetitions[index]), let theirs = figure(other), theirs > 0 else { return nil }
            return mine / theirs
        }
        return Ratio(values)
    }

    /// p50 latency of `row` over `reference`'s: their quiet p50s (``QuietP50``) when both rows have one in every
    /// repetition (closed-loop round trips measured here), else their p50s (a row another tool measured).
    func p50Ratio(_ row: ReportRow?, over reference: ReportRow?) -> Ratio? {
        ratio(row, over: reference, Self.comparedP50([row, reference].compactMap { $0 }))
    }

    /// An open-loop (rate) row over the C floor's paced client at the same rate and transport, repetition by
    /// repetition: latency from the actual send time, the quiet p50s (``QuietP50``, stretches of 20 ms of
    /// messages) when every repetition of both rows has one, else their p50s (sockperf's under-load row).
    func openLoopRatio(_ row: ReportRow?, over reference: ReportRow?) -> Ratio? {
        let rows = [row, reference].compactMap { $0 }
        return ratio(row, over: reference, Self.comparedP50(rows) { $0.uncorrectedLatency?.p50 })
    }

    /// The latency figure two rows' ratio compares: the quiet p50 when every repetition of both has it, else
    /// `plain` (the p50, by default).
    static func comparedP50(
        _ rows: [ReportRow], plain: @escaping (ScenarioResult) -> UInt64? = { $0.latency?.p50 }
    ) -> (ScenarioResult) -> Double? {
        let quiet = rows.allSatisfy { $0.repetitions.allSatisfy { $0.quietP50 != nil } }
        // Not `.map(Double.init)`: for a UInt64 that resolves to `init(bitPattern:)`, whose ratios come out right
        // (the values are subnormals, linear in their bits) and whose printed microseconds were all 0.0.
        return quiet ? { $0.quietP50.map { Double($0) } } : { plain($0).map { Double($0) } }
    }

    /// The C floor's row for a latency row of the same size (ws/tls/wss against tcp): the floor measured in the
    /// same passes when the run has it (native-SIZE and asyncchannel-SIZE run the C floor's ping-pong beside
    /// their rows), else its pingpong row.
    func floorRow(for row: ReportRow) -> ReportRow? {
        let scenario = row.scenario
        guard
            let size = scenario.as(PingPongScenario.self)?.size ?? scenario.as(NativeScenario.self)?.size
                ?? scenario.as(AsyncChannelScenario.self)?.size ?? scenario.as(ProxyScenario.self)?.size
        else { return nil }
        let transport = row.transport == "udp" ? "udp" : "tcp"
        return self.row(Self.floorName, transport, row.scenario)
            ?? self.row(Self.floorName, transport, .pingpong(size: size))
    }

    /// The price of the unified API: a tcp pingpong-SIZE row's p50 over the same backend's native-SIZE p50, each
    /// over the C floor's p50 in its own pass when the run has the floor's rows of both scenarios.
    func unifiedPrice(for row: ReportRow) -> Ratio? {
        guard let size = row.scenario.as(PingPongScenario.self)?.size, row.transport == "tcp",
            row.backend != Self.floorName
        else {
            return nil
        }
        let native = self.row(row.backend, "tcp", .native(size: size))
        guard let native, let floor = self.row(Self.floorName, "tcp", row.scenario),
            let nativeFloor = self.row(Self.floorName, "tcp", native.scenario),
            Set([row, native, floor, nativeFloor].map(\.repetitions.count)).count == 1
        else { return p50Ratio(row, over: native) }
        // Slice by slice, each row over the C floor measured in the same pass: the machine's slow stretches move
        // every row of a pass alike, and the pingpong and native passes of a slice, though adjacent, are not the
        // same pass.
        let figure = Self.comparedP50([row, native, floor, nativeFloor])
        return Self.overFloors(
            row.repetitions.map(figure), native.repetitions.map(figure), floor.repetitions.map(figure),
            nativeFloor.repetitions.map(figure))
    }

    /// Slice by slice, (`row` over `floor`) over (`other` over `otherFloor`): two rows of different passes set
    /// against each other with the machine's speed in each pass taken out (every row of a pass is measured within
    /// about a second of the others, the floor among them).
    static func overFloors(_ row: [Double?], _ other: [Double?], _ floor: [Double?], _ otherFloor: [Double?]) -> Ratio?
    {
        Ratio(
            row.indices.compactMap { index -> Double? in
                guard index < other.count, index < floor.count, index < otherFloor.count,
                    let mine = row[index], let theirs = other[index], let floorHere = floor[index],
                    let floorThere = otherFloor[index], theirs > 0, floorHere > 0
                else { return nil }
                return (mine / floorHere) / (theirs / floorThere)
            })
    }

    /// A pump row against the C floor's pump of the same size: MB/s delivered for tcp, datagrams received per
    /// second at the sink for udp (goodput; what the UDP target compares).
    func pumpFloorRatio(for row: ReportRow?) -> Ratio? {
        guard let row, row.scenario.is(PumpScenario.self) || row.scenario.is(ProxyPumpScenario.self),
            row.transport == "tcp" || row.transport == "udp"
        else { return nil }
        let floor = self.row(Self.floorName, row.transport, row.scenario)
        return row.transport == "udp"
            ? ratio(row, over: floor, \.receivedPerSecond) : ratio(row, over: floor, \.bytesPerSecond)
    }

    /// The reference backend's row (SwiftNIO's: `Backend.reference`) for the same scenario and transport.
    func referenceRow(for row: ReportRow) -> ReportRow? {
        Backend.reference.flatMap { self.row($0.name, row.transport, row.scenario) }
    }

    // MARK: Ranking

    /// Rows ordered by their median figure, best first, each step judged by ``PairedRanking``: the rows' passes
    /// are measured in the same interleaved slices, so slice i of one row is set against slice i of the other.
    func ranking(
        _ candidates: [ReportRow], lowerIsBetter: Bool, figure: (ScenarioResult) -> Double?,
        show: (Double) -> String
    ) -> String {
        let entries = candidates.compactMap { row -> PairedRanking.Entry? in
            figure(row.median).map {
                PairedRanking.Entry(name: row.backend, center: $0, slices: row.repetitions.map(figure))
            }
        }
        return PairedRanking.text(entries, lowerIsBetter: lowerIsBetter, show: show)
    }

    // MARK: Disturbance

    /// What the run says about other load on the measured CPUs, judged per pass (every row of a scenario measured
    /// once, one after another; its windows together): passes still disturbed after re-measuring, or that none
    /// was, with the largest foreign share of a pass.
    func disturbanceLines() -> [String] {
        var largest: Double?
        var named: [String] = []
        var replaced: [String] = []
        for scenario in plan.scenarios {
            let selected = rows.filter { $0.scenario == scenario && !$0.repetitions.contains { $0.cpuShare == nil } }
            let passes = selected.map(\.repetitions.count).max() ?? 0
            for index in 0..<passes {
                let windows = selected.compactMap { row in
                    row.repetitions.indices.contains(index) ? row.repetitions[index].cpuShare : nil
                }
                guard let share = CPUShare.combined(windows) else { continue }
                largest = max(largest ?? 0, share.foreignShare)
                let before = selected.compactMap { row in
                    row.repetitions.indices.contains(index) ? row.repetitions[index].replacedForeignShare : nil
                }.max()
                if let before {
                    replaced.append("\(scenario) pass \(index + 1) of \(passes) (\(fixed(before * 100, 0))%)")
                }
                if share.isDisturbed {
                    named.append("\(scenario) pass \(index + 1) of \(passes) (\(fixed(share.foreignShare * 100, 0))%)")
                }
            }
        }
        guard let largest else {
            return ["- Foreign load on the measured CPUs was not watched (/proc/stat unreadable, or an older run)."]
        }
        // Passes taken under foreign load and measured again: the report holds the new ones; it says which.
        let again =
            replaced.isEmpty
            ? []
            : [
                "- Measured again: \(replaced.count) pass(es) were disturbed when first taken (foreign share of the measured CPUs in brackets) and their results are from a later, quieter pass: "
                    + replaced.joined(separator: ", ") + "."
            ]
        guard !named.isEmpty else {
            return [
                "- No pass \(replaced.isEmpty ? "was" : "is") disturbed: other processes and the hypervisor used at most \(fixed(largest * 100, 1))% of the measured CPUs in any pass (a pass is disturbed at \(fixed(CPUShare.disturbedShare * 100, 0))% and 50 ms)."
            ] + again
        }
        let why =
            plan.remeasure == 0
            ? "they were not measured again (--remeasure 0)" : "measuring them again did not find a quiet moment"
        return [
            "- DISTURBED: something else used the measured CPUs during these passes, and \(why); the rows measured in them, and every ratio against those rows, are not to be trusted: "
                + named.joined(separator: ", ") + "."
        ] + again
    }

    // MARK: Fan-in

    /// What queueing predicts for a fan-in row: N connections in closed loop against one server take turns, so a
    /// round trip waits for about N of them; with one connection's round trip (the same backend and transport's
    /// pingpong-64 in this run) that is N x its p50. Returns that figure, the measured p50 over it, and the p99.9
    /// judged against N x one connection's p99.9: within it, queueing behind the others explains it; above it,
    /// "unexplained" (something else: a stall, a timer, the machine).
    func faninExpectation(_ row: ReportRow) -> [String] {
        guard let connections = row.scenario.connections, row.scenario.is(FaninScenario.self),
            let single = self.row(row.backend, row.transport, .pingpong(size: 64))?.median.latency,
            let measured = row.median.latency
        else { return ["-", "-", microseconds(row.median.latency?.p999 ?? 0)] }
        let expected = Double(connections) * Double(single.p50)
        let tail = microseconds(measured.p999)
        let explained = Double(measured.p999) <= Double(connections) * Double(single.p999)
        return [
            microseconds(UInt64(expected)), fixed(Double(measured.p50) / max(1, expected)),
            explained ? tail : "\(tail) unexplained",
        ]
    }
}

/// An order of rows by one figure that says how sure each step is. A machine that switches between speeds moves
/// every row measured at the same moment alike, so two rows' ranges over their passes overlap even when one is
/// behind the other in every pass; set side by side, slice for slice (the interleaved passes of one repetition),
/// the speed cancels. Each step after the first says how far behind the row before it this one was (the
/// interquartile mean of the paired ratios) and in how many of the paired slices it was behind at all; a step
/// behind in fewer than 80% of them, or in fewer than 5 pairs where their ranges overlap, is "~": not
/// distinguishable in this run.
enum PairedRanking {
    struct Entry {
        var name: String
        /// The row's figure (its median over the passes): what orders the rows.
        var center: Double
        /// The figure of each pass, in the order passes were measured (`nil`: none in that pass).
        var slices: [Double?]
    }

    /// The share of paired slices a step must hold to count as an order.
    static let sureShare = 0.8
    /// The fewest paired slices that can decide a step; with fewer, the ranges over the passes decide.
    static let fewestPairs = 5

    static func text(_ entries: [Entry], lowerIsBetter: Bool, show: (Double) -> String) -> String {
        let sorted = entries.sorted { lowerIsBetter ? $0.center < $1.center : $0.center > $1.center }
        var text = ""
        for (index, entry) in sorted.enumerated() {
            guard index > 0 else {
                text = "\(entry.name) \(show(entry.center))"
                continue
            }
            let step = self.step(from: sorted[index - 1], to: entry, lowerIsBetter: lowerIsBetter)
            text += (step.sure ? ", " : " ~ ") + "\(entry.name) \(show(entry.center))" + step.note
        }
        return text
    }

    /// Whether `next` is behind `previous` (worse by the figure), and the note that says by how much and how often.
    static func step(from previous: Entry, to next: Entry, lowerIsBetter: Bool) -> (sure: Bool, note: String) {
        let ratios = zip(previous.slices, next.slices).compactMap { before, after -> Double? in
            guard let before, let after, before > 0 else { return nil }
            return after / before
        }
        guard ratios.count >= fewestPairs, let ratio = Ratio(ratios) else {
            let values = (previous.slices.compactMap { $0 }, next.slices.compactMap { $0 })
            guard let low = values.1.min(), let high = values.1.max(), let lowBefore = values.0.min(),
                let highBefore = values.0.max()
            else { return (false, "") }
            return (!(low <= highBefore && lowBefore <= high), "")
        }
        let behind = ratios.filter { lowerIsBetter ? $0 > 1 : $0 < 1 }.count
        let percent = Int(((ratio.center - 1) * 100).rounded())
        let sign = percent >= 0 ? "+" : ""
        let sure = Double(behind) >= sureShare * Double(ratios.count)
        return (sure, " (\(sign)\(percent)%, \(behind)/\(ratios.count))")
    }
}
