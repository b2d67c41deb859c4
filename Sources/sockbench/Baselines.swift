import BenchmarkDriver
import Foundation
import POSIXSupport
import SocketStyles

/// iperf3 and sockperf, when installed (Debian packages iperf3 and sockperf), run in the same session as the
/// backends and folded into the report as rows: iperf3's single TCP stream in 64 KiB writes (pump-65536 tcp)
/// and its UDP sender in 1,400-byte datagrams (pump-1400 udp); sockperf's ping-pong (pingpong-64 tcp and udp).
/// sockperf runs with --full-rtt, so its rows are round trips like ours (by default it reports half of one).
enum Baselines {
    static func path(_ tool: String) -> String? {
        for directory in ["/usr/bin", "/usr/local/bin", "/bin"] where access("\(directory)/\(tool)", X_OK) == 0 {
            return "\(directory)/\(tool)"
        }
        return nil
    }

    /// A free loopback port: bound to port 0 and released. A tool started right after takes it (a race only
    /// with another process binding in the same instant).
    static func freePort(datagram: Bool) throws -> UInt16 {
        let socket = try BSDSocket.listen(on: try Endpoint(url: datagram ? "udp://127.0.0.1:0" : "tcp://127.0.0.1:0"))
        defer { socket.close() }
        return try socket.localAddress.port
    }

    /// Starts a server tool with its output discarded (a pipe nobody reads would fill and stop it).
    static func startServer(_ arguments: [String]) throws -> ChildProcess {
        let command = arguments.map { "'\($0)'" }.joined(separator: " ")
        return try ChildProcess(["/bin/sh", "-c", "exec \(command) >/dev/null 2>&1 </dev/null"])
    }

    /// Waits (up to two seconds) until something accepts TCP connections on `port`.
    static func waitForListener(port: UInt16) {
        for _ in 0..<200 {
            if let socket = try? BSDSocket.connect(to: try! Endpoint(url: "tcp://127.0.0.1:\(port)")) {
                socket.close()
                return
            }
            usleep(10_000)
        }
    }

    /// `taskset -c CPU` before a command when the plan pins.
    static func pinned(_ cpu: Int?, _ arguments: [String]) -> [String] {
        guard let cpu, let taskset = path("taskset") else { return arguments }
        return [taskset, "-c", "\(cpu)"] + arguments
    }

    /// Runs the baselines the plan's scenarios call for; returns rows keyed like the backends' runs.
    static func run(plan: Compare.Plan, seconds: Int) -> [RowKey: [ScenarioResult]] {
        var rows: [RowKey: [ScenarioResult]] = [:]
        let scenarios = Set(plan.scenarios.map(\.description))
        if let iperf3 = path("iperf3") {
            if scenarios.contains("pump-65536"), plan.transports.contains("tcp"),
                let result = try? iperf(iperf3, udp: false, size: 65_536, seconds: seconds, plan: plan)
            {
                rows[RowKey(scenario: .pump(size: 65_536), source: "iperf3", transport: "tcp")] = [result]
            }
            if scenarios.contains("pump-1400"), plan.transports.contains("udp"),
                let result = try? iperf(iperf3, udp: true, size: 1_400, seconds: seconds, plan: plan)
            {
                rows[RowKey(scenario: .pump(size: 1_400), source: "iperf3", transport: "udp")] = [result]
            }
        }
        if let sockperf = path("sockperf") {
            for perSecond in plan.scenarios.compactMap({ $0.as(RateScenario.self)?.perSecond }) {
                for transport in ["tcp", "udp"] where plan.transports.contains(transport) {
                    do {
                        rows[RowKey(scenario: .rate(perSecond: perSecond), source: "sockperf", transport: transport)] =
                            [
                                try runSockperf(
                                    sockperf, udp: transport == "udp", seconds: seconds, plan: plan,
                                    mode: ["ul", "--mps=\(perSecond)", "--reply-every", "1"])
                            ]
                    } catch {
                        Console.error("  sockperf under load \(transport): \(error) (row left out)")
                    }
                }
            }
        }
        if let sockperf = path("sockperf"), scenarios.contains("pingpong-64") {
            for transport in ["tcp", "udp"] where plan.transports.contains(transport) {
                do {
                    rows[RowKey(scenario: .pingpong(size: 64), source: "sockperf", transport: transport)] = [
                        try runSockperf(sockperf, udp: transport == "udp", seconds: seconds, plan: plan, mode: ["pp"])
                    ]
                } catch {
                    Console.error("  sockperf \(transport): \(error) (row left out)")
                }
            }
        }
        return rows
    }

