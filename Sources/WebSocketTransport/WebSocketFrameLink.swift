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
/// comes in one frame straight into that buffer. The buffer (the stream's read chunk size, 64 KiB) is made when a read first brings 16 KiB
/// or more; until then a read is an ordinary receive, so an idle connection, waiting in a receive, holds no read
/// buffer (10,000 idle WebSocket connections would otherwise hold 10,000 of them). Frames go out encoded (and
/// masked) into a reused buffer, as large as the largest frame sent up to 64 KiB, and sent from it
/// (`Connection.send(contentsOf:)`): a send allocates nothing and masks into memory that is in the cache.
package final class WebSocketFrameLink: @unchecked Sendable {
    private let stream: any Connection
    private let parser: Mutex<WebSocketFrameParser>
    /// Used by the one receive in progress (``WebSocketConnection`` holds its receive lock around it); made
    /// once a read brings `bulkRead` bytes or more.
    private var readBuffer: UnsafeMutableRawBufferPointer?
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
        self.parser = Mutex(parser)
        largestRead = max(Self.bulkRead, stream.options.readChunkSize)
    }

    deinit {
        readBuffer?.deallocate()
        writeBuffer.deallocate()
    }

    package func send(_ frames: [WebSocketFrame]) async throws(ConnectionError) {
        for frame in frames {
            let size = WebSocketFrameEncoder.encodedSize(frame)
            guard size <= largestWrite else {
                try await stream.send(WebSocketFrameEncoder.encode(frame))
                continue
            }
            // Encoded (and masked) into the link's reused buffer, which stays in the cache, and sent from there.
            if writeBuffer.count < size {
                writeBuffer.deallocate()
                writeBuffer = .allocate(byteCount: max(size, min(2 * writeBuffer.count, largestWrite)), alignment: 16)
            }
            let buffer = writeBuffer
            let count = WebSocketFrameEncoder.encode(frame, into: buffer)
            try await stream.send(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[..<count]))
        }
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
                guard let received = try await stream.receive(into: buffer) else { return nil }
                feed(UnsafeRawBufferPointer(rebasing: buffer[..<received.count]), placingInto: destination)
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
