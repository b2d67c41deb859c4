import BenchmarkDriver
import ConnectionCore
import SocketStyles

/// One kind of measurement `sockbench compare` runs, with everything that belongs to it in one file: its name and
/// how its parameters are written, the server it runs against, when it does not apply, how it measures, the figure
/// it is judged by, its line in the live progress, its table and chart, and its lines in "what this run says".
/// A value of the type is one scenario with its parameters (`pingpong-64` is `PingPongScenario(size: 64)`).
///
/// Adding one is its file and its line in ``Scenario/registered``: the parser, compare, the report files and the
/// docs' list of scenarios iterate that list.
protocol ScenarioKind: Sendable, Hashable {
    /// The name's first word (`pingpong` in `pingpong-64`), unique among the registered kinds.
    static var prefix: String { get }
    /// How its names are written, for the list of scenarios (`pingpong-SIZE`).
    static var usage: String { get }
    /// What it times, in a line (`sockbench compare --help` and docs/benchmarks.md list them).
    static var about: String { get }
    /// Parses what follows the prefix and its dash (`nil` for the bare prefix); `name` is the whole name, for the
    /// error.
    init(argument: String?, name: String) throws(ScenarioError)
    /// The whole name with its parameters: it parses back to the same value.
    var name: String { get }
    /// The connections it holds open at once, where it holds more than one.
    var connections: Int? { get }
    /// Closed-loop round trips counted per repetition (what `--count` or `--seconds` sets).
    var countsRoundTrips: Bool { get }
    /// The server it runs against (a kind of server every target starts when a planned scenario needs it).
    static var server: ServerRole { get }
    /// Whether it may run against an echo server on more threads (`@Nthreads`: fan-in and workloads, the loads
    /// that many connections make).
    static var takesServerThreads: Bool { get }
    /// The server of `target` it runs against, given the run's upstreams by role (`ServerRole/upstream`).
    func server(of target: Compare.Target, upstreams: [String: ChildServer]) -> any ServerHandle
    /// Why it does not apply to a target (the C floor's when `target.backend` is `nil`), or `nil`. `remote`: the
    /// servers run on another host (`--server`).
    func skipReason(_ target: Compare.Target, remote: Bool) -> String?
    /// One measurement.
    func measure(_ context: MeasureContext) async throws(ConnectionError) -> ScenarioResult
    /// The figure it is judged by (its spread across repetitions is the row's `spread`).
    func mainFigure(_ measurement: ScenarioResult) -> Double
    /// The main figure's name as `sockbench diff` prints it (`p50 us`, `MB/s`, ...).
    var mainFigureName: String { get }
    /// Whether the main figure is a p50 latency (which rankings and diffs read as the quiet p50 where every pass
    /// has one).
    var judgedByP50: Bool { get }
    /// Whether more of the main figure is better (bytes a second) rather than less (a latency).
    var higherIsBetter: Bool { get }
    /// The kind of load it stands for in the decision that ends `compare`'s output, in plain words (`nil`: not
    /// one a choice rests on, as the native styles and the proxy).
    var loadName: String? { get }
    /// Its line in the live progress.
    func brief(_ measurement: ScenarioResult) -> String
    /// Its table: the header and a row of cells per report row (`rows` are this scenario's).
    func table(_ report: Report, rows: [ReportRow]) -> (header: [String], cells: [[String]])
    /// Its chart in report.html, above its table.
    func chart(_ page: ReportHTML, rows: [ReportRow]) -> String
    /// Its lines in "what this run says", for the planned scenarios of this kind (in plan order).
    static func summary(_ report: Report, _ scenarios: [Self]) -> [String]
}

extension ScenarioKind {
    var connections: Int? { nil }
    var countsRoundTrips: Bool { false }
    static var server: ServerRole { .echo }
    static var takesServerThreads: Bool { false }

    func skipReason(_ target: Compare.Target, remote: Bool) -> String? {
        target.backend == nil ? Scenario.floorRuns : nil
    }

