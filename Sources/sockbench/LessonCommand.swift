import ArgumentParser
import Foundation
import Lessons
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
        if json {
            try Console.json(
                LessonJSON(
                    lesson: lesson.name, summary: lesson.summary, backend: backend.rawValue, faults: faults,
                    figures: report.figures, lines: report.lines))
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
}

/// The measuring side of the namespace lessons (run inside a namespace by the lesson itself).
struct LessonProbeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lesson-probe", abstract: "Internal: the client side of the loss, ordering and multicast lessons.",
        shouldDisplay: false)

    @Argument var mode: String
    @Argument var url: String
    @Option var backend: String = Backend.bsd.name

    func run() async throws {
        let encoder = JSONEncoder()
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
