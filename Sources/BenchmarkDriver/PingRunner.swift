public import ConnectionCore
public import Histogram
import POSIXSupport
import Synchronization

/// Ends a run (``PingRunner``, ``PumpRunner``) early, between two messages, with what it measured so far: Ctrl-C,
/// a `--time` limit. ``request()`` from any thread; a loop pays one relaxed load per message when it has one.
public final class RunStop: Sendable {
    private let flag = Atomic<Bool>(false)
    public init() {}
    public func request() { flag.store(true, ordering: .relaxed) }
    public var isRequested: Bool { flag.load(ordering: .relaxed) }
}

/// Closed-loop round trips over one ``Connection``: send `size` bytes, wait for the echo, repeat. Every
/// sample after the warm-up goes into an HdrHistogram.
///
/// What is timed: from just before `send` to just after the whole echo was received (for TCP, all `size`
/// bytes however the stream split them; for UDP, the datagram with the matching sequence number).
///
/// UDP may lose a datagram: a watchdog sends the same probe again when no echo came within `lossTimeout`,
/// counts the loss, and the sample is timed from the re-send. Each probe carries a sequence number, so a late
/// echo of an earlier probe is recognised and discarded.
public struct PingRunner: Sendable {
    /// What one run measured.
    public struct Result: Sendable, Codable {
        /// Round-trip latency, nanoseconds.
        public var latency: LatencySummary
        /// Probes re-sent because no echo came in time (UDP).
        public var lost: Int
        /// Late echoes of earlier probes, discarded (UDP).
        public var stale: Int
        /// Wall-clock time of the measured part, nanoseconds.
        public var elapsedNanoseconds: UInt64
        /// Round trips per second over the measured part.
        public var roundTripsPerSecond: Double
        /// The full histogram, for merging runs.
        public var histogram: Histogram<UInt64>
        /// Every measured round trip in order, nanoseconds (only with ``PingRunner/keepsSamples``).
        public var samples: [UInt64]?

        /// Creates a result (for runners other than ``PingRunner``, such as the C floor).
        public init(
            latency: LatencySummary, lost: Int, stale: Int, elapsedNanoseconds: UInt64, roundTripsPerSecond: Double,
            histogram: Histogram<UInt64>, samples: [UInt64]? = nil
        ) {
            self.latency = latency
            self.lost = lost
            self.stale = stale
            self.elapsedNanoseconds = elapsedNanoseconds
            self.roundTripsPerSecond = roundTripsPerSecond
            self.histogram = histogram
            self.samples = samples
        }
    }

    /// The round trips of one reporting interval (``PingRunner/reportEvery``), handed over as they are: summarise
    /// it off the connection's executor.
    public struct Interval: Sendable {
        /// When the interval began and ended, since the measured part began.
        public var from: Duration
        public var to: Duration
        /// Its round trips, nanoseconds.
        public var histogram: Histogram<UInt64>
    }

    public var size: Int
    public var count: Int
    public var warmup: Int
    public var lossTimeout: Duration
    /// The longest a round trip may take (`nil`: no limit). When an echo has not come by then (a server that
    /// accepts and never answers, a UDP peer that is gone), the connection is closed and the run fails with
    /// `.timedOut`. Checked by a watchdog a few times per limit, so a round trip pays one atomic store.
    public var timeout: Duration?
    /// Checked between round trips: once requested, the run ends with what it measured (`nil`: runs `count`).
    public var stop: RunStop?
    /// The measured part ends once it has lasted this long (from the end of the warm-up) and made at least
    /// ``minimumCount`` round trips; `count` stays the most (`nil`: `count` round trips).
    public var duration: Duration?
    /// With ``duration``: the round trips the measured part makes however long they take.
    public var minimumCount = 0
    /// How often ``onInterval`` gets the round trips of the interval just ended (`nil`: never). Called on the
    /// loop's executor: it should only hand the interval over.
    public var reportEvery: Duration?
    public var onInterval: (@Sendable (Interval) -> Void)?
    /// Keep every measured round trip in ``Result/samples`` (8 bytes each).
    public var keepsSamples = false
    /// Record into a histogram as the loop runs (about 300 KiB each). `false` (with ``keepsSamples``) keeps only
    /// the raw samples: a fan-in of 10,000 connections would otherwise hold 3 GiB of histograms.
    public var keepsHistogram = true
    /// Message transports: the message of round trip `index` (it must differ from the one before), instead of
    /// `size` bytes stamped with the index.
    public var messageMaker: (@Sendable (Int) -> Message)?

