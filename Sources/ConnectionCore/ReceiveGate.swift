/// The receiving side that the sockets over a non-blocking descriptor share (async's readiness, uring's
/// completions): one receive at a time, in call order (a FIFO ``AsyncGate``), and a scratch buffer of the socket's
/// own for the receives that return a new array (a whole datagram on UDP, the read chunk on TCP). The read itself
/// is the style's (`read`: recv(2) after readiness, or an io_uring receive), called inside the gate.
///
/// Inlinable, so that each socket's compiler folds it into its own `receive`: no async call is added per message.
package final class ReceiveGate: Sendable {
    /// Held by a receive while it reads; a close takes it to wait for the receive in progress.
    @usableFromInline package let gate = AsyncGate()
    @usableFromInline let datagrams: Bool
    /// Used only inside the gate.
    @usableFromInline nonisolated(unsafe) let scratch: UnsafeMutableRawBufferPointer

    package init(transport: Transport, options: ConnectionOptions) {
        datagrams = transport == .udp
        scratch = .allocate(
            byteCount: transport == .udp ? options.maxDatagramSize : options.readChunkSize, alignment: 16)
    }

    deinit { scratch.deallocate() }

    /// Receives into the scratch buffer (TCP: at most `maximumLength` bytes; UDP: one whole datagram) and returns
    /// a copy; `nil` when `read` reports the end.
    @inlinable package func receive(
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
    @inlinable package func receive(
        into buffer: UnsafeMutableRawBufferPointer,
        read: (UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Int?
    ) async throws(ConnectionError) -> Int? {
        try Received.requireRoom(buffer)
        if !gate.tryEnter() { await gate.enter() }
        defer { gate.leave() }
        return try await read(buffer)
    }
}
