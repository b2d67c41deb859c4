public import ConnectionCore
import Synchronization

/// An integrity soak over one connection to an echo server: sequence-numbered messages of random sizes, a window
/// of them in flight, every echoed byte checked against what was sent.
///
/// Each message is a 16-byte header (`SOAK`, the sequence number, the payload length, big-endian) and a payload
/// that is a pure function of the run's seed and the sequence number, so the receiver needs no copy of what it
/// sent. Over byte streams (tcp, tls) the echo is re-framed from the header; over messages (udp, ws, wss) each
/// message must come back whole. What comes back is sorted into verified, duplicated (a sequence number seen
/// before), reordered (arrived after a later one), corrupted (a byte or a length differs) and lost (never came
/// back: over UDP, not within `lossTimeout`; over a stream, not before the drain deadline).
public struct SoakRunner: Sendable {
    public struct Configuration: Sendable {
        /// Stop sending after this many messages (`nil`: only `duration` stops it).
        public var messages: Int?
        /// Stop sending after this long (`nil`: only `messages` stops it).
        public var duration: Duration?
        /// Messages in flight at most.
        public var window: Int = 32
        /// Payload sizes, drawn uniformly.
        public var sizes: ClosedRange<Int> = 0...16_384
        /// UDP: a datagram not echoed within this long is counted lost (and frees its place in the window).
        public var lossTimeout: Duration = .seconds(1)
        /// After the last send, how long the echoes of the messages in flight may take.
        public var drainTimeout: Duration = .seconds(10)
        /// Seed of the sizes and payloads (the same seed, the same run).
        public var seed: UInt64 = 0x5EED

        public init(messages: Int? = 10_000, duration: Duration? = nil) {
            self.messages = messages
            self.duration = duration
        }
    }

    /// What a soak saw.
    public struct Report: Sendable, Codable, Hashable {
        public var sent = 0
        public var verified = 0
        public var lost = 0
        public var duplicated = 0
        public var reordered = 0
        public var corrupted = 0
        public var bytesSent = 0
        public var bytesVerified = 0
        public var seconds = 0.0
        /// Why the run ended early, if it did (a connection error, a stream that could not be re-framed).
        public var error: String?

        /// Holds for a reliable transport when every message came back once, whole, in order; for UDP when
        /// nothing came back corrupted or twice (loss and reordering are UDP's right, and are reported).
        public func passed(reliable: Bool) -> Bool {
            guard error == nil, corrupted == 0, duplicated == 0 else { return false }
            return !reliable || (lost == 0 && reordered == 0 && verified == sent)
        }
    }

    public let configuration: Configuration

    public init(_ configuration: Configuration) {
        self.configuration = configuration
    }

    static let headerSize = 16
    static let magic: [UInt8] = Array("SOAK".utf8)

