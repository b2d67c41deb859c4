import ArgumentParser
import BenchmarkDriver
import Foundation
import Histogram
import Lessons
import POSIXSupport
import SocketStyles

/// `sockbench fleet`: one load spread over several load hosts (`sockbench serve --agent` on each) against one
/// server, with one measured window that opens on every host at the same moment, and the latencies merged from
/// the hosts' histograms.
struct FleetCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fleet",
        abstract: "Drive several load hosts (`sockbench serve --agent` on each) against one server at once.",
        discussion: """
            Every agent opens its share of the load (fanin-N: N connections per agent, each in closed-loop 64-byte \
            round trips; rate-R: R messages a second in all, split evenly, one connection per agent; a workload, as \
            compare's, on every agent; broadcast-N: N clients per agent of a broadcast server, this process the asker, \
            each receipt timed on the asker's clock through the agent's offset) and warms it up; \
            only when every agent is ready does the measured window open, at the same moment on every host: each \
            agent is told how long after it reads the order to start (the coordinator allows for the order's way to \
            it), not a wall-clock time, and each agent's clock offset and its window's measured start are reported. \
            Each agent sends back its latencies as a histogram; the merged row is the sum of the histograms, never an \
            average of percentiles. An agent that cannot be reached, or that dies or stops answering mid-run, is named \
            and left out; the others' results are kept. The server is either started by an agent (--server-agent, \
            which also reports its CPU and memory over the window) or any echo server (--target).
            """
    )

    @Option(help: "The load agents, HOST:PORT,HOST:PORT,... (each running `sockbench serve --agent tcp://HOST:PORT`).")
    var agents: String?

    @Option(
        help:
            "Instead of --agents and --server-agent (root): make N load hosts and a server host as network namespaces on one bridge, an agent in each, run there, and remove them."
    )
    var lab: Int?

    @Option(help: "An agent that starts the server (and reports its CPU and memory), HOST:PORT.")
    var serverAgent: String?

    @Option(help: "With --server-agent: the server's backend.")
    var serverBackend: String = Backend.async.name

    @Option(help: "With --server-agent: the transport (tcp, udp, ws; a broadcast: tcp, ws).")
    var transport: String = "tcp"

    @Option(help: "Instead of --server-agent: any echo server's URL, as the agents reach it (tcp://, udp://, ws://).")
    var target: String?

    @Option(
        help:
            "The load: fanin-N (N connections per agent), rate-R (R messages a second over all agents), workload-NxRATE/s-SIZEB-SECONDSs (per agent; its window is its SECONDS) or broadcast-N[-RATE/s][-SECONDSs] (N clients per agent; this process asks)."
    )
    var load: String = "fanin-64"

    @Option(help: "The agents' client backend.")
    var backend: String = Backend.async.name

    @Option(help: "Seconds the measured window lasts.")
    var seconds: Double = 3

    @Option(
        help: "Seconds an agent may take to answer beyond what its request needs; past that it is named and left out.")
    var timeout: Double = 15

    @Option(
        help:
            "Seconds to keep trying agents that cannot be reached yet (pods still starting); past that they are named and left out."
    )
    var waitForAgents: Double = 0

    @Flag(help: "Have the agents send every latency too, and print them in --json (for checking the merge).")
    var samples = false

    @Flag(help: "Print the result as JSON.")
    var json = false

    func validate() throws {
        if let lab {
            guard agents == nil, serverAgent == nil, target == nil else {
                throw ValidationError(
                    "--lab makes its own agents and server: not with --agents, --server-agent or --target")
            }
            guard (1...50).contains(lab) else { throw ValidationError("--lab: 1 to 50 load hosts") }
        } else {
            guard (target == nil) != (serverAgent == nil) else {
                throw ValidationError("name the server: --server-agent HOST:PORT or --target URL (one of them)")
            }
            guard let agents, !agents.split(separator: ",").isEmpty else {
                throw ValidationError("--agents: at least one HOST:PORT (or --lab N)")
            }
        }
        guard FleetShare.Load(load) != nil else {
            throw ValidationError(
                "--load: fanin-N (N up to 10000), rate-R or workload-NxRATE/s-SIZEB-SECONDSs, not \(load)")
        }
        guard seconds > 0, seconds <= 600 else { throw ValidationError("--seconds must be above 0 and at most 600") }
        guard timeout > 0 else { throw ValidationError("--timeout must be above 0") }
    }

    func run() async throws {
        if let lab { return try await runInLab(hosts: lab) }
        var load = FleetShare.Load(load)!
        let addresses = (agents ?? "").split(separator: ",").map(String.init)
        if case .rate(let total) = load {
            guard total >= addresses.count else { throw fail("--load \(load): fewer messages a second than agents") }
            load = .rate(perSecond: total / addresses.count)
        }
        // The server.
        var server: (agent: FleetAgent, id: String)?
        let url: String
        if let serverAgent {
            let agent: FleetAgent
            do {
                agent = try await FleetAgent.connect(serverAgent, within: timeout, wait: waitForAgents)
            } catch {
                throw fail("--server-agent \(serverAgent): \(error)")
            }
            let started: String
            do {
                let mode: String
                if case .broadcast = load { mode = "broadcast" } else { mode = "echo" }
                started = try await agent.request("start \(serverBackend) \(transport) \(mode)", within: timeout)
            } catch {
                throw fail("--server-agent \(serverAgent): \(error)")
            }
            let parts = started.split(separator: " ")
            guard parts.count == 2 else { throw fail("--server-agent \(serverAgent) answered '\(started)'") }
            server = (agent, String(parts[0]))
            url = String(parts[1])
        } else {
            url = target!
        }
        defer { if let server { Task { await server.agent.close() } } }

        let run = FleetRun(
            load: load, backend: backend, url: url,
            window: load.window.map { Double($0.wholeNanoseconds) / 1e9 } ?? seconds, timeout: timeout,
            samples: samples,
            serverBackend: serverAgent == nil ? nil : serverBackend, waitForAgents: waitForAgents)
        let report = await run.measure(addresses, server: server)
        if json {
            try Console.json(report)
        } else {
            for line in report.lines() { Console.line(line) }
        }
        if report.merged.count == 0 { throw fail("no agent measured anything") }
    }
}