    /// Creates a runner.
    public init(
        size: Int = 64, count: Int = 10_000, warmup: Int = 1_000, lossTimeout: Duration = .milliseconds(200),
        timeout: Duration? = nil
    ) {
        self.timeout = timeout
        self.size = size
        self.count = count
        self.warmup = warmup
        self.lossTimeout = lossTimeout
    }

    /// What the timed loop collects: the raw histogram and counters, cheap to hand back. Percentiles are
    /// computed from it afterwards, off the connection's executor.
    public struct Samples: Sendable {
        /// Round-trip latency, nanoseconds (`nil` without ``PingRunner/keepsHistogram``: see ``latency``).
        public var histogram: Histogram<UInt64>?
        /// Every measured round trip, in order (with ``PingRunner/keepsSamples``).
        public var raw: [UInt64]?
        /// Probes re-sent because no echo came in time (UDP).
        public var lost: Int
        /// Late echoes of earlier probes, discarded (UDP).
        public var stale: Int
        /// Wall-clock time of the measured part, nanoseconds.
        public var elapsedNanoseconds: UInt64

        /// The round trips as a histogram: ``histogram``, or one made from ``raw``.
        public var latency: Histogram<UInt64> {
            if let histogram { return histogram }
            var made = LatencySummary.makeHistogram()
            for value in raw ?? [] { _ = made.record(value) }
            return made
        }
    }

    /// Runs against an echo peer on `connection`.
    ///
    /// The loop runs on the connection's preferred executor when it has one (an event loop that is a
    /// `TaskExecutor`), as a user of that style would run it.
    public func run(on connection: any Connection) async throws(ConnectionError) -> Result {
        let samples = try await measure(on: connection)
        let histogram = samples.latency
        return Result(
            latency: LatencySummary(histogram), lost: samples.lost, stale: samples.stale,
            elapsedNanoseconds: samples.elapsedNanoseconds,
            roundTripsPerSecond: Double(histogram.totalCount) / (Double(max(1, samples.elapsedNanoseconds)) / 1e9),
            histogram: histogram, samples: samples.raw)
    }

    /// The timed loop alone, on the connection's preferred executor. Nothing slow runs there once the loop is
    /// done: summarising a histogram (percentiles walk every bucket) takes milliseconds, and on an event loop
    /// shared with other connections it would stall them all (it once put a 250 ms tail on fan-in runs).
    public func measure(on connection: any Connection) async throws(ConnectionError) -> Samples {
        let progress = Progress()
        let watchdog = timeout.map { limit in
            Task {
                let limitNanoseconds = UInt64(limit.wholeNanoseconds)
                while !Task.isCancelled {
                    try? await Task.sleep(for: limit / 4)
                    if MonotonicClock.nanoseconds() - progress.last.load(ordering: .relaxed) > limitNanoseconds {
                        progress.expired.store(true, ordering: .relaxed)
                        await connection.close()
                        return
                    }
                }
            }
        }
        defer { watchdog?.cancel() }
        let outcome: Swift.Result<Samples, ConnectionError> = await withTaskExecutorPreference(
            connection.preferredExecutor
        ) {
            do throws(ConnectionError) {
                if connection.transport.isByteStream {
                    return .success(try await runStream(connection, progress))
                }
                return .success(try await runMessages(connection, progress))
            } catch {
                return .failure(error)
            }
        }
        if case .failure = outcome, progress.expired.load(ordering: .relaxed), let timeout {
            throw ConnectionError(.timedOut, "no echo from \(connection.remoteEndpoint) within \(timeout)")
        }
        return try outcome.get()
    }

