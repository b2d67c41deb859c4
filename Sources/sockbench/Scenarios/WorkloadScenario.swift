import BenchmarkDriver
import ConnectionCore
import SocketStyles

/// `workload-NxRATE/s-SIZEB-SECONDSs`: a user's own load: N connections, each sending SIZE-byte messages RATE times
/// a second on a schedule for SECONDS, every message echoed; latency as in `rate`, plus memory per connection and
/// CPU per message (``Workload``), and a verdict: which backends held it.
struct WorkloadScenario: ScenarioKind {
    static let prefix = "workload"
    static let usage = "workload-NxRATE/s-SIZEB-SECONDSs[@Tthreads]"
    static let about =
        "a user's own load: N connections, each sending SIZE-byte messages RATE times a second on a schedule for SECONDS, every message echoed; latency as in `rate`, plus memory per connection and CPU per message"
    static let takesServerThreads = true
    var workload: Workload

    init(_ workload: Workload) { self.workload = workload }

    init(argument: String?, name: String) throws(ScenarioError) {
        guard let argument else {
            throw ScenarioError(message: "'\(name)' needs its load, e.g. workload-100x10/s-64B-3s")
        }
        workload = try Workload(name: argument)
    }

    var name: String { workload.description }
    /// Its connections, and the bulk ones beside them.
    var connections: Int? { workload.connections + (workload.bulk ?? 0) }

    func skipReason(_ target: Compare.Target, remote: Bool) -> String? {
        if target.transport == .udp, workload.size > 65_507 { return "a UDP datagram carries at most 65,507 bytes" }
        return target.backend == nil ? Scenario.floorRuns : nil
    }

    func measure(_ context: MeasureContext) async throws(ConnectionError) -> ScenarioResult {
        let server = context.server
        return try await WorkloadRunner(workload, pacing: context.plan.pacing ?? .sleep).run(
            serverUsage: { await server.usage() }, startWindow: context.startWindow, endWindow: context.endWindow,
            connect: context.connector)
    }

    /// Judged by its p99 from the intended send time.
    func mainFigure(_ measurement: ScenarioResult) -> Double { Double(measurement.latency?.p99 ?? 0) }
    var mainFigureName: String { "p99 us" }
    var judgedByP50: Bool { false }
    func brief(_ m: ScenarioResult) -> String { RateScenario.openLoopBrief(m) }

    func table(_ report: Report, rows: [ReportRow]) -> (header: [String], cells: [[String]]) {
        let header =
            [
                "backend", "transport", "held", "p50 us", "p99 us", "p99 range", "p99.9 us", "max us",
                "uncorrected p50", "offered/s", "answered/s", "lost %", "cpu us/msg", "server KiB/conn",
                "client KiB/conn",
            ] + Report.fairnessHeader + (workload.bulk == nil ? [] : ["bulk MB/s"])
        let cells = rows.map { row -> [String] in
            let m = row.median
            let verdict = report.verdicts?.first {
                $0.transport == row.transport && $0.workload == workload
                    && $0.serverThreads == row.scenario.serverThreads
            }
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
                report.cpuPerMessage(m), m.serverKiBPerConnection.map { fixed($0, 1) } ?? "-",
                m.clientKiBPerConnection.map { fixed($0, 1) } ?? "-",
            ] + Report.fairnessCells(m.fairness)
                + (workload.bulk == nil ? [] : [m.bulkBytesPerSecond.map { fixed($0 / 1e6, 1) } ?? "-"])
        }
        return (header, cells)
    }

    /// The verdicts: per transport, which backends held the load and the best choice for it.
    static func summary(_ report: Report, _ scenarios: [Self]) -> [String] {
        var lines: [String] = []
        for verdict in report.verdicts ?? [] {
            let text = verdict.lines
            let threads = verdict.serverThreads.map { ", its server on \($0) thread\($0 == 1 ? "" : "s")" } ?? ""
            lines.append("- Your workload\(threads), " + text[0])
            lines += text.dropFirst()
        }
        return lines
    }

    /// Per planned workload and transport, the verdict over the backends' runs.
    static func verdicts(plan: Compare.Plan, runs: [RowKey: [ScenarioResult]]) -> [WorkloadVerdict] {
        var verdicts: [WorkloadVerdict] = []
        for scenario in plan.scenarios {
            guard let workload = scenario.as(WorkloadScenario.self)?.workload else { continue }
            for transport in plan.transports {
                let runs = plan.backends.compactMap { backend in
                    runs[RowKey(scenario: scenario, source: backend, transport: transport)].map {
                        (backend: backend, results: $0)
                    }
                }
                guard !runs.isEmpty else { continue }
                var verdict = WorkloadVerdict(
                    workload: workload, transport: transport,
                    p99Bound: plan.p99Bound ?? Compare.Plan.defaultP99Bound, runs: runs)
                verdict.serverThreads = scenario.serverThreads
                verdicts.append(verdict)
            }
        }
        return verdicts
    }
}

extension Scenario {
    static func workload(_ workload: Workload) -> Scenario { Scenario(WorkloadScenario(workload)) }
}
