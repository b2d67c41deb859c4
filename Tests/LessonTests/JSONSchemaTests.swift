import ConnectionTestKit
import Foundation
import Lessons
import POSIXSupport
import SocketStyles
import Testing

/// Every `--json` output and compare's results.json, as the commands print them, checked against the JSON
/// Schema files in docs/schemas (by a small validator of the keywords those files use: a schema that uses
/// another fails here).
@Suite("JSON output matches docs/schemas", .serialized, .timeLimit(.minutes(20)))
struct JSONSchemaTests {
    static let schemas = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("docs/schemas")

    /// What `sockbench ARGUMENTS` printed on stdout; unless `raw`, with the lines the terminal wraps at 120 columns
    /// joined again (a line continued is indented by two more spaces), so that a sentence is searched whole.
    private func run(_ arguments: [String], raw: Bool = false) async throws -> String {
        let child = try ChildProcess([NetworkLab.selfPath()] + arguments, mergeErrors: false)
        let output = try await blocking { child.readToEnd() }
        let status = try await blocking { try child.wait() }
        try #require(status == 0, "sockbench \(arguments.joined(separator: " ")) exited \(status): \(output)")
        return raw ? output : output.replacingOccurrences(of: "\n  ", with: " ")
    }

    private func check(_ json: String, against name: String) throws {
        let value = try JSONSerialization.jsonObject(with: Data(json.utf8))
        var validator = SchemaValidator(directory: Self.schemas)
        let problems = try validator.validate(value, against: name)
        #expect(problems.isEmpty, "\(name): \(problems.joined(separator: "; "))\n\(json.prefix(2000))")
    }

