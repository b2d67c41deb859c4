public import ConnectionCore
import POSIXSupport

/// Runs a ``Workload``: opens its connections (memory per idle connection read as in fan-in), then sends on a
/// schedule over all of them, message `i` on connection `i mod N` at `start + i / (N x rate)` (so each
/// connection sends at its own rate and the server sees the total evenly spread), every message echoed. Each
/// connection has a sender and a receiver of its own on the connection's executor; the senders keep the schedule
/// on one ``Pacer``'s clock, as the rate runner's does. Latency from the intended send time (a late sender or a stalled
/// server shows in every message behind the stall) and from the actual one, summed up by
/// ``RateRunner/result(intended:actual:received:)`` like every open-loop row.
public struct WorkloadRunner: Sendable {
    public var workload: Workload
    public var warmup: Duration
    public var pacing: Pacing
    /// Handed every message's times once the window is over (and before a failure is thrown), for a caller that
    /// keeps the latencies themselves: a load host of `sockbench fleet` sends them on as a histogram.
    public var onTimes: (@Sendable (RateRunner.Times) -> Void)?

    public init(_ workload: Workload, warmup: Duration = .milliseconds(250), pacing: Pacing = .spin) {
        self.workload = workload
        self.warmup = warmup
        self.pacing = pacing
    }

    /// The schedule as a rate runner over the total rate: its message count, warm-up and summing up.
    var schedule: RateRunner {
        RateRunner(
            perSecond: max(1, Int(workload.totalPerSecond.rounded())),
            duration: .nanoseconds(Int64(workload.seconds * 1e9)), warmup: warmup, pacing: pacing)
    }

    /// What each connection's receiver notes: which message came back, and when.
    private struct Echo {
        var sequence: Int
        var at: UInt64
    }

    /// What each connection's sender notes: which message went, when it was meant to and when it did.
    private struct Send {
        var sequence: Int
        var intended: UInt64
        var actual: UInt64
    }

    private enum Part {
        case receiver([Echo], ConnectionError?)
        case sender([Send], ConnectionError?)
        case timer
    }

