import BenchmarkDriver

/// Values over time that a lesson draws beside (or instead of) a diagram's arrows: panels on one time axis, each
/// with its lines (several flows' throughput, a ping's round trip), and marks where something began.
public struct LessonChart: Codable, Sendable, Hashable {
    /// The diagram (``LessonPhase``) it is drawn under.
    public var phase: Int
    /// The time axis, microseconds on the chart's own clock (the congestion lesson's: 0 is when the first flow
    /// began).
    public var start: Double
    public var end: Double
    public var panels: [Panel]
    /// Vertical marks across every panel: when something began.
    public var marks: [Mark] = []

    public struct Panel: Codable, Sendable, Hashable {
        public var label: String
        public var unit: Unit
        /// The top of the scale; `nil`: the largest value drawn.
        public var maximum: Double?
        public var lines: [Line]
    }

    public enum Unit: String, Codable, Sendable, Hashable {
        case bytes, bitsPerSecond, segments, microseconds, ratio
    }

    public struct Line: Codable, Sendable, Hashable {
        public var name: String
        /// Its colour: 0-3 the flows', 4 the ping's, 5 a reference.
        public var style: Int
        /// Drawn as steps (a value holds until the next) rather than straight segments between points.
        public var steps: Bool
        public var points: [Point]
    }

    public struct Point: Codable, Sendable, Hashable {
        public var at: Double
        public var value: Double
    }

    public struct Mark: Codable, Sendable, Hashable {
        public var at: Double
        public var text: String
    }
}

extension LessonPage {
    /// `chart` as one figure: its panels stacked on one linear time axis.
    static func chartFigure(_ chart: LessonChart) -> (svg: String, height: Double) {
        let (x0, x1) = (62.0, width - 8)
        let span = max(1, chart.end - chart.start)
        func x(_ at: Double) -> Double { x0 + (min(max(at, chart.start), chart.end) - chart.start) / span * (x1 - x0) }
        var body = ""
        var top = 16.0
        for panel in chart.panels {
            let values = panel.lines.flatMap { $0.points.map(\.value) }
            let largest = panel.maximum ?? max(values.max() ?? 1, panel.unit == .ratio ? 1 : 1e-9)
            let bottom = top + graphHeight
            func y(_ value: Double) -> Double { bottom - min(value, largest) / largest * graphHeight }
            body +=
                "<rect class=\"tcp-frame\" x=\"\(fmt(x0))\" y=\"\(fmt(top))\" width=\"\(fmt(x1 - x0))\" height=\"\(fmt(graphHeight))\"/>"
                + "<text x=\"\(fmt(x0))\" y=\"\(fmt(top - 4))\">\(escape(panel.label))</text>"
                + "<text x=\"\(fmt(x0 - 3))\" y=\"\(fmt(top + 8))\" text-anchor=\"end\">\(escape(format(largest, panel.unit)))</text>"
                + "<text x=\"\(fmt(x0 - 3))\" y=\"\(fmt(bottom))\" text-anchor=\"end\">0</text>\n"
            for mark in chart.marks {
                body +=
                    "<line class=\"chart-mark\" x1=\"\(fmt(x(mark.at)))\" y1=\"\(fmt(top))\" x2=\"\(fmt(x(mark.at)))\" y2=\"\(fmt(bottom))\"><title>\(escape(mark.text))</title></line>"
            }
            for line in panel.lines where !line.points.isEmpty {
                var points: [String] = []
                var previous: Double?
                for point in line.points {
                    let (px, py) = (x(point.at), y(point.value))
                    if line.steps, let previous { points.append("\(fmt(px)),\(fmt(previous))") }
                    points.append("\(fmt(px)),\(fmt(py))")
                    previous = py
                }
                if points.count == 1 { points.append(points[0]) }
                body +=
                    "<polyline class=\"chart-\(line.style)\" points=\"\(points.joined(separator: " "))\"><title>\(escape(line.name))</title></polyline>\n"
            }
            top = bottom + graphGap
        }
        let axis = top - graphGap + 12
        body +=
            "<text x=\"\(fmt(x0))\" y=\"\(fmt(axis))\">\(seconds(chart.start))</text><text x=\"\(fmt(x1))\" y=\"\(fmt(axis))\" text-anchor=\"end\">\(seconds(chart.end))</text>\n"
        let legend = chart.panels.flatMap(\.lines).reduce(into: [(String, Int)]()) { names, line in
            if !names.contains(where: { $0.0 == line.name }) { names.append((line.name, line.style)) }
        }
        let caption =
            legend.map { "<span class=\"chart-key-\($0.1)\">&#9472;</span> \(escape($0.0))" }.joined(separator: " ")
            + (chart.marks.isEmpty
                ? "" : "; grey lines: " + chart.marks.map { escape($0.text) }.joined(separator: ", "))
        let height = axis + 8
        let svg = """
            <figure class="chart" id="chart-\(chart.phase)"><svg class="chart" width="\(Int(width))" height="\(Int(height))" viewBox="0 0 \(Int(width)) \(Int(height))">
            \(body)</svg><figcaption>\(caption)</figcaption></figure>

            """
        return (svg, height)
    }

    /// A time on a chart's axis (which may start before 0), in seconds.
    static func seconds(_ microseconds: Double) -> String {
        (microseconds < 0 ? "-" : "") + fixed(abs(microseconds) / 1e6, 1) + " s"
    }

    static func format(_ value: Double, _ unit: LessonChart.Unit) -> String {
        switch unit {
        case .bytes: bytes(value)
        case .bitsPerSecond: fixed(value / 1e6, value >= 10e6 ? 0 : 1) + " Mbit/s"
        case .segments: "\(Int(value.rounded()))"
        case .microseconds: duration(value)
        case .ratio: fixed(value, 2)
        }
    }
}
