import ConnectionCore
import Foundation
import POSIXSupport
public import SocketStyles
import Synchronization

/// The sending host of the congestion lesson: it runs inside host A (as `sockbench lesson-probe congestion`),
/// sends TCP flows as fast as they go to a sink on host B through the router's bottleneck, pings B over UDP beside
/// them, reads every flow's TCP state every 4 ms, and prints one JSON object.
public enum CongestionProbe {
    /// One run: which congestion control the flows ran, each flow's TCP state over time, and every ping.
    public struct Run: Codable, Sendable {
        /// The congestion control the flows ran, as the kernel reported each one's (sock_diag's INET_DIAG_CONG);
        /// several names joined by "+" if they differed.
        public var algorithm: String
        public var flows: [Flow] = []
        public var pings: [Ping] = []
        /// When the flows stopped, microseconds after the first began.
        public var end: Double
    }

    public struct Flow: Codable, Sendable {
        /// When it connected and when it stopped sending, microseconds after the first flow began.
        public var joined: Double
        public var left: Double
        /// Bytes its sends handed to the connection.
        public var bytesSent: Int
        /// Its congestion control, as the kernel reported it.
        public var algorithm: String
        /// Its TCP state read every 4 ms (times on the run's clock: 0 is when the first flow began).
        public var series: LessonTCPSeries
    }

    /// A UDP ping: when it was sent (microseconds on the run's clock, negative before the flows) and its round
    /// trip in microseconds, `nil` when no echo came back.
    public struct Ping: Codable, Sendable {
        public var at: Double
        public var rtt: Double?
    }

    /// When each flow starts (microseconds after the first): one, a second half a second later, then two more
    /// together; all stop at ``end``, 8 s after the last two joined (CUBIC's shares on this path take several
    /// seconds to even out). Pings begin ``idle`` before the first flow, to see the path empty.
    public static let joins: [Double] = [0, 500_000, 2_500_000, 2_500_000]
    public static let end: Double = 10_500_000
    public static let idle: Double = 300_000

    /// Runs the flows against `sink` and the pings against the UDP echo server at `ping` (the congestion control is
    /// the route's: ``NetworkLab/setCongestionControl(_:)``).
    public static func run(backend: Backend, sink: Endpoint, ping: Endpoint) async throws -> Run {
        let pinger = try await backend.connect(to: ping)
        let origin = MonotonicClock.nanoseconds() + UInt64(idle * 1000)
        let now: @Sendable () -> Double = { Double(Int64(bitPattern: MonotonicClock.nanoseconds() &- origin)) / 1000 }
        let sleep: @Sendable (_ until: Double) async throws -> Void = { at in
            let wait = at - now()
            if wait > 0 { try await Task.sleep(for: .microseconds(Int64(wait))) }
        }

        // Pings every 10 ms from `idle` before the flows to 300 ms after them; each carries its number.
        let sentAt = Guarded<[Double]>([])
        let answered = Guarded<[Int: Double]>([:])
        let pinging = Task { @Sendable in
            var sequence: UInt64 = 0
            while now() < end + 300_000 {
                let at = now()
                sentAt.withLock { $0.append(at) }
                try? await pinger.send(withUnsafeBytes(of: sequence) { Array($0) } + [UInt8](repeating: 0, count: 24))
                sequence += 1
                try? await sleep(at + 10_000)
            }
        }
        let echoes = Task { @Sendable in
            // The last pings may wait behind a full queue: listen until a second passes with nothing.
            while let message = try? await withDeadline(.seconds(1), { try await pinger.receive() }), let message,
                message.count >= 8
            {
                let sequence = Int(message.bytes.withUnsafeBytes { $0.loadUnaligned(as: UInt64.self) })
                let arrived = now()
                if let sent = sentAt.withLock({ sequence < $0.count ? $0[sequence] : nil }) {
                    answered.withLock { $0[sequence] = arrived - sent }
                }
            }
        }

        let flows = try await withThrowingTaskGroup(of: Flow.self) { group in
            for joined in joins {
                group.addTask {
                    try await sleep(joined)
                    let connection = try await backend.connect(to: sink)
                    let start = now()
                    let sampler = TCPSampler(
                        local: connection.localEndpoint, remote: connection.remoteEndpoint, phase: 0, side: .client,
                        interval: .milliseconds(4), origin: origin, limit: 20_000)
                    sampler.start()
                    let algorithm =
                        Syscall.tcpView(local: connection.localEndpoint, remote: connection.remoteEndpoint)?
                        .congestionControl ?? ""
                    let chunk = [UInt8](repeating: 7, count: 16 * 1024)
                    var sent = 0
                    while now() < end {
                        guard (try? await connection.send(chunk)) != nil else { break }
                        sent += chunk.count
                    }
                    let left = now()
                    sampler.readNow()
                    let series = sampler.stop()
                    // Abortive: what is still queued is dropped here, not sent into the next run's measurements.
                    await connection.abort()
                    return Flow(
                        joined: start, left: left, bytesSent: sent, algorithm: algorithm, series: series)
                }
            }
            var all: [Flow] = []
            for try await flow in group { all.append(flow) }
            return all.sorted { $0.joined < $1.joined }
        }
        _ = await pinging.value
        _ = await echoes.value
        await pinger.close()
        let times = sentAt.withLock { $0 }
        let rtts = answered.withLock { $0 }
        var names: [String] = []
        for flow in flows where !names.contains(flow.algorithm) { names.append(flow.algorithm) }
        return Run(
            algorithm: names.joined(separator: "+"), flows: flows,
            pings: times.enumerated().map { Ping(at: $0.element, rtt: rtts[$0.offset]) }, end: end)
    }
}
