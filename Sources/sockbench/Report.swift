import ArgumentParser
import BenchmarkDriver
import Foundation
import POSIXSupport
import SocketStyles

/// The machine a report was measured on.
struct MachineInfo: Codable {
    var cpuModel: String
    var cpus: Int
    var kernel: String
    var loadAverageBefore: String
    var libuv: String
    var openssl: String
    var swiftNIO: String
    var date: String
    /// What the kernel offers a bulk UDP sender, probed at run time (absent in reports made before it was).
    var udpOffload: String?
    /// The io_uring features the `uring` rows ran with (absent where io_uring is unavailable, and in reports made
    /// before it was recorded).
    var uring: String?

    static func read() -> MachineInfo {
        let cpuinfo = (try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8)) ?? ""
        let model =
            cpuinfo.split(separator: "\n").first { $0.hasPrefix("model name") }.map {
                String($0.split(separator: ":", maxSplits: 1).last ?? "").trimmingCharacters(in: .whitespaces)
            } ?? "unknown"
        var name = utsname()
        uname(&name)
        let release = withUnsafeBytes(of: name.release) {
            String(decoding: $0.prefix(while: { $0 != 0 }), as: UTF8.self)
        }
        let load = ((try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8)) ?? "")
            .split(separator: " ").prefix(3).joined(separator: " ")
        let formatter = ISO8601DateFormatter()
        return MachineInfo(
            cpuModel: model, cpus: Syscall.cpuCount, kernel: "Linux \(release)", loadAverageBefore: load,
            libuv: LibUVBackend.libraryVersion, openssl: TLSLibrary.version, swiftNIO: "2.101 (swift-nio)",
            date: formatter.string(from: Date()), udpOffload: udpOffloadLine(),
            uring: UringBackend.unavailableReason == nil ? "uring: \(UringFeatures.current)" : nil)
    }

    /// UDP GSO decides how a UDP pump's batches go (one segmented send per run of equal datagrams, or sendmmsg).
    static func udpOffloadLine() -> String {
        let gso = Syscall.udpSegmentationAvailable ? "UDP GSO present" : "UDP GSO absent (sendmmsg only)"
        let gro = Syscall.udpReceiveCoalescingAvailable ? "GRO present, not used" : "GRO absent"
        return "\(gso), \(gro); udp pumps send \(PumpRunner.defaultBatch) datagrams per call"
    }
}

/// One backend x transport x scenario: every repetition and their median.
struct ReportRow: Codable {
    var scenario: Scenario
    var backend: String
    var transport: String
    var repetitions: [ScenarioResult]
    var median: ScenarioResult
    /// Smallest and largest of the scenario's main figure across repetitions.
    var spread: [Double]
}

/// What `sockbench compare` found, in every format it writes.
/// Which row a measurement belongs to: a scenario, who measured it (a backend, the C floor, iperf3 or sockperf)
/// and the transport. Written `scenario|source|transport` where a text key is needed (the report's `skipped`).
struct RowKey: Hashable, CustomStringConvertible {
    var scenario: Scenario
    var source: String
    var transport: String

    var description: String { "\(scenario)|\(source)|\(transport)" }
}

struct Report: Codable {
    static let floorName = "c-floor"
    var schema = "socketstyles.compare/1"
    var machine: MachineInfo
    var plan: Compare.Plan
    var rows: [ReportRow]
    var skipped: [String: String]
    var notes: [String]
    /// Per workload scenario and transport: which backends held the load and the best choice for it (absent in
    /// reports of runs without a workload).
    var verdicts: [WorkloadVerdict]?
    /// Per transport, the verdict on the broadcast workload (absent without one).
    var broadcastVerdicts: [BroadcastVerdict]?

    static func key(_ scenario: Scenario, _ backend: Backend?, _ transport: Transport) -> RowKey {
        RowKey(scenario: scenario, source: backend?.rawValue ?? floorName, transport: "\(transport)")
    }

