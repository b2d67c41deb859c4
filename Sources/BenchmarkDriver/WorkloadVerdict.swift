/// Which backends held a ``Workload`` and which is the best choice for it, from the run's own figures.
///
/// A backend *held* the load when, in the median of its repetitions, the sender kept the schedule (echoes came
/// back at no less than 95% of the offered rate), at most 1% of messages went unanswered, and the p99 from the
/// intended send time stayed at or under the bound. Among those that held it, the lowest median p99 wins; when
/// other p99s cannot be told from it in this run (ranges over the repetitions that overlap, or medians within
/// 5%), the lowest CPU per message among them decides, then the least server memory per connection; a backend that
/// another one beats on both p99 and cost is never named. When none held it, the verdict
/// names the one that came closest (the largest share of the offered rate answered, then the lowest p99).
public struct WorkloadVerdict: Sendable, Codable, Hashable {
    /// One backend's figures: medians over the repetitions, with the smallest and largest p99.
    public struct Entry: Sendable, Codable, Hashable, VerdictEntry {
        public var backend: String
        public var held: Bool
        /// Repetitions that held the load on their own.
        public var repetitionsHeld: Int
        public var repetitions: Int
        /// Why it did not hold (empty when it did).
        public var shortfalls: [String]
        public var p50: UInt64
        public var p99: UInt64
        public var p999: UInt64
        /// The smallest and largest p99 over the repetitions, nanoseconds.
        public var p99Range: [UInt64]
        /// Echoes per second, and as a share of the offered rate.
        public var achievedPerSecond: Double
        public var achievedShare: Double
        /// Messages sent but never echoed (within half a second of the last send), percent.
        public var lossPercent: Double
        public var cpuPerMessageMicroseconds: Double?
        public var serverKiBPerConnection: Double?
        public var clientKiBPerConnection: Double?
    }

    public var workload: Workload
    /// The threads its servers ran on (`compare --server-threads`); `nil`: one, placed as the run's placement says.
    public var serverThreads: Int?
    public var transport: String
    public var offeredPerSecond: Double
    /// The p99 a backend had to keep, nanoseconds.
    public var p99Bound: UInt64
    /// Held first, best first; then the rest, closest first.
    public var entries: [Entry]
    /// The backend the verdict recommends (`nil` when none held the load).
    public var best: String?
    /// The backend that came closest when none held it.
    public var closest: String?
    /// Backends whose p99 range overlaps the best's (held, not distinguishable by p99 in this run).
    public var tiedOnP99: [String]
    /// Why the best was chosen (or why none was), in a sentence.
    public var reason: String

    public static let minimumShare = 0.95
    public static let maximumLossPercent = 1.0

    /// The verdict from every backend's repetitions of the workload on one transport.
    public init(
        workload: Workload, transport: String, p99Bound: UInt64, runs: [(backend: String, results: [ScenarioResult])]
    ) {
        self.workload = workload
        self.transport = transport
        self.p99Bound = p99Bound
        offeredPerSecond = workload.totalPerSecond
        let offered = workload.totalPerSecond
        func mid<T: Comparable>(_ values: [T]) -> T? { values.isEmpty ? nil : values.sorted()[values.count / 2] }
        func loss(_ result: ScenarioResult) -> Double {
            result.messages > 0 ? Double(result.lost ?? 0) * 100 / Double(result.messages) : 100
        }
        func shortfalls(p99: UInt64, share: Double, loss: Double) -> [String] {
            var found: [String] = []
            if share < Self.minimumShare { found.append("answered \(fixed(share * 100, 1))% of the offered rate") }
            if loss > Self.maximumLossPercent { found.append("\(fixed(loss, 2))% of messages unanswered") }
            if p99 > p99Bound {
                found.append("p99 \(Self.time(p99)) over the \(Self.time(p99Bound)) bound")
            }
            return found
        }
        var entries: [Entry] = []
        for (backend, results) in runs where !results.isEmpty {
            let p99s = results.map { $0.latency?.p99 ?? .max }
            let p99 = mid(p99s)!
            let achieved = mid(results.map { $0.messagesPerSecond ?? 0 })!
            let lost = mid(results.map(loss))!
            let heldEach = results.filter {
                shortfalls(
                    p99: $0.latency?.p99 ?? .max, share: ($0.messagesPerSecond ?? 0) / offered, loss: loss($0)
                ).isEmpty
            }.count
            let missing = shortfalls(p99: p99, share: achieved / offered, loss: lost)
            entries.append(
                Entry(
                    backend: backend, held: missing.isEmpty, repetitionsHeld: heldEach, repetitions: results.count,
                    shortfalls: missing, p50: mid(results.map { $0.latency?.p50 ?? .max })!, p99: p99,
                    p999: mid(results.map { $0.latency?.p999 ?? .max })!, p99Range: [p99s.min()!, p99s.max()!],
                    achievedPerSecond: achieved, achievedShare: achieved / offered, lossPercent: lost,
                    cpuPerMessageMicroseconds: mid(results.compactMap(\.cpuPerMessageNanoseconds)).map { $0 / 1000 },
                    serverKiBPerConnection: mid(results.compactMap(\.serverKiBPerConnection)),
                    clientKiBPerConnection: mid(results.compactMap(\.clientKiBPerConnection))))
        }
        let held = entries.filter(\.held).sorted { ($0.p99, $0.backend) < ($1.p99, $1.backend) }
        let rest = entries.filter { !$0.held }.sorted {
            ($0.achievedShare, -Double($0.p99)) > ($1.achievedShare, -Double($1.p99))
        }
        let choice = VerdictChoice(
            held: held, rest: rest, figure: \.p99, indistinguishable: Self.indistinguishable,
            cheaper: { Self.cheaper($0, than: $1) },
            describe: {
                .init(
                    value: Self.time($0.p99), range: Self.range($0), repetitions: $0.repetitions, cost: Self.costs($0))
            }, lowest: "p99", figure: "p99")
        self.entries = choice.entries
        best = choice.best
        closest = choice.closest
        tiedOnP99 = choice.tied
        reason = choice.reason
    }

