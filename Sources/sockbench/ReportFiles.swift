import ArgumentParser
import BenchmarkDriver
import Foundation
import POSIXSupport
import SocketStyles

/// The report as files: results.json, results.csv, report.md and report.html.
extension Report {
    func write(to directory: String) throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        try encoder.encode(self).write(to: URL(fileURLWithPath: directory + "/results.json"))
        try csv().write(toFile: directory + "/results.csv", atomically: true, encoding: .utf8)
        try markdown().write(toFile: directory + "/report.md", atomically: true, encoding: .utf8)
        try ReportHTML(report: self).render().write(
            toFile: directory + "/report.html", atomically: true, encoding: .utf8)
    }

    func csv() -> String {
        var lines = [
            "scenario,backend,transport,repetitions,p50_ns,p90_ns,p99_ns,p999_ns,max_ns,uncorrected_p50_ns,uncorrected_p99_ns,messages_per_s,bytes_per_s,messages,lost,received,reordered,kernel_drops,cpu_ns_per_message,client_user_ns,client_sys_ns,server_user_ns,server_sys_ns,client_ctx,server_ctx,server_peak_rss_kib,server_threads,server_kib_per_connection,client_kib_per_connection,quiet_p50_ns,server_threads_open"
        ]
        for row in rows {
            let m = row.median
            let fields: [String] = [
                row.scenario.description, row.backend, row.transport, "\(row.repetitions.count)",
                m.latency.map { "\($0.p50)" } ?? "", m.latency.map { "\($0.p90)" } ?? "",
                m.latency.map { "\($0.p99)" } ?? "",
                m.latency.map { "\($0.p999)" } ?? "", m.latency.map { "\($0.max)" } ?? "",
                m.uncorrectedLatency.map { "\($0.p50)" } ?? "", m.uncorrectedLatency.map { "\($0.p99)" } ?? "",
                m.messagesPerSecond.map { fixed($0, 1) } ?? "", m.bytesPerSecond.map { fixed($0, 0) } ?? "",
                "\(m.messages)", m.lost.map(String.init) ?? "", m.received.map(String.init) ?? "",
                m.reordered.map(String.init) ?? "", m.kernelReceiveBufferDrops.map(String.init) ?? "",
                m.cpuPerMessageNanoseconds.map { fixed($0, 0) } ?? "",
                m.client.map { "\($0.userNanoseconds)" } ?? "", m.client.map { "\($0.systemNanoseconds)" } ?? "",
                m.server.map { "\($0.userNanoseconds)" } ?? "", m.server.map { "\($0.systemNanoseconds)" } ?? "",
                m.client.map { "\($0.voluntaryContextSwitches + $0.involuntaryContextSwitches)" } ?? "",
                m.server.map { "\($0.voluntaryContextSwitches + $0.involuntaryContextSwitches)" } ?? "",
                m.server.map { "\($0.peakResidentKiB)" } ?? "", m.server.map { "\($0.threads)" } ?? "",
                m.serverKiBPerConnection.map { fixed($0, 2) } ?? "",
                m.clientKiBPerConnection.map { fixed($0, 2) } ?? "", m.quietP50.map { "\($0)" } ?? "",
                m.serverThreadsOpen.map(String.init) ?? "",
            ]
            lines.append(fields.joined(separator: ","))
        }
        return lines.joined(separator: "\n") + "\n"
    }

    func markdown() -> String {
        var text = "# sockbench compare\n\n"
        text +=
            "Measured \(machine.date) on \(machine.cpus) x \(machine.cpuModel), \(machine.kernel); load average before: \(machine.loadAverageBefore). "
        text += "libuv \(machine.libuv), \(machine.openssl), SwiftNIO \(machine.swiftNIO)"
        text += machine.udpOffload.map { ". \($0)" } ?? ""
        text += machine.uring.map { ". \($0).\n\n" } ?? ".\n\n"
        text +=
            "Servers: \(plan.servers == "local" ? "child processes on this host" : "on another host, started by `sockbench serve --agent` at \(plan.servers)"). "
        text += "Placement: \(plan.placement.rawValue)"
        if let server = plan.serverCPU, let client = plan.clientCPU {
            text += " (server CPU \(server), client CPU \(client))"
        }
        text +=
            "; \(plan.repetitions) repetitions, medians; pingpong \(plan.pingpongCount) round trips after \(plan.pingpongWarmup); "
        text +=
            "rate windows \(plan.rateSeconds) s, senders pacing by \((plan.pacing ?? .sleep).rawValue); pump \(plan.pumpSeconds.map { "passes of \($0) s after a \(plan.pumpBytes >> 23) MiB warm-up" } ?? "\(plan.pumpBytes >> 20) MiB"); connect \(plan.connectCount); fan-in \(plan.faninCount) round trips per connection (beyond 1,000 connections \(plan.faninCount) x 1,000 in all).\n\n"
        text += "Options: \(plan.options).\n\n"
        let decision = decision()
        if !decision.isEmpty {
            // First, as on the terminal last: what the run means for a choice.
            text +=
                "## The decision\n\n```\n"
                + decision.dropFirst().flatMap { $0.contains("\n") ? [$0] : Self.wrap($0, width: Self.terminalWidth) }
                .joined(separator: "\n") + "\n```\n\n"
        }
        for scenario in plan.scenarios where rows.contains(where: { $0.scenario == scenario }) {
            let (header, cells) = table(for: scenario)
            text +=
                "## \(scenario)\n\n| " + header.joined(separator: " | ") + " |\n|"
                + header.map { _ in "---" }.joined(separator: "|") + "|\n"
            for row in cells { text += "| " + row.joined(separator: " | ") + " |\n" }
            text += "\n"
        }
        if let (header, cells) = serverThreadsTable() {
            text +=
                "## Server threads\n\nThe same loads against servers on each thread count (`--server-threads`), not pinned.\n\n| "
                + header.joined(separator: " | ") + " |\n|" + header.map { _ in "---" }.joined(separator: "|") + "|\n"
            for row in cells { text += "| " + row.joined(separator: " | ") + " |\n" }
            text += "\n"
        }
        if !skipped.isEmpty {
            let reasons = Set(skipped.values).sorted()
            text += "Not run: " + reasons.joined(separator: "; ") + ".\n\n"
        }
        text += summary().dropFirst().joined(separator: "\n") + "\n\n"
        text += notes.map { "- " + $0 }.joined(separator: "\n") + "\n"
        let targets = targets()
        if !targets.isEmpty {
            text += "\n## The project's own targets\n\n" + Self.targetsPreamble + "\n\n"
            text += targets.joined(separator: "\n") + "\n"
        }
        return text
    }
}

