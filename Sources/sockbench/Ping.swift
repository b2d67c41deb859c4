import ArgumentParser
import BenchmarkDriver
import Foundation
import Histogram
import NativeStyles
import SocketStyles

struct Ping: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Measure round-trip latency against an echo server (closed loop, HdrHistogram).",
        discussion: """
            Sends --size bytes, waits for the whole echo, repeats --count times (or for --time seconds) after \
            --warmup round trips. Prints count, min, p50, p90, p99, p99.9, max in microseconds; --interval adds \
            a line per interval, as iperf3's -i does. SIGINT or SIGTERM ends the run early with the summary of \
            what was measured. --hgrm and --samples write the distribution and every round trip to files.
            """
    )

    @Argument(help: "The echo server, e.g. tcp://127.0.0.1:9000.")
    var url: String

    @Option(help: "The connection style: \(Backend.allCases.map(\.rawValue).joined(separator: ", ")).")
    var backend: String = Backend.bsd.name

    @Option(help: "Bytes per message.")
    var size: Int = 64

    @Option(help: "Measured round trips (default 10000; not with --time).")
    var count: Int?

    @Option(help: "Run for this many seconds instead of a --count (the warm-up included).")
    var time: Double?

    @Option(help: "Print a line every this many seconds: the round trips and percentiles of that interval.")
    var interval: Double?

    @Option(help: "Write the percentile distribution to this file, HdrHistogram's .hgrm format (microseconds).")
    var hgrm: String?

    @Option(help: "Write every measured round trip to this file, one per line: index,nanoseconds.")
    var samples: String?

    @Option(help: "Round trips before measuring (not recorded).")
    var warmup: Int = 1_000

    @Option(help: "Pin this client to a CPU.")
    var cpu: Int?

    @Option(
        help:
            "Seconds the connect, a WebSocket or TLS handshake, and each round trip may take before ping gives up with an error (0: no limit for round trips)."
    )
    var timeout: Double = 10

    @Flag(inversion: .prefixedNo, help: "TCP_NODELAY (on by default, as for every backend).")
    var nodelay = true

    @Flag(help: "ws, wss: offer permessage-deflate (RFC 7692); the summary says whether the server agreed.")
    var deflate = false

    @OptionGroup var tls: TLSClientOptions

    @Flag(
        help:
            "Ping in the backend's own style instead of through Connection (tcp; \(Backend.nio.name) also ws, tls and wss): compare with `serve --native`."
    )
    var native = false

    @Flag(help: "Print the result as JSON.")
    var json = false

    func validate() throws {
        guard size >= 1, size <= 16 * 1024 * 1024 else { throw ValidationError("--size must be 1 to 16777216") }
        if let count, count < 1 { throw ValidationError("--count must be at least 1") }
        if count != nil && time != nil { throw ValidationError("give --count or --time, not both") }
        if let time, time <= 0 { throw ValidationError("--time must be more than 0 seconds") }
        if let interval, interval <= 0 { throw ValidationError("--interval must be more than 0 seconds") }
        if native && (time != nil || interval != nil || hgrm != nil || samples != nil) {
            throw ValidationError("--native runs a plain --count: no --time, --interval, --hgrm or --samples")
        }
        guard warmup >= 0 else { throw ValidationError("--warmup must not be negative") }
        guard timeout >= 0 else { throw ValidationError("--timeout must not be negative") }
    }

    func run() async throws {
        let (endpoint, backend) = try parseTarget(url: url, backend: backend)
        if endpoint.transport == .udp && size > 65_507 {
            throw fail("--size \(size) exceeds the largest UDP datagram over IPv4 (65507 bytes)")
        }
        try pin(toCPU: cpu)
        let limit: Duration? = timeout > 0 ? .milliseconds(Int64(timeout * 1000)) : nil
        let options = ConnectionOptions.with {
            $0.tcpNoDelay = nodelay
            if let limit { $0.connectTimeout = limit }
        }
        let result: PingRunner.Result
        // SIGINT or SIGTERM (or the end of --time) ends the loop between two round trips; the summary follows.
        let control = RunControl<PingRunner.Interval>(seconds: time, json: json, line: Self.intervalLine)
        do throws(ConnectionError) {
            if native {
                guard nodelay else {
                    throw ConnectionError(
                        .unsupported, "--native pings with TCP_NODELAY, as every native style sets it")
                }
                result = try await backend.nativePingPong(
                    to: endpoint, size: size, count: count ?? 10_000, warmup: warmup, tls: tls.configuration)
            } else {
                var tlsConfiguration = tls.configuration
                var webSocket = WebSocketOptions()
                if deflate { webSocket.deflate = WebSocketDeflateOptions() }
                if let limit {
                    tlsConfiguration.handshakeTimeout = limit
                    webSocket.handshakeTimeout = limit
                }
                let connection = try await backend.connect(
                    to: endpoint, options: options, webSocket: webSocket, tls: tlsConfiguration)
                if deflate {
                    let agreed = (connection as? WebSocketConnection)?.deflate
                    Console.error(
                        "permessage-deflate: \(agreed.map { "agreed (\($0))" } ?? "not agreed by the server")")
                }
                var runner = PingRunner(
                    size: size, count: count ?? (time != nil ? Int.max / 2 : 10_000), warmup: warmup, timeout: limit)
                runner.stop = control.stop
                runner.keepsSamples = samples != nil
                if let interval {
                    runner.reportEvery = .milliseconds(Int64(interval * 1000))
                    runner.onInterval = control.report
                }
                do throws(ConnectionError) {
                    result = try await runner.run(on: connection)
                } catch {
                    await connection.close()
                    throw error
                }
                await connection.close()
            }
        } catch {
            await control.finish()
            throw fail(error.description)
        }
        await control.finish()
        if result.latency.count == 0 {
            throw fail("no round trip was measured (stopped during the \(warmup) warm-up round trips)")
        }
        if let hgrm {
            var text = ""
            result.histogram.outputPercentileDistribution(to: &text, outputValueUnitScalingRatio: 1000)
            try write(text, to: hgrm, what: "--hgrm")
        }
        if let samples, let raw = result.samples {
            var text = ""
            text.reserveCapacity(raw.count * 12)
            for (index, value) in raw.enumerated() { text += "\(index),\(value)\n" }
            try write(text, to: samples, what: "--samples")
        }
        let report = PingReport(
            backend: backend.rawValue, url: endpoint.description, transport: endpoint.transport.rawValue, size: size,
            warmup: warmup, tcpNoDelay: nodelay, cpu: cpu, latency: result.latency, lost: result.lost,
            roundTripsPerSecond: result.roundTripsPerSecond, stoppedBy: control.stoppedBy)
        if json {
            try Console.json(report)
        } else {
            Console.line(report.text)
        }
    }

    private func write(_ text: String, to path: String, what: String) throws {
        do {
            try text.write(toFile: path, atomically: true, encoding: .utf8)
        } catch {
            throw fail("\(what) \(path): \(error.localizedDescription)")
        }
    }

    /// One `--interval` line, iperf3-like: the interval, its round trips, its percentiles in microseconds.
    static func intervalLine(_ interval: PingRunner.Interval) -> String {
        let latency = LatencySummary(interval.histogram)
        return RunControl<PingRunner.Interval>.span(interval.from, interval.to)
            + "\(latency.count) round trips  p50 \(microseconds(latency.p50))  p99 \(microseconds(latency.p99))  max \(microseconds(latency.max)) us"
    }
}