    func mainFigure(_ measurement: ScenarioResult) -> Double { Double(measurement.latency?.p50 ?? 0) }
    var mainFigureName: String { "p50 us" }
    var judgedByP50: Bool { true }
    var higherIsBetter: Bool { false }
    var loadName: String? { nil }

    func brief(_ m: ScenarioResult) -> String {
        "p50 \(microseconds(m.latency?.p50 ?? 0)) us, p99 \(microseconds(m.latency?.p99 ?? 0)) us, \(Int(m.messagesPerSecond ?? 0)) rt/s"
            + (m.serverKiBPerConnection.map { ", server \(fixed($0, 1)) KiB/connection" } ?? "")
    }

    func table(_ report: Report, rows: [ReportRow]) -> (header: [String], cells: [[String]]) {
        report.roundTripTable(rows)
    }

    func chart(_ page: ReportHTML, rows: [ReportRow]) -> String { page.latencyBars(rows) }

    static func summary(_ report: Report, _ scenarios: [Self]) -> [String] { [] }

    /// Its role's server, else the echo server (the C floor's rows run their direct path against it).
    func server(of target: Compare.Target, upstreams: [String: ChildServer]) -> any ServerHandle {
        target.servers[Self.server.mode] ?? target.echo
    }
}

/// A scenario `sockbench compare` runs, by name: one of the registered kinds with its parameters. Parameters are
/// part of the name, so a report row says exactly what was measured; two scenarios are the same when their names
/// are.
struct Scenario: Sendable, Hashable, Codable, CustomStringConvertible {
    /// Every kind, in the order the report's "what this run says" speaks of them. One line per kind.
    static let registered: [any ScenarioKind.Type] = [
        WorkloadScenario.self,
        RateScenario.self,
        PingPongScenario.self,
        NativeScenario.self,
        AsyncChannelScenario.self,
        ProxyScenario.self,
        ProxyPumpScenario.self,
        PumpScenario.self,
        ConnectScenario.self,
        FaninScenario.self,
        JSONScenario.self,
        LoadedScenario.self,
        BroadcastScenario.self,
    ]

    /// The kind with its parameters.
    let kind: any ScenarioKind
    /// The threads its server runs on (`sockbench serve --threads N`, unpinned, so that they may span every CPU),
    /// written `@Nthreads` after the name (`fanin-1000@2threads`); `nil`: the target's own server, one thread,
    /// placed as the run's `--placement` says. Only the kinds that take it (``ScenarioKind/takesServerThreads``).
    let serverThreads: Int?

    init(_ kind: some ScenarioKind, serverThreads: Int? = nil) {
        self.kind = kind
        self.serverThreads = serverThreads
    }

    /// The same scenario with its server on `threads` threads.
    func onServerThreads(_ threads: Int) -> Scenario { Scenario(kind: kind, serverThreads: threads) }

    private init(kind: any ScenarioKind, serverThreads: Int?) {
        self.kind = kind
        self.serverThreads = serverThreads
    }

    /// Parses `pingpong-64`, `rate-10000`, `pump-65536`, `connect`, `fanin-100`, `fanin-1000@2threads`, ... (sizes
    /// may end in `k`, for KiB, or `m`, for MiB; rates and counts in `k`, for thousands).
    init(name: String) throws(ScenarioError) {
        var name = name
        var threads: Int?
        if let at = name.lastIndex(of: "@") {
            let suffix = name[name.index(after: at)...].lowercased()
            let digits = suffix.prefix(while: \.isNumber)
            guard let count = Int(digits), count >= 1, ["thread", "threads"].contains(suffix.dropFirst(digits.count))
            else {
                throw ScenarioError(
                    message: "'\(name)': after '@', the server's threads, e.g. fanin-1000@2threads")
            }
            threads = count
            name = String(name[..<at])
        }
        let base = try Scenario(baseName: name)
        guard threads == nil || type(of: base.kind).takesServerThreads else {
            throw ScenarioError(
                message:
                    "'\(name)@...': only fanin and workload scenarios run against a server on more threads")
        }
        self.init(kind: base.kind, serverThreads: threads)
    }

