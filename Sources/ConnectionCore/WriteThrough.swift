/// The send path of the stream connections that write from the calling thread first (uv's and the run loop's): one
/// send at a time, in call order; what the socket takes at once goes without a suspension or a hand-over
/// (`writeNow`), and only the rest is copied and handed to the loop (`queue`), which returns once it is written.
/// An empty send goes to `queue`, where the loop says whether the stream is still open.
///
/// Public to the `Loop` SPI and inlinable, so that each backend's compiler inlines it into its own `send` (see
/// ``ReceiveGate``).
///
/// A struct, stored in the connection object: a class of its own would be one more allocation per connection.
@_spi(Loop) public struct WriteThrough: ~Copyable, Sendable {
    /// Held by a send while it writes; a half-close takes it to come after the sends before it.
    public let gate = AsyncGate()

    public init() {}

    /// Sends `bytes`, copying only what the socket did not take at once.
    @inlinable @inline(__always) public func send(
        _ bytes: [UInt8], writeNow: (UnsafeRawBufferPointer) throws(ConnectionError) -> Int,
        queue: ([UInt8]) async throws(ConnectionError) -> Void
    ) async throws(ConnectionError) {
        if !gate.tryEnter() { await gate.enter() }
        defer { gate.leave() }
        let written = try bytes.withUnsafeBytes { raw in Result { () throws(ConnectionError) in try writeNow(raw) } }
            .get()
        if written == bytes.count && written > 0 { return }
        try await queue(written == 0 ? bytes : Array(bytes[written...]))
    }

    /// Sends bytes the caller keeps until this returns, from where they lie: only what the socket did not take at
    /// once is copied.
    @inlinable @inline(__always) public func send(
        contentsOf bytes: UnsafeRawBufferPointer, writeNow: (UnsafeRawBufferPointer) throws(ConnectionError) -> Int,
        queue: ([UInt8]) async throws(ConnectionError) -> Void
    ) async throws(ConnectionError) {
        if !gate.tryEnter() { await gate.enter() }
        defer { gate.leave() }
        let written = try writeNow(bytes)
        if written == bytes.count && written > 0 { return }
        try await queue(Array(bytes[written...]))
    }
}
