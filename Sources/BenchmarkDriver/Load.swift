public import ConnectionCore
import Histogram
import POSIXSupport
import Synchronization

/// Open-loop load: 64-byte messages sent on a fixed schedule (`perSecond`) for `duration`, echoed back. Each
/// message's latency is measured twice: from the time the schedule said it should go (coordinated omission
/// corrected: a stalled sender or server delays every message behind the stall, and that shows) and from the
/// time it actually went (what a closed-loop tool would report). The first `warmup` of the run is not recorded.
public struct RateRunner: Sendable {
    public var perSecond: Int
    public var duration: Duration
    public var warmup: Duration
    /// How the sender waits for each send time.
    public var pacing: Pacing
    public let size = 64

    public init(
        perSecond: Int, duration: Duration = .seconds(2), warmup: Duration = .milliseconds(250),
        pacing: Pacing = .spin
    ) {
        self.perSecond = perSecond
        self.duration = duration
        self.warmup = warmup
        self.pacing = pacing
    }

    /// Messages in all, warm-up included.
    public var total: Int { max(1, Int(Double(perSecond) * Double((duration + warmup).wholeNanoseconds) / 1e9)) }

    /// Messages of the warm-up (not recorded).
    public var skip: Int { Int(Double(perSecond) * Double(warmup.wholeNanoseconds) / 1e9) }

    public func run(on connection: any Connection) async throws(ConnectionError) -> ScenarioResult {
        let times = try await sendTimes(on: connection)
        var measurement = result(intended: times.intended, actual: times.actual, received: times.received)
        measurement.pacingCPUNanoseconds = times.pacingCPUNanoseconds
        return measurement
    }

    /// When each message was meant to go, went and came back (0: never), and the pacer's CPU time: what ``run(on:)``
    /// sums up, for a caller that keeps the latencies themselves (a load spread over hosts merges them).
    public struct Times: Sendable {
        public var intended: [UInt64]
        public var actual: [UInt64]
        public var received: [UInt64]
        public var pacingCPUNanoseconds: UInt64

        /// Each echoed message's latency from when it was meant to go (in send order), and how many sent messages
        /// never came back.
        public func latenciesFromIntended() -> (latencies: [UInt64], lost: Int) {
            var latencies: [UInt64] = []
            var lost = 0
            for index in intended.indices where actual[index] != 0 {
                guard received[index] != 0 else {
                    lost += 1
                    continue
                }
                latencies.append(max(1, received[index] &- intended[index]))
            }
            return (latencies, lost)
        }
    }