    private init(baseName name: String) throws(ScenarioError) {
        let parts = name.lowercased().split(separator: "-", maxSplits: 1).map(String.init)
        guard let prefix = parts.first, let type = Self.registered.first(where: { $0.prefix == prefix }) else {
            // A closure, not the key path `\.usage`: a key path to a static member through an existential metatype
            // crashes Swift 6.3.1's SILGen.
            let usages = Self.registered.map { $0.usage }
            throw ScenarioError(message: "unknown scenario '\(name)' (\(usages.joined(separator: ", ")))")
        }
        kind = try type.init(argument: parts.count > 1 ? parts[1] : nil, name: name)
        serverThreads = nil
    }

    var description: String { kind.name + (serverThreads.map { "@\($0)thread\($0 == 1 ? "" : "s")" } ?? "") }

    /// The name without its server's threads (`fanin-1000` for `fanin-1000@2threads`).
    var baseName: String { kind.name }

    /// The kind's parameters when it is a `type`.
    func `as`<Kind: ScenarioKind>(_ type: Kind.Type) -> Kind? { kind as? Kind }

    /// Whether the kind is a `type`.
    func `is`(_ type: (some ScenarioKind).Type) -> Bool { Swift.type(of: kind) == type }

    var connections: Int? { kind.connections }
    var countsRoundTrips: Bool { kind.countsRoundTrips }
    var server: ServerRole { serverThreads.map(ServerRole.echo(threads:)) ?? Swift.type(of: kind).server }

    /// The server of `target` it runs against.
    func server(of target: Compare.Target, upstreams: [String: ChildServer]) -> any ServerHandle {
        guard serverThreads != nil else { return kind.server(of: target, upstreams: upstreams) }
        return target.servers[server.mode] ?? target.echo
    }

    /// Why it does not apply to a target, or `nil`.
    func skipReason(_ target: Compare.Target, remote: Bool) -> String? {
        if serverThreads != nil, remote { return "@Nthreads scenarios start their servers here, not on an agent" }
        return kind.skipReason(target, remote: remote)
    }

    static func == (lhs: Scenario, rhs: Scenario) -> Bool { lhs.description == rhs.description }
    func hash(into hasher: inout Hasher) { hasher.combine(description) }

