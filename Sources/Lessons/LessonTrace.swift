import ConnectionCore
import POSIXSupport
public import SocketStyles
import Synchronization

/// Records a lesson's events as it runs. Wrap each end of a connection with ``trace(_:side:phase:)``; every
/// send and receive through the wrapper is recorded (up to ``cap`` sends per phase and direction).
public final class LessonTrace: Sendable {
    /// The most sends recorded per phase and direction; the rest are counted, not drawn.
    public let cap: Int
    private let origin: UInt64
    private let state = Guarded(State())

    private struct Direction {
        var sends: [Int] = []  // event indices
        var sentBytes = 0  // byte streams: where the last recorded send ends
        var receivedBytes = 0
        var ends: [Int] = []  // byte streams: end offset of each recorded send
        var matched = 0  // next send a receive completes (in order: byte streams, ws)
        var numbered: [Int: Int] = [:]  // send number -> event index (udp, numbered)
        var capped = false
    }

    private struct State {
        var events: [LessonEvent] = []
        var phases: [LessonPhase] = []
        var directions: [String: Direction] = [:]
        var notRecorded = 0
    }

    /// The TCP samplers running (``startTCPSampling(_:phase:side:every:)``), and the series of those stopped.
    private let samplers = Guarded<[ObjectIdentifier: TCPSampler]>([:])
    private let stoppedSeries = Guarded<[LessonTCPSeries]>([])
    /// The most TCP samplers a trace runs at once (each is a thread reading every millisecond): a lesson that
    /// opens more connections draws the first ones' TCP state.
    static let samplersAtOnce = 8

    /// Set in a process that only observes (a lesson's probe or server in another namespace): what it saw, with
    /// CLOCK_MONOTONIC times, for the lesson's own trace to ``replay(_:into:byteStream:)``.
    private let recording: Bool
    private let recorder = Guarded<[Observation]>([])

    public init(cap: Int = 240, origin: UInt64 = MonotonicClock.nanoseconds()) {
        self.cap = cap
        self.origin = origin
        recording = false
    }

    /// A trace that records raw observations (``observations``) instead of events: for the other process of a
    /// lesson. Every process on the machine reads the same CLOCK_MONOTONIC, network namespace or not.
    /// It keeps at most `limit` observations (a `sockbench serve --trace` left running must not grow without
    /// bound) and counts the rest in ``notRecorded``.
    public static func recorder(limit: Int = 200_000) -> LessonTrace { LessonTrace(recordingAtMost: limit) }

    private init(recordingAtMost limit: Int) {
        cap = limit
        origin = 0
        recording = true
    }

    /// Observations a recording trace dropped past its limit.
    public var notRecorded: Int { state.withLock { $0.notRecorded } }

    /// Keeps `observation` unless the recorder is full.
    private func record(_ observation: Observation) {
        let kept = recorder.withLock { list in
            guard list.count < cap else { return false }
            list.append(observation)
            return true
        }
        if !kept { state.withLock { $0.notRecorded += 1 } }
    }

    /// One send or receive seen by a process of its own, or the kernel's view sampled there.
    public struct Observation: Codable, Sendable, Hashable {
        public enum Kind: String, Codable, Sendable { case send, receive, kernel }
        /// CLOCK_MONOTONIC nanoseconds.
        public var at: UInt64
        public var side: LessonEvent.Side
        public var kind: Kind
        public var bytes: Int
        public var number: Int?
        /// The kernel's view (``Kind/kernel``).
        public var text: String?

        public init(
            at: UInt64, side: LessonEvent.Side, kind: Kind, bytes: Int, number: Int? = nil, text: String? = nil
        ) {
            self.at = at
            self.side = side
            self.kind = kind
            self.bytes = bytes
            self.number = number
            self.text = text
        }
    }

    /// What a recording trace saw so far.
    public var observations: [Observation] { recorder.withLock { $0 } }