extension FleetCommand {
    /// `--lab N`: N + 1 namespaces on a bridge (``NetworkLab/init(bridgedHosts:)``), an agent in each, and this
    /// command again in the server's namespace with their addresses; its output is passed on as it is.
    func runInLab(hosts: Int) async throws {
        if let reason = NetworkLab.unavailableReason() { throw fail("--lab: \(reason)") }
        let network: NetworkLab
        do {
            network = try NetworkLab(bridgedHosts: hosts + 1)
        } catch {
            throw fail("--lab: \(error)")
        }
        defer { network.remove() }
        var started: [ChildProcess] = []
        defer { for agent in started { NetworkLab.stop(agent) } }
        var addresses: [String] = []
        for host in network.hosts {
            let agent = try network.start(
                in: host.namespace, ["serve", "--agent", "tcp://\(host.address):0", "--exit-on-stdin-eof"])
            started.append(agent)
            let line = agent.readLine()
            guard line.hasPrefix("listening on tcp://") else { throw fail("--lab: an agent said '\(line)'") }
            addresses.append(String(line.dropFirst("listening on tcp://".count)))
        }
        var arguments = [
            "fleet", "--agents", addresses.dropFirst().joined(separator: ","), "--server-agent", addresses[0],
            "--server-backend", serverBackend, "--transport", transport, "--load", load, "--backend", backend,
            "--seconds", "\(seconds)", "--timeout", "\(timeout)",
        ]
        if samples { arguments.append("--samples") }
        if json { arguments.append("--json") }
        let coordinator = try network.start(in: network.serverNamespace, arguments)
        let output = coordinator.readToEnd()
        let status = try coordinator.wait()
        if !output.isEmpty { Console.line(String(output.dropLast(output.hasSuffix("\n") ? 1 : 0))) }
        if status != 0 { throw ExitCode(status) }
    }
}

/// The result of one fleet run: each agent's row, the merged row, the server's usage.
struct FleetReport: Codable {
    struct AgentRow: Codable {
        var agent: String
        /// Why the agent is left out (unreachable, refused the load, died or went silent mid-run), or `nil`.
        var error: String?
        /// The agent's monotonic clock minus this host's, and the round trip that estimate came from, ns.
        var clockOffsetNanoseconds: Int64?
        var clockRoundTripNanoseconds: UInt64?
        /// When its window opened, against when it was meant to, on this host's clock (offset applied), ns.
        var startSkewNanoseconds: Int64?
        var connections: Int?
        var outcome: FleetShare.Outcome?
        var latency: LatencySummary?
        var perSecond: Double?
    }

