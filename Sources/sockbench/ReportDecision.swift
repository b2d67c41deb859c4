import BenchmarkDriver
import SocketStyles

/// The end of `compare`'s output: what the run means for a choice. Per transport, the backends of the first
/// round-trip scenario in groups the run can tell apart (a step into the next group holds in at least 80% of the
/// paired slices, ``PairedRanking``, and is 5% or more), with the figures a choice weighs; then, for each kind of
/// load the run measured, the groups in plain words.
extension Report {
    /// The least step between two ranks: a difference the run is sure of but smaller than this (bsd 1% behind
    /// async in 13 of 15 slices) does not decide a choice.
    static let decisionStep = 1.05

    /// A group of rows the run cannot order among themselves; groups are in order, best first.
    struct DecisionGroup {
        var rows: [(row: ReportRow, figure: Double)]
    }

    /// The backends' rows of `scenario` over `transport` in groups, best first, by the scenario's main figure
    /// (the quiet p50 for round trips, as the rankings).
    func decisionGroups(_ scenario: Scenario, _ transport: String) -> [DecisionGroup] {
        let candidates = rows.filter {
            $0.scenario == scenario && $0.transport == transport && Backend(rawValue: $0.backend) != nil
        }
        let kind = scenario.kind
        let figure: (ScenarioResult) -> Double? =
            kind.judgedByP50 ? Self.comparedP50(candidates) : { kind.mainFigure($0) }
        let entries = candidates.compactMap { row -> (ReportRow, PairedRanking.Entry)? in
            guard let center = figure(row.median), center > 0 else { return nil }
            return (row, PairedRanking.Entry(name: row.backend, center: center, slices: row.repetitions.map(figure)))
        }.sorted { kind.higherIsBetter ? $0.1.center > $1.1.center : $0.1.center < $1.1.center }
        // A backend opens a new rank when the run tells it apart from the one before it, or from the first of the
        // rank it would join (so that steps too small to tell apart one by one do not chain a rank from 22 to 30 us).
        func apart(_ before: PairedRanking.Entry, _ after: PairedRanking.Entry) -> Bool {
            let ratio = kind.higherIsBetter ? before.center / after.center : after.center / before.center
            return ratio >= Self.decisionStep
                && PairedRanking.step(from: before, to: after, lowerIsBetter: !kind.higherIsBetter).sure
        }
        var groups: [DecisionGroup] = []
        var leader: PairedRanking.Entry?
        var previous: PairedRanking.Entry?
        for (row, entry) in entries {
            if let leader, let previous, !apart(previous, entry), !apart(leader, entry) {
                groups[groups.count - 1].rows.append((row, entry.center))
            } else {
                groups.append(DecisionGroup(rows: [(row, entry.center)]))
                leader = entry
            }
            previous = entry
        }
        return groups
    }

    /// The decision's lines (empty when the run measured no load a choice rests on).
    func decision() -> [String] {
        let loads = Dictionary(grouping: plan.scenarios.filter { $0.kind.loadName != nil }) { $0.kind.loadName! }
        // Per kind of load, the scenario that says most of it: the most connections, else the first planned.
        let chosen = plan.scenarios.compactMap { scenario -> Scenario? in
            guard let name = scenario.kind.loadName, let all = loads[name] else { return nil }
            let pick = all.max { ($0.connections ?? 0) < ($1.connections ?? 0) }
            return pick == scenario ? scenario : nil
        }
        guard !chosen.isEmpty else { return [] }
        var lines = ["== The decision"]
        if let first = chosen.first(where: { $0.countsRoundTrips }) {
            for transport in plan.transports {
                let groups = decisionGroups(first, transport)
                guard !groups.isEmpty else { continue }
                lines.append(
                    "\(first) \(transport), best first; a new rank where the run tells the backends apart by 5% or more:"
                )
                lines.append("")
                lines.append(decisionTable(groups) + "\n")
            }
        }
        var loadLines: [String] = []
        for scenario in chosen {
            let kind = scenario.kind
            var perTransport: [String] = []
            for transport in plan.transports {
                let groups = decisionGroups(scenario, transport)
                guard !groups.isEmpty else { continue }
                // One unit per transport: milliseconds once its slowest backend takes one (a broadcast's last
                // receipt, 703.4 ms, not 703397.2 us).
                let milliseconds = (groups.flatMap(\.rows).map(\.figure).max() ?? 0) >= 1_000_000
                perTransport.append(
                    "\(transport): "
                        + groups.map { words($0, scenario, milliseconds: milliseconds) }.joined(separator: ", then "))
            }
            guard !perTransport.isEmpty, let name = kind.loadName else { continue }
            loadLines.append("  \(name), \(scenario): " + perTransport.joined(separator: "; ") + ".")
        }
        if !loadLines.isEmpty {
            lines.append(
                "- What each kind of load says (best first; backends joined by \"and\" are within 5% or not distinguishable in this run):"
            )
            lines += loadLines
        }
        lines.append(
            "- Full tables: --wide, or --out DIR for report.md and report.html; two runs set side by side: sockbench diff."
        )
        return lines
    }

    /// A group in words: `bsd (11.0)`, `async and uring (12.3-13.0)`.
    private func words(_ group: DecisionGroup, _ scenario: Scenario, milliseconds: Bool) -> String {
        let higher = scenario.kind.higherIsBetter
        let show: (Double) -> String =
            higher
            ? { fixed($0 / 1e6, 0) }
            : milliseconds ? { fixed($0 / 1e6, $0 < 10_000_000 ? 2 : 1) } : { fixed($0 / 1000, 1) }
        let unit = higher ? " MB/s" : milliseconds ? " ms" : " us"
        let names = group.rows.map(\.row.backend)
        let listed =
            names.count == 1
            ? names[0] : names.dropLast().joined(separator: ", ") + " and " + names.last!
        let values = group.rows.map(\.figure)
        let low = show(values.min()!)
        let high = show(values.max()!)
        return "\(listed) (\(low == high ? low : "\(low)-\(high)")\(unit))"
    }

    /// The round-trip table of the decision: rank, backend, quiet p50, p99, x floor with its range, CPU.
    private func decisionTable(_ groups: [DecisionGroup]) -> String {
        let header = ["rank", "backend", "quiet p50 us", "p99 us", "x floor", "cpu us/rt"]
        var cells: [[String]] = []
        for (rank, group) in groups.enumerated() {
            for (row, figure) in group.rows {
                cells.append([
                    "\(rank + 1)", row.backend, fixed(figure / 1000, 1),
                    row.median.latency.map { fixed(Double($0.p99) / 1000, 1) } ?? "-",
                    p50Ratio(row, over: floorRow(for: row))?.text ?? "-", cpuPerMessage(row.median),
                ])
            }
        }
        return Self.render(header, cells)
    }
}
