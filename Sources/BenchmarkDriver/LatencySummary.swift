public import Histogram

/// The percentiles of a latency histogram, in nanoseconds, as every report prints them.
public struct LatencySummary: Sendable, Codable, Hashable {
    public var count: UInt64
    public var min: UInt64
    public var p50: UInt64
    public var p90: UInt64
    public var p99: UInt64
    public var p999: UInt64
    public var p9999: UInt64
    public var max: UInt64
    public var mean: Double
    public var stddev: Double

    /// Reads the summary from a histogram of nanoseconds.
    public init(_ histogram: Histogram<UInt64>) {
        count = histogram.totalCount
        min = histogram.totalCount == 0 ? 0 : histogram.min
        p50 = histogram.valueAtPercentile(50)
        p90 = histogram.valueAtPercentile(90)
        p99 = histogram.valueAtPercentile(99)
        p999 = histogram.valueAtPercentile(99.9)
        p9999 = histogram.valueAtPercentile(99.99)
        max = histogram.max
        mean = histogram.mean
        stddev = histogram.stdDeviation
    }

    /// A summary from percentiles another tool reported (sockperf), nanoseconds.
    public init(
        count: UInt64, min: UInt64, p50: UInt64, p90: UInt64, p99: UInt64, p999: UInt64, p9999: UInt64, max: UInt64,
        mean: Double, stddev: Double
    ) {
        self.count = count
        self.min = min
        self.p50 = p50
        self.p90 = p90
        self.p99 = p99
        self.p999 = p999
        self.p9999 = p9999
        self.max = max
        self.mean = mean
        self.stddev = stddev
    }

    /// A histogram for latencies from 1 ns to 60 s at 3 significant digits.
    public static func makeHistogram() -> Histogram<UInt64> {
        Histogram<UInt64>(
            lowestDiscernibleValue: 1, highestTrackableValue: 60_000_000_000, numberOfSignificantValueDigits: .three)
    }

    /// Whether a percentile has enough samples behind it to mean anything: p99.9 needs at least 1,000 samples,
    /// p99.99 at least 10,000.
    public func isMeaningful(percentile: Double) -> Bool {
        let needed = 1.0 / (1.0 - percentile / 100.0)
        return Double(count) >= needed
    }
}

/// Formats nanoseconds as microseconds with one decimal, e.g. `12.3`.
public func microseconds(_ nanoseconds: UInt64) -> String {
    let tenths = (nanoseconds + 50) / 100
    return "\(tenths / 10).\(tenths % 10)"
}

/// Formats a Double with `digits` decimals, without Foundation.
public func fixed(_ value: Double, _ digits: Int = 2) -> String {
    guard value.isFinite else { return "-" }
    var scale = 1.0
    for _ in 0..<digits { scale *= 10 }
    let rounded = (value * scale).rounded()
    let negative = rounded < 0
    let magnitude = UInt64(abs(rounded))
    let whole = magnitude / UInt64(scale)
    var fraction = String(magnitude % UInt64(scale))
    while fraction.count < digits { fraction = "0" + fraction }
    return (negative ? "-" : "") + (digits > 0 ? "\(whole).\(fraction)" : "\(whole)")
}