    struct Merged: Codable {
        var agents: Int
        var count: Int
        var lost: Int
        var perSecond: Double
        var latency: LatencySummary?
        var histogram: SparseHistogram
        /// The spread of the agents' window starts (latest minus earliest), on this host's clock, ns.
        var startSpreadNanoseconds: UInt64?
    }

    struct Server: Codable {
        var backend: String
        var cpuNanoseconds: UInt64
        var cpuPerMessageNanoseconds: Double?
        var residentKiB: UInt64?
        var threads: UInt64
    }

    var load: String
    var backend: String
    var target: String
    var windowSeconds: Double
    var agents: [AgentRow]
    var merged: Merged
    var server: Server?
    /// A broadcast load: per message the first and the last client's receipt over every agent (on this host's
    /// clock), the asker's answers, what went missing.
    var broadcast: BroadcastFigures?
    var askerError: String?

    /// The table a person reads.
    func lines() -> [String] {
        var out = [
            "sockbench fleet: \(load) per agent, \(backend) clients, against \(target), a \(fixed(windowSeconds, 1)) s window"
        ]
        let header = [
            "agent", "clock offset us", "start skew us", "conns", "messages", "per second", "p50 us", "p99 us",
            "p99.9 us", "lost", "failed",
        ]
        var rows: [[String]] = []
        for row in agents {
            guard let outcome = row.outcome, let latency = row.latency else { continue }
            rows.append([
                row.agent,
                row.clockOffsetNanoseconds.map {
                    signedMicroseconds($0) + " ±" + microseconds((row.clockRoundTripNanoseconds ?? 0) / 2)
                } ?? "-",
                row.startSkewNanoseconds.map(signedMicroseconds) ?? "-",
                row.connections.map(String.init) ?? "-", String(outcome.count), String(Int(row.perSecond ?? 0)),
                microseconds(latency.p50), microseconds(latency.p99), microseconds(latency.p999), String(outcome.lost),
                String(outcome.failedConnections),
            ])
        }
        if let latency = merged.latency {
            rows.append([
                "all \(merged.agents) (merged)", "-",
                merged.startSpreadNanoseconds.map { "spread " + microseconds($0) } ?? "-", "-", String(merged.count),
                String(Int(merged.perSecond)), microseconds(latency.p50), microseconds(latency.p99),
                microseconds(latency.p999), String(merged.lost), "-",
            ])
        }
        out += Report.render(header, rows).split(separator: "\n").map(String.init)
        if let b = broadcast {
            func ms(_ value: UInt64?) -> String { value.map { fixed(Double($0) / 1e6, 2) } ?? "-" }
            out.append(
                "broadcast: \(b.clients) clients, \(b.messages) messages measured; per message, last client's receipt p50 \(ms(b.lastReceipt?.p50)) p95 \(ms(b.lastReceipt?.p95)) p99 \(ms(b.lastReceipt?.p99)) ms, first \(ms(b.firstReceipt?.p50)) ms (p50), the asker's answer \(ms(b.answer?.p50)) ms (p50); missing \(b.missing), duplicated or late \(b.duplicates + b.outOfOrder)"
            )
        }
        if let askerError { out.append("asker: \(askerError)") }
        if let server {
            out.append(
                "server (\(server.backend)): \(fixed(Double(server.cpuNanoseconds) / 1e9, 2)) CPU s in the window"
                    + (server.cpuPerMessageNanoseconds.map { ", \(fixed($0 / 1000, 2)) us CPU a message" } ?? "")
                    + (server.residentKiB.map { "; halfway through: resident \(fixed(Double($0) / 1024, 1)) MiB" } ?? "")
                    + ", \(server.threads) threads")
        }
        for row in agents {
            if let error = row.error { out.append("agent \(row.agent): \(error)") }
            if let first = row.outcome?.firstError { out.append("agent \(row.agent): a connection failed: \(first)") }
        }
        return out
    }

    private func signedMicroseconds(_ value: Int64) -> String {
        (value < 0 ? "-" : "+") + microseconds(value.magnitude)
    }
}

/// One run: agents connected, clocks read, loads prepared, one window, results merged.
struct FleetRun {
    let load: FleetShare.Load
    let backend: String
    let url: String
    let window: Double
    let timeout: Double
    let samples: Bool
    /// The server's backend, when an agent started it.
    let serverBackend: String?
    /// Seconds to keep trying an agent that is not reachable yet.
    let waitForAgents: Double

