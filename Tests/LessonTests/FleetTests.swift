import BenchmarkDriver
import ConnectionTestKit
import Foundation
import Lessons
import POSIXSupport
import SocketStyles
import Testing

/// `sockbench fleet` across hosts: a server namespace and three client namespaces on one bridge (root only; the
/// namespaces are removed afterwards, also on failure), an agent in each, the coordinator beside the server.
@Suite("Fleet across hosts", .serialized, .timeLimit(.minutes(20)))
struct FleetTests {
    init() {
        SocketTest.addWarmUp { NetworkLab.installSignalCleanup() }
    }

    /// The lab with an agent in every host: the agents' control addresses, server's first.
    private static func agents(_ lab: NetworkLab) async throws -> [(ChildProcess, String)] {
        var started: [(ChildProcess, String)] = []
        for host in lab.hosts {
            let agent = try lab.start(
                in: host.namespace, ["serve", "--agent", "tcp://\(host.address):0", "--exit-on-stdin-eof"])
            started.append((agent, ""))
            let line = try await blocking { agent.readLine() }
            let prefix = "listening on tcp://"
            try #require(line.hasPrefix(prefix), "the agent in \(host.namespace) said: \(line)")
            started[started.count - 1].1 = String(line.dropFirst(prefix.count))
        }
        return started
    }

