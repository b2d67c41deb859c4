import BenchmarkDriver
import Foundation
import SocketStyles

/// A sweep (`compare --sweep`): the open-loop rate rows read as one latency-against-load curve per source x
/// transport, each source's highest rate that holds a p99 bound, and the curves drawn.
extension Report {
    /// One step of a curve: the medians over the step's repetitions.
    struct SweepPoint {
        var rate: Int
        var p50: UInt64
        var p99: UInt64
        var p999: UInt64
        var achieved: Double
        var lossPercent: Double
        var repetitions: Int
    }

    /// A step *holds* a p99 bound when the echoes kept up (at least 95% of the offered rate answered, at most 1%
    /// lost) and its p99 from the intended send time is within the bound.
    static func holds(_ point: SweepPoint, bound: UInt64) -> Bool {
        point.achieved >= WorkloadVerdict.minimumShare * Double(point.rate)
            && point.lossPercent <= WorkloadVerdict.maximumLossPercent && point.p99 <= bound
    }

    /// A step past a target's knee: the echoes did not keep up (under 95% of the offered rate answered, or more
    /// than 1% lost), or the median message waited longer than the bound. A sweep stops for the target there (in
    /// that repetition). Not the p99: one pause of the machine puts a 0.5 s step's p99 past 10 ms at any rate.
    static func saturated(_ point: SweepPoint, bound: UInt64) -> Bool {
        point.achieved < WorkloadVerdict.minimumShare * Double(point.rate)
            || point.lossPercent > WorkloadVerdict.maximumLossPercent || point.p50 > bound
    }

    static func saturated(_ measurement: ScenarioResult, perSecond: Int, bound: UInt64) -> Bool {
        guard let point = sweepPoint([measurement], rate: perSecond) else { return true }
        return saturated(point, bound: bound)
    }

    static func sweepPoint(_ results: [ScenarioResult], rate: Int) -> SweepPoint? {
        let measured = results.filter { $0.latency != nil }
        guard !measured.isEmpty else { return nil }
        func mid<T: Comparable>(_ values: [T]) -> T { values.sorted()[values.count / 2] }
        return SweepPoint(
            rate: rate, p50: mid(measured.map { $0.latency!.p50 }), p99: mid(measured.map { $0.latency!.p99 }),
            p999: mid(measured.map { $0.latency!.p999 }), achieved: mid(measured.map { $0.messagesPerSecond ?? 0 }),
            lossPercent: mid(
                measured.map { $0.messages > 0 ? Double($0.lost ?? 0) * 100 / Double($0.messages) : 100 }),
            repetitions: measured.count)
    }

    /// The curves of one transport: the C floor first, then the backends in the run's order, each with its steps
    /// in rising rate.
    func sweepCurves(_ transport: String) -> [(source: String, points: [SweepPoint])] {
        guard let rates = plan.sweep else { return [] }
        return ([Self.floorName] + plan.backends).compactMap { source in
            let points = rates.compactMap { rate -> SweepPoint? in
                rows.first {
                    $0.scenario == .rate(perSecond: rate) && $0.backend == source && $0.transport == transport
                }
                .flatMap { Self.sweepPoint($0.repetitions, rate: rate) }
            }
            return points.isEmpty ? nil : (source, points)
        }
    }

    /// The summary's lines: per transport, each source's highest rate that held 1 ms and the run's bound, and
    /// where each saturated.
    func sweepLines() -> [String] {
        guard let rates = plan.sweep, let first = rates.first, let last = rates.last else { return [] }
        let bound = plan.p99Bound ?? Compare.Plan.defaultP99Bound
        var lines: [String] = []
        for transport in plan.transports {
            let curves = sweepCurves(transport)
            guard !curves.isEmpty else { continue }
            func highest(_ limit: UInt64) -> String {
                curves.map { curve in
                    let held = curve.points.filter { Self.holds($0, bound: limit) }.map(\.rate).max()
                    return "\(curve.source) \(held.map(String.init) ?? "none")"
                }.joined(separator: ", ")
            }
            var line =
                "- Latency against load, \(transport) (open loop, 64 B, \(first)-\(last)/s): the highest rate each held with p99 <= 1 ms (answered >= 95%, <= 1% lost): \(highest(1_000_000))"
            if bound != 1_000_000 { line += "; with p99 <= \(WorkloadVerdict.time(bound)): \(highest(bound))" }
            let saturation = curves.compactMap { curve -> String? in
                guard let point = curve.points.first(where: { Self.saturated($0, bound: bound) }) else { return nil }
                let p99 = point.p99 == 0 ? "no echo timed" : "p99 \(WorkloadVerdict.time(point.p99))"
                return
                    "\(curve.source) at \(point.rate) (\(fixed(point.achieved / Double(point.rate) * 100, 0))% answered, p50 \(WorkloadVerdict.time(point.p50)), \(p99))"
            }
            line +=
                saturation.isEmpty
                ? "; none saturated (answered < 95%, > 1% lost, or p50 over the bound)."
                : "; saturated (answered < 95%, > 1% lost, or p50 over the bound) first at: "
                    + saturation.joined(separator: ", ") + "."
            lines.append(line)
        }
        return lines
    }
}