    /// `compare --json-stream`: stdout is JSON lines only, each valid against compare-stream.schema.json: a
    /// start, a pass line per measurement (5 pingpong slices and one pump pass, for bsd and the C floor), an end
    /// with the report.
    @Test("compare --json-stream prints one valid object per line: start, each pass, end")
    func jsonStream() async throws {
        try await SocketTest.run(timeLimit: .seconds(120)) {
            let printed = try await run(
                [
                    "compare", "--scenarios", "pingpong-64,pump-64k", "--transports", "tcp", "--backends", "bsd",
                    "--repetitions", "1", "--seconds", "0.5", "--pump-seconds", "0.2", "--no-baselines",
                    "--json-stream",
                ], raw: true)
            let lines = printed.split(separator: "\n").map(String.init)
            for line in lines { try check(line, against: "compare-stream.schema.json") }
            let events = try lines.map { line -> [String: Any] in
                try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            }
            #expect(events.first?["event"] as? String == "start")
            #expect(events.last?["event"] as? String == "end")
            let passes = events.filter { $0["event"] as? String == "pass" }
            let firstTry = passes.filter { $0["label"] as? String != "again" }
            #expect(
                firstTry.count == 12,
                "\(passes.map { "\($0["label"] ?? "") \($0["scenario"] ?? "") \($0["source"] ?? "")" })")
            let report = events.last?["report"] as? [String: Any]
            #expect((report?["rows"] as? [Any])?.count == 4)
        }
    }

    @Test("ping, pump, lesson and compare outputs are valid against their schemas")
    func outputsMatch() async throws {
        try await SocketTest.run(timeLimit: .seconds(240)) {
            for sink in [false, true] {
                let server = try ChildProcess(
                    [NetworkLab.selfPath(), "serve", "tcp://127.0.0.1:0", "--exit-on-stdin-eof", "--quiet"]
                        + (sink ? ["--sink"] : []), mergeErrors: false)
                defer { NetworkLab.stop(server) }
                let line = try await blocking { server.readLine() }
                try #require(line.hasPrefix("listening on "), "the server said: \(line)")
                let url = String(line.dropFirst(13))
                if sink {
                    try check(
                        try await run(["pump", url, "--bytes", "2000000", "--json"]), against: "pump.schema.json")
                } else {
                    try check(
                        try await run(["ping", url, "--count", "200", "--warmup", "10", "--json"]),
                        against: "ping.schema.json")
                }
            }
            // boundaries: sends and receives; nagle: the kernel's view; headofline: marks and a note on a send.
            // c10k: charts (no root needed).
            for lesson in ["boundaries", "nagle", "headofline", "c10k"] {
                try check(try await run(["lesson", lesson, "--json"]), against: "lesson.schema.json")
            }
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("schema-\(getpid())")
            defer { try? FileManager.default.removeItem(at: directory) }
            // One second a repetition, slices of 0.2 s: round trips per slice are calibrated once, and a slice
            // calibrated while the other test process loaded the CPUs must still hold the ten 5 ms stretches a
            // quiet p50 needs (with 0.5 s, under that load, the c-floor and bsd pingpong rows once had none).
            let printed = try await run(
                [
                    "compare", "--scenarios", "pingpong-64,pump-64k,connect,json-deflate,rate-2000", "--transports",
                    "tcp,udp,ws",
                    "--backends",
                    "bsd",
                    "--repetitions", "2", "--seconds", "1", "--pump-seconds", "0.2", "--no-baselines", "--out",
                    directory.path,
                ], raw: true)
            // What the terminal shows fits it, and speaks of the user's choice, not of the project's own targets.
            try checkTerminal(printed)
            let results = try String(contentsOf: directory.appendingPathComponent("results.json"), encoding: .utf8)
            try check(results, against: "compare.schema.json")
            // Two repetitions, each against server processes of its own; the closed-loop rows carry a quiet p50.
            let object = try #require(
                try JSONSerialization.jsonObject(with: Data(results.utf8)) as? [String: Any])
            let plan = try #require(object["plan"] as? [String: Any])
            #expect((plan["options"] as? String)?.contains("server processes started anew for each repetition") == true)
            #expect(plan["pumpSeconds"] as? Double == 0.2)
            #expect(plan["udpSinkBuffer"] as? Int == 4 << 20)
            #expect((plan["options"] as? String)?.contains("udp pump sinks: SO_RCVBUF 4194304 B asked") == true)
            let rows = try #require(object["rows"] as? [[String: Any]])
            for row in rows where (row["scenario"] as? String) == "pingpong-64" {
                let repetitions = try #require(row["repetitions"] as? [[String: Any]])
                #expect(repetitions.count == 2 * 5, "two repetitions of five slices: \(row["backend"] ?? "")")
                #expect(repetitions.allSatisfy { ($0["quietP50"] as? Int) != nil }, "\(row["backend"] ?? "")")
            }
            // The open-loop rows carry one too (latency from the actual send time in stretches of 20 ms of
            // messages), the C floor's among them: their "x C floor" and target compare those.
            for row in rows where (row["scenario"] as? String) == "rate-2000" {
                let repetitions = try #require(row["repetitions"] as? [[String: Any]])
                #expect(
                    repetitions.allSatisfy { ($0["quietP50"] as? Int) != nil },
                    "rate-2000 \(row["backend"] ?? "") \(row["transport"] ?? "")")
            }
            // The summary ranks by those quiet p50s and prints each backend's median in microseconds (it once
            // printed 0.0 for every one).
            let bsd = try #require(
                rows.first {
                    $0["scenario"] as? String == "pingpong-64" && $0["transport"] as? String == "tcp"
                        && $0["backend"] as? String == "bsd"
                })
            let quiet = try #require((bsd["median"] as? [String: Any])?["quietP50"] as? Int)
            let report = try String(contentsOf: directory.appendingPathComponent("report.md"), encoding: .utf8)
            let ranked = report.split(separator: "\n").first {
                $0.contains("pingpong-64 tcp quiet p50 us, lowest first")
            }
            let tenths = (quiet + 50) / 100
            #expect(
                ranked?.contains("bsd \(tenths / 10).\(tenths % 10)") == true,
                "\(ranked ?? "no ranking"): bsd's median quiet p50 is \(quiet) ns")
            // The open-loop rows are checked against the C floor's paced client where it has a row (tcp, udp; not
            // ws), with bsd's ratio of uncorrected p50s.
            let lines = report.split(separator: "\n")
            for transport in ["tcp", "udp"] {
                let target = lines.first {
                    $0.hasPrefix("- Target, rate-2000 \(transport) p50 from the actual send time <= 1.3x")
                        && $0.contains("both in their quiet stretches")
                }
                #expect(target?.contains("(bsd ") == true, "\(target ?? "no rate-2000 \(transport) target")")
            }
            #expect(!lines.contains { $0.hasPrefix("- Target, rate-2000 ws") })
            try await checkReportPage(directory.appendingPathComponent("report.html"))
            try await checkDisturbanceLines(results: object, in: directory)
            try await checkTargetsFlag(results: object, in: directory)
            try await checkDiff(results: object, in: directory)
        }
    }

    /// What compare printed on the terminal: no line over 120 columns, no word of the project's own targets.
    private func checkTerminal(_ printed: String) throws {
        let wide: [Substring] = printed.split(separator: "\n").filter { $0.count > 120 }
        let first: String = wide.first.map { String($0) } ?? ""
        #expect(wide.isEmpty, "\(wide.count) line(s) over 120 columns, the first: \(first)")
        #expect(!printed.contains("Target"), "\(printed.suffix(3000))")
        #expect(printed.contains("== What this run says"))
        // It ends with the decision: a ranked table per transport of the first round trips, then each load in
        // words.
        let sections = printed.split(separator: "\n").filter { $0.hasPrefix("== ") }
        #expect(sections.last == "== The decision", "\(sections)")
        let decision = printed.components(separatedBy: "== The decision").last ?? ""
        #expect(decision.contains("pingpong-64 tcp, best first"), "\(decision)")
        #expect(decision.contains("rank  backend  quiet p50 us  p99 us"), "\(decision)")
        #expect(decision.contains("One connection at a time (round trips), pingpong-64: tcp: "), "\(decision)")
        #expect(decision.contains("Bulk transfer (one flow, MB/s), pump-65536: tcp: "), "\(decision)")
    }

    /// `--check-targets`: the project's targets are printed and a missed one fails the command. The run's ws
    /// round trips are made ten times its tcp ones, which misses "WebSocket echo <= 1.25x the same backend's tcp
    /// round trip" for bsd whatever the machine measured.
    private func checkTargetsFlag(results object: [String: Any], in directory: URL) async throws {
        var object = object
        var rows = try #require(object["rows"] as? [[String: Any]])
        func slowed(_ result: [String: Any]) -> [String: Any] {
            var result = result
            if let quiet = result["quietP50"] as? Int { result["quietP50"] = quiet * 10 }
            if var latency = result["latency"] as? [String: Any], let p50 = latency["p50"] as? Int {
                latency["p50"] = p50 * 10
                result["latency"] = latency
            }
            return result
        }
        for index in rows.indices
        where rows[index]["scenario"] as? String == "pingpong-64" && rows[index]["transport"] as? String == "ws" {
            rows[index]["repetitions"] = try #require(rows[index]["repetitions"] as? [[String: Any]]).map(slowed)
            rows[index]["median"] = slowed(try #require(rows[index]["median"] as? [String: Any]))
        }
        object["rows"] = rows
        let missed = directory.appendingPathComponent("missed")
        try FileManager.default.createDirectory(at: missed, withIntermediateDirectories: true)
        try JSONSerialization.data(withJSONObject: object).write(to: missed.appendingPathComponent("results.json"))
        let child = try ChildProcess(
            [NetworkLab.selfPath(), "report", missed.path, "--check-targets"], mergeErrors: false)
        let output = try await blocking { child.readToEnd() }
        let status = try await blocking { try child.wait() }
        #expect(status == 1, "report --check-targets exited \(status)")
        let unwrapped = output.replacingOccurrences(of: "\n  ", with: " ")  // the terminal's wrapped lines
        let echo = unwrapped.split(separator: "\n").first { $0.hasPrefix("- Target, WebSocket echo <= 1.25x") }
        #expect(echo?.contains("MISSED by bsd") == true, "\(output.suffix(3000))")
        #expect(output.contains("== The project's own targets"))
    }

    /// `sockbench diff`: the run set against itself has nothing slower and passes `--fail-slower 10`; against a
    /// copy in which bsd's tcp round trips take three times as long (more than any spread of its passes), that row is slower, named on stderr, and the
    /// command exits 1.
    private func checkDiff(results object: [String: Any], in directory: URL) async throws {
        let same = try ChildProcess(
            [NetworkLab.selfPath(), "diff", directory.path, directory.path, "--fail-slower", "10"], mergeErrors: false)
        let sameOutput = try await blocking { same.readToEnd() }
        let sameStatus = try await blocking { try same.wait() }
        #expect(sameStatus == 0, "diff of a run with itself exited \(sameStatus)")
        #expect(sameOutput.contains("by their main figure: 0 slower, 0 faster"), "\(sameOutput.suffix(2000))")
        var object = object
        var rows = try #require(object["rows"] as? [[String: Any]])
        func slowed(_ result: [String: Any]) -> [String: Any] {
            var result = result
            if let quiet = result["quietP50"] as? Int { result["quietP50"] = quiet * 3 }
            return result
        }
        for index in rows.indices
        where rows[index]["scenario"] as? String == "pingpong-64" && rows[index]["transport"] as? String == "tcp"
            && rows[index]["backend"] as? String == "bsd"
        {
            rows[index]["repetitions"] = try #require(rows[index]["repetitions"] as? [[String: Any]]).map(slowed)
            rows[index]["median"] = slowed(try #require(rows[index]["median"] as? [String: Any]))
        }
        object["rows"] = rows
        let slower = directory.appendingPathComponent("slower")
        try FileManager.default.createDirectory(at: slower, withIntermediateDirectories: true)
        let file = slower.appendingPathComponent("results.json")
        try JSONSerialization.data(withJSONObject: object).write(to: file)
        let child = try ChildProcess(
            [NetworkLab.selfPath(), "diff", directory.path, file.path, "--fail-slower", "10"], mergeErrors: false)
        let output = try await blocking { child.readToEnd() }
        let status = try await blocking { try child.wait() }
        #expect(status == 1, "diff against a slowed copy exited \(status)")
        let line = output.split(separator: "\n").first {
            $0.hasPrefix("pingpong-64") && $0.contains(" bsd ") && $0.contains(" tcp ") && $0.contains("quiet p50")
        }
        #expect(line?.hasSuffix("slower") == true, "\(output.suffix(2000))")
        #expect(output.contains("by their main figure: 1 slower, 0 faster"), "\(output.suffix(2000))")
        // A machine twice as slow on the day, C floor included: over the floor nothing is slower; as they are
        // (--raw), the round trips are.
        var slowMachine = try #require(
            try JSONSerialization.jsonObject(with: Data(contentsOf: directory.appendingPathComponent("results.json")))
                as? [String: Any])
        var everyRow = try #require(slowMachine["rows"] as? [[String: Any]])
        for index in everyRow.indices where everyRow[index]["scenario"] as? String == "pingpong-64" {
            func doubled(_ result: [String: Any]) -> [String: Any] {
                var result = result
                if let quiet = result["quietP50"] as? Int { result["quietP50"] = quiet * 2 }
                return result
            }
            everyRow[index]["repetitions"] = try #require(everyRow[index]["repetitions"] as? [[String: Any]]).map(
                doubled)
        }
        slowMachine["rows"] = everyRow
        let slowFile = slower.appendingPathComponent("slow-machine.json")
        try JSONSerialization.data(withJSONObject: slowMachine).write(to: slowFile)
        for (arguments, slowerRows) in [([String](), 0), (["--raw"], 1)] {
            let run = try ChildProcess(
                [NetworkLab.selfPath(), "diff", directory.path, slowFile.path] + arguments, mergeErrors: false)
            let printed = try await blocking { run.readToEnd() }
            _ = try await blocking { try run.wait() }
            let pingpong = printed.split(separator: "\n").filter {
                $0.hasPrefix("pingpong-64") && $0.hasSuffix("slower")
            }
            #expect(pingpong.count >= slowerRows, "\(arguments): \(printed.suffix(2000))")
            if slowerRows == 0 { #expect(pingpong.isEmpty, "\(printed.suffix(2000))") }
        }
    }

    /// The summary's word on foreign load, from this run's results.json made to say it (`sockbench report` renders
    /// a run again): every pass quiet, but the first pass of `connect` measured again after a disturbed first try
    /// (46% foreign) and the second pass of `pump-65536` disturbed still (80%). What the run itself saw (the other
    /// test process loads the CPUs) is replaced, so that the lines are known.
    private func checkDisturbanceLines(results object: [String: Any], in directory: URL) async throws {
        func share(busy: Int, measured: Int) -> [String: Any] {
            [
                "windowNanoseconds": 1_000_000_000, "busyNanoseconds": busy, "stealNanoseconds": 0,
                "measuredNanoseconds": measured, "cpus": 1,
            ]
        }
        var object = object
        var rows = try #require(object["rows"] as? [[String: Any]])
        for index in rows.indices {
            var repetitions = try #require(rows[index]["repetitions"] as? [[String: Any]])
            for pass in repetitions.indices {
                repetitions[pass]["cpuShare"] = share(busy: 500_000_000, measured: 500_000_000)
                repetitions[pass]["replacedForeignShare"] = nil
            }
            switch rows[index]["scenario"] as? String {
            case "connect": repetitions[0]["replacedForeignShare"] = 0.46
            case "pump-65536": repetitions[1]["cpuShare"] = share(busy: 900_000_000, measured: 100_000_000)
            default: break
            }
            rows[index]["repetitions"] = repetitions
        }
        object["rows"] = rows
        let again = directory.appendingPathComponent("again")
        try FileManager.default.createDirectory(at: again, withIntermediateDirectories: true)
        let json = try JSONSerialization.data(withJSONObject: object)
        try check(String(decoding: json, as: UTF8.self), against: "compare.schema.json")
        try json.write(to: again.appendingPathComponent("results.json"))
        let output = try await run(["report", again.path])
        let lines = output.split(separator: "\n")
        let disturbed = lines.first { $0.hasPrefix("- DISTURBED:") }
        #expect(disturbed?.contains("pump-65536 pass 2 of 2 (80%)") == true, "\(disturbed ?? "no DISTURBED line")")
        #expect(disturbed?.contains("connect") == false)
        let measuredAgain = lines.first { $0.hasPrefix("- Measured again: 1 pass(es)") }
        #expect(measuredAgain?.contains("connect pass 1 of 2 (46%)") == true, "\(output.suffix(3000))")
    }

    /// `compare --scenarios loaded-K,broadcast-N --workload broadcast=N,...`: rows that fit the schema, every
    /// broadcast message at every client, the summary's lines on both, and the broadcast workload's verdict per
    /// transport, which agrees with the rows it judges.
    @Test(
        "compare runs loaded-K, broadcast-N and a broadcast workload: the schema holds, every broadcast arrives, the summary speaks of all three"
    )
    func loadedAndBroadcast() async throws {
        try await SocketTest.run(timeLimit: .seconds(300)) {
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("loaded-\(getpid())")
            defer { try? FileManager.default.removeItem(at: directory) }
            let output = try await run([
                "compare", "--scenarios", "loaded-0,loaded-2,broadcast-40", "--workload",
                "broadcast=30,rate=20/s,duration=1s", "--transports", "tcp,ws", "--backends", "bsd,async",
                "--repetitions", "1", "--seconds", "0.2", "--remeasure", "0", "--no-baselines", "--out", directory.path,
            ])
            let results = try String(contentsOf: directory.appendingPathComponent("results.json"), encoding: .utf8)
            try check(results, against: "compare.schema.json")
            let object = try #require(try JSONSerialization.jsonObject(with: Data(results.utf8)) as? [String: Any])
            let rows = try #require(object["rows"] as? [[String: Any]])
            for scenario in ["loaded-0", "loaded-2", "broadcast-40", "broadcast-30-20/s-1s"] {
                #expect(rows.filter { $0["scenario"] as? String == scenario }.count == 4, "\(scenario)")
            }
            for row in rows where row["scenario"] as? String == "loaded-2" {
                let median = try #require(row["median"] as? [String: Any])
                #expect((median["bytesPerSecond"] as? Double ?? 0) > 0, "the bulk flows moved bytes")
                #expect((median["messages"] as? Int ?? 0) >= 100, "at least 100 probe round trips")
            }
            for row in rows where row["scenario"] as? String == "broadcast-40" {
                let broadcast = try #require((row["median"] as? [String: Any])?["broadcast"] as? [String: Any])
                #expect(broadcast["clients"] as? Int == 40)
                #expect(broadcast["messages"] as? Int == 20)
                #expect(broadcast["missing"] as? Int == 0 && broadcast["duplicates"] as? Int == 0)
                #expect(broadcast["outOfOrder"] as? Int == 0)
            }
            for row in rows where row["scenario"] as? String == "broadcast-30-20/s-1s" {
                let broadcast = try #require((row["median"] as? [String: Any])?["broadcast"] as? [String: Any])
                #expect(broadcast["clients"] as? Int == 30 && broadcast["messages"] as? Int == 20)
                #expect(broadcast["missing"] as? Int == 0)
            }
            let verdicts = try #require(object["broadcastVerdicts"] as? [[String: Any]])
            #expect(verdicts.map { $0["transport"] as? String } == ["tcp", "ws"])
            for verdict in verdicts {
                let entries = try #require(verdict["entries"] as? [[String: Any]])
                #expect(Set(entries.compactMap { $0["backend"] as? String }) == ["bsd", "async"])
                // Each entry's p95 is its row's last-receipt p95 (one repetition: the median is that one).
                for entry in entries {
                    let row = try #require(
                        rows.first {
                            $0["scenario"] as? String == "broadcast-30-20/s-1s"
                                && $0["backend"] as? String == entry["backend"] as? String
                                && $0["transport"] as? String == verdict["transport"] as? String
                        })
                    let last = ((row["median"] as? [String: Any])?["broadcast"] as? [String: Any])?["lastReceipt"]
                    #expect((last as? [String: Any])?["p95"] as? Int == entry["p95"] as? Int)
                }
            }
            for transport in ["tcp", "ws"] {
                #expect(output.contains("An interactive connection beside 2 bulk ones on the same \(transport) server"))
                #expect(output.contains("Broadcast over \(transport), the most clients served"))
                #expect(output.contains("Your broadcast, broadcast-30-20/s-1s over \(transport): 30 clients"))
            }
        }
    }

    /// `compare --workload`: the user's load on every backend, ending in a verdict. The verdict must agree with
    /// the run's own figures: each backend's quoted p99 and range are the median and extremes of its
    /// repetitions in results.json, and the named best held the load and is not beaten by any other that held
    /// it (a lower p99 it cannot be told from in this run is allowed only where the best costs less CPU).
    @Test("compare --workload ends in a verdict that agrees with its own figures")
    func workloadVerdict() async throws {
        try await SocketTest.run(timeLimit: .seconds(300)) {
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("workload-\(getpid())")
            defer { try? FileManager.default.removeItem(at: directory) }
            let output = try await run([
                "compare", "--workload", "connections=24,rate=50/s,size=120,transport=tcp,duration=0.5s,p99=50ms",
                "--repetitions", "2", "--no-baselines", "--out", directory.path,
            ])
            let results = try String(contentsOf: directory.appendingPathComponent("results.json"), encoding: .utf8)
            try check(results, against: "compare.schema.json")
            let object = try #require(try JSONSerialization.jsonObject(with: Data(results.utf8)) as? [String: Any])
            let verdicts = try #require(object["verdicts"] as? [[String: Any]])
            try #require(verdicts.count == 1)
            let verdict = verdicts[0]
            #expect(verdict["transport"] as? String == "tcp")
            #expect(verdict["offeredPerSecond"] as? Double == 1200)
            let entries = try #require(verdict["entries"] as? [[String: Any]])
            let rows = try #require(object["rows"] as? [[String: Any]]).filter {
                ($0["scenario"] as? String) == "workload-24x50/s-120B-0.5s"
            }
            #expect(
                Set(rows.compactMap { $0["backend"] as? String })
                    == Set(entries.compactMap { $0["backend"] as? String }))
            struct Figures {
                var held: Bool
                var p99: Int
                var range: [Int]
                var cpu: Double
            }
            var figures: [String: Figures] = [:]
            for row in rows {
                let backend = try #require(row["backend"] as? String)
                let repetitions = try #require(row["repetitions"] as? [[String: Any]])
                #expect(repetitions.count == 2, "\(backend)")
                let p99s = repetitions.compactMap { ($0["latency"] as? [String: Any])?["p99"] as? Int }.sorted()
                let entry = try #require(entries.first { $0["backend"] as? String == backend })
                #expect(entry["p99"] as? Int == p99s[p99s.count / 2], "\(backend) quotes its median p99")
                #expect(entry["p99Range"] as? [Int] == [p99s.first!, p99s.last!], "\(backend)")
                figures[backend] = Figures(
                    held: entry["held"] as? Bool ?? false, p99: p99s[p99s.count / 2], range: [p99s.first!, p99s.last!],
                    cpu: entry["cpuPerMessageMicroseconds"] as? Double ?? .infinity)
            }
            let best = try #require(verdict["best"] as? String, "a 50 ms p99 bound at 1,200 messages/s is held")
            let chosen = try #require(figures[best])
            #expect(chosen.held)
            #expect(entries.first?["backend"] as? String == best, "the best is listed first")
            for (backend, other) in figures where backend != best && other.held {
                let overlap = chosen.range[0] <= other.range[1] && other.range[0] <= chosen.range[1]
                let near = Double(max(chosen.p99, other.p99)) <= Double(min(chosen.p99, other.p99)) * 1.05
                #expect(
                    chosen.p99 <= other.p99 || ((overlap || near) && chosen.cpu <= other.cpu),
                    "\(best) (p99 \(chosen.p99), cpu \(chosen.cpu)) named over \(backend) (p99 \(other.p99), cpu \(other.cpu))"
                )
            }
            #expect(output.contains("Best choice for this load: \(best)."), "\(output.suffix(3000))")
            let markdown = try String(contentsOf: directory.appendingPathComponent("report.md"), encoding: .utf8)
            #expect(markdown.contains("Best choice for this load: \(best)."))
            let html = try String(contentsOf: directory.appendingPathComponent("report.html"), encoding: .utf8)
            #expect(html.contains("<b>Your workload, tcp workload-24x50/s-120B-0.5s: \(best)</b>"))
        }
    }

    /// `compare --server-threads 1,2`: each fan-in and workload against servers on one and on two threads. The
    /// servers really ran that many loops (a loop backend's server process has one thread more on two), every
    /// row's scenario carries its threads, the workload gets a verdict per thread count, and the "Server threads"
    /// table sets the counts side by side in the terminal, report.md and report.html.
    @Test("compare --server-threads runs fan-in and workloads on servers of 1 and 2 threads, side by side")
    func serverThreads() async throws {
        try await SocketTest.run(timeLimit: .seconds(300)) {
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("threads-\(getpid())")
            defer { try? FileManager.default.removeItem(at: directory) }
            let output = try await run([
                "compare", "--scenarios", "fanin-16", "--workload",
                "connections=8,rate=50/s,size=64,transport=tcp,duration=0.3s,p99=50ms", "--server-threads", "1,2",
                "--backends", "uv,async", "--repetitions", "1", "--no-baselines", "--no-floor", "--out",
                directory.path,
            ])
            let results = try String(contentsOf: directory.appendingPathComponent("results.json"), encoding: .utf8)
            try check(results, against: "compare.schema.json")
            let object = try #require(try JSONSerialization.jsonObject(with: Data(results.utf8)) as? [String: Any])
            let plan = try #require(object["plan"] as? [String: Any])
            #expect(plan["serverThreads"] as? [Int] == [1, 2])
            #expect(
                plan["scenarios"] as? [String] == [
                    "fanin-16@1thread", "fanin-16@2threads", "workload-8x50/s-64B-0.3s@1thread",
                    "workload-8x50/s-64B-0.3s@2threads",
                ])
            let rows = try #require(object["rows"] as? [[String: Any]])
            for backend in ["uv", "async"] {
                var threads: [String: Int] = [:]
                for row in rows where row["backend"] as? String == backend {
                    let scenario = try #require(row["scenario"] as? String)
                    let server = (row["median"] as? [String: Any])?["server"] as? [String: Any]
                    threads[scenario] = server?["threads"] as? Int
                }
                let one = try #require(threads["fanin-16@1thread"], "\(backend): \(threads)")
                let two = try #require(threads["fanin-16@2threads"], "\(backend): \(threads)")
                #expect(two > one, "\(backend): a server on 2 loops has more threads than on 1 (\(two), \(one))")
            }
            let verdicts = try #require(object["verdicts"] as? [[String: Any]])
            #expect(verdicts.compactMap { $0["serverThreads"] as? Int }.sorted() == [1, 2])
            #expect(output.contains("== Server threads"), "\(output.suffix(3000))")
            #expect(output.contains("- Server threads, fanin-16 tcp: throughput on 2 threads over 1: "))
            let markdown = try String(contentsOf: directory.appendingPathComponent("report.md"), encoding: .utf8)
            #expect(markdown.contains("## Server threads"))
            #expect(markdown.contains("| fanin-16 | uv | tcp | 2 |"))
            let html = try String(contentsOf: directory.appendingPathComponent("report.html"), encoding: .utf8)
            #expect(html.contains("<h2 id=server-threads>Server threads</h2>"))
        }
    }

    /// `compare --sweep`: every backend and the C floor stepped through open-loop rates; results.json carries
    /// every step, the summary names each one's highest rate within the bound, and report.html, rendered by
    /// headless Chromium (flags that keep it from requests of its own), draws one latency curve per backend and
    /// the C floor's, and fetches nothing.
    @Test("compare --sweep draws one latency-against-load curve per backend, and the page fetches nothing")
    func sweepCurves() async throws {
        try await SocketTest.run(timeLimit: .seconds(300)) {
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("sweep-\(getpid())")
            defer { try? FileManager.default.removeItem(at: directory) }
            let output = try await run([
                "compare", "--sweep", "--sweep-rates", "1k,3k", "--bound", "50ms", "--transports", "tcp,udp,ws",
                "--repetitions", "1",
                "--no-baselines", "--out", directory.path,
            ])
            let results = try String(contentsOf: directory.appendingPathComponent("results.json"), encoding: .utf8)
            try check(results, against: "compare.schema.json")
            let object = try #require(try JSONSerialization.jsonObject(with: Data(results.utf8)) as? [String: Any])
            let plan = try #require(object["plan"] as? [String: Any])
            #expect(plan["sweep"] as? [Int] == [1000, 3000])
            let backends = try #require(plan["backends"] as? [String])
            let sources = ["c-floor"] + backends
            let rows = try #require(object["rows"] as? [[String: Any]])
            // The C floor speaks tcp and udp; ws is the backends' alone.
            func sourcesOf(_ transport: String) -> [String] { transport == "ws" ? backends : sources }
            for transport in ["tcp", "udp", "ws"] {
                for source in sourcesOf(transport) {
                    let steps = rows.filter {
                        $0["backend"] as? String == source && $0["transport"] as? String == transport
                    }
                    #expect(steps.count == 2, "\(source) \(transport): a row per step")
                }
                let summary = try #require(
                    output.split(separator: "\n").first { $0.hasPrefix("- Latency against load, \(transport)") })
                for source in sourcesOf(transport) { #expect(summary.contains("\(source) "), "\(summary)") }
            }
            let page = directory.appendingPathComponent("report.html")
            let html = try String(contentsOf: page, encoding: .utf8)
            for transport in ["tcp", "udp", "ws"] { #expect(html.contains("id=\"sweep-\(transport)\"")) }
            for external in ["<script", "<link", "<img", "<iframe", "src=", "href=", "url(", "http://", "https://"] {
                #expect(!html.contains(external), "report.html contains \(external)")
            }
            guard let chromium = HeadlessChromium.path else {
                print("skipped the Chromium render of the sweep: no chromium (scripts/ensure-deps --browser)")
                return
            }
            let netLog = directory.appendingPathComponent("netlog.json")
            let flags = HeadlessChromium.flags(
                profile: directory.appendingPathComponent("chromium-profile"), netLog: netLog)
            let render = try ChildProcess.run([chromium] + flags + ["--dump-dom", page.absoluteString])
            #expect(render.status == 0)
            // One curve per source in each transport's chart, in the DOM Chromium built.
            let charts = render.output.components(separatedBy: "<svg class=\"sweep\"").dropFirst()
            #expect(charts.count == 3, "a chart per transport")
            for (chart, transport) in zip(charts, ["tcp", "udp", "ws"]) {
                let drawn = chart.components(separatedBy: "</svg>")[0].components(
                    separatedBy: "<polyline class=\"curve\""
                )
                .dropFirst().compactMap { $0.split(separator: "\"").dropFirst().first.map(String.init) }
                #expect(drawn == sourcesOf(transport), "\(transport) curves drawn: \(drawn)")
            }
            #expect(HeadlessChromium.trafficBeyondLoopback(netLog: netLog).isEmpty)
            let screenshot = directory.appendingPathComponent("sweep.png")
            let shotLog = directory.appendingPathComponent("netlog-screenshot.json")
            let shotFlags = HeadlessChromium.flags(
                profile: directory.appendingPathComponent("chromium-profile-2"), netLog: shotLog)
            let shot = try ChildProcess.run(
                [chromium] + shotFlags + [
                    "--window-size=1100,1400", "--screenshot=\(screenshot.path)", page.absoluteString,
                ])
            #expect(shot.status == 0)
            let size = (try? FileManager.default.attributesOfItem(atPath: screenshot.path)[.size] as? Int) ?? 0
            #expect(size > 10_000, "the screenshot has the page in it (\(size) bytes)")
            let remote = HeadlessChromium.trafficBeyondLoopback(netLog: shotLog)
            #expect(remote.isEmpty, "Chromium sent traffic beyond loopback: \(remote)")
        }
    }

    /// report.html: the verdict first, charts with axes, the percentile plot, the project's targets in a section
    /// of their own; nothing on the page refers to anything outside it, and headless Chromium (with the flags
    /// that keep it from making requests of its own) renders the charts and fetches nothing: its network log
    /// has no http(s) request.
    func checkReportPage(_ file: URL) async throws {
        let html = try String(contentsOf: file, encoding: .utf8)
        let headings = html.components(separatedBy: "<h2").dropFirst().map { $0.prefix(80) }
        #expect(headings.first?.contains("Verdict") == true, "\(headings)")
        #expect(headings.last?.contains("The project's own targets") == true, "\(headings)")
        #expect(html.contains("<b>Lowest latency, tcp pingpong-64: bsd</b>"))
        // The decision's tables come right after the verdict, before any scenario's table.
        let decision = html.range(of: "<pre class=decision>")
        let firstTable = html.range(of: "<table>")
        #expect(decision != nil && firstTable != nil && decision!.lowerBound < firstTable!.lowerBound)
        #expect(html.contains("<b>Bulk, tcp pump-65536: bsd</b>"))
        #expect(html.contains("latency by percentile"))
        #expect(html.components(separatedBy: "<line class=axis").count > 4)
        for external in [
            "<script", "<link", "<img", "<iframe", "src=", "href=", "url(", "@import", "http://", "https://",
        ] {
            #expect(!html.contains(external), "report.html contains \(external)")
        }
        guard let chromium = HeadlessChromium.path else {
            print("skipped the Chromium render of report.html: no chromium (scripts/ensure-deps --browser)")
            return
        }
        let netLog = file.deletingLastPathComponent().appendingPathComponent("netlog.json")
        let flags = HeadlessChromium.flags(
            profile: file.deletingLastPathComponent().appendingPathComponent("chromium-profile"), netLog: netLog)
        let render = try ChildProcess.run([chromium] + flags + ["--dump-dom", file.absoluteString])
        #expect(render.status == 0)
        let dom = render.output
        #expect(dom.components(separatedBy: "<svg").count - 1 >= 6, "Chromium's DOM has the charts")
        #expect(dom.contains("polyline"), "the percentile plot is drawn")
        // Chromium still builds requests of its own (network time, updates); none may reach a socket beyond
        // loopback, and the page itself asks for nothing.
        let remote = HeadlessChromium.trafficBeyondLoopback(netLog: netLog)
        #expect(remote.isEmpty, "Chromium sent traffic beyond loopback: \(remote)")
        let log = (try? String(contentsOf: netLog, encoding: .utf8)) ?? ""
        #expect(!log.isEmpty, "Chromium wrote its network log")
    }

    @Test("The validator catches what the schemas forbid")
    func validatorCatches() throws {
        var validator = SchemaValidator(directory: Self.schemas)
        let bad: [String: Any] = [
            "backend": "carrier-pigeon", "url": "tcp://x", "transport": "tcp", "size": 0, "warmup": 1,
            "tcpNoDelay": true, "latencyUnit": "ms", "lost": 0, "roundTripsPerSecond": 1.5, "extra": 1,
            "latency": ["count": 1],
        ]
        let problems = try validator.validate(bad, against: "ping.schema.json")
        for expected in ["backend", "size", "latencyUnit", "extra", "latency.min"] {
            #expect(problems.contains { $0.contains(expected) }, "no problem named \(expected): \(problems)")
        }
        // A bound above (the compare schema's fairness index is at most 1).
        var fairness = SchemaValidator(directory: Self.schemas)
        let index: [String: Any] = ["connections": 2, "jainIndex": 1.5, "slowestShare": 1]
        let tooFair = try fairness.validate(
            index, against: "compare.schema.json", definition: "fairness")
        #expect(tooFair.contains { $0.contains("jainIndex") && $0.contains("above") }, "\(tooFair)")
        #expect(
            try fairness.validate(
                ["connections": 2, "jainIndex": 1, "slowestShare": 1], against: "compare.schema.json",
                definition: "fairness"
            ).isEmpty)
    }
}

