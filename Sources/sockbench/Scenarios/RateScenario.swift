import BenchmarkDriver
import ConnectionCore
import SocketStyles

/// `rate-PERSECOND`: open loop: 64-byte messages sent on a fixed schedule; latency from the intended send time
/// (coordinated omission corrected) and from the actual one. A sweep (`--sweep`) is a series of them.
struct RateScenario: ScenarioKind {
    static let prefix = "rate"
    static let usage = "rate-PERSECOND"
    static let about =
        "open loop: 64-byte messages sent on a fixed schedule; latency from the intended send time (coordinated omission corrected) and from the actual one"
    var perSecond: Int

    init(perSecond: Int) { self.perSecond = perSecond }

    init(argument: String?, name: String) throws(ScenarioError) {
        perSecond = try Scenario.number(argument, nil, kilo: 1000, name: name)
    }

    var loadName: String? { "A steady rate of messages (open loop)" }

    var name: String { "rate-\(perSecond)" }

    func skipReason(_ target: Compare.Target, remote: Bool) -> String? { nil }

    func measure(_ context: MeasureContext) async throws(ConnectionError) -> ScenarioResult {
        let plan = context.plan
        guard context.target.backend != nil else {
            return try await runFloorRate(
                endpoint: context.endpoint, perSecond: perSecond,
                duration: .milliseconds(Int(plan.rateSeconds * 1000)), warmup: .milliseconds(250),
                pacing: plan.pacing ?? .sleep)
        }
        let connection = try await context.connect()
        let runner = RateRunner(
            perSecond: perSecond, duration: .milliseconds(Int(plan.rateSeconds * 1000)), pacing: plan.pacing ?? .sleep)
        do throws(ConnectionError) {
            let result = try await runner.run(on: connection)
            await connection.close()
            return result
        } catch {
            await connection.close()
            throw error
        }
    }

    func brief(_ m: ScenarioResult) -> String { Self.openLoopBrief(m) }

    /// p50 and p99 from the intended send time, the uncorrected and quiet p50s, and the losses.
    static func openLoopBrief(_ m: ScenarioResult) -> String {
        "p50 \(microseconds(m.latency?.p50 ?? 0)) us (uncorrected \(microseconds(m.uncorrectedLatency?.p50 ?? 0))\(m.quietP50.map { ", quiet \(microseconds($0))" } ?? "")), p99 \(microseconds(m.latency?.p99 ?? 0)) us, lost \(m.lost ?? 0)"
    }

    func table(_ report: Report, rows: [ReportRow]) -> (header: [String], cells: [[String]]) {
        let header = [
            "backend", "transport", "p50 us", "p99 us", "p99.9 us", "max us", "uncorrected p50", "uncorrected p99",
            "quiet p50", "x C floor", "achieved/s", "lost", "cpu us/msg",
        ]
        let scenario = Scenario(self)
        let cells = rows.map { row -> [String] in
            let m = row.median
            // sockperf's under-load rows have no corrected latency (it corrects for no stall).
            func us(_ value: UInt64?) -> String { value.map { microseconds($0) } ?? "-" }
            let ratio = report.openLoopRatio(row, over: report.row(Report.floorName, row.transport, scenario))?.text
            return [
                row.backend, row.transport, us(m.latency?.p50), us(m.latency?.p99), us(m.latency?.p999),
                us(m.latency?.max), us(m.uncorrectedLatency?.p50), us(m.uncorrectedLatency?.p99), us(m.quietP50),
                ratio ?? "-",
                "\(Int(m.messagesPerSecond ?? 0))", "\(m.lost ?? 0)", report.cpuPerMessage(m),
            ]
        }
        return (header, cells)
    }

    /// A sweep's lines: each backend's highest rate held.
    static func summary(_ report: Report, _ scenarios: [Self]) -> [String] { report.sweepLines() }
}

extension Scenario {
    static func rate(perSecond: Int) -> Scenario { Scenario(RateScenario(perSecond: perSecond)) }
}