    init(
        plan: Compare.Plan, runs: [RowKey: [ScenarioResult]], skipped: [String: String], machine: MachineInfo,
        external: [String] = []
    ) {
        self.plan = plan
        self.machine = machine
        self.skipped = skipped
        var rows: [ReportRow] = []
        for scenario in plan.scenarios {
            for backend in [Self.floorName] + external + plan.backends {
                for transport in plan.transports {
                    let key = RowKey(scenario: scenario, source: backend, transport: transport)
                    guard let measurements = runs[key], !measurements.isEmpty else { continue }
                    let main = measurements.map { Self.mainFigure(scenario, $0) }
                    rows.append(
                        ReportRow(
                            scenario: scenario, backend: backend, transport: transport, repetitions: measurements,
                            median: Self.median(measurements), spread: [main.min() ?? 0, main.max() ?? 0]))
                }
            }
        }
        self.rows = rows
        let verdicts = WorkloadScenario.verdicts(plan: plan, runs: runs)
        self.verdicts = verdicts.isEmpty ? nil : verdicts
        let broadcastVerdicts = BroadcastScenario.verdicts(plan: plan, runs: runs)
        self.broadcastVerdicts = broadcastVerdicts.isEmpty ? nil : broadcastVerdicts
        notes = [
            "Every backend is measured through the unified Connection on both ends (client here, server in its own process), except native-SIZE: the same tcp ping-pong written in the backend's own style on both ends (x native = the price of the unified API), and proxy-SIZE: the C client and C echo server with one relay between them written in the backend's own style (sockbench proxy --native, in its own process on the server's CPU); the C floor's proxy row is the direct path. Its CPU figures are the client's and the relay's (the C echo server is not counted).",
            "SwiftNIO (\(Backend.nio.name)) runs with TCP_NODELAY and a 64 KiB UDP buffer like every other backend (its defaults differ); its tls/wss use the same OpenSSL layer as the others, so TLS numbers compare connection styles, not TLS libraries; nio's native tls and wss rows are swift-nio-ssl (BoringSSL in SwiftNIO's pipeline), what a SwiftNIO user would write. Its ws and wss frames go through the shared WebSocket codec like every backend's; SwiftNIO's own WebSocket (NIOHTTP1 upgrade and NIOWebSocket handlers on both ends) is nio's native ws row.",
            "iperf3 and sockperf rows (when installed) are those tools measured in the same run with the same pinning: iperf3's single TCP stream and UDP sender, sockperf's ping-pong (its --full-rtt round trips) and its under-load mode at each rate (every message answered; its sender polls the clock instead of sleeping, so it pays no timer or idle wake-up; its latency is from the actual send time, set against the C floor's uncorrected p50).",
            "CPU time per side is read from each process's CPU-time clock (clock_getcpuclockid: every thread, nanoseconds); cost per message is (client + server CPU) / messages over the window. Context switches: the client from getrusage (every thread), the server summed over its live threads in /proc/PID/task (a server thread that ended in the window is not counted); peak memory from /proc/PID/status. All figures per repetition, medians across repetitions.",
        ]
    }

    /// The figure a scenario is judged by (its kind's): p50 latency (ns) for latency scenarios, bytes/s for pump,
    /// the p99 (ns, from the intended send time) for a workload.
    static func mainFigure(_ scenario: Scenario, _ measurement: ScenarioResult) -> Double {
        scenario.kind.mainFigure(measurement)
    }

