import BenchmarkDriver
import ConnectionCore
import SocketStyles

/// `pingpong-SIZE`: closed-loop round trips of SIZE bytes through `Connection`: send, wait for the whole echo,
/// repeat.
struct PingPongScenario: ScenarioKind {
    static let prefix = "pingpong"
    static let usage = "pingpong-SIZE"
    static let about = "closed-loop round trips of SIZE bytes: send, wait for the whole echo, repeat"
    var size: Int

    init(size: Int) { self.size = size }

    init(argument: String?, name: String) throws(ScenarioError) {
        size = try Scenario.number(argument, "64", kilo: 1024, name: name)
    }

    var loadName: String? { "One connection at a time (round trips)" }

    var name: String { "pingpong-\(size)" }
    var countsRoundTrips: Bool { true }

    func skipReason(_ target: Compare.Target, remote: Bool) -> String? { nil }

    func measure(_ context: MeasureContext) async throws(ConnectionError) -> ScenarioResult {
        guard context.target.backend != nil else { return try await context.floorPing(size: size) }
        let connection = try await context.connect()
        defer { Task { await connection.close() } }
        var runner = PingRunner(size: size, count: context.roundTrips, warmup: context.plan.pingpongWarmup)
        runner.keepsSamples = true  // in order, for the quiet p50
        let result = try await runner.run(on: connection)
        await context.endWindow()
        await connection.close()
        return Compare.measurement(result, size: size, count: context.roundTrips)
    }

    /// The first pingpong's ranking per transport.
    static func summary(_ report: Report, _ scenarios: [Self]) -> [String] {
        guard let first = scenarios.first else { return [] }
        let ping = Scenario(first)
        var lines: [String] = []
        for transport in report.plan.transports {
            let candidates = report.rows.filter {
                $0.scenario == ping && $0.transport == transport && Backend(rawValue: $0.backend) != nil
            }
            guard !candidates.isEmpty else { continue }
            let figure = Report.comparedP50(candidates)
            let quiet = candidates.allSatisfy { $0.median.quietP50 != nil }
            let ordered = report.ranking(
                candidates, lowerIsBetter: true, figure: figure, show: { microseconds(UInt64($0)) })
            lines.append(
                "- \(ping) \(transport) \(quiet ? "quiet p50" : "p50") us, lowest first; in brackets, how much higher than the one before, slice for slice, and in how many of the paired slices it was higher (~: in under 80% of them, not distinguishable in this run): \(ordered)."
            )
        }
        return lines
    }
}

extension Scenario {
    static func pingpong(size: Int) -> Scenario { Scenario(PingPongScenario(size: size)) }
}
