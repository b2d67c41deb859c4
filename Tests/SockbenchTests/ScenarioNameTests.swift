import ArgumentParser
import BenchmarkDriver
import Foundation
import Testing

@testable import sockbench

/// Scenario names: every registered kind parses its names back to the same value, rejects bad ones with the
/// reason, and is registered by exactly one line.
@Suite("Scenario names and their registration", .timeLimit(.minutes(1)))
struct ScenarioNameTests {
    @Test(
        "Scenario names carry their parameters and parse back",
        arguments: [
            "pingpong-64", "pingpong-1k", "native-64", "asyncchannel-64", "proxy-64", "proxypump-64k", "rate-10k",
            "pump-64k", "pump-1400", "connect", "fanin-100", "json", "json-deflate", "workload-16x100/s-64B-2s",
            "workload-16x100/s-64B-3s-bulk4",
            "loaded-0", "loaded-16", "broadcast-5000", "broadcast-5000-20/s", "broadcast-100-20/s-2s",
        ])
    func names(_ name: String) throws {
        let scenario = try Scenario(name: name)
        #expect(try Scenario(name: scenario.description) == scenario)
        #expect(name.hasPrefix(type(of: scenario.kind).prefix))
        // Codable as its name.
        let data = try JSONEncoder().encode([scenario])
        #expect(try JSONDecoder().decode([Scenario].self, from: data) == [scenario])
    }

    @Test("Sizes and rates read k and m; the defaults fill what a name leaves out")
    func parameters() throws {
        #expect(try Scenario(name: "pingpong-1k").as(PingPongScenario.self)?.size == 1024)
        #expect(try Scenario(name: "pump-1m").as(PumpScenario.self)?.size == 1 << 20)
        #expect(try Scenario(name: "rate-10k").as(RateScenario.self)?.perSecond == 10_000)
        #expect(try Scenario(name: "fanin-10k").connections == 10_000)
        #expect(try Scenario(name: "pingpong") == .pingpong(size: 64))
        #expect(try Scenario(name: "pump") == .pump(size: 65_536))
        #expect(try Scenario(name: "json-deflate").as(JSONScenario.self)?.deflate == true)
        #expect(try Scenario(name: "pingpong-64").countsRoundTrips)
        #expect(try !Scenario(name: "pump-64").countsRoundTrips)
        #expect(try Scenario(name: "loaded-0").connections == 1)
        #expect(try Scenario(name: "loaded-16").as(LoadedScenario.self)?.bulk == 16)
    }

