import ArgumentParser
import BenchmarkDriver
import Foundation
import SocketStyles

struct Soak: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract:
            "Check that an echo server returns every byte: numbered messages of random sizes, a window in flight.",
        discussion: """
            Sends sequence-numbered messages of random sizes (--min-size to --max-size) with up to --window of them \
            in flight, and checks every echoed byte. Counts verified, lost, duplicated, reordered and corrupted \
            messages. Over tcp, tls, ws and wss anything but all verified, in order, fails (exit 1); over udp, loss \
            and reordering are reported but only corruption and duplicates fail. Stops after --messages or --time, \
            whichever comes first.
            """
    )

    @Argument(help: "The echo server, e.g. ws://127.0.0.1:9000/ (start one with `sockbench serve`).")
    var url: String

    @Option(help: "The connection style: \(Backend.allCases.map(\.rawValue).joined(separator: ", ")).")
    var backend: String = Backend.bsd.name

    @Option(help: "Messages to send (0: no limit, then --time must be set).")
    var messages: Int = 10_000

    @Option(help: "Seconds to send for (0: no limit).")
    var time: Double = 0

    @Option(help: "Messages in flight at most.")
    var window: Int = 32

    @Option(help: "Smallest payload in bytes (a 16-byte header comes on top).")
    var minSize: Int = 0

    @Option(help: "Largest payload in bytes (udp: at most 65,491).")
    var maxSize: Int = 16_384

    @Option(help: "udp: seconds after which a datagram not echoed counts as lost.")
    var lossTimeout: Double = 1

    @Option(help: "Seed of sizes and payloads.")
    var seed: UInt64 = 0x5EED

    @Option(help: "Seconds the connect and a TLS or WebSocket handshake may take.")
    var timeout: Double = 10

    @OptionGroup var tls: TLSClientOptions

    @Flag(help: "Print the result as JSON.")
    var json = false

    func validate() throws {
        guard messages >= 0, time >= 0, messages > 0 || time > 0 else {
            throw ValidationError("set --messages or --time (or both) above 0")
        }
        guard window >= 1 else { throw ValidationError("--window must be at least 1") }
        guard minSize >= 0, maxSize >= minSize, maxSize <= 16 * 1024 * 1024 else {
            throw ValidationError("sizes must satisfy 0 <= --min-size <= --max-size <= 16777216")
        }
        guard lossTimeout > 0, timeout > 0 else {
            throw ValidationError("--loss-timeout and --timeout must be above 0")
        }
    }

    func run() async throws {
        let (endpoint, backend) = try parseTarget(url: url, backend: backend)
        if endpoint.transport == .udp && maxSize > 65_507 - 16 {
            throw fail("--max-size \(maxSize) does not fit a UDP datagram with its 16-byte header (65491 at most)")
        }
        let limit = Duration.milliseconds(Int64(timeout * 1000))
        var tlsConfiguration = tls.configuration
        tlsConfiguration.handshakeTimeout = limit
        let connection: any Connection
        do throws(ConnectionError) {
            connection = try await backend.connect(
                to: endpoint, options: .with { $0.connectTimeout = limit },
                webSocket: .with { $0.handshakeTimeout = limit }, tls: tlsConfiguration)
        } catch {
            throw fail(error.description)
        }
        var configuration = SoakRunner.Configuration(
            messages: messages > 0 ? messages : nil, duration: time > 0 ? .milliseconds(Int64(time * 1000)) : nil)
        configuration.window = window
        configuration.sizes = minSize...maxSize
        configuration.lossTimeout = .milliseconds(Int64(lossTimeout * 1000))
        configuration.seed = seed
        let report = await SoakRunner(configuration).run(on: connection)
        let reliable = endpoint.transport != .udp
        let passed = report.passed(reliable: reliable)
        if json {
            try Console.json(
                SoakOutput(
                    backend: backend.rawValue, url: endpoint.description, transport: endpoint.transport.rawValue,
                    passed: passed, report: report))
        } else {
            let rate = report.seconds > 0 ? Double(report.verified) / report.seconds : 0
            Console.line(
                "\(backend.rawValue) \(endpoint): sent \(report.sent), verified \(report.verified), lost \(report.lost), "
                    + "duplicated \(report.duplicated), reordered \(report.reordered), corrupted \(report.corrupted); "
                    + "\(report.bytesVerified) bytes verified in \(String(format: "%.2f", report.seconds)) s "
                    + "(\(Int(rate)) messages/s)")
            if let error = report.error { Console.line("stopped early: \(error)") }
            Console.line(passed ? "passed" : "FAILED")
        }
        if !passed { throw ExitCode(1) }
    }
}

/// What `sockbench soak --json` prints.
struct SoakOutput: Codable {
    var backend: String
    var url: String
    var transport: String
    var passed: Bool
    var report: SoakRunner.Report
}
