import ArgumentParser
import ConnectionTestKit
import Foundation
import Lessons
import POSIXSupport
import SocketStyles

struct LessonCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lesson",
        abstract: "Run a live lesson on how TCP and UDP behave (no name: list them).",
        discussion: "Each lesson runs on real sockets in under a minute and explains what it measured."
    )

    @Argument(help: "The lesson to run.")
    var name: String?

    @Option(help: "The connection style to run it with.")
    var backend: String = Backend.bsd.name

    @Flag(
        help:
            "Print only JSON on standard output (the lesson's text, its figures, which faults ran); the text also goes to standard error as it runs."
    )
    var json = false

    @Option(
        help: ArgumentHelp(
            "Also write the lesson as one self-contained page: a time-sequence diagram of what it did (an arrow per send), beside its text and figures.",
            valueName: "file"))
    var html: String?

    @Option(
        help: ArgumentHelp(
            "Also render the page to a PNG with headless Chromium (scripts/ensure-deps --browser), started so that it fetches nothing; the run fails if it reached beyond loopback.",
            valueName: "file"))
    var png: String?

    @Option(
        help:
            "Where loss and ordering get their faults: automatic (namespaces when root, else the relay), namespaces (root: kernel packet loss, TCP retransmits), relay (a user-space relay, no root)."
    )
    var faults: String = Lesson.Faults.automatic.rawValue

    func run() async throws {
        guard let name else {
            Console.line("Lessons (sockbench lesson NAME [--backend B]):")
            for lesson in Lesson.all {
                Console.line("  \(lesson.name.padding(toLength: 11, withPad: " ", startingAt: 0)) \(lesson.summary)")
            }
            return
        }
        guard let lesson = Lesson.named(name) else {
            throw fail("unknown lesson '\(name)' (\(Lesson.all.map(\.name).joined(separator: ", ")))")
        }
        let backend: Backend
        do throws(ConnectionError) {
            backend = try Backend(name: self.backend)
        } catch {
            throw fail(error.detail)
        }
        // With --json, standard output carries the JSON alone; the lesson still talks, on standard error.
        let json = json
        let say: @Sendable (String) -> Void = { line in
            if json { Console.error(line) } else { Console.line(line) }
        }
        say("== lesson: \(lesson.name) - \(lesson.summary)")
        let report: LessonReport
        do {
            guard let faults = Lesson.Faults(rawValue: faults) else {
                throw fail("--faults must be \(Lesson.Faults.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            report = try await Lesson.$faults.withValue(faults) { try await lesson.run(backend) { say($0) } }
        } catch {
            throw fail("the lesson failed: \(error)")
        }
        if html != nil || png != nil {
            let page = LessonPage.render(report, summary: lesson.summary, backend: backend.rawValue)
            let scratch = FileManager.default.temporaryDirectory.appendingPathComponent(
                "sockbench-lesson-\(getpid())")
            defer { try? FileManager.default.removeItem(at: scratch) }
            let file = URL(fileURLWithPath: html ?? scratch.appendingPathComponent("\(lesson.name).html").path)
            do {
                try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: true)
                try page.html.write(to: file, atomically: true, encoding: .utf8)
            } catch {
                throw fail("could not write \(file.path): \(error.localizedDescription)")
            }
            let arrows = report.events.filter { $0.kind == .send }.count
            if let html {
                say("Wrote \(html): \(report.phases.count) diagram(s), \(arrows) arrows (one per send recorded).")
            }
            if let png {
                try screenshot(file, to: URL(fileURLWithPath: png), width: page.width, height: page.height, scratch)
                say("Wrote \(png) (\(page.width) x \(page.height), headless Chromium; nothing fetched).")
            }
        }
        if json {
            try Console.json(
                LessonJSON(
                    lesson: lesson.name, summary: lesson.summary, backend: backend.rawValue, faults: faults,
                    figures: report.figures, lines: report.lines, phases: report.phases, events: report.events,
                    tcp: report.tcp, charts: report.charts))
        }
    }
}

