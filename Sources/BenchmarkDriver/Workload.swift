public import ConnectionCore

/// A user's own load, as they would describe it: `connections` clients, each sending `size`-byte messages
/// `perSecond` times a second (open loop: on a schedule, whatever the echoes do), for `seconds`. Every message
/// is echoed; its latency is measured as in `rate-PERSECOND` (from the intended and from the actual send time).
///
/// As a scenario it is named `workload-1000x10/s-200B-3s` (connections x rate per connection, size, duration),
/// so a report row says exactly what ran.
public struct Workload: Sendable, Hashable, Codable, CustomStringConvertible {
    public var connections: Int
    /// Messages per second on each connection.
    public var perSecond: Double
    /// Bytes per message (at least 8: each carries its sequence number).
    public var size: Int
    /// Measured seconds (after a quarter second of warm-up that is not recorded).
    public var seconds: Double
    /// Bulk connections to the same server beside the load (`bulk=K`), each carrying as much as it can, every
    /// byte echoed (``LoadedRunner``'s flows: 64 KiB writes, udp 1,400-byte datagrams); `nil`: none.
    public var bulk: Int?

    public init(connections: Int, perSecond: Double, size: Int = 64, seconds: Double = 3, bulk: Int? = nil) {
        self.connections = connections
        self.perSecond = perSecond
        self.size = size
        self.seconds = seconds
        self.bulk = bulk.flatMap { $0 > 0 ? $0 : nil }
    }

    /// Messages per second over all connections: what the server is offered.
    public var totalPerSecond: Double { Double(connections) * perSecond }

    /// The most messages one run may send (warm-up included): the run keeps three times for each.
    public static let maximumMessages = 20_000_000

    public var description: String {
        "workload-\(connections)x\(Self.number(perSecond))/s-\(size)B-\(Self.number(seconds))s"
            + (bulk.map { "-bulk\($0)" } ?? "")
    }

    /// `12`, `0.5`, `2.25`: a rate or duration as the name writes it.
    public static func number(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? "\(Int(value))" : fixed(value, 3).trimmingTrailingZeros()
    }

    /// Checks what a run could not do: too few bytes to carry a sequence number, no connections, no rate, a run
    /// of more messages than ``maximumMessages``.
    public func validated() throws(ScenarioError) -> Workload {
        guard connections >= 1 else { throw ScenarioError(message: "a workload needs at least one connection") }
        guard perSecond > 0, perSecond.isFinite else {
            throw ScenarioError(message: "a workload's rate must be above 0 messages per second")
        }
        guard totalPerSecond >= 1 else {
            throw ScenarioError(
                message:
                    "\(connections) connections at \(Self.number(perSecond))/s offer less than one message a second; raise the rate or the connections"
            )
        }
        guard size >= 8 else {
            throw ScenarioError(
                message: "a workload's messages need at least 8 bytes (each carries its sequence number)")
        }
        guard (bulk ?? 0) <= 1_000 else {
            throw ScenarioError(message: "at most 1,000 bulk connections beside a workload")
        }
        guard seconds > 0, seconds <= 600 else {
            throw ScenarioError(message: "a workload's duration must be above 0 and at most 600 s")
        }
        guard totalPerSecond * (seconds + 0.25) <= Double(Self.maximumMessages) else {
            throw ScenarioError(
                message:
                    "\(self) would send \(Int(totalPerSecond * (seconds + 0.25))) messages; at most \(Self.maximumMessages) per run (shorten the duration)"
            )
        }
        return self
    }

