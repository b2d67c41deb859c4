/// The receiving side that the sockets over a non-blocking descriptor share (async's readiness, uring's
/// completions): one receive at a time, in call order (a FIFO ``AsyncGate``), and a scratch buffer of the socket's
/// own for the receives that return a new array (a whole datagram on UDP, the read chunk on TCP). The read itself
/// is the style's (`read`: recv(2) after readiness, or an io_uring receive), called inside the gate.
///
/// Public to the `Loop` SPI and inlinable, so that each socket's compiler inlines it into its own `receive` (a
/// `package` inlinable body is not inlined across modules: docs/architecture.md, rule 7); the release objects of
/// AsyncSocket and UringSocket call no `ReceiveGate` method on a message's path.
@_spi(Loop) public final class ReceiveGate: Sendable {
    /// Held by a receive while it reads; a close takes it to wait for the receive in progress.
    public let gate = AsyncGate()
    @usableFromInline let datagrams: Bool
    /// Used only inside the gate.
    @usableFromInline nonisolated(unsafe) let scratch: UnsafeMutableRawBufferPointer

    public init(transport: Transport, options: ConnectionOptions) {
        datagrams = transport == .udp
        scratch = .allocate(
            byteCount: transport == .udp ? options.maxDatagramSize : options.readChunkSize, alignment: 16)
    }

    deinit { scratch.deallocate() }

    /// Receives into the scratch buffer (TCP: at most `maximumLength` bytes; UDP: one whole datagram) and returns
    /// a copy; `nil` when `read` reports the end.
    @inlinable @inline(__always) public func receive(
        maximumLength: Int, read: (UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Int?
    ) async throws(ConnectionError) -> [UInt8]? {
        if !gate.tryEnter() { await gate.enter() }
        defer { gate.leave() }
        let limit = datagrams ? scratch.count : min(max(1, maximumLength), scratch.count)
        let buffer = UnsafeMutableRawBufferPointer(rebasing: scratch[..<limit])
        guard let count = try await read(buffer) else { return nil }
        return [UInt8](UnsafeRawBufferPointer(rebasing: buffer[..<count]))
    }

    /// Receives into the caller's buffer, which must have room for a byte: no allocation.
    @inlinable @inline(__always) public func receive(
        into buffer: UnsafeMutableRawBufferPointer,
        read: (UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Int?
    ) async throws(ConnectionError) -> Int? {
        try Received.requireRoom(buffer)
        if !gate.tryEnter() { await gate.enter() }
        defer { gate.leave() }
        return try await read(buffer)
    }
}
