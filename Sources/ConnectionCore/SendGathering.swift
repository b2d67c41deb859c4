import Synchronization

/// Small sends made back to back on a loop's thread, gathered into one system call (the stream connections of bsd,
/// uv, runloop and async; uring has its own send queue on the ring).
///
/// A task on the loop's thread that sends back to back (a bulk flow of small writes, a burst of replies) neither lets
/// the loop poll between its sends nor receives between them, so nothing its peer sends can depend on them yet: from
/// the second such send of a connection on, the bytes are copied into a buffer of up to ``limit`` bytes and the send
/// returns; the buffer goes to the socket in one system call when it is full, before any other write of the
/// connection, when the connection half-closes or closes, and before the loop next sleeps
/// (``writeNow(gate:writeNow:)``, which the backend asks its loop for when ``offer(_:turn:)`` says so). The first
/// send of a loop's turn and a send after a receive (``noteReceive()``: a reply, a request whose response is
/// awaited) are written at once, so a round trip makes the same system calls as without. As with uring's send
/// queue, a gathered send returns before its bytes reach the kernel; a failure to write them is the socket's, and
/// the connection's next call meets it.
///
/// Every method but ``writeNow(gate:writeNow:)`` is called by the holder of the connection's write gate, so the
/// bytes are written in call order: whoever holds the gate writes what gathered before anything of its own.
///
/// A noncopyable struct stored in the connection: no allocation while nothing gathers (an idle connection keeps no
/// buffer).
@_spi(Loop) public struct SendGathering: ~Copyable, Sendable {
    // Internal, not private: see AsyncGate's State.
    struct State: Sendable {
        /// ``SendGathering/limit`` bytes while sends gather into it (made by the first; freed once a turn's end has
        /// written them).
        var bytes: Buffer?
        var count = 0
        /// The loop's turn in which the connection last wrote a send at once (`turnKnown`: there was one).
        var directTurn: UInt32 = 0
        var turnKnown = false
        /// A write before the loop sleeps is asked for and has not run.
        var flushAsked = false
    }
    private let state = Guarded(State())
    /// A receive was called since the last send: the next send goes at once.
    private let received = ReceiveMark()

    /// The buffer's memory, which only the holder of the write gate reads or writes. `@unchecked`: a raw pointer is
    /// never `Sendable`, and the gate (bsd: its writer's lock) that makes this safe is outside what the compiler sees.
    struct Buffer: @unchecked Sendable {
        let base: UnsafeMutableRawPointer
    }

    /// The most bytes gathered before they are written.
    public static let limit = 64 * 1024
    /// Sends larger than this are written at once (after what gathered): copying them buys little.
    public static let largest = 16 * 1024

    public init() {}

    deinit {
        state.withLock { $0.bytes?.base.deallocate() }
    }

    /// What ``offer(_:turn:)`` did with a send.
    public enum Offer: Sendable {
        /// Copied into the buffer: the send is done. `askFlush`: the backend asks its loop to call
        /// ``writeNow(gate:writeNow:)`` before it next sleeps (once per gathering).
        case gathered(askFlush: Bool)
        /// Write it now (nothing is gathered): the first send of its connection in this turn, or one too large to
        /// gather.
        case direct
        /// The buffer is too full for it: write what gathered (``take(writeNow:keepBuffer:)``), then offer it again.
        case full
    }

