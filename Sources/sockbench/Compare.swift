import ArgumentParser
import BenchmarkDriver
import ConnectionCore
import ConnectionTestKit
import Foundation
import Histogram
import NativeStyles
import POSIXSupport
import SocketStyles
import Synchronization

struct Compare: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Every backend x transport x scenario, side by side, against SwiftNIO and the C floor, in one run.",
        discussion: """
            Starts one server process per backend x transport (an echo server, and a sink for pump scenarios), \
            then runs each scenario against each, backends interleaved and the order rotated, --repetitions \
            times, and reports the median with the spread. Client and server are pinned (--placement). \
            Scenarios: pingpong-SIZE, rate-PERSECOND, pump-SIZE, connect, fanin-N (docs/benchmarks.md says what \
            each times). The quick default takes about three minutes; --full goes deep.
            """
    )

    @Option(help: "Comma-separated backends, or `all` (bsd, uv, runloop, async, nio).")
    var backends: String = "all"

    @Option(help: "Comma-separated transports: tcp, udp, ws, tls, wss.")
    var transports: String?

    @Option(
        help:
            "Comma-separated scenarios (default: pingpong-64,native-64,asyncchannel-64,rate-5000,pump-64k,pump-1400,connect,fanin-16)."
    )
    var scenarios: String?

    @Option(help: "pingpong: measured round trips per repetition (fixed; default: as many as --seconds takes).")
    var count: Int?

    @Option(
        help:
            "pingpong: seconds of round trips per repetition; the count is calibrated once per row (default 0.25, --full 1)."
    )
    var seconds: Double?

    @Option(help: "pingpong: interleaved slices each repetition's seconds are measured in (default 5).")
    var slices: Int = 5

    @Option(
        help:
            "Rounds of measuring again the passes taken while something else used the measured CPUs (0: only name them)."
    )
    var remeasure: Int = 2

    @Option(help: "pingpong: round trips before measuring, per repetition.")
    var warmup: Int = 500

    @Option(help: "Repetitions (backends interleaved in each).")
    var repetitions: Int?

    @Option(help: "CPU placement: `same` (client and server on one CPU), `cross` (different CPUs) or `none`.")
    var placement: Placement = .same

    @Option(help: "Write results.json, results.csv, report.md and report.html to this directory.")
    var out: String?

    @Flag(inversion: .prefixedNo, help: "Also run the C floor (blocking C ping-pong against a C echo server).")
    var floor = true

    @Flag(inversion: .prefixedNo, help: "Also run iperf3 and sockperf when installed, as rows of the same report.")
    var baselines = true

    @Option(
        help:
            "Run the servers on another host: HOST:PORT of a `sockbench serve --agent tcp://HOST:PORT` there. Servers are then pinned by the agent's --cpu; iperf3 and sockperf rows are left out."
    )
    var server: String?

    @Flag(help: "Go deep: more sizes, rates, fan-in up to 1,000 connections, tls and wss, 5 repetitions.")
    var full = false

    enum Placement: String, ExpressibleByArgument, Codable {
        case same, cross, none
    }

    /// The knobs a run uses, resolved from the flags (recorded in results.json).
    struct Plan: Codable {
        var backends: [String]
        var transports: [String]
        var scenarios: [Scenario]
        var repetitions: Int
        /// Round trips per repetition when fixed (--count), and of each row's calibration run otherwise.
        var pingpongCount: Int
        /// Seconds of round trips per repetition (the count calibrated per row), `nil` when --count fixes it.
        var pingpongSeconds: Double?
        /// Round-trip scenarios: the passes over every target each repetition is measured in (1 with --count).
        var slices = 1
        /// Rounds of measuring disturbed passes again (`nil` in reports made before there was a choice).
        var remeasure: Int?
        var pingpongWarmup: Int
        var rateSeconds: Double
        var pumpBytes: Int
        var connectCount: Int
        var faninCount: Int
        var placement: Placement
        var serverCPU: Int?
        var clientCPU: Int?
        var tcpNoDelay = true
        var options: String
        /// Where the servers ran: `local` (child processes here) or the agent's HOST:PORT.
        var servers = "local"

        /// fanin-N: `faninCount` round trips per connection up to 1,000 connections; beyond, `faninCount` x 1,000
        /// in all (at least 10 per connection), so that fanin-10000 takes seconds, not minutes.
        func faninRoundTrips(connections: Int) -> Int {
            connections <= 1000 ? faninCount : max(10, faninCount * 1000 / connections)
        }
    }

    func makePlan() throws -> Plan {
        let chosenBackends: [Backend]
        do throws(ConnectionError) {
            chosenBackends =
                backends == "all"
                ? Backend.allCases
                : try backends.split(separator: ",").map { name throws(ConnectionError) in
                    try Backend(name: String(name))
                }
        } catch {
            throw fail(error.detail)
        }
        var chosenTransports: [Transport] = []
        for name in (transports ?? (full ? "tcp,udp,ws,tls,wss" : "tcp,udp,ws")).split(separator: ",") {
            guard let transport = Transport(rawValue: String(name)) else {
                throw fail("unknown transport '\(name)' (tcp, udp, ws, tls, wss)")
            }
            chosenTransports.append(transport)
        }
        let defaultScenarios =
            full
            ? "pingpong-64,native-64,asyncchannel-64,proxy-64,proxypump-64k,pingpong-1k,pingpong-64k,rate-10k,rate-50k,pump-1400,pump-64k,connect,fanin-1,fanin-10,fanin-100,fanin-1000,json,json-deflate"
            : "pingpong-64,native-64,asyncchannel-64,rate-5000,pump-64k,pump-1400,connect,fanin-16"
        var chosenScenarios: [Scenario] = []
        for name in (scenarios ?? defaultScenarios).split(separator: ",") {
            do throws(ScenarioError) {
                chosenScenarios.append(try Scenario(name: String(name)))
            } catch {
                throw fail(error.message)
            }
        }
        let (serverCPU, clientCPU): (Int?, Int?) =
            switch placement {
            case .same: (Syscall.cpuCount - 1, Syscall.cpuCount - 1)
            case .cross: (0, min(1, Syscall.cpuCount - 1))
            case .none: (nil, nil)
            }
        let defaults = ConnectionOptions()
        return Plan(
            backends: chosenBackends.map(\.rawValue), transports: chosenTransports.map(\.rawValue),
            scenarios: chosenScenarios, repetitions: repetitions ?? (full ? 5 : 3),
            pingpongCount: count ?? 2_000, pingpongSeconds: count == nil ? (seconds ?? (full ? 1 : 0.25)) : nil,
            slices: count == nil ? max(1, slices) : 1, remeasure: max(0, remeasure), pingpongWarmup: warmup,
            rateSeconds: full ? 2 : 0.5,
            pumpBytes: full ? 1024 << 20 : 256 << 20, connectCount: full ? 200 : 30, faninCount: full ? 500 : 100,
            placement: placement, serverCPU: serverCPU, clientCPU: clientCPU,
            options:
                "TCP_NODELAY on; SO_RCVBUF/SO_SNDBUF system defaults; read chunk \(defaults.readChunkSize) B; UDP buffer \(defaults.maxDatagramSize) B; receive queue \(defaults.receiveQueueLimit) B; TLS \(TLSLibrary.version), TLS 1.3, certificate verified against a throwaway CA"
        )
    }

    /// Raises this process's descriptor limit (RLIMIT_NOFILE, which the server processes inherit) so that each
    /// can hold `connections` connections and a thousand descriptors more, when it is lower; returns what it did,
    /// or `nil` when nothing was needed. bsd uses two per connection (the socket and its reader thread's
    /// eventfd), the others one. Past the hard limit only a process with CAP_SYS_RESOURCE may go: otherwise the
    /// limit goes as far as the hard limit, rows that need more are skipped with the reason, and when even one
    /// per connection does not fit, the error says how to raise it.
    static func raiseDescriptorLimit(toHold connections: Int) throws -> String? {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return nil }
        let wanted = rlim_t(descriptors(for: connections, backend: .bsd))
        guard limit.rlim_cur < wanted else { return nil }
        let before = limit.rlim_cur
        var raised = limit
        raised.rlim_cur = wanted
        raised.rlim_max = max(limit.rlim_max, wanted)
        if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) != 0 {
            raised = limit
            raised.rlim_cur = limit.rlim_max
            let needed = rlim_t(descriptors(for: connections, backend: .uv))
            guard limit.rlim_max >= needed, setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) == 0 else {
                throw fail(
                    "fanin-\(connections) needs \(needed) descriptors in each process (bsd \(wanted)), and the limit is \(before) (hard \(limit.rlim_max)); raise it (`ulimit -n \(wanted)`, as root for more than the hard limit) or run fewer connections"
                )
            }
        }
        guard raised.rlim_cur > before else {
            return
                "descriptor limit \(before) is the hard limit; fanin-\(connections) on bsd would need \(wanted) (rows that need more are skipped)"
        }
        return
            "descriptor limit raised from \(before) to \(raised.rlim_cur) for fanin-\(connections) (RLIMIT_NOFILE, inherited by the servers)"
    }

    /// Descriptors a client or server process needs for `connections` of `backend`, with room for the rest.
    static func descriptors(for connections: Int, backend: Backend) -> Int {
        connections * (backend == .bsd ? 2 : 1) + 1024
    }

    /// One server process (and its sink, for pump) per backend x transport.
    struct Target {
        var backend: Backend?
        var transport: Transport
        var echo: any ServerHandle
        var sink: (any ServerHandle)?
        /// The backend's own-style echo server (tcp, for native-SIZE).
        var native: (any ServerHandle)?
        /// nio's NIOAsyncChannel echo server (tcp, for asyncchannel-SIZE).
        var asyncChannel: (any ServerHandle)?
        /// The backend's own-style relay in front of the C echo server (tcp, for proxy-SIZE).
        var proxy: (any ServerHandle)?
        /// The backend's own-style relay in front of the C sink (tcp, for proxypump-SIZE).
        var proxyPump: (any ServerHandle)?
        var name: String { "\(backend?.rawValue ?? Report.floorName)/\(transport)" }
    }

    func run() async throws {
        var plan = try makePlan()
        let mostConnections = plan.scenarios.compactMap { if case .fanin(let n) = $0 { n } else { nil } }.max() ?? 0
        if let note = try Self.raiseDescriptorLimit(toHold: mostConnections) {
            Console.error("sockbench compare: \(note)")
            plan.options += "; \(note)"
        }
        try pin(toCPU: plan.clientCPU)
        let chosenTransports = plan.transports.compactMap(Transport.init(rawValue:))
        let secure = chosenTransports.contains(where: \.isSecure)
        let agent = try await server.asyncMap { try await AgentClient.connect($0) }
        if let server {
            plan.servers = server
            plan.serverCPU = nil
        }
        let certificates = secure && agent == nil ? try TestCertificates.make() : nil
        let remoteCA = secure ? try await agent?.fetchCA() : nil
        defer {
            certificates?.remove()
            if let remoteCA { unlink(remoteCA) }
        }
        var clientTLS = certificates?.client ?? TLSConfiguration()
        if let remoteCA { clientTLS.trustRoots = .file(remoteCA) }
        /// Starts one server: a child process here, or one the agent starts there.
        func start(_ backend: Backend?, _ transport: Transport, _ mode: String) async throws -> any ServerHandle {
            if let agent { return try await agent.start(backend, transport, mode) }
            var arguments =
                transport.isSecure
                ? ["--cert", certificates!.server.certificate, "--key", certificates!.server.key] : []
            if mode != "echo" { arguments.append("--\(mode)") }
            // WebSocket echo servers accept permessage-deflate; only the json-deflate clients offer it.
            if mode == "echo", transport == .ws || transport == .wss, backend != nil { arguments.append("--deflate") }
            return try ChildServer.start(
                backend: backend, url: "\(transport)://127.0.0.1:0", cpu: plan.serverCPU, extraArguments: arguments)
        }
        let needsSink = plan.scenarios.contains { $0.kind == .pump }
        let needsNative = plan.scenarios.contains { $0.kind == .native }
        let needsAsyncChannel = plan.scenarios.contains { $0.kind == .asyncChannel }
        let relaysHere = agent == nil && chosenTransports.contains(.tcp)
        let needsProxy = plan.scenarios.contains { $0.kind == .proxy } && relaysHere
        let needsProxyPump = plan.scenarios.contains { $0.kind == .proxyPump } && relaysHere
        // proxy-SIZE: every style's relay forwards to one C echo server, so only the hop differs; proxypump-SIZE:
        // to one C sink, which is also the direct path of the C floor's row.
        let proxyUpstream =
            needsProxy ? try ChildServer.start(backend: nil, url: "tcp://127.0.0.1:0", cpu: plan.serverCPU) : nil
        defer { proxyUpstream?.stop() }
        let proxySink =
            needsProxyPump
            ? try ChildServer.start(
                backend: nil, url: "tcp://127.0.0.1:0", cpu: plan.serverCPU, extraArguments: ["--sink"]) : nil
        defer { proxySink?.stop() }

        var targets: [Target] = []
        defer {
            for target in targets {
                target.echo.stop()
                target.sink?.stop()
                target.native?.stop()
                target.asyncChannel?.stop()
                target.proxy?.stop()
                target.proxyPump?.stop()
            }
        }
        var combos: [(Backend?, Transport)] = []
        if floor {
            for transport in chosenTransports where transport == .tcp || transport == .udp {
                combos.append((nil, transport))
            }
        }
        for name in plan.backends {
            let backend = Backend(rawValue: name)!
            for transport in chosenTransports where backend.transports.contains(transport) {
                combos.append((backend, transport))
            }
        }
        guard !combos.isEmpty else { throw fail("nothing to compare") }
        Console.error(
            "sockbench compare: \(combos.count) server(s) x \(plan.scenarios.count) scenario(s) x \(plan.repetitions) repetition(s), placement \(plan.placement.rawValue)"
                + (plan.serverCPU.map { " (server cpu \($0), client cpu \(plan.clientCPU!))" } ?? ""))
        for (backend, transport) in combos {
            let echo = try await start(backend, transport, "echo")
            let sink = needsSink ? try await start(backend, transport, "sink") : nil
            let native =
                needsNative && backend?.nativeTransports.contains(transport) == true
                ? try await start(backend, transport, "native") : nil
            let asyncChannel =
                needsAsyncChannel && backend == .nio && transport == .tcp
                ? try await start(backend, transport, "async-channel") : nil
            func relay(to upstream: (any ServerHandle)?) throws -> (any ServerHandle)? {
                guard let upstream, let backend, transport == .tcp else { return nil }
                return try ChildServer.start(
                    command: [
                        "proxy", "tcp://127.0.0.1:0", "\(upstream.endpoint)", "--backend", backend.rawValue, "--native",
                    ], cpu: plan.serverCPU, label: "the \(backend.rawValue) relay")
            }
            targets.append(
                Target(
                    backend: backend, transport: transport, echo: echo, sink: sink, native: native,
                    asyncChannel: asyncChannel,
                    proxy: try relay(to: proxyUpstream), proxyPump: try relay(to: proxySink)))
        }

        /// The server a scenario runs against, and other local processes of the measurement.
        func serverOf(_ scenario: Scenario, _ target: Target) -> (any ServerHandle, [any ServerHandle]) {
            let server: any ServerHandle =
                switch scenario.kind {
                case .pump: target.sink!
                case .native: target.native!
                case .asyncChannel: target.asyncChannel!
                case .proxy: target.proxy ?? target.echo
                case .proxyPump: target.proxyPump ?? proxySink!
                default: target.echo
                }
            return (server, [proxyUpstream, proxySink].compactMap { $0 })
        }
        // Round trips per slice, by time: one calibration run per row (it is also the row's warm-up).
        var roundTrips: [RowKey: Int] = [:]
        if let seconds = plan.pingpongSeconds {
            let slice = seconds / Double(plan.slices)
            let calibrated = plan.scenarios.filter(\.countsRoundTrips)
            if !calibrated.isEmpty {
                Console.error(
                    "  calibrating round trips: \(seconds) s per repetition, in \(plan.slices) interleaved slices ...")
            }
            for scenario in calibrated {
                for target in targets where skipReason(scenario, target) == nil {
                    let (server, also) = serverOf(scenario, target)
                    let probe = try await measureWatched(
                        scenario, target, server: server, also: also, plan: plan, tls: clientTLS,
                        roundTrips: plan.pingpongCount)
                    let perRoundTrip = Double(max(1, probe.elapsedNanoseconds)) / Double(plan.pingpongCount)
                    roundTrips[Report.key(scenario, target.backend, target.transport)] = min(
                        2_000_000, max(plan.pingpongCount / 4, Int(slice * 1e9 / perRoundTrip)))
                }
            }
        }

        var runs: [RowKey: [ScenarioResult]] = [:]
        var skipped: [String: String] = [:]
        let started = Date()
        /// One pass: every target measured once in `scenario`, one after another in `order`. Returns the
        /// measurements by row key.
        func pass(_ scenario: Scenario, order: [Target], label: String) async throws -> [RowKey: ScenarioResult] {
            var results: [RowKey: ScenarioResult] = [:]
            for target in order {
                let key = Report.key(scenario, target.backend, target.transport)
                if let reason = skipReason(scenario, target) {
                    skipped[key.description] = reason
                    continue
                }
                let (server, also) = serverOf(scenario, target)
                let measurement = try await measureWatched(
                    scenario, target, server: server, also: also, plan: plan, tls: clientTLS,
                    roundTrips: roundTrips[key] ?? plan.pingpongCount)
                results[key] = measurement
                Console.error(
                    String(
                        format: "  [%@ %4.0fs] %-14@ %-12@ %@", label, Date().timeIntervalSince(started),
                        scenario.description, target.name, Report.brief(scenario, measurement)))
            }
            return results
        }
        /// The foreign share of a pass (its windows together), `nil` when it was not disturbed.
        func disturbed(_ results: some Collection<ScenarioResult>) -> Double? {
            guard let share = CPUShare.combined(results.compactMap(\.cpuShare)), share.isDisturbed else { return nil }
            return share.foreignShare
        }
        // Each repetition measures every target in turn, the order rotated; round-trip scenarios do it in
        // `slices` short passes, so that a row and the rows it is compared with are measured seconds apart at
        // most: this VM's CPU runs at different speeds for seconds at a time (a spin loop took 17 to 40 ms), and
        // only neighbours in time compare. A pass in which something else used the measured CPUs is measured
        // again at the end, whole (its rows are compared with each other).
        var redo: [(scenario: Scenario, slot: Int, order: [Target])] = []
        var slots: [Scenario: Int] = [:]
        var cycle = 0
        for repetition in 0..<plan.repetitions {
            for scenario in plan.scenarios {
                let passes = scenario.countsRoundTrips && plan.pingpongSeconds != nil ? plan.slices : 1
                for slice in 0..<passes {
                    let order = targets.indices.map { targets[($0 + cycle) % targets.count] }
                    cycle += 1
                    let label =
                        passes == 1
                        ? "\(repetition + 1)/\(plan.repetitions)" : "\(repetition + 1)/\(plan.repetitions).\(slice + 1)"
                    let results = try await pass(scenario, order: order, label: label)
                    for (key, result) in results { runs[key, default: []].append(result) }
                    let slot = slots[scenario, default: 0]
                    slots[scenario] = slot + 1
                    if let share = disturbed(results.values) {
                        Console.error(
                            "  that pass was disturbed: foreign use of the measured CPUs \(fixed(share * 100, 1))%")
                        redo.append((scenario, slot, order))
                    }
                }
            }
        }
        for round in 0..<max(0, remeasure) where !redo.isEmpty {
            Console.error(
                "  re-measuring \(redo.count) pass(es) taken under foreign CPU load (round \(round + 1) of \(remeasure))"
            )
            var still: [(scenario: Scenario, slot: Int, order: [Target])] = []
            for entry in redo {
                let again = try await pass(entry.scenario, order: entry.order, label: "again")
                let before = entry.order.compactMap {
                    runs[Report.key(entry.scenario, $0.backend, $0.transport)]?[entry.slot]
                }
                let worstBefore = disturbed(before) ?? 0
                let worstAgain = disturbed(again.values)
                if worstAgain == nil || worstAgain! < worstBefore {
                    for (key, result) in again where runs[key]?.indices.contains(entry.slot) == true {
                        runs[key]![entry.slot] = result
                    }
                }
                if worstAgain != nil { still.append(entry) }
            }
            redo = still
        }
        var external: [String] = []
        if baselines, agent == nil {
            Console.error("  baselines: iperf3 and sockperf (when installed) ...")
            let rows = Baselines.run(plan: plan, seconds: full ? 5 : 1)
            for (key, value) in rows { runs[key] = value }
            external = Array(Set(rows.keys.map(\.source))).sorted()
        }
        let report = Report(
            plan: plan, runs: runs, skipped: skipped, machine: MachineInfo.read(), external: external)
        Console.line(report.terminalTables())
        if let out {
            try report.write(to: out)
            Console.error("wrote \(out)/results.json, results.csv, report.md, report.html")
        }
        // The agent stops its servers when the control connection ends.
        await agent?.close()
    }

    /// The CPUs a run's processes are pinned to (every CPU with `--placement none`).
    static func watchedCPUs(_ plan: Plan) -> Set<Int>? {
        guard let client = plan.clientCPU else { return nil }
        return Set([client] + (plan.serverCPU.map { [$0] } ?? []))
    }

    /// One measurement with the client's and the server's resource use over its window, and what else used the
    /// measured CPUs meanwhile (``CPUShare``).
    /// `also`: other local processes of the measurement (the upstream a relay forwards to) whose CPU time counts
    /// as the run's own.
    func measureWatched(
        _ scenario: Scenario, _ target: Target, server: any ServerHandle, also: [any ServerHandle], plan: Plan,
        tls: TLSConfiguration, roundTrips: Int
    ) async throws -> ScenarioResult {
        let cpus = Self.watchedCPUs(plan)
        let cpuBefore = CPUTimes.read(cpus: cpus)
        let clientBefore = ResourceUsage.read()
        let serverBefore = await server.usage()
        var othersBefore: [ResourceUsage?] = []
        for other in also { othersBefore.append(await other.usage()) }
        let windowStart = MonotonicClock.nanoseconds()
        // Usage at the end of the measured window: taken before the connection closes where the scenario allows
        // (a bsd server's reader thread, and its counts, end with the connection).
        struct WindowEnd: Sendable {
            var client: ResourceUsage?
            var server: ResourceUsage?
            var cpu: CPUTimes?
            var others: UInt64
            var at: UInt64
        }
        let windowEnd = Guarded<WindowEnd?>(nil)
        let endWindow: () async -> Void = {
            let client = ResourceUsage.read()
            let server = await server.usage()
            var others: UInt64 = 0
            for (other, before) in zip(also, othersBefore) {
                if let after = await other.usage(), let before { others += after.since(before).cpuNanoseconds }
            }
            let cpu = CPUTimes.read(cpus: cpus)
            windowEnd.withLock {
                $0 = WindowEnd(
                    client: client, server: server, cpu: cpu, others: others, at: MonotonicClock.nanoseconds())
            }
        }
        do throws(ConnectionError) {
            var measurement = try await measure(
                scenario, target, server: server, plan: plan, tls: tls, roundTrips: roundTrips, endWindow: endWindow)
            if windowEnd.withLock({ $0 }) == nil { await endWindow() }
            let end = windowEnd.withLock { $0 }!
            if let after = end.client, let clientBefore { measurement.client = after.since(clientBefore) }
            if let after = end.server, let serverBefore { measurement.server = after.since(serverBefore) }
            // The measured processes: with a remote server, only the client runs on the watched CPUs.
            let measured =
                (measurement.client?.cpuNanoseconds ?? 0)
                + (agentless(server) ? (measurement.server?.cpuNanoseconds ?? 0) : 0) + end.others
            if let cpuBefore, let cpuAfter = end.cpu {
                measurement.cpuShare = CPUShare(
                    windowNanoseconds: end.at &- windowStart, before: cpuBefore, after: cpuAfter,
                    measuredNanoseconds: measured, cpus: cpus?.count ?? Syscall.cpuCount)
            }
            return measurement
        } catch {
            throw fail("\(scenario) \(target.name): \(error)")
        }
    }

    private func agentless(_ server: any ServerHandle) -> Bool { !(server is RemoteServer) }

    /// Why a scenario does not apply to a target, or `nil`.
    func skipReason(_ scenario: Scenario, _ target: Target) -> String? {
        var limit = rlimit()
        if case .fanin(let connections) = scenario, let backend = target.backend,
            getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0,
            limit.rlim_cur < Self.descriptors(for: connections, backend: backend)
        {
            return
                "fanin-\(connections) on \(backend) needs \(Self.descriptors(for: connections, backend: backend)) descriptors per process (bsd: a socket and an eventfd per connection); the limit is \(limit.rlim_cur)"
        }
        if scenario.kind == .json, target.transport != .ws && target.transport != .wss {
            return "JSON text messages are WebSocket's (ws, wss)"
        }
        if case .pump(let size) = scenario, target.transport == .udp, size > 65_507 {
            return "a UDP datagram carries at most 65,507 bytes"
        }
        if scenario.kind == .proxy || scenario.kind == .proxyPump, target.transport != .tcp || server != nil {
            return server != nil
                ? "proxy runs on this host only (not with --server)" : "the native relays are tcp -> tcp"
        }
        guard target.backend != nil else {
            return ([.pingpong, .rate, .pump, .proxy, .proxyPump] as [Scenario.Kind]).contains(scenario.kind)
                ? nil : "the C floor runs pingpong, rate, pump, proxy and proxypump (the direct paths) only"
        }
        if scenario.kind == .native, target.native == nil {
            return "native styles: every backend over tcp; nio also over ws (NIOWebSocket), tls and wss (swift-nio-ssl)"
        }
        if scenario.kind == .asyncChannel, target.asyncChannel == nil {
            return "NIOAsyncChannel is SwiftNIO's async/await bridge: nio over tcp only"
        }
        return nil
    }

    func measure(
        _ scenario: Scenario, _ target: Target, server: any ServerHandle, plan: Plan, tls: TLSConfiguration,
        roundTrips: Int, endWindow: () async -> Void
    ) async throws(ConnectionError) -> ScenarioResult {
        let endpoint = server.endpoint
        guard let backend = target.backend else {
            switch scenario {
            case .pingpong(let size), .proxy(let size):
                let result = try await runFloorPing(
                    endpoint: endpoint, size: size, count: roundTrips, warmup: plan.pingpongWarmup)
                return Self.measurement(result, size: size, count: roundTrips)
            case .pump(let size), .proxyPump(let size):
                _ = try await runFloorPump(endpoint: endpoint, size: size, totalBytes: plan.pumpBytes / 8)
                return try await runFloorPump(endpoint: endpoint, size: size, totalBytes: plan.pumpBytes)
            case .rate(let perSecond):
                return try await runFloorRate(
                    endpoint: endpoint, perSecond: perSecond, duration: .milliseconds(Int(plan.rateSeconds * 1000)),
                    warmup: .milliseconds(250))
            default:
                throw ConnectionError(.unsupported, "the C floor runs pingpong, rate, pump and proxy only")
            }
        }
        let connect: @Sendable () async throws(ConnectionError) -> any Connection = {
            try await backend.connect(to: endpoint, tls: tls)
        }
        switch scenario {
        case .pingpong(let size):
            let connection = try await connect()
            defer { Task { await connection.close() } }
            let result = try await PingRunner(size: size, count: roundTrips, warmup: plan.pingpongWarmup).run(
                on: connection)
            await endWindow()
            await connection.close()
            return Self.measurement(result, size: size, count: roundTrips)
        case .proxy(let size):
            // The C client, through the backend's relay, to the C echo server.
            let result = try await runFloorPing(
                endpoint: endpoint, size: size, count: roundTrips, warmup: plan.pingpongWarmup)
            return Self.measurement(result, size: size, count: roundTrips)
        case .proxyPump(let size):
            // The C pump, through the backend's relay, to the C sink; a short one first as the warm-up.
            _ = try await runFloorPump(endpoint: endpoint, size: size, totalBytes: plan.pumpBytes / 8)
            return try await runFloorPump(endpoint: endpoint, size: size, totalBytes: plan.pumpBytes)
        case .native(let size):
            let result = try await backend.nativePingPong(
                to: endpoint, size: size, count: roundTrips, warmup: plan.pingpongWarmup, tls: tls)
            return Self.measurement(result, size: size, count: roundTrips)
        case .asyncChannel(let size):
            let result = try await backend.asyncChannelPingPong(
                to: endpoint, size: size, count: roundTrips, warmup: plan.pingpongWarmup)
            return Self.measurement(result, size: size, count: roundTrips)
        case .rate(let perSecond):
            let connection = try await connect()
            let runner = RateRunner(perSecond: perSecond, duration: .milliseconds(Int(plan.rateSeconds * 1000)))
            do throws(ConnectionError) {
                let result = try await runner.run(on: connection)
                await connection.close()
                return result
            } catch {
                await connection.close()
                throw error
            }
        case .pump(let size):
            // A short pump first, on its own connection, as the warm-up.
            for total in [plan.pumpBytes / 8, plan.pumpBytes] {
                let connection = try await connect()
                do throws(ConnectionError) {
                    let result = try await PumpRunner(size: size, totalBytes: max(size, total)).run(on: connection)
                    await connection.close()
                    if total == plan.pumpBytes { return result }
                } catch {
                    await connection.close()
                    throw error
                }
            }
            throw ConnectionError(.system, "unreachable")
        case .connect:
            return try await ConnectRunner(count: plan.connectCount).run(connect: connect)
        case .fanin(let connections):
            let count = plan.faninRoundTrips(connections: connections)
            return try await FaninRunner(connections: connections, count: count, warmup: min(20, count)).run(
                serverUsage: { await server.usage() }, connect: connect)
        case .json(let deflate):
            let connection = try await backend.connectWebSocket(
                to: endpoint, webSocket: .with { $0.deflate = deflate ? WebSocketDeflateOptions() : nil }, tls: tls)
            if deflate && connection.deflate == nil {
                await connection.close()
                throw ConnectionError(.unsupported, "the server did not agree to permessage-deflate")
            }
            var runner = PingRunner(count: roundTrips, warmup: plan.pingpongWarmup)
            runner.messageMaker = { .text(MarketData.book($0)) }
            let before = connection.sent
            do throws(ConnectionError) {
                let result = try await runner.run(on: connection)
                await endWindow()
                let sent = connection.sent
                await connection.close()
                let messages = Double(max(1, sent.messages - before.messages))
                var measurement = Self.measurement(result, size: 0, count: roundTrips)
                measurement.messageBytes = Double(sent.messageBytes - before.messageBytes) / messages
                measurement.wireBytes = Double(sent.payloadBytes - before.payloadBytes) / messages
                measurement.bytesPerSecond = result.roundTripsPerSecond * (measurement.messageBytes ?? 0)
                return measurement
            } catch {
                await connection.close()
                throw error
            }
        }
    }

    static func measurement(_ result: PingRunner.Result, size: Int, count: Int) -> ScenarioResult {
        var measurement = ScenarioResult()
        measurement.latency = result.latency
        measurement.messages = count
        measurement.lost = result.lost
        measurement.elapsedNanoseconds = result.elapsedNanoseconds
        measurement.messagesPerSecond = result.roundTripsPerSecond
        measurement.bytesPerSecond = result.roundTripsPerSecond * Double(size)
        return measurement
    }
}
