public import ConnectionCore
public import Histogram
import POSIXSupport
import Synchronization

/// One load host's part of a load spread over several (`sockbench fleet`, run by `sockbench serve --agent`): its
/// connections opened and warmed first (``prepare(_:connect:warmup:)``), then, at the moment the coordinator
/// names, one measured window on all of them at once (``run(window:keepsSamples:)``). Preparing and measuring are
/// apart so that every host is connected and warm before any host's window opens.
public struct FleetShare: Sendable {
    /// What a host runs.
    public enum Load: Sendable, Hashable, CustomStringConvertible {
        /// `connections` connections, each in closed-loop 64-byte round trips.
        case fanin(connections: Int)
        /// 64-byte messages on one connection, `perSecond` of them a second on a schedule (open loop; latency from
        /// the time each was meant to go).
        case rate(perSecond: Int)
        /// A ``Workload`` (its connections each at its rate, for its seconds: the window is the workload's own).
        case workload(Workload)
        /// Clients of a broadcast server (`serve --broadcast`), each having said hello: they only receive; the
        /// coordinator asks for the broadcasts and the window is the load's seconds (``BroadcastLoad``).
        case broadcast(BroadcastLoad)

        /// `fanin-N`, `rate-PERSECOND` or `workload-NxRATE/s-SIZEB-SECONDSs`.
        public init?(_ text: String) {
            if text.hasPrefix("broadcast-") {
                guard let load = try? BroadcastLoad(name: String(text.dropFirst("broadcast-".count))),
                    load.clients <= 10_000
                else { return nil }
                self = .broadcast(load)
                return
            }
            if text.hasPrefix("workload-") {
                guard let workload = try? Workload(name: String(text.dropFirst("workload-".count))).validated()
                else { return nil }
                self = .workload(workload)
                return
            }
            let parts = text.split(separator: "-", maxSplits: 1)
            guard parts.count == 2, let number = Int(parts[1]), number >= 1 else { return nil }
            switch parts[0] {
            case "fanin" where number <= 10_000: self = .fanin(connections: number)
            case "rate" where number <= 1_000_000: self = .rate(perSecond: number)
            default: return nil
            }
        }

        public var description: String {
            switch self {
            case .fanin(let connections): "fanin-\(connections)"
            case .rate(let perSecond): "rate-\(perSecond)"
            case .workload(let workload): "\(workload)"
            case .broadcast(let load): "\(load)"
            }
        }

        /// The connections an agent opens for it.
        public var connections: Int {
            switch self {
            case .fanin(let connections): connections
            case .rate: 1
            case .workload(let workload): workload.connections + (workload.bulk ?? 0)
            case .broadcast(let load): load.clients
            }
        }

        /// The window a workload sets itself (its seconds), else `nil` (the coordinator's).
        public var window: Duration? {
            switch self {
            case .workload(let workload): .nanoseconds(Int64(workload.seconds * 1e9))
            case .broadcast(let load): load.seconds.map { .nanoseconds(Int64($0 * 1e9)) }
            default: nil
            }
        }
    }

    public let load: Load
    private let clients: [any Connection]
    /// A workload runs as one piece (``WorkloadRunner`` opens its connections itself): it waits at the start of
    /// its window until ``run(window:keepsSamples:)`` opens `go`, and hands its times to `times`.
    private let running: Task<ConnectionError?, Never>?
    private let go: Latch?
    private let times: KeptTimes?

    /// Opens the load's connections with `connect` and makes `warmup` round trips on each (at least one: the
    /// server has accepted and set up every connection before the window). On failure every connection opened is
    /// closed.
    public static func prepare(
        _ load: Load, warmup: Int = 20,
        connect: @escaping @Sendable () async throws(ConnectionError) -> any Connection
    ) async throws(ConnectionError) -> FleetShare {
        if case .workload(let workload) = load { return try await prepare(workload, connect: connect) }
        let warm = {
            var runner = PingRunner(size: 64, count: max(1, warmup), warmup: 0, timeout: .seconds(10))
            runner.keepsHistogram = false
            return runner
        }()
        let broadcast: Bool
        if case .broadcast = load { broadcast = true } else { broadcast = false }
        let clients = try await ConnectionBatch.open(load.connections, connect: connect) {
            connection async throws(ConnectionError) in
            if broadcast {
                try await BroadcastReceipts.hello(on: connection)
            } else {
                _ = try await warm.measure(on: connection)
            }
        }
        return FleetShare(load: load, clients: clients, running: nil, go: nil, times: nil)
    }

