import BenchmarkDriver
import Foundation
import SocketStyles

// The charts of report.html: per transport, bars, lines against a parameter, percentiles, concurrency.
extension ReportHTML {
    /// One scenario's chart: its kind's.
    func chart(for scenario: Scenario) -> String {
        scenario.kind.chart(self, rows: report.rows.filter { $0.scenario == scenario })
    }

    /// One chart per transport (headed by the transport when there are several), in the report's transport order.
    func perTransport(_ rows: [ReportRow], _ chart: ([ReportRow]) -> String) -> String {
        let transports = Array(Set(rows.map(\.transport))).sorted {
            (Self.transportOrder.firstIndex(of: $0) ?? 99) < (Self.transportOrder.firstIndex(of: $1) ?? 99)
        }
        var html = ""
        for transport in transports {
            if transports.count > 1 { html += "<h3>\(escape(transport))</h3>\n" }
            html += chart(rows.filter { $0.transport == transport })
        }
        return html
    }

    /// Delivered MB/s per backend, highest first, then CPU per message; per transport.
    func throughputBars(_ rows: [ReportRow]) -> String {
        perTransport(rows) { group in
            let sorted = group.sorted { ($0.median.bytesPerSecond ?? 0) > ($1.median.bytesPerSecond ?? 0) }
            return bars(
                sorted.map { ($0.backend, [($0.median.bytesPerSecond ?? 0) / 1e6]) },
                series: ["MB/s delivered"], unit: "MB/s") + cpuBars(group)
        }
    }

    /// p50, p90 and p99 per backend, lowest p50 first, then CPU per message; per transport.
    func latencyBars(_ rows: [ReportRow]) -> String {
        perTransport(rows) { group in
            let sorted = group.sorted { ($0.median.latency?.p50 ?? 0) < ($1.median.latency?.p50 ?? 0) }
            return bars(
                sorted.map { row in
                    let l = row.median.latency
                    return (
                        row.backend,
                        [Double(l?.p50 ?? 0) / 1000, Double(l?.p90 ?? 0) / 1000, Double(l?.p99 ?? 0) / 1000]
                    )
                }, series: ["p50", "p90", "p99"], unit: "us") + cpuBars(group)
        }
    }

    /// One line per name (a backend's colour) through its points, the x values evenly spaced in order (the
    /// K of loaded-K, the N of broadcast-N), y on a log scale when `logY`.
    func lineChart(_ lines: [String: [(Double, Double)]], x xLabel: String, y yLabel: String, logY: Bool) -> String {
        let xs = Array(Set(lines.values.flatMap { $0.map(\.0) })).sorted()
        let ys = lines.values.flatMap { $0.map(\.1) }.filter { $0 > 0 }
        guard !xs.isEmpty, let low = ys.min(), let high = ys.max() else { return "" }
        let width = 900.0
        let height = 340.0
        let (left, right, top, bottom) = (70.0, 150.0, 20.0, 44.0)
        let (lowY, highY) =
            logY ? (floor(log10(max(low, 0.1))), ceil(log10(max(high, low * 10)))) : (0, niceCeiling(max(high, 1e-9)))
        func x(_ value: Double) -> Double {
            let index = Double(xs.firstIndex(of: value) ?? 0)
            return left + (xs.count > 1 ? index / Double(xs.count - 1) : 0.5) * (width - left - right)
        }
        func y(_ value: Double) -> Double {
            let fraction =
                logY ? (log10(max(value, 0.1)) - lowY) / max(1e-9, highY - lowY) : value / max(1e-9, highY)
            return height - bottom - fraction * (height - top - bottom)
        }
        var svg =
            "<svg class=lines width=\"\(Int(width))\" height=\"\(Int(height))\" viewBox=\"0 0 \(Int(width)) \(Int(height))\" role=\"img\">"
        svg +=
            "<line class=axis x1=\"\(left)\" y1=\"\(height - bottom)\" x2=\"\(width - right)\" y2=\"\(height - bottom)\" stroke=\"#999\"/>"
        svg +=
            "<line class=axis x1=\"\(left)\" y1=\"\(top)\" x2=\"\(left)\" y2=\"\(height - bottom)\" stroke=\"#999\"/>"
        for value in xs {
            svg +=
                "<text x=\"\(fixed(x(value), 1))\" y=\"\(height - bottom + 16)\" font-size=\"11\" text-anchor=\"middle\">\(Int(value).formatted())</text>"
        }
        svg +=
            "<text x=\"\((width - right + left) / 2)\" y=\"\(height - 8)\" font-size=\"11\" text-anchor=\"middle\">\(escape(xLabel))</text>"
        svg +=
            "<text x=\"12\" y=\"\(top - 6)\" font-size=\"11\">\(escape(yLabel))</text>"
        if logY {
            svg += decades(from: lowY, to: highY, left: left, right: width - right, y: y) {
                $0 >= 1000 ? "\(Int($0 / 1000).formatted()) ms" : "\($0 < 1 ? fixed($0, 1) : "\(Int($0))") us"
            }
        } else {
            for fraction in [0.0, 0.5, 1.0] {
                svg +=
                    "<text x=\"\(left - 6)\" y=\"\(fixed(y(highY * fraction) + 4, 1))\" font-size=\"10\" text-anchor=\"end\">\(fixed(highY * fraction, 0))</text>"
            }
        }
        let order = [Report.floorName] + Backend.allCases.map(\.name)
        let names = lines.keys.sorted { (order.firstIndex(of: $0) ?? 99, $0) < (order.firstIndex(of: $1) ?? 99, $1) }
        for (index, name) in names.enumerated() {
            let color = Self.color(of: name)
            let points = (lines[name] ?? []).filter { $0.1 > 0 }.sorted { $0.0 < $1.0 }
            let path = points.map { "\(fixed(x($0.0), 1)),\(fixed(y($0.1), 1))" }.joined(separator: " ")
            svg +=
                "<polyline class=curve data-source=\"\(escape(name))\" points=\"\(path)\" fill=\"none\" stroke=\"\(color)\" stroke-width=\"2\"/>"
            for point in points {
                svg +=
                    "<circle cx=\"\(fixed(x(point.0), 1))\" cy=\"\(fixed(y(point.1), 1))\" r=\"2.5\" fill=\"\(color)\"/>"
            }
            svg +=
                "<text x=\"\(width - right + 8)\" y=\"\(top + 14 * Double(index) + 8)\" font-size=\"11\" fill=\"\(color)\">\(escape(name))</text>"
        }
        return svg + "</svg>\n"
    }

