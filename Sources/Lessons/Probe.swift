import BenchmarkDriver
import ConnectionCore
import Foundation
import POSIXSupport
public import SocketStyles
import Synchronization

/// The measuring client of the loss and ordering lessons. It runs inside the client namespace (as
/// `sockbench lesson-probe`) and prints one JSON object.
public enum LessonProbe {
    public struct Result: Codable, Sendable {
        public var sent = 0
        public var delivered = 0
        public var outOfOrder = 0
        public var p50us = 0.0
        public var p99us = 0.0
        public var maxus = 0.0
        public var retransmittedSegments = 0
        /// Messages whose round trip exceeded 1 ms.
        public var delayedOver10ms = 0
        public var perMessageMicroseconds: [Double] = []
        /// Every send and receive the probe made, for the lesson's picture.
        public var observations: [LessonTrace.Observation] = []
        /// Its TCP connection's state read every millisecond (times on CLOCK_MONOTONIC), for the picture's graphs.
        public var tcp: [LessonTCPSeries] = []
    }

    /// `mode`: `udp-loss`, `tcp-rtt`, `ordering-tcp`, `ordering-ws` or `ordering-udp`.
    public static func run(mode: String, backend: Backend, url: String) async throws -> Result {
        let endpoint = try Endpoint(url: url)
        let retransBefore = tcpCounter("RetransSegs")
        let recorder = LessonTrace.recorder()
        let number = endpoint.transport.isByteStream ? nil : LessonTrace.leadingNumber
        let wrap: (any Connection) -> any Connection = {
            recorder.trace($0, side: .client, phase: 0, number: number, kernel: .onRetransmissions)
        }
        var result: Result
        switch mode {
        case "udp-loss": result = try await udpLoss(backend, endpoint, wrap: wrap)
        case "tcp-rtt": result = try await tcpRoundTrips(backend, endpoint, wrap: wrap)
        case "ordering-tcp", "ordering-ws", "ordering-udp":
            result = try await ordering(backend, endpoint, wrap: wrap)
        default: throw ConnectionError(.unsupported, "unknown probe mode \(mode)")
        }
        result.retransmittedSegments = tcpCounter("RetransSegs") - retransBefore
        result.observations = recorder.observations
        result.tcp = recorder.tcpSeries
        return result
    }

    /// 1,000 numbered datagrams in bursts of 20, each burst waiting (at most 30 ms) for its echoes; an echo that
    /// comes back later (up to 100 ms after the last burst) still counts as delivered.
    static func udpLoss(
        _ backend: Backend, _ endpoint: Endpoint, wrap: (any Connection) -> any Connection = { $0 }
    ) async throws -> Result {
        let connection = wrap(try await backend.connect(to: endpoint))
        var seen = Set<UInt32>()
        var result = Result()
        for burst in 0..<50 {
            for index in 0..<20 {
                var sequence = UInt32(burst * 20 + index)
                try await connection.send(
                    withUnsafeBytes(of: &sequence) { Array($0) } + [UInt8](repeating: 0, count: 60))
                result.sent += 1
            }
            try await collectEchoes(on: connection, into: &seen, sent: result.sent, until: 30_000_000)
        }
        // The last echoes, however late (a busy machine), for up to 100 ms.
        try await collectEchoes(on: connection, into: &seen, sent: result.sent, until: 100_000_000)
        result.delivered = seen.count
        await connection.close()
        return result
    }

    /// Receives numbered echoes into `seen` until all `sent` are there or `nanoseconds` have passed. A late echo of
    /// an earlier burst still came back: only what never returns is lost.
    private static func collectEchoes(
        on connection: any Connection, into seen: inout Set<UInt32>, sent: Int, until nanoseconds: UInt64
    ) async throws {
        let deadline = MonotonicClock.nanoseconds() + nanoseconds
        while seen.count < sent, MonotonicClock.nanoseconds() < deadline {
            let remaining = Duration.nanoseconds(Int64(deadline - MonotonicClock.nanoseconds()))
            guard let message = try await withDeadline(remaining, { try await connection.receive() }), let message,
                message.count >= 4
            else { break }
            let sequence = message.bytes.withUnsafeBytes { $0.loadUnaligned(as: UInt32.self) }
            if sequence < UInt32(sent) { seen.insert(sequence) }
        }
    }

    /// 200 closed-loop round trips of 64 bytes.
    static func tcpRoundTrips(
        _ backend: Backend, _ endpoint: Endpoint, wrap: (any Connection) -> any Connection = { $0 }
    ) async throws -> Result {
        let connection = wrap(try await backend.connect(to: endpoint))
        let run = try await PingRunner(size: 64, count: 200, warmup: 0).run(on: connection)
        await connection.close()
        var result = Result()
        result.sent = 200
        result.delivered = Int(run.latency.count)
        result.p50us = Double(run.latency.p50) / 1000
        result.p99us = Double(run.latency.p99) / 1000
        result.maxus = Double(run.latency.max) / 1000
        return result
    }

