import ArgumentParser
import BenchmarkDriver
import Foundation
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
                "--load: fanin-N (N up to 10000), rate-R, workload-NxRATE/s-SIZEB-SECONDSs or broadcast-N, not \(load)")
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