    /// The schedule run on `connection`: every message's times.
    public func sendTimes(on connection: any Connection) async throws(ConnectionError) -> Times {
        let total = total
        let interval = 1e9 / Double(perSecond)
        let stream = connection.transport.isByteStream
        let size = size
        let pacer = Pacer(
            start: MonotonicClock.nanoseconds() + 1_000_000, interval: interval, count: total, pacing: pacing)
        // Each side keeps its own times, with no lock between them: what follows a send or an echo is on the
        // next message's path when the side shares its thread with the other (a loop backend's sender and
        // receiver), so it is kept to a store.
        enum Part {
            case receiver([UInt64], ConnectionError?)
            case sender(intended: [UInt64], actual: [UInt64], ConnectionError?)
            case timer
        }
        var intended: [UInt64] = []
        var actual: [UInt64] = []
        var received: [UInt64] = []
        let failure: ConnectionError? = await withTaskGroup(of: Part.self) { group in
            // The receiver, on the connection's executor (resumed by I/O without a hop), only notes when each echo
            // came back (the latencies are worked out afterwards): a read into a buffer it keeps, a clock and a
            // store per echo, as in the C floor's client (no array per echo).
            group.addTask(executorPreference: connection.preferredExecutor) {
                var times = [UInt64](repeating: 0, count: total)
                var count = 0
                let buffer = UnsafeMutableRawBufferPointer.allocate(
                    byteCount: stream ? size : connection.options.maxDatagramSize, alignment: 16)
                defer { buffer.deallocate() }
                do throws(ConnectionError) {
                    while count < total {
                        if stream {
                            // Exactly one message's bytes, however the stream splits them.
                            var filled = 0
                            while filled < size {
                                guard
                                    let got = try await connection.receive(
                                        into: UnsafeMutableRawBufferPointer(rebasing: buffer[filled..<size]))
                                else { throw ConnectionError(.closed, "stream ended after \(filled) of \(size) bytes") }
                                filled += got.count
                            }
                        } else {
                            guard let got = try await connection.receive(into: buffer) else { break }
                            guard got.count >= 8 else { continue }
                        }
                        let now = MonotonicClock.nanoseconds()
                        let sequence = Int(PumpSink.decode(UnsafeRawBufferPointer(buffer), at: 0))
                        guard sequence < total, times[sequence] == 0 else { continue }
                        times[sequence] = now
                        count += 1
                    }
                } catch {
                    return .receiver(times, error.kind == .cancelled ? nil : error)
                }
                return .receiver(times, nil)
            }
            // The sender waits for each message's time on the pacer (which spins or sleeps on a thread of its
            // own; its lateness shows in the corrected latency, as it should), notes the time and sends. It runs
            // where its send costs no hand-over: on the pacer's thread, as the C floor's sender does, when the
            // connection sends from any thread; otherwise on the connection's executor, beside the receiver (a
            // sender spinning there itself would starve the receiver).
            let sendsHere: any TaskExecutor =
                connection.sendsFromAnyThread ? pacer : connection.preferredExecutor ?? pacer
            group.addTask(executorPreference: sendsHere) {
                var intended = [UInt64](repeating: 0, count: total)
                var actual = [UInt64](repeating: 0, count: total)
                var payload = [UInt8](repeating: 0x5a, count: size)
                for sequence in 0..<total {
                    await pacer.wait(for: sequence)
                    if Task.isCancelled { break }  // the receiver failed
                    actual[sequence] = MonotonicClock.nanoseconds()
                    intended[sequence] = pacer.due(sequence)
                    PumpSink.encode(UInt64(sequence), into: &payload)
                    do throws(ConnectionError) {
                        try await connection.send(payload)
                    } catch {
                        return .sender(intended: intended, actual: actual, error)
                    }
                }
                return .sender(intended: intended, actual: actual, nil)
            }
            var sendFailure: ConnectionError?
            var receiveFailure: ConnectionError?
            while let part = await group.next() {
                switch part {
                case .sender(let sentAt, let wentAt, let failure):
                    (intended, actual) = (sentAt, wentAt)
                    sendFailure = failure
                    // Echoes still in flight get half a second; UDP datagrams that never come are counted as lost.
                    group.addTask {
                        try? await Task.sleep(for: .milliseconds(500))
                        return .timer
                    }
                case .receiver(let times, let failure):
                    received = times
                    receiveFailure = failure
                    group.cancelAll()
                case .timer:
                    group.cancelAll()
                }
            }
            return sendFailure ?? receiveFailure
        }
        let pacerCPU = await pacer.end()
        if let failure { throw failure }
        return Times(intended: intended, actual: actual, received: received, pacingCPUNanoseconds: pacerCPU)
    }

