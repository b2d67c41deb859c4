public import ConnectionCore
import Histogram
import POSIXSupport

/// The bookkeeping of a closed-loop ping-pong written in a backend's native style (callbacks, delegates,
/// handlers, a blocking loop): which probe is out, when it left, whether the echo matches, and the samples.
/// The native code only moves bytes; every native client shares this, so they time exactly the same thing as
/// ``PingRunner``: from just before the probe is handed to the style's write call to the moment the last byte
/// of its echo was handed back by the style's read.
///
/// Used from one thread at a time (the style's loop or thread); not for concurrent use.
public final class PingPongTally: @unchecked Sendable {
    public let size: Int
    public let count: Int
    public let warmup: Int
    /// The probe now out (valid after ``next()``).
    public private(set) var payload: [UInt8]
    private var received: [UInt8]
    private var index = 0
    private var sentAt: UInt64 = 0
    private var measuredFrom: UInt64 = 0
    private var measuredUntil: UInt64 = 0
    private var samples: [UInt64]

    /// What a read did to the round trip in flight.
    public enum Step: Equatable {
        /// Part of the echo; read on.
        case needMore
        /// The echo is complete and matches: send ``next()``.
        case echoed
        /// The last echo is in: stop.
        case finished
    }

    public init(size: Int, count: Int, warmup: Int) {
        self.size = max(1, size)
        self.count = count
        self.warmup = warmup
        payload = [UInt8](repeating: 0x5a, count: max(1, size))
        received = []
        received.reserveCapacity(max(1, size))
        samples = []
        samples.reserveCapacity(count)
    }

    /// `true` once every round trip is done.
    public var isFinished: Bool { index == warmup + count }

    /// Stamps the next probe with its sequence number, notes the time, and returns it to be written.
    public func next() -> [UInt8] {
        PingRunner.stamp(&payload, UInt64(index))
        sentAt = MonotonicClock.nanoseconds()
        if index == warmup { measuredFrom = sentAt }
        return payload
    }

    /// Takes bytes the style read. Throws when the echo differs from the probe or is longer than it.
    public func consume(_ bytes: UnsafeRawBufferPointer) throws(ConnectionError) -> Step {
        received.append(contentsOf: bytes)
        if received.count < size { return .needMore }
        let now = MonotonicClock.nanoseconds()
        guard received.count == size, received == payload else {
            throw ConnectionError(
                .protocolViolation, "the echo of round trip \(index) differs from what was sent")
        }
        received.removeAll(keepingCapacity: true)
        if index >= warmup { samples.append(max(1, now - sentAt)) }
        index += 1
        if isFinished {
            measuredUntil = now
            return .finished
        }
        return .echoed
    }

    /// ``consume(_:)-(UnsafeRawBufferPointer)`` for an array.
    public func consume(_ bytes: [UInt8]) throws(ConnectionError) -> Step {
        try bytes.withUnsafeBytes { raw in Result { () throws(ConnectionError) in try consume(raw) } }.get()
    }

    /// The samples so far as a ``PingRunner/Result``.
    public func result() -> PingRunner.Result {
        PingRunner.Result(samples: samples, elapsedNanoseconds: max(1, measuredUntil - measuredFrom))
    }
}

extension PingRunner.Result {
    /// A result from raw round-trip samples (nanoseconds) measured over `elapsedNanoseconds`.
    public init(samples: [UInt64], elapsedNanoseconds: UInt64) {
        var histogram = LatencySummary.makeHistogram()
        for sample in samples { _ = histogram.record(max(1, sample)) }
        self.init(
            latency: LatencySummary(histogram), lost: 0, stale: 0, elapsedNanoseconds: elapsedNanoseconds,
            roundTripsPerSecond: Double(samples.count) / (Double(max(1, elapsedNanoseconds)) / 1e9),
            histogram: histogram, samples: samples)
    }
}
