import BenchmarkDriver
import Foundation

/// The result of one fleet run: each agent's row, the merged row, the server's usage.
struct FleetReport: Codable {
    struct AgentRow: Codable {
        var agent: String
        /// Why the agent is left out (unreachable, refused the load, died or went silent mid-run), or `nil`.
        var error: String?
        /// The agent's monotonic clock minus this host's, and the round trip that estimate came from, ns.
        var clockOffsetNanoseconds: Int64?
        var clockRoundTripNanoseconds: UInt64?
        /// When its window opened, against when it was meant to, on this host's clock (offset applied), ns.
        var startSkewNanoseconds: Int64?
        var connections: Int?
        var outcome: FleetShare.Outcome?
        var latency: LatencySummary?
        var perSecond: Double?
    }

    struct Merged: Codable {
        var agents: Int
        var count: Int
        var lost: Int
        var perSecond: Double
        var latency: LatencySummary?
        var histogram: SparseHistogram
        /// The spread of the agents' window starts (latest minus earliest), on this host's clock, ns.
        var startSpreadNanoseconds: UInt64?
    }

    struct Server: Codable {
        var backend: String
        var cpuNanoseconds: UInt64
        var cpuPerMessageNanoseconds: Double?
        var residentKiB: UInt64?
        var threads: UInt64
    }

    var load: String
    var backend: String
    var target: String
    var windowSeconds: Double
    var agents: [AgentRow]
    var merged: Merged
    var server: Server?
    /// A broadcast load: per message the first and the last client's receipt over every agent (on this host's
    /// clock), the asker's answers, what went missing.
    var broadcast: BroadcastFigures?
    var askerError: String?

    /// The table a person reads.
    func lines() -> [String] {
        var out = [
            "sockbench fleet: \(load) per agent, \(backend) clients, against \(target), a \(fixed(windowSeconds, 1)) s window"
        ]
        let header = [
            "agent", "clock offset us", "start skew us", "conns", "messages", "per second", "p50 us", "p99 us",
            "p99.9 us", "lost", "failed",
        ]
        var rows: [[String]] = []
        for row in agents {
            guard let outcome = row.outcome, let latency = row.latency else { continue }
            rows.append([
                row.agent,
                row.clockOffsetNanoseconds.map {
                    signedMicroseconds($0) + " ±" + microseconds((row.clockRoundTripNanoseconds ?? 0) / 2)
                } ?? "-",
                row.startSkewNanoseconds.map(signedMicroseconds) ?? "-",
                row.connections.map(String.init) ?? "-", String(outcome.count), String(Int(row.perSecond ?? 0)),
                microseconds(latency.p50), microseconds(latency.p99), microseconds(latency.p999), String(outcome.lost),
                String(outcome.failedConnections),
            ])
        }
        if let latency = merged.latency {
            rows.append([
                "all \(merged.agents) (merged)", "-",
                merged.startSpreadNanoseconds.map { "spread " + microseconds($0) } ?? "-", "-", String(merged.count),
                String(Int(merged.perSecond)), microseconds(latency.p50), microseconds(latency.p99),
                microseconds(latency.p999), String(merged.lost), "-",
            ])
        }
        if !rows.isEmpty { out += Report.render(header, rows).split(separator: "\n").map(String.init) }
        if let b = broadcast {
            func ms(_ value: UInt64?) -> String { value.map { fixed(Double($0) / 1e6, 2) } ?? "-" }
            out.append(
                "broadcast: \(b.clients) clients, \(b.messages) messages measured; per message, last client's receipt p50 \(ms(b.lastReceipt?.p50)) p95 \(ms(b.lastReceipt?.p95)) p99 \(ms(b.lastReceipt?.p99)) ms, first \(ms(b.firstReceipt?.p50)) ms (p50), the asker's answer \(ms(b.answer?.p50)) ms (p50); missing \(b.missing), duplicated or late \(b.duplicates + b.outOfOrder)"
            )
        }
        if let askerError { out.append("asker: \(askerError)") }
        if let server {
            out.append(
                "server (\(server.backend)): \(fixed(Double(server.cpuNanoseconds) / 1e9, 2)) CPU s in the window"
                    + (server.cpuPerMessageNanoseconds.map { ", \(fixed($0 / 1000, 2)) us CPU a message" } ?? "")
                    + (server.residentKiB.map { "; halfway through: resident \(fixed(Double($0) / 1024, 1)) MiB" } ?? "")
                    + ", \(server.threads) threads")
        }
        for row in agents {
            if let error = row.error { out.append("agent \(row.agent): \(error)") }
            if let first = row.outcome?.firstError { out.append("agent \(row.agent): a connection failed: \(first)") }
        }
        return out
    }

    private func signedMicroseconds(_ value: Int64) -> String {
        (value < 0 ? "-" : "+") + microseconds(value.magnitude)
    }
}
