import ArgumentParser
import Foundation
import NativeStyles
import SocketStyles

struct Proxy: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Relay clients to an upstream server, injecting delay, jitter, loss and more (no root needed).",
        discussion: """
            Accepts clients on LISTEN_URL and relays each over its own connection to UPSTREAM_URL, through \
            Connection on the chosen backend: tcp to tcp (half-close carried), udp to udp (one association per \
            client), tls to tcp or tcp to tls (TLS ended or started here), ws to ws (whole messages, close codes \
            carried). Faults apply in the --direction chosen, from a --seed: --delay and --jitter (ms), \
            --reorder (udp, ws), --loss (udp datagrams, ws messages: a tcp stream cannot lose bytes without \
            breaking), --duplicate (udp), --bandwidth (bytes/s), --cut-after (bytes, then both connections are \
            reset), --black-hole-after (bytes, then nothing is forwarded but the connections stay open). \
            With --native, the relay is written in the backend's own style instead (tcp to tcp, no faults): the \
            relay of compare's `proxy` scenario. Prints `listening on URL`; stops on SIGINT or SIGTERM. \
            docs/proxy.md shows uses.
            """
    )

    @Argument(help: "Where clients connect, e.g. tcp://127.0.0.1:0 (port 0: any free port).")
    var listen: String

    @Argument(help: "Where each client is relayed, e.g. tcp://127.0.0.1:9000.")
    var upstream: String

    @Option(help: "The connection style: \(Backend.allCases.map(\.rawValue).joined(separator: ", ")).")
    var backend: String = Backend.async.name

    @Flag(
        help:
            "Relay in the backend's own style (tcp -> tcp, no faults) instead of through Connection: the relay of compare's proxy scenario."
    )
    var native = false

    @Option(help: "Which way faults apply: both, up (client to upstream) or down (upstream to client).")
    var direction: String = "both"

    @Option(help: "Milliseconds added to every message or chunk.") var delay: Double = 0
    @Option(help: "Up to this many milliseconds more, at random.") var jitter: Double = 0
    @Flag(help: "With jitter, let messages overtake each other (udp, ws).") var reorder = false
    @Option(help: "Probability (0-1) of dropping a udp datagram or ws message.") var loss: Double = 0
    @Option(help: "Probability (0-1) of sending a udp datagram twice.") var duplicate: Double = 0
    @Option(help: "Bytes per second at most.") var bandwidth: Int?
    @Option(help: "Reset both connections (TCP RST) after this many bytes.") var cutAfter: Int?
    @Option(help: "Stop forwarding (connections stay open) after this many bytes.") var blackHoleAfter: Int?
    @Option(
        help: ArgumentHelp(
            "Hold the message carrying byte BYTE (from 0; tcp, tls: that byte and the rest of its chunk) for MS milliseconds more; what follows waits behind it unless --reorder.",
            valueName: "byte:ms"))
    var hold: String?
    @Option(help: "Seed of the random faults.") var seed: UInt64 = 1

    @Option(help: "Close a client pair idle for this many seconds (0: never).") var idleTimeout: Double = 300
    @Option(help: "The most clients relayed at once.") var maxConnections: Int = 16_384

    @Option(help: "Pin the proxy to this CPU.")
    var cpu: Int?

    @Flag(help: "Stop when standard input reaches its end (used by `sockbench compare` for its proxies).")
    var exitOnStdinEOF = false

    @Flag(help: "Print no line when stopping (compare's child servers: compare reports for them).")
    var quiet = false

    @OptionGroup var serverTLS: TLSServerOptions
    @OptionGroup var upstreamTLS: TLSClientOptions

    func validate() throws {
        guard ["both", "up", "down"].contains(direction) else {
            throw ValidationError("--direction must be both, up or down")
        }
        guard delay >= 0, jitter >= 0 else { throw ValidationError("--delay and --jitter must not be negative") }
        if let hold, Self.parseHold(hold) == nil {
            throw ValidationError("--hold must be BYTE:MS with BYTE >= 0 and MS > 0, as 160:50")
        }
    }

    static func parseHold(_ text: String) -> FaultPlan.Hold? {
        let parts = text.split(separator: ":")
        guard parts.count == 2, let byte = Int(parts[0]), byte >= 0, let ms = Double(parts[1]), ms > 0 else {
            return nil
        }
        return FaultPlan.Hold(byte: byte, duration: .microseconds(Int64(ms * 1000)))
    }

    func run() async throws {
        try pin(toCPU: cpu)
        let (listenEndpoint, backend) = try parseTarget(url: listen, backend: backend)
        let upstreamEndpoint: Endpoint
        do throws(ConnectionError) {
            upstreamEndpoint = try Endpoint(url: upstream)
        } catch {
            throw fail(error.description)
        }
        if native { return try await relayNatively(listenEndpoint, upstreamEndpoint, backend) }
        let plan = FaultPlan.with {
            $0.delay = .microseconds(Int64(delay * 1000))
            $0.jitter = .microseconds(Int64(jitter * 1000))
            $0.reorder = reorder
            $0.loss = loss
            $0.duplication = duplicate
            $0.bandwidth = bandwidth
            $0.cutAfterBytes = cutAfter
            $0.blackHoleAfterBytes = blackHoleAfter
            $0.hold = hold.flatMap(Self.parseHold)
        }
        let options = ConnectionOptions.with {
            $0.idleTimeout = idleTimeout > 0 ? .milliseconds(Int64(idleTimeout * 1000)) : nil
            $0.maximumConnections = maxConnections
        }
        let terminating = try serverTLS.configuration(for: listenEndpoint.transport)
        let relay: Relay
        do throws(ConnectionError) {
            relay = try await Relay.start(
                listen: listenEndpoint, upstream: upstreamEndpoint, backend: backend, options: options,
                serverTLS: terminating,
                upstreamTLS: upstreamTLS.configuration,
                toUpstream: direction == "down" ? FaultPlan() : plan, toClient: direction == "up" ? FaultPlan() : plan,
                seed: seed)
        } catch {
            throw fail(error.description)
        }
        Console.line("listening on \(relay.endpoint)")
        let reason = await StopSignal.wait(stdinEOF: exitOnStdinEOF)
        await relay.stop()
        let statistics = relay.statistics
        guard !quiet else { return }
        Console.error(
            "sockbench proxy: \(reason); \(statistics.clients) client(s), \(statistics.bytesToUpstream) bytes up, "
                + "\(statistics.bytesToClients) down, \(statistics.dropped) dropped, \(statistics.duplicated) duplicated, \(statistics.held) held, "
                + "\(statistics.upstreamFailures) upstream failure(s)")
    }

    private func relayNatively(_ listen: Endpoint, _ upstream: Endpoint, _ backend: Backend) async throws {
        let faults = delay > 0 || jitter > 0 || reorder || loss > 0 || duplicate > 0 || bandwidth != nil
        guard !faults, cutAfter == nil, blackHoleAfter == nil, hold == nil else {
            throw fail(
                "--native relays without faults; faults are injected by the relay through Connection (drop --native)")
        }
        let relay: any NativeRelay
        do throws(ConnectionError) {
            relay = try await backend.nativeRelay(listen: listen, upstream: upstream)
        } catch {
            throw fail(error.description)
        }
        Console.line("listening on \(relay.localEndpoint)")
        let reason = await StopSignal.wait(stdinEOF: exitOnStdinEOF)
        await relay.stop()
        guard !quiet else { return }
        Console.error("sockbench proxy --native: \(reason); \(relay.clients) client(s)")
    }
}
