public import ConnectionCore
public import Histogram
import POSIXSupport

/// A churn of short connections against one echo server: `sequential` clients one after another (or `lanes` at a
/// time, each lane starting its next client when its last has ended), then `concurrent` of them at once (the burst a
/// server meets when many clients arrive together). Each client connects (with a TLS and WebSocket handshake where
/// the transport has them), makes one echo of `size` bytes, and ends: over a byte
/// stream it half-closes its output and reads until the server's end (so the server has closed its side before
/// the next client comes), over WebSocket it runs the close handshake, over UDP (a new peer, from a new port,
/// each time) it closes its socket; a UDP datagram or its echo that is lost is sent again, up to 10 times. This is
/// netperf's TCP_CRR with an echo, and the life of most clients of a web or market-data server.
///
/// Every client is bounded in time (`cycleLimit`) and the whole run too (`deadline`): a server that stops
/// answering ends the run with its failures counted and named, never a hang.
public struct ChurnRunner: Sendable {
    /// Clients one after another.
    public var sequential: Int
    /// Clients at once, after the sequential ones.
    public var concurrent: Int
    /// How many of the sequential clients are alive at a time (1: strictly one after another). More lanes keep a
    /// server busy when each client's life is mostly waiting for the other process to be scheduled.
    public var lanes: Int
    /// Bytes each client sends and expects back.
    public var size: Int
    /// How long one client's whole life may take.
    public var cycleLimit: Duration
    /// How long the whole run may take: the clients not yet started when it passes are not started.
    public var deadline: Duration

    public init(
        sequential: Int, concurrent: Int = 0, lanes: Int = 1, size: Int = 64, cycleLimit: Duration = .seconds(10),
        deadline: Duration = .seconds(600)
    ) {
        self.sequential = sequential
        self.concurrent = concurrent
        self.lanes = max(1, lanes)
        self.size = size
        self.cycleLimit = cycleLimit
        self.deadline = deadline
    }

    /// What a churn did.
    public struct Outcome: Sendable {
        /// Clients that connected, got their echo back whole and ended cleanly.
        public var completed = 0
        /// Clients that failed, by what failed (the first 20 distinct messages, with their counts).
        public var failed = 0
        public var failures: [String: Int] = [:]
        /// Clients not started because the deadline passed.
        public var notStarted = 0
        /// UDP: datagrams sent again because one or its echo was lost.
        public var resent = 0
        /// Each completed client's whole life (connect to end), nanoseconds: those one after another, and those of
        /// the burst (which wait for each other).
        public var cycle = LatencySummary.makeHistogram()
        public var burstCycle = LatencySummary.makeHistogram()
        /// Wall-clock time of the sequential part and of the burst, nanoseconds.
        public var sequentialNanoseconds: UInt64 = 0
        public var concurrentNanoseconds: UInt64 = 0

        public init() {}

        /// Every client started got its echo and ended cleanly.
        public var allServed: Bool { failed == 0 && notStarted == 0 }

        /// Sequential clients a second.
        public var sequentialPerSecond: Double {
            sequentialNanoseconds == 0 ? 0 : Double(completed) / (Double(sequentialNanoseconds) / 1e9)
        }

        public mutating func note(_ error: any Error) {
            failed += 1
            let text = (error as? ConnectionError)?.description ?? "\(error)"
            if failures[text] != nil || failures.count < 20 { failures[text, default: 0] += 1 }
        }

        /// Adds another outcome's counts, and its clients' lives as those of a burst when `asBurst`.
        public mutating func add(_ other: Outcome, asBurst: Bool = false) {
            completed += other.completed
            failed += other.failed
            for (text, count) in other.failures where failures[text] != nil || failures.count < 20 {
                failures[text, default: 0] += count
            }
            resent += other.resent
            if asBurst { burstCycle.add(other.cycle) } else { cycle.add(other.cycle) }
        }
    }

