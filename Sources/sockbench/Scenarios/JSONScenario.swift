import BenchmarkDriver
import ConnectionCore
import SocketStyles

/// `json`, `json-deflate`: ws/wss only: closed-loop round trips of market-data JSON text (about 1.1 KB), without
/// and with permessage-deflate; bytes on the wire per message.
struct JSONScenario: ScenarioKind {
    static let prefix = "json"
    static let usage = "json, json-deflate"
    static let about =
        "ws/wss only: closed-loop round trips of market-data JSON text (about 1.1 KB), without and with permessage-deflate; bytes on the wire per message"
    var deflate: Bool

    init(deflate: Bool) { self.deflate = deflate }

    init(argument: String?, name: String) throws(ScenarioError) {
        switch argument {
        case nil: deflate = false
        case "deflate": deflate = true
        default: throw ScenarioError(message: "'\(name)': json takes no parameter but 'deflate' (json-deflate)")
        }
    }

    var name: String { deflate ? "json-deflate" : "json" }
    var countsRoundTrips: Bool { true }

    func skipReason(_ target: Compare.Target, remote: Bool) -> String? {
        guard target.transport == .ws || target.transport == .wss else {
            return "JSON text messages are WebSocket's (ws, wss)"
        }
        return target.backend == nil ? Scenario.floorRuns : nil
    }

    func measure(_ context: MeasureContext) async throws(ConnectionError) -> ScenarioResult {
        guard let backend = context.target.backend else {
            throw ConnectionError(.unsupported, "the C floor runs no WebSocket")
        }
        let connection = try await backend.connectWebSocket(
            to: context.endpoint, webSocket: .with { $0.deflate = deflate ? WebSocketDeflateOptions() : nil },
            tls: context.tls)
        if deflate && connection.deflate == nil {
            await connection.close()
            throw ConnectionError(.unsupported, "the server did not agree to permessage-deflate")
        }
        var runner = PingRunner(count: context.roundTrips, warmup: context.plan.pingpongWarmup)
        runner.keepsSamples = true
        runner.messageMaker = { .text(MarketData.book($0)) }
        let before = connection.sent
        do throws(ConnectionError) {
            let result = try await runner.run(on: connection)
            await context.endWindow()
            let sent = connection.sent
            await connection.close()
            let messages = Double(max(1, sent.messages - before.messages))
            var measurement = Compare.measurement(result, size: 0, count: context.roundTrips)
            measurement.messageBytes = Double(sent.messageBytes - before.messageBytes) / messages
            measurement.wireBytes = Double(sent.payloadBytes - before.payloadBytes) / messages
            measurement.bytesPerSecond = result.roundTripsPerSecond * (measurement.messageBytes ?? 0)
            return measurement
        } catch {
            await connection.close()
            throw error
        }
    }

    func brief(_ m: ScenarioResult) -> String {
        "p50 \(microseconds(m.latency?.p50 ?? 0)) us, \(Int(m.messageBytes ?? 0)) B as \(Int(m.wireBytes ?? 0)) B on the wire"
    }

    func table(_ report: Report, rows: [ReportRow]) -> (header: [String], cells: [[String]]) {
        let header = [
            "backend", "transport", "p50 us", "p99 us", "rt/s", "message B", "wire B", "wire / message",
            "cpu us/rt", "client", "server",
        ]
        let cells = rows.map { row -> [String] in
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
                report.cpuPerMessage(m), cpu(m.client), cpu(m.server),
            ]
        }
        return (header, cells)
    }
}
