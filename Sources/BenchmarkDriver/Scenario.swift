/// The scenarios `sockbench compare` runs, by name; parameters are part of the name so a report row says
/// exactly what was measured.
///
/// | name | what is timed |
/// |---|---|
/// | `pingpong-SIZE` | closed-loop round trips of SIZE bytes: send, wait for the whole echo, repeat |
/// | `native-SIZE` | the same round trips over TCP, written in each backend's own style on both ends (blocking loop, libuv callbacks, stream delegates, async socket calls, NIO handlers) instead of through `Connection` |
/// | `asyncchannel-SIZE` | nio only: the same tcp round trips written with SwiftNIO's async/await bridge (`NIOAsyncChannel`) on both ends, as its documentation shows |
/// | `proxy-SIZE` | the `pingpong-SIZE` round trips of the C client to the C echo server through one tcp relay hop written in the backend's own style; the C floor's row is the direct path |
/// | `proxypump-SIZE` | the `pump-SIZE` bulk transfer of the C client to the C sink through the same relay hop; the C floor's row is the direct path |
/// | `rate-PERSECOND` | open loop: 64-byte messages sent on a fixed schedule; latency from the intended send time (coordinated omission corrected) and from the actual one |
/// | `pump-SIZE` | one-way bulk in SIZE-byte writes to a sink; for UDP, datagrams sent and received, loss, reordering, kernel drops |
/// | `connect` | connections opened one after another: handshake time (TCP, + TLS, + WebSocket upgrade) and connections per second |
/// | `fanin-N` | N connections at once against one server, each in closed-loop 64-byte round trips |
/// | `workload-NxRATE/s-SIZEB-SECONDSs` | a user's own load: N connections, each sending SIZE-byte messages RATE times a second on a schedule for SECONDS, every message echoed; latency as in `rate`, plus memory per connection and CPU per message (``Workload``) |
/// | `json`, `json-deflate` | ws/wss only: closed-loop round trips of market-data JSON text (about 1.1 KB), without and with permessage-deflate; bytes on the wire per message |
public enum Scenario: Sendable, Hashable, Codable, CustomStringConvertible {
    case pingpong(size: Int)
    case native(size: Int)
    /// nio over tcp: the ping-pong written with SwiftNIO's `NIOAsyncChannel` on both ends.
    case asyncChannel(size: Int)
    /// The tcp ping-pong through one relay hop written in the backend's own style (`sockbench proxy --native`),
    /// from the C client to the C echo server; the C floor's row is the same path without the hop.
    case proxy(size: Int)
    /// The tcp pump (C client to C sink) through one relay hop written in the backend's own style; the C floor's
    /// row is the same path without the hop.
    case proxyPump(size: Int)
    case rate(perSecond: Int)
    case pump(size: Int)
    case connect
    case fanin(connections: Int)
    /// ws/wss: round trips of ``MarketData`` JSON text, with or without permessage-deflate.
    case json(deflate: Bool)
    /// Open loop over many connections: a user's own load (``Workload``).
    case workload(Workload)

    /// Parses `pingpong-64`, `rate-10000`, `pump-65536`, `connect`, `fanin-100` (sizes may end in `k`, for
    /// KiB, or `m`, for MiB; rates in `k`, for thousands).
    public init(name: String) throws(ScenarioError) {
        let parts = name.lowercased().split(separator: "-", maxSplits: 1).map(String.init)
        func number(_ text: String?, kilo: Int) throws(ScenarioError) -> Int {
            guard var text, !text.isEmpty else {
                throw ScenarioError(message: "'\(name)' needs a number, e.g. pingpong-64")
            }
            var scale = 1
            if text.hasSuffix("k") {
                scale = kilo
                text.removeLast()
            } else if text.hasSuffix("m") {
                scale = kilo * kilo
                text.removeLast()
            }
            guard let value = Int(text), value > 0 else {
                throw ScenarioError(message: "'\(name)': '\(text)' is not a positive number")
            }
            return value * scale
        }
        switch parts[0] {
        case "pingpong": self = .pingpong(size: try number(parts.count > 1 ? parts[1] : "64", kilo: 1024))
        case "native": self = .native(size: try number(parts.count > 1 ? parts[1] : "64", kilo: 1024))
        case "asyncchannel": self = .asyncChannel(size: try number(parts.count > 1 ? parts[1] : "64", kilo: 1024))
        case "proxy": self = .proxy(size: try number(parts.count > 1 ? parts[1] : "64", kilo: 1024))
        case "proxypump": self = .proxyPump(size: try number(parts.count > 1 ? parts[1] : "64k", kilo: 1024))
        case "rate": self = .rate(perSecond: try number(parts.count > 1 ? parts[1] : nil, kilo: 1000))
        case "pump": self = .pump(size: try number(parts.count > 1 ? parts[1] : "64k", kilo: 1024))
        case "connect": self = .connect
        case "fanin": self = .fanin(connections: try number(parts.count > 1 ? parts[1] : nil, kilo: 1000))
        case "json" where parts.count == 1: self = .json(deflate: false)
        case "json" where parts[1] == "deflate": self = .json(deflate: true)
        case "workload" where parts.count > 1: self = .workload(try Workload(name: parts[1]))
        default:
            throw ScenarioError(
                message:
                    "unknown scenario '\(name)' (pingpong-SIZE, native-SIZE, asyncchannel-SIZE, proxy-SIZE, proxypump-SIZE, rate-PERSECOND, pump-SIZE, connect, fanin-N, json, json-deflate, workload-NxRATE/s-SIZEB-SECONDSs)"
            )
        }
    }

