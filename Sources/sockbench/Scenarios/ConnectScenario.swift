import BenchmarkDriver
import ConnectionCore
import SocketStyles

/// `connect`: connections opened one after another: handshake time (TCP, + TLS, + WebSocket upgrade) and
/// connections per second.
struct ConnectScenario: ScenarioKind {
    static let prefix = "connect"
    static let usage = "connect"
    static let about =
        "connections opened one after another: handshake time (TCP, + TLS, + WebSocket upgrade) and connections per second"

    init() {}

    init(argument: String?, name: String) throws(ScenarioError) {
        guard argument == nil else { throw ScenarioError(message: "'\(name)': connect takes no parameter") }
    }

    var loadName: String? { "Setting up connections" }

    var name: String { "connect" }

    func measure(_ context: MeasureContext) async throws(ConnectionError) -> ScenarioResult {
        try await ConnectRunner(count: context.plan.connectCount).run(connect: context.connector)
    }

    func brief(_ m: ScenarioResult) -> String {
        "p50 \(microseconds(m.latency?.p50 ?? 0)) us, \(Int(m.messagesPerSecond ?? 0)) conn/s"
    }

    func table(_ report: Report, rows: [ReportRow]) -> (header: [String], cells: [[String]]) {
        let header = ["backend", "transport", "connect p50 us", "p90 us", "p99 us", "conn/s", "cpu us/conn"]
        let cells = rows.map { row -> [String] in
            let m = row.median
            return [
                row.backend, row.transport, microseconds(m.latency?.p50 ?? 0), microseconds(m.latency?.p90 ?? 0),
                microseconds(m.latency?.p99 ?? 0), "\(Int(m.messagesPerSecond ?? 0))", report.cpuPerMessage(m),
            ]
        }
        return (header, cells)
    }

    func chart(_ page: ReportHTML, rows: [ReportRow]) -> String {
        page.perTransport(rows) { group in
            let sorted = group.sorted { ($0.median.latency?.p50 ?? 0) < ($1.median.latency?.p50 ?? 0) }
            return page.bars(
                sorted.map { ($0.backend, [Double($0.median.latency?.p50 ?? 0) / 1000]) },
                series: ["connect p50"], unit: "us")
        }
    }
}

extension Scenario {
    static let connect = Scenario(ConnectScenario())
}