    /// Runs the soak on `connection`, and closes it at the end (which also ends a receive still waiting).
    public func run(on connection: any Connection) async -> Report {
        let (credits, creditor) = AsyncStream.makeStream(of: Void.self)
        let state = SoakState(
            configuration: configuration, reliable: connection.transport != .udp, creditor: creditor)
        let clock = ContinuousClock()
        let start = clock.now
        for _ in 0..<max(1, configuration.window) { creditor.yield() }
        let configuration = configuration
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await Self.receive(on: connection, state: state)
            }
            // UDP: datagrams not echoed within lossTimeout are lost. A reliable transport loses nothing, so an echo
            // missing for drainTimeout means a stalled peer: the run ends with an error instead of waiting forever.
            group.addTask {
                let limit = state.reliable ? configuration.drainTimeout : configuration.lossTimeout
                while !state.isFinished {
                    try? await Task.sleep(for: limit / 4)
                    state.expire(olderThan: limit, now: clock.now)
                }
            }
            await Self.send(on: connection, state: state, credits: credits, start: start, clock: clock)
            // Drain: wait for the echoes still in flight, bounded.
            let deadline = clock.now + configuration.drainTimeout
            while !state.isDrained && clock.now < deadline && state.error == nil {
                try? await Task.sleep(for: .milliseconds(5))
            }
            state.finish()
            await connection.close()
            group.cancelAll()
        }
        var report = state.report()
        report.seconds = Double((clock.now - start).wholeNanoseconds) / 1e9
        return report
    }

    private static func send(
        on connection: any Connection, state: SoakState, credits: AsyncStream<Void>, start: ContinuousClock.Instant,
        clock: ContinuousClock
    ) async {
        let configuration = state.configuration
        var generator = SplitMix64(seed: configuration.seed)
        var iterator = credits.makeAsyncIterator()
        var sequence: UInt64 = 0
        while state.error == nil {
            if let messages = configuration.messages, sequence >= messages { break }
            if let duration = configuration.duration, clock.now - start >= duration { break }
            guard await iterator.next() != nil, state.error == nil else { break }
            let size = configuration.sizes.lowerBound + Int(generator.next() % UInt64(configuration.sizes.count))
            let message = Self.message(sequence: sequence, size: size, seed: configuration.seed)
            state.sending(sequence, at: clock.now)
            do throws(ConnectionError) {
                try await connection.send(message)
            } catch {
                state.fail("send of message \(sequence): \(error)")
                break
            }
            state.sent(bytes: message.count)
            sequence += 1
        }
        state.doneSending()
    }

    private static func receive(on connection: any Connection, state: SoakState) async {
        var stream: [UInt8] = []
        var consumed = 0
        while !state.isFinished {
            let message: Message?
            do throws(ConnectionError) {
                message = try await connection.receive()
            } catch {
                if !state.isFinished { state.fail("receive: \(error)") }
                return
            }
            guard let message else {
                if !state.isDrained { state.fail("the server ended the connection") }
                return
            }
            if connection.transport.isByteStream {
                stream.append(contentsOf: message.bytes)
                while stream.count - consumed >= headerSize {
                    guard let length = Self.length(in: stream, at: consumed) else {
                        state.fail("the echoed stream lost its framing at byte \(consumed) of the buffer")
                        state.corrupt()
                        return
                    }
                    guard stream.count - consumed >= headerSize + length else { break }
                    state.check(stream[consumed..<(consumed + headerSize + length)])
                    consumed += headerSize + length
                }
                if consumed > 1 << 20 || consumed == stream.count {
                    stream.removeFirst(consumed)
                    consumed = 0
                }
            } else {
                state.check(message.bytes[...])
            }
        }
    }

    /// The payload length in the header at `offset`, or `nil` when the magic is not there.
    static func length(in bytes: [UInt8], at offset: Int) -> Int? {
        guard bytes[offset..<(offset + 4)].elementsEqual(magic) else { return nil }
        return bytes[(offset + 12)..<(offset + 16)].reduce(0) { $0 << 8 | Int($1) }
    }

    static func message(sequence: UInt64, size: Int, seed: UInt64) -> [UInt8] {
        var bytes = magic
        bytes.reserveCapacity(headerSize + size)
        for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: sequence >> shift)) }
        for shift in stride(from: 24, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: size >> shift)) }
        appendPayload(to: &bytes, sequence: sequence, size: size, seed: seed)
        return bytes
    }

    static func appendPayload(to bytes: inout [UInt8], sequence: UInt64, size: Int, seed: UInt64) {
        var generator = SplitMix64(seed: seed ^ (sequence &* 0x9E37_79B9_7F4A_7C15))
        var remaining = size
        while remaining > 0 {
            let word = generator.next()
            for index in 0..<min(8, remaining) { bytes.append(UInt8(truncatingIfNeeded: word >> (index * 8))) }
            remaining -= 8
        }
    }
}

/// The soak's bookkeeping, shared by its sender, receiver and (UDP) loss timer.
final class SoakState: Sendable {
    let configuration: SoakRunner.Configuration
    let reliable: Bool
    /// Gives the sender a credit per echo (or loss): the window.
    let creditor: AsyncStream<Void>.Continuation?

    private struct Counts {
        var report = SoakRunner.Report()
        /// Sent and not yet echoed (or declared lost): when each was sent.
        var inFlight: [UInt64: ContinuousClock.Instant] = [:]
        /// Every sequence number below this one was echoed or declared lost.
        var floor: UInt64 = 0
        /// Echoed at or above `floor`.
        var seenAbove: Set<UInt64> = []
        /// Declared lost (UDP); a late echo of one is counted reordered, not duplicated.
        var declaredLost: Set<UInt64> = []
        var highest: UInt64?
        var doneSending = false
        var finished = false
    }
    private let counts = Guarded(Counts())

