import ConnectionCore
import Glibc
import POSIXSupport
import Synchronization

/// One reading of a TCP connection's state as the kernel keeps it (TCP_INFO, read by the connection's addresses
/// through sock_diag), on the lesson's clock.
public struct LessonTCPSample: Codable, Sendable, Hashable {
    /// Microseconds since the lesson began.
    public var at: Double
    /// The congestion window, in segments: how many TCP may have unacknowledged.
    public var congestionWindow: UInt32
    /// The slow-start threshold, in segments; `nil` while it is the kernel's "not yet set" (no loss so far).
    public var slowStartThreshold: UInt32?
    /// Smoothed round-trip time and its variance, microseconds.
    public var rttMicroseconds: UInt32
    public var rttVarianceMicroseconds: UInt32
    /// Segments sent and not yet acknowledged.
    public var unacked: UInt32
    /// Segments retransmitted since the connection opened.
    public var retransmits: UInt32
    /// Bytes since the connection opened: sent (retransmissions included), acknowledged, retransmitted.
    public var bytesSent: UInt64
    public var bytesAcked: UInt64
    public var bytesRetransmitted: UInt64
    /// Bytes a second: the last measured delivery rate, and the rate TCP paces its sends at.
    public var deliveryRate: UInt64
    public var pacingRate: UInt64
    /// The congestion-control state: 0 open, 1 disorder, 2 CWR, 3 recovery, 4 loss.
    public var congestionState: UInt8

    init(at: Double, _ view: Syscall.TCPView) {
        self.at = at
        congestionWindow = view.congestionWindow
        // The kernel's initial ssthresh is TCP_INFINITE_SSTHRESH (0x7fffffff).
        slowStartThreshold = view.slowStartThreshold >= 0x7fff_ffff ? nil : view.slowStartThreshold
        rttMicroseconds = view.rttMicroseconds
        rttVarianceMicroseconds = view.rttVarianceMicroseconds
        unacked = view.unacked
        retransmits = view.totalRetransmits
        bytesSent = view.bytesSent
        bytesAcked = view.bytesAcked
        bytesRetransmitted = view.bytesRetransmitted
        deliveryRate = view.deliveryRate
        pacingRate = view.pacingRate
        congestionState = view.congestionState
    }

    /// The same state, whatever the time.
    func sameState(as other: LessonTCPSample) -> Bool {
        var other = other
        other.at = at
        return self == other
    }
}

/// One end's TCP state over a diagram's time: the readings that differed from the one before (a reading that
/// changed nothing is counted, not kept), with what a reading cost.
public struct LessonTCPSeries: Codable, Sendable, Hashable {
    /// The diagram (``LessonPhase``) it belongs to.
    public var phase: Int
    /// Whose socket: the client's connection or the server's.
    public var side: LessonEvent.Side
    /// The sender's maximum segment size, bytes (a congestion window of N segments is N times this).
    public var maximumSegmentSize: UInt32
    public var samples: [LessonTCPSample]
    /// Readings taken (``samples`` keeps the ones that changed something).
    public var readings: Int
    /// The time asked between readings, microseconds.
    public var intervalMicroseconds: Double
    /// The median time one reading took (a sock_diag query on a netlink socket kept open), microseconds.
    public var readingMicroseconds: Double
}

/// Reads one TCP connection's state every `interval` on a thread of its own until stopped (or until the
/// connection has been gone for 100 readings), keeping the readings that changed: cwnd opening and falling, RTT
/// growing as a queue fills, bytes sent, acknowledged and sent again.
final class TCPSampler: Sendable {
    private let local: Endpoint
    private let remote: Endpoint
    private let phase: Int
    private let side: LessonEvent.Side
    private let interval: UInt64
    private let origin: UInt64
    private let limit: Int
    private let stopping = Atomic<Bool>(false)
    /// Once the program has closed the connection: read on until the kernel is done with it (the bytes still in
    /// its send buffer sent and acknowledged, the FINs exchanged), at most until this time (CLOCK_MONOTONIC ns).
    private let closedDeadline = Atomic<UInt64>(0)
    /// Open once the thread has finished (or never started).
    private let finished = Latch()
    private let result = Mutex(Collected())

    private struct Collected {
        var samples: [LessonTCPSample] = []
        var readings = 0
        var costs: [UInt64] = []
        var mss: UInt32 = 0
    }