    /// Runs the churn, calling `connect` for every client. `progress` is called after each sequential client (with
    /// the number done) and once after the burst, for a caller that samples the server on the way; when it returns
    /// `false` (the server is gone) the clients left are not started.
    public func run(
        transport: Transport,
        progress: (@Sendable (Int) async -> Bool)? = nil,
        connect: @escaping @Sendable () async throws(ConnectionError) -> any Connection
    ) async -> Outcome {
        let start = MonotonicClock.nanoseconds()
        let end = start + deadline.wholeNanoseconds
        var outcome = Outcome()
        let payload = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }
        let limit = cycleLimit
        let lanes = lanes
        // The lanes are child tasks; this task alone counts what they did and calls `progress`, one call at a time.
        let stopped = await withTaskGroup(of: Outcome.self) { group -> Bool in
            var started = 0
            var done = 0
            var stopped = false
            func startNext() {
                guard !stopped, started < sequential, MonotonicClock.nanoseconds() < end else { return }
                started += 1
                group.addTask { await Self.client(transport, payload, limit, connect) }
            }
            for _ in 0..<lanes { startNext() }
            while let one = await group.next() {
                outcome.add(one)
                done += 1
                if await progress?(done) == false { stopped = true }
                startNext()
            }
            outcome.notStarted += sequential - started
            return stopped
        }
        if stopped {
            outcome.notStarted += concurrent
            outcome.sequentialNanoseconds = MonotonicClock.nanoseconds() - start
            return outcome
        }
        let burstStart = MonotonicClock.nanoseconds()
        outcome.sequentialNanoseconds = burstStart - start
        guard concurrent > 0 else { return outcome }
        if burstStart >= end {
            outcome.notStarted += concurrent
            return outcome
        }
        let burst = await withTaskGroup(of: Outcome.self) { group in
            for _ in 0..<concurrent {
                group.addTask { await Self.client(transport, payload, limit, connect) }
            }
            var total = Outcome()
            for await one in group { total.add(one) }
            return total
        }
        outcome.add(burst, asBurst: true)
        outcome.concurrentNanoseconds = MonotonicClock.nanoseconds() - burstStart
        _ = await progress?(sequential + concurrent)
        return outcome
    }

    /// One client's life, as an outcome of its own (for a child task).
    private static func client(
        _ transport: Transport, _ payload: [UInt8], _ limit: Duration,
        _ connect: @escaping @Sendable () async throws(ConnectionError) -> any Connection
    ) async -> Outcome {
        var one = Outcome()
        await client(transport, payload, limit, connect, into: &one)
        return one
    }

    /// One client's life, its result added to `outcome`.
    private static func client(
        _ transport: Transport, _ payload: [UInt8], _ limit: Duration,
        _ connect: @escaping @Sendable () async throws(ConnectionError) -> any Connection, into outcome: inout Outcome
    ) async {
        let before = MonotonicClock.nanoseconds()
        let connection: any Connection
        do throws(ConnectionError) {
            connection = try await connect()
        } catch {
            return outcome.note(error)
        }
        do throws(ConnectionError) {
            let resent = try await withDeadline(limit, closing: connection, "a churn client's echo and end") {
                () throws(ConnectionError) -> Int in
                try await echoAndEnd(connection, transport, payload)
            }
            await connection.close()
            outcome.resent += resent
            outcome.completed += 1
            _ = outcome.cycle.record(max(1, MonotonicClock.nanoseconds() - before))
        } catch {
            await connection.close()
            outcome.note(error)
        }
    }

    /// The echo, then the end the transport has; returns the UDP datagrams sent again.
    private static func echoAndEnd(
        _ connection: any Connection, _ transport: Transport, _ payload: [UInt8]
    ) async throws(ConnectionError) -> Int {
        if transport == .udp { return try await udpEcho(connection, payload) }
        try await connection.send(payload)
        if transport.isByteStream {
            let echoed = try await connection.receive(exactly: payload.count)
            guard echoed == payload else { throw ConnectionError(.protocolViolation, "the echo differs") }
            try await connection.closeOutput()
            while let extra = try await connection.receive() {
                throw ConnectionError(.protocolViolation, "\(extra.bytes.count) bytes after the echo")
            }
        } else {
            guard let echoed = try await connection.receive() else {
                throw ConnectionError(.reset, "the server ended before the echo")
            }
            guard echoed.bytes == payload else { throw ConnectionError(.protocolViolation, "the echo differs") }
        }
        return 0
    }

    /// A datagram and its echo, sent again after 200 ms without one (10 tries).
    private static func udpEcho(_ connection: any Connection, _ payload: [UInt8]) async throws(ConnectionError) -> Int {
        for attempt in 0..<10 {
            try await connection.send(payload)
            // The first of the echo and 200 ms; a receive still waiting is cancelled, which ends it at once.
            let reply: [UInt8]?? = await withTaskGroup(of: [UInt8]??.self) { group in
                group.addTask { try? await connection.receive()?.bytes }
                group.addTask {
                    try? await Task.sleep(for: .milliseconds(200))
                    return nil
                }
                let first = await group.next() ?? nil
                group.cancelAll()
                return first
            }
            if let reply, let bytes = reply {
                guard bytes == payload else { throw ConnectionError(.protocolViolation, "the echo differs") }
                return attempt
            }
        }
        throw ConnectionError(.timedOut, "no UDP echo after 10 tries")
    }
}
