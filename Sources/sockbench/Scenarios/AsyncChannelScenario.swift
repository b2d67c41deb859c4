import BenchmarkDriver
import ConnectionCore
import NativeStyles
import SocketStyles

/// `asyncchannel-SIZE`: nio only: the tcp round trips written with SwiftNIO's async/await bridge
/// (`NIOAsyncChannel`) on both ends, as its documentation shows.
struct AsyncChannelScenario: ScenarioKind {
    static let prefix = "asyncchannel"
    static let usage = "asyncchannel-SIZE"
    static let about =
        "nio only: the same tcp round trips written with SwiftNIO's async/await bridge (`NIOAsyncChannel`) on both ends, as its documentation shows"
    var size: Int

    init(size: Int) { self.size = size }

    init(argument: String?, name: String) throws(ScenarioError) {
        size = try Scenario.number(argument, "64", kilo: 1024, name: name)
    }

    var name: String { "asyncchannel-\(size)" }
    var countsRoundTrips: Bool { true }

    /// nio's NIOAsyncChannel echo server (`sockbench serve URL --async-channel`), tcp.
    static let server = ServerRole(mode: "async-channel") { start in
        guard start.backend?.hasAsyncChannelStyle == true, start.transport == .tcp else { return nil }
        return try await start.serve("async-channel")
    }

    func skipReason(_ target: Compare.Target, remote: Bool) -> String? {
        guard target.backend != nil else {
            return target.transport == .tcp ? nil : "the C floor's native row is tcp"
        }
        return target.servers[Self.server.mode] == nil
            ? "NIOAsyncChannel is SwiftNIO's async/await bridge: \(Backend.nio.name) over tcp only" : nil
    }

    func measure(_ context: MeasureContext) async throws(ConnectionError) -> ScenarioResult {
        guard let backend = context.target.backend else { return try await context.floorPing(size: size) }
        let result = try await backend.asyncChannelPingPong(
            to: context.endpoint, size: size, count: context.roundTrips, warmup: context.plan.pingpongWarmup)
        return Compare.measurement(result, size: size, count: context.roundTrips)
    }

    static func summary(_ report: Report, _ scenarios: [Self]) -> [String] {
        var lines: [String] = []
        for size in scenarios.map(\.size) {
            guard let bridge = report.p50(Backend.nio.name, "tcp", .asyncChannel(size: size)) else { continue }
            var compared = [String]()
            if let floor = report.p50(Report.floorName, "tcp", .pingpong(size: size)) {
                compared.append("\(fixed(bridge / floor))x the C floor")
            }
            if let handlers = report.p50(Backend.nio.name, "tcp", .native(size: size)) {
                compared.append("\(fixed(bridge / handlers))x \(Backend.nio.name)'s ChannelHandlers (native-\(size))")
            }
            if let unified = report.p50(Backend.nio.name, "tcp", .pingpong(size: size)) {
                compared.append("\(fixed(bridge / unified))x \(Backend.nio.name) through Connection")
            }
            if let async = report.p50(Backend.async.name, "tcp", .native(size: size)) {
                compared.append("\(fixed(bridge / async))x the async backend's own style")
            }
            lines.append(
                "- SwiftNIO's async/await bridge (NIOAsyncChannel on both ends, tasks on the global executor), tcp asyncchannel-\(size) p50 \(microseconds(UInt64(bridge))) us"
                    + (compared.isEmpty ? "." : ": " + compared.joined(separator: ", ") + "."))
        }
        return lines
    }
}

extension Scenario {
    static func asyncChannel(size: Int) -> Scenario { Scenario(AsyncChannelScenario(size: size)) }
}