    /// Parses the scenario name's part after `workload-`: `1000x10/s-200B-3s`, `16x100/s-64B-3s-bulk4` (size and
    /// duration may be left out: 64 B, 3 s; bulk connections: none).
    public init(name: String) throws(ScenarioError) {
        let parts = name.split(separator: "-").map(String.init)
        let shape = "workload-CONNECTIONSxRATE/s[-SIZEB][-SECONDSs][-bulkK], e.g. workload-1000x10/s-200B-3s"
        guard (1...4).contains(parts.count) else { throw ScenarioError(message: "'\(name)': expected \(shape)") }
        let load = parts[0].lowercased().split(separator: "x", maxSplits: 1).map(String.init)
        guard load.count == 2, let connections = Int(load[0]), let rate = Self.rate(load[1]) else {
            throw ScenarioError(message: "'\(name)': expected \(shape)")
        }
        var size = 64
        var seconds = 3.0
        var bulk: Int?
        for part in parts.dropFirst() {
            let lower = part.lowercased()
            if lower.hasPrefix("bulk"), let value = Int(lower.dropFirst(4)), value > 0 {
                bulk = value
            } else if lower.hasSuffix("b"), let value = Self.size(String(lower.dropLast())) {
                size = value
            } else if let value = Self.duration(lower) {
                seconds = value
            } else {
                throw ScenarioError(message: "'\(name)': '\(part)' is neither a size (200B) nor a duration (3s)")
            }
        }
        self = try Workload(connections: connections, perSecond: rate, size: size, seconds: seconds, bulk: bulk)
            .validated()
    }

    /// `10/s`, `10`, `2k/s`, `600/min`.
    public static func rate(_ text: String) -> Double? {
        var text = text.lowercased()
        var per = 1.0
        if text.hasSuffix("/s") {
            text.removeLast(2)
        } else if text.hasSuffix("/min") {
            text.removeLast(4)
            per = 60
        }
        var scale = 1.0
        if text.hasSuffix("k") {
            text.removeLast()
            scale = 1000
        }
        guard let value = Double(text), value > 0, value.isFinite else { return nil }
        return value * scale / per
    }

    /// `200`, `1k` (KiB).
    static func size(_ text: String) -> Int? {
        var text = text.lowercased()
        var scale = 1
        if text.hasSuffix("k") {
            text.removeLast()
            scale = 1024
        }
        return Int(text).map { $0 * scale }
    }

    /// `3`, `3s`, `500ms`, `250us`, `1m`.
    public static func duration(_ text: String) -> Double? {
        var text = text.lowercased()
        var scale = 1.0
        if text.hasSuffix("ms") {
            text.removeLast(2)
            scale = 0.001
        } else if text.hasSuffix("us") {
            text.removeLast(2)
            scale = 0.000_001
        } else if text.hasSuffix("s") {
            text.removeLast()
        } else if text.hasSuffix("m") {
            text.removeLast()
            scale = 60
        }
        guard let value = Double(text), value > 0, value.isFinite else { return nil }
        return value * scale
    }

    /// What `sockbench compare --workload` takes:
    /// `connections=N,rate=R/s,size=S,transport=T[,duration=D][,p99=B][,bulk=K]`,
    /// keys in any order; `rate` is per connection (`total=R/s` gives the rate over all connections instead).
    /// The broadcast form, `broadcast=N[,rate=R/s][,duration=D][,transport=T][,p95=B]`: N clients, one message to
    /// all of them R times a second (10/s unless given), held when every message reaches every client and the last
    /// receipt's p95 stays within B (250 ms unless given).
    public struct Specification: Sendable, Hashable {
        /// The echoed load (`nil` for the broadcast form).
        public var workload: Workload?
        /// The broadcast form's load.
        public var broadcast: BroadcastLoad?
        /// The broadcast form's bound on the last receipt's p95, nanoseconds (`nil`: 250 ms).
        /// The transports to run it on (`nil`: the run's own choice).
        public var transport: Transport?
        /// The p99 (from the intended send time) a backend must keep to hold the load, nanoseconds (`nil`: the
        /// run's default).
        public var p99Bound: UInt64?
        public var p95Bound: UInt64?