/// What `sockbench ping --json` prints. Latencies in nanoseconds (`latencyUnit`).
struct PingReport: Codable {
    var backend: String
    var url: String
    var transport: String
    var size: Int
    var warmup: Int
    var tcpNoDelay: Bool
    var cpu: Int?
    var latency: LatencySummary
    var lost: Int
    var roundTripsPerSecond: Double
    /// Why the run ended before its count ("stopped by SIGINT"), if it did.
    var stoppedBy: String?
    var latencyUnit = "ns"

    var text: String {
        var lines = [
            "\(backend) \(url) size=\(size)B warmup=\(warmup) count=\(latency.count)"
                + (transport == "tcp" ? " TCP_NODELAY=\(tcpNoDelay ? "on" : "off")" : "")
                + (cpu.map { " cpu=\($0)" } ?? ""),
            "round trip (us): min \(microseconds(latency.min))  p50 \(microseconds(latency.p50))  p90 \(microseconds(latency.p90))  p99 \(microseconds(latency.p99))  p99.9 \(microseconds(latency.p999))  max \(microseconds(latency.max))",
            "mean \(microseconds(UInt64(latency.mean))) us, stddev \(microseconds(UInt64(latency.stddev))) us, \(Int(roundTripsPerSecond)) round trips/s"
                + (lost > 0 ? ", \(lost) datagram(s) lost and re-sent" : ""),
        ]
        if let stoppedBy { lines.append("\(stoppedBy) after \(latency.count) measured round trips") }
        if !latency.isMeaningful(percentile: 99.9) {
            lines.append("note: \(latency.count) samples are too few for p99.9 to mean much (1,000 needed)")
        }
        return lines.joined(separator: "\n")
    }
}
