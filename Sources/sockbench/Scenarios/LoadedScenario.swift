import BenchmarkDriver
import ConnectionCore
import Foundation
import SocketStyles

/// `loaded-K`: latency under load. A probe makes closed-loop 64-byte round trips on one connection while K other
/// connections to the same server process carry bulk traffic echoed back (tcp, tls, ws, wss: 64 KiB writes; udp:
/// 1,400-byte datagrams; each keeps 8 messages in flight), for `--seconds` per repetition (`--count`: that many
/// probe round trips). `loaded-0` is the same probe on an idle server: the report sets every `loaded-K` row against
/// it, repetition by repetition, and gives round trips per minute under load (RPM, 60 s over the probe's p50: the
/// responsiveness figure of Apple's networkQuality and the IETF draft, which use a trimmed mean over several kinds
/// of probe; here one kind, its median) and the bulk bytes echoed meanwhile (``LoadedRunner``).
struct LoadedScenario: ScenarioKind {
    static let prefix = "loaded"
    static let usage = "loaded-K"
    static let about =
        "latency under load: a probe's 64-byte round trips on one connection while K other connections to the same server carry bulk traffic (64 KiB writes, udp 1,400-byte datagrams), every byte echoed; loaded-0 is the idle reference"
    /// The bulk connections beside the probe.
    var bulk: Int

    init(bulk: Int) { self.bulk = bulk }

    init(argument: String?, name: String) throws(ScenarioError) {
        guard let argument, let bulk = Int(argument), bulk >= 0, bulk <= 1_000 else {
            throw ScenarioError(message: "'\(name)' needs the bulk connections beside the probe, 0 to 1000: loaded-16")
        }
        self.bulk = bulk
    }

    var loadName: String? { "An interactive connection beside bulk flows (its p99)" }

    var name: String { "loaded-\(bulk)" }
    var connections: Int? { bulk + 1 }

    /// The probe's measured round trips last `--seconds` (or are `--count`), and are at least 100 however long
    /// they take, after 10 of warm-up: beside bulk traffic one may take tens of milliseconds.
    func measure(_ context: MeasureContext) async throws(ConnectionError) -> ScenarioResult {
        let plan = context.plan
        var probe = PingRunner(
            count: plan.pingpongSeconds == nil ? plan.pingpongCount : 10_000_000, warmup: 10, timeout: .seconds(30))
        probe.keepsSamples = true
        probe.duration = plan.pingpongSeconds.map { .milliseconds(Int($0 * 1000)) }
        probe.minimumCount = Self.minimumProbes
        return try await LoadedRunner(bulk: bulk, probe: probe).run(connect: context.connector)
    }

    /// The fewest probe round trips a repetition measures.
    static let minimumProbes = 100

    /// Judged by the probe's p99.
    func mainFigure(_ measurement: ScenarioResult) -> Double { Double(measurement.latency?.p99 ?? 0) }
    var mainFigureName: String { "p99 us" }
    var judgedByP50: Bool { false }

    func brief(_ m: ScenarioResult) -> String {
        "probe p50 \(microseconds(m.latency?.p50 ?? 0)) us, p99 \(microseconds(m.latency?.p99 ?? 0)) us, \(m.messages) rt"
            + (m.bytesPerSecond.map { ", bulk \(fixed($0 / 1e6, 1)) MB/s" } ?? "")
            + (m.lost.map { $0 > 0 ? ", lost \($0)" : "" } ?? "")
    }