        public init(parsing text: String) throws(ScenarioError) {
            var connections = 1
            var rate: Double?
            var total: Double?
            var size = 64
            var seconds = 3.0
            var transport: Transport?
            var bound: UInt64?
            var bulk: Int?
            var broadcastClients: Int?
            var p95: UInt64?
            var given: Set<String> = []
            let keys =
                "connections, rate (per connection), total, size, transport, duration, p99, bulk; or broadcast, rate, duration, transport, p95"
            for item in text.split(separator: ",") {
                let pair = item.split(separator: "=", maxSplits: 1).map {
                    String($0).trimmingCharacters(in: " ")
                }
                guard pair.count == 2, !pair[1].isEmpty else {
                    throw ScenarioError(message: "'\(item)': expected KEY=VALUE (\(keys))")
                }
                let (key, value) = (pair[0].lowercased(), pair[1])
                given.insert(key)
                func bad(_ example: String) -> ScenarioError {
                    ScenarioError(message: "\(key)=\(value): expected \(example)")
                }
                switch key {
                case "connections", "conns", "clients":
                    guard let number = Int(value), number > 0 else { throw bad("a positive number, e.g. 1000") }
                    connections = number
                case "rate":
                    guard let number = Workload.rate(value) else { throw bad("messages per second, e.g. 10/s") }
                    rate = number
                case "total":
                    guard let number = Workload.rate(value) else { throw bad("messages per second, e.g. 20000/s") }
                    total = number
                case "size":
                    let trimmed = value.lowercased().hasSuffix("b") ? String(value.dropLast()) : value
                    guard let number = Workload.size(trimmed), number > 0 else { throw bad("bytes, e.g. 200") }
                    size = number
                case "transport":
                    guard let chosen = Transport(rawValue: value.lowercased()) else {
                        throw bad("tcp, udp, ws, tls or wss")
                    }
                    transport = chosen
                case "duration", "seconds":
                    guard let number = Workload.duration(value) else { throw bad("a duration, e.g. 3s or 500ms") }
                    seconds = number
                case "bulk":
                    guard let number = Int(value), number >= 0 else {
                        throw bad("the bulk connections beside the load, e.g. 4")
                    }
                    bulk = number
                case "p99":
                    guard let number = Workload.duration(value) else {
                        throw bad("a latency, e.g. 1ms or 500us")
                    }
                    bound = UInt64(number * 1e9)
                case "broadcast":
                    let lower = value.lowercased()
                    let thousands = lower.hasSuffix("k")
                    guard let count = Int(thousands ? String(lower.dropLast()) : lower), count > 0 else {
                        throw bad("the clients a message goes to, e.g. 5000 or 5k")
                    }
                    broadcastClients = thousands ? count * 1000 : count
                case "p95":
                    guard let number = Workload.duration(value) else { throw bad("a latency, e.g. 250ms") }
                    p95 = UInt64(number * 1e9)
                default:
                    throw ScenarioError(message: "unknown workload key '\(key)' (\(keys))")
                }
            }
            if let broadcastClients {
                let foreign = given.subtracting(["broadcast", "rate", "duration", "seconds", "transport", "p95"])
                guard foreign.isEmpty else {
                    throw ScenarioError(
                        message:
                            "a broadcast workload takes broadcast, rate, duration, transport and p95, not \(foreign.sorted().joined(separator: ", ")) (its message is the market-data JSON, sent to every client)"
                    )
                }
                if let transport, transport != .tcp, transport != .ws {
                    throw ScenarioError(message: "a broadcast runs over tcp or ws, not \(transport)")
                }
                broadcast = try BroadcastLoad(
                    clients: broadcastClients, perSecond: rate ?? BroadcastLoad.defaultPerSecond,
                    seconds: given.contains("duration") || given.contains("seconds") ? seconds : nil
                ).validated()
                workload = nil
                self.transport = transport
                p99Bound = nil
                p95Bound = p95
                return
            }
            if p95 != nil { throw ScenarioError(message: "p95 bounds a broadcast workload (broadcast=N); use p99") }
            if rate != nil, total != nil {
                throw ScenarioError(message: "give rate (per connection) or total (over all connections), not both")
            }
            guard let perConnection = rate ?? total.map({ $0 / Double(connections) }) else {
                throw ScenarioError(message: "a workload needs rate=R/s (per connection) or total=R/s")
            }
            workload = try Workload(
                connections: connections, perSecond: perConnection, size: size, seconds: seconds, bulk: bulk
            ).validated()
            broadcast = nil
            self.transport = transport
            p99Bound = bound
            p95Bound = nil
        }
    }
}

extension String {
    fileprivate func trimmingTrailingZeros() -> String {
        guard contains(".") else { return self }
        var text = self
        while text.hasSuffix("0") { text.removeLast() }
        if text.hasSuffix(".") { text.removeLast() }
        return text
    }

    fileprivate func trimmingCharacters(in set: Character) -> String {
        var text = Substring(self)
        while text.first == set { text.removeFirst() }
        while text.last == set { text.removeLast() }
        return String(text)
    }
}