    /// The `--json` output, checked against docs/schemas/fleet.schema.json.
    private static func report(_ output: String) throws -> [String: Any] {
        let value = try JSONSerialization.jsonObject(with: Data(output.utf8))
        var validator = SchemaValidator(directory: JSONSchemaTests.schemas)
        let problems = try validator.validate(value, against: "fleet.schema.json")
        #expect(problems.isEmpty, "fleet.schema.json: \(problems.joined(separator: "; "))")
        return try #require(
            try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any], "not JSON: \(output)")
    }

    @Test(
        "Three load hosts against every backend's server: per-agent rows, and the merge equals all samples together",
        .enabled(
            if: NetworkLab.unavailableReason() == nil,
            "skipped: \(NetworkLab.unavailableReason() ?? "") (the fleet test makes five network namespaces)"))
    func mergedAcrossHosts() async throws {
        try await SocketTest.run(timeLimit: .seconds(400)) {
            let lab = try NetworkLab(bridgedHosts: 4)
            defer { lab.remove() }
            let agents = try await Self.agents(lab)
            defer { for (agent, _) in agents { NetworkLab.stop(agent) } }
            let clients = agents.dropFirst().map(\.1).joined(separator: ",")
            var runs = Backend.allCases.map { ($0.name, "tcp", "fanin-8") }
            runs += [
                ("async", "ws", "fanin-8"), ("bsd", "udp", "fanin-4"), ("uv", "tcp", "rate-3000"),
                ("runloop", "tcp", "workload-10x100/s-64B-1s"), ("uring", "tcp", "broadcast-50-20/s-1s"),
                ("nio", "ws", "broadcast-50-20/s-1s"),
            ]
            for (server, transport, load) in runs {
                let output = try await blocking {
                    try lab.runToEnd(
                        in: lab.serverNamespace,
                        [
                            "fleet", "--agents", clients, "--server-agent", agents[0].1, "--server-backend", server,
                            "--transport", transport, "--load", load, "--seconds", "1", "--samples", "--json",
                        ])
                }
                let key = "\(server) \(transport) \(load)"
                let json = try Self.report(output)
                let rows = try #require(json["agents"] as? [[String: Any]], "\(key)")
                #expect(rows.count == 3, "\(key): \(rows.count) agent rows")
                var all: [UInt64] = []
                var total = 0
                for row in rows {
                    #expect(row["error"] == nil, "\(key): agent \(row["agent"] ?? "?"): \(row["error"] ?? "")")
                    let outcome = try JSONDecoder().decode(
                        FleetShare.Outcome.self,
                        from: JSONSerialization.data(withJSONObject: try #require(row["outcome"], "\(key): no outcome"))
                    )
                    let samples = try #require(outcome.samples, "\(key): no samples")
                    #expect(outcome.count == samples.count, "\(key): count and samples differ")
                    #expect(samples.count > 100, "\(key): \(samples.count) messages in the window")
                    #expect(outcome.failedConnections == 0, "\(key): \(outcome.firstError ?? "")")
                    #expect(outcome.histogram == SparseHistogram(samples: samples))
                    all += samples
                    total += samples.count
                    // The hosts share one kernel's monotonic clock: the true offset is 0, and the estimate is
                    // within half its round trip of the truth.
                    let offset = try #require(row["clockOffsetNanoseconds"] as? Int)
                    let roundTrip = try #require(row["clockRoundTripNanoseconds"] as? Int)
                    #expect(
                        abs(offset) <= roundTrip / 2 + 1, "\(key): clock offset \(offset) ns, round trip \(roundTrip)")
                }
                let merged = try #require(json["merged"] as? [String: Any])
                #expect(merged["count"] as? Int == total)
                #expect(merged["agents"] as? Int == 3)
                let histogram = try JSONDecoder().decode(
                    SparseHistogram.self, from: JSONSerialization.data(withJSONObject: merged["histogram"]!))
                #expect(
                    histogram == SparseHistogram(samples: all),
                    "\(key): the merged histogram is not that of every sample")
                #expect(histogram.totalCount == UInt64(total))
                let spread = try #require(merged["startSpreadNanoseconds"] as? Int)
                #expect(spread < 50_000_000, "\(key): the windows opened \(spread) ns apart")
                if load.hasPrefix("broadcast") {
                    // Every client on every agent got every message once, in order; per message the last receipt
                    // over all agents.
                    let broadcast = try #require(json["broadcast"] as? [String: Any], "\(key): no broadcast figures")
                    #expect(broadcast["clients"] as? Int == 150, "\(key)")
                    #expect(broadcast["messages"] as? Int == 20, "\(key)")
                    #expect(broadcast["missing"] as? Int == 0, "\(key)")
                    #expect(broadcast["duplicates"] as? Int == 0 && broadcast["outOfOrder"] as? Int == 0, "\(key)")
                    #expect(broadcast["lastReceipt"] != nil, "\(key)")
                    #expect(total == 150 * 20, "\(key): \(total) receipts")
                }
                let server = try #require(json["server"] as? [String: Any], "\(key): no server usage")
                #expect((server["cpuNanoseconds"] as? Int ?? 0) > 0)
                print(
                    "fleet \(key): \(total) messages, merged p99 \((merged["latency"] as? [String: Any])?["p99"] ?? "-") ns, starts within \(spread / 1000) us"
                )
            }
        }
    }

    @Test(
        "An agent killed mid-run and one that stops answering are named; the other's results are kept; the run ends",
        .enabled(
            if: NetworkLab.unavailableReason() == nil,
            "skipped: \(NetworkLab.unavailableReason() ?? "") (the fleet test makes five network namespaces)"))
    func agentDiesMidRun() async throws {
        try await SocketTest.run(timeLimit: .seconds(120)) {
            let lab = try NetworkLab(bridgedHosts: 4)
            defer { lab.remove() }
            let agents = try await Self.agents(lab)
            defer { for (agent, _) in agents { NetworkLab.stop(agent) } }
            let clients = agents.dropFirst().map(\.1).joined(separator: ",")
            let coordinator = try lab.start(
                in: lab.serverNamespace,
                [
                    "fleet", "--agents", clients, "--server-agent", agents[0].1, "--load", "fanin-8", "--seconds", "4",
                    "--timeout", "3", "--json",
                ])
            // The third agent says when its window is ordered; it is killed then, in the middle of the run, and
            // the second is stopped (SIGSTOP: its connections stay open and nothing answers).
            let (victim, silent) = (agents[3].0, agents[2].0)
            let order = try await blocking { victim.readLine() }
            #expect(order.hasPrefix("go: fanin-8"), "the agent said: \(order)")
            let silentOrder = try await blocking { silent.readLine() }
            #expect(silentOrder.hasPrefix("go: fanin-8"), "the agent said: \(silentOrder)")
            victim.terminate(force: true)
            kill(silent.pid, SIGSTOP)
            defer { silent.terminate(force: true) }
            let output = try await blocking { coordinator.readToEnd() }
            let status = try await blocking { try coordinator.wait() }
            #expect(status == 0, "fleet exited \(status): \(output)")
            let json = try Self.report(output)
            let rows = try #require(json["agents"] as? [[String: Any]])
            for gone in [agents[3].1, agents[2].1] {
                let row = try #require(rows.first { ($0["agent"] as? String) == gone })
                let error = try #require(row["error"] as? String, "the agent is not named: \(row)")
                #expect(error.contains("mid-run"), "\(error)")
                print("fleet: agent \(gone): \(error)")
            }
            let alive = rows.filter { $0["error"] == nil }
            #expect(alive.count == 1)
            for row in alive {
                let outcome = try #require(row["outcome"] as? [String: Any])
                #expect((outcome["count"] as? Int ?? 0) > 100)
            }
            let merged = try #require(json["merged"] as? [String: Any])
            #expect(merged["agents"] as? Int == 1)
        }
    }
}