    /// At most `limit` samples are kept (a reading every millisecond that changes every time: 100 s).
    init(
        local: Endpoint, remote: Endpoint, phase: Int, side: LessonEvent.Side, interval: Duration, origin: UInt64,
        limit: Int = 100_000
    ) {
        self.local = local
        self.remote = remote
        self.phase = phase
        self.side = side
        let (seconds, attoseconds) = interval.components
        self.interval = max(100_000, UInt64(seconds) * 1_000_000_000 + UInt64(attoseconds / 1_000_000_000))
        self.origin = origin
        self.limit = limit
    }

    /// Starts reading on a thread of its own.
    func start() {
        if PosixThread.trySpawn(
            name: "tcp-sampler", stackSize: 128 * 1024,
            { [self] in
                run()
                finished.open()
            }) != nil
        {
            finished.open()
        }
    }

    /// The program closed the connection: reads on while the kernel still sends what was left in its buffer and
    /// closes, for at most `linger`, then stops by itself.
    func closed(linger: Duration = .milliseconds(250)) {
        let (seconds, attoseconds) = linger.components
        let nanoseconds = UInt64(seconds) * 1_000_000_000 + UInt64(attoseconds / 1_000_000_000)
        closedDeadline.store(MonotonicClock.nanoseconds() &+ nanoseconds, ordering: .relaxed)
    }

    /// One reading now, on the caller's thread: before the program closes the connection, so that its last state
    /// with bytes in it is kept (a close can take the socket to TIME-WAIT, which keeps no TCP state, within a
    /// millisecond, between two of the thread's readings).
    func readNow() {
        guard let view = Syscall.tcpView(local: local, remote: remote), view.hasTCPState else { return }
        keep(LessonTCPSample(at: Double(Int64(bitPattern: MonotonicClock.nanoseconds() &- origin)) / 1000, view), view)
    }

    /// Keeps `sample` when it changed something since the reading before it.
    private func keep(_ sample: LessonTCPSample, _ view: Syscall.TCPView, cost: UInt64? = nil) {
        result.withLock { collected in
            collected.readings += 1
            if let cost, collected.costs.count < 10_000 { collected.costs.append(cost) }
            collected.mss = view.maximumSegmentSize
            guard collected.samples.count < limit else { return }
            // The caller's reading and the thread's may come in either order.
            let index = collected.samples.lastIndex { $0.at <= sample.at }.map { $0 + 1 } ?? 0
            if index > 0, collected.samples[index - 1].sameState(as: sample) { return }
            collected.samples.insert(sample, at: index)
        }
    }

    /// Whether its thread still reads.
    var isRunning: Bool { !finished.isOpen }

    /// Stops reading (waits for the thread) and returns what was read.
    func stop() -> LessonTCPSeries {
        stopping.store(true, ordering: .relaxed)
        finished.wait()
        return snapshot()
    }

    /// What was read so far (it may still be reading).
    func snapshot() -> LessonTCPSeries {
        result.withLock { collected in
            let costs = collected.costs.sorted()
            return LessonTCPSeries(
                phase: phase, side: side, maximumSegmentSize: collected.mss, samples: collected.samples,
                readings: collected.readings, intervalMicroseconds: Double(interval) / 1000,
                readingMicroseconds: costs.isEmpty ? 0 : Double(costs[costs.count / 2]) / 1000)
        }
    }

    private func run() {
        guard let diagnostics = try? Syscall.TCPDiagnostics() else { return }
        defer { diagnostics.close() }
        var next = MonotonicClock.nanoseconds()
        var missing = 0
        while !stopping.load(ordering: .relaxed) {
            let before = MonotonicClock.nanoseconds()
            let deadline = closedDeadline.load(ordering: .relaxed)
            if deadline != 0, before > deadline { return }
            // A timewait entry (TIME-WAIT, or FIN-WAIT-2 after the close): the kernel keeps no TCP state to read.
            let view = diagnostics.view(local: local, remote: remote).flatMap { $0.hasTCPState ? $0 : nil }
            let after = MonotonicClock.nanoseconds()
            if let view {
                missing = 0
                keep(
                    LessonTCPSample(at: Double(Int64(bitPattern: before &- origin)) / 1000, view), view,
                    cost: after &- before)
            } else {
                missing += 1
                // Gone (closed, or never there): stop reading rather than spin on nothing.
                if missing >= 100 || deadline != 0 { return }
            }
            next &+= interval
            let now = MonotonicClock.nanoseconds()
            if next < now { next = now &+ interval }
            var wake = timespec(tv_sec: Int(next / 1_000_000_000), tv_nsec: Int(next % 1_000_000_000))
            while clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &wake, nil) == EINTR {}
        }
    }
}