    /// The asker of a broadcast load: `total` requests to the broadcast server on a schedule from `start` (the
    /// first 10 ms after it, while every agent's clients listen), whatever the answers do; the answers' latencies
    /// from each request's intended time, past the warm-up.
    private func ask(
        _ total: Int, warmup: Int, every interval: UInt64, from start: UInt64
    ) async -> (sent: [UInt64: UInt64], answers: [UInt64], error: String?) {
        let asker: any Connection
        do throws(ConnectionError) {
            asker = try await Backend(name: backend).connect(to: try Endpoint(url: url))
        } catch {
            return ([:], [], "the asker could not connect: \(error)")
        }
        let first = start + 10_000_000
        let answers = Task {
            var latencies: [UInt64] = []
            while let bytes = try? await Broadcast.receive(on: asker) {
                guard let header = Broadcast.decode(bytes), header.kind == .answer else { break }
                if header.sequence >= UInt64(warmup) { latencies.append(MonotonicClock.nanoseconds() &- header.sent) }
                if header.sequence == UInt64(total - 1) { break }
            }
            return latencies
        }
        let giveUp = Task {
            guard (try? await Task.sleep(for: .nanoseconds(Int64(UInt64(total) * interval) + 30_000_000_000))) != nil
            else { return }
            await asker.close()
        }
        var sent: [UInt64: UInt64] = [:]
        var failure: String?
        for sequence in 0..<total {
            let intended = first + UInt64(sequence) * interval
            let now = MonotonicClock.nanoseconds()
            if intended > now { try? await Task.sleep(for: .nanoseconds(intended - now)) }
            let request = Broadcast.encode(Broadcast.Header(kind: .request, sequence: UInt64(sequence), sent: intended))
            do throws(ConnectionError) {
                try await Broadcast.send(request, on: asker)
            } catch {
                failure = "the asker's request \(sequence) failed: \(error)"
                break
            }
            if sequence >= warmup { sent[UInt64(sequence)] = intended }
        }
        if failure != nil { await asker.close() }
        let answered = await answers.value
        giveUp.cancel()
        await asker.close()
        return (sent, answered, failure)
    }

    private func usage(of server: (agent: FleetAgent, id: String)?) async -> ResourceUsage? {
        guard let server else { return nil }
        return try? await server.agent.usage(server.id, within: timeout)
    }