    /// The measured window: `startWindow` is called once the connections are open (opening them is not the
    /// load's cost), `endWindow` when the last echo is in (or given up on), before the connections close (a
    /// server's per-connection threads, and the CPU time they account for, end with them).
    public func run(
        serverUsage: (() async -> ResourceUsage?)? = nil, startWindow: () async -> Void = {},
        endWindow: () async -> Void = {},
        connect: @escaping @Sendable () async throws(ConnectionError) -> any Connection
    ) async throws(ConnectionError) -> ScenarioResult {
        let opened = try await FaninRunner.open(
            workload.connections, size: workload.size, serverUsage: serverUsage, connect: connect)
        let clients = opened.clients
        // Bulk connections beside the load (`bulk=K`): each keeps as much in flight as ``LoadedRunner``'s flows,
        // from before the window opens to its end; the bytes echoed in the window are what they got meanwhile.
        var flows: [LoadedRunner.Flow] = []
        do throws(ConnectionError) {
            for _ in 0..<(workload.bulk ?? 0) {
                let connection = try await connect()
                flows.append(
                    LoadedRunner.Flow(connection, size: connection.transport == .udp ? 1_400 : 65_536, window: 8))
            }
        } catch {
            for flow in flows { await flow.connection.abort() }
            for client in clients { await client.close() }
            throw error
        }
        let bulk = flows
        let bulkTasks = Task {
            await withTaskGroup(of: Void.self) { group in
                for flow in bulk {
                    group.addTask(executorPreference: flow.connection.preferredExecutor) { await flow.send() }
                    group.addTask(executorPreference: flow.connection.preferredExecutor) { await flow.receive() }
                    if flow.connection.transport == .udp {
                        group.addTask { await flow.refill(after: .milliseconds(50)) }
                    }
                }
            }
        }
        for flow in bulk { await flow.firstEcho() }
        let bulkBefore = bulk.map(\.echoedBytes)
        let bulkStart = MonotonicClock.nanoseconds()
        await startWindow()
        let schedule = schedule
        let total = schedule.total
        let size = workload.size
        let pacer = Pacer(
            start: MonotonicClock.nanoseconds() + 1_000_000, interval: 1e9 / workload.totalPerSecond, count: total,
            pacing: pacing)
        let count = clients.count
        var intended = [UInt64](repeating: 0, count: total)
        var actual = [UInt64](repeating: 0, count: total)
        var received = [UInt64](repeating: 0, count: total)
        var failure: ConnectionError?
        await withTaskGroup(of: Part.self) { group in
            for (index, connection) in clients.enumerated() {
                // Messages index, index + N, ...: how many come back to this connection.
                let expected = index < total ? (total - index + count - 1) / count : 0
                let stream = connection.transport.isByteStream
                group.addTask(executorPreference: connection.preferredExecutor) {
                    var echoes: [Echo] = []
                    echoes.reserveCapacity(expected)
                    do throws(ConnectionError) {
                        while echoes.count < expected {
                            let sequence: Int
                            if stream {
                                let bytes = try await connection.receive(exactly: size)
                                sequence = Int(PumpSink.decode(bytes, at: 0))
                            } else {
                                guard let message = try await connection.receive() else { break }
                                guard message.bytes.count >= 8 else { continue }
                                sequence = Int(PumpSink.decode(message.bytes, at: 0))
                            }
                            echoes.append(Echo(sequence: sequence, at: MonotonicClock.nanoseconds()))
                        }
                    } catch {
                        return .receiver(echoes, error.kind == .cancelled ? nil : error)
                    }
                    return .receiver(echoes, nil)
                }
            }
            // A sender per connection, on the connection's executor, as each client of a real load sends on its
            // own: it waits for its own messages' times on the shared pacer (which resumes it there), notes the
            // time and sends; a slow send holds back only its own connection's next messages.
            for (index, connection) in clients.enumerated() {
                group.addTask(executorPreference: connection.preferredExecutor) {
                    var sent: [Send] = []
                    sent.reserveCapacity(index < total ? (total - index + count - 1) / count : 0)
                    var payload = [UInt8](repeating: 0x5a, count: size)
                    for sequence in stride(from: index, to: total, by: count) {
                        let intended = pacer.due(sequence)
                        await pacer.wait(for: sequence)
                        if Task.isCancelled { break }  // a receiver or another sender failed
                        sent.append(Send(sequence: sequence, intended: intended, actual: MonotonicClock.nanoseconds()))
                        PumpSink.encode(UInt64(sequence), into: &payload)
                        do throws(ConnectionError) {
                            try await connection.send(payload)
                        } catch {
                            return .sender(sent, error)
                        }
                    }
                    return .sender(sent, nil)
                }
            }
            var receiversLeft = count
            var sendersLeft = count
            while let part = await group.next() {
                switch part {
                case .sender(let sent, let error):
                    for send in sent {
                        intended[send.sequence] = send.intended
                        actual[send.sequence] = send.actual
                    }
                    sendersLeft -= 1
                    if let error {
                        failure = failure ?? error
                        group.cancelAll()
                    } else if sendersLeft == 0 && receiversLeft > 0 {
                        // Echoes still in flight get half a second; what never comes is counted as lost.
                        group.addTask {
                            try? await Task.sleep(for: .milliseconds(500))
                            return .timer
                        }
                    }
                case .receiver(let echoes, let error):
                    receiversLeft -= 1
                    for echo in echoes where echo.sequence >= 0 && echo.sequence < total {
                        if received[echo.sequence] == 0 { received[echo.sequence] = echo.at }
                    }
                    if let error {
                        failure = failure ?? error
                        group.cancelAll()
                    } else if receiversLeft == 0 && sendersLeft == 0 {
                        group.cancelAll()  // the timer
                    }
                case .timer:
                    group.cancelAll()
                }
            }
        }
        let pacerCPU = await pacer.end()
        let bulkBytes = zip(bulk.map(\.echoedBytes), bulkBefore).map { $0 - $1 }
        let bulkElapsed = MonotonicClock.nanoseconds() &- bulkStart
        await endWindow()
        for flow in bulk { flow.stop() }
        for flow in bulk { await flow.connection.abort() }
        bulkTasks.cancel()
        await bulkTasks.value
        for client in clients { await client.close() }
        onTimes?(
            RateRunner.Times(intended: intended, actual: actual, received: received, pacingCPUNanoseconds: pacerCPU))
        if let failure { throw failure }
        var measurement = schedule.result(intended: intended, actual: actual, received: received)
        measurement.pacingCPUNanoseconds = pacerCPU
        measurement.bytesPerSecond = (measurement.messagesPerSecond ?? 0) * Double(size)
        measurement.serverKiBPerConnection = opened.serverKiBPerConnection
        measurement.clientKiBPerConnection = opened.clientKiBPerConnection
        measurement.fairness = Self.fairness(
            connections: count, skip: schedule.skip, intended: intended, received: received)
        if !bulk.isEmpty {
            measurement.bulkBytesPerSecond = Double(bulkBytes.reduce(0, +)) / (Double(max(1, bulkElapsed)) / 1e9)
        }
        return measurement
    }

    /// Every connection was offered the same rate (message i goes on connection i mod N): its share is the echoes
    /// it got back, its latency each answered message's from its intended send time, the warm-up left out.
    static func fairness(connections: Int, skip: Int, intended: [UInt64], received: [UInt64]) -> Fairness {
        var answered = [Double](repeating: 0, count: connections)
        var latencies = [[UInt64]](repeating: [], count: connections)
        let end = min(intended.count, received.count)
        for index in min(skip, end)..<end where received[index] != 0 && intended[index] != 0 {
            answered[index % connections] += 1
            latencies[index % connections].append(max(1, received[index] &- intended[index]))
        }
        return Fairness(throughputs: answered, latencies: latencies)
    }
}