    static func median(_ runs: [ScenarioResult]) -> ScenarioResult {
        func mid<T: Comparable>(_ values: [T]) -> T? { values.isEmpty ? nil : values.sorted()[values.count / 2] }
        func latency(_ values: [LatencySummary]) -> LatencySummary? {
            guard var result = values.first else { return nil }
            result.count = values.map(\.count).reduce(0, +)
            result.min = values.map(\.min).min()!
            result.p50 = mid(values.map(\.p50))!
            result.p90 = mid(values.map(\.p90))!
            result.p99 = mid(values.map(\.p99))!
            result.p999 = mid(values.map(\.p999))!
            result.p9999 = mid(values.map(\.p9999))!
            result.max = values.map(\.max).max()!
            result.mean = mid(values.map(\.mean))!
            result.stddev = mid(values.map(\.stddev))!
            return result
        }
        func usage(_ values: [ResourceUsage]) -> ResourceUsage? {
            guard var result = values.first else { return nil }
            result.userNanoseconds = mid(values.map(\.userNanoseconds))!
            let clocks = values.compactMap(\.cpuClockNanoseconds)
            result.cpuClockNanoseconds = clocks.count == values.count ? mid(clocks) : nil
            result.systemNanoseconds = mid(values.map(\.systemNanoseconds))!
            result.voluntaryContextSwitches = mid(values.map(\.voluntaryContextSwitches))!
            result.involuntaryContextSwitches = mid(values.map(\.involuntaryContextSwitches))!
            result.peakResidentKiB = values.map(\.peakResidentKiB).max()!
            let resident = values.compactMap(\.residentKiB)
            result.residentKiB = resident.count == values.count ? mid(resident) : nil
            result.threads = values.map(\.threads).max()!
            return result
        }
        var result = ScenarioResult()
        result.latency = latency(runs.compactMap(\.latency))
        result.uncorrectedLatency = latency(runs.compactMap(\.uncorrectedLatency))
        result.messagesPerSecond = mid(runs.compactMap(\.messagesPerSecond))
        result.bytesPerSecond = mid(runs.compactMap(\.bytesPerSecond))
        result.messages = mid(runs.map(\.messages)) ?? 0
        result.lost = mid(runs.compactMap(\.lost))
        result.received = mid(runs.compactMap(\.received))
        result.receivedPerSecond = mid(runs.compactMap(\.receivedPerSecond))
        result.quietP50 = mid(runs.compactMap(\.quietP50))
        result.pacingCPUNanoseconds = mid(runs.compactMap(\.pacingCPUNanoseconds))
        result.reordered = mid(runs.compactMap(\.reordered))
        result.kernelReceiveBufferDrops = mid(runs.compactMap(\.kernelReceiveBufferDrops))
        result.elapsedNanoseconds = mid(runs.map(\.elapsedNanoseconds)) ?? 0
        result.messageBytes = mid(runs.compactMap(\.messageBytes))
        result.wireBytes = mid(runs.compactMap(\.wireBytes))
        result.bulkBytesPerSecond = mid(runs.compactMap(\.bulkBytesPerSecond))
        result.serverKiBPerConnection = mid(runs.compactMap(\.serverKiBPerConnection))
        result.clientKiBPerConnection = mid(runs.compactMap(\.clientKiBPerConnection))
        result.serverThreadsOpen = runs.compactMap(\.serverThreadsOpen).max()
        result.client = usage(runs.compactMap(\.client))
        result.server = usage(runs.compactMap(\.server))
        // A broadcast's figures: those of its median repetition by the last receipt's p95 (the percentiles of one
        // repetition's messages stay together).
        let broadcasts = runs.compactMap(\.broadcast).sorted {
            ($0.lastReceipt?.p95 ?? .max) < ($1.lastReceipt?.p95 ?? .max)
        }
        result.broadcast = broadcasts.isEmpty ? nil : broadcasts[broadcasts.count / 2]
        let fairness = runs.compactMap(\.fairness)
        if var median = fairness.first {
            median.jainIndex = mid(fairness.map(\.jainIndex))!
            median.slowestShare = mid(fairness.map(\.slowestShare))!
            median.medianP99 = mid(fairness.compactMap(\.medianP99))
            median.worstP99 = mid(fairness.compactMap(\.worstP99))
            result.fairness = median
        }
        return result
    }

    // MARK: Summary

    /// What the numbers mean for someone choosing: measured facts first, then what each style asks of you. The
    /// project's own performance targets (``targets()``) are not among them: they say how SocketStyles is doing,
    /// not which backend suits a user's load; `--check-targets` prints them.
    func summary() -> [String] {
        var lines = ["== What this run says"]
        for kind in Scenario.registered { lines += summaryLines(of: kind) }
        lines += serverThreadsLines()
        lines += disturbanceLines()
        let measured = Set(rows.map(\.backend))
        lines.append("- Threads and style, as each backend registers itself:")
        lines += Backend.allCases.filter { measured.contains($0.name) }.map { "  \($0.name): \($0.summary)." }
        lines += [
            "- Backpressure: every backend stops reading when its receive queue is full and makes send wait while the kernel buffer is full.",
            "- Read the ratios from this run, never absolute numbers from another day: shared machines are noisy.",
        ]
        return lines
    }

    /// One kind's lines about the planned scenarios of that kind.
    private func summaryLines<Kind: ScenarioKind>(of kind: Kind.Type) -> [String] {
        Kind.summary(self, plan.scenarios.compactMap { $0.as(Kind.self) })
    }
}
