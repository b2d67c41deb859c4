/// Which end of the connection this is: a server receives masked frames, a client unmasked ones.
public enum WebSocketRole: Sendable, Hashable {
    case client
    case server
}

/// An incremental frame parser: bytes go in as they arrive (one at a time works), whole frames come out.
///
/// It enforces the framing rules (RFC 6455 §5): reserved bits must be 0 (RSV1 may be set once permessage-deflate
/// is agreed: ``allowsCompressedFrames``; which frames may carry it is the state machine's rule), unknown
/// opcodes are rejected, control frames carry at most 125 bytes and are never fragmented, frames from a client
/// are masked and frames from a server are not, a 64-bit length has its top bit clear, and no frame exceeds
/// `maximumFrameSize` (1009).
public struct WebSocketFrameParser: Sendable {
    /// Whose frames this parser reads: `.server` parses what clients send (masked).
    public let role: WebSocketRole
    /// The largest payload accepted in one frame.
    public var maximumFrameSize: Int
    /// RSV1 is allowed: permessage-deflate was agreed (RFC 7692 §6).
    public var allowsCompressedFrames = false

    private var buffer: [UInt8] = []
    private var start = 0

    /// A parser for the given end of the connection.
    public init(role: WebSocketRole, maximumFrameSize: Int = 16 * 1024 * 1024 + 1024) {
        self.role = role
        self.maximumFrameSize = maximumFrameSize
    }

    /// Adds received bytes.
    public mutating func feed(_ bytes: [UInt8]) {
        compact()
        buffer.append(contentsOf: bytes)
    }

    /// The `[UInt8]` form of `feed(_:)` for any collection of bytes. The array form is the hot path: a generic
    /// called from another module runs unspecialised, a byte at a time.
    public mutating func feed<Bytes: Collection>(_ bytes: Bytes) where Bytes.Element == UInt8 {
        compact()
        buffer.append(contentsOf: bytes)
    }

    /// Drops consumed bytes: all of them once everything was parsed, or the consumed front once it is large.
    private mutating func compact() {
        if start > 0 && start == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            start = 0
        } else if start > 65_536 && start * 2 > buffer.count {
            buffer.removeFirst(start)
            start = 0
        }
    }

    /// Bytes received but not yet part of a returned frame.
    public var bufferedCount: Int { buffer.count - start }

    /// The next complete frame, or `nil` when more bytes are needed.
    public mutating func nextFrame() throws(WebSocketProtocolError) -> WebSocketFrame? {
        let available = buffer.count - start
        guard available >= 2 else { return nil }
        let first = buffer[start]
        let second = buffer[start + 1]
        let opcode = WebSocketOpcode(rawValue: first & 0x0F)
        let fin = first & 0x80 != 0
        try Self.checkReservedBits(
            rsv1: first & 0x40 != 0, rsv2: first & 0x20 != 0, rsv3: first & 0x10 != 0,
            allowsCompressedFrames: allowsCompressedFrames)
        guard opcode.isKnown else { throw WebSocketProtocolError(.protocolError, "unknown \(opcode)") }
        let masked = second & 0x80 != 0
        switch role {
        case .server where !masked: throw WebSocketProtocolError(.protocolError, "a client frame must be masked")
        case .client where masked: throw WebSocketProtocolError(.protocolError, "a server frame must not be masked")
        default: break
        }
        var length = UInt64(second & 0x7F)
        var header = 2
        if opcode.isControl {
            guard fin else { throw WebSocketProtocolError(.protocolError, "a control frame must not be fragmented") }
            guard length <= 125 else {
                throw WebSocketProtocolError(.protocolError, "a control frame carries at most 125 bytes")
            }
        }
        if length == 126 {
            guard available >= 4 else { return nil }
            length = UInt64(buffer[start + 2]) << 8 | UInt64(buffer[start + 3])
            header = 4
        } else if length == 127 {
            guard available >= 10 else { return nil }
            length = 0
            for index in 2..<10 { length = length << 8 | UInt64(buffer[start + index]) }
            guard length & (1 << 63) == 0 else {
                throw WebSocketProtocolError(.protocolError, "the most significant bit of a 64-bit length must be 0")
            }
            header = 10
        }
        guard length <= UInt64(maximumFrameSize) else {
            throw WebSocketProtocolError(
                .messageTooBig, "a \(length)-byte frame exceeds the limit of \(maximumFrameSize)")
        }
        var key: UInt32?
        if masked {
            guard available >= header + 4 else { return nil }
            key = 0
            for index in header..<(header + 4) { key = key! << 8 | UInt32(buffer[start + index]) }
            header += 4
        }
        let total = header + Int(length)
        guard available >= total else { return nil }
        var payload = Array(buffer[(start + header)..<(start + total)])
        if let key { WebSocketMasking.apply(key: key, to: &payload) }
        start += total
        return WebSocketFrame(fin: fin, opcode: opcode, payload: payload, maskingKey: key, rsv1: first & 0x40 != 0)
    }

    /// The reserved-bit rule of every frame link (ours and the nio backend's): RSV2 and RSV3 are never set, RSV1
    /// only with permessage-deflate.
    public static func checkReservedBits(
        rsv1: Bool, rsv2: Bool, rsv3: Bool, allowsCompressedFrames: Bool
    ) throws(WebSocketProtocolError) {
        if rsv2 || rsv3 || (rsv1 && !allowsCompressedFrames) {
            throw WebSocketProtocolError(.protocolError, "reserved bits set without a negotiated extension")
        }
    }
}
