import ArgumentParser
import BenchmarkDriver
import Foundation
import POSIXSupport
import SocketStyles

/// What the report shows of a measurement: the one-line brief while it runs, and a table per scenario (for
/// the terminal, Markdown and HTML alike).
extension Report {
    /// One line for the live progress.
    static func brief(_ scenario: Scenario, _ m: ScenarioResult) -> String {
        let share = m.cpuShare.map {
            " [foreign cpu \(fixed($0.foreignShare * 100, 1))%]"
        }
        return scenario.kind.brief(m) + (share ?? "")
    }

    // MARK: Tables

    /// The median p50 of one row, nanoseconds.
    func p50(_ backend: String, _ transport: String, _ scenario: Scenario) -> Double? {
        rows.first { $0.backend == backend && $0.transport == transport && $0.scenario == scenario }
            .flatMap { $0.median.latency.map { Double($0.p50) } }
    }

    func cpuPerMessage(_ m: ScenarioResult) -> String {
        m.cpuPerMessageNanoseconds.map { fixed($0 / 1000, 1) } ?? "-"
    }

    /// The header and cells of one scenario's table: its kind's.
    func table(for scenario: Scenario) -> (header: [String], cells: [[String]]) {
        scenario.kind.table(self, rows: rows.filter { $0.scenario == scenario })
    }

    /// The table of a pump's rows (and the relays' pumps): delivered, sent and received, losses, CPU.
    func pumpTable(_ selected: [ReportRow]) -> (header: [String], cells: [[String]]) {
        let header = [
            "backend", "transport", "MB/s", "sent/s", "received/s", "x floor", "spread MB/s", "sent", "received",
            "lost", "loss %", "reordered", "kernel drops", "cpu us/msg", "client cpu ms", "server cpu ms",
        ]
        let cells = selected.map { row -> [String] in
            let m = row.median
            return [
                row.backend, row.transport, fixed((m.bytesPerSecond ?? 0) / 1e6, 1),
                "\(Int(m.messagesPerSecond ?? 0))", m.receivedPerSecond.map { "\(Int($0))" } ?? "-",
                pumpFloorRatio(for: row)?.text ?? "-",
                "\(fixed(row.spread[0] / 1e6, 1))-\(fixed(row.spread[1] / 1e6, 1))", "\(m.messages)",
                m.received.map(String.init) ?? "-", m.received == nil ? "-" : "\(m.lost ?? 0)",
                m.received == nil || m.messages == 0
                    ? "-" : fixed(Double(m.lost ?? 0) * 100 / Double(m.messages), 1),
                m.reordered.map(String.init) ?? "-", m.kernelReceiveBufferDrops.map(String.init) ?? "-",
                cpuPerMessage(m), m.client.map { fixed(Double($0.cpuNanoseconds) / 1e6, 0) } ?? "-",
                m.server.map { fixed(Double($0.cpuNanoseconds) / 1e6, 0) } ?? "-",
            ]
        }
        return (header, cells)
    }

    /// The table of closed-loop round trips (pingpong, native, proxy, fan-in's first columns): latency, its ratios
    /// to the C floor, the reference and the native style, CPU and context switches per round trip, threads.
    func roundTripTable(_ selected: [ReportRow]) -> (header: [String], cells: [[String]]) {
        let header =
            [
                "backend", "transport", "p50 us", "quiet p50", "x floor",
                "x \(Backend.reference?.name ?? "reference")",
                "x native", "p50 spread", "p90 us", "p99 us",
                "p99.9 us",
                "max us", "rt/s", "lost", "cpu us/rt", "client", "server", "ctx sw/rt", "client", "server",
                "threads",
            ]
        let cells = selected.map { row -> [String] in
            let m = row.median
            let p50 = Double(m.latency?.p50 ?? 0)
            // Per round trip on each end, and both together (the client's figures include the load
            // generator's own bookkeeping, as a user's client would).
            let perMessage: (ResourceUsage?, (ResourceUsage) -> UInt64, Double, Int) -> String = {
                usage, value, scale, digits in
                guard let usage, m.messages > 0 else { return "-" }
                return fixed(Double(value(usage)) / scale / Double(m.messages), digits)
            }
            let switches: (ResourceUsage) -> UInt64 = {
                $0.voluntaryContextSwitches + $0.involuntaryContextSwitches
            }
            let contextSwitches: String = {
                guard let client = m.client, let server = m.server, m.messages > 0 else { return "-" }
                return fixed(Double(switches(client) + switches(server)) / Double(m.messages), 1)
            }()
            return [
                row.backend, row.transport, microseconds(UInt64(p50)), m.quietP50.map(microseconds) ?? "-",
                p50Ratio(row, over: floorRow(for: row))?.text ?? "-",
                p50Ratio(row, over: referenceRow(for: row))?.text ?? "-", unifiedPrice(for: row)?.text ?? "-",
                "\(microseconds(UInt64(row.spread[0])))-\(microseconds(UInt64(row.spread[1])))",
                microseconds(m.latency?.p90 ?? 0), microseconds(m.latency?.p99 ?? 0),
                microseconds(m.latency?.p999 ?? 0), microseconds(m.latency?.max ?? 0),
                "\(Int(m.messagesPerSecond ?? 0))", "\(m.lost ?? 0)", cpuPerMessage(m),
                perMessage(m.client, { $0.cpuNanoseconds }, 1000, 1),
                perMessage(m.server, { $0.cpuNanoseconds }, 1000, 1), contextSwitches,
                perMessage(m.client, switches, 1, 1), perMessage(m.server, switches, 1, 1),
                m.server.map { "\($0.threads)" } ?? "-",
            ]
        }
        return (header, cells)
    }

