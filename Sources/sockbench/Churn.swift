import ArgumentParser
import BenchmarkDriver
import Foundation
import SocketStyles
import Synchronization

struct ChurnCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "churn",
        abstract: "Check that a server survives a churn of short connections: connect, one echo, end; many times.",
        discussion: """
            Opens --connections clients one after another (--lanes of them at a time), then --at-once of them \
            together. Each connects (with the TLS and WebSocket handshakes its URL has), sends --size bytes, checks the echo, and ends: tcp and tls \
            half-close and read to the server's end, ws and wss run the close handshake, udp (a new peer each time, \
            from a new port) closes its socket, a lost datagram or echo sent again. A warm-up comes first (a tenth \
            as many clients, and the burst). With --server-pid (a server on this machine) it prints the server's \
            resident memory and descriptors as it goes, and its growth per connection after the warm-up. Fails (exit \
            1) when any client was not served, when the server holds more descriptors at the end than after the \
            warm-up, or when --max-growth is set and the server grew by more per connection.
            """
    )

    @Argument(help: "The echo server, e.g. tcp://127.0.0.1:9000 (start one with `sockbench serve`).")
    var url: String

    @Option(help: "The clients' connection style: \(Backend.allCases.map(\.rawValue).joined(separator: ", ")).")
    var backend: String = Backend.async.name

    @Option(help: "Clients one after another.")
    var connections: Int = 10_000

    @Option(help: "Clients at once, after those.")
    var atOnce: Int = 0

    @Option(
        help:
            "How many of the clients one after another are alive at a time (each lane starts its next client when its last ends)."
    )
    var lanes: Int = 1

    @Option(
        help:
            "Clients one after another to warm up with, before memory is counted (default: a tenth of --connections); the warm-up ends with a burst of --at-once too."
    )
    var warmUpConnections: Int?

    @Option(help: "Bytes each client sends and expects back (udp: at most 65,507).")
    var size: Int = 64

    @Option(help: "Seconds one client's whole life may take.")
    var timeout: Double = 10

    @Option(help: "Seconds the whole churn may take (the clients left are then not started, and it fails).")
    var time: Double = 600

    @Option(help: "The server's process id, to print its memory and descriptors as the churn goes.")
    var serverPid: Int32?

    @Option(
        help: "With --server-pid: fail when the server grows by more than this many KiB a connection after the warm-up."
    )
    var maxGrowth: Double?

    @OptionGroup var tls: TLSClientOptions

    @Flag(help: "Print the result as JSON.")
    var json = false

    func validate() throws {
        guard connections >= 0, atOnce >= 0, connections + atOnce > 0 else {
            throw ValidationError("--connections and --at-once must be 0 or more, and not both 0")
        }
        guard lanes >= 1 else { throw ValidationError("--lanes must be 1 or more") }
        guard size >= 1, size <= 65_507 else { throw ValidationError("--size must be 1 to 65507") }
        guard timeout > 0, time > 0 else { throw ValidationError("--timeout and --time must be above 0") }
        if maxGrowth != nil && serverPid == nil { throw ValidationError("--max-growth needs --server-pid") }
    }

    func run() async throws {
        let (endpoint, backend) = try parseTarget(url: url, backend: backend)
        if let serverPid, ResourceUsage.read(pid: serverPid) == nil {
            throw fail("no process \(serverPid) to watch (--server-pid)")
        }
        let limit = Duration.milliseconds(Int64(timeout * 1000))
        let tlsConfiguration = {
            var configuration = tls.configuration
            configuration.handshakeTimeout = limit
            return configuration
        }()
        let connect: @Sendable () async throws(ConnectionError) -> any Connection = { () throws(ConnectionError) in
            try await backend.connect(
                to: endpoint, options: .with { $0.connectTimeout = limit },
                webSocket: .with { $0.handshakeTimeout = limit }, tls: tlsConfiguration)
        }
        var total = ChurnRunner.Outcome()
        let deadline = ContinuousClock.now + .milliseconds(Int64(time * 1000))
        let watch = ServerWatch(pid: serverPid, every: max(1, connections / 10))
        // The warm-up: a tenth as many clients one after another, and the same burst, so that the server's
        // allocator has grown to what the burst needs before memory is counted.
        var warmUp = ChurnRunner(
            sequential: warmUpConnections ?? connections / 10, concurrent: atOnce, lanes: lanes, size: size,
            cycleLimit: limit)
        warmUp.deadline = ContinuousClock.now.duration(to: deadline)
        let warm = await warmUp.run(transport: endpoint.transport, connect: connect)
        total.add(warm)
        if let first = watch.settled(0, descriptorsAtMost: nil), !json {
            Console.line("server after the warm-up (\(warm.completed) clients): \(first)")
        }
        var runner = ChurnRunner(
            sequential: connections, concurrent: atOnce, lanes: lanes, size: size, cycleLimit: limit)
        runner.deadline = ContinuousClock.now.duration(to: deadline)
        let outcome = await runner.run(
            transport: endpoint.transport,
            progress: { done in
                if done % 100 == 0 && !watch.isRunning { return false }
                guard done % watch.every == 0, done < connections, let sample = watch.sample(done) else { return true }
                if !json { Console.line("\(done) clients: server \(sample)") }
                return true
            },
            connect: connect)
        total.add(outcome)
        if !watch.isRunning {
            total.failures["the server process is gone", default: 0] += 1
        }
        let last = watch.settled(connections + atOnce, descriptorsAtMost: watch.samples.first?.descriptors)
        if let last, !json { Console.line("\(connections + atOnce) clients: server \(last)") }
        let growth = watch.growthPerConnection
        let descriptorsKept = watch.descriptorsKept
        let grewTooMuch = maxGrowth.map { limit in (growth ?? 0) > limit } ?? false
        let passed =
            total.allServed && total.failures.isEmpty && warm.notStarted + outcome.notStarted == 0 && !grewTooMuch
            && (descriptorsKept ?? 0) <= 0
        let output = ChurnOutput(
            backend: backend.rawValue, url: endpoint.description, passed: passed, warmUpCompleted: warm.completed,
            completed: outcome.completed, failed: total.failed, notStarted: warm.notStarted + outcome.notStarted,
            failures: total.failures, resentDatagrams: total.resent, sequentialPerSecond: outcome.sequentialPerSecond,
            burstSeconds: Double(outcome.concurrentNanoseconds) / 1e9,
            clientLife: outcome.completed > atOnce ? LatencySummary(outcome.cycle) : nil,
            burstClientLife: outcome.concurrentNanoseconds > 0 ? LatencySummary(outcome.burstCycle) : nil,
            server: watch.samples, serverKiBPerConnectionAfterWarmUp: growth, serverDescriptorsKept: descriptorsKept)
        if json {
            try Console.json(output)
        } else {
            print(output, atOnce: atOnce)
        }
        if !passed { throw ExitCode(1) }
    }

    private func print(_ output: ChurnOutput, atOnce: Int) {
        var line =
            "\(output.backend) client, \(output.url): \(output.completed) served after \(output.warmUpCompleted) to warm up, "
            + "\(output.failed) failed, \(output.notStarted) not started; "
            + "\(Int(output.sequentialPerSecond)) clients/s one after another"
            + (lanes > 1 ? " (\(lanes) lanes)" : "")
        if output.burstSeconds > 0 { line += String(format: ", %d at once in %.2f s", atOnce, output.burstSeconds) }
        if output.resentDatagrams > 0 { line += ", \(output.resentDatagrams) datagrams sent again" }
        Console.line(line)
        for (name, life) in [("a client's life", output.clientLife), ("in the burst", output.burstClientLife)] {
            guard let life else { continue }
            Console.line(
                String(
                    format: "%@: p50 %.1f us, p99 %.1f us, max %.1f us", name, Double(life.p50) / 1000,
                    Double(life.p99) / 1000, Double(life.max) / 1000))
        }
        for (text, count) in output.failures.sorted(by: { $0.value > $1.value }) {
            Console.line("  \(count) x \(text)")
        }
        if let growth = output.serverKiBPerConnectionAfterWarmUp {
            Console.line(String(format: "server memory after the warm-up: %+.3f KiB a connection", growth))
        }
        if let kept = output.serverDescriptorsKept, kept > 0 { Console.line("server kept \(kept) descriptors") }
        Console.line(output.passed ? "passed" : "FAILED")
    }
}

