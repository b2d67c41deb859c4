/// The send path of the stream connections that write from the calling thread first (uv's and the run loop's): one
/// send at a time, in call order; what the socket takes at once goes without a suspension or a hand-over
/// (`writeNow`), and only the rest is copied and handed to the loop (`queue`), which returns once it is written.
/// An empty send goes to `queue`, where the loop says whether the stream is still open. Sends made back to back on
/// the loop's thread gather into one write (``SendGathering``).
///
/// Public to the `Loop` SPI and inlinable, so that each backend's compiler inlines it into its own `send` (see
/// ``ReceiveGate``).
///
/// A struct, stored in the connection object: a class of its own would be one more allocation per connection.
@_spi(Loop) public struct WriteThrough: ~Copyable, Sendable {
    /// Held by a send while it writes; a half-close takes it to come after the sends before it.
    public let gate = AsyncGate()
    /// Sends gathered on the loop's thread, written before anything else of the connection.
    public let gathering = SendGathering()

    public init() {}

    /// Sends `bytes`, copying only what the socket did not take at once. `turn`: the loop's turn when the caller is
    /// on the loop's thread (`nil` elsewhere: nothing gathers), and `askFlush` asks the loop for a write of what
    /// gathered before it next sleeps.
    @inlinable @inline(__always) public func send(
        _ bytes: [UInt8], turn: UInt32?, askFlush: () -> Void,
        writeNow: (UnsafeRawBufferPointer) throws(ConnectionError) -> Int,
        queue: ([UInt8]) async throws(ConnectionError) -> Void
    ) async throws(ConnectionError) {
        if !gate.tryEnter() { await gate.enter() }
        defer { gate.leave() }
        // The common cases make no async call: one gathered, one written at once.
        if let turn {
            switch bytes.withUnsafeBytes({ gathering.offer($0, turn: turn) }) {
            case .gathered(let ask):
                if ask { askFlush() }
                return
            case .direct: break
            case .full:
                let again = try await gatherAfterWriting(
                    { bytes.withUnsafeBytes { gathering.offer($0, turn: turn) } }, askFlush, writeNow, queue)
                if again { return }
            }
        } else if !gathering.isEmpty {
            try await writeGathered(writeNow: writeNow, queue: queue)
        }
        let written = try bytes.withUnsafeBytes { raw in Result { () throws(ConnectionError) in try writeNow(raw) } }
            .get()
        if written == bytes.count && written > 0 { return }
        try await queue(written == 0 ? bytes : Array(bytes[written...]))
    }

    /// Sends bytes the caller keeps until this returns, from where they lie: only what the socket did not take at
    /// once is copied (or what gathers, as above).
    @inlinable @inline(__always) public func send(
        contentsOf bytes: UnsafeRawBufferPointer, turn: UInt32?, askFlush: () -> Void,
        writeNow: (UnsafeRawBufferPointer) throws(ConnectionError) -> Int,
        queue: ([UInt8]) async throws(ConnectionError) -> Void
    ) async throws(ConnectionError) {
        if !gate.tryEnter() { await gate.enter() }
        defer { gate.leave() }
        if let turn {
            switch gathering.offer(bytes, turn: turn) {
            case .gathered(let ask):
                if ask { askFlush() }
                return
            case .direct: break
            case .full:
                if try await gatherAfterWriting({ gathering.offer(bytes, turn: turn) }, askFlush, writeNow, queue) {
                    return
                }
            }
        } else if !gathering.isEmpty {
            try await writeGathered(writeNow: writeNow, queue: queue)
        }
        let written = try writeNow(bytes)
        if written == bytes.count && written > 0 { return }
        try await queue(Array(bytes[written...]))
    }

    /// Inside the gate, after ``SendGathering/Offer/full``: writes what gathered, then offers the caller's bytes
    /// again (`true`: they gathered and the send is done; `false`: the caller writes them). `offerAgain` is
    /// ``SendGathering/offer(_:turn:)`` of them.
    @usableFromInline func gatherAfterWriting(
        _ offerAgain: () -> SendGathering.Offer, _ askFlush: () -> Void,
        _ writeNow: (UnsafeRawBufferPointer) throws(ConnectionError) -> Int,
        _ queue: ([UInt8]) async throws(ConnectionError) -> Void
    ) async throws(ConnectionError) -> Bool {
        try await writeGathered(writeNow: writeNow, queue: queue)
        guard case .gathered(let ask) = offerAgain() else { return false }
        if ask { askFlush() }
        return true
    }

    /// Inside the gate: writes what gathered (what the socket does not take at once goes to `queue`), keeping the
    /// buffer for the sends that follow.
    public func writeGathered(
        writeNow: (UnsafeRawBufferPointer) throws(ConnectionError) -> Int,
        queue: ([UInt8]) async throws(ConnectionError) -> Void
    ) async throws(ConnectionError) {
        guard let rest = try gathering.take(writeNow: writeNow, keepBuffer: true) else { return }
        try await queue(rest)
    }

    /// On the loop's thread, outside any send: ``SendGathering/writeNow(gate:writeNow:)`` with this gate.
    public func writeGatheredNow(writeNow: (UnsafeRawBufferPointer) throws(ConnectionError) -> Int) -> [UInt8]? {
        gathering.writeNow(gate: gate, writeNow: writeNow)
    }
}
