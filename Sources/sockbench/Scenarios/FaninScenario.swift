import BenchmarkDriver
import ConnectionCore
import SocketStyles

/// `fanin-N`: N connections at once against one server, each in closed-loop 64-byte round trips.
struct FaninScenario: ScenarioKind {
    static let prefix = "fanin"
    static let usage = "fanin-N[@Tthreads]"
    static let about =
        "N connections at once against one server, each in closed-loop 64-byte round trips; @Tthreads: against a server on T threads, unpinned"
    static let takesServerThreads = true
    var count: Int

    init(connections: Int) { count = connections }

    init(argument: String?, name: String) throws(ScenarioError) {
        count = try Scenario.number(argument, nil, kilo: 1000, name: name)
    }

    var loadName: String? { "Many connections at once (round trips on each)" }

    var name: String { "fanin-\(count)" }
    var connections: Int? { count }

    func measure(_ context: MeasureContext) async throws(ConnectionError) -> ScenarioResult {
        let rounds = context.plan.faninRoundTrips(connections: count)
        let server = context.server
        return try await FaninRunner(connections: count, count: rounds, warmup: min(20, rounds)).run(
            serverUsage: { await server.usage() }, connect: context.connector)
    }

    /// The round-trip table, with memory per connection, what queueing predicts and whether every connection got
    /// its share.
    func table(_ report: Report, rows: [ReportRow]) -> (header: [String], cells: [[String]]) {
        let (header, cells) = report.roundTripTable(rows)
        return (
            header + [
                "server KiB/conn", "server threads open", "client KiB/conn", "N x one rt", "p50 / (N x rt)", "p99.9",
            ] + Report.fairnessHeader,
            zip(rows, cells).map { row, cells in
                let m = row.median
                return cells
                    + [
                        m.serverKiBPerConnection.map { fixed($0, 1) } ?? "-",
                        m.serverThreadsOpen.map(String.init) ?? "-",
                        m.clientKiBPerConnection.map { fixed($0, 1) } ?? "-",
                    ]
                    + report.faninExpectation(row) + Report.fairnessCells(m.fairness)
            }
        )
    }
}

extension Scenario {
    static func fanin(connections: Int) -> Scenario { Scenario(FaninScenario(connections: connections)) }
}