/// `sockbench report DIR`: writes report.md, report.html and results.csv again from DIR/results.json (after
/// an upgrade of sockbench, or to print a run's tables and summary again).
struct RenderReport: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "report",
        abstract: "Render a compare run again from its results.json: tables, summary, report.md/html, results.csv."
    )

    @Argument(help: "A directory written by `sockbench compare --out DIR`.")
    var directory: String

    @OptionGroup var output: ReportOutputOptions

    func run() throws {
        let data: Data
        do {
            data = try Data(contentsOf: URL(fileURLWithPath: directory + "/results.json"))
        } catch {
            throw fail("cannot read \(directory)/results.json: \(error.localizedDescription)")
        }
        let report: Report
        do {
            report = try JSONDecoder().decode(Report.self, from: data)
        } catch {
            throw fail("\(directory)/results.json is not a compare report: \(error)")
        }
        Console.line(report.terminalTables(wide: output.wide))
        try report.write(to: directory)
        try output.checkTargets(of: report)
    }
}

/// How `compare` and `report` print a run: the terminal's width, and the project's own targets.
struct ReportOutputOptions: ParsableArguments {
    @Flag(help: "Print every table's every column (report.md's); by default no line is wider than 120 columns.")
    var wide = false

    @Flag(
        help:
            "Also print the project's own performance targets against this run, and exit 1 if any is missed (for CI and regression checks)."
    )
    var checkTargets = false

    /// With `--check-targets`: prints the targets and fails when one is missed.
    func checkTargets(of report: Report) throws {
        guard checkTargets else { return }
        let lines = report.targets()
        Console.line(
            (["== The project's own targets"]
                + lines.flatMap { wide ? [$0] : Report.wrap($0, width: Report.terminalWidth) })
                .joined(separator: "\n"))
        let missed = lines.filter { $0.contains(": MISSED by ") }.count
        if missed > 0 {
            Console.error("sockbench: \(missed) of \(lines.count) target(s) missed")
            throw ExitCode.failure
        }
        if lines.isEmpty { Console.line("(this run measured none of them)") }
    }
}
