import BenchmarkDriver

/// What the kernel did underneath a diagram: one end's TCP connection read every millisecond (``LessonTCPSeries``),
/// drawn under the diagram as three graphs on one linear time axis: the bytes sent and acknowledged since the
/// connection opened (a sequence graph, as Stevens' and tcptrace's: the gap between the lines is what is in flight; a red tick where bytes were
/// sent again), the congestion window in segments (the slow-start threshold dashed once a loss set it), and the
/// smoothed round-trip time.
extension LessonPage {
    static let graphHeight = 70.0
    static let graphGap = 26.0

    /// The graphs of `series`, or `nil` when that end sent nothing over the time read (nothing to draw).
    static func tcpGraphs(_ series: LessonTCPSeries) -> (svg: String, height: Double)? {
        let samples = series.samples
        guard let first = samples.first, let last = samples.last, samples.count >= 2,
            last.bytesSent > first.bytesSent
        else { return nil }
        let start = first.at
        let span = max(1, last.at - start)
        let (x0, x1) = (54.0, width - 8)
        func x(_ at: Double) -> Double { x0 + (at - start) / span * (x1 - x0) }
        var body =
            "<text class=\"title\" x=\"8\" y=\"16\">\(escape(series.side.rawValue)) TCP, read every \(duration(series.intervalMicroseconds))</text>\n"
        var top = 30.0

        /// A panel: its frame, its label and largest value, and a step line per value.
        func panel(
            _ label: String, lines: [(className: String, value: (LessonTCPSample) -> Double?)], unit: (Double) -> String
        ) -> (y: (Double) -> Double, svg: String) {
            let largest = max(
                1, lines.flatMap { line in samples.compactMap(line.value) }.max() ?? 1)
            let bottom = top + graphHeight
            let frameTop = top
            func y(_ value: Double) -> Double { bottom - value / largest * graphHeight }
            var svg =
                "<rect class=\"tcp-frame\" x=\"\(fmt(x0))\" y=\"\(fmt(frameTop))\" width=\"\(fmt(x1 - x0))\" height=\"\(fmt(graphHeight))\"/>"
                + "<text x=\"\(fmt(x0))\" y=\"\(fmt(frameTop - 4))\">\(escape(label))</text>"
                + "<text x=\"\(fmt(x0 - 3))\" y=\"\(fmt(frameTop + 8))\" text-anchor=\"end\">\(escape(unit(largest)))</text>"
                + "<text x=\"\(fmt(x0 - 3))\" y=\"\(fmt(bottom))\" text-anchor=\"end\">0</text>\n"
            for line in lines {
                var points: [String] = []
                var previousY: Double?
                for sample in samples {
                    guard let value = line.value(sample) else {
                        previousY = nil
                        continue
                    }
                    let (px, py) = (x(sample.at), y(value))
                    // A step: the value holds until the next reading that changed it.
                    if let previousY { points.append("\(fmt(px)),\(fmt(previousY))") }
                    points.append("\(fmt(px)),\(fmt(py))")
                    previousY = py
                }
                if let previousY { points.append("\(fmt(x1)),\(fmt(previousY))") }
                if points.count >= 2 {
                    svg += "<polyline class=\"\(line.className)\" points=\"\(points.joined(separator: " "))\"/>\n"
                }
            }
            top = bottom + graphGap
            return (y, svg)
        }

        let sequence = panel(
            "bytes sent (blue), acknowledged (green)",
            lines: [
                ("tcp-sent", { Double($0.bytesSent) }),
                ("tcp-acked", { Double($0.bytesAcked) }),
            ], unit: bytes)
        body += sequence.svg
        var resent = 0
        for (previous, sample) in zip(samples, samples.dropFirst())
        where sample.bytesRetransmitted > previous.bytesRetransmitted {
            let px = x(sample.at)
            let py = sequence.y(Double(sample.bytesSent))
            body +=
                "<line class=\"tcp-retransmit\" x1=\"\(fmt(px))\" y1=\"\(fmt(py - 6))\" x2=\"\(fmt(px))\" y2=\"\(fmt(py + 6))\"><title>\(sample.bytesRetransmitted - previous.bytesRetransmitted) B sent again at \(escape(duration(sample.at)))</title></line>\n"
            resent += 1
        }
        body +=
            panel(
                "cwnd, segments (dashed: ssthresh)",
                lines: [
                    ("tcp-cwnd", { Double($0.congestionWindow) }),
                    ("tcp-ssthresh", { $0.slowStartThreshold.map(Double.init) }),
                ], unit: { "\(Int($0))" }
            ).svg
        body +=
            panel("smoothed RTT", lines: [("tcp-rtt", { Double($0.rttMicroseconds) })], unit: duration).svg
        let axis = top - graphGap + 12
        body +=
            "<text x=\"\(fmt(x0))\" y=\"\(fmt(axis))\">\(escape(duration(start)))</text><text x=\"\(fmt(x1))\" y=\"\(fmt(axis))\" text-anchor=\"end\">\(escape(duration(last.at)))</text>\n"
        let height = axis + 8
        let caption =
            "\(series.readings) readings (\(samples.count) changed something), one took \(fixed(series.readingMicroseconds, 1)) us"
            + (resent > 0 ? "; \(resent) reading(s) with bytes sent again" : "")
        let svg = """
            <figure class="tcp" id="tcp-\(series.phase)-\(series.side.rawValue)"><svg class="tcp" width="\(Int(width))" height="\(Int(height))" viewBox="0 0 \(Int(width)) \(Int(height))">
            \(body)</svg><figcaption>\(escape(caption))</figcaption></figure>

            """
        return (svg, height)
    }

    static func bytes(_ value: Double) -> String {
        if value >= 1_048_576 { return fixed(value / 1_048_576, 1) + " MiB" }
        if value >= 1024 { return fixed(value / 1024, 0) + " KiB" }
        return "\(Int(value)) B"
    }
}