    /// Adds what other processes observed to `phase`, in time order, matched as if recorded here.
    public func replay(_ observations: [Observation], into phase: Int, byteStream: Bool) {
        for observation in observations.sorted(by: { $0.at < $1.at }) {
            let time = Double(Int64(bitPattern: observation.at &- origin)) / 1000
            switch observation.kind {
            case .send:
                sent(phase, observation.side, count: observation.bytes, number: observation.number, at: time)
            case .receive:
                received(
                    phase, observation.side, count: observation.bytes, byteStream: byteStream,
                    number: observation.number, at: time)
            case .kernel:
                state.withLock {
                    $0.events.append(
                        LessonEvent(
                            phase: phase, at: time, side: observation.side, kind: .kernel, text: observation.text))
                }
            }
        }
    }

    deinit {
        for sampler in samplers.withLock({ Array($0.values) }) { _ = sampler.stop() }
    }

    /// Starts reading `connection`'s TCP state (cwnd, RTT, bytes sent and acknowledged, retransmissions) every
    /// `interval`, as `side`'s in `phase`, until the connection is gone (or the trace goes). `nil` for UDP, or
    /// when ``samplersAtOnce`` are running.
    func startTCPSampling(
        _ connection: any Connection, phase: Int, side: LessonEvent.Side, every interval: Duration = .milliseconds(1)
    ) -> TCPSampler? {
        // A recording trace's samplers keep CLOCK_MONOTONIC times (its origin is 0), for the lesson to replay.
        guard connection.transport != .udp else { return nil }
        let sampler = TCPSampler(
            local: connection.localEndpoint, remote: connection.remoteEndpoint, phase: phase, side: side,
            interval: interval, origin: origin)
        let admitted = samplers.withLock { all in
            guard all.values.filter(\.isRunning).count < Self.samplersAtOnce else { return false }
            all[ObjectIdentifier(sampler)] = sampler
            return true
        }
        guard admitted else { return nil }
        sampler.start()
        return sampler
    }

    /// The program closed `sampler`'s connection: it reads on while the kernel finishes with it (what was left in
    /// the send buffer sent and acknowledged, then the close), and stops by itself; the lesson's report collects it.
    func closedTCPSampling(_ sampler: TCPSampler) { sampler.closed() }

    /// Every TCP series read so far, by phase and side (those still being read, as far as they got), and those
    /// replayed from another process (``replayTCP(_:into:)``).
    public var tcpSeries: [LessonTCPSeries] {
        let running = samplers.withLock { Array($0.values) }.map { $0.snapshot() }
        return (stoppedSeries.withLock { $0 } + running).filter { !$0.samples.isEmpty }.sorted {
            ($0.phase, $0.side.rawValue) < ($1.phase, $1.side.rawValue)
        }
    }

    /// Adds TCP series another process read (a recording trace's, its times on CLOCK_MONOTONIC) to `phase`, their
    /// times made the lesson's.
    public func replayTCP(_ series: [LessonTCPSeries], into phase: Int) {
        let shift = Double(origin) / 1000
        let moved = series.map { series in
            var series = series
            series.phase = phase
            series.samples = series.samples.map { sample in
                var sample = sample
                sample.at -= shift
                return sample
            }
            return series
        }
        stoppedSeries.withLock { $0 += moved }
    }

    /// Microseconds since the lesson began.
    func now() -> Double { Double(MonotonicClock.nanoseconds() &- origin) / 1000 }

    /// Starts a diagram; events name it by the index returned.
    @discardableResult
    public func phase(_ title: String, _ transport: Transport) -> Int {
        state.withLock { state in
            state.phases.append(LessonPhase(title: title, transport: transport.rawValue))
            return state.phases.count - 1
        }
    }

    /// The kernel's view of `side`'s TCP connection now, in `phase`.
    func kernel(_ phase: Int, _ side: LessonEvent.Side, _ text: String) {
        if recording {
            record(Observation(at: MonotonicClock.nanoseconds(), side: side, kind: .kernel, bytes: 0, text: text))
            return
        }
        let time = now()
        state.withLock {
            $0.events.append(LessonEvent(phase: phase, at: time, side: side, kind: .kernel, text: text))
        }
    }

