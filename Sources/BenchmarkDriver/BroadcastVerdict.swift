/// A broadcast load: `clients` connected, one message to all of them `perSecond` times a second (the request form
/// of the WebSocket shootouts: an asker asks, the server sends to every client, then answers), for `seconds`
/// (`nil`: as long as the run's other round-trip scenarios measure). As a scenario it is named `broadcast-N`,
/// `broadcast-N-20/s`, `broadcast-N-20/s-10s`: the rate and the duration are written when they are not the
/// defaults, so the name says what ran.
public struct BroadcastLoad: Sendable, Hashable, Codable, CustomStringConvertible {
    public var clients: Int
    public var perSecond: Double
    public var seconds: Double?

    /// Broadcasts per second unless asked otherwise.
    public static let defaultPerSecond = 10.0
    /// The most clients one run may ask for (descriptors are the limit well before: the report says so).
    public static let maximumClients = 1_000_000

    public init(clients: Int, perSecond: Double = Self.defaultPerSecond, seconds: Double? = nil) {
        self.clients = clients
        self.perSecond = perSecond
        self.seconds = seconds
    }

    public var description: String {
        "broadcast-\(clients)"
            + (perSecond == Self.defaultPerSecond ? "" : "-\(Workload.number(perSecond))/s")
            + (seconds.map { "-\(Workload.number($0))s" } ?? "")
    }

    /// Broadcasts before the measured ones: half a second's worth, at least five.
    public var warmup: Int { max(5, Int(perSecond / 2)) }

    /// The broadcasts measured: `seconds`' worth, or `fallbackSeconds`' worth, at least 20.
    public func measured(fallbackSeconds: Double) -> Int {
        max(20, Int((seconds ?? fallbackSeconds) * perSecond))
    }

    /// Parses what follows `broadcast-`: `5000`, `5k`, `5000-20/s`, `5000-20/s-10s`.
    public init(name: String) throws(ScenarioError) {
        let parts = name.lowercased().split(separator: "-").map(String.init)
        let shape = "broadcast-CLIENTS[-RATE/s][-SECONDSs], e.g. broadcast-5000 or broadcast-5000-20/s-10s"
        guard (1...3).contains(parts.count), var text = parts.first else {
            throw ScenarioError(message: "'broadcast-\(name)': expected \(shape)")
        }
        var scale = 1
        if text.hasSuffix("k") {
            scale = 1000
            text.removeLast()
        }
        guard let clients = Int(text), clients > 0 else {
            throw ScenarioError(message: "'broadcast-\(name)': '\(parts[0])' is not a number of clients (\(shape))")
        }
        var load = BroadcastLoad(clients: clients * scale)
        for part in parts.dropFirst() {
            if part.hasSuffix("/s") || part.hasSuffix("/min"), let rate = Workload.rate(part) {
                load.perSecond = rate
            } else if let seconds = Workload.duration(part) {
                load.seconds = seconds
            } else {
                throw ScenarioError(
                    message: "'broadcast-\(name)': '\(part)' is neither a rate (20/s) nor a duration (10s)")
            }
        }
        self = try load.validated()
    }

    /// Checks what a run could not do.
    public func validated() throws(ScenarioError) -> BroadcastLoad {
        guard clients >= 1, clients <= Self.maximumClients else {
            throw ScenarioError(message: "a broadcast needs 1 to \(Self.maximumClients) clients")
        }
        guard perSecond >= 0.1, perSecond <= 1_000 else {
            throw ScenarioError(message: "a broadcast's rate must be 0.1/s to 1000/s")
        }
        if let seconds, !(seconds > 0 && seconds <= 600) {
            throw ScenarioError(message: "a broadcast's duration must be above 0 and at most 600 s")
        }
        return self
    }
}

/// Which backends held a ``BroadcastLoad`` and which is the best choice for it, from the run's own figures.
///
/// A backend *held* it when, in the median of its repetitions, every measured message reached every client once
/// and in order and the last client's receipt kept its 95th percentile (from the request's intended send time) at
/// or under the bound (250 ms unless asked: hashrocket's websocket-shootout measure). Among those that held it,
/// the lowest median p95 wins; when others cannot be told from it (p95 ranges over the repetitions that overlap,
/// or medians within 5%), the least server CPU per delivery among them decides. When none held it, the verdict
/// names the one that came closest (fewest missing deliveries, then the lowest p95).
public struct BroadcastVerdict: Sendable, Codable, Hashable {
    /// One backend's figures: medians over the repetitions, with the smallest and largest p95.
    public struct Entry: Sendable, Codable, Hashable, VerdictEntry {
        public var backend: String
        public var held: Bool
        /// Repetitions that held the load on their own.
        public var repetitionsHeld: Int
        public var repetitions: Int
        /// Why it did not hold (empty when it did).
        public var shortfalls: [String]
        /// The last client's receipt: p50, p95, p99 (nanoseconds), and the p95's smallest and largest.
        public var p50: UInt64
        public var p95: UInt64
        public var p99: UInt64
        public var p95Range: [UInt64]
        /// The first client's receipt, p50.
        public var firstP50: UInt64
        /// Deliveries that never came, and that came twice or out of order.
        public var missing: Int
        public var duplicatesOrLate: Int
        /// The server's CPU per delivery, microseconds.
        public var serverCPUPerDeliveryMicroseconds: Double?
    }