    init(configuration: SoakRunner.Configuration, reliable: Bool, creditor: AsyncStream<Void>.Continuation) {
        self.configuration = configuration
        self.reliable = reliable
        self.creditor = creditor
    }

    var error: String? { counts.withLock { $0.report.error } }
    var isFinished: Bool { counts.withLock { $0.finished } }
    var isDrained: Bool { counts.withLock { $0.doneSending && $0.inFlight.isEmpty } }

    func sending(_ sequence: UInt64, at now: ContinuousClock.Instant) {
        counts.withLock { $0.inFlight[sequence] = now }
    }

    func sent(bytes: Int) {
        counts.withLock {
            $0.report.sent += 1
            $0.report.bytesSent += bytes
        }
    }

    func doneSending() { counts.withLock { $0.doneSending = true } }

    func fail(_ why: String) {
        counts.withLock { if $0.report.error == nil { $0.report.error = why } }
        creditor?.finish()
    }

    func corrupt() { counts.withLock { $0.report.corrupted += 1 } }

    func finish() {
        counts.withLock { $0.finished = true }
        creditor?.finish()
    }

    /// One echoed message (header and payload).
    func check(_ bytes: ArraySlice<UInt8>) {
        let base = bytes.startIndex
        guard bytes.count >= SoakRunner.headerSize,
            bytes[base..<(base + 4)].elementsEqual(SoakRunner.magic)
        else {
            corrupt()
            return
        }
        let sequence = bytes[(base + 4)..<(base + 12)].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        let length = bytes[(base + 12)..<(base + 16)].reduce(0) { $0 << 8 | Int($1) }
        var expected: [UInt8] = []
        expected.reserveCapacity(length)
        SoakRunner.appendPayload(to: &expected, sequence: sequence, size: length, seed: configuration.seed)
        let whole =
            bytes.count == SoakRunner.headerSize + length
            && bytes[(base + SoakRunner.headerSize)...].elementsEqual(expected)
        let credit: Bool = counts.withLock { counts in
            let known = counts.inFlight.removeValue(forKey: sequence) != nil
            if !whole {
                counts.report.corrupted += 1
                return known
            }
            if !known {
                if counts.declaredLost.remove(sequence) != nil {
                    counts.report.lost -= 1
                    counts.report.reordered += 1
                    counts.report.verified += 1
                    counts.report.bytesVerified += bytes.count
                } else {
                    counts.report.duplicated += 1
                }
                return false
            }
            if let highest = counts.highest, sequence < highest { counts.report.reordered += 1 }
            counts.highest = max(counts.highest ?? 0, sequence)
            counts.report.verified += 1
            counts.report.bytesVerified += bytes.count
            counts.seenAbove.insert(sequence)
            while counts.seenAbove.remove(counts.floor) != nil || counts.declaredLost.contains(counts.floor) {
                counts.floor += 1
            }
            return true
        }
        if credit { creditor?.yield() }
    }

    /// UDP: messages in flight longer than `limit` are lost; their places in the window are freed. A reliable
    /// transport: the run fails, naming the oldest message that did not come back.
    func expire(olderThan limit: Duration, now: ContinuousClock.Instant) {
        if reliable {
            let stalled = counts.withLock { counts in counts.inFlight.filter { now - $0.value >= limit }.keys.min() }
            if let stalled { fail("no echo of message \(stalled) for \(limit)") }
            return
        }
        let freed: Int = counts.withLock { counts in
            let old = counts.inFlight.filter { now - $0.value >= limit }.map(\.key)
            for sequence in old {
                counts.inFlight[sequence] = nil
                counts.declaredLost.insert(sequence)
            }
            counts.report.lost += old.count
            return old.count
        }
        for _ in 0..<freed { creditor?.yield() }
    }

    func report() -> SoakRunner.Report {
        counts.withLock { counts in
            var report = counts.report
            report.lost += counts.inFlight.count  // never came back before the drain deadline
            return report
        }
    }
}