    func measure(_ addresses: [String], server: (agent: FleetAgent, id: String)?) async -> FleetReport {
        var rows = addresses.map { FleetReport.AgentRow(agent: $0) }
        // Connect, estimate each clock, prepare each share: every agent at once.
        let prepared = await withTaskGroup(of: (Int, Result<(FleetAgent, Int64, UInt64), FleetError>).self) { group in
            for (index, address) in addresses.enumerated() {
                group.addTask {
                    do {
                        let agent = try await FleetAgent.connect(address, within: timeout, wait: waitForAgents)
                        do {
                            let (offset, roundTrip) = try await agent.clockOffset(within: timeout)
                            // Connections are opened 64 at a time: allow a second per batch as well.
                            let batches = Double(load.connections / 64 + 1)
                            _ = try await agent.request(
                                "load \(load) \(backend) \(url)" + (samples ? " samples" : ""),
                                within: timeout + batches)
                            return (index, .success((agent, offset, roundTrip)))
                        } catch {
                            await agent.close()
                            throw error
                        }
                    } catch let error as FleetError {
                        return (index, .failure(error))
                    } catch {
                        return (index, .failure(FleetError("\(error)")))
                    }
                }
            }
            var results: [(Int, Result<(FleetAgent, Int64, UInt64), FleetError>)] = []
            for await result in group { results.append(result) }
            return results
        }
        var ready: [(index: Int, agent: FleetAgent, offset: Int64, roundTrip: UInt64)] = []
        for (index, result) in prepared {
            switch result {
            case .success(let (agent, offset, roundTrip)):
                rows[index].clockOffsetNanoseconds = offset
                rows[index].clockRoundTripNanoseconds = roundTrip
                rows[index].connections = load.connections
                ready.append((index, agent, offset, roundTrip))
            case .failure(let error): rows[index].error = error.message
            }
        }
        let serverBefore = await usage(of: server)
        // The window opens `lead` from now on this host's clock; each agent is told how long after it reads
        // its order, less the order's way there (half the clock round trip).
        let slowest = ready.map(\.roundTrip).max() ?? 0
        let lead = UInt64(50_000_000) + 4 * slowest
        let opens = MonotonicClock.nanoseconds() + lead
        let windowMs = Int(window * 1000)
        // The server's threads and memory are read halfway through the window, with every connection busy.
        let halfway = Task { () -> ResourceUsage? in
            let at = opens + UInt64(window * 0.5e9)
            let now = MonotonicClock.nanoseconds()
            if at > now { try? await Task.sleep(for: .nanoseconds(at - now)) }
            return await usage(of: server)
        }
        // A broadcast load: this process is the asker, its requests timed on this clock from the window's start.
        var broadcast: (load: BroadcastLoad, warmup: Int, total: Int, interval: UInt64)?
        if case .broadcast(let shape) = load {
            let total = shape.warmup + shape.measured(fallbackSeconds: window)
            broadcast = (shape, shape.warmup, total, UInt64(1e9 / shape.perSecond))
        }
        let orders = broadcast
        let entries = ready
        let agentsDone = Task {
            await withTaskGroup(of: (Int, Result<FleetShare.Outcome, FleetError>).self) { group in
                for entry in entries {
                    group.addTask {
                        let now = MonotonicClock.nanoseconds()
                        let delay = opens > now + entry.roundTrip / 2 ? opens - now - entry.roundTrip / 2 : 0
                        var order = "go \(delay) \(windowMs)"
                        var limit = Double(lead) / 1e9 + window + timeout
                        if let orders {
                            order += " \(orders.total) \(orders.warmup) \(entry.offset)"
                            limit += 20
                        }
                        do {
                            let answer = try await entry.agent.request(order, within: limit)
                            let outcome = try JSONDecoder().decode(FleetShare.Outcome.self, from: Data(answer.utf8))
                            return (entry.index, .success(outcome))
                        } catch let error as FleetError {
                            return (entry.index, .failure(FleetError("died or went silent mid-run: " + error.message)))
                        } catch {
                            return (entry.index, .failure(FleetError("answered what is not a result: \(error)")))
                        }
                    }
                }
                var results: [(Int, Result<FleetShare.Outcome, FleetError>)] = []
                for await result in group { results.append(result) }
                return results
            }
        }
        var asked: (sent: [UInt64: UInt64], answers: [UInt64], error: String?)?
        if let broadcast {
            asked = await ask(broadcast.total, warmup: broadcast.warmup, every: broadcast.interval, from: opens)
        }
        let outcomes = await agentsDone.value
        let serverAfter = await usage(of: server)
        let serverDuring = await halfway.value
        for entry in ready { await entry.agent.close() }

        var merged = LatencySummary.makeHistogram()
        var starts: [Int64] = []
        var (count, lost, agentsMerged) = (0, 0, 0)
        for (index, result) in outcomes {
            switch result {
            case .success(let outcome):
                let histogram = outcome.histogram.histogram
                merged.add(histogram)
                count += outcome.count
                lost += outcome.lost
                agentsMerged += 1
                rows[index].outcome = outcome
                rows[index].latency = outcome.count > 0 ? LatencySummary(histogram) : nil
                rows[index].perSecond = Double(outcome.count) / window
                if let offset = rows[index].clockOffsetNanoseconds {
                    let start = Int64(bitPattern: outcome.start) - offset
                    rows[index].startSkewNanoseconds = start - Int64(bitPattern: opens)
                    starts.append(start)
                }
            case .failure(let error):
                rows[index].error = error.message
            }
        }
        var report = FleetReport(
            load: "\(load)", backend: backend, target: url, windowSeconds: window, agents: rows,
            merged: .init(
                agents: agentsMerged, count: count, lost: lost, perSecond: Double(count) / window,
                latency: count > 0 ? LatencySummary(merged) : nil, histogram: SparseHistogram(merged),
                startSpreadNanoseconds: starts.isEmpty ? nil : UInt64(starts.max()! - starts.min()!)))
        if let asked {
            let reports = outcomes.compactMap { try? $0.1.get().broadcast }
            report.broadcast = BroadcastFigures.merge(reports, sent: asked.sent, answers: asked.answers).figures
            report.askerError = asked.error
        }
        if server != nil, let before = serverBefore, let after = serverAfter {
            let cpu = after.cpuNanoseconds &- before.cpuNanoseconds
            report.server = .init(
                backend: serverBackend ?? "", cpuNanoseconds: cpu,
                cpuPerMessageNanoseconds: count > 0 ? Double(cpu) / Double(count) : nil,
                residentKiB: serverDuring?.residentKiB, threads: serverDuring?.threads ?? 0)
        }
        return report
    }

}

