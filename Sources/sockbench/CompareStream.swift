import BenchmarkDriver
import Foundation

/// `compare --json-stream`: one JSON object per line on standard output as the run goes, as iperf3's
/// `--json-stream` does: a `start` line with the plan, a `pass` line for each measurement as it finishes (a
/// pass measured again after a disturbance comes again, labelled `again`), and an `end` line with the whole
/// report (what results.json holds). Schema: docs/schemas/compare-stream.schema.json.
struct CompareStreamEvent: Encodable {
    static let schemaName = "socketstyles.compare-stream/1"

    var schema = Self.schemaName
    var event: String
    var scenarios: [String]?
    var backends: [String]?
    var transports: [String]?
    var repetitions: Int?
    var label: String?
    var elapsedSeconds: Double?
    var scenario: String?
    var source: String?
    var transport: String?
    var result: ScenarioResult?
    var report: Report?

    static func start(_ plan: Compare.Plan) -> Self {
        Self(
            event: "start", scenarios: plan.scenarios.map(\.description), backends: plan.backends,
            transports: plan.transports, repetitions: plan.repetitions)
    }

    static func pass(label: String, elapsed: Double, key: RowKey, result: ScenarioResult) -> Self {
        Self(
            event: "pass", label: label, elapsedSeconds: elapsed, scenario: key.scenario.description,
            source: key.source, transport: key.transport, result: result)
    }

    static func end(_ report: Report) -> Self { Self(event: "end", report: report) }

    /// Writes the event as one line of compact JSON.
    func write() {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        guard let data = try? encoder.encode(self) else { return }
        Console.line(String(decoding: data, as: UTF8.self))
    }
}
