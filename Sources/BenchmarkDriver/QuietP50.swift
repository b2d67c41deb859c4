/// The median round trip of a closed-loop run in its quiet stretches.
///
/// The machine a run is measured on does not run at one speed. On this project's 2-CPU virtual machine a pinned C
/// ping-pong, its p50 taken every 10 ms, sits at 6.1 us or at 9.2 us and switches between the two every 10 to 100
/// ms with nothing else running (docs/benchmarks.md, "Quiet p50"). A run's p50 is then the p50 of whichever speed
/// held for more than half of it: the same program measured 6.3 us in one second and 9.1 us in the next, and a
/// ratio of two rows measured a second apart moved by up to 1.5x.
///
/// The quiet p50 cuts the samples, in the order they were measured, into stretches of `window` nanoseconds (by
/// their own durations: in a closed loop the round trips follow one another), takes each stretch's p50, and
/// returns the `quantile` of those (the 10th percentile by default): the median round trip while the machine
/// ran at its quicker speed. Ten repetitions of one second each of that C ping-pong gave 6.01-6.08 us, against
/// 6.26-9.05 us for their plain p50s. It is what the report's ratios (x floor, x nio, x native) compare.
public enum QuietP50 {
    /// The stretch length: shorter than the machine's speed states, long enough for a p50 (hundreds of round
    /// trips).
    public static let window: UInt64 = 5_000_000

    /// The quiet p50 of `samples` (nanoseconds, in measured order), or `nil` with fewer than `minimumWindows`
    /// whole stretches (a run too short to have a quiet part worth the name).
    public static func of(
        _ samples: [UInt64], window: UInt64 = window, quantile: Double = 0.1, minimumWindows: Int = 10
    ) -> UInt64? {
        var medians: [UInt64] = []
        var stretch: [UInt64] = []
        var elapsed: UInt64 = 0
        for sample in samples {
            stretch.append(sample)
            elapsed &+= sample
            if elapsed >= window {
                medians.append(median(&stretch))
                elapsed = 0
            }
        }
        return pick(medians, quantile: quantile, minimumWindows: minimumWindows)
    }

    /// An open-loop row's stretches: in an open loop the messages go on a schedule, not one after another's
    /// round trip, so a stretch is `messages` messages in the order they were sent (at a fixed rate, a fixed
    /// span of time). The quiet p50 of their latencies (nanoseconds, in send order), as ``of(_:window:quantile:minimumWindows:)``.
    public static func of(
        _ samples: [UInt64], messages: Int, quantile: Double = 0.1, minimumWindows: Int = 10
    ) -> UInt64? {
        let size = max(1, messages)
        var medians: [UInt64] = []
        var stretch: [UInt64] = []
        for sample in samples {
            stretch.append(sample)
            if stretch.count == size { medians.append(median(&stretch)) }
        }
        return pick(medians, quantile: quantile, minimumWindows: minimumWindows)
    }

    /// Messages per stretch of an open-loop row sent `perSecond` times a second: 20 ms of them (the machine's
    /// speed states last 10 to 100 ms), at least 50 (a p50 of fewer says little).
    public static func openLoopMessages(perSecond: Int) -> Int { max(50, perSecond / 50) }

    /// The median of `stretch`, which is emptied for the next.
    private static func median(_ stretch: inout [UInt64]) -> UInt64 {
        stretch.sort()
        let value = stretch[stretch.count / 2]
        stretch.removeAll(keepingCapacity: true)
        return value
    }

    private static func pick(_ medians: [UInt64], quantile: Double, minimumWindows: Int) -> UInt64? {
        guard medians.count >= max(1, minimumWindows) else { return nil }
        let sorted = medians.sorted()
        let index = Int((Double(sorted.count - 1) * min(1, max(0, quantile))).rounded())
        return sorted[index]
    }
}
