import ArgumentParser
import BenchmarkDriver
import ConnectionTestKit
import Foundation
import Histogram
import SocketStyles

struct Compare: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Round-trip latency of every backend x transport, side by side, in one run.",
        discussion: """
            Starts one echo server per backend x transport in separate processes (same backend on both ends), \
            then runs closed-loop ping-pong against each, interleaved, --repetitions times, and prints the \
            median of each percentile with the spread of p50 across repetitions.
            """
    )

    @Option(help: "Comma-separated backends, or `all`.")
    var backends: String = "all"

    @Option(help: "Comma-separated transports: tcp, udp, ws, tls, wss.")
    var transports: String = "tcp,udp,ws"

    @Option(help: "Bytes per message.")
    var size: Int = 64

    @Option(help: "Measured round trips per repetition.")
    var count: Int = 5_000

    @Option(help: "Round trips before measuring, per repetition.")
    var warmup: Int = 500

    @Option(help: "Connections opened (and closed) per repetition to time the handshake (TCP, + TLS, + upgrade).")
    var connects: Int = 50

    @Option(help: "Repetitions (backends interleaved in each).")
    var repetitions: Int = 3

    @Option(help: "CPU placement: `same` (client and server on one CPU), `cross` (different CPUs) or `none`.")
    var placement: Placement = .same

    @Option(help: "Write results.json to this directory.")
    var out: String?

    @Flag(inversion: .prefixedNo, help: "Also run the C floor (blocking C ping-pong against a C echo server).")
    var floor = true

    enum Placement: String, ExpressibleByArgument, Codable {
        case same, cross, none
    }

    struct Row: Codable {
        var backend: String
        var transport: String
        var size: Int
        var repetitions: [LatencySummary]
        var median: LatencySummary
        var lost: Int
        var roundTripsPerSecond: Double
        /// Median of the per-repetition median time to connect (TCP handshake, plus TLS, plus WebSocket
        /// upgrade as the transport has them), nanoseconds.
        var connectNanoseconds: UInt64?
    }

    func run() async throws {
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
        for name in transports.split(separator: ",") {
            guard let transport = Transport(rawValue: String(name)) else {
                throw fail("unknown transport '\(name)' (tcp, udp, ws, tls, wss)")
            }
            chosenTransports.append(transport)
        }
        let (serverCPU, clientCPU): (Int?, Int?) =
            switch placement {
            case .same: (Syscall.cpuCount - 1, Syscall.cpuCount - 1)
            case .cross: (0, min(1, Syscall.cpuCount - 1))
            case .none: (nil, nil)
            }
        try pin(toCPU: clientCPU)

        var combos: [(Backend?, Transport)] = []
        if floor {
            for transport in chosenTransports where transport == .tcp || transport == .udp {
                combos.append((nil, transport))
            }
        }
        for backend in chosenBackends {
            for transport in chosenTransports where backend.transports.contains(transport) {
                combos.append((backend, transport))
            }
        }
        guard !combos.isEmpty else { throw fail("nothing to compare") }

        Console.error(
            "sockbench compare: \(combos.count) combination(s) x \(repetitions) repetition(s), \(count) round trips of \(size) B each, placement \(placement.rawValue)"
                + (serverCPU.map { " (server cpu \($0), client cpu \(clientCPU!))" } ?? ""))
        // tls and wss: a throwaway CA and server certificate for this run (deleted at the end); the client
        // verifies the server against that CA, as a real client would.
        let certificates = chosenTransports.contains(where: \.isSecure) ? try TestCertificates.make() : nil
        defer { certificates?.remove() }
        let clientTLS = certificates?.client ?? TLSConfiguration()
        var servers: [String: ChildServer] = [:]
        defer { for server in servers.values { server.stop() } }
        for (backend, transport) in combos {
            let tlsArguments =
                transport.isSecure
                ? ["--cert", certificates!.server.certificate, "--key", certificates!.server.key] : []
            servers[Self.key(backend, transport)] = try ChildServer.start(
                backend: backend, url: "\(transport)://127.0.0.1:0", cpu: serverCPU, extraArguments: tlsArguments)
        }
        var connectTimes: [String: [UInt64]] = [:]

        var results: [String: [PingRunner.Result]] = [:]
        for repetition in 0..<repetitions {
            // Rotate the order each repetition so no backend always runs first (or last).
            let order = combos.indices.map { combos[($0 + repetition) % combos.count] }
            for (backend, transport) in order {
                let key = Self.key(backend, transport)
                let endpoint = servers[key]!.endpoint
                Console.error("  [\(repetition + 1)/\(repetitions)] \(key) ...")
                do throws(ConnectionError) {
                    guard let backend else {
                        let result = try await runFloorPing(
                            endpoint: endpoint, size: size, count: count, warmup: warmup)
                        results[key, default: []].append(result)
                        continue
                    }
                    if connects > 0 {
                        connectTimes[key, default: []].append(
                            try await medianConnectTime(backend, endpoint, tls: clientTLS))
                    }
                    let connection = try await backend.connect(to: endpoint, tls: clientTLS)
                    do throws(ConnectionError) {
                        let result = try await PingRunner(size: size, count: count, warmup: warmup).run(on: connection)
                        results[key, default: []].append(result)
                    } catch {
                        await connection.close()
                        throw error
                    }
                    await connection.close()
                } catch {
                    throw fail("\(key): \(error)")
                }
            }
        }

        var rows: [Row] = []
        for (backend, transport) in combos {
            let runs = results[Self.key(backend, transport)]!
            rows.append(
                Row(
                    backend: backend?.rawValue ?? Self.floorName, transport: transport.rawValue, size: size,
                    repetitions: runs.map(\.latency), median: median(runs.map(\.latency)),
                    lost: runs.map(\.lost).reduce(0, +),
                    roundTripsPerSecond: runs.map(\.roundTripsPerSecond).sorted()[runs.count / 2],
                    connectNanoseconds: connectTimes[Self.key(backend, transport)].map { $0.sorted()[$0.count / 2] }))
        }
        Console.line(table(rows))
        if let out {
            try FileManager.default.createDirectory(atPath: out, withIntermediateDirectories: true)
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            let document = CompareDocument(
                placement: placement, serverCPU: serverCPU, clientCPU: clientCPU, size: size, count: count,
                warmup: warmup, repetitions: repetitions, tcpNoDelay: true, rows: rows)
            try encoder.encode(document).write(to: URL(fileURLWithPath: out + "/results.json"))
            Console.error("wrote \(out)/results.json")
        }
    }

    static let floorName = "c-floor"

    /// Opens and closes `connects` connections one after another; returns the median time the connect call
    /// took (resolution is skipped: the endpoint is an address).
    func medianConnectTime(
        _ backend: Backend, _ endpoint: Endpoint, tls: TLSConfiguration
    ) async throws(ConnectionError) -> UInt64 {
        var times: [UInt64] = []
        for _ in 0..<connects {
            let start = MonotonicClock.nanoseconds()
            let connection = try await backend.connect(to: endpoint, tls: tls)
            times.append(MonotonicClock.nanoseconds() - start)  // UDP: no handshake, only the peer is fixed
            await connection.close()
        }
        return times.sorted()[times.count / 2]
    }

    static func key(_ backend: Backend?, _ transport: Transport) -> String {
        "\(backend?.rawValue ?? floorName)/\(transport)"
    }

    struct CompareDocument: Codable {
        var placement: Placement
        var serverCPU: Int?
        var clientCPU: Int?
        var size: Int
        var count: Int
        var warmup: Int
        var repetitions: Int
        var tcpNoDelay: Bool
        var rows: [Row]
    }

    /// The median of each field across repetitions.
    func median(_ runs: [LatencySummary]) -> LatencySummary {
        func mid(_ values: [UInt64]) -> UInt64 { values.sorted()[values.count / 2] }
        var result = runs[0]
        result.count = runs.map(\.count).reduce(0, +)
        result.min = runs.map(\.min).min()!
        result.p50 = mid(runs.map(\.p50))
        result.p90 = mid(runs.map(\.p90))
        result.p99 = mid(runs.map(\.p99))
        result.p999 = mid(runs.map(\.p999))
        result.p9999 = mid(runs.map(\.p9999))
        result.max = runs.map(\.max).max()!
        result.mean = runs.map(\.mean).sorted()[runs.count / 2]
        result.stddev = runs.map(\.stddev).sorted()[runs.count / 2]
        return result
    }

    func table(_ rows: [Row]) -> String {
        let header = [
            "backend", "transport", "size", "p50 us", "x floor", "p50 spread", "p90 us", "p99 us", "p99.9 us", "max us",
            "rt/s", "lost", "connect us",
        ]
        var floors: [String: UInt64] = [:]
        for row in rows where row.backend == Self.floorName { floors[row.transport] = row.median.p50 }
        var cells: [[String]] = [header]
        for row in rows {
            let p50s = row.repetitions.map(\.p50)
            cells.append([
                row.backend, row.transport, "\(row.size)", microseconds(row.median.p50),
                floors[row.transport == "udp" ? "udp" : "tcp"].map {
                    fixed(Double(row.median.p50) / Double(max(1, $0))) + "x"
                } ?? "-",
                "\(microseconds(p50s.min()!))-\(microseconds(p50s.max()!))", microseconds(row.median.p90),
                microseconds(row.median.p99), microseconds(row.median.p999), microseconds(row.median.max),
                "\(Int(row.roundTripsPerSecond))", "\(row.lost)", row.connectNanoseconds.map(microseconds) ?? "-",
            ])
        }
        let widths = header.indices.map { column in cells.map { $0[column].count }.max()! }
        return cells.enumerated().map { index, row in
            let line = row.enumerated().map { column, cell in
                column < 2
                    ? cell.padding(toLength: widths[column], withPad: " ", startingAt: 0)
                    : String(repeating: " ", count: widths[column] - cell.count) + cell
            }.joined(separator: "  ")
            return index == 0 ? line + "\n" + String(repeating: "-", count: line.count) : line
        }.joined(separator: "\n")
    }
}