    /// Inside the write gate, on the loop's thread in its turn `turn`: gathers `bytes` or says why not.
    public func offer(_ bytes: UnsafeRawBufferPointer, turn: UInt32) -> Offer {
        if bytes.isEmpty { return .direct }  // nothing to order: the backend's empty send checks the stream
        let afterReceive = received.take()
        return state.withLock { state in
            if bytes.count > Self.largest { return state.count == 0 ? .direct : .full }
            if afterReceive {
                // A new exchange: what gathered before goes first, then this send at once.
                state.turnKnown = false
                if state.count > 0 { return .full }
            }
            if state.count == 0 && (!state.turnKnown || state.directTurn != turn) {
                state.turnKnown = true
                state.directTurn = turn
                return .direct
            }
            guard state.count + bytes.count <= Self.limit else { return .full }
            let buffer: UnsafeMutableRawPointer
            if let existing = state.bytes {
                buffer = existing.base
            } else {
                buffer = .allocate(byteCount: Self.limit, alignment: 16)
                state.bytes = Buffer(base: buffer)
            }
            (buffer + state.count).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count)
            state.count += bytes.count
            defer { state.flushAsked = true }
            return .gathered(askFlush: !state.flushAsked)
        }
    }

    /// A receive was called on the connection: its next send is written at once. One relaxed store.
    @inline(__always) public func noteReceive() {
        received.note()
    }

    /// Whether bytes gathered and were not written yet (a send from off the loop's thread writes them first).
    public var isEmpty: Bool { state.withLock { $0.count == 0 } }

    /// Inside the write gate: writes what gathered with `writeNow` (a non-blocking write that returns how much the
    /// socket took) and returns a copy of what it did not take (`nil`: none), for the caller to send as it sends
    /// any rest. `keepBuffer`: keep the buffer for sends that follow (a full buffer written in the middle of a burst).
    public func take(
        writeNow: (UnsafeRawBufferPointer) throws(ConnectionError) -> Int, keepBuffer: Bool
    ) throws(ConnectionError) -> [UInt8]? {
        guard
            let (buffer, count) = state.withLock({ state -> (Buffer, Int)? in
                guard let bytes = state.bytes, state.count > 0 else { return nil }
                state.bytes = nil
                defer { state.count = 0 }
                return (bytes, state.count)
            })
        else { return nil }
        let all = UnsafeRawBufferPointer(start: buffer.base, count: count)
        defer {
            if keepBuffer {
                state.withLock { state in
                    if state.bytes == nil { state.bytes = buffer } else { buffer.base.deallocate() }
                }
            } else {
                buffer.base.deallocate()
            }
        }
        let written = try writeNow(all)
        return written == count ? nil : Array(all[written...])
    }

    /// On the loop's thread, outside any send: writes what gathered when `gate` (the connection's write gate) is
    /// free; when it is not, its holder writes them before anything of its own. For the loop about to sleep, as asked
    /// for by ``Offer/gathered(askFlush:)``, and for a close. Returns the bytes the socket did not take with the gate
    /// held: the caller sends them as it sends any rest and then leaves the gate (a close drops them, as it drops
    /// sends still queued). A failed write drops them: the socket has failed, and the connection's next call meets
    /// its error.
    public func writeNow(
        gate: borrowing AsyncGate, writeNow: (UnsafeRawBufferPointer) throws(ConnectionError) -> Int
    ) -> [UInt8]? {
        state.withLock { $0.flushAsked = false }
        guard gate.tryEnter() else { return nil }
        let rest = (try? take(writeNow: writeNow, keepBuffer: false)) ?? nil
        if rest == nil { gate.leave() }
        return rest
    }

    /// The loop is about to sleep, as asked for by ``Offer/gathered(askFlush:)``, for a backend whose sends hold a
    /// lock of their own instead of an `AsyncGate` (bsd's writer), called under that lock: as
    /// ``take(writeNow:keepBuffer:)``, and the next gathering asks again.
    public func takeBeforeSleep(
        writeNow: (UnsafeRawBufferPointer) throws(ConnectionError) -> Int
    ) throws(ConnectionError) -> [UInt8]? {
        state.withLock { $0.flushAsked = false }
        return try take(writeNow: writeNow, keepBuffer: false)
    }

    /// An abort: what gathered is dropped with the connection's unsent bytes.
    public func discard() {
        state.withLock { state in
            state.bytes?.base.deallocate()
            state.bytes = nil
            state.count = 0
        }
    }
}