    /// The probe's percentiles, each over the same backend and transport's `loaded-0` (paired repetitions), its
    /// RPM, and what the bulk connections got.
    func table(_ report: Report, rows: [ReportRow]) -> (header: [String], cells: [[String]]) {
        let header = [
            "backend", "transport", "K", "probe p50 us", "p99 us", "p99.9 us", "x idle p50", "x idle p99",
            "x idle p99.9", "RPM", "probe rt", "lost", "bulk MB/s", "bulk fairness", "server cpu %",
        ]
        let cells = rows.map { row -> [String] in
            let m = row.median
            let idle = report.row(row.backend, row.transport, .loaded(bulk: 0))
            func overIdle(_ figure: @escaping (LatencySummary) -> UInt64) -> String {
                guard bulk > 0 else { return "-" }
                return report.ratio(row, over: idle) { $0.latency.map { Double(figure($0)) } }?.text ?? "-"
            }
            let serverShare = m.server.flatMap { usage in
                m.elapsedNanoseconds > 0 ? Double(usage.cpuNanoseconds) / Double(m.elapsedNanoseconds) * 100 : nil
            }
            return [
                row.backend, row.transport, "\(bulk)", microseconds(m.latency?.p50 ?? 0),
                microseconds(m.latency?.p99 ?? 0), microseconds(m.latency?.p999 ?? 0), overIdle(\.p50),
                overIdle(\.p99), overIdle(\.p999), Self.rpm(m).map { fixed($0, 0) } ?? "-", "\(m.messages)",
                "\(m.lost ?? 0)", m.bytesPerSecond.map { fixed($0 / 1e6, 1) } ?? "-",
                m.fairness.map { fixed($0.jainIndex, 3) } ?? "-", serverShare.map { fixed($0, 0) } ?? "-",
            ]
        }
        return (header, cells)
    }

    /// Round trips per minute at the probe's median: 60 s / p50.
    static func rpm(_ m: ScenarioResult) -> Double? {
        guard let p50 = m.latency?.p50, p50 > 0 else { return nil }
        return 60e9 / Double(p50)
    }

    /// The last `loaded-K` of the plan draws the probe's p99 against K for every one (the bars of each are its
    /// table's).
    func chart(_ page: ReportHTML, rows: [ReportRow]) -> String {
        let planned = page.report.plan.scenarios.compactMap { $0.as(LoadedScenario.self) }
        guard planned.count > 1, planned.last == self else { return "" }
        return page.perTransport(page.report.rows.filter { $0.scenario.is(LoadedScenario.self) }) { group in
            var lines: [String: [(Double, Double)]] = [:]
            for row in group {
                guard let k = row.scenario.as(LoadedScenario.self)?.bulk, let p99 = row.median.latency?.p99 else {
                    continue
                }
                lines[row.backend, default: []].append((Double(k), Double(p99) / 1000))
            }
            return page.lineChart(
                lines, x: "bulk connections beside the probe (K)", y: "probe p99 (us, log scale)", logY: true)
        }
    }

    /// Per transport, at the largest K of the run: the backends by the probe's p99 under load, with its ratio to
    /// the idle probe, RPM and the bulk throughput meanwhile.
    static func summary(_ report: Report, _ scenarios: [Self]) -> [String] {
        guard let most = scenarios.map(\.bulk).max(), most > 0 else { return [] }
        var lines: [String] = []
        for transport in report.plan.transports {
            let candidates = report.rows.filter {
                $0.scenario == .loaded(bulk: most) && $0.transport == transport && Backend(rawValue: $0.backend) != nil
                    && $0.median.latency != nil
            }
            guard !candidates.isEmpty else { continue }
            let ordered = candidates.sorted { ($0.median.latency?.p99 ?? 0) < ($1.median.latency?.p99 ?? 0) }
            let entries = ordered.map { row -> String in
                let m = row.median
                var text = "\(row.backend) \(microseconds(m.latency?.p99 ?? 0))"
                let idle = report.row(row.backend, transport, .loaded(bulk: 0))
                if let ratio = report.ratio(row, over: idle, { $0.latency.map { Double($0.p99) } }) {
                    text += " (\(ratio.text) idle"
                } else {
                    text += " ("
                }
                if let rpm = rpm(m) { text += (text.hasSuffix("(") ? "" : ", ") + "\(Int(rpm).formatted()) RPM" }
                if let bytes = m.bytesPerSecond { text += ", bulk \(fixed(bytes / 1e6, 0)) MB/s" }
                return text + ")"
            }
            lines.append(
                "- An interactive connection beside \(most) bulk ones on the same \(transport) server (loaded-\(most)), probe p99 us, lowest first (x its idle p99, round trips per minute, bulk echoed): "
                    + entries.joined(separator: ", ") + ".")
        }
        return lines
    }
}

extension Scenario {
    static func loaded(bulk: Int) -> Scenario { Scenario(LoadedScenario(bulk: bulk)) }
}