    /// When a measured part that began at `start` may end (``duration``), `UInt64.max` without one.
    private func endOfWindow(from start: UInt64) -> UInt64 {
        guard let duration else { return .max }
        return start &+ UInt64(max(0, duration.wholeNanoseconds))
    }

    /// When the last round trip finished, for the watchdog.
    private final class Progress: Sendable {
        let last = Atomic<UInt64>(MonotonicClock.nanoseconds())
        let expired = Atomic<Bool>(false)
    }

    private func runStream(_ connection: any Connection, _ progress: Progress) async throws(ConnectionError) -> Samples
    {
        var recorder = Recorder(self)
        var payload = [UInt8](repeating: 0x5a, count: size)
        var start: UInt64 = 0
        var deadline = UInt64.max
        for index in 0..<(warmup + count) {
            if let stop, stop.isRequested { break }
            if index == warmup {
                start = MonotonicClock.nanoseconds()
                recorder.begin(at: start)
                deadline = endOfWindow(from: start)
            }
            if index >= warmup + minimumCount, deadline != .max, MonotonicClock.nanoseconds() >= deadline { break }
            Self.stamp(&payload, UInt64(index))
            let sent = MonotonicClock.nanoseconds()
            try await connection.send(payload)
            let echoed = try await connection.receive(exactly: size)
            let elapsed = MonotonicClock.nanoseconds() - sent
            guard echoed == payload else {
                throw ConnectionError(.protocolViolation, "the echo of round trip \(index) differs from what was sent")
            }
            if index >= warmup { recorder.record(max(1, elapsed), endingAt: sent &+ elapsed) }
            progress.last.store(sent &+ elapsed, ordering: .relaxed)
        }
        let end = MonotonicClock.nanoseconds()
        recorder.finish(at: end)
        return Samples(
            histogram: recorder.histogram, raw: recorder.raw, lost: 0, stale: 0,
            elapsedNanoseconds: start == 0 ? 0 : end - start)
    }

    private final class Probe: Sendable {
        struct State {
            var sequence: UInt64 = 0
            var payload: [UInt8] = []
            var sentAt: UInt64 = 0
            var lost = 0
            var finished = false
        }
        let state = Guarded(State())
    }

