import BenchmarkDriver
import ConnectionCore
import NativeStyles
import SocketStyles

/// `native-SIZE`: the pingpong round trips over TCP written in each backend's own style on both ends (blocking
/// loop, libuv callbacks, stream delegates, async socket calls, NIO handlers) instead of through `Connection`:
/// what `x native` (the price of the unified API) sets the pingpong rows against. In its passes the C floor's
/// ping-pong (C written in its own style) runs beside the rows, so their ratios over it pair measurements taken in
/// the same pass.
struct NativeScenario: ScenarioKind {
    static let prefix = "native"
    static let usage = "native-SIZE"
    static let about =
        "the same round trips over TCP, written in each backend's own style on both ends (blocking loop, libuv callbacks, stream delegates, async socket calls, NIO handlers) instead of through `Connection`"
    var size: Int

    init(size: Int) { self.size = size }

    init(argument: String?, name: String) throws(ScenarioError) {
        size = try Scenario.number(argument, "64", kilo: 1024, name: name)
    }

    var name: String { "native-\(size)" }
    var countsRoundTrips: Bool { true }

    /// The backend's own-style echo server (`sockbench serve URL --native`), where it has one.
    static let server = ServerRole(mode: "native") { start in
        guard start.backend?.nativeTransports.contains(start.transport) == true else { return nil }
        return try await start.serve("native")
    }

    func skipReason(_ target: Compare.Target, remote: Bool) -> String? {
        guard target.backend != nil else {
            return target.transport == .tcp ? nil : "the C floor's native row is tcp"
        }
        return target.servers[Self.server.mode] == nil
            ? "native styles: every backend over tcp; \(Backend.nio.name) also over ws (NIOWebSocket), tls and wss (swift-nio-ssl)"
            : nil
    }

    func measure(_ context: MeasureContext) async throws(ConnectionError) -> ScenarioResult {
        guard let backend = context.target.backend else { return try await context.floorPing(size: size) }
        let result = try await backend.nativePingPong(
            to: context.endpoint, size: size, count: context.roundTrips, warmup: context.plan.pingpongWarmup,
            tls: context.tls)
        return Compare.measurement(result, size: size, count: context.roundTrips)
    }

    /// The price of the unified API per backend, the other transports against SwiftNIO's own code, and the native
    /// rows against the C floor.
    static func summary(_ report: Report, _ scenarios: [Self]) -> [String] {
        var lines: [String] = []
        for size in scenarios.map(\.size) {
            let prices = report.rows.filter { $0.scenario == .pingpong(size: size) && $0.transport == "tcp" }
                .compactMap { row in report.unifiedPrice(for: row).map { (row.backend, $0) } }
            guard !prices.isEmpty else { continue }
            lines.append(
                "- The price of the unified API (tcp pingpong-\(size) p50 through Connection / the same backend written in its own style, both ends): "
                    + prices.map { "\($0.0) \($0.1.text)" }.joined(separator: ", ") + ".")
            let references = [
                ("ws", "SwiftNIO's own WebSocket (NIOHTTP1 upgrade and NIOWebSocket handlers"),
                ("tls", "SwiftNIO with swift-nio-ssl (its TLS handler in front of the echo handlers"),
                ("wss", "SwiftNIO's own WebSocket over swift-nio-ssl (NIOSSL, NIOHTTP1 and NIOWebSocket handlers"),
            ]
            for (transport, written) in references {
                guard let reference = report.p50(Backend.nio.name, transport, .native(size: size)) else { continue }
                let ratios = report.rows.filter { $0.scenario == .pingpong(size: size) && $0.transport == transport }
                    .compactMap { row in row.median.latency.map { (row.backend, Double($0.p50) / max(1, reference)) } }
                lines.append(
                    "- \(transport) pingpong-\(size) p50 against \(written) on both ends, no Connection; \(microseconds(UInt64(reference))) us): "
                        + ratios.map { "\($0.0) \(fixed($0.1))x" }.joined(separator: ", ") + ".")
            }
            let floors = report.rows.filter {
                $0.scenario == .native(size: size) && $0.transport == "tcp" && $0.backend != Report.floorName
            }.compactMap { row in
                report.p50Ratio(row, over: report.floorRow(for: row)).map { (row.backend, $0) }
            }
            if !floors.isEmpty {
                lines.append(
                    "- native-\(size) against the C floor: "
                        + floors.map { "\($0.0) \($0.1.text)" }.joined(separator: ", ")
                        + ".")
            }
        }
        return lines
    }
}

extension Scenario {
    static func native(size: Int) -> Scenario { Scenario(NativeScenario(size: size)) }
}