    /// 300 numbered, time-stamped messages in bursts of 10 a millisecond apart, echoed back; each message's
    /// round trip.
    static func ordering(
        _ backend: Backend, _ endpoint: Endpoint, wrap: (any Connection) -> any Connection = { $0 }
    ) async throws -> Result {
        let connection = wrap(try await backend.connect(to: endpoint))
        let count = 300
        let size = 16
        let arrivals = Guarded<[(sequence: Int, rtt: UInt64)]>([])
        let stream = endpoint.transport == .tcp
        // tcp and ws deliver everything, however late; a udp datagram may never come.
        let reliable = endpoint.transport != .udp
        let reader = Task {
            while true {
                let bytes: [UInt8]
                if stream {
                    guard let record = try? await connection.receive(exactly: size) else { return }
                    bytes = record
                } else if reliable {
                    guard let message = try? await connection.receive() else { return }
                    bytes = message.bytes
                } else {
                    guard let message = try? await withDeadline(.milliseconds(800), { try await connection.receive() }),
                        let message
                    else { return }
                    bytes = message.bytes
                }
                let now = MonotonicClock.nanoseconds()
                let (sequence, sentAt) = bytes.withUnsafeBytes {
                    (Int($0.loadUnaligned(as: UInt64.self)), $0.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
                }
                let done = arrivals.withLock { list in
                    list.append((sequence, now - sentAt))
                    return list.count == count
                }
                if done { return }
            }
        }
        // At most `window` datagrams unanswered: each socket on the way (client, relay, server) then never holds more
        // than its receive buffer takes (a 16-byte datagram costs about 1 KiB of the default 208 KiB), so a reader
        // the CPU left waiting for a while loses nothing; with the lesson's jitter about 80 are in flight, so the
        // bursts and the overtaking are as before. A datagram lost on purpose (5% as root) holds the window at
        // most 200 ms.
        let window = 128
        for sequence in 0..<count {
            if !reliable {
                let until = MonotonicClock.nanoseconds() + 200_000_000
                while sequence - arrivals.withLock({ $0.count }) >= window && MonotonicClock.nanoseconds() < until {
                    try await Task.sleep(for: .milliseconds(1))
                }
            }
            var record = [UInt8](repeating: 0, count: size)
            record.withUnsafeMutableBytes {
                $0.storeBytes(of: UInt64(sequence), as: UInt64.self)
                $0.storeBytes(of: MonotonicClock.nanoseconds(), toByteOffset: 8, as: UInt64.self)
            }
            try await connection.send(record)
            // Bursts of 10 back-to-back messages, a millisecond apart: enough in flight that a hole shows.
            if sequence % 10 == 9 { try await Task.sleep(for: .milliseconds(1)) }
        }
        // TCP delivers everything eventually; give retransmissions time (bounded).
        let deadline = MonotonicClock.nanoseconds() + 10_000_000_000
        while arrivals.withLock({ $0.count }) < count && MonotonicClock.nanoseconds() < deadline {
            if !reliable && arrivals.withLock({ $0.count }) > 0 {
                _ = await reader.value
                break
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        reader.cancel()
        await connection.close()
        let list = arrivals.withLock { $0 }
        var result = Result()
        result.sent = count
        result.delivered = Set(list.map(\.sequence)).count
        var highest = -1
        for arrival in list {
            if arrival.sequence < highest { result.outOfOrder += 1 }
            highest = max(highest, arrival.sequence)
        }
        let rtts = list.map { Double($0.rtt) / 1000 }.sorted()
        if !rtts.isEmpty {
            result.p50us = rtts[rtts.count / 2]
            result.p99us = rtts[min(rtts.count - 1, rtts.count * 99 / 100)]
            result.maxus = rtts.last!
        }
        result.delayedOver10ms = rtts.filter { $0 > 1_000 }.count
        var perMessage = [Double](repeating: -1, count: count)
        for arrival in list where arrival.sequence < count { perMessage[arrival.sequence] = Double(arrival.rtt) / 1000 }
        result.perMessageMicroseconds = perMessage
        return result
    }

    /// A counter from the `Tcp:` lines of /proc/net/snmp (this namespace's stack).
    static func tcpCounter(_ name: String) -> Int {
        guard let text = try? String(contentsOfFile: "/proc/net/snmp", encoding: .utf8) else { return 0 }
        let lines = text.split(separator: "\n").filter { $0.hasPrefix("Tcp:") }
        guard lines.count >= 2 else { return 0 }
        let names = lines[0].split(separator: " ")
        let values = lines[1].split(separator: " ")
        guard let index = names.firstIndex(of: Substring(name)), index < values.count else { return 0 }
        return Int(values[index]) ?? 0
    }
}
