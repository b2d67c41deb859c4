import BenchmarkDriver
import Foundation
import SocketStyles

/// report.html: one self-contained page (inline CSS and SVG, no script, no network) with the tables and charts:
/// latency percentiles per backend, throughput bars, latency against concurrency, cost per message.
struct ReportHTML {
    let report: Report

    static let palette = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f"]

    func render() -> String {
        var body = "<h1>sockbench compare</h1>\n"
        let machine = report.machine
        body +=
            "<p class=meta>\(escape(machine.date)) &middot; \(machine.cpus) x \(escape(machine.cpuModel)) &middot; \(escape(machine.kernel)) &middot; load before: \(escape(machine.loadAverageBefore)) &middot; libuv \(escape(machine.libuv)) &middot; \(escape(machine.openssl)) &middot; SwiftNIO \(escape(machine.swiftNIO))\(machine.udpOffload.map { " &middot; \(escape($0))" } ?? "")\(machine.uring.map { " &middot; \(escape($0))" } ?? "")</p>\n"
        body +=
            "<p class=meta>Placement \(report.plan.placement.rawValue); \(report.plan.repetitions) repetitions (medians); \(escape(report.plan.options)).</p>\n"
        body += "<h2 id=verdict>Verdict: which backend for what, from this run</h2>\n<ul class=verdict>"
        for line in verdict() { body += "<li>\(line)</li>" }
        body +=
            "</ul>\n"
        let decision = report.decision()
        if !decision.isEmpty {
            body +=
                "<pre class=decision>"
                + escape(
                    decision.dropFirst().flatMap {
                        $0.contains("\n") ? [$0] : Report.wrap($0, width: Report.terminalWidth)
                    }
                    .joined(separator: "\n")) + "</pre>\n"
        }
        body +=
            "<p class=meta>Why, and what else to weigh (threads, memory per connection, ergonomics): docs/choosing-a-backend.md in the SocketStyles repository. One run on one machine: run it again on yours.</p>\n"
        for transport in report.plan.transports {
            let chart = sweepChart(transport)
            guard !chart.isEmpty else { continue }
            body +=
                "<h2 id=\"sweep-\(transport)\">Latency against load, \(transport): p99 (solid) and p50 (dotted) from the intended send time</h2>\n"
                + chart
        }
        for scenario in report.plan.scenarios where report.rows.contains(where: { $0.scenario == scenario }) {
            body += "<h2>\(scenario)</h2>\n"
            body += chart(for: scenario)
            let (header, cells) = report.table(for: scenario)
            body += "<table><tr>" + header.map { "<th>\(escape($0))</th>" }.joined() + "</tr>\n"
            for row in cells { body += "<tr>" + row.map { "<td>\(escape($0))</td>" }.joined() + "</tr>\n" }
            body += "</table>\n"
        }
        if let (header, cells) = report.serverThreadsTable() {
            body += "<h2 id=server-threads>Server threads</h2>\n"
            body +=
                "<p class=meta>The same loads against servers on each thread count (--server-threads), not pinned.</p>\n"
            body += "<table><tr>" + header.map { "<th>\(escape($0))</th>" }.joined() + "</tr>\n"
            for row in cells { body += "<tr>" + row.map { "<td>\(escape($0))</td>" }.joined() + "</tr>\n" }
            body += "</table>\n"
        }
        let pingpongs = report.plan.scenarios.filter { $0.is(PingPongScenario.self) }
        for scenario in pingpongs {
            let distribution = percentileChart(scenario)
            if !distribution.isEmpty {
                body += "<h2>\(scenario): latency by percentile (log scales)</h2>\n" + distribution
            }
        }
        // Fan-in against the run's own servers (a scenario on more server threads is in "Server threads").
        let fanins = report.plan.scenarios.filter { $0.is(FaninScenario.self) && ($0.serverThreads ?? 1) == 1 }
        if fanins.count > 1 {
            body += "<h2>Latency against concurrency (fan-in, p50 and p99)</h2>\n" + concurrencyChart(fanins)
        }
        let lines = report.summary().dropFirst().map { $0.trimmingCharacters(in: CharacterSet(charactersIn: "- ")) }
        body += "<h2>What this run says</h2>\n<ul>"
        for line in lines { body += "<li>\(escape(line))</li>" }
        body += "</ul>\n<ul class=notes>" + report.notes.map { "<li>\(escape($0))</li>" }.joined() + "</ul>\n"
        let targets = report.targets().map { $0.trimmingCharacters(in: CharacterSet(charactersIn: "- ")) }
        if !targets.isEmpty {
            body +=
                "<h2 id=targets>The project's own targets</h2>\n<p class=meta>\(escape(Report.targetsPreamble))</p>\n<ul>"
            for line in targets { body += "<li>\(escape(String(line.dropFirst("Target, ".count))))</li>" }
            body += "</ul>\n"
        }
        return """
            <!doctype html>
            <html lang="en"><head><meta charset="utf-8"><title>sockbench compare</title>
            <style>
            body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1180px;color:#222;padding:0 16px}
            h1{font-size:24px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd;padding-bottom:4px}
            .meta{color:#555;margin:4px 0}
            table{border-collapse:collapse;margin:12px 0;font-size:12px;font-variant-numeric:tabular-nums}
            th,td{border:1px solid #ddd;padding:3px 7px;text-align:right}th{background:#f4f4f4}
            td:nth-child(-n+2),th:nth-child(-n+2){text-align:left}
            pre.decision{font-size:12px;background:#f8f8f8;padding:8px;overflow-x:auto}
            svg{display:block;margin:8px 0}.notes{color:#555}.verdict li{margin:3px 0}
            h3{font-size:14px;margin:14px 0 2px}
            </style></head><body>
            \(body)
            </body></html>

            """
    }

