import ConnectionCore
public import SocketStyles
import Synchronization

/// What a lesson measured: the lines it printed, and the key figures by name, so that tests can check the
/// lesson's claims (without asserting timings).
public struct LessonReport: Sendable {
    /// The lesson's name.
    public var lesson: String
    /// Everything printed, in order.
    public var lines: [String] = []
    /// Key figures by name (counts, bytes, microseconds).
    public var figures: [String: Double] = [:]
    /// What the lesson did, with times: the picture's arrows and marks (``LessonTrace``).
    public var events: [LessonEvent] = []
    /// The picture's diagrams, which ``LessonEvent/phase`` indexes.
    public var phases: [LessonPhase] = []
    /// Lines (by index into ``lines``) that point at a diagram (by index into ``phases``): a "Here ..."
    /// sentence and the part of the picture that shows it.
    public var pointers: [Int: Int] = [:]
    /// Each traced TCP connection's state over its diagram's time (cwnd, RTT, bytes sent and acknowledged).
    public var tcp: [LessonTCPSeries] = []
    /// Values over time drawn under a diagram (flows' throughput and fairness, a ping's round trip).
    public var charts: [LessonChart] = []

    public init(lesson: String) { self.lesson = lesson }

    mutating func say(_ line: String = "", pointingAt phase: Int? = nil) {
        if let phase { pointers[lines.count] = phase }
        lines.append(line)
    }
}

/// A live experiment on real sockets that shows how TCP or UDP behaves, with a plain-language explanation.
public struct Lesson: Sendable {
    /// The name users type: `sockbench lesson NAME`.
    public let name: String
    /// One line on what it shows.
    public let summary: String
    /// Runs it with `backend`, printing through `print` as it goes.
    public let run:
        @Sendable (_ backend: Backend, _ print: @escaping @Sendable (String) -> Void) async throws -> LessonReport

    /// Every lesson, in the order they are best read.
    public static let all: [Lesson] = [
        .boundaries, .handshake, .nagle, .mtu, .flow, .loss, .ordering, .headOfLine, .deadPeer, .multicast,
        .congestion, .c10k,
    ]

    /// The lesson named `name`.
    public static func named(_ name: String) -> Lesson? { all.first { $0.name == name } }

    /// Where the loss and ordering lessons get their faults.
    public enum Faults: String, Sendable, CaseIterable {
        /// Network namespaces when this process may create them (root, iproute2, iptables), else the relay.
        case automatic
        /// Kernel packet loss between two network namespaces (root): TCP's own retransmissions show.
        case namespaces
        /// A user-space relay (``Relay``, `sockbench proxy`) that drops or delays messages: no root needed.
        case relay
    }

    /// The fault source for lessons run in this task (`sockbench lesson --faults`).
    @TaskLocal public static var faults: Faults = .automatic

    /// The relay version runs (with why, when it was not asked for) or the namespace version does.
    enum FaultSource {
        case namespaces
        case relay(because: String?)
    }

    static var faultSource: FaultSource {
        switch faults {
        case .relay: .relay(because: nil)
        case .namespaces: .namespaces
        case .automatic: NetworkLab.unavailableReason().map { FaultSource.relay(because: $0) } ?? .namespaces
        }
    }
}

/// Collects lines and figures while printing each line as it comes.
final class LessonOutput: Sendable {
    private let collected: Guarded<LessonReport>
    let print: @Sendable (String) -> Void
    /// Where the lesson records its events for the picture.
    let trace = LessonTrace()

    init(_ lesson: String, _ print: @escaping @Sendable (String) -> Void) {
        collected = Guarded(LessonReport(lesson: lesson))
        self.print = print
    }

    /// What was said, measured and recorded so far.
    var report: LessonReport {
        var report = collected.withLock { $0 }
        report.events = trace.events
        report.phases = trace.phases
        report.tcp = trace.tcpSeries
        return report
    }

    /// Prints `line`; with `phase`, the page links it to that diagram (a "Here ..." sentence and what shows it).
    func say(_ line: String = "", pointingAt phase: Int? = nil) {
        collected.withLock { $0.say(line, pointingAt: phase) }
        print(line)
    }

    func figure(_ name: String, _ value: Double) {
        collected.withLock { $0.figures[name] = value }
    }

    func chart(_ chart: LessonChart) {
        collected.withLock { $0.charts.append(chart) }
    }
}

func loopback(_ transport: Transport) -> Endpoint {
    try! Endpoint(url: "\(transport)://127.0.0.1:0")
}

/// Formats a count with thousands separators.
func grouped(_ value: Int) -> String {
    let digits = String(value.magnitude)
    var result = ""
    for (index, character) in digits.enumerated() {
        if index > 0 && (digits.count - index) % 3 == 0 { result += "," }
        result.append(character)
    }
    return (value < 0 ? "-" : "") + result
}
