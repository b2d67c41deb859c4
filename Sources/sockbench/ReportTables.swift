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
        return briefFigures(scenario, m) + (share ?? "")
    }

    private static func briefFigures(_ scenario: Scenario, _ m: ScenarioResult) -> String {
        switch scenario.kind {
        case .pump, .proxyPump:
            var text = "\(fixed((m.bytesPerSecond ?? 0) / 1e6, 1)) MB/s, \(Int(m.messagesPerSecond ?? 0)) msg/s"
            if let lost = m.lost, m.received != nil { text += ", lost \(lost)" }
            return text
        case .connect:
            return "p50 \(microseconds(m.latency?.p50 ?? 0)) us, \(Int(m.messagesPerSecond ?? 0)) conn/s"
        case .json:
            return
                "p50 \(microseconds(m.latency?.p50 ?? 0)) us, \(Int(m.messageBytes ?? 0)) B as \(Int(m.wireBytes ?? 0)) B on the wire"
        case .rate, .workload:
            return
                "p50 \(microseconds(m.latency?.p50 ?? 0)) us (uncorrected \(microseconds(m.uncorrectedLatency?.p50 ?? 0))\(m.quietP50.map { ", quiet \(microseconds($0))" } ?? "")), p99 \(microseconds(m.latency?.p99 ?? 0)) us, lost \(m.lost ?? 0)"
        default:
            return
                "p50 \(microseconds(m.latency?.p50 ?? 0)) us, p99 \(microseconds(m.latency?.p99 ?? 0)) us, \(Int(m.messagesPerSecond ?? 0)) rt/s"
                + (m.serverKiBPerConnection.map { ", server \(fixed($0, 1)) KiB/connection" } ?? "")
        }
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

    /// The header and cells of one scenario's table.
    func table(for scenario: Scenario) -> (header: [String], cells: [[String]]) {
        let selected = rows.filter { $0.scenario == scenario }
        switch scenario.kind {
        case .pump, .proxyPump:
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
        case .connect:
            let header = ["backend", "transport", "connect p50 us", "p90 us", "p99 us", "conn/s", "cpu us/conn"]
            let cells = selected.map { row -> [String] in
                let m = row.median
                return [
                    row.backend, row.transport, microseconds(m.latency?.p50 ?? 0), microseconds(m.latency?.p90 ?? 0),
                    microseconds(m.latency?.p99 ?? 0), "\(Int(m.messagesPerSecond ?? 0))", cpuPerMessage(m),
                ]
            }
            return (header, cells)
        case .json:
            let header = [
                "backend", "transport", "p50 us", "p99 us", "rt/s", "message B", "wire B", "wire / message",
                "cpu us/rt", "client", "server",
            ]
            let cells = selected.map { row -> [String] in
                let m = row.median
                let cpu: (ResourceUsage?) -> String = { usage in
                    guard let usage, m.messages > 0 else { return "-" }
                    return fixed(Double(usage.cpuNanoseconds) / 1000 / Double(m.messages), 1)
                }
                return [
                    row.backend, row.transport, microseconds(m.latency?.p50 ?? 0), microseconds(m.latency?.p99 ?? 0),
                    "\(Int(m.messagesPerSecond ?? 0))", m.messageBytes.map { fixed($0, 0) } ?? "-",
                    m.wireBytes.map { fixed($0, 0) } ?? "-",
                    m.messageBytes.flatMap { total in m.wireBytes.map { fixed($0 / max(1, total), 2) } } ?? "-",
                    cpuPerMessage(m), cpu(m.client), cpu(m.server),
                ]
            }
            return (header, cells)
        case .rate:
            let header = [
                "backend", "transport", "p50 us", "p99 us", "p99.9 us", "max us", "uncorrected p50", "uncorrected p99",
                "quiet p50", "x C floor", "achieved/s", "lost", "cpu us/msg",
            ]
            let cells = selected.map { row -> [String] in
                let m = row.median
                // sockperf's under-load rows have no corrected latency (it corrects for no stall).
                func us(_ value: UInt64?) -> String { value.map { microseconds($0) } ?? "-" }
                let ratio = openLoopRatio(row, over: self.row(Self.floorName, row.transport, scenario))?.text
                return [
                    row.backend, row.transport, us(m.latency?.p50), us(m.latency?.p99), us(m.latency?.p999),
                    us(m.latency?.max), us(m.uncorrectedLatency?.p50), us(m.uncorrectedLatency?.p99), us(m.quietP50),
                    ratio ?? "-",
                    "\(Int(m.messagesPerSecond ?? 0))", "\(m.lost ?? 0)", cpuPerMessage(m),
                ]
            }
            return (header, cells)
        case .workload:
            let header =
                [
                    "backend", "transport", "held", "p50 us", "p99 us", "p99 range", "p99.9 us", "max us",
                    "uncorrected p50", "offered/s", "answered/s", "lost %", "cpu us/msg", "server KiB/conn",
                    "client KiB/conn",
                ] + Self.fairnessHeader
            let cells = selected.map { row -> [String] in
                let m = row.median
                let verdict = verdicts?.first { $0.transport == row.transport && .workload($0.workload) == scenario }
                let entry = verdict?.entries.first { $0.backend == row.backend }
                return [
                    row.backend, row.transport,
                    entry.map { $0.held ? "yes (\($0.repetitionsHeld)/\($0.repetitions))" : "no" } ?? "-",
                    entry.map { microseconds($0.p50) } ?? "-", entry.map { microseconds($0.p99) } ?? "-",
                    entry.map { "\(microseconds($0.p99Range[0]))-\(microseconds($0.p99Range[1]))" } ?? "-",
                    entry.map { microseconds($0.p999) } ?? "-", microseconds(m.latency?.max ?? 0),
                    microseconds(m.uncorrectedLatency?.p50 ?? 0),
                    verdict.map { fixed($0.offeredPerSecond, 0) } ?? "-",
                    entry.map { fixed($0.achievedPerSecond, 0) } ?? "-", entry.map { fixed($0.lossPercent, 2) } ?? "-",
                    cpuPerMessage(m), m.serverKiBPerConnection.map { fixed($0, 1) } ?? "-",
                    m.clientKiBPerConnection.map { fixed($0, 1) } ?? "-",
                ] + Self.fairnessCells(m.fairness)
            }
            return (header, cells)
        default:
            let header =
                [
                    "backend", "transport", "p50 us", "quiet p50", "x floor",
                    "x \(Backend.reference?.name ?? "reference")",
                    "x native", "p50 spread", "p90 us", "p99 us",
                    "p99.9 us",
                    "max us", "rt/s", "lost", "cpu us/rt", "client", "server", "ctx sw/rt", "client", "server",
                    "threads",
                ]
                + (scenario.kind == .fanin
                    ? ["server KiB/conn", "client KiB/conn", "N x one rt", "p50 / (N x rt)", "p99.9"]
                        + Self.fairnessHeader : [])
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
                var cells: [String] = [
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
                if scenario.kind == .fanin {
                    cells += [m.serverKiBPerConnection, m.clientKiBPerConnection].map { $0.map { fixed($0, 1) } ?? "-" }
                    cells += faninExpectation(row)
                    cells += Self.fairnessCells(m.fairness)
                }
                return cells
            }
            return (header, cells)
        }
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

    func terminalTables() -> String {
        var text = ""
        for scenario in plan.scenarios where rows.contains(where: { $0.scenario == scenario }) {
            let (header, cells) = table(for: scenario)
            text += "\n== \(scenario)\n" + Self.render(header, cells) + "\n"
        }
        text += "\n" + summary().joined(separator: "\n") + "\n"
        return text
    }
}
