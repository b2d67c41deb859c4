/// Whether every connection of a many-connection run got its share: a loop that serves some connections and
/// starves others can post a fine merged median while a few connections wait, and the merged figures hide it.
///
/// - Jain's fairness index over the connections' throughputs, (Σx)² / (n·Σx²) (R. Jain, D. Chiu, W. Hawe, "A
///   Quantitative Measure of Fairness and Discrimination for Resource Allocation in Shared Computer Systems",
///   DEC-TR-301, 1984): 1 when every connection got the same, 1/n when one connection got everything, k/n when k
///   connections shared it equally and the rest got nothing. It does not depend on the unit or the scale.
/// - The least-served connection's throughput over the mean of all, which names how far behind the last one was.
/// - The median connection's 99th-percentile latency beside the worst connection's.
public struct Fairness: Sendable, Codable, Hashable {
    /// How many connections the figures are over.
    public var connections: Int
    /// Jain's index over per-connection throughput, 1/n to 1.
    public var jainIndex: Double
    /// The smallest per-connection throughput over the mean throughput (1: nobody behind; 0: someone got nothing).
    public var slowestShare: Double
    /// Of the connections' own 99th-percentile latencies, nanoseconds: the median one and the largest one (`nil`
    /// where no latency was measured per connection).
    public var medianP99: UInt64?
    public var worstP99: UInt64?

    /// `throughputs`: one figure per connection, in any unit (messages, bytes, per second or in all).
    /// `latencies`: each connection's own samples, nanoseconds (empty: not measured per connection).
    public init(throughputs: [Double], latencies: [[UInt64]] = []) {
        connections = throughputs.count
        jainIndex = Self.jainIndex(throughputs)
        let mean = throughputs.isEmpty ? 0 : throughputs.reduce(0, +) / Double(throughputs.count)
        slowestShare = mean > 0 ? (throughputs.min() ?? 0) / mean : 1
        let p99s = latencies.compactMap { Self.percentile(99, of: $0) }.sorted()
        medianP99 = p99s.isEmpty ? nil : p99s[(p99s.count - 1) / 2]
        worstP99 = p99s.last
    }

    /// `throughputs` as above; `p99s`: each connection's own 99th percentile, nanoseconds, computed where its
    /// samples were (another process).
    public init(throughputs: [Double], p99s: [UInt64]) {
        self.init(throughputs: throughputs)
        let sorted = p99s.sorted()
        medianP99 = sorted.isEmpty ? nil : sorted[(sorted.count - 1) / 2]
        worstP99 = sorted.last
    }

    /// Jain's index of `values` (non-negative). All equal, none at all, or all zero: 1.
    public static func jainIndex(_ values: [Double]) -> Double {
        let sum = values.reduce(0, +)
        let squares = values.reduce(0) { $0 + $1 * $1 }
        guard !values.isEmpty, squares > 0 else { return 1 }
        return sum * sum / (Double(values.count) * squares)
    }

    /// The nearest-rank percentile (the smallest sample with at least `percent` of the samples at or below it).
    public static func percentile(_ percent: Double, of samples: [UInt64]) -> UInt64? {
        guard !samples.isEmpty else { return nil }
        let sorted = samples.sorted()
        let rank = Int((percent / 100 * Double(sorted.count)).rounded(.up))
        return sorted[min(sorted.count, max(1, rank)) - 1]
    }
}
