package import ConnectionCore
import Synchronization
package import WebSocketCodec

/// What ``WebSocketFrameLink/receive()`` read: a frame, a frame the RFC forbids (the connection fails with its close
/// code), or nothing.
package enum WebSocketLinkInput: Sendable {
    /// A whole frame, payload unmasked.
    case frame(WebSocketFrame)
    /// Bytes that are not a valid frame for this role.
    case invalid(WebSocketProtocolError)
    /// A message in one frame whose payload is in the receive's buffer (``WebSocketFrameLink/receive(placingInto:)``),
    /// unmasked: `count` bytes at its start.
    case placed(text: Bool, count: Int)
}

/// Frames over any byte stream: our encoder out, our parser in.
///
/// Reads of a bulk transfer go into the link's own buffer (`Connection.receive(into:)`: the backends that can
/// read straight into it allocate nothing per read), and the parser copies each payload out of it once,
/// unmasking on the way: into an array of its own, or, for a receive into the caller's buffer, a message that
/// comes in one frame straight into that buffer. A read is parsed only up to the end of such a placed message:
/// the rest (the start of the next one) stays in the read buffer for the next receive, which places it in its
/// own buffer, so a bulk stream received into a caller's buffer never makes an array. The buffer (the
/// stream's read chunk size, 64 KiB) is made when a read first brings 16 KiB or more; until then a read is an
/// ordinary receive, so an idle connection, waiting in a receive, holds no read buffer (10,000 idle WebSocket
/// connections would otherwise hold 10,000 of them). Frames go out encoded (and masked) into a reused buffer,
/// as large as the largest frame sent up to 64 KiB, and sent from it (`Connection.send(contentsOf:)`): a send
/// allocates nothing and masks into memory that is in the cache; a message sent from the caller's bytes is
/// masked straight from them.
package final class WebSocketFrameLink: @unchecked Sendable {
    private let stream: any Connection
    private let parser: Guarded<WebSocketFrameParser>
    /// Used by the one receive in progress (``WebSocketConnection`` holds its receive lock around it); made
    /// once a read brings `bulkRead` bytes or more.
    private var readBuffer: UnsafeMutableRawBufferPointer?
    /// Bytes in `readBuffer` read from the stream but not yet given to the parser (the rest of a read, after a
    /// message placed in a receive's buffer).
    private var pending = 0..<0
    private let largestRead: Int
    private static let bulkRead = 16 * 1024
    /// Used by the one send in progress (``WebSocketConnection`` holds its send lock around it); frames larger
    /// than `largestWrite` are encoded into arrays of their own.
    private var writeBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 0, alignment: 16)
    private let largestWrite = 64 * 1024 + 14

    package init(
        over stream: any Connection, role: WebSocketRole, maximumFrameSize: Int, allowsCompressedFrames: Bool,
        leftover: [UInt8]
    ) {
        self.stream = stream
        var parser = WebSocketFrameParser(role: role, maximumFrameSize: maximumFrameSize)
        parser.allowsCompressedFrames = allowsCompressedFrames
        parser.feed(leftover)
        self.parser = Guarded(parser)
        largestRead = max(Self.bulkRead, stream.options.readChunkSize)
    }

    deinit {
        readBuffer?.deallocate()
        writeBuffer.deallocate()
    }

    package func send(_ frames: [WebSocketFrame]) async throws(ConnectionError) {
        for frame in frames {
            guard WebSocketFrameEncoder.encodedSize(frame) <= largestWrite else {
                try await stream.send(WebSocketFrameEncoder.encode(frame))
                continue
            }
            let buffer = sendBuffer(holding: WebSocketFrameEncoder.encodedSize(frame))
            let count = WebSocketFrameEncoder.encode(frame, into: buffer)
            try await stream.send(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[..<count]))
        }
    }

    /// Sends one whole binary message from bytes the caller keeps (``Connection/send(contentsOf:)``): the
    /// header and the payload, masked with `maskingKey` when set, are encoded into the link's reused buffer and
    /// sent from it, so the payload is read once and no array is made. A frame larger than that buffer is
    /// encoded into an array of its own.
    package func send(binary payload: UnsafeRawBufferPointer, maskingKey: UInt32?) async throws(ConnectionError) {
        let size = WebSocketFrameEncoder.encodedSize(payloadLength: payload.count, masked: maskingKey != nil)
        guard size <= largestWrite else {
            let frame = [UInt8](unsafeUninitializedCapacity: size) { out, initialized in
                initialized = WebSocketFrameEncoder.encode(
                    opcode: .binary, maskingKey: maskingKey, payload: payload, into: UnsafeMutableRawBufferPointer(out))
            }
            return try await stream.send(Message(frame))
        }
        let buffer = sendBuffer(holding: size)
        let count = WebSocketFrameEncoder.encode(
            opcode: .binary, maskingKey: maskingKey, payload: payload, into: buffer)
        try await stream.send(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[..<count]))
    }

    /// The reused send buffer, grown to hold `size` bytes (at most `largestWrite`); frames are encoded (and
    /// masked) into it, where they stay in the cache, and sent from there.
    private func sendBuffer(holding size: Int) -> UnsafeMutableRawBufferPointer {
        if writeBuffer.count < size {
            writeBuffer.deallocate()
            writeBuffer = .allocate(byteCount: max(size, min(2 * writeBuffer.count, largestWrite)), alignment: 16)
        }
        return writeBuffer
    }

    /// The next frame. With a `destination` (a receive into the caller's buffer), a message that comes in one
    /// frame and fits is unmasked straight into it (`.placed`) instead of into an array of its own; a frame
    /// only partly there when this returns otherwise (cancelled, failed) is copied into the parser, so nothing
    /// is lost and the buffer is no longer referred to.
    package func receive(
        placingInto destination: UnsafeMutableRawBufferPointer? = nil
    ) async throws(ConnectionError)
        -> WebSocketLinkInput?
    {
        defer {
            if let destination { parser.withLock { $0.stopPlacing(copyingFrom: UnsafeRawBufferPointer(destination)) } }
        }
        while true {
            // Whole frames already parsed first: a placed one precedes every frame still in the parser.
            do throws(WebSocketProtocolError) {
                let next = try parser.withLock { (parser) throws(WebSocketProtocolError) -> WebSocketLinkInput? in
                    if let placed = parser.takePlaced() {
                        return .placed(text: placed.opcode == .text, count: placed.count)
                    }
                    return try parser.nextFrame().map(WebSocketLinkInput.frame)
                }
                if let next { return next }
            } catch {
                return .invalid(error)
            }
            if let buffer = readBuffer {
                if pending.isEmpty {
                    guard let received = try await stream.receive(into: buffer) else { return nil }
                    pending = 0..<received.count
                }
                // Fed up to the end of a message placed in `destination`: what follows it waits in the read
                // buffer for the next receive, whose buffer its payload then goes to.
                let input = UnsafeRawBufferPointer(rebasing: buffer[pending])
                let taken = parser.withLock { parser in
                    guard let destination else {
                        parser.feed(input)
                        return input.count
                    }
                    return parser.feedUntilPlaced(input, placingInto: destination)
                }
                pending = (pending.lowerBound + taken)..<pending.upperBound
            } else {
                guard let chunk = try await stream.receive(maximumLength: largestRead) else { return nil }
                chunk.bytes.withUnsafeBytes { feed($0, placingInto: destination) }
                if chunk.bytes.count >= Self.bulkRead {
                    readBuffer = .allocate(byteCount: largestRead, alignment: 16)
                }
            }
        }
    }

    private func feed(_ bytes: UnsafeRawBufferPointer, placingInto destination: UnsafeMutableRawBufferPointer?) {
        parser.withLock { parser in
            if let destination { parser.feed(bytes, placingInto: destination) } else { parser.feed(bytes) }
        }
    }
}