    /// Records the kernel's view of `connection` (TCP) now, as `side`'s in `phase`; nothing when there is none.
    func kernelView(of connection: any Connection, _ phase: Int, _ side: LessonEvent.Side) {
        guard let view = Syscall.tcpView(local: connection.localEndpoint, remote: connection.remoteEndpoint) else {
            return
        }
        kernel(phase, side, Self.describe(view))
    }

    /// "60 B not sent, 1 unacked, rtt 31 us": what TCP did with what the program wrote.
    static func describe(_ view: Syscall.TCPView) -> String {
        var parts: [String] = []
        if view.notSentBytes > 0 { parts.append("\(view.notSentBytes) B not sent") }
        parts.append("\(view.unacked) unacked")
        if view.totalRetransmits > 0 { parts.append("\(view.totalRetransmits) retransmitted") }
        parts.append("rtt \(view.rttMicroseconds) us")
        return parts.joined(separator: ", ")
    }

    /// Something that happened now (or at `at`) at `side` in `phase`.
    public func mark(_ phase: Int, _ side: LessonEvent.Side, _ text: String, at: Double? = nil) {
        if recording { return }  // another process's marks are not replayed
        let time = at ?? now()
        state.withLock {
            $0.events.append(LessonEvent(phase: phase, at: time, side: side, kind: .mark, text: text))
        }
    }

    /// `connection` with every send and receive recorded as `side`'s in `phase`. `number` reads a datagram's
    /// number from its bytes (its sender's count from 0) where datagrams may be lost or reordered; without it,
    /// messages are matched in order.
    /// With `every` above 1 (numbered sends only), only sends whose number is a multiple of it are drawn: a
    /// flood stays a picture, and the page says how many were left out.
    /// With `kernel`, the kernel's view of a TCP connection is sampled too (``KernelSampling``).
    public func trace(
        _ connection: any Connection, side: LessonEvent.Side, phase: Int,
        number: (@Sendable ([UInt8]) -> Int?)? = nil, every: Int = 1, kernel: KernelSampling = .never
    ) -> any Connection {
        TracedConnection(
            connection, trace: self, side: side, phase: phase, number: number, every: every, kernel: kernel)
    }

    /// When a traced TCP connection (tcp, tls, ws, wss) records the kernel's view of itself (TCP_INFO, read by
    /// its addresses through sock_diag, so every backend's sockets can be read).
    public enum KernelSampling: Sendable {
        case never
        /// After every send: what TCP did with the bytes (sent, or held back unsent: Nagle), what is unacknowledged.
        case afterSends
        /// After a send or a receive whenever the connection's count of retransmitted segments has grown.
        case onRetransmissions
    }

    /// Counts a send or receive that is not drawn.
    func skipped(_ phase: Int) { state.withLock { $0.phases[phase].notDrawn += 1 } }

    private static func key(_ phase: Int, from side: LessonEvent.Side) -> String { "\(phase)|\(side.rawValue)" }

    func sent(_ phase: Int, _ side: LessonEvent.Side, _ bytes: [UInt8], number: Int?) {
        if recording {
            record(
                Observation(
                    at: MonotonicClock.nanoseconds(), side: side, kind: .send, bytes: bytes.count, number: number))
            return
        }
        sent(phase, side, count: bytes.count, number: number, at: now())
    }

    private func sent(_ phase: Int, _ side: LessonEvent.Side, count bytes: Int, number: Int?, at time: Double) {
        state.withLock { state in
            let key = Self.key(phase, from: side)
            var direction = state.directions[key, default: Direction()]
            defer { state.directions[key] = direction }
            guard !direction.capped, direction.sends.count < cap else {
                direction.capped = true
                state.phases[phase].notDrawn += 1
                return
            }
            direction.sentBytes += bytes
            direction.ends.append(direction.sentBytes)
            let index = state.events.count
            let count = direction.sends.count
            direction.sends.append(index)
            if let number { direction.numbered[number] = index }
            state.events.append(
                LessonEvent(phase: phase, at: time, side: side, kind: .send, bytes: bytes, number: number ?? count))
        }
    }