struct FleetError: Error, CustomStringConvertible {
    let message: String
    init(_ message: String) { self.message = message }
    var description: String { message }
}

/// One agent's control connection, each request with a time limit: past it the connection is closed, which ends
/// the request waiting on it.
actor FleetAgent {
    private let channel: LineChannel
    nonisolated let address: String
    private nonisolated let connection: any Connection

    private init(_ connection: any Connection, address: String) {
        channel = LineChannel(connection)
        self.connection = connection
        self.address = address
    }

    /// Connects to `address`, each attempt within `seconds`; an agent that is not there yet (a pod still
    /// starting) is tried again every half second for `wait` seconds.
    static func connect(_ address: String, within seconds: Double, wait: Double = 0) async throws -> FleetAgent {
        let until = MonotonicClock.nanoseconds() + UInt64(max(0, wait) * 1e9)
        while true {
            do {
                return try await attempt(address, within: seconds)
            } catch {
                guard MonotonicClock.nanoseconds() < until else { throw error }
                try await Task.sleep(for: .milliseconds(500))
            }
        }
    }

    private static func attempt(_ address: String, within seconds: Double) async throws -> FleetAgent {
        let endpoint: Endpoint
        do {
            endpoint = try Endpoint(url: address.contains("://") ? address : "tcp://\(address)")
        } catch {
            throw FleetError("not an address: \(error)")
        }
        let attempt = Task { () throws(ConnectionError) -> any Connection in
            try await Backend.async.connect(to: endpoint)
        }
        let limit = Task {
            try await Task.sleep(for: .seconds(seconds))
            attempt.cancel()
        }
        defer { limit.cancel() }
        do {
            return FleetAgent(try await attempt.value, address: address)
        } catch {
            throw FleetError("unreachable: \(error)")
        }
    }

    /// One request, one answer (what follows `ok `); `error ...`, a closed connection or no answer within
    /// `seconds` throw.
    func request(_ line: String, within seconds: Double) async throws -> String {
        let connection = connection
        let until = MonotonicClock.nanoseconds() + UInt64(seconds * 1e9)
        let limit = Task {
            try await Task.sleep(for: .seconds(seconds))
            await connection.close()
        }
        defer { limit.cancel() }
        let answer: String?
        do {
            try await channel.send(line)
            answer = try await channel.readLine()
        } catch {
            let verb = line.split(separator: " ").first ?? ""
            throw FleetError(
                MonotonicClock.nanoseconds() >= until
                    ? "no answer to `\(verb)` within \(fixed(seconds, 1)) s" : "\(error)")
        }
        guard let answer else {
            throw FleetError("the control connection closed during `\(line.split(separator: " ").first ?? "")`")
        }
        guard answer.hasPrefix("ok") else { throw FleetError("refused `\(line)`: \(answer)") }
        return String(answer.dropFirst(3))
    }

    /// The agent's monotonic clock minus ours, from the exchange of nine with the shortest round trip (NTP's
    /// way: the agent read its clock halfway through the round trip, give or take half of it).
    func clockOffset(within seconds: Double) async throws -> (offset: Int64, roundTrip: UInt64) {
        var best: (offset: Int64, roundTrip: UInt64)?
        for _ in 0..<9 {
            let sent = MonotonicClock.nanoseconds()
            let answer = try await request("clock", within: seconds)
            let back = MonotonicClock.nanoseconds()
            guard let theirs = UInt64(answer) else { throw FleetError("answered `clock` with '\(answer)'") }
            let roundTrip = back - sent
            let offset = Int64(bitPattern: theirs) - Int64(bitPattern: sent + roundTrip / 2)
            if best == nil || roundTrip < best!.roundTrip { best = (offset, roundTrip) }
        }
        return best!
    }

    func usage(_ id: String, within seconds: Double) async throws -> ResourceUsage {
        try JSONDecoder().decode(ResourceUsage.self, from: Data(try await request("usage \(id)", within: seconds).utf8))
    }

    func close() async { await connection.close() }
}