    public var description: String {
        switch self {
        case .pingpong(let size): "pingpong-\(size)"
        case .native(let size): "native-\(size)"
        case .asyncChannel(let size): "asyncchannel-\(size)"
        case .proxy(let size): "proxy-\(size)"
        case .proxyPump(let size): "proxypump-\(size)"
        case .rate(let perSecond): "rate-\(perSecond)"
        case .pump(let size): "pump-\(size)"
        case .connect: "connect"
        case .fanin(let connections): "fanin-\(connections)"
        case .json(let deflate): deflate ? "json-deflate" : "json"
        case .workload(let workload): workload.description
        }
    }

    /// What a scenario does, without its parameters; the raw value is the name's prefix (`asyncchannel-64`).
    public enum Kind: String, Sendable, CaseIterable {
        case pingpong, native, proxy, rate, pump, connect, fanin, json, workload
        case asyncChannel = "asyncchannel"
        case proxyPump = "proxypump"
    }

    /// The kind without parameters, to switch on (the report and compare branch on it, never on a string).
    public var kind: Kind {
        switch self {
        case .pingpong: .pingpong
        case .native: .native
        case .asyncChannel: .asyncChannel
        case .proxy: .proxy
        case .proxyPump: .proxyPump
        case .rate: .rate
        case .pump: .pump
        case .connect: .connect
        case .fanin: .fanin
        case .json: .json
        case .workload: .workload
        }
    }

    /// The connections a scenario holds open at once, where it holds more than one (fan-in, workloads).
    public var connections: Int? {
        switch self {
        case .fanin(let connections): connections
        case .workload(let workload): workload.connections
        default: nil
        }
    }

    /// Closed-loop round trips counted per repetition (what `--count` or `--seconds` sets).
    public var countsRoundTrips: Bool {
        switch self {
        case .pingpong, .native, .asyncChannel, .proxy, .json: true
        default: false
        }
    }

    public init(from decoder: any Decoder) throws {
        let name = try decoder.singleValueContainer().decode(String.self)
        self = try Scenario(name: name)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(description)
    }
}

/// A scenario name that cannot be parsed.
public struct ScenarioError: Error, CustomStringConvertible {
    public let message: String
    public var description: String { message }
}

/// What one run of one scenario measured. Fields a scenario does not produce are `nil`.
public struct ScenarioResult: Sendable, Codable {
    /// Latency, nanoseconds: round trips (pingpong, fanin), from the intended send time (rate), handshakes
    /// (connect).
    public var latency: LatencySummary?
    /// rate only: latency from the actual send time (what a closed-loop tool would report).
    public var uncorrectedLatency: LatencySummary?
    /// Messages (round trips, datagrams, connections) per second.
    public var messagesPerSecond: Double?
    /// Payload bytes per second delivered (pump), or echoed both ways (pingpong, fanin: one direction counted).
    public var bytesPerSecond: Double?
    /// Messages counted (round trips, datagrams sent, connections).
    public var messages: Int = 0
    /// UDP: datagrams lost (pingpong: re-sent probes; pump and rate: sent but never received).
    public var lost: Int?
    /// UDP pump: datagrams the sink received.
    public var received: Int?
    /// UDP pump: datagrams that arrived after a later one.
    public var reordered: Int?
    /// UDP pump: the kernel's RcvbufErrors delta during the run (system-wide).
    public var kernelReceiveBufferDrops: Int?
    /// json: the average message, bytes, and what it took on the wire from the client (frame payloads: after
    /// permessage-deflate, frame headers not counted).
    public var messageBytes: Double?
    public var wireBytes: Double?
    /// fanin: how much the server's resident memory (VmRSS) grew per connection, KiB, between before the
    /// connections were opened and when all of them were open and had made one round trip, before the measured
    /// window (so: memory per open, idle connection).
    public var serverKiBPerConnection: Double?
    /// fanin: the same for the client (the load generator).
    public var clientKiBPerConnection: Double?
    /// fanin and workload: whether every connection got its share (``Fairness``).
    public var fairness: Fairness?
    /// Wall-clock time of the measured window, nanoseconds.
    public var elapsedNanoseconds: UInt64 = 0
    /// The client process during the window (peak memory: so far).
    public var client: ResourceUsage?
    /// The server process during the window (peak memory: so far).
    public var server: ResourceUsage?
    /// What else used the measured CPUs during the window (`nil` where /proc/stat could not be read).
    public var cpuShare: CPUShare?
    /// A re-measured pass's result: the foreign share of the disturbed pass it replaced (`nil`: measured once).
    public var replacedForeignShare: Double?
    /// UDP pump: datagrams the sink received per second of the send window (goodput; what iperf3 reports as the
    /// receiver's rate).
    public var receivedPerSecond: Double?
    /// Closed-loop round trips: the median round trip in the run's quiet stretches (``QuietP50``), nanoseconds;
    /// open-loop (rate) rows: the median latency from the actual send time in theirs (stretches of 20 ms of
    /// messages). What the report's ratios compare.
    public var quietP50: UInt64?
    /// rate: the CPU time the sender's clock spent waiting for send times (all of it while spinning), part of the
    /// client's CPU time and left out of ``cpuPerMessageNanoseconds``: it is the load generator's, not the cost of
    /// a message.
    public var pacingCPUNanoseconds: UInt64?

    public init() {}

    /// CPU time of both sides per message, nanoseconds (the cost of a message; a rate sender's waiting left out).
    public var cpuPerMessageNanoseconds: Double? {
        guard messages > 0, let client, let server else { return nil }
        let spent = client.cpuNanoseconds + server.cpuNanoseconds
        return Double(spent - min(spent, pacingCPUNanoseconds ?? 0)) / Double(messages)
    }
}
