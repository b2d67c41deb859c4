import BenchmarkDriver
import Foundation

/// `sockbench lesson NAME --html FILE`: one self-contained page (no scripts, no fetches) with a time-sequence
/// diagram per phase of the lesson beside its text and figures.
///
/// Each diagram has the client and the server as columns and time going down. Every recorded send is one arrow
/// (`class="arrow"`) from its end to the receive that delivered its last byte, or to a cross halfway when none
/// did (`class="arrow lost"`); every receive is a tick on its column (`class="receive"`); marks (connections,
/// faults, the end of a stream) are dots with their text. Time is drawn compressed: a step grows with the log of
/// the time between two events, so a burst of microseconds and a stall of 40 ms both fit; every gap of 5 ms or
/// more is labelled with its duration on the left.
public enum LessonPage {
    /// The page for `report`, run with `backend`.
    public static func html(_ report: LessonReport, summary: String, backend: String) -> String {
        render(report, summary: summary, backend: backend).html
    }

    /// Diagrams side by side beside the text, at most this many to a row.
    static let perRow = 3

    /// The page, and the window it fits in (the diagrams `perRow` to a row beside the text; the height capped
    /// at 8,000 pixels, where a very long run is cut).
    public static func render(
        _ report: LessonReport, summary: String, backend: String
    ) -> (html: String, width: Int, height: Int) {
        var text = ""
        for (index, line) in report.lines.enumerated() {
            if let phase = report.pointers[index], phase < report.phases.count {
                text +=
                    "<p class=\"here\"><a href=\"#phase-\(phase)\">\(escape(line))</a> <span class=\"see\">(see \(escape(report.phases[phase].title)))</span></p>\n"
            } else if line.isEmpty {
                text += "<p class=\"blank\"></p>\n"
            } else {
                text += "<p>\(escape(line))</p>\n"
            }
        }
        let figures = report.figures.sorted { $0.key < $1.key }.map {
            "<tr><td>\(escape($0.key))</td><td>\(number($0.value))</td></tr>"
        }.joined(separator: "\n")
        var diagrams = ""
        var heights: [Double] = []
        for (index, phase) in report.phases.enumerated() {
            let events = report.events.filter { $0.phase == index }
            let charts = report.charts.filter { $0.phase == index }.map(chartFigure)
            // A phase drawn only as charts (no sends recorded) has its title and no empty diagram.
            let drawn =
                events.isEmpty && !charts.isEmpty
                ? (
                    svg:
                        "<figure id=\"phase-\(index)\"><h2 class=\"chart-title\">\(escape(phase.title))</h2></figure>\n",
                    height: 24.0
                ) : diagram(index, phase, events)
            // With each diagram, what TCP did underneath at each end that sent (cwnd, RTT, bytes in flight): above
            // the diagram, under the phase's title, so that a tall diagram (hundreds of arrows) cannot push them off
            // the bottom of a picture.
            let graphs = report.tcp.filter { $0.phase == index }.compactMap(tcpGraphs)
            let heading =
                graphs.isEmpty || events.isEmpty
                ? "" : "<h2 class=\"chart-title\">\(escape(phase.title))</h2>\n"
            diagrams +=
                "<div class=\"phase\">\n" + heading + graphs.map(\.svg).joined() + drawn.svg
                + charts.map(\.svg).joined() + "</div>\n"
            heights.append(
                drawn.height + (graphs + charts).map { $0.height + 30 }.reduce(0, +) + (heading.isEmpty ? 0 : 24))
        }
        let columns = max(1, min(perRow, heights.count))
        let rows = stride(from: 0, to: heights.count, by: columns).map {
            (heights[$0..<min(heights.count, $0 + columns)].max() ?? 0) + 44
        }
        // A line wraps at about 104 characters in the 740-pixel text column; a "Here" line's "(see ...)" adds more.
        let textLines = report.lines.enumerated().map { index, line in
            ((line.count + (report.pointers[index] == nil ? 0 : 40)) / 104) + 1
        }.reduce(0, +)
        let textHeight = 150 + Double(textLines) * 16.5 + Double(report.figures.count) * 19
        let width = 830 + columns * Int(Self.width + 18)
        let height = min(8000, max(600, Int(max(textHeight, 100 + rows.reduce(0, +)))))
        let sends = report.events.filter { $0.kind == .send }.count
        let html = """
            <!DOCTYPE html>
            <html lang="en"><head><meta charset="utf-8">
            <title>sockbench lesson \(escape(report.lesson)) (\(escape(backend)))</title>
            <style>
            body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #1d1d1f; }
            h1 { font-size: 20px; margin: 0 0 4px; } .sub { color: #555; margin: 0 0 4px; }
            .legend { color: #555; font-size: 12px; margin: 0 0 14px; } .legend .c { color: #2763c4; }
            .legend .s { color: #1f8a4c; } .legend .l { color: #c62828; }
            .layout { display: flex; gap: 28px; align-items: flex-start; }
            .text { flex: 0 0 740px; } .text p { margin: 0; white-space: pre-wrap; font: 11.5px/1.4 ui-monospace, monospace; }
            .text p.blank { height: 10px; }
            .text p.here { background: #fff6d6; } .text a { color: #0b57d0; } .see { color: #777; font-size: 12px; }
            .diagrams { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; }
            figure { margin: 0; } figcaption { font-size: 12px; color: #444; max-width: 300px; }
            table { border-collapse: collapse; margin-top: 14px; font-size: 12px; }
            td { border-bottom: 1px solid #ddd; padding: 1px 8px 1px 0; }
            svg text { font: 10px system-ui, sans-serif; fill: #333; }
            svg .title { font-size: 12px; font-weight: 600; } svg .gap { fill: #a33; }
            svg .arrow { stroke: #2763c4; stroke-width: 1.1; fill: none; }
            svg .arrow.back { stroke: #1f8a4c; } svg .arrow.lost { stroke: #c62828; stroke-dasharray: 3 2; }
            svg .receive { stroke: #111; stroke-width: 2; } svg .life { stroke: #999; stroke-width: 1; }
            svg .mark { fill: #8a4fbf; } svg .head { fill: #555; } svg .cross { stroke: #c62828; stroke-width: 2; }
            svg .note { fill: #8a4fbf; } svg .flagged { fill: #c62828; }
            svg rect.kernel { fill: #777; } svg text.kernel { fill: #666; font-size: 9px; font-style: italic; }
            .phase { display: flex; flex-direction: column; gap: 8px; }
            svg .tcp-frame { fill: #fafafa; stroke: #ccc; } svg polyline { fill: none; stroke-width: 1.3; }
            svg .tcp-sent { stroke: #2763c4; } svg .tcp-acked { stroke: #1f8a4c; } svg .tcp-cwnd { stroke: #333; }
            svg .tcp-ssthresh { stroke: #e08a00; stroke-dasharray: 4 3; } svg .tcp-rtt { stroke: #8a4fbf; }
            svg .tcp-retransmit { stroke: #c62828; stroke-width: 2; }
            h2.chart-title { font-size: 13px; margin: 0; } svg .chart-mark { stroke: #bbb; stroke-dasharray: 2 2; }
            svg .chart-0 { stroke: #2763c4; } svg .chart-1 { stroke: #1f8a4c; } svg .chart-2 { stroke: #e08a00; }
            svg .chart-3 { stroke: #c62828; } svg .chart-4 { stroke: #8a4fbf; } svg .chart-5 { stroke: #999; stroke-dasharray: 4 3; }
            .chart-key-0 { color: #2763c4; } .chart-key-1 { color: #1f8a4c; } .chart-key-2 { color: #e08a00; }
            .chart-key-3 { color: #c62828; } .chart-key-4 { color: #8a4fbf; } .chart-key-5 { color: #999; }
            </style></head><body>
            <h1>sockbench lesson \(escape(report.lesson))</h1>
            <p class="sub">\(escape(summary)) &middot; backend \(escape(backend)) &middot; \(sends) arrows, one per send recorded</p>
            <p class="legend">Time runs down, compressed (red figures: gaps of 5 ms or more). <span class="c">&#9472;</span> client to server, <span class="s">&#9472;</span> server to client, each arrow from a send to the receive that delivered its last byte; <span class="l">&#10005;</span> never received; a bar is a receive; a dot is an event; a grey square, the kernel's view of that end's TCP connection then (TCP_INFO). Above a diagram, each end's TCP connection read every millisecond, on one time axis: bytes sent and acknowledged (red: sent again), the congestion window, the smoothed round trip.</p>
            <div class="layout">
            <div class="text">
            \(text)
            <table>\(figures)</table>
            </div>
            <div class="diagrams">
            \(diagrams)
            </div>
            </div>
            </body></html>

            """
        return (html, width, height)
    }