    func received(
        _ phase: Int, _ side: LessonEvent.Side, _ bytes: [UInt8], transport: Transport, number: Int?
    ) {
        if recording {
            record(
                Observation(
                    at: MonotonicClock.nanoseconds(), side: side, kind: .receive, bytes: bytes.count, number: number
                ))
            return
        }
        received(phase, side, count: bytes.count, byteStream: transport.isByteStream, number: number, at: now())
    }

    private func received(
        _ phase: Int, _ side: LessonEvent.Side, count bytes: Int, byteStream: Bool, number: Int?, at time: Double
    ) {
        let from: LessonEvent.Side = side == .client ? .server : .client
        state.withLock { state in
            let key = Self.key(phase, from: from)
            var direction = state.directions[key, default: Direction()]
            defer { state.directions[key] = direction }
            var completed: Int?
            if byteStream {
                // A receive delivers the bytes after the last one received; it completes every send whose last
                // byte is among them.
                let start = direction.receivedBytes
                direction.receivedBytes += bytes
                if start >= direction.sentBytes && direction.capped {
                    state.phases[phase].notDrawn += 1
                    return
                }
                while direction.matched < direction.ends.count,
                    direction.ends[direction.matched] <= direction.receivedBytes
                {
                    let send = direction.sends[direction.matched]
                    state.events[send].arrived = time
                    completed = state.events[send].number
                    direction.matched += 1
                }
            } else if let number {
                guard let send = direction.numbered[number] else {
                    state.phases[phase].notDrawn += 1
                    return
                }
                if state.events[send].arrived == nil { state.events[send].arrived = time }
                completed = number
            } else {
                guard direction.matched < direction.sends.count else {
                    state.phases[phase].notDrawn += 1
                    return
                }
                let send = direction.sends[direction.matched]
                state.events[send].arrived = time
                completed = state.events[send].number
                direction.matched += 1
            }
            state.events.append(
                LessonEvent(
                    phase: phase, at: time, side: side, kind: .receive, bytes: bytes, number: completed))
        }
    }

    /// Notes on a send already recorded (a fault the relay applied to it, say): the send numbered `number` from
    /// `side` in `phase`.
    public func annotate(_ phase: Int, from side: LessonEvent.Side, number: Int, _ text: String) {
        state.withLock { state in
            guard
                let index = state.events.firstIndex(where: {
                    $0.phase == phase && $0.side == side && $0.kind == .send && $0.number == number
                })
            else { return }
            state.events[index].text = text
        }
    }

    /// What was recorded, in time order within each phase.
    public var events: [LessonEvent] {
        state.withLock { $0.events }.enumerated().sorted {
            ($0.element.phase, $0.element.at, $0.offset) < ($1.element.phase, $1.element.at, $1.offset)
        }.map(\.element)
    }

    /// The diagrams, in the order they were started.
    public var phases: [LessonPhase] { state.withLock { $0.phases } }
}

extension LessonTrace {
    /// `listener` with every accepted connection traced as the server's in `phase`.
    public func trace(
        _ listener: any Listener, phase: Int, number: (@Sendable ([UInt8]) -> Int?)? = nil
    ) -> any Listener {
        TracedListener(listener, trace: self, phase: phase, number: number)
    }

    /// Reads a little-endian UInt32 at the start of a datagram: the number the lessons' numbered sends carry.
    public static let leadingNumber: @Sendable ([UInt8]) -> Int? = { bytes in
        guard bytes.count >= 4 else { return nil }
        return bytes.withUnsafeBytes { Int($0.loadUnaligned(as: UInt32.self)) }
    }
}