    func escape(_ text: Substring) -> String { escape(String(text)) }

    func escape(_ text: String) -> String {
        text.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
            .replacingOccurrences(of: ">", with: "&gt;").replacingOccurrences(of: "\"", with: "&quot;")
    }

    /// What each style asks of the code that uses it, in a line (the cost of the verdict's picks).
    static func codeCost(_ backend: String) -> String? { Backend(rawValue: backend)?.style }

    /// The verdict's lines, derived from the run's rows: lowest latency, least CPU per message, bulk, many
    /// connections, each with what the style costs in code. Rows of the C floor and external tools are
    /// references, never picks.
    func verdict() -> [String] {
        let backends = Set(Backend.allCases.map(\.rawValue))
        func rows(_ kind: (some ScenarioKind).Type, _ transport: String) -> [ReportRow] {
            report.rows.filter {
                $0.scenario.is(kind) && $0.transport == transport && backends.contains($0.backend)
            }
        }
        func pick(
            _ title: String, _ candidates: [ReportRow], by value: (ReportRow) -> Double?, lowest: Bool,
            _ describe: (ReportRow, Double) -> String
        ) -> String? {
            let valued = candidates.compactMap { row in value(row).map { (row, $0) } }
            guard let best = (lowest ? valued.min { $0.1 < $1.1 } : valued.max { $0.1 < $1.1 }) else { return nil }
            let others = valued.filter { $0.0.backend != best.0.backend }.sorted { lowest ? $0.1 < $1.1 : $0.1 > $1.1 }
            let next = others.first.map { " (next: \(escape($0.0.backend)), \(describe($0.0, $0.1)))" } ?? ""
            return "<b>\(title): \(escape(best.0.backend))</b>, \(describe(best.0, best.1))\(next). In code: "
                + escape(Self.codeCost(best.0.backend) ?? "")
                + "."
        }
        var lines: [String] = []
        for verdict in report.verdicts ?? [] {
            lines.append(
                "<b>Your workload, \(escape(verdict.transport)) \(escape(verdict.workload.description)): \(escape(verdict.best ?? "no backend held it"))</b>: "
                    + escape(verdict.reason) + "."
                    + (verdict.best.flatMap(Self.codeCost).map { " In code: " + escape($0) + "." } ?? ""))
        }
        for verdict in report.broadcastVerdicts ?? [] {
            lines.append(
                "<b>Your broadcast, \(escape(verdict.transport)) \(escape(verdict.load.description)): \(escape(verdict.best ?? "no backend held it"))</b>: "
                    + escape(verdict.reason) + "."
                    + (verdict.best.flatMap(Self.codeCost).map { " In code: " + escape($0) + "." } ?? ""))
        }
        for scenario in report.plan.scenarios where scenario.is(PingPongScenario.self) {
            for transport in ["tcp", "ws"] {
                // The decision's first rank: the backends this run cannot tell apart at the top (see the table).
                let groups = report.decisionGroups(scenario, transport)
                guard let first = groups.first, let lead = first.rows.first else { continue }
                let names = first.rows.map { escape($0.row.backend) }
                let next = groups.dropFirst().first?.rows.first
                lines.append(
                    "<b>Lowest latency, \(transport) \(scenario): \(names.joined(separator: " and "))</b>"
                        + (names.count > 1 ? " (within 5% or not distinguishable in this run)" : "")
                        + ", quiet p50 \(fixed(lead.figure / 1000, 1)) us"
                        + (report.p50Ratio(lead.row, over: report.floorRow(for: lead.row)).map {
                            ", \($0.text) the C floor"
                        } ?? "")
                        + (next.map { " (next: \(escape($0.row.backend)), \(fixed($0.figure / 1000, 1)) us)" } ?? "")
                        + ". In code: " + escape(Self.codeCost(lead.row.backend) ?? "") + ".")
            }
            if let line = pick(
                "Least CPU per message, tcp \(scenario)",
                rows(PingPongScenario.self, "tcp").filter { $0.scenario == scenario },
                by: { $0.median.cpuPerMessageNanoseconds }, lowest: true,
                { _, cpu in "\(fixed(cpu / 1000, 1)) us of CPU per round trip, both ends" })
            {
                lines.append(line)
            }
            break
        }
        for scenario in report.plan.scenarios where scenario.is(PumpScenario.self) {
            if let line = pick(
                "Bulk, tcp \(scenario)", rows(PumpScenario.self, "tcp").filter { $0.scenario == scenario },
                by: { $0.median.bytesPerSecond }, lowest: false,
                { _, rate in "\(fixed(rate / 1e6, 0)) MB/s delivered" })
            {
                lines.append(line)
            }
        }
        if let scenario = report.plan.scenarios.filter({ $0.is(FaninScenario.self) && ($0.serverThreads ?? 1) == 1 })
            .last,
            let line = pick(
                "Many connections at once, tcp \(scenario)",
                rows(FaninScenario.self, "tcp").filter { $0.scenario == scenario },
                by: { $0.median.messagesPerSecond }, lowest: false,
                { row, rate in
                    "\(Int(rate).formatted()) round trips/s"
                        + (row.median.latency.map { ", p99 \(fixed(Double($0.p99) / 1000, 0)) us" } ?? "")
                })
        {
            lines.append(line)
        }
        for line in report.sweepLines() {
            let text = line.hasPrefix("- ") ? String(line.dropFirst(2)) : line
            let (head, rest) = text.split(separator: ":", maxSplits: 1).map(String.init).pair
            lines.append("<b>\(escape(head))</b>:" + escape(rest))
        }
        if lines.isEmpty {
            lines.append("This run has no pingpong, pump or fan-in rows of the backends to choose from.")
        }
        return lines
    }
}