    /// The figures of a run from when each message was meant to go, went and came back (0: never): latency
    /// from the intended time (corrected) and from the actual one, past the warm-up; loss; the rate echoes came
    /// back at, from the first send time to the last echo. Shared with the C floor's open-loop client, so both are summed up alike.
    public func result(intended: [UInt64], actual: [UInt64], received: [UInt64]) -> ScenarioResult {
        var corrected = LatencySummary.makeHistogram()
        var uncorrected = LatencySummary.makeHistogram()
        let count = min(intended.count, actual.count, received.count)
        var echoed = 0
        var last: UInt64 = 0
        var fromActual: [UInt64] = []
        fromActual.reserveCapacity(max(0, count - skip))
        for index in 0..<count where actual[index] != 0 {
            last = max(last, actual[index], received[index])
            guard received[index] != 0 else { continue }
            echoed += 1
            guard index >= skip else { continue }
            _ = corrected.record(max(1, received[index] &- intended[index]))
            let latency = max(1, received[index] &- actual[index])
            _ = uncorrected.record(latency)
            fromActual.append(latency)
        }
        // From the first send time to the last echo (or send): echoes that trail the schedule by seconds, as under
        // overload, do not count as keeping up with it.
        let first = intended.first ?? 0
        let elapsed = max(1, last &- first)
        var measurement = ScenarioResult()
        measurement.latency = LatencySummary(corrected)
        measurement.uncorrectedLatency = LatencySummary(uncorrected)
        // From the actual send time, in send order: the row's p50 while the machine ran at its quicker speed.
        measurement.quietP50 = QuietP50.of(fromActual, messages: QuietP50.openLoopMessages(perSecond: perSecond))
        measurement.messages = total - skip
        measurement.lost = total - echoed
        measurement.elapsedNanoseconds = elapsed
        measurement.messagesPerSecond = Double(echoed) / (Double(elapsed) / 1e9)
        return measurement
    }
}

/// Fan-in: `connections` clients at once against one server, each in closed-loop round trips of `size` bytes
/// (`count` each after `warmup`). Latency under load is every client's samples merged; throughput is every
/// round trip over the wall-clock time of the whole.
public struct FaninRunner: Sendable {
    public var connections: Int
    public var size: Int
    public var count: Int
    public var warmup: Int

    public init(connections: Int, size: Int = 64, count: Int, warmup: Int) {
        self.connections = connections
        self.size = size
        self.count = count
        self.warmup = warmup
    }

    /// Opens the connections with `connect` (in batches of 64, so a listen backlog is not overrun), makes one
    /// round trip on each, runs them all at once, closes them. With `serverUsage` (the server process's usage),
    /// the server's and this process's resident memory is read before connecting and once every connection has
    /// made its first round trip: the growth per connection is the memory of an open, idle connection.
    public func run(
        serverUsage: (() async -> ResourceUsage?)? = nil,
        connect: @escaping @Sendable () async throws(ConnectionError) -> any Connection
    ) async throws(ConnectionError) -> ScenarioResult {
        let opened = try await Self.open(connections, size: size, serverUsage: serverUsage, connect: connect)
        let clients = opened.clients
        let start = MonotonicClock.nanoseconds()
        var runner = PingRunner(size: size, count: count, warmup: warmup)
        runner.keepsSamples = true
        runner.keepsHistogram = false
        let results = await Self.everyClient(clients, runner)
        let elapsed = MonotonicClock.nanoseconds() - start
        for client in clients { await client.close() }
        var merged = LatencySummary.makeHistogram()
        var lost = 0
        var throughputs: [Double] = []
        var latencies: [[UInt64]] = []
        for result in results {
            let run = try result.get()
            for value in run.raw ?? [] { _ = merged.record(value) }
            lost += run.lost
            // Each connection made the same count of round trips: one that waited longer took longer.
            throughputs.append(Double(count) / (Double(max(1, run.elapsedNanoseconds)) / 1e9))
            latencies.append(run.raw ?? [])
        }
        var measurement = ScenarioResult()
        measurement.latency = LatencySummary(merged)
        measurement.messages = connections * count
        measurement.lost = lost
        measurement.elapsedNanoseconds = elapsed
        let perConnectionTotal = Double(connections * (count + warmup))
        measurement.messagesPerSecond = perConnectionTotal / (Double(elapsed) / 1e9)
        measurement.bytesPerSecond = perConnectionTotal * Double(size) / (Double(elapsed) / 1e9)
        measurement.serverKiBPerConnection = opened.serverKiBPerConnection
        measurement.clientKiBPerConnection = opened.clientKiBPerConnection
        measurement.serverThreadsOpen = opened.serverThreadsOpen
        measurement.fairness = Fairness(throughputs: throughputs, latencies: latencies)
        return measurement
    }