    static func iperf(_ tool: String, udp: Bool, size: Int, seconds: Int, plan: Compare.Plan) throws -> ScenarioResult {
        let port = try freePort(datagram: false)
        // Not -1 (one-off): the readiness probe below is a connection of its own.
        let server = try startServer(pinned(plan.serverCPU, [tool, "-s", "-B", "127.0.0.1", "-p", "\(port)"]))
        defer {
            server.terminate(force: true)
            _ = try? server.wait()
        }
        waitForListener(port: port)
        var arguments = [tool, "-c", "127.0.0.1", "-p", "\(port)", "-t", "\(seconds)", "-J", "-l", "\(size)"]
        if udp { arguments += ["-u", "-b", "0"] }
        var output = ""
        for _ in 0..<10 {
            let (status, text) = try ChildProcess.run(pinned(plan.clientCPU, arguments))
            output = text
            // A busy or not yet ready server answers with {"error": ...}; try again shortly.
            if status == 0 && !text.contains("\"error\"") { break }
            usleep(100_000)
        }
        guard let json = try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any],
            let end = json["end"] as? [String: Any]
        else { throw ConnectionError(.system, "iperf3 printed no result") }
        var result = ScenarioResult()
        if udp {
            let sum = end["sum"] as? [String: Any] ?? [:]
            let packets = sum["packets"] as? Int ?? 0
            let lost = sum["lost_packets"] as? Int ?? 0
            let seconds = sum["seconds"] as? Double ?? Double(seconds)
            result.messages = packets
            result.received = packets - lost
            result.lost = lost
            result.messagesPerSecond = Double(packets) / seconds
            result.bytesPerSecond = Double((packets - lost) * size) / seconds
            // iperf3's receiver counts over its own interval, as our sinks do (goodput).
            result.receivedPerSecond = Double(packets - lost) / seconds
        } else {
            let received = end["sum_received"] as? [String: Any] ?? [:]
            let bits = received["bits_per_second"] as? Double ?? 0
            result.bytesPerSecond = bits / 8
            result.messagesPerSecond = bits / 8 / Double(size)
            result.messages = Int((received["bytes"] as? Double ?? 0) / Double(size))
        }
        result.elapsedNanoseconds = UInt64(seconds) * 1_000_000_000
        return result
    }

    /// sockperf's ping-pong (`pp`) or under-load mode (`ul --mps=N --reply-every 1`: every message answered, sent
    /// on sockperf's schedule; its sender waits for each send time by polling the clock, on a CPU of its own, so
    /// it never pays a timer's or an idle CPU's wake-up as our sleeping senders do). Its figures are round trips
    /// from the actual send time: a rate row's uncorrected latency (sockperf corrects for no stall).
    static func runSockperf(
        _ tool: String, udp: Bool, seconds: Int, plan: Compare.Plan, mode: [String]
    ) throws -> ScenarioResult {
        let port = try freePort(datagram: udp)
        let server = try startServer(
            pinned(plan.serverCPU, [tool, "sr"] + (udp ? [] : ["--tcp"]) + ["-i", "127.0.0.1", "-p", "\(port)"]))
        usleep(300_000)  // no readiness probe: a probe connection confuses sockperf sr (it then fails the run)
        defer {
            server.terminate(force: true)
            _ = try? server.wait()
        }
        var output = ""
        for _ in 0..<10 {
            let (status, text) = try ChildProcess.run(
                pinned(
                    plan.clientCPU,
                    [tool] + mode + (udp ? [] : ["--tcp"]) + [
                        "-i", "127.0.0.1", "-p", "\(port)", "-t", "\(seconds)", "-m", "64", "--full-rtt",
                    ]))
            output = text
            if status == 0 && output.contains("percentile 50.000") { break }
            usleep(50_000)
        }
        // Lines such as "sockperf: ---> percentile 99.000 =   16.602" (microseconds).
        var percentiles: [String: Double] = [:]
        var observations = 0
        var window: Double?
        for line in output.split(separator: "\n") {
            if let range = line.range(of: "percentile ") {
                let rest = line[range.upperBound...].split(separator: "=")
                if rest.count == 2, let value = Double(rest[1].trimmingCharacters(in: .whitespaces)) {
                    percentiles[rest[0].trimmingCharacters(in: .whitespaces)] = value
                }
            } else if line.contains("<MAX> observation"), let value = line.split(separator: "=").last {
                percentiles["max"] = Double(value.trimmingCharacters(in: .whitespaces))
            } else if line.contains("<MIN> observation"), let value = line.split(separator: "=").last {
                percentiles["min"] = Double(value.trimmingCharacters(in: .whitespaces))
            } else if let range = line.range(of: "SentMessages=") {
                // "[Valid Duration] RunTime=2.550 sec; SentMessages=12751; ..." comes after the total run's line
                // (which counts the warm-up): the last one read is the measured window.
                observations = Int(line[range.upperBound...].prefix(while: { $0.isNumber })) ?? 0
                if let time = line.range(of: "RunTime=") {
                    window = Double(line[time.upperBound...].prefix(while: { $0.isNumber || $0 == "." }))
                }
            }
        }
        guard let p50 = percentiles["50.000"] else {
            throw ConnectionError(.system, "sockperf printed no percentiles: \(output.suffix(300))")
        }
        func ns(_ key: String) -> UInt64 { UInt64((percentiles[key] ?? p50) * 1000) }
        var result = ScenarioResult()
        let latency = LatencySummary(
            count: UInt64(observations), min: ns("min"), p50: ns("50.000"), p90: ns("90.000"), p99: ns("99.000"),
            p999: ns("99.900"), p9999: ns("99.990"), max: ns("max"), mean: p50 * 1000, stddev: 0)
        if mode.first == "ul" {
            result.uncorrectedLatency = latency
        } else {
            result.latency = latency
        }
        result.messages = observations
        result.messagesPerSecond = Double(observations) / max(0.001, window ?? Double(seconds))
        result.elapsedNanoseconds = UInt64((window ?? Double(seconds)) * 1e9)
        return result
    }
}