/// The server's resident memory and descriptors, sampled as a churn goes: first after the warm-up, last once the
/// churn is done.
final class ServerWatch: Sendable {
    struct Sample: Codable, Sendable, CustomStringConvertible {
        var clients: Int
        var residentKiB: UInt64
        var descriptors: Int
        var threads: UInt64
        var description: String { "\(residentKiB) KiB resident, \(descriptors) descriptors, \(threads) threads" }
    }
    let pid: Int32?
    /// Clients between samples.
    let every: Int
    private let taken = Guarded<[Sample]>([])

    init(pid: Int32?, every: Int) {
        self.pid = pid
        self.every = every
    }

    var samples: [Sample] { taken.withLock { $0 } }

    /// Whether the server process still runs (`true` when no process is watched).
    var isRunning: Bool {
        guard let pid else { return true }
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return false }
        let state = stat[stat.index(after: close)...].split(separator: " ").first
        return state != "Z" && state != "X"
    }

    /// A sample now, as of `clients` done.
    func sample(_ clients: Int) -> Sample? {
        guard let pid, let usage = ResourceUsage.read(pid: pid) else { return nil }
        let descriptors = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? -1
        let sample = Sample(
            clients: clients, residentKiB: usage.residentKiB ?? 0, descriptors: descriptors, threads: usage.threads)
        taken.withLock { $0.append(sample) }
        return sample
    }

    /// A sample once the server has closed what its last clients left (its descriptors at most `limit`, or their
    /// count steady for 100 ms), waiting at most 5 s.
    func settled(_ clients: Int, descriptorsAtMost limit: Int?) -> Sample? {
        guard let pid else { return nil }
        var previous = -1
        for _ in 0..<50 {
            let count = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? -1
            if let limit, count <= limit { break }
            if limit == nil && count == previous { break }
            previous = count
            usleep(100_000)
        }
        return sample(clients)
    }

    /// Resident memory's growth from the first sample to the last, KiB per client in between.
    var growthPerConnection: Double? {
        let all = samples
        guard let start = all.first, let end = all.last, end.clients > start.clients else { return nil }
        return (Double(end.residentKiB) - Double(start.residentKiB)) / Double(end.clients - start.clients)
    }

    /// Descriptors the server held at the end beyond those it held after the warm-up.
    var descriptorsKept: Int? {
        let all = samples
        guard let start = all.first, let end = all.last, all.count > 1 else { return nil }
        return end.descriptors - start.descriptors
    }
}

/// What `sockbench churn --json` prints.
struct ChurnOutput: Codable {
    var backend: String
    var url: String
    var passed: Bool
    var warmUpCompleted: Int
    var completed: Int
    var failed: Int
    var notStarted: Int
    var failures: [String: Int]
    var resentDatagrams: Int
    var sequentialPerSecond: Double
    var burstSeconds: Double
    var clientLife: LatencySummary?
    var burstClientLife: LatencySummary?
    var server: [ServerWatch.Sample]
    var serverKiBPerConnectionAfterWarmUp: Double?
    var serverDescriptorsKept: Int?
}
