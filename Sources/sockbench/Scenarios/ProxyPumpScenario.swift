import BenchmarkDriver
import ConnectionCore
import SocketStyles

/// `proxypump-SIZE`: the `pump-SIZE` bulk transfer of the C client to the C sink through the same relay hop as
/// `proxy-SIZE`; the C floor's row is the direct path.
struct ProxyPumpScenario: ScenarioKind {
    static let prefix = "proxypump"
    static let usage = "proxypump-SIZE"
    static let about =
        "the `pump-SIZE` bulk transfer of the C client to the C sink through the same relay hop; the C floor's row is the direct path"
    var size: Int

    init(size: Int) { self.size = size }

    init(argument: String?, name: String) throws(ScenarioError) {
        size = try Scenario.number(argument, "64k", kilo: 1024, name: name)
    }

    var name: String { "proxypump-\(size)" }

    /// Every style's relay forwards to one C sink, which is also the direct path of the C floor's row.
    static let server = ServerRole.relay(mode: "proxypump", upstreamArguments: ["--sink"])

    func skipReason(_ target: Compare.Target, remote: Bool) -> String? { ProxyScenario.skip(target, remote: remote) }

    /// The C pump, through the backend's relay, to the C sink (the C floor's row: to the sink directly).
    func measure(_ context: MeasureContext) async throws(ConnectionError) -> ScenarioResult {
        try await context.floorPump(size: size)
    }

    /// The relay, or for the C floor the run's C sink itself.
    func server(of target: Compare.Target, upstreams: [String: ChildServer]) -> any ServerHandle {
        target.servers[Self.server.mode] ?? upstreams[Self.server.mode] ?? target.echo
    }

    func mainFigure(_ measurement: ScenarioResult) -> Double { measurement.bytesPerSecond ?? 0 }
    var mainFigureName: String { "MB/s" }
    var judgedByP50: Bool { false }
    var higherIsBetter: Bool { true }
    func brief(_ m: ScenarioResult) -> String { PumpScenario.brief(m) }

    func table(_ report: Report, rows: [ReportRow]) -> (header: [String], cells: [[String]]) {
        report.pumpTable(rows)
    }

    func chart(_ page: ReportHTML, rows: [ReportRow]) -> String { page.throughputBars(rows) }

    static func summary(_ report: Report, _ scenarios: [Self]) -> [String] {
        var lines: [String] = []
        for size in scenarios.map(\.size) {
            let scenario = Scenario.proxyPump(size: size)
            guard
                let direct = report.rows.first(where: { $0.backend == Report.floorName && $0.scenario == scenario })?
                    .median.bytesPerSecond, direct > 0
            else { continue }
            let hops = report.rows.filter { $0.scenario == scenario && $0.backend != Report.floorName }
                .compactMap { row in row.median.bytesPerSecond.map { (row.backend, $0) } }
                .sorted { $0.1 > $1.1 }
            guard !hops.isEmpty else { continue }
            lines.append(
                "- The same hop under bulk (proxypump-\(size): C pump -> relay -> C sink, against the direct \(fixed(direct / 1e6, 0)) MB/s), MB/s and share of the direct path, highest first: "
                    + hops.map { "\($0.0) \(fixed($0.1 / 1e6, 0)) (\(fixed($0.1 / direct))x)" }.joined(separator: ", ")
                    + ".")
        }
        return lines
    }
}

extension Scenario {
    static func proxyPump(size: Int) -> Scenario { Scenario(ProxyPumpScenario(size: size)) }
}
