/// The receiving side of a socket whose reads complete after the call that starts them (uring's completions): one
/// receive at a time, in call order (a FIFO ``AsyncGate``), and a scratch buffer of the socket's own, made at its
/// first use, for the receives that return a new array (a whole datagram on UDP; TCP where the kernel has no
/// buffer rings). The read itself is the style's (`read`), called inside the gate.
///
/// Public to the `Loop` SPI and inlinable, so that each socket's compiler inlines it into its own `receive` (a
/// `package` inlinable body is not inlined across modules: docs/architecture.md, rule 7); the release objects of
/// AsyncSocket and UringSocket call no `ReceiveGate` method on a message's path.
@_spi(Loop) public final class ReceiveGate: Sendable {
    /// Held by a receive while it reads; a close takes it to wait for the receive in progress.
    public let gate = AsyncGate()
    @usableFromInline let datagrams: Bool
    @usableFromInline let scratchSize: Int
    /// Made at the first receive that needs it; used only inside the gate.
    @usableFromInline nonisolated(unsafe) var madeScratch: UnsafeMutableRawBufferPointer?

    public init(transport: Transport, options: ConnectionOptions) {
        datagrams = transport == .udp
        scratchSize = transport == .udp ? options.maxDatagramSize : options.readChunkSize
    }

    deinit { madeScratch?.deallocate() }

    /// Inside the gate: the scratch buffer.
    @inlinable var scratch: UnsafeMutableRawBufferPointer {
        if let madeScratch { return madeScratch }
        let made = UnsafeMutableRawBufferPointer.allocate(byteCount: scratchSize, alignment: 16)
        madeScratch = made
        return made
    }

    /// Receives into the scratch buffer (TCP: at most `maximumLength` bytes; UDP: one whole datagram) and returns
    /// a copy; `nil` when `read` reports the end.
    @inlinable @inline(__always) public func receive(
        maximumLength: Int, read: (UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Int?
    ) async throws(ConnectionError) -> [UInt8]? {
        if !gate.tryEnter() { await gate.enter() }
        defer { gate.leave() }
        let scratch = self.scratch
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
