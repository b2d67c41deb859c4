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
    public let size = 64

    public init(perSecond: Int, duration: Duration = .seconds(2), warmup: Duration = .milliseconds(250)) {
        self.perSecond = perSecond
        self.duration = duration
        self.warmup = warmup
    }

    private final class Book: Sendable {
        let times: Guarded<(intended: [UInt64], actual: [UInt64])>
        init(count: Int) {
            times = Guarded(([UInt64](repeating: 0, count: count), [UInt64](repeating: 0, count: count)))
        }
    }

    public func run(on connection: any Connection) async throws(ConnectionError) -> ScenarioResult {
        let outcome: Result<ScenarioResult, ConnectionError> = await withTaskExecutorPreference(
            connection.preferredExecutor
        ) {
            do throws(ConnectionError) {
                return .success(try await measure(connection))
            } catch {
                return .failure(error)
            }
        }
        return try outcome.get()
    }

    private func measure(_ connection: any Connection) async throws(ConnectionError) -> ScenarioResult {
        let total = max(1, Int(Double(perSecond) * Double((duration + warmup).wholeNanoseconds) / 1e9))
        let skip = Int(Double(perSecond) * Double(warmup.wholeNanoseconds) / 1e9)
        let interval = 1e9 / Double(perSecond)
        let book = Book(count: total)
        let stream = connection.transport.isByteStream
        let size = size
        // The receiver: matches each echo to its sequence number and records both latencies.
        let receiver = Task { () -> (Histogram<UInt64>, Histogram<UInt64>, Int, ConnectionError?) in
            var corrected = LatencySummary.makeHistogram()
            var uncorrected = LatencySummary.makeHistogram()
            var received = 0
            do throws(ConnectionError) {
                while received < total {
                    let bytes: [UInt8]
                    if stream {
                        bytes = try await connection.receive(exactly: size)
                    } else {
                        guard let message = try await connection.receive() else { break }
                        bytes = message.bytes
                    }
                    let now = MonotonicClock.nanoseconds()
                    let sequence = Int(PumpSink.decode(bytes, at: 0))
                    guard sequence < total else { continue }
                    received += 1
                    guard sequence >= skip else { continue }
                    let (intended, actual) = book.times.withLock { ($0.intended[sequence], $0.actual[sequence]) }
                    _ = corrected.record(max(1, now &- intended))
                    _ = uncorrected.record(max(1, now &- actual))
                }
            } catch {
                return (corrected, uncorrected, received, error.kind == .cancelled ? nil : error)
            }
            return (corrected, uncorrected, received, nil)
        }
        var payload = [UInt8](repeating: 0x5a, count: size)
        let start = MonotonicClock.nanoseconds() + 1_000_000
        var sendFailure: ConnectionError?
        for sequence in 0..<total {
            let intended = start + UInt64(Double(sequence) * interval)
            var now = MonotonicClock.nanoseconds()
            // Sleep, never spin: a spinning sender would starve the event loop it may share with the receiver
            // (and, pinned, the server). Timer lateness shows up in the corrected latency, as it should.
            if intended > now { try? await Task.sleep(for: .nanoseconds(Int64(intended - now))) }
            now = MonotonicClock.nanoseconds()
            book.times.withLock {
                $0.intended[sequence] = intended
                $0.actual[sequence] = now
            }
            let encoded = PumpSink.encode(UInt64(sequence))
            for index in 0..<8 { payload[index] = encoded[index] }
            do throws(ConnectionError) {
                try await connection.send(payload)
            } catch {
                sendFailure = error
                break
            }
        }
        let sendEnd = MonotonicClock.nanoseconds()
        // Echoes still in flight get half a second; UDP datagrams that never come are counted as lost.
        _ = await runBounded(by: .milliseconds(500), onTimeout: { receiver.cancel() }) { _ = await receiver.value }
        receiver.cancel()
        let (corrected, uncorrected, received, receiveFailure) = await receiver.value
        if let failure = sendFailure ?? receiveFailure { throw failure }
        var measurement = ScenarioResult()
        measurement.latency = LatencySummary(corrected)
        measurement.uncorrectedLatency = LatencySummary(uncorrected)
        measurement.messages = total - skip
        measurement.lost = total - received
        measurement.elapsedNanoseconds = sendEnd - start
        measurement.messagesPerSecond = Double(received) / (Double(sendEnd - start) / 1e9)
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
        let serverBefore = await serverUsage?()?.residentKiB
        let clientBefore = ResourceUsage.read()?.residentKiB
        var clients: [any Connection] = []
        while clients.count < connections {
            let batch = min(64, connections - clients.count)
            let opened: [Result<any Connection, ConnectionError>] = await withTaskGroup(
                of: Result<any Connection, ConnectionError>.self
            ) { group in
                for _ in 0..<batch {
                    group.addTask {
                        do throws(ConnectionError) { return .success(try await connect()) } catch {
                            return .failure(error)
                        }
                    }
                }
                var results: [Result<any Connection, ConnectionError>] = []
                for await result in group { results.append(result) }
                return results
            }
            for result in opened {
                switch result {
                case .success(let connection): clients.append(connection)
                case .failure(let error):
                    for client in clients { await client.close() }
                    for case .success(let other) in opened { await other.close() }
                    throw error
                }
            }
        }
        // One round trip on each, so that the server has accepted, set up and served every connection.
        var once = PingRunner(size: size, count: 1, warmup: 0)
        once.keepsSamples = true
        once.keepsHistogram = false
        let first = await Self.everyClient(clients, once)
        for case .failure(let error) in first {
            for client in clients { await client.close() }
            throw error
        }
        var serverGrowth: Double?
        var clientGrowth: Double?
        if let before = serverBefore, let after = await serverUsage?()?.residentKiB {
            serverGrowth = (Double(after) - Double(before)) / Double(connections)
        }
        if let before = clientBefore, let after = ResourceUsage.read()?.residentKiB {
            clientGrowth = (Double(after) - Double(before)) / Double(connections)
        }
        let start = MonotonicClock.nanoseconds()
        var runner = PingRunner(size: size, count: count, warmup: warmup)
        runner.keepsSamples = true
        runner.keepsHistogram = false
        let results = await Self.everyClient(clients, runner)
        let elapsed = MonotonicClock.nanoseconds() - start
        for client in clients { await client.close() }
        var merged = LatencySummary.makeHistogram()
        var lost = 0
        for result in results {
            let run = try result.get()
            for value in run.raw ?? [] { _ = merged.record(value) }
            lost += run.lost
        }
        var measurement = ScenarioResult()
        measurement.latency = LatencySummary(merged)
        measurement.messages = connections * count
        measurement.lost = lost
        measurement.elapsedNanoseconds = elapsed
        let perConnectionTotal = Double(connections * (count + warmup))
        measurement.messagesPerSecond = perConnectionTotal / (Double(elapsed) / 1e9)
        measurement.bytesPerSecond = perConnectionTotal * Double(size) / (Double(elapsed) / 1e9)
        measurement.serverKiBPerConnection = serverGrowth
        measurement.clientKiBPerConnection = clientGrowth
        return measurement
    }

    /// `runner`'s round trips on every client at once, a task each.
    private static func everyClient(
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