extension LessonCommand {
    /// Renders `page` to `png` with headless Chromium, with the flags the browser tests use (no requests of its
    /// own, names other than 127.0.0.1 unresolvable) and its network log checked afterwards.
    func screenshot(_ page: URL, to png: URL, width: Int, height: Int, _ scratch: URL) throws {
        guard let chromium = HeadlessChromium.path else {
            throw fail("--png needs Chromium (scripts/ensure-deps --browser installs it)")
        }
        let netLog = scratch.appendingPathComponent("netlog.json")
        let flags = HeadlessChromium.flags(profile: scratch.appendingPathComponent("profile"), netLog: netLog)
        let shot: (status: Int32, output: String)
        do throws(ConnectionError) {
            shot = try ChildProcess.run(
                [chromium] + flags + [
                    "--hide-scrollbars", "--window-size=\(width),\(height)", "--screenshot=\(png.path)",
                    page.absoluteString,
                ])
        } catch {
            throw fail("could not start Chromium: \(error)")
        }
        guard shot.status == 0, FileManager.default.fileExists(atPath: png.path) else {
            throw fail("Chromium did not write \(png.path) (exit \(shot.status)): \(shot.output.suffix(400))")
        }
        let remote = HeadlessChromium.trafficBeyondLoopback(netLog: netLog)
        guard remote.isEmpty else {
            throw fail("Chromium reached beyond loopback while rendering: \(remote.joined(separator: ", "))")
        }
    }
}

/// What `sockbench lesson NAME --json` prints (docs/schemas/lesson.schema.json). A figure's unit is in its name
/// (`p50us`: microseconds, `...Seconds`, counts otherwise).
struct LessonJSON: Codable {
    var schema = "socketstyles.lesson/1"
    var lesson: String
    var summary: String
    var backend: String
    /// The --faults asked for; a lesson that used the relay says so in `figures.relay` (1).
    var faults: String
    var figures: [String: Double]
    /// The text the lesson printed, line by line.
    var lines: [String]
    /// The diagrams of its picture (`events[].phase` indexes them).
    var phases: [LessonPhase]
    /// What it did, with times in microseconds since it began: every send (with when it arrived, or null), every
    /// receive, and marks (connections, faults, the end of a stream).
    var events: [LessonEvent]
    /// Each traced TCP connection's state over its diagram's time, read every millisecond (TCP_INFO): the
    /// readings that changed something.
    var tcp: [LessonTCPSeries]
    /// Values over time drawn under a diagram (the congestion lesson's flows and ping).
    var charts: [LessonChart]
}

/// The measuring side of the namespace lessons (run inside a namespace by the lesson itself).
struct LessonProbeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lesson-probe",
        abstract: "Internal: the client side of the loss, ordering, multicast and congestion lessons.",
        shouldDisplay: false)

    @Argument var mode: String
    @Argument var url: String
    @Option var backend: String = Backend.bsd.name
    /// `congestion`: the UDP echo server to ping beside the flows.
    @Option var ping: String?

    func run() async throws {
        let encoder = JSONEncoder()
        if mode == "congestion" {
            guard let ping else { throw fail("congestion needs --ping URL") }
            let run = try await CongestionProbe.run(
                backend: try Backend(name: backend), sink: try Endpoint(url: url), ping: try Endpoint(url: ping))
            Console.line(String(decoding: try encoder.encode(run), as: UTF8.self))
            return
        }
        if mode == "multicast" {
            let endpoint = try Endpoint(url: url)
            Console.line(
                String(
                    decoding: try encoder.encode(try MulticastProbe.run(group: endpoint.host.literal)), as: UTF8.self))
            return
        }
        let result = try await LessonProbe.run(mode: mode, backend: try Backend(name: backend), url: url)
        Console.line(String(decoding: try encoder.encode(result), as: UTF8.self))
    }
}