    /// A workload's runner started and held at the start of its window, every connection open and answered once.
    private static func prepare(
        _ workload: Workload, connect: @escaping @Sendable () async throws(ConnectionError) -> any Connection
    ) async throws(ConnectionError) -> FleetShare {
        let (ready, go, times, early) = (Latch(), Latch(), KeptTimes(), KeptTimes())
        var runner = WorkloadRunner(workload, warmup: .zero, pacing: .sleep)
        runner.onTimes = { kept in times.times.withLock { $0 = kept } }
        let configured = runner
        let running = Task { () -> ConnectionError? in
            do throws(ConnectionError) {
                _ = try await configured.run(
                    startWindow: {
                        ready.open()
                        await go.wait()
                    }, connect: connect)
                return nil
            } catch {
                // Failed before its window (a connection refused): `ready` is opened to say so.
                if !go.isOpen { early.error.withLock { $0 = error } }
                ready.open()
                return error
            }
        }
        await ready.wait()
        if let error = early.error.withLock({ $0 }) { throw error }
        return FleetShare(load: .workload(workload), clients: [], running: running, go: go, times: times)
    }

    /// What one host measured in its window.
    public struct Outcome: Sendable, Codable {
        /// When the window opened and closed, on this host's monotonic clock, nanoseconds.
        public var start: UInt64
        public var end: UInt64
        /// Round trips (fan-in) or echoed messages (rate) recorded.
        public var count: Int
        /// Messages never echoed (rate), round trips cut off by an error.
        public var lost: Int
        /// Connections that failed during the window, and the first failure.
        public var failedConnections: Int
        public var firstError: String?
        /// Every latency recorded, nanoseconds.
        public var histogram: SparseHistogram
        /// The latencies one by one (only when asked for: a test checks the merge against them).
        public var samples: [UInt64]?
        /// A broadcast load's receipts: per message the first and last arrival and how many clients got it, on the
        /// coordinator's clock (the agent's clock offset taken off).
        public var broadcast: BroadcastClientReport?
    }

    /// One window of `window` on every connection at once, starting now. A connection that fails is counted and
    /// its round trips so far are lost; the others go on.
    public func run(window: Duration, keepsSamples: Bool) async -> Outcome {
        let start = MonotonicClock.nanoseconds()
        var histogram = LatencySummary.makeHistogram()
        var samples: [UInt64] = []
        var lost = 0
        var failures: [ConnectionError] = []
        // An open-loop run's messages, from when each was meant to go.
        func record(_ times: RateRunner.Times) {
            let (latencies, never) = times.latenciesFromIntended()
            for latency in latencies { _ = histogram.record(latency) }
            if keepsSamples { samples += latencies }
            lost += never
        }
        switch load {
        case .fanin:
            // A connection makes at most 100,000 round trips a second (a loopback round trip takes 10 us or more).
            let most = max(1_000, Int(Double(window.wholeNanoseconds) / 1e9 * 100_000))
            var runner = PingRunner(size: 64, count: most, warmup: 0, timeout: .seconds(5))
            runner.duration = window
            runner.keepsSamples = true
            runner.keepsHistogram = false
            let results = await FaninRunner.everyClient(clients, runner)
            for result in results {
                switch result {
                case .success(let run):
                    for value in run.raw ?? [] { _ = histogram.record(value) }
                    if keepsSamples { samples += run.raw ?? [] }
                case .failure(let error): failures.append(error)
                }
            }
        case .workload:
            go?.open()
            if let failure = await running?.value { failures.append(failure) }
            if let kept = times?.times.withLock({ $0 }) { record(kept) }
        case .broadcast:
            failures.append(ConnectionError(.unsupported, "a broadcast load runs with receiveBroadcasts"))
        case .rate(let perSecond):
            let runner = RateRunner(perSecond: perSecond, duration: window, warmup: .zero, pacing: .sleep)
            do throws(ConnectionError) {
                record(try await runner.sendTimes(on: clients[0]))
            } catch {
                failures.append(error)
            }
        }
        return Outcome(
            start: start, end: MonotonicClock.nanoseconds(), count: Int(histogram.totalCount), lost: lost,
            failedConnections: failures.count, firstError: failures.first.map { "\($0)" },
            histogram: SparseHistogram(histogram), samples: keepsSamples ? samples : nil)
    }

