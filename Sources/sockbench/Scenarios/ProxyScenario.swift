import BenchmarkDriver
import ConnectionCore
import SocketStyles

/// `proxy-SIZE`: the `pingpong-SIZE` round trips of the C client to the C echo server through one tcp relay hop
/// written in the backend's own style (`sockbench proxy --native`); the C floor's row is the direct path.
struct ProxyScenario: ScenarioKind {
    static let prefix = "proxy"
    static let usage = "proxy-SIZE"
    static let about =
        "the `pingpong-SIZE` round trips of the C client to the C echo server through one tcp relay hop written in the backend's own style; the C floor's row is the direct path"
    var size: Int

    init(size: Int) { self.size = size }

    init(argument: String?, name: String) throws(ScenarioError) {
        size = try Scenario.number(argument, "64", kilo: 1024, name: name)
    }

    var name: String { "proxy-\(size)" }
    var countsRoundTrips: Bool { true }

    /// Every style's relay forwards to one C echo server, so only the hop differs.
    static let server = ServerRole.relay(mode: "proxy", upstreamArguments: [])

    func skipReason(_ target: Compare.Target, remote: Bool) -> String? { ProxyScenario.skip(target, remote: remote) }

    /// The C client, through the backend's relay, to the C echo server (the C floor's row: directly).
    func measure(_ context: MeasureContext) async throws(ConnectionError) -> ScenarioResult {
        try await context.floorPing(size: size)
    }

    /// Why the relays do not run: they are tcp -> tcp and run on this host.
    static func skip(_ target: Compare.Target, remote: Bool) -> String? {
        guard target.transport == .tcp, !remote else {
            return remote ? "proxy runs on this host only (not with --server)" : "the native relays are tcp -> tcp"
        }
        return nil
    }

    static func summary(_ report: Report, _ scenarios: [Self]) -> [String] {
        var lines: [String] = []
        for size in scenarios.map(\.size) {
            guard let direct = report.p50(Report.floorName, "tcp", .proxy(size: size)) else { continue }
            let hops = report.rows.filter { $0.scenario == .proxy(size: size) && $0.backend != Report.floorName }
                .compactMap { row in row.median.latency.map { (row.backend, (Double($0.p50) - direct) / 1000) } }
                .sorted { $0.1 < $1.1 }
            guard !hops.isEmpty else { continue }
            lines.append(
                "- One tcp relay hop in each style's own code (proxy-\(size): C client -> relay -> C echo server, against the direct \(microseconds(UInt64(direct))) us), added p50, least first: "
                    + hops.map { "\($0.0) +\(fixed($0.1, 1))" }.joined(separator: ", ") + " us.")
        }
        return lines
    }
}

extension Scenario {
    static func proxy(size: Int) -> Scenario { Scenario(ProxyScenario(size: size)) }
}

extension ServerRole {
    /// A backend's own-style tcp relay (`sockbench proxy --native`, on the server's CPU) in front of one upstream
    /// C server per run (`floor-serve` with `upstreamArguments`), started when the run has tcp and its servers run
    /// here. The C floor's target has no relay: its row is the direct path.
    static func relay(mode: String, upstreamArguments: [String]) -> ServerRole {
        ServerRole(
            mode: mode,
            upstream: { plan in
                guard plan.transports.contains(Transport.tcp.rawValue) else { return nil }
                return try ChildServer.start(
                    backend: nil, url: "tcp://127.0.0.1:0", cpu: plan.serverCPU, extraArguments: upstreamArguments)
            },
            start: { start in
                guard let upstream = start.upstream, start.transport == .tcp else { return nil }
                guard let backend = start.backend else { return nil }
                return try ChildServer.start(
                    command: [
                        "proxy", "tcp://127.0.0.1:0", "\(upstream.endpoint)", "--backend", backend.rawValue, "--native",
                    ], cpu: start.plan.serverCPU, label: "the \(backend.rawValue) relay")
            })
    }
}