/// A `sockbench serve` child process. It stops when we close its standard input (or on SIGTERM), so it cannot
/// outlive this process.
final class ChildServer {
    let process: Process
    let stdin: Pipe
    let endpoint: Endpoint

    private init(process: Process, stdin: Pipe, endpoint: Endpoint) {
        self.process = process
        self.stdin = stdin
        self.endpoint = endpoint
    }

    static func start(backend: Backend?, url: String, cpu: Int?, extraArguments: [String] = []) throws -> ChildServer {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executablePath())
        let command = backend.map { ["serve", url, "--backend", $0.rawValue] } ?? ["floor-serve", url]
        process.arguments =
            command + ["--exit-on-stdin-eof"] + (cpu.map { ["--cpu", "\($0)"] } ?? []) + extraArguments
        let input = Pipe()
        let output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        try process.run()
        // The first line is "listening on URL".
        var line: [UInt8] = []
        while true {
            let byte = output.fileHandleForReading.readData(ofLength: 1)
            if byte.isEmpty || byte.first == UInt8(ascii: "\n") { break }
            line.append(byte.first!)
        }
        let text = String(decoding: line, as: UTF8.self)
        guard text.hasPrefix("listening on "),
            let endpoint = try? Endpoint(url: String(text.dropFirst("listening on ".count)))
        else {
            process.terminate()
            throw fail("the \(backend?.rawValue ?? "C floor") server for \(url) did not start (it said: '\(text)')")
        }
        return ChildServer(process: process, stdin: input, endpoint: endpoint)
    }

    func stop() {
        try? stdin.fileHandleForWriting.close()
        process.waitUntilExit()
    }

    static func executablePath() -> String {
        var buffer = [CChar](repeating: 0, count: 4096)
        let count = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        guard count > 0 else { return CommandLine.arguments[0] }
        return String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