    /// Columns of a diagram.
    static let width = 300.0
    static let left = 76.0
    static let right = 226.0
    static let top = 52.0

    static func x(_ side: LessonEvent.Side) -> Double {
        switch side {
        case .client: left
        case .server: right
        case .between: (left + right) / 2
        }
    }

    /// A vertical step for `microseconds` between two events: a few pixels for a microsecond, more with each
    /// factor of ten, at most 46.
    static func step(_ microseconds: Double) -> Double {
        guard microseconds > 0 else { return 0 }
        return min(46, 2 + 11 * log10(1 + microseconds / 4))
    }

    static func diagram(_ index: Int, _ phase: LessonPhase, _ events: [LessonEvent]) -> (svg: String, height: Double) {
        // Every time anything happened in this phase, in order, and the y each is drawn at.
        var times = Set<Double>()
        for event in events {
            times.insert(event.at)
            if let arrived = event.arrived { times.insert(arrived) }
        }
        let ordered = times.sorted()
        var y: [Double: Double] = [:]
        var gaps: [(y: Double, microseconds: Double)] = []
        var position = top
        var previous: Double?
        for time in ordered {
            if let previous {
                let delta = time - previous
                position += step(delta)
                if delta >= 5_000 { gaps.append((position - step(delta) / 2, delta)) }
            }
            y[time] = position
            previous = time
        }
        let height = position + 40
        let lostDrop = 14.0
        var body = ""
        body += "<text class=\"title\" x=\"8\" y=\"16\">\(escape(phase.title))</text>\n"
        body += "<text x=\"\(left - 18)\" y=\"36\">client</text><text x=\"\(right - 18)\" y=\"36\">server</text>\n"
        body +=
            "<line class=\"life\" x1=\"\(left)\" y1=\"42\" x2=\"\(left)\" y2=\"\(fmt(height - 20))\"/><line class=\"life\" x1=\"\(right)\" y1=\"42\" x2=\"\(right)\" y2=\"\(fmt(height - 20))\"/>\n"
        for gap in gaps {
            body +=
                "<text class=\"gap\" x=\"4\" y=\"\(fmt(gap.y + 3))\">\(escape(duration(gap.microseconds)))</text><line class=\"life\" x1=\"\(left - 6)\" y1=\"\(fmt(gap.y - 2))\" x2=\"\(left + 6)\" y2=\"\(fmt(gap.y + 2))\"/>\n"
        }
        let labelled = events.filter { $0.kind == .send }.count <= 40
        for event in events {
            let from = x(event.side)
            let at = y[event.at] ?? top
            switch event.kind {
            case .send:
                let to = event.side == .client ? right : left
                let back = event.side == .server ? " back" : ""
                let tip = "send \(event.number.map { "#\($0) " } ?? "")\(event.bytes) B at \(duration(event.at))"
                if let arrived = event.arrived {
                    let end = y[arrived] ?? at
                    body +=
                        head(from: (from, at), to: (to, end))
                        + "<path class=\"arrow\(back)\" d=\"M\(fmt(from)),\(fmt(at)) L\(fmt(to)),\(fmt(end))\"><title>\(escape(tip)), arrived after \(escape(duration(arrived - event.at)))\(event.text.map { "; " + escape($0) } ?? "")</title></path>\n"
                } else {
                    let middle = (from + to) / 2
                    body +=
                        "<path class=\"arrow lost\" d=\"M\(fmt(from)),\(fmt(at)) L\(fmt(middle)),\(fmt(at + lostDrop))\"><title>\(escape(tip)): never received\(event.text.map { "; " + escape($0) } ?? "")</title></path>"
                        + "<path class=\"cross\" d=\"M\(fmt(middle - 4)),\(fmt(at + lostDrop - 4)) l8,8 m0,-8 l-8,8\"/>\n"
                }
                if labelled {
                    let anchor = event.side == .client ? "end" : "start"
                    let labelX = event.side == .client ? from - 4 : from + 4
                    body +=
                        "<text x=\"\(fmt(labelX))\" y=\"\(fmt(at + 3))\" text-anchor=\"\(anchor)\"\(event.text == nil ? "" : " class=\"flagged\"")>\(event.number.map { "#\($0) " } ?? "")\(event.bytes) B</text>\n"
                }
            case .receive:
                body +=
                    "<line class=\"receive\" x1=\"\(fmt(from - 5))\" y1=\"\(fmt(at))\" x2=\"\(fmt(from + 5))\" y2=\"\(fmt(at))\"><title>receive \(event.bytes) B at \(escape(duration(event.at)))</title></line>\n"
            case .kernel:
                let anchor = event.side == .server ? "end" : "start"
                let labelX = event.side == .server ? from - 6 : from + 6
                body +=
                    "<rect class=\"kernel\" x=\"\(fmt(from - 2.5))\" y=\"\(fmt(at - 2.5))\" width=\"5\" height=\"5\"/><text class=\"kernel\" x=\"\(fmt(labelX))\" y=\"\(fmt(at + 3))\" text-anchor=\"\(anchor)\">\(escape(event.text ?? ""))</text>\n"
            case .mark:
                let anchor = event.side == .server ? "end" : "start"
                let labelX = event.side == .server ? from - 6 : from + 6
                body +=
                    "<circle class=\"mark\" cx=\"\(fmt(from))\" cy=\"\(fmt(at))\" r=\"3\"/><text class=\"note\" x=\"\(fmt(labelX))\" y=\"\(fmt(at + 3))\" text-anchor=\"\(anchor)\">\(escape(event.text ?? ""))</text>\n"
            }
        }
        var caption = "\(phase.transport): \(events.filter { $0.kind == .send }.count) sends drawn"
        if phase.notDrawn > 0 { caption += ", \(phase.notDrawn) more sends and receives not drawn" }
        let svg = """
            <figure id="phase-\(index)"><svg class="lesson" width="\(Int(width))" height="\(Int(height))" viewBox="0 0 \(Int(width)) \(Int(height))">
            \(body)</svg><figcaption>\(escape(caption))</figcaption></figure>

            """
        return (svg, height)
    }

    /// An arrowhead at `to`, pointing along the line from `from`.
    static func head(from: (Double, Double), to: (Double, Double)) -> String {
        let dx = to.0 - from.0
        let dy = to.1 - from.1
        let length = max(0.001, (dx * dx + dy * dy).squareRoot())
        let (ux, uy) = (dx / length, dy / length)
        let back = (to.0 - 7 * ux, to.1 - 7 * uy)
        let a = (back.0 - 3 * uy, back.1 + 3 * ux)
        let b = (back.0 + 3 * uy, back.1 - 3 * ux)
        return
            "<path class=\"head\" d=\"M\(fmt(to.0)),\(fmt(to.1)) L\(fmt(a.0)),\(fmt(a.1)) L\(fmt(b.0)),\(fmt(b.1)) z\"/>"
    }

    static func duration(_ microseconds: Double) -> String {
        if microseconds >= 1_000_000 { return fixed(microseconds / 1_000_000, 2) + " s" }
        if microseconds >= 1_000 { return fixed(microseconds / 1_000, 1) + " ms" }
        return fixed(microseconds, 0) + " us"
    }

    static func number(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? String(Int(value)) : fixed(value, 2)
    }

    static func fmt(_ value: Double) -> String { fixed(value, 1) }

    static func escape(_ text: String) -> String {
        var result = ""
        for character in text {
            switch character {
            case "&": result += "&amp;"
            case "<": result += "&lt;"
            case ">": result += "&gt;"
            case "\"": result += "&quot;"
            default: result.append(character)
            }
        }
        return result
    }
}
