import ArgumentParser
import BenchmarkDriver
import Foundation
import NativeStyles
import SocketStyles

struct Ping: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Measure round-trip latency against an echo server (closed loop, HdrHistogram).",
        discussion: """
            Sends --size bytes, waits for the whole echo, repeats --count times after --warmup round trips. \
            Prints count, min, p50, p90, p99, p99.9, max in microseconds.
            """
    )

    @Argument(help: "The echo server, e.g. tcp://127.0.0.1:9000.")
    var url: String

    @Option(help: "The connection style: \(Backend.allCases.map(\.rawValue).joined(separator: ", ")).")
    var backend: String = "bsd"

    @Option(help: "Bytes per message.")
    var size: Int = 64

    @Option(help: "Measured round trips.")
    var count: Int = 10_000

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

    @OptionGroup var tls: TLSClientOptions

    @Flag(
        help:
            "Ping in the backend's own style instead of through Connection (tcp; nio also ws): compare with `serve --native`."
    )
    var native = false

    @Flag(help: "Print the result as JSON.")
    var json = false

    func validate() throws {
        guard size >= 1, size <= 16 * 1024 * 1024 else { throw ValidationError("--size must be 1 to 16777216") }
        guard count >= 1 else { throw ValidationError("--count must be at least 1") }
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
        do throws(ConnectionError) {
            if native {
                guard nodelay, tls.configuration == TLSConfiguration() else {
                    throw ConnectionError(.unsupported, "--native pings plain tcp (nio: also ws) with TCP_NODELAY")
                }
                result = try await backend.nativePingPong(to: endpoint, size: size, count: count, warmup: warmup)
            } else {
                var tlsConfiguration = tls.configuration
                var webSocket = WebSocketOptions()
                if let limit {
                    tlsConfiguration.handshakeTimeout = limit
                    webSocket.handshakeTimeout = limit
                }
                let connection = try await backend.connect(
                    to: endpoint, options: options, webSocket: webSocket, tls: tlsConfiguration)
                do throws(ConnectionError) {
                    result = try await PingRunner(size: size, count: count, warmup: warmup, timeout: limit).run(
                        on: connection)
                } catch {
                    await connection.close()
                    throw error
                }
                await connection.close()
            }
        } catch {
            throw fail(error.description)
        }
        let report = PingReport(
            backend: backend.rawValue, url: endpoint.description, transport: endpoint.transport.rawValue, size: size,
            warmup: warmup, tcpNoDelay: nodelay, cpu: cpu, latency: result.latency, lost: result.lost,
            roundTripsPerSecond: result.roundTripsPerSecond)
        if json {
            try Console.json(report)
        } else {
            Console.line(report.text)
        }
    }
}

/// What `sockbench ping --json` prints. Latencies in nanoseconds.
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

    var text: String {
        var lines = [
            "\(backend) \(url) size=\(size)B warmup=\(warmup) count=\(latency.count)"
                + (transport == "tcp" ? " TCP_NODELAY=\(tcpNoDelay ? "on" : "off")" : "")
                + (cpu.map { " cpu=\($0)" } ?? ""),
            "round trip (us): min \(microseconds(latency.min))  p50 \(microseconds(latency.p50))  p90 \(microseconds(latency.p90))  p99 \(microseconds(latency.p99))  p99.9 \(microseconds(latency.p999))  max \(microseconds(latency.max))",
            "mean \(microseconds(UInt64(latency.mean))) us, stddev \(microseconds(UInt64(latency.stddev))) us, \(Int(roundTripsPerSecond)) round trips/s"
                + (lost > 0 ? ", \(lost) datagram(s) lost and re-sent" : ""),
        ]
        if !latency.isMeaningful(percentile: 99.9) {
            lines.append("note: \(latency.count) samples are too few for p99.9 to mean much (1,000 needed)")
        }
        return lines.joined(separator: "\n")
    }
}
