import ArgumentParser
import BenchmarkDriver
import Foundation
import SocketStyles

struct PumpCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pump",
        abstract: "Measure one-way bulk throughput to a sink server (`sockbench serve URL --sink`), as iperf3 does.",
        discussion: """
            Writes --size bytes at a time for --time seconds (10 by default) or until --bytes went out, then asks \
            the sink what arrived: the rate counts bytes delivered, not bytes queued. udp: datagrams of --size \
            bytes, each numbered, handed over --batch at a time (sendmmsg, and UDP GSO where the kernel has it); \
            the sink's counts give received, lost and reordered. --interval prints what \
            the sender wrote in each interval, as iperf3's -i does; SIGINT or SIGTERM ends the run early with \
            its summary. The CPU figure is this client's (the sink's is its own process's).
            """
    )

    @Argument(help: "The sink server, e.g. tcp://127.0.0.1:9000 (`sockbench serve URL --sink`).")
    var url: String

    @Option(help: "The connection style: \(Backend.allCases.map(\.rawValue).joined(separator: ", ")).")
    var backend: String = Backend.bsd.name

    @Option(help: "Bytes per write (default 65536; udp: 1400).")
    var size: Int?

    @Option(help: "Run for this many seconds (default 10; not with --bytes).")
    var time: Double?

    @Option(help: "Send this many bytes instead of running for a --time.")
    var bytes: Int?

    @Option(help: "Print a line every this many seconds: what the sender wrote in that interval.")
    var interval: Double?

    @Option(help: "udp: datagrams per send(batch:) (sendmmsg, UDP GSO); 1 sends each on its own.")
    var batch: Int = PumpRunner.defaultBatch

    @Option(help: "Pin this client to a CPU.")
    var cpu: Int?

    @OptionGroup var buffers: SocketBufferOption

    @Option(help: "Seconds the connect and the TLS and WebSocket handshakes may take.")
    var timeout: Double = 10

    @OptionGroup var tls: TLSClientOptions

    @Flag(help: "Print the result as JSON (interval lines go to standard error).")
    var json = false

    func validate() throws {
        if let size, size < 1 || size > 16 * 1024 * 1024 { throw ValidationError("--size must be 1 to 16777216") }
        if time != nil && bytes != nil { throw ValidationError("give --time or --bytes, not both") }
        if let time, time <= 0 { throw ValidationError("--time must be more than 0 seconds") }
        if let bytes, bytes < 1 { throw ValidationError("--bytes must be at least 1") }
        if batch < 1 || batch > 1024 { throw ValidationError("--batch must be 1 to 1024") }
        if let interval, interval <= 0 { throw ValidationError("--interval must be more than 0 seconds") }
        guard timeout > 0 else { throw ValidationError("--timeout must be more than 0 seconds") }
    }

    func run() async throws {
        let (endpoint, backend) = try parseTarget(url: url, backend: backend)
        let size = size ?? (endpoint.transport == .udp ? 1400 : 65_536)
        if endpoint.transport == .udp && size > 65_507 {
            throw fail("--size \(size) exceeds the largest UDP datagram over IPv4 (65507 bytes)")
        }
        try pin(toCPU: cpu)
        let limit = Duration.milliseconds(Int64(timeout * 1000))
        var tlsConfiguration = tls.configuration
        tlsConfiguration.handshakeTimeout = limit
        let options = ConnectionOptions.with {
            $0.connectTimeout = limit
            buffers.apply(to: &$0)
        }
        let webSocket = WebSocketOptions.with { $0.handshakeTimeout = limit }

        let control = RunControl<PumpRunner.Interval>(
            seconds: bytes == nil ? (time ?? 10) : nil, json: json, line: Self.intervalLine)
        var runner = PumpRunner(size: size, totalBytes: bytes ?? Int.max / 2)
        runner.stop = control.stop
        runner.batch = batch
        if let interval {
            runner.reportEvery = .milliseconds(Int64(interval * 1000))
            runner.onInterval = control.report
        }
        let before = ResourceUsage.read()
        let result: ScenarioResult
        do throws(ConnectionError) {
            let connection = try await backend.connect(
                to: endpoint, options: options, webSocket: webSocket, tls: tlsConfiguration)
            do throws(ConnectionError) {
                result = try await runner.run(on: connection)
            } catch {
                await connection.close()
                throw error
            }
            await connection.close()
        } catch {
            await control.finish()
            throw fail(error.description)
        }
        await control.finish()
        let after = ResourceUsage.read()
        let cpu = before.flatMap { before in after.map { Double($0.since(before).cpuNanoseconds) / 1e9 } }
        let report = PumpReport(
            backend: backend.rawValue, url: endpoint.description, transport: endpoint.transport.rawValue, size: size,
            messages: result.messages, seconds: Double(result.elapsedNanoseconds) / 1e9,
            bytesPerSecond: result.bytesPerSecond ?? 0, messagesPerSecond: result.messagesPerSecond ?? 0,
            received: result.received, lost: result.lost, reordered: result.reordered,
            kernelReceiveBufferDrops: result.kernelReceiveBufferDrops, clientCPUSeconds: cpu,
            stoppedBy: control.stoppedBy)
        if json {
            try Console.json(report)
        } else {
            Console.line(report.text)
        }
    }

    /// One `--interval` line: the interval, what the sender wrote, its rate.
    static func intervalLine(_ interval: PumpRunner.Interval) -> String {
        let seconds = Double((interval.to - interval.from).wholeNanoseconds) / 1e9
        let rate = Double(interval.bytes) / max(1e-9, seconds)
        return RunControl<PumpRunner.Interval>.span(interval.from, interval.to)
            + "\(interval.messages) writes, \(interval.bytes) bytes, \(fixed(rate / 1e6, 1)) MB/s written"
    }
}

/// What `sockbench pump --json` prints.
struct PumpReport: Codable {
    var backend: String
    var url: String
    var transport: String
    var size: Int
    /// Writes (udp: datagrams) sent.
    var messages: Int
    /// From the first write to the sink's count (udp: to the last datagram sent).
    var seconds: Double
    /// tcp, tls, ws: bytes the sink counted, per second; udp: bytes received per second of sending.
    var bytesPerSecond: Double
    var messagesPerSecond: Double
    /// udp: datagrams the sink received, lost, reordered, and the receive-buffer drops the kernel counted.
    var received: Int?
    var lost: Int?
    var reordered: Int?
    var kernelReceiveBufferDrops: Int?
    var clientCPUSeconds: Double?
    var stoppedBy: String?

    var text: String {
        var lines = [
            "\(backend) \(url) size=\(size)B: \(messages) writes in \(fixed(seconds, 2)) s: "
                + "\(fixed(bytesPerSecond / 1e6, 1)) MB/s (\(fixed(bytesPerSecond * 8 / 1e9, 2)) Gbit/s), "
                + "\(Int(messagesPerSecond)) writes/s"
                + (clientCPUSeconds.map { ", client CPU \(fixed($0, 2)) s" } ?? "")
        ]
        if let received, let lost {
            lines.append(
                "udp: \(received) of \(messages) datagrams received, \(lost) lost, \(reordered ?? 0) reordered"
                    + (kernelReceiveBufferDrops.map { ", \($0) dropped by a full receive buffer (kernel count)" } ?? "")
            )
        }
        if let stoppedBy { lines.append("\(stoppedBy) after \(messages) writes") }
        return lines.joined(separator: "\n")
    }
}