    /// Two p99s this run cannot tell apart: their ranges over the repetitions overlap, or their medians are
    /// within ``resolution`` of each other (one repetition has no range; a p99 moves that much run to run).
    static func indistinguishable(_ a: Entry, _ b: Entry) -> Bool {
        let overlap = a.p99Range[0] <= b.p99Range[1] && b.p99Range[0] <= a.p99Range[1]
        let near = Double(max(a.p99, b.p99)) <= Double(min(a.p99, b.p99)) * (1 + resolution)
        return overlap || near
    }

    /// How close two medians may be and still count as the same (5%).
    public static let resolution = 0.05

    /// `a` costs less than `b`: CPU per message, then server memory per connection, then name.
    static func cheaper(_ a: Entry, than b: Entry) -> Bool {
        let cpu = (a.cpuPerMessageMicroseconds ?? .infinity, b.cpuPerMessageMicroseconds ?? .infinity)
        if cpu.0 != cpu.1 { return cpu.0 < cpu.1 }
        let memory = (a.serverKiBPerConnection ?? .infinity, b.serverKiBPerConnection ?? .infinity)
        if memory.0 != memory.1 { return memory.0 < memory.1 }
        return a.backend < b.backend
    }

    static func range(_ entry: Entry) -> String {
        "\(time(entry.p99Range[0]))-\(time(entry.p99Range[1]))"
    }

    /// A latency in the unit that reads best: `834.6 us`, `1.25 ms`, `601.9 ms`, `4.15 s`.
    public static func time(_ nanoseconds: UInt64) -> String {
        switch nanoseconds {
        case ..<1_000_000: "\(microseconds(nanoseconds)) us"
        case ..<10_000_000: "\(fixed(Double(nanoseconds) / 1e6, 2)) ms"
        case ..<1_000_000_000: "\(fixed(Double(nanoseconds) / 1e6, 1)) ms"
        default: "\(fixed(Double(nanoseconds) / 1e9, 2)) s"
        }
    }

    static func costs(_ entry: Entry) -> String {
        let cpu = entry.cpuPerMessageMicroseconds.map { "\(fixed($0, 1)) us of CPU per message" } ?? "CPU not read"
        let memory = entry.serverKiBPerConnection.map { "\(fixed($0, 1)) KiB of server memory per connection" }
        return [cpu, memory].compactMap { $0 }.joined(separator: ", ")
    }

    /// The verdict as the report prints it: a line for the load, one per backend, and the choice.
    public var lines: [String] {
        VerdictChoice<Entry>.lines(
            header:
                "\(workload) over \(transport): \(workload.connections) connection(s) x \(Workload.number(workload.perSecond))/s = \(fixed(offeredPerSecond, 0)) messages/s of \(workload.size) B for \(Workload.number(workload.seconds)) s\(workload.bulk.map { ", beside \($0) bulk connection(s) to the same server" } ?? ""); held = answered >= \(Int(Self.minimumShare * 100))% of that, <= \(fixed(Self.maximumLossPercent, 0))% unanswered, p99 <= \(Self.time(p99Bound)) (latency from the intended send time; medians over repetitions)",
            entries: entries,
            figures: { entry in
                "p50 \(Self.time(entry.p50)) / p99 \(Self.time(entry.p99)) (\(Self.range(entry))) / p99.9 \(Self.time(entry.p999)), \(fixed(entry.achievedPerSecond, 0))/s answered, \(fixed(entry.lossPercent, 2))% lost, "
                    + Self.costs(entry)
            }, best: best, reason: reason)
    }
}
