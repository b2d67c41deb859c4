public import ConnectionCore
import POSIXSupport
import Synchronization

/// Latency under load: closed-loop 64-byte round trips on one probe connection while `bulk` other connections to
/// the same server carry as much as they can, every byte echoed back and read. What an interactive client of a
/// busy server sees: a thread per connection, a loop and a completion ring queue the probe behind the bulk
/// traffic differently. An adaptation of the IETF responsiveness measure (draft-ietf-ippm-responsiveness: round
/// trips while load-generating connections fill the path), where what fills up is the server and its loop, not a
/// network path.
///
/// Each bulk connection keeps `window` messages of `bulkSize` bytes in flight (tcp and ws: 64 KiB writes; udp:
/// 1,400-byte datagrams) and sends the next as each echo comes back, so no sender runs ahead of the server
/// (a sender that never waits would starve its own side's loop, and measure the client). A udp window that
/// stalls (datagrams lost) is refilled after `lossTimeout`. The probe connects first and its round trips start
/// once every bulk connection has had an echo back; the bulk bytes echoed while it runs are the throughput
/// achieved meanwhile.
public struct LoadedRunner: Sendable {
    public var bulk: Int
    public var probe: PingRunner
    public var bulkSize: Int?
    public var window: Int
    public var lossTimeout: Duration

    /// `bulkSize` `nil`: 64 KiB over byte streams and WebSocket, 1,400 bytes over udp.
    public init(
        bulk: Int, probe: PingRunner, bulkSize: Int? = nil, window: Int = 8, lossTimeout: Duration = .milliseconds(50)
    ) {
        self.bulk = bulk
        self.probe = probe
        self.bulkSize = bulkSize
        self.window = window
        self.lossTimeout = lossTimeout
    }

    /// Runs the probe beside the bulk connections, all opened with `connect`, and closes them all. The result's
    /// latency, quiet p50, round trips per second and `lost` are the probe's; `bytesPerSecond` the bulk bytes
    /// echoed back per second while the probe ran; `fairness` over the bulk connections' bytes.
    public func run(
        connect: @escaping @Sendable () async throws(ConnectionError) -> any Connection
    ) async throws(ConnectionError) -> ScenarioResult {
        let prober = try await connect()
        var flows: [Flow] = []
        do throws(ConnectionError) {
            for _ in 0..<bulk {
                let connection = try await connect()
                let size = bulkSize ?? (connection.transport == .udp ? 1_400 : 65_536)
                flows.append(Flow(connection, size: size, window: window))
            }
        } catch {
            for flow in flows { await flow.connection.abort() }
            await prober.close()
            throw error
        }
        let flowsOpened = flows
        let lossTimeout = lossTimeout
        let probe = probe
        let outcome: Result<(PingRunner.Result, [Int], UInt64), ConnectionError> = await withTaskGroup(
            of: Void.self
        ) { group in
            for flow in flowsOpened {
                group.addTask(executorPreference: flow.connection.preferredExecutor) { await flow.send() }
                group.addTask(executorPreference: flow.connection.preferredExecutor) { await flow.receive() }
                if flow.connection.transport == .udp {
                    group.addTask { await flow.refill(after: lossTimeout) }
                }
            }
            defer { group.cancelAll() }
            for flow in flowsOpened { await flow.firstEcho() }
            // The bulk bytes echoed while the probe ran (its warm-up too: the flows were running before it).
            let before = flowsOpened.map(\.echoedBytes)
            let start = MonotonicClock.nanoseconds()
            let result: Result<PingRunner.Result, ConnectionError>
            do throws(ConnectionError) { result = .success(try await probe.run(on: prober)) } catch {
                result = .failure(error)
            }
            let elapsed = MonotonicClock.nanoseconds() &- start
            let bytes = zip(flowsOpened.map(\.echoedBytes), before).map { $0 - $1 }
            for flow in flowsOpened { flow.stop() }
            for flow in flowsOpened { await flow.connection.abort() }
            return result.map { ($0, bytes, elapsed) }
        }
        await prober.close()
        let (run, bytes, elapsed) = try outcome.get()
        var measurement = ScenarioResult()
        measurement.latency = run.latency
        measurement.messages = Int(run.latency.count)
        measurement.lost = run.lost
        measurement.elapsedNanoseconds = run.elapsedNanoseconds
        measurement.messagesPerSecond = run.roundTripsPerSecond
        measurement.quietP50 = run.samples.flatMap { QuietP50.of($0) }
        if bulk > 0 {
            measurement.bytesPerSecond = Double(bytes.reduce(0, +)) / (Double(max(1, elapsed)) / 1e9)
            measurement.fairness = Fairness(throughputs: bytes.map(Double.init))
        }
        return measurement
    }