    @Test("Unknown or malformed scenario names are rejected with the reason")
    func badNames() {
        for bad in [
            "teleport", "rate", "fanin-0", "fanin", "pingpong-x", "connect-3", "json-zip", "workload", "",
            "loaded", "loaded-x", "loaded--1",
        ] {
            #expect(throws: ScenarioError.self, "\(bad)") { try Scenario(name: bad) }
        }
        do {
            _ = try Scenario(name: "teleport")
        } catch {
            // The message lists every registered kind's form.
            for kind in Scenario.registered { #expect(error.message.contains(kind.usage), "\(kind.usage)") }
        }
    }

    @Test(
        "A workload's scenario name carries every parameter and parses back",
        arguments: [
            Workload(connections: 1000, perSecond: 10, size: 200, seconds: 3),
            Workload(connections: 4, perSecond: 0.5, size: 8, seconds: 2.5),
            Workload(connections: 16, perSecond: 1250, size: 1024, seconds: 0.25),
        ])
    func workloadNames(_ workload: Workload) throws {
        let scenario = Scenario.workload(workload)
        #expect(try Scenario(name: scenario.description) == scenario, "\(scenario)")
        #expect(scenario.connections == workload.connections)
        #expect(scenario.is(WorkloadScenario.self))
    }

    @Test("@Nthreads puts a fan-in or a workload against a server on N threads; other kinds refuse it")
    func serverThreads() throws {
        let fanin = try Scenario(name: "fanin-1000@2threads")
        #expect(fanin.serverThreads == 2)
        #expect(fanin.baseName == "fanin-1000")
        #expect(fanin.description == "fanin-1000@2threads")
        #expect(fanin.connections == 1000)
        #expect(fanin != (try Scenario(name: "fanin-1000")))
        #expect(try Scenario(name: "fanin-64@1thread").description == "fanin-64@1thread")
        #expect(try Scenario(name: "fanin-64@1threads") == (try Scenario(name: "fanin-64@1thread")))
        #expect(try Scenario(name: fanin.description) == fanin)
        let data = try JSONEncoder().encode([fanin])
        #expect(try JSONDecoder().decode([Scenario].self, from: data) == [fanin])
        // Its server: an echo server of its own on that many threads, not the target's.
        #expect(fanin.server.mode == "echo@2threads")
        #expect(try Scenario(name: "fanin-1000").server.mode == "echo")
        let workload = try Scenario(name: "workload-16x100/s-64B-2s@2threads")
        #expect(workload.serverThreads == 2)
        #expect(workload.as(WorkloadScenario.self)?.workload.connections == 16)
        for bad in ["pingpong-64@2threads", "fanin-64@0threads", "fanin-64@2", "fanin-64@twothreads", "fanin-64@"] {
            #expect(throws: ScenarioError.self, "\(bad)") { try Scenario(name: bad) }
        }
    }

    @Test("--server-threads runs each fan-in and workload on every count, and only those")
    func serverThreadsPlan() throws {
        let compare = try Compare.parse([
            "--scenarios", "pingpong-64,fanin-64,fanin-1000", "--server-threads", "2,1", "--transports", "tcp",
        ])
        let plan = try compare.makePlan()
        #expect(
            plan.scenarios.map(\.description) == [
                "pingpong-64", "fanin-64@1thread", "fanin-64@2threads", "fanin-1000@1thread", "fanin-1000@2threads",
            ])
        #expect(plan.serverThreads == [1, 2])
        #expect(plan.options.contains("--server-threads"))
        for bad in [["--scenarios", "pingpong-64"], ["--scenarios", "fanin-64", "--server-threads", "0"]] {
            let arguments = bad + (bad.contains("--server-threads") ? [] : ["--server-threads", "1,2"])
            #expect(throws: (any Error).self, "\(arguments)") { try Compare.parse(arguments).makePlan() }
        }
    }

    @Test("Every kind has a prefix of its own")
    func prefixes() {
        let prefixes = Scenario.registered.map { $0.prefix }
        #expect(Set(prefixes).count == prefixes.count, "\(prefixes)")
    }

    /// Adding a scenario is its file plus its line in `Scenario.registered`: every kind declared under
    /// Sources/sockbench/Scenarios is registered, and only there are kinds declared.
    @Test("Every scenario kind in Sources/sockbench/Scenarios is registered, one file each")
    func everyKindRegistered() throws {
        let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .appendingPathComponent("../../Sources/sockbench/Scenarios").standardized
        let files = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter {
            $0.hasSuffix(".swift")
        }
        let registered = Set(Scenario.registered.map { String(describing: $0) })
        var declared: [String] = []
        for file in files {
            let text = try String(contentsOf: directory.appendingPathComponent(file), encoding: .utf8)
            let kinds = text.split(separator: "\n").compactMap { line -> String? in
                guard line.hasPrefix("struct "), line.contains(": ScenarioKind") else { return nil }
                return String(line.dropFirst("struct ".count).prefix { $0 != ":" })
            }
            #expect(kinds.count <= 1, "\(file) declares \(kinds)")
            if let kind = kinds.first { #expect(file == "\(kind).swift", "\(kind) is in \(file)") }
            declared += kinds
        }
        #expect(Set(declared) == registered, "declared \(declared.sorted()), registered \(registered.sorted())")
    }
}
