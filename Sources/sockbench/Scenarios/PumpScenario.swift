import BenchmarkDriver
import ConnectionCore
import SocketStyles

/// `pump-SIZE`: one-way bulk in SIZE-byte writes to a sink; for UDP, datagrams sent and received, loss,
/// reordering, kernel drops.
struct PumpScenario: ScenarioKind {
    static let prefix = "pump"
    static let usage = "pump-SIZE"
    static let about =
        "one-way bulk in SIZE-byte writes to a sink; for UDP, datagrams sent and received, loss, reordering, kernel drops"
    var size: Int

    init(size: Int) { self.size = size }

    init(argument: String?, name: String) throws(ScenarioError) {
        size = try Scenario.number(argument, "64k", kilo: 1024, name: name)
    }

    var loadName: String? { "Bulk transfer (one flow, MB/s)" }

    var name: String { "pump-\(size)" }

    static var server: ServerRole { .sink }

    func skipReason(_ target: Compare.Target, remote: Bool) -> String? {
        target.transport == .udp && size > 65_507 ? "a UDP datagram carries at most 65,507 bytes" : nil
    }

    func measure(_ context: MeasureContext) async throws(ConnectionError) -> ScenarioResult {
        guard context.target.backend != nil else { return try await context.floorPump(size: size) }
        // Each pass on its own connection.
        return try await Compare.pump(plan: context.plan, size: size) { bytes throws(ConnectionError) in
            let connection = try await context.connect()
            do throws(ConnectionError) {
                let result = try await PumpRunner(size: size, totalBytes: bytes).run(on: connection)
                await connection.close()
                return result
            } catch {
                await connection.close()
                throw error
            }
        }
    }

    func mainFigure(_ measurement: ScenarioResult) -> Double { measurement.bytesPerSecond ?? 0 }
    var mainFigureName: String { "MB/s" }
    var judgedByP50: Bool { false }
    var higherIsBetter: Bool { true }
    func brief(_ m: ScenarioResult) -> String { Self.brief(m) }

    static func brief(_ m: ScenarioResult) -> String {
        var text = "\(fixed((m.bytesPerSecond ?? 0) / 1e6, 1)) MB/s, \(Int(m.messagesPerSecond ?? 0)) msg/s"
        if let lost = m.lost, m.received != nil { text += ", lost \(lost)" }
        return text
    }

    func table(_ report: Report, rows: [ReportRow]) -> (header: [String], cells: [[String]]) {
        report.pumpTable(rows)
    }

    func chart(_ page: ReportHTML, rows: [ReportRow]) -> String { page.throughputBars(rows) }

    /// The first pump's tcp rows, highest first.
    static func summary(_ report: Report, _ scenarios: [Self]) -> [String] {
        guard let first = scenarios.first else { return [] }
        let pump = Scenario(first)
        let candidates = report.rows.filter { $0.scenario == pump && $0.transport == "tcp" }
        let ordered = candidates.sorted { ($0.median.bytesPerSecond ?? 0) > ($1.median.bytesPerSecond ?? 0) }
            .map { "\($0.backend) \(fixed(($0.median.bytesPerSecond ?? 0) / 1e6, 0))" }.joined(separator: ", ")
        return ordered.isEmpty ? [] : ["- \(pump) tcp, MB/s, highest first: \(ordered)."]
    }
}

extension Scenario {
    static func pump(size: Int) -> Scenario { Scenario(PumpScenario(size: size)) }
}