    /// One bulk connection: a sender that keeps `window` messages in flight, a receiver that reads the echoes and
    /// gives the sender a credit per message's worth of bytes.
    final class Flow: Sendable {
        let connection: any Connection
        let size: Int
        let window: Int
        private let state: Guarded<State>

        private struct State {
            var credits: Int
            var waiting: CheckedContinuation<Bool, Never>?
            var echoed = 0
            var echoedAtLastCheck = 0
            var partial = 0
            var stopped = false
            var firstEcho: [CheckedContinuation<Void, Never>] = []
        }

        init(_ connection: any Connection, size: Int, window: Int) {
            self.connection = connection
            self.size = size
            self.window = window
            state = Guarded(State(credits: window))
        }

        /// Bytes echoed back so far.
        var echoedBytes: Int { state.withLock { $0.echoed } }

        func send() async {
            let payload = [UInt8](repeating: 0x42, count: size)
            while await take() {
                do throws(ConnectionError) { try await connection.send(payload) } catch { return }
            }
        }

        func receive() async {
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: max(size, 65_536), alignment: 16)
            defer { buffer.deallocate() }
            while true {
                let received: Received?
                do throws(ConnectionError) { received = try await connection.receive(into: buffer) } catch { break }
                guard let received else { break }
                give(received.count, stream: connection.transport.isByteStream)
            }
            stop()
        }

        /// udp: a window that made no progress for `timeout` lost its datagrams; the sender gets it back.
        func refill(after timeout: Duration) async {
            while !Task.isCancelled {
                try? await Task.sleep(for: timeout)
                let resume = state.withLock { state -> CheckedContinuation<Bool, Never>? in
                    defer { state.echoedAtLastCheck = state.echoed }
                    guard !state.stopped, state.echoed == state.echoedAtLastCheck, state.credits == 0 else {
                        return nil
                    }
                    state.credits = window
                    return state.waiting.take()
                }
                resume?.resume(returning: true)
            }
        }

        /// Waits until the first echo is back (or the flow stopped).
        func firstEcho() async {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let now = state.withLock { state in
                    if state.echoed > 0 || state.stopped { return true }
                    state.firstEcho.append(continuation)
                    return false
                }
                if now { continuation.resume() }
            }
        }

        func stop() {
            let (waiting, first) = state.withLock {
                state -> (CheckedContinuation<Bool, Never>?, [CheckedContinuation<Void, Never>]) in
                state.stopped = true
                defer { state.firstEcho = [] }
                return (state.waiting.take(), state.firstEcho)
            }
            waiting?.resume(returning: false)
            for continuation in first { continuation.resume() }
        }

        /// A credit to send one more message; `false` once the flow stopped.
        private func take() async -> Bool {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let now: Bool? = state.withLock { state in
                    if state.stopped { return false }
                    if state.credits > 0 {
                        state.credits -= 1
                        return true
                    }
                    state.waiting = continuation
                    return nil
                }
                if let now { continuation.resume(returning: now) }
            }
        }

        private func give(_ bytes: Int, stream: Bool) {
            let (waiting, first) = state.withLock {
                state -> (CheckedContinuation<Bool, Never>?, [CheckedContinuation<Void, Never>]) in
                state.echoed += bytes
                // A stream hands the echo back in pieces: a credit per whole message's bytes.
                var messages = 1
                if stream {
                    state.partial += bytes
                    messages = state.partial / size
                    state.partial %= size
                }
                state.credits = min(window, state.credits + messages)
                defer { state.firstEcho = [] }
                guard messages > 0, let waiting = state.waiting.take() else { return (nil, state.firstEcho) }
                state.credits -= 1
                return (waiting, state.firstEcho)
            }
            waiting?.resume(returning: true)
            for continuation in first { continuation.resume() }
        }
    }
}