    public var load: BroadcastLoad
    public var transport: String
    /// The p95 of the last receipt a backend had to keep, nanoseconds.
    public var p95Bound: UInt64
    /// Held first, best first; then the rest, closest first.
    public var entries: [Entry]
    public var best: String?
    public var closest: String?
    /// Backends whose p95 cannot be told from the best's in this run.
    public var tiedOnP95: [String]
    public var reason: String

    public static let defaultBound: UInt64 = 250_000_000

    public init(
        load: BroadcastLoad, transport: String, p95Bound: UInt64,
        runs: [(backend: String, results: [ScenarioResult])]
    ) {
        self.load = load
        self.transport = transport
        self.p95Bound = p95Bound
        func mid<T: Comparable>(_ values: [T]) -> T { values.sorted()[values.count / 2] }
        func shortfalls(p95: UInt64, missing: Int, disordered: Int) -> [String] {
            var found: [String] = []
            if missing > 0 { found.append("\(missing) deliveries missing") }
            if disordered > 0 { found.append("\(disordered) deliveries twice or out of order") }
            if p95 > p95Bound {
                found.append(
                    "last receipt p95 \(WorkloadVerdict.time(p95)) over the \(WorkloadVerdict.time(p95Bound)) bound")
            }
            return found
        }
        func figures(_ result: ScenarioResult) -> (p95: UInt64, missing: Int, disordered: Int) {
            guard let b = result.broadcast else { return (.max, Int.max / 4, 0) }
            return (b.lastReceipt?.p95 ?? .max, b.missing, b.duplicates + b.outOfOrder)
        }
        var entries: [Entry] = []
        for (backend, results) in runs where !results.isEmpty {
            let each = results.map(figures)
            let p95s = each.map(\.p95)
            let (p95, missing, disordered) = (mid(p95s), mid(each.map(\.missing)), mid(each.map(\.disordered)))
            let why = shortfalls(p95: p95, missing: missing, disordered: disordered)
            let cpu = results.compactMap { result -> Double? in
                guard let server = result.server, result.messages > 0 else { return nil }
                return Double(server.cpuNanoseconds) / Double(result.messages) / 1000
            }
            entries.append(
                Entry(
                    backend: backend, held: why.isEmpty,
                    repetitionsHeld: each.filter {
                        shortfalls(p95: $0.p95, missing: $0.missing, disordered: $0.disordered).isEmpty
                    }
                    .count,
                    repetitions: results.count, shortfalls: why,
                    p50: mid(results.map { $0.broadcast?.lastReceipt?.p50 ?? .max }), p95: p95,
                    p99: mid(results.map { $0.broadcast?.lastReceipt?.p99 ?? .max }),
                    p95Range: [p95s.min()!, p95s.max()!],
                    firstP50: mid(results.map { $0.broadcast?.firstReceipt?.p50 ?? .max }), missing: missing,
                    duplicatesOrLate: disordered, serverCPUPerDeliveryMicroseconds: cpu.isEmpty ? nil : mid(cpu)))
        }
        func cheaper(_ a: Entry, _ b: Entry) -> Bool {
            let (x, y) = (
                a.serverCPUPerDeliveryMicroseconds ?? .infinity, b.serverCPUPerDeliveryMicroseconds ?? .infinity
            )
            return x != y ? x < y : a.backend < b.backend
        }
        func indistinguishable(_ a: Entry, _ b: Entry) -> Bool {
            let overlap = a.p95Range[0] <= b.p95Range[1] && b.p95Range[0] <= a.p95Range[1]
            let near = Double(max(a.p95, b.p95)) <= Double(min(a.p95, b.p95)) * (1 + WorkloadVerdict.resolution)
            return overlap || near
        }
        let held = entries.filter(\.held).sorted { ($0.p95, $0.backend) < ($1.p95, $1.backend) }
        let rest = entries.filter { !$0.held }.sorted {
            ($0.missing, $0.p95, $0.backend) < ($1.missing, $1.p95, $1.backend)
        }
        let t = WorkloadVerdict.time
        let choice = VerdictChoice(
            held: held, rest: rest, figure: \.p95, indistinguishable: indistinguishable,
            cheaper: cheaper,
            describe: {
                .init(
                    value: t($0.p95), range: "\(t($0.p95Range[0]))-\(t($0.p95Range[1]))", repetitions: $0.repetitions,
                    cost: Self.cost($0))
            }, lowest: "last-receipt p95", figure: "p95")
        self.entries = choice.entries
        best = choice.best
        closest = choice.closest
        tiedOnP95 = choice.tied
        reason = choice.reason
    }

    static func cost(_ entry: Entry) -> String {
        entry.serverCPUPerDeliveryMicroseconds.map { "\(fixed($0, 2)) us of server CPU per delivery" }
            ?? "server CPU not read"
    }

    /// The verdict as the report prints it: a line for the load, one per backend, and the choice.
    public var lines: [String] {
        let t = WorkloadVerdict.time
        return VerdictChoice<Entry>.lines(
            header:
                "\(load) over \(transport): \(load.clients) clients, one message to all of them \(Workload.number(load.perSecond)) times a second (asked for by one more client); held = every message reaches every client once and in order, the last client's receipt p95 <= \(t(p95Bound)) (from the request's intended send time; medians over repetitions)",
            entries: entries,
            figures: { entry in
                "last receipt p50 \(t(entry.p50)) / p95 \(t(entry.p95)) (\(t(entry.p95Range[0]))-\(t(entry.p95Range[1]))) / p99 \(t(entry.p99)), first p50 \(t(entry.firstP50)), \(Self.cost(entry))"
            }, best: best, reason: reason)
    }
}
