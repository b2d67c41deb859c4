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
            The quick default takes about four minutes; --full goes deep; --workload runs your own load and names \
            the backend that holds it best. Scenarios (docs/benchmarks.md says what each times):
            """
                + Scenario.registered.map { "\n  \($0.usage): \($0.about)" }.joined()
    )

    @Option(help: "Comma-separated backends, or `all` (\(Backend.allCases.map(\.name).joined(separator: ", "))).")
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
            "pingpong: seconds of round trips per repetition; the count is calibrated once per row (default 1)."
    )
    var seconds: Double?

    @Option(help: "pump: seconds of each measured pass, sized from its warm-up pass's rate (default 0.25; --full: 1).")
    var pumpSeconds: Double?

    @Option(
        help: ArgumentHelp(
            "udp pump sinks, the C floor's too: SO_RCVBUF in bytes (0: the system's default). With the default 208 KiB a sink on its sender's CPU takes what the buffer holds at each turn, whatever it costs per datagram; the kernel caps the size at net.core.rmem_max.",
            valueName: "bytes"))
    var udpSinkBuffer: Int = Compare.Plan.defaultUDPSinkBuffer

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

    @Option(
        help:
            "How the open-loop (rate) senders, ours and the C floor's, wait for each send time: `spin` (check the clock, yielding the CPU between checks, as sockperf's sender polls it: no timer or idle wake-up in the latency) or `sleep` (a timed sleep, clock_nanosleep in C and ppoll in ours: every message pays the timer's lateness and an idle CPU's wake-up)."
    )
    var pacing: String = Pacing.spin.rawValue

    @Option(help: "Write results.json, results.csv, report.md and report.html to this directory.")
    var out: String?

    @Flag(inversion: .prefixedNo, help: "Also run the C floor (blocking C ping-pong against a C echo server).")
    var floor = true

    @Flag(
        inversion: .prefixedNo,
        help: "Start every server process anew for each repetition (a process's own luck then shows in the spread).")
    var freshServers = true

    @Flag(inversion: .prefixedNo, help: "Also run iperf3 and sockperf when installed, as rows of the same report.")
    var baselines = true

    @Option(
        help:
            "Run the servers on another host: HOST:PORT of a `sockbench serve --agent tcp://HOST:PORT` there. Servers are then pinned by the agent's --cpu; iperf3 and sockperf rows are left out."
    )
    var server: String?

    @Option(
        help: ArgumentHelp(
            "Run every fan-in and workload scenario against servers on each of these thread counts (`serve --threads N`, a listening socket per loop), e.g. 1,2: the scenarios become fanin-64@1thread, fanin-64@2threads, ... Those servers are not pinned, so that their threads may span every CPU (1 thread too, to set the others against); the report adds a table of throughput, p99 and round trips per server CPU-second by threads.",
            valueName: "counts"))
    var serverThreads: String?

    @OptionGroup(title: "Your own load") var load: LoadOptions

    @OptionGroup(title: "Output") var output: ReportOutputOptions

    @Option(
        help:
            "An earlier run (results.json or a --out directory) to set this one against at the end, as `sockbench diff` does."
    )
    var baseline: String?

    @Flag(
        help:
            "Print one JSON object per line on stdout as the run goes (start, each pass's measurement, end with the whole report); the tables go to stderr."
    )
    var jsonStream = false

    @Option(
        help: "With --baseline: exit 1 when any figure is slower than the baseline's by more than this many percent.")
    var failSlower: Double?

    @Flag(
        help:
            "Go deep: more sizes, rates, fan-in up to 1,000 connections, a 1,000-connection workload, tls and wss, 5 repetitions."
    )
    var full = false

    func run() async throws {
        var plan = try makePlan()
        if failSlower != nil, baseline == nil { throw fail("--fail-slower needs a --baseline to compare with") }
        if jsonStream, baseline != nil || output.checkTargets {
            throw fail(
                "--json-stream keeps stdout for JSON lines: run `sockbench diff` or `report --check-targets` on --out DIR"
            )
        }
        // Read before the run, so that a wrong path fails in a second, not after it.
        let before = try baseline.map(ReportDiff.load)
        let mostConnections = plan.scenarios.compactMap(\.connections).max() ?? 0
        if let note = try Self.raiseDescriptorLimit(toHold: mostConnections) {
            Console.error("sockbench compare: \(note)")
            plan.options += "; \(note)"
        }
        if freshServers, server == nil, plan.repetitions > 1 {
            plan.options += "; server processes started anew for each repetition"
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
        let start = { (backend: Backend?, transport: Transport, mode: String) async throws -> any ServerHandle in
            try await Self.startServer(backend, transport, mode, agent: agent, certificates: certificates, plan: plan)
        }
        // The kinds of server the planned scenarios run against, besides the echo server every target has, each
        // with the process it fronts (a relay's upstream) started once for the run, here.
        var roles: [ServerRole] = []
        for scenario in plan.scenarios where scenario.server.mode != ServerRole.echo.mode {
            if !roles.contains(where: { $0.mode == scenario.server.mode }) { roles.append(scenario.server) }
        }
        var upstreams: [String: ChildServer] = [:]
        defer { upstreams.values.forEach { $0.stop() } }
        for role in roles where agent == nil {
            if let upstream = try role.upstream?(plan) { upstreams[role.mode] = upstream }
        }

        var targets: [Target] = []
        defer { targets.forEach { $0.stop() } }
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
        /// Every target's servers, started afresh.
        func startTargets() async throws -> [Target] {
            var started: [Target] = []
            for (backend, transport) in combos { started.append(try await startTarget(backend, transport)) }
            return started
        }
        func startTarget(_ backend: Backend?, _ transport: Transport) async throws -> Target {
            let echo = try await start(backend, transport, "echo")
            var servers: [String: any ServerHandle] = [:]
            for role in roles {
                let context = ServerStart(
                    backend: backend, transport: transport, plan: plan, upstream: upstreams[role.mode],
                    serve: { mode, extra, pinned in
                        try await Self.startServer(
                            backend, transport, mode, extraArguments: extra, agent: agent, certificates: certificates,
                            plan: plan, pinned: pinned)
                    })
                servers[role.mode] = try await role.start(context)
            }
            return Target(backend: backend, transport: transport, echo: echo, servers: servers)
        }
        targets = try await startTargets()

        /// The server a scenario runs against, and other local processes of the measurement.
        func serverOf(_ scenario: Scenario, _ target: Target) -> (any ServerHandle, [any ServerHandle]) {
            (scenario.server(of: target, upstreams: upstreams), Array(upstreams.values))
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
                    // The probe's median round trip, not its mean: a warm-up against a fresh server, or one that
                    // other processes stalled for a few milliseconds, has a mean far above its median, and slices
                    // counted from that mean ran short of the time asked (a bsd row's 0.2 s slices, calibrated
                    // while another test process loaded both CPUs, held fewer than the ten 5 ms stretches a quiet
                    // p50 needs, in CI on 2026-12-02).
                    let mean = Double(max(1, probe.elapsedNanoseconds)) / Double(plan.pingpongCount)
                    let perRoundTrip = probe.latency.map { Double(max(1, $0.p50)) } ?? mean
                    roundTrips[Report.key(scenario, target.backend, target.transport)] = min(
                        2_000_000, max(plan.pingpongCount / 4, Int(slice * 1e9 / perRoundTrip)))
                }
            }
        }

        var runs: [RowKey: [ScenarioResult]] = [:]
        var skipped: [String: String] = [:]
        // A sweep's rates, per target: the lowest at which it saturated in this repetition (higher ones skipped).
        var saturated: [String: Int] = [:]
        let started = Date()
        if jsonStream { CompareStreamEvent.start(plan).write() }
        /// One pass: every target measured once in `scenario`, one after another in `order`. Returns the
        /// measurements by row key.
        func pass(_ scenario: Scenario, order: [Target], label: String) async throws -> [RowKey: ScenarioResult] {
            var results: [RowKey: ScenarioResult] = [:]
            for target in order {
                let key = Report.key(scenario, target.backend, target.transport)
                if let reason = skipReason(scenario, target) ?? saturation(scenario, target, saturated) {
                    skipped[key.description] = reason
                    continue
                }
                let (server, also) = serverOf(scenario, target)
                let measurement = try await measureWatched(
                    scenario, target, server: server, also: also, plan: plan, tls: clientTLS,
                    roundTrips: roundTrips[key] ?? plan.pingpongCount)
                results[key] = measurement
                if jsonStream {
                    CompareStreamEvent.pass(
                        label: label, elapsed: Date().timeIntervalSince(started), key: key, result: measurement
                    ).write()
                }
                if plan.sweep != nil, let rate = scenario.as(RateScenario.self)?.perSecond,
                    Report.saturated(measurement, perSecond: rate, bound: plan.p99Bound ?? Plan.defaultP99Bound)
                {
                    saturated[target.name] = min(rate, saturated[target.name] ?? rate)
                }
                Console.error(
                    String(
                        format: "  [%@ %4.0fs] %-14@ %-12@ %@", label, Date().timeIntervalSince(started),
                        scenario.description, target.name, Report.brief(scenario, measurement)))
            }
            return results
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
            saturated = [:]
            if repetition > 0, freshServers, agent == nil {
                // New server processes for each repetition: a row's round trip keeps one level for as long as its
                // server process lives (bsd ws: 14.7 us in every pass of one run, 13.0 in every pass of the next),
                // so one process per run put that luck between runs; a process per repetition puts it in the
                // run's spread.
                targets.forEach { $0.stop() }
                targets = []
                targets = try await startTargets()
            }
            // Round-trip scenarios take their slices in turn (pingpong slice 1, native slice 1, pingpong slice 2,
            // ...), so that rows of different scenarios set against each other (the price of the unified API is
            // a pingpong row over a native row) are measured seconds apart too, not a whole scenario apart: the
            // CPU's slow stretches last about 10-20 s here, as long as 5 slices of 7 rows.
            let sliced = plan.pingpongSeconds != nil ? plan.scenarios.filter(\.countsRoundTrips) : []
            let schedule: [(Scenario, Int, Int)] =
                (0..<(sliced.isEmpty ? 0 : plan.slices)).flatMap { slice in sliced.map { ($0, slice, plan.slices) } }
                + plan.scenarios.filter { !sliced.contains($0) }.map { ($0, 0, 1) }
            for (scenario, slice, passes) in schedule {
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
        for round in 0..<max(0, remeasure) where !redo.isEmpty {
            Console.error(
                "  re-measuring \(redo.count) pass(es) taken under foreign CPU load (round \(round + 1) of \(remeasure))"
            )
            var still: [(scenario: Scenario, slot: Int, order: [Target])] = []
            for entry in redo {
                let order = entry.order.compactMap { old in targets.first { $0.name == old.name } }
                let again = try await pass(entry.scenario, order: order, label: "again")
                let before = entry.order.compactMap {
                    runs[Report.key(entry.scenario, $0.backend, $0.transport)]?[entry.slot]
                }
                let worstBefore = disturbed(before) ?? 0
                let worstAgain = disturbed(again.values)
                if worstAgain == nil || worstAgain! < worstBefore {
                    for (key, var result) in again where runs[key]?.indices.contains(entry.slot) == true {
                        result.replacedForeignShare = worstBefore
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
        if jsonStream {
            Console.error(report.terminalTables(wide: output.wide))
            CompareStreamEvent.end(report).write()
        } else {
            Console.line(report.terminalTables(wide: output.wide))
        }
        if let out {
            try report.write(to: out)
            Console.error("wrote \(out)/results.json, results.csv, report.md, report.html")
        }
        // The agent stops its servers when the control connection ends.
        await agent?.close()
        // Both checks print before either sets the exit status.
        let againstBaseline = Result<Void, any Error> {
            guard let before else { return }
            Console.line("\n== Against the baseline \(baseline ?? "")")
            try ReportDiff(old: before, new: report).report(wide: output.wide, failSlower: failSlower)
        }
        try output.checkTargets(of: report)
        try againstBaseline.get()
    }
}