    /// Whether every connection got its share (``Fairness``): Jain's index over per-connection throughput, the
    /// least-served connection's throughput over the mean, and the median and the worst connection's own p99.
    static let fairnessHeader = ["fairness", "slowest share", "conn p99 median us", "conn p99 worst us"]

    static func fairnessCells(_ fairness: Fairness?) -> [String] {
        guard let fairness else { return fairnessHeader.map { _ in "-" } }
        return [
            fixed(fairness.jainIndex, 3), fixed(fairness.slowestShare, 2),
            fairness.medianP99.map(microseconds) ?? "-", fairness.worstP99.map(microseconds) ?? "-",
        ]
    }

    static func render(_ header: [String], _ cells: [[String]]) -> String {
        let all = [header] + cells
        let widths = header.indices.map { column in all.map { $0[column].count }.max()! }
        return all.enumerated().map { index, row in
            let line = row.enumerated().map { column, cell in
                column < 2
                    ? cell.padding(toLength: widths[column], withPad: " ", startingAt: 0)
                    : String(repeating: " ", count: widths[column] - cell.count) + cell
            }.joined(separator: "  ")
            return index == 0 ? line + "\n" + String(repeating: "-", count: line.count) : line
        }.joined(separator: "\n")
    }

    /// The widest line `compare` and `report` print by default (`--wide` prints report.md's tables whole).
    static let terminalWidth = 120

    /// Columns the terminal leaves to report.md, report.html and `--wide`: the spread of figures the narrow table
    /// already gives (p90 beside p50 and p99, the tail past p99), and the split of CPU and context switches.
    static let detailColumns: Set<String> = [
        "p50 spread", "p90 us", "p99.9 us", "max us", "client", "server", "ctx sw/rt", "threads", "x native",
        "spread MB/s", "sent", "received", "client cpu ms", "server cpu ms", "reordered", "kernel drops",
    ]

    /// A table narrowed to `width` columns of text: backend and transport, then the columns that are not details,
    /// left to right, as many as fit. Returns how many columns it left out.
    static func narrow(
        _ header: [String], _ cells: [[String]], width: Int
    ) -> (
        header: [String], cells: [[String]], leftOut: Int
    ) {
        let all = [header] + cells
        let widths = header.indices.map { column in all.map { $0[column].count }.max()! }
        var kept: [Int] = []
        var used = 0
        for column in header.indices where column < 2 || !detailColumns.contains(header[column]) {
            let added = widths[column] + (kept.isEmpty ? 0 : 2)
            guard column < 2 || used + added <= width else { continue }
            kept.append(column)
            used += added
        }
        return (kept.map { header[$0] }, cells.map { row in kept.map { row[$0] } }, header.count - kept.count)
    }

    /// `line` broken at spaces into lines of at most `width` characters (a word longer than that stays whole);
    /// lines after the first are indented to the text after a leading "- " (or by two spaces).
    static func wrap(_ line: String, width: Int) -> [String] {
        guard line.count > width else { return [line] }
        let leading = line.prefix { $0 == " " }.count
        let indent = String(repeating: " ", count: leading + 2)
        var lines: [String] = []
        var current = ""
        for word in line.split(separator: " ", omittingEmptySubsequences: true) {
            let prefix = current.isEmpty ? (lines.isEmpty ? String(repeating: " ", count: leading) : indent) : ""
            let candidate = current.isEmpty ? prefix + word : current + " " + word
            if candidate.count > width, !current.isEmpty {
                lines.append(current)
                current = indent + word
            } else {
                current = candidate
            }
        }
        if !current.isEmpty { lines.append(current) }
        return lines
    }

    /// What `compare` prints when it ends: a table per scenario, then what the run says. By default every line
    /// fits ``terminalWidth`` (tables keep their main columns, the summary is wrapped); `wide`: report.md's tables.
    func terminalTables(wide: Bool = false) -> String {
        var text = ""
        var leftOut = 0
        for scenario in plan.scenarios where rows.contains(where: { $0.scenario == scenario }) {
            var (header, cells) = table(for: scenario)
            if !wide {
                let narrowed = Self.narrow(header, cells, width: Self.terminalWidth)
                (header, cells) = (narrowed.header, narrowed.cells)
                leftOut = max(leftOut, narrowed.leftOut)
            }
            text += "\n== \(scenario)\n" + Self.render(header, cells) + "\n"
        }
        if var (header, cells) = serverThreadsTable() {
            if !wide {
                let narrowed = Self.narrow(header, cells, width: Self.terminalWidth)
                (header, cells) = (narrowed.header, narrowed.cells)
                leftOut = max(leftOut, narrowed.leftOut)
            }
            text += "\n== Server threads\n" + Self.render(header, cells) + "\n"
        }
        if leftOut > 0 {
            text +=
                "\n(Each table's other columns, up to \(leftOut): --wide, report.md or report.html with --out DIR.)\n"
        }
        // What the run says, then last, where the eye lands when the run ends, what it means for a choice.
        for part in [summary(), decision()] where !part.isEmpty {
            text +=
                "\n"
                + (wide ? part : part.flatMap { $0.contains("\n") ? [$0] : Self.wrap($0, width: Self.terminalWidth) })
                .joined(separator: "\n") + "\n"
        }
        return text
    }
}