    /// A broadcast load's window: every client receives until it has had message `messages - 1`, or until
    /// `deadline` (then every connection is closed); latencies from each request's send time, with this host's
    /// clock turned into the coordinator's (`clockOffset`, this clock minus that one, taken off every arrival).
    public func receiveBroadcasts(
        messages: Int, warmup: Int, clockOffset: Int64, deadline: Duration, keepsSamples: Bool
    ) async -> Outcome {
        let start = MonotonicClock.nanoseconds()
        let last = UInt64(max(1, messages) - 1)
        let all = clients
        let stop = Task {
            guard (try? await Task.sleep(for: deadline)) != nil else { return }
            for client in all { await client.close() }
        }
        let receipts = await withTaskGroup(of: BroadcastReceipts.self) { group in
            for client in all {
                group.addTask(executorPreference: client.preferredExecutor) {
                    await BroadcastReceipts.receive(on: client, clockOffset: clockOffset) { $0 >= last }
                }
            }
            var collected: [BroadcastReceipts] = []
            for await receipts in group { collected.append(receipts) }
            return collected
        }
        stop.cancel()
        let report = BroadcastClientReport(receipts, warmup: UInt64(warmup), cpuNanoseconds: 0)
        var samples: [UInt64] = []
        if keepsSamples {
            for client in receipts {
                for (index, sequence) in client.sequences.enumerated() where sequence >= UInt64(warmup) {
                    samples.append(max(1, client.latencies[index]))
                }
            }
        }
        return Outcome(
            start: start, end: MonotonicClock.nanoseconds(), count: Int(report.histogram.totalCount), lost: 0,
            failedConnections: 0, firstError: nil, histogram: SparseHistogram(report.histogram),
            samples: keepsSamples ? samples : nil, broadcast: report)
    }

    /// Closes every connection (a workload not run is let go: its runner closes its own).
    public func close() async {
        for client in clients { await client.close() }
        if let running, let go, !go.isOpen {
            running.cancel()
            go.open()
            _ = await running.value
        }
    }
}

/// What a workload's runner hands over from its task: its times, or the error that ended it before its window.
final class KeptTimes: Sendable {
    let times = Mutex<RateRunner.Times?>(nil)
    let error = Mutex<ConnectionError?>(nil)
}

/// Opens once; waiters before and after go on.
final class Latch: Sendable {
    private let state = Mutex<(open: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    func open() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.open = true
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    var isOpen: Bool { state.withLock { $0.open } }

    func wait() async {
        await withCheckedContinuation { continuation in
            let now = state.withLock { state -> Bool in
                if state.open { return true }
                state.waiters.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }
}

/// A latency histogram as the values it holds and their counts: what a load host sends back, a few KiB where
/// the whole histogram (every bucket from 1 ns to 60 s) would be hundreds. ``histogram`` rebuilds it exactly:
/// each value stands for its bucket, and recording it again lands in the same one.
public struct SparseHistogram: Sendable, Codable, Equatable {
    public var values: [UInt64]
    public var counts: [UInt64]

    public init(_ histogram: Histogram<UInt64>) {
        values = []
        counts = []
        for bucket in histogram.recordedValues() {
            values.append(bucket.value)
            counts.append(bucket.count)
        }
    }

    /// The histogram of `samples`, nanoseconds.
    public init(samples: [UInt64]) {
        var histogram = LatencySummary.makeHistogram()
        for sample in samples { _ = histogram.record(sample) }
        self.init(histogram)
    }

    /// The histogram again (``LatencySummary/makeHistogram()``'s range and precision).
    public var histogram: Histogram<UInt64> {
        var made = LatencySummary.makeHistogram()
        for (value, count) in zip(values, counts) { _ = made.record(value, count: count) }
        return made
    }

    public var totalCount: UInt64 { counts.reduce(0, +) }
}
