extension ReceiveQueue where Element == [UInt8] {
    /// A queue of byte-stream chunks: bounded by bytes, and a receive with a smaller limit takes the front of a
    /// chunk and leaves the rest queued.
    public static func byteStream(capacity: Int, onSpaceAvailable: (@Sendable () -> Void)? = nil) -> ReceiveQueue {
        ReceiveQueue(capacity: capacity, framing: byteStreamFraming, onSpaceAvailable: onSpaceAvailable)
    }

    /// A queue of datagrams: bounded by bytes (an empty datagram weighs 1), never split.
    public static func datagrams(capacity: Int, onSpaceAvailable: (@Sendable () -> Void)? = nil) -> ReceiveQueue {
        ReceiveQueue(capacity: capacity, framing: datagramFraming, onSpaceAvailable: onSpaceAvailable)
    }
}

/// Every byte-stream queue's framing (one object for all of them).
private let byteStreamFraming = ReceiveQueue<[UInt8]>.Framing(
    weigh: { $0.count },
    split: { chunk, limit in
        guard chunk.count > limit else { return nil }
        let prefix = Array(chunk[..<limit])
        chunk.removeFirst(limit)
        return prefix
    },
    join: { chunk, more in chunk.append(contentsOf: more) }
)

/// Every datagram queue's framing.
private let datagramFraming = ReceiveQueue<[UInt8]>.Framing(weigh: { max(1, $0.count) })

/// What a read straight into a caller's buffer found (see ``ReceiveQueue/next(into:readingNow:)``).
public enum DirectReadCount: Sendable {
    /// This many bytes are in the caller's buffer (more than 0).
    case count(Int)
    /// Nothing to read now: the caller waits for the producer as usual.
    case nothing
    /// The stream ended (or failed) under the read.
    case end(ReceiveQueue<[UInt8]>.End)
}

extension ReceiveQueue where Element == [UInt8] {
    /// ``Connection/receive(into:)`` over a queue of chunks or datagrams: on the producer's own thread, with
    /// nothing queued and nobody waiting, `read` fills the caller's buffer straight from the socket (no
    /// allocation, no copy); otherwise the next element is taken and copied in. A datagram larger than the buffer
    /// throws `.messageTooLarge` (and is gone, as the contract says).
    @inlinable
    public func next(
        into buffer: UnsafeMutableRawBufferPointer,
        readingNow read: ((UnsafeMutableRawBufferPointer) -> DirectReadCount)? = nil
    ) async throws(ConnectionError) -> Int? {
        try Received.requireRoom(buffer)
        if let read, !sourceDrained, isIdle {
            switch read(buffer) {
            case .count(let count):
                sourceDrained = count < buffer.count
                return count
            case .nothing: sourceDrained = true
            case .end(let end): finish(end)
            }
        }
        guard let element = try await next(maximumLength: buffer.count) else { return nil }
        return try Received.copy(Message(element), into: buffer).count
    }
}
