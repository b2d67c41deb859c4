import BenchmarkDriver
import SocketStyles

/// `compare --server-threads 1,2`: the same fan-in or workload against servers on each thread count, set side by
/// side per backend x transport: throughput, p99, the server's CPU and what each server CPU-second bought.
extension Report {
    /// The rows of the scenarios run on more than one thread count, grouped: one group per scenario (without its
    /// threads) x backend x transport, its rows by thread count.
    private func threadGroups() -> [(base: String, backend: String, transport: String, rows: [ReportRow])] {
        let threaded = rows.filter { $0.scenario.serverThreads != nil }
        var groups: [(base: String, backend: String, transport: String, rows: [ReportRow])] = []
        for row in threaded {
            let base = row.scenario.baseName
            if let index = groups.firstIndex(where: {
                $0.base == base && $0.backend == row.backend && $0.transport == row.transport
            }) {
                groups[index].rows.append(row)
            } else {
                groups.append((base, row.backend, row.transport, [row]))
            }
        }
        return groups.map { group in
            (
                group.base, group.backend, group.transport,
                group.rows.sorted { ($0.scenario.serverThreads ?? 1) < ($1.scenario.serverThreads ?? 1) }
            )
        }
    }

    /// Messages (round trips, or echoed workload messages) a second.
    private static func throughput(_ m: ScenarioResult) -> Double? { m.messagesPerSecond ?? m.receivedPerSecond }

    /// The server's CPU time over the measured window, as a share of one CPU (2.0: two CPUs busy throughout).
    private static func serverCPUs(_ m: ScenarioResult) -> Double? {
        guard let server = m.server, m.elapsedNanoseconds > 0 else { return nil }
        return Double(server.cpuNanoseconds) / Double(m.elapsedNanoseconds)
    }

    /// Messages per second of server CPU time: what a core of the server buys, whatever the thread count.
    private static func perServerCPUSecond(_ m: ScenarioResult) -> Double? {
        guard let server = m.server, server.cpuNanoseconds > 0, m.messages > 0 else { return nil }
        return Double(m.messages) / (Double(server.cpuNanoseconds) / 1e9)
    }

    /// The table: a row per scenario x backend x transport x thread count.
    func serverThreadsTable() -> (header: [String], cells: [[String]])? {
        let groups = threadGroups()
        guard !groups.isEmpty else { return nil }
        let header = [
            "scenario", "backend", "transport", "server threads", "msg/s", "x 1 thread", "p99 us", "server CPUs",
            "msg per server CPU-s", "server threads open",
        ]
        var cells: [[String]] = []
        for group in groups {
            let first = group.rows.first.flatMap { Self.throughput($0.median) }
            for row in group.rows {
                let m = row.median
                let rate = Self.throughput(m)
                cells.append([
                    group.base, group.backend, group.transport, "\(row.scenario.serverThreads ?? 1)",
                    rate.map { "\(Int($0))" } ?? "-",
                    rate.flatMap { rate in first.map { fixed(rate / max($0, 1e-9), 2) } } ?? "-",
                    m.latency.map { microseconds($0.p99) } ?? "-", Self.serverCPUs(m).map { fixed($0, 2) } ?? "-",
                    Self.perServerCPUSecond(m).map { "\(Int($0))" } ?? "-", m.server.map { "\($0.threads)" } ?? "-",
                ])
            }
        }
        return (header, cells)
    }

    /// Its lines in "what this run says": per scenario and transport, each backend's gain from its fewest to its
    /// most server threads, most first.
    func serverThreadsLines() -> [String] {
        let groups = threadGroups().filter { $0.rows.count > 1 }
        guard !groups.isEmpty else { return [] }
        var lines: [String] = []
        var seen: [String] = []
        for group in groups where !seen.contains("\(group.base) \(group.transport)") {
            seen.append("\(group.base) \(group.transport)")
            let same = groups.filter { $0.base == group.base && $0.transport == group.transport }
            let gains: [(backend: String, gain: Double, cpus: Double?)] = same.compactMap { group in
                guard let fewest = group.rows.first, let most = group.rows.last,
                    let before = Self.throughput(fewest.median), let after = Self.throughput(most.median), before > 0
                else { return nil }
                return (group.backend, after / before, Self.serverCPUs(most.median))
            }.sorted { $0.gain > $1.gain }
            guard let fewest = same.first?.rows.first?.scenario.serverThreads,
                let most = same.first?.rows.last?.scenario.serverThreads
            else { continue }
            let parts = gains.map { entry in
                "\(entry.backend) \(fixed(entry.gain, 2))x"
                    + (entry.cpus.map { " (server \(fixed($0, 2)) CPUs)" } ?? "")
            }
            lines.append(
                "- Server threads, \(group.base) \(group.transport): throughput on \(most) threads over \(fewest): "
                    + parts.joined(separator: ", ")
                    + ". The servers were not pinned; the client shares the machine's \(machine.cpus) CPUs with them.")
        }
        return lines
    }
}