extension ReportHTML {
    /// Latency against offered load for one transport, log scales on both axes: p99 (solid, one curve per
    /// source, class `curve`) and p50 (dotted), the bound as a horizontal line.
    func sweepChart(_ transport: String) -> String {
        let curves = report.sweepCurves(transport)
        guard !curves.isEmpty, let rates = report.plan.sweep, let firstRate = rates.first, let lastRate = rates.last
        else { return "" }
        let bound = Double(report.plan.p99Bound ?? Compare.Plan.defaultP99Bound) / 1000
        let width = 900.0
        let height = 380.0
        let (left, right, top, bottom) = (70.0, 150.0, 20.0, 44.0)
        let values =
            curves.flatMap { $0.points.flatMap { [Double($0.p50), Double($0.p99)] } }.map { $0 / 1000 } + [bound]
        let (lowY, highY) = (floor(log10(max(1, values.min() ?? 1))), ceil(log10(max(10, values.max() ?? 10))))
        let (lowX, highX) = (log10(Double(firstRate)), max(log10(Double(lastRate)), log10(Double(firstRate)) + 1e-9))
        func x(_ rate: Int) -> Double { left + (log10(Double(rate)) - lowX) / (highX - lowX) * (width - left - right) }
        func y(_ us: Double) -> Double {
            height - bottom - (log10(max(1, us)) - lowY) / max(1e-9, highY - lowY) * (height - top - bottom)
        }
        var svg =
            "<svg class=sweep width=\"\(Int(width))\" height=\"\(Int(height))\" viewBox=\"0 0 \(Int(width)) \(Int(height))\" role=\"img\">"
        svg +=
            "<line class=axis x1=\"\(left)\" y1=\"\(height - bottom)\" x2=\"\(width - right)\" y2=\"\(height - bottom)\" stroke=\"#999\"/>"
        svg +=
            "<line class=axis x1=\"\(left)\" y1=\"\(top)\" x2=\"\(left)\" y2=\"\(height - bottom)\" stroke=\"#999\"/>"
        for rate in rates {
            svg +=
                "<text x=\"\(fixed(x(rate), 1))\" y=\"\(height - bottom + 16)\" font-size=\"11\" text-anchor=\"middle\">\(rate >= 1000 ? "\(rate / 1000)k" : "\(rate)")</text>"
        }
        svg +=
            "<text x=\"\((width - right + left) / 2)\" y=\"\(height - 8)\" font-size=\"11\" text-anchor=\"middle\">offered load, messages per second (\(escape(transport)), log scale)</text>"
        svg += decades(from: lowY, to: highY, left: left, right: width - right, y: y) {
            $0 >= 1000 ? "\(Int($0 / 1000)) ms" : "\(Int($0)) us"
        }
        svg +=
            "<line x1=\"\(left)\" y1=\"\(fixed(y(bound), 1))\" x2=\"\(width - right)\" y2=\"\(fixed(y(bound), 1))\" stroke=\"#c00\" stroke-dasharray=\"6 4\"/>"
        svg +=
            "<text x=\"\(width - right + 8)\" y=\"\(fixed(y(bound) + 4, 1))\" font-size=\"10\" fill=\"#c00\">p99 bound</text>"
        for (index, curve) in curves.enumerated() {
            // A step with no echo timed (every message lost) has no latency to draw.
            let drawn = curve.points.filter { $0.p99 > 0 }
            let color = Self.color(of: curve.source)
            let p99 = drawn.map { "\(fixed(x($0.rate), 1)),\(fixed(y(Double($0.p99) / 1000), 1))" }
            let p50 = drawn.map { "\(fixed(x($0.rate), 1)),\(fixed(y(Double($0.p50) / 1000), 1))" }
            svg +=
                "<polyline class=curve data-source=\"\(escape(curve.source))\" points=\"\(p99.joined(separator: " "))\" fill=\"none\" stroke=\"\(color)\" stroke-width=\"2\"/>"
            svg +=
                "<polyline points=\"\(p50.joined(separator: " "))\" fill=\"none\" stroke=\"\(color)\" stroke-width=\"1\" stroke-dasharray=\"2 3\"/>"
            svg +=
                "<text x=\"\(width - right + 8)\" y=\"\(top + 14 * Double(index) + 8)\" font-size=\"11\" fill=\"\(color)\">\(escape(curve.source))</text>"
        }
        return svg + "</svg>\n"
    }
}

extension Array where Element == String {
    /// The first two elements (the second empty when there is one).
    var pair: (String, String) { (first ?? "", count > 1 ? self[1] : "") }
}