/// The JSON Schema keywords docs/schemas uses: $ref (another file, or #/$defs/NAME), type, const, enum,
/// required, properties, additionalProperties, items, minimum, maximum, minItems, maxItems, pattern.
struct SchemaValidator {
    let directory: URL
    private var loaded: [String: [String: Any]] = [:]

    init(directory: URL) { self.directory = directory }

    /// Checks `value` against the schema in `file`, or against one of its `$defs` (`definition`).
    mutating func validate(_ value: Any, against file: String, definition: String? = nil) throws -> [String] {
        var problems: [String] = []
        let root = try load(file)
        var schema = root
        if let definition {
            guard let definitions = root["$defs"] as? [String: Any],
                let part = definitions[definition] as? [String: Any]
            else { throw SocketTest.Failure(description: "\(file) has no definition \(definition)") }
            schema = part
        }
        try check(value, schema, root: root, path: "", &problems)
        return problems
    }

    private mutating func load(_ file: String) throws -> [String: Any] {
        if let schema = loaded[file] { return schema }
        let data = try Data(contentsOf: directory.appendingPathComponent(file))
        guard let schema = try JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            throw SocketTest.Failure(description: "\(file) is not a JSON object")
        }
        loaded[file] = schema
        return schema
    }

    private static let known: Set<String> = [
        "$schema", "$id", "$ref", "$defs", "title", "description", "type", "const", "enum", "required",
        "properties", "additionalProperties", "items", "minimum", "maximum", "minItems", "maxItems", "pattern",
    ]

    private mutating func check(
        _ value: Any, _ schema: [String: Any], root: [String: Any], path: String, _ problems: inout [String]
    ) throws {
        let at = path.isEmpty ? "(top)" : path
        for key in schema.keys where !Self.known.contains(key) {
            throw SocketTest.Failure(description: "the schema uses \(key), which this validator does not know")
        }
        if let reference = schema["$ref"] as? String {
            if reference.hasPrefix("#/$defs/") {
                let name = String(reference.dropFirst("#/$defs/".count))
                guard let definitions = root["$defs"] as? [String: Any],
                    let target = definitions[name] as? [String: Any]
                else { throw SocketTest.Failure(description: "no definition \(reference)") }
                try check(value, target, root: root, path: path, &problems)
            } else {
                // Another file, whole or one of its definitions: `compare.schema.json#/$defs/result`.
                let parts = reference.split(separator: "#", maxSplits: 1).map(String.init)
                let other = try load(parts[0])
                var target = other
                if parts.count == 2 {
                    let name = String(parts[1].dropFirst("/$defs/".count))
                    guard parts[1].hasPrefix("/$defs/"), let definitions = other["$defs"] as? [String: Any],
                        let part = definitions[name] as? [String: Any]
                    else { throw SocketTest.Failure(description: "no definition \(reference)") }
                    target = part
                }
                try check(value, target, root: other, path: path, &problems)
            }
        }
        if let type = schema["type"] as? String, !Self.matches(value, type) {
            problems.append("\(at): not of type \(type)")
            return
        }
        if let constant = schema["const"], !Self.equal(value, constant) {
            problems.append("\(at): must be \(constant)")
        }
        if let allowed = schema["enum"] as? [Any], !allowed.contains(where: { Self.equal(value, $0) }) {
            problems.append("\(at): \(value) is not one of \(allowed)")
        }
        if let minimum = (schema["minimum"] as? NSNumber)?.doubleValue, let number = Self.number(value),
            number < minimum
        {
            problems.append("\(at): \(number) is below \(minimum)")
        }
        if let maximum = (schema["maximum"] as? NSNumber)?.doubleValue, let number = Self.number(value),
            number > maximum
        {
            problems.append("\(at): \(number) is above \(maximum)")
        }
        if let pattern = schema["pattern"] as? String, let text = value as? String,
            text.range(of: pattern, options: .regularExpression) == nil
        {
            problems.append("\(at): '\(text)' does not match \(pattern)")
        }
        if let object = value as? [String: Any] {
            for key in schema["required"] as? [String] ?? [] where object[key] == nil {
                problems.append("\(path.isEmpty ? "" : path + ".")\(key): missing")
            }
            let properties = schema["properties"] as? [String: Any] ?? [:]
            for (key, member) in object {
                let memberPath = path.isEmpty ? key : "\(path).\(key)"
                if let propertySchema = properties[key] as? [String: Any] {
                    try check(member, propertySchema, root: root, path: memberPath, &problems)
                } else if let additional = schema["additionalProperties"] as? [String: Any] {
                    try check(member, additional, root: root, path: memberPath, &problems)
                } else if schema["additionalProperties"] as? Bool == false {
                    problems.append("\(memberPath): not allowed")
                }
            }
        }
        if let array = value as? [Any] {
            if let minimum = schema["minItems"] as? Int, array.count < minimum {
                problems.append("\(at): fewer than \(minimum) items")
            }
            if let maximum = schema["maxItems"] as? Int, array.count > maximum {
                problems.append("\(at): more than \(maximum) items")
            }
            if let items = schema["items"] as? [String: Any] {
                for (index, item) in array.enumerated() {
                    try check(item, items, root: root, path: "\(at)[\(index)]", &problems)
                }
            }
        }
    }

    private static func matches(_ value: Any, _ type: String) -> Bool {
        switch type {
        case "object": return value is [String: Any]
        case "array": return value is [Any]
        case "string": return value is String
        case "boolean": return isBoolean(value)
        case "integer": return number(value).map { $0.rounded() == $0 } ?? false
        case "number": return number(value) != nil
        case "null": return value is NSNull
        default: return false
        }
    }

    /// JSONSerialization gives true and false as a boolean subclass of NSNumber.
    private static func isBoolean(_ value: Any) -> Bool {
        String(describing: Swift.type(of: value)).contains("Boolean")
    }

    /// A JSON number (NSNumber, or a Swift Double or Int, as JSONSerialization may give), not a boolean.
    private static func number(_ value: Any) -> Double? {
        if isBoolean(value) { return nil }
        if let number = value as? Double { return number }
        if let number = value as? Int { return Double(number) }
        return (value as? NSNumber)?.doubleValue
    }

    private static func equal(_ value: Any, _ other: Any) -> Bool {
        if let a = value as? String, let b = other as? String { return a == b }
        if let a = number(value), let b = number(other) { return a == b }
        return false
    }
}