    private func runMessages(
        _ connection: any Connection, _ progress: Progress
    ) async throws(ConnectionError) -> Samples {
        var recorder = Recorder(self)
        let probe = Probe()
        let timeout = lossTimeout
        let timeoutNanoseconds = timeout.wholeNanoseconds
        // The watchdog (UDP only: a WebSocket delivers every message, however late): re-sends the current probe
        // when its echo is overdue. A task per connection that wakes every `timeout / 4`: WebSocket fan-ins of
        // thousands of connections once paid for it in timer wake-ups, and in duplicate messages once a busy
        // server's round trips passed 200 ms.
        let watchdog = Task {
            guard connection.transport == .udp else { return }
            while !Task.isCancelled {
                try? await Task.sleep(for: timeout / 4)
                let resend: [UInt8]? = probe.state.withLock { state in
                    guard !state.finished, state.sentAt != 0 else { return nil }
                    let now = MonotonicClock.nanoseconds()
                    guard now - state.sentAt > timeoutNanoseconds else { return nil }
                    state.lost += 1
                    state.sentAt = now
                    return state.payload
                }
                if let resend { try? await connection.send(resend) }
            }
        }
        defer { watchdog.cancel() }
        var stale = 0
        var payload = [UInt8](repeating: 0x5a, count: size)
        var start: UInt64 = 0
        var deadline = UInt64.max
        for index in 0..<(warmup + count) {
            if let stop, stop.isRequested { break }
            if index == warmup {
                start = MonotonicClock.nanoseconds()
                recorder.begin(at: start)
                deadline = endOfWindow(from: start)
                probe.state.withLock { $0.lost = 0 }
            }
            if index >= warmup + minimumCount, deadline != .max, MonotonicClock.nanoseconds() >= deadline { break }
            let outgoing: Message
            if let messageMaker {
                outgoing = messageMaker(index)
                payload = outgoing.bytes
            } else {
                Self.stamp(&payload, UInt64(index))
                outgoing = Message(payload)
            }
            let now = MonotonicClock.nanoseconds()
            probe.state.withLock { state in
                state.sequence = UInt64(index)
                state.payload = payload
                state.sentAt = now
            }
            try await connection.send(outgoing)
            while true {
                guard let message = try await connection.receive() else {
                    throw ConnectionError(.closed, "the peer ended the connection")
                }
                let end = MonotonicClock.nanoseconds()
                if message.bytes == payload {
                    let sentAt = probe.state.withLock { state in
                        defer { state.sentAt = 0 }
                        return state.sentAt
                    }
                    // The watchdog may have re-sent (and stamped sentAt) after `end` was read.
                    if index >= warmup { recorder.record(end > sentAt ? end - sentAt : 1, endingAt: end) }
                    progress.last.store(end, ordering: .relaxed)
                    break
                }
                stale += 1
            }
        }
        let end = MonotonicClock.nanoseconds()
        recorder.finish(at: end)
        let lost = probe.state.withLock { state in
            state.finished = true
            return state.lost
        }
        return Samples(
            histogram: recorder.histogram, raw: recorder.raw, lost: lost, stale: stale,
            elapsedNanoseconds: start == 0 ? 0 : end - start)
    }

    /// Where both loops put a measured round trip: the run's histogram and, when asked, the raw samples and the
    /// current interval's histogram (handed to ``onInterval`` when the interval is over).
    struct Recorder {
        var histogram: Histogram<UInt64>?
        var raw: [UInt64]?
        var interval: Histogram<UInt64>?
        let every: UInt64
        let onInterval: (@Sendable (Interval) -> Void)?
        var measuringSince: UInt64 = 0
        var intervalSince: UInt64 = 0

        init(_ runner: PingRunner) {
            raw = runner.keepsSamples ? [] : nil
            histogram = runner.keepsHistogram || !runner.keepsSamples ? LatencySummary.makeHistogram() : nil
            raw?.reserveCapacity(min(runner.count, 1 << 24))
            onInterval = runner.onInterval
            every = runner.reportEvery.map { UInt64(max(1, $0.wholeNanoseconds)) } ?? .max
            interval = onInterval != nil && runner.reportEvery != nil ? LatencySummary.makeHistogram() : nil
        }

        mutating func begin(at now: UInt64) {
            measuringSince = now
            intervalSince = now
        }

        @inline(__always)
        mutating func record(_ elapsed: UInt64, endingAt end: UInt64) {
            _ = histogram?.record(elapsed)
            raw?.append(elapsed)
            guard interval != nil else { return }
            _ = interval!.record(elapsed)
            if end &- intervalSince >= every { flush(at: end) }
        }

        /// The last, partial interval.
        mutating func finish(at end: UInt64) {
            if interval != nil { flush(at: max(end, intervalSince)) }
        }

        private mutating func flush(at end: UInt64) {
            guard let current = interval, current.totalCount > 0, let onInterval else { return }
            onInterval(
                Interval(
                    from: .nanoseconds(Int64(intervalSince &- measuringSince)),
                    to: .nanoseconds(Int64(end &- measuringSince)), histogram: current))
            interval!.reset()
            intervalSince = end
        }
    }

    /// Writes the sequence number into the first (up to) 8 bytes, so each probe differs from the last.
    static func stamp(_ payload: inout [UInt8], _ sequence: UInt64) {
        for offset in 0..<min(8, payload.count) {
            payload[offset] = UInt8(truncatingIfNeeded: sequence >> (8 * UInt64(offset)))
        }
    }
}
