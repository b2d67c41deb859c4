import BenchmarkDriver
import Foundation

/// report.html: one self-contained page (inline CSS and SVG, no script, no network) with the tables and charts:
/// latency percentiles per backend, throughput bars, latency against concurrency, cost per message.
struct ReportHTML {
    let report: Report

    static let palette = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f"]

    func render() -> String {
        var body = "<h1>sockbench compare</h1>\n"
        let machine = report.machine
        body +=
            "<p class=meta>\(escape(machine.date)) &middot; \(machine.cpus) x \(escape(machine.cpuModel)) &middot; \(escape(machine.kernel)) &middot; load before: \(escape(machine.loadAverageBefore)) &middot; libuv \(escape(machine.libuv)) &middot; \(escape(machine.openssl)) &middot; SwiftNIO \(escape(machine.swiftNIO))</p>\n"
        body +=
            "<p class=meta>Placement \(report.plan.placement.rawValue); \(report.plan.repetitions) repetitions (medians); \(escape(report.plan.options)).</p>\n"
        for scenario in report.plan.scenarios where report.rows.contains(where: { $0.scenario == scenario }) {
            body += "<h2>\(scenario)</h2>\n"
            body += chart(for: scenario)
            let (header, cells) = report.table(for: scenario)
            body += "<table><tr>" + header.map { "<th>\(escape($0))</th>" }.joined() + "</tr>\n"
            for row in cells { body += "<tr>" + row.map { "<td>\(escape($0))</td>" }.joined() + "</tr>\n" }
            body += "</table>\n"
        }
        let fanins = report.plan.scenarios.filter { $0.kind == "fanin" }
        if fanins.count > 1 {
            body += "<h2>Latency against concurrency (fan-in, p50 and p99)</h2>\n" + concurrencyChart(fanins)
        }
        body += "<h2>What this run says</h2>\n<ul>"
        for line in report.summary().dropFirst() {
            body += "<li>\(escape(line.trimmingCharacters(in: CharacterSet(charactersIn: "- "))))</li>"
        }
        body += "</ul>\n<ul class=notes>" + report.notes.map { "<li>\(escape($0))</li>" }.joined() + "</ul>\n"
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
            svg{display:block;margin:8px 0}.notes{color:#555}
            </style></head><body>
            \(body)
            </body></html>

            """
    }

    func escape(_ text: String) -> String {
        text.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
            .replacingOccurrences(of: ">", with: "&gt;").replacingOccurrences(of: "\"", with: "&quot;")
    }

    func chart(for scenario: Scenario) -> String {
        let rows = report.rows.filter { $0.scenario == scenario }
        switch scenario.kind {
        case "pump", "proxypump":
            return bars(
                rows.map { ("\($0.backend) \($0.transport)", [($0.median.bytesPerSecond ?? 0) / 1e6]) },
                series: ["MB/s delivered"], unit: "MB/s")
                + bars(
                    rows.compactMap { row in
                        row.median.cpuPerMessageNanoseconds.map { ("\(row.backend) \(row.transport)", [$0 / 1000]) }
                    },
                    series: ["CPU per message (client + server)"], unit: "us")
        case "connect":
            return bars(
                rows.map { ("\($0.backend) \($0.transport)", [Double($0.median.latency?.p50 ?? 0) / 1000]) },
                series: ["connect p50"], unit: "us")
        default:
            let latency = bars(
                rows.map { row in
                    let l = row.median.latency
                    return (
                        "\(row.backend) \(row.transport)",
                        [Double(l?.p50 ?? 0) / 1000, Double(l?.p90 ?? 0) / 1000, Double(l?.p99 ?? 0) / 1000]
                    )
                }, series: ["p50", "p90", "p99"], unit: "us")
            let cost = bars(
                rows.compactMap { row in
                    row.median.cpuPerMessageNanoseconds.map { ("\(row.backend) \(row.transport)", [$0 / 1000]) }
                },
                series: ["CPU per round trip (client + server)"], unit: "us")
            return latency + cost
        }
    }

    /// Horizontal grouped bars: one group per label, one bar per series.
    func bars(_ data: [(String, [Double])], series: [String], unit: String) -> String {
        guard !data.isEmpty else { return "" }
        let maximum = max(data.flatMap(\.1).max() ?? 1, 1e-9)
        let barHeight = 9.0
        let groupHeight = barHeight * Double(series.count) + 6
        let left = 130.0
        let width = 900.0
        let plot = width - left - 90
        let height = groupHeight * Double(data.count) + 40
        var svg =
            "<svg width=\"\(Int(width))\" height=\"\(Int(height))\" viewBox=\"0 0 \(Int(width)) \(Int(height))\" role=\"img\">"
        for (index, name) in series.enumerated() {
            let x = left + Double(index) * 190
            svg +=
                "<rect x=\"\(x)\" y=\"4\" width=\"10\" height=\"10\" fill=\"\(Self.palette[index % Self.palette.count])\"/><text x=\"\(x + 14)\" y=\"13\" font-size=\"11\">\(escape(name)) (\(unit))</text>"
        }
        for (row, (label, values)) in data.enumerated() {
            let top = 24 + Double(row) * groupHeight
            svg +=
                "<text x=\"\(left - 6)\" y=\"\(top + groupHeight / 2 + 1)\" font-size=\"11\" text-anchor=\"end\">\(escape(label))</text>"
            for (index, value) in values.enumerated() {
                let y = top + Double(index) * barHeight
                let length = max(1, plot * value / maximum)
                svg +=
                    "<rect x=\"\(left)\" y=\"\(y)\" width=\"\(fixed(length, 1))\" height=\"\(barHeight - 1)\" fill=\"\(Self.palette[index % Self.palette.count])\"/>"
                svg +=
                    "<text x=\"\(fixed(left + length + 4, 1))\" y=\"\(y + barHeight - 1.5)\" font-size=\"9\">\(fixed(value, 1))</text>"
            }
        }
        return svg + "</svg>\n"
    }

    /// p50 (solid) and p99 (dashed) against the number of connections, one line per backend x transport.
    func concurrencyChart(_ scenarios: [Scenario]) -> String {
        let counts: [(Scenario, Int)] = scenarios.compactMap {
            if case .fanin(let n) = $0 { return ($0, n) } else { return nil }
        }
        var lines: [String: [(Int, Double, Double)]] = [:]
        for (scenario, n) in counts {
            for row in report.rows where row.scenario == scenario {
                guard let latency = row.median.latency else { continue }
                lines["\(row.backend) \(row.transport)", default: []].append(
                    (n, Double(latency.p50) / 1000, Double(latency.p99) / 1000))
            }
        }
        let width = 900.0
        let height = 360.0
        let (left, right, top, bottom) = (60.0, 170.0, 20.0, 40.0)
        let xs = counts.map { log10(Double(max(1, $0.1))) }
        let (minX, maxX) = (xs.min() ?? 0, max((xs.max() ?? 1), (xs.min() ?? 0) + 1e-9))
        let maxY = max(lines.values.flatMap { $0.map(\.2) }.max() ?? 1, 1e-9)
        func x(_ n: Int) -> Double { left + (log10(Double(max(1, n))) - minX) / (maxX - minX) * (width - left - right) }
        func y(_ value: Double) -> Double { height - bottom - value / maxY * (height - top - bottom) }
        var svg =
            "<svg width=\"\(Int(width))\" height=\"\(Int(height))\" viewBox=\"0 0 \(Int(width)) \(Int(height))\" role=\"img\">"
        svg +=
            "<line x1=\"\(left)\" y1=\"\(height - bottom)\" x2=\"\(width - right)\" y2=\"\(height - bottom)\" stroke=\"#999\"/>"
        svg += "<line x1=\"\(left)\" y1=\"\(top)\" x2=\"\(left)\" y2=\"\(height - bottom)\" stroke=\"#999\"/>"
        for (_, n) in counts {
            svg +=
                "<text x=\"\(fixed(x(n), 1))\" y=\"\(height - bottom + 16)\" font-size=\"11\" text-anchor=\"middle\">\(n)</text>"
        }
        svg +=
            "<text x=\"\((width - right + left) / 2)\" y=\"\(height - 6)\" font-size=\"11\" text-anchor=\"middle\">concurrent connections (log scale)</text>"
        for fraction in [0.0, 0.5, 1.0] {
            svg +=
                "<text x=\"\(left - 6)\" y=\"\(fixed(y(maxY * fraction) + 4, 1))\" font-size=\"10\" text-anchor=\"end\">\(fixed(maxY * fraction, 0)) us</text>"
        }
        for (index, (name, points)) in lines.sorted(by: { $0.key < $1.key }).enumerated() {
            let color = Self.palette[index % Self.palette.count]
            let sorted = points.sorted { $0.0 < $1.0 }
            let p50 = sorted.map { "\(fixed(x($0.0), 1)),\(fixed(y($0.1), 1))" }.joined(separator: " ")
            let p99 = sorted.map { "\(fixed(x($0.0), 1)),\(fixed(y($0.2), 1))" }.joined(separator: " ")
            svg += "<polyline points=\"\(p50)\" fill=\"none\" stroke=\"\(color)\" stroke-width=\"2\"/>"
            svg +=
                "<polyline points=\"\(p99)\" fill=\"none\" stroke=\"\(color)\" stroke-width=\"1.5\" stroke-dasharray=\"4 3\"/>"
            svg +=
                "<text x=\"\(width - right + 8)\" y=\"\(top + 14 * Double(index) + 8)\" font-size=\"11\" fill=\"\(color)\">\(escape(name))</text>"
        }
        return svg + "</svg>\n"
    }
}