    init(from decoder: any Decoder) throws {
        self = try Scenario(name: try decoder.singleValueContainer().decode(String.self))
    }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(description)
    }

    /// What the C floor runs: the direct paths, one connection each.
    static let floorRuns =
        "the C floor runs pingpong, native, rate, pump, proxy and proxypump (the direct paths) only; its open-loop client drives one connection"

    /// A number after a scenario's dash: `64`, `1k` (`kilo` of them), `1m` (`kilo` x `kilo`); `fallback` when the
    /// name has none (`nil`: it must).
    static func number(
        _ argument: String?, _ fallback: String?, kilo: Int, name: String
    ) throws(ScenarioError)
        -> Int
    {
        guard var text = argument ?? fallback, !text.isEmpty else {
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
}

/// A kind of server a target runs, started once per backend x transport when a planned scenario needs it: the
/// echo server every target has, a sink, a backend's own-style server, a relay.
struct ServerRole: Sendable {
    /// Its name, `sockbench serve`'s mode (`echo`, `sink`, `native`, ...): the key of a target's servers.
    let mode: String
    /// A process the servers of this role front, started once per run here (a relay's upstream), or `nil`.
    let upstream: (@Sendable (Compare.Plan) throws -> ChildServer?)?
    /// Starts the server of one backend x transport (`nil`: the target has none of this role), given the
    /// upstream when there is one.
    let start: @Sendable (ServerStart) async throws -> (any ServerHandle)?

    init(
        mode: String, upstream: (@Sendable (Compare.Plan) throws -> ChildServer?)? = nil,
        start: @escaping @Sendable (ServerStart) async throws -> (any ServerHandle)?
    ) {
        self.mode = mode
        self.upstream = upstream
        self.start = start
    }

    /// The echo server every target has (`sockbench serve URL`).
    static let echo = ServerRole(mode: "echo") { try await $0.serve("echo") }
    /// An echo server on `threads` loops (`sockbench serve URL --threads N`), not pinned to a CPU, so that its
    /// threads may span every CPU; with 1, the same unpinned server on one thread, to set the others against.
    static func echo(threads: Int) -> ServerRole {
        ServerRole(mode: "echo@\(threads)threads") { start in
            try await start.serve("echo", ["--threads", "\(threads)"], pinned: false)
        }
    }
    /// A sink that counts what it receives (`sockbench serve URL --sink`).
    static let sink = ServerRole(mode: "sink") { try await $0.serve("sink") }
}

/// What a role needs to start one target's server.
struct ServerStart {
    let backend: Backend?
    let transport: Transport
    let plan: Compare.Plan
    /// The role's upstream when it has one and the servers run here (`nil` with `--server`).
    let upstream: ChildServer?
    /// Starts `sockbench serve` in a mode, with more arguments (here: an agent starts the mode alone): a child
    /// process here, or one the agent starts there.
    /// `pinned`: on the run's server CPU, when the placement names one.
    let serve: (String, [String], Bool) async throws -> any ServerHandle

    /// `serve` with no more arguments.
    func serve(_ mode: String) async throws -> any ServerHandle { try await serve(mode, [], true) }

    /// `serve` with more arguments, pinned where the placement says.
    func serve(_ mode: String, _ arguments: [String], pinned: Bool = true) async throws -> any ServerHandle {
        try await serve(mode, arguments, pinned)
    }
}

/// What a scenario's measurement is given: the target, the server it runs against, the plan, the client's TLS,
/// the round trips calibrated for its row, and the measured window's edges (``Compare/measureWatched``).
struct MeasureContext {
    let target: Compare.Target
    let server: any ServerHandle
    let plan: Compare.Plan
    let tls: TLSConfiguration
    let roundTrips: Int
    /// Marks where the measured window starts, where a scenario sets up first (a workload opens its connections).
    let startWindow: () async -> Void
    /// Marks where it ends, before the connection closes where the scenario allows (a bsd server's reader thread,
    /// and its counts, end with the connection).
    let endWindow: () async -> Void

    var endpoint: Endpoint { server.endpoint }

    /// A connection of the target's backend to the server (the C floor has none: its scenarios run C clients).
    func connect() async throws(ConnectionError) -> any Connection {
        guard let backend = target.backend else {
            throw ConnectionError(.unsupported, "the C floor connects with its own C clients")
        }
        return try await backend.connect(to: endpoint, tls: tls)
    }

    /// `connect` as a value, for the runners that open connections themselves.
    var connector: @Sendable () async throws(ConnectionError) -> any Connection {
        let (backend, endpoint, tls) = (target.backend, endpoint, tls)
        return { () async throws(ConnectionError) -> any Connection in
            guard let backend else {
                throw ConnectionError(.unsupported, "the C floor connects with its own C clients")
            }
            return try await backend.connect(to: endpoint, tls: tls)
        }
    }

    /// The C floor's ping-pong client against the server (the C floor's rows, and the relays' rows: the C client
    /// through the relay to the C echo server).
    func floorPing(size: Int) async throws(ConnectionError) -> ScenarioResult {
        let result = try await runFloorPing(
            endpoint: endpoint, size: size, count: roundTrips, warmup: plan.pingpongWarmup)
        return Compare.measurement(result, size: size, count: roundTrips)
    }

    /// The C floor's pump to the server's sink, as ``Compare/pump(plan:size:pass:)`` sizes its passes.
    func floorPump(size: Int) async throws(ConnectionError) -> ScenarioResult {
        let endpoint = endpoint
        return try await Compare.pump(plan: plan, size: size) { bytes throws(ConnectionError) in
            try await runFloorPump(endpoint: endpoint, size: size, totalBytes: bytes)
        }
    }
}