    static let transportOrder = ["tcp", "udp", "tls", "ws", "wss"]

    /// The same colour for a backend (or reference) in every line chart of the page: a backend's own, from its
    /// registration (`Backend.Tooling.colour`); the C floor's, sockperf's and iperf3's here; anything else by the
    /// order it comes in.
    static func color(of name: String) -> String {
        if let colour = Backend.everyCase.first(where: { $0.name == name })?.tooling?.colour { return colour }
        let references = [Report.floorName: palette[0], "sockperf": palette[7], "iperf3": "#7f7f7f"]
        if let colour = references[name] { return colour }
        let others = Backend.everyCase.filter { $0.tooling == nil }.map(\.name)
        return others.firstIndex(of: name).map { palette[($0 + 1) % palette.count] } ?? palette[palette.count - 1]
    }

    /// CPU per message (both ends), least first.
    func cpuBars(_ rows: [ReportRow]) -> String {
        let valued = rows.compactMap { row in row.median.cpuPerMessageNanoseconds.map { (row.backend, [$0 / 1000]) } }
        return bars(valued.sorted { $0.1[0] < $1.1[0] }, series: ["CPU per message, client + server"], unit: "us")
    }

    /// Horizontal grouped bars: one group per label, one bar per series, with a value axis under them.
    func bars(_ data: [(String, [Double])], series: [String], unit: String) -> String {
        guard !data.isEmpty else { return "" }
        let maximum = niceCeiling(max(data.flatMap(\.1).max() ?? 1, 1e-9))
        let barHeight = 9.0
        let groupHeight = barHeight * Double(series.count) + 6
        let left = 130.0
        let width = 900.0
        let plot = width - left - 90
        let axisY = 24 + groupHeight * Double(data.count) + 2
        let height = axisY + 30
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
                    "<rect x=\"\(left)\" y=\"\(y)\" width=\"\(fixed(length, 1))\" height=\"\(barHeight - 1)\" fill=\"\(series.count == 1 ? Self.color(of: label.split(separator: " ").first.map(String.init) ?? label) : Self.palette[index % Self.palette.count])\"/>"
                svg +=
                    "<text x=\"\(fixed(left + length + 4, 1))\" y=\"\(y + barHeight - 1.5)\" font-size=\"9\">\(fixed(value, 1))</text>"
            }
        }
        // The axis: a line and five ticks with their values.
        svg +=
            "<line class=axis x1=\"\(left)\" y1=\"\(axisY)\" x2=\"\(left + plot)\" y2=\"\(axisY)\" stroke=\"#999\"/>"
        for step in 0...5 {
            let value = maximum * Double(step) / 5
            let x = left + plot * Double(step) / 5
            svg +=
                "<line x1=\"\(fixed(x, 1))\" y1=\"\(axisY)\" x2=\"\(fixed(x, 1))\" y2=\"\(axisY + 4)\" stroke=\"#999\"/>"
            svg +=
                "<text x=\"\(fixed(x, 1))\" y=\"\(axisY + 16)\" font-size=\"10\" text-anchor=\"middle\">\(fixed(value, value == value.rounded() ? 0 : 1))</text>"
        }
        svg += "<text x=\"\(left + plot + 16)\" y=\"\(axisY + 16)\" font-size=\"10\">\(escape(unit))</text>"
        return svg + "</svg>\n"
    }

    /// The smallest 1, 2 or 5 times a power of ten at or above `value`, so the five axis steps are round.
    func niceCeiling(_ value: Double) -> Double {
        let power = pow(10, floor(log10(value)))
        for factor in [1.0, 2.0, 5.0, 10.0] where factor * power >= value { return factor * power }
        return 10 * power
    }

    /// HdrHistogram's percentile plot for one pingpong scenario, per transport: latency (log scale) against
    /// the percentile, spaced as 1/(1-p) on a log scale (50%, 90%, 99%, 99.9%, 99.99%, max), one line per
    /// backend, the C floor and tools included as references.
    func percentileChart(_ scenario: Scenario) -> String {
        let rows = report.rows.filter { $0.scenario == scenario && $0.median.latency != nil }
        guard !rows.isEmpty else { return "" }
        let transports = Array(Set(rows.map(\.transport))).sorted {
            (Self.transportOrder.firstIndex(of: $0) ?? 99) < (Self.transportOrder.firstIndex(of: $1) ?? 99)
        }
        let marks: [(String, Double)] = [("50%", 2), ("90%", 10), ("99%", 100), ("99.9%", 1000), ("99.99%", 10_000)]
        var html = ""
        for transport in transports {
            let group = rows.filter { $0.transport == transport }.sorted {
                ($0.median.latency?.p50 ?? 0) < ($1.median.latency?.p50 ?? 0)
            }
            let series: [(String, [Double])] = group.map { row in
                let l = row.median.latency!
                return (row.backend, [l.p50, l.p90, l.p99, l.p999, l.p9999].map { Double(max(1, $0)) / 1000 })
            }
            let values = series.flatMap(\.1)
            let (low, high) = (log10(max(values.min() ?? 1, 0.1)), log10(max(values.max() ?? 10, 1)))
            let top = ceil(high)
            let bottomDecade = min(floor(low), top - 1)
            let width = 900.0
            let height = 300.0
            let (left, right, upper, lower) = (60.0, 170.0, 20.0, 40.0)
            func x(_ inverse: Double) -> Double { left + log10(inverse) / 4 * (width - left - right) }
            func y(_ microseconds: Double) -> Double {
                height - lower - (log10(microseconds) - bottomDecade) / (top - bottomDecade) * (height - upper - lower)
            }
            var svg =
                "<svg class=percentiles width=\"\(Int(width))\" height=\"\(Int(height))\" viewBox=\"0 0 \(Int(width)) \(Int(height))\" role=\"img\">"
            svg +=
                "<line class=axis x1=\"\(left)\" y1=\"\(height - lower)\" x2=\"\(width - right)\" y2=\"\(height - lower)\" stroke=\"#999\"/>"
            svg +=
                "<line class=axis x1=\"\(left)\" y1=\"\(upper)\" x2=\"\(left)\" y2=\"\(height - lower)\" stroke=\"#999\"/>"
            for (label, inverse) in marks {
                svg +=
                    "<text x=\"\(fixed(x(inverse), 1))\" y=\"\(height - lower + 16)\" font-size=\"11\" text-anchor=\"middle\">\(label)</text>"
            }
            svg +=
                "<text x=\"\((width - right + left) / 2)\" y=\"\(height - 6)\" font-size=\"11\" text-anchor=\"middle\">percentile (\(escape(transport)), log scale of 1/(1-p))</text>"
            svg += decades(from: bottomDecade, to: top, left: left, right: width - right, y: y) {
                "\($0 < 1 ? fixed($0, 1) : Int($0).formatted()) us"
            }
            for (index, (name, points)) in series.enumerated() {
                let color = Self.color(of: name)
                let path = zip(marks, points).map { "\(fixed(x($0.0.1), 1)),\(fixed(y($0.1), 1))" }.joined(
                    separator: " ")
                svg += "<polyline points=\"\(path)\" fill=\"none\" stroke=\"\(color)\" stroke-width=\"2\"/>"
                svg +=
                    "<text x=\"\(width - right + 8)\" y=\"\(upper + 14 * Double(index) + 8)\" font-size=\"11\" fill=\"\(color)\">\(escape(name))</text>"
            }
            html += svg + "</svg>\n"
        }
        return html
    }

    /// A log scale's gridlines and labels: one at each power of ten from 10^`low` to 10^`high`, between x `left`
    /// and `right`, at height `y(value)`, labelled `label(value)` on the left.
    func decades(
        from low: Double, to high: Double, left: Double, right: Double, y: (Double) -> Double,
        label: (Double) -> String
    ) -> String {
        var svg = ""
        var decade = low
        while decade <= high {
            let value = pow(10, decade)
            svg +=
                "<text x=\"\(left - 6)\" y=\"\(fixed(y(value) + 4, 1))\" font-size=\"10\" text-anchor=\"end\">\(escape(label(value)))</text>"
            svg +=
                "<line x1=\"\(left)\" y1=\"\(fixed(y(value), 1))\" x2=\"\(right)\" y2=\"\(fixed(y(value), 1))\" stroke=\"#eee\"/>"
            decade += 1
        }
        return svg
    }

    /// p50 (solid) and p99 (dashed) against the number of connections, one line per backend x transport.
    func concurrencyChart(_ scenarios: [Scenario]) -> String {
        let counts: [(Scenario, Int)] = scenarios.compactMap { scenario in
            scenario.as(FaninScenario.self).map { (scenario, $0.count) }
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
            let color = Self.color(of: String(name.split(separator: " ").first ?? Substring(name)))
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