    /// Connections open and idle, each having made one round trip, and what they cost in memory.
    struct Opened {
        var clients: [any Connection]
        /// Growth of the server's and this process's resident memory per connection, KiB (`nil`: not read).
        var serverKiBPerConnection: Double?
        var clientKiBPerConnection: Double?
        /// The server's threads with every connection open.
        var serverThreadsOpen: Int?
    }

    /// Opens `connections` with `connect` (in batches of 64, so a listen backlog is not overrun) and makes one
    /// `size`-byte round trip on each, so that the server has accepted, set up and served every one. With
    /// `serverUsage` (the server process's usage), the server's and this process's resident memory is read
    /// before and after: the growth per connection is the memory of an open, idle connection. On failure every
    /// connection opened is closed.
    static func open(
        _ connections: Int, size: Int, serverUsage: (() async -> ResourceUsage?)?,
        connect: @escaping @Sendable () async throws(ConnectionError) -> any Connection
    ) async throws(ConnectionError) -> Opened {
        let serverBefore = await serverUsage?()?.residentKiB
        let clientBefore = ResourceUsage.read()?.residentKiB
        let clients = try await ConnectionBatch.open(connections, connect: connect)
        var once = PingRunner(size: size, count: 1, warmup: 0)
        once.keepsSamples = true
        once.keepsHistogram = false
        let first = await everyClient(clients, once)
        for case .failure(let error) in first {
            for client in clients { await client.close() }
            throw error
        }
        var result = Opened(clients: clients)
        var serverAfter: ResourceUsage?
        if let serverUsage { serverAfter = await serverUsage() }
        result.serverThreadsOpen = serverAfter.map { Int($0.threads) }
        if let before = serverBefore, let after = serverAfter?.residentKiB {
            result.serverKiBPerConnection = (Double(after) - Double(before)) / Double(connections)
        }
        if let before = clientBefore, let after = ResourceUsage.read()?.residentKiB {
            result.clientKiBPerConnection = (Double(after) - Double(before)) / Double(connections)
        }
        return result
    }

    /// `runner`'s round trips on every client at once, a task each.
    static func everyClient(
        _ clients: [any Connection], _ runner: PingRunner
    ) async -> [Result<PingRunner.Samples, ConnectionError>] {
        await withTaskGroup(of: Result<PingRunner.Samples, ConnectionError>.self) { group in
            for client in clients {
                group.addTask {
                    do throws(ConnectionError) { return .success(try await runner.measure(on: client)) } catch {
                        return .failure(error)
                    }
                }
            }
            var results: [Result<PingRunner.Samples, ConnectionError>] = []
            for await result in group { results.append(result) }
            return results
        }
    }
}

/// Connections opened and closed one after another: the time `connect` takes (TCP handshake, plus TLS, plus
/// WebSocket upgrade, as the transport has them) and connections per second (closing included).
public struct ConnectRunner: Sendable {
    public var count: Int
    public var warmup: Int

    public init(count: Int, warmup: Int = 5) {
        self.count = count
        self.warmup = warmup
    }

    public func run(
        connect: @Sendable () async throws(ConnectionError) -> any Connection
    ) async throws(ConnectionError) -> ScenarioResult {
        var histogram = LatencySummary.makeHistogram()
        var start: UInt64 = 0
        for index in 0..<(warmup + count) {
            if index == warmup { start = MonotonicClock.nanoseconds() }
            let before = MonotonicClock.nanoseconds()
            let connection = try await connect()
            let after = MonotonicClock.nanoseconds()
            if index >= warmup { _ = histogram.record(max(1, after - before)) }
            await connection.close()
        }
        let elapsed = MonotonicClock.nanoseconds() - start
        var measurement = ScenarioResult()
        measurement.latency = LatencySummary(histogram)
        measurement.messages = count
        measurement.elapsedNanoseconds = elapsed
        measurement.messagesPerSecond = Double(count) / (Double(elapsed) / 1e9)
        return measurement
    }
}
