/// A frame opcode (RFC 6455 §5.2).
public struct WebSocketOpcode: RawRepresentable, Sendable, Hashable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue & 0x0F }

    public static let continuation = WebSocketOpcode(rawValue: 0x0)
    public static let text = WebSocketOpcode(rawValue: 0x1)
    public static let binary = WebSocketOpcode(rawValue: 0x2)
    public static let close = WebSocketOpcode(rawValue: 0x8)
    public static let ping = WebSocketOpcode(rawValue: 0x9)
    public static let pong = WebSocketOpcode(rawValue: 0xA)

    /// Close, ping and pong: at most 125 bytes of payload, never fragmented.
    public var isControl: Bool { rawValue & 0x8 != 0 }

    /// One of the six opcodes RFC 6455 defines.
    public var isKnown: Bool { [0x0, 0x1, 0x2, 0x8, 0x9, 0xA].contains(rawValue) }

    public var description: String {
        switch rawValue {
        case 0x0: "continuation"
        case 0x1: "text"
        case 0x2: "binary"
        case 0x8: "close"
        case 0x9: "ping"
        case 0xA: "pong"
        default: "opcode \(rawValue)"
        }
    }
}

/// One WebSocket frame, unmasked payload.
public struct WebSocketFrame: Sendable, Hashable {
    public var fin: Bool
    public var rsv1: Bool
    public var rsv2: Bool
    public var rsv3: Bool
    public var opcode: WebSocketOpcode
    /// The masking key the frame carried (or is to be sent with); `nil` for an unmasked frame.
    public var maskingKey: UInt32?
    /// The payload, unmasked.
    public var payload: [UInt8]

    public init(
        fin: Bool = true, opcode: WebSocketOpcode, payload: [UInt8] = [], maskingKey: UInt32? = nil,
        rsv1: Bool = false, rsv2: Bool = false, rsv3: Bool = false
    ) {
        self.fin = fin
        self.opcode = opcode
        self.payload = payload
        self.maskingKey = maskingKey
        self.rsv1 = rsv1
        self.rsv2 = rsv2
        self.rsv3 = rsv3
    }
}

/// Masking (RFC 6455 §5.3): XOR with the 4-byte key, 8 bytes at a time.
public enum WebSocketMasking {
    /// Masks (or unmasks: the same operation) `bytes` in place. `offset` is the position of `bytes[0]` in the
    /// payload, so a payload can be masked in pieces.
    public static func apply(key: UInt32, to bytes: inout [UInt8], offset: Int = 0) {
        bytes.withUnsafeMutableBytes { apply(key: key, to: $0, offset: offset) }
    }

    /// Masks a raw buffer in place.
    public static func apply(key: UInt32, to buffer: UnsafeMutableRawBufferPointer, offset: Int = 0) {
        guard !buffer.isEmpty else { return }
        // The key as bytes in wire order (big-endian), rotated to the payload offset.
        let keyBytes: [UInt8] = [
            UInt8(truncatingIfNeeded: key >> 24), UInt8(truncatingIfNeeded: key >> 16),
            UInt8(truncatingIfNeeded: key >> 8), UInt8(truncatingIfNeeded: key),
        ]
        var index = 0
        var phase = offset & 3
        // Bytes until an 8-byte boundary of the buffer.
        let base = Int(bitPattern: buffer.baseAddress!)
        while index < buffer.count && (base + index) & 7 != 0 {
            buffer[index] ^= keyBytes[phase]
            phase = (phase + 1) & 3
            index += 1
        }
        // Eight at a time with the key repeated twice, rotated to the current phase.
        var wide: UInt64 = 0
        withUnsafeMutableBytes(of: &wide) { raw in
            for position in 0..<8 { raw[position] = keyBytes[(phase + position) & 3] }
        }
        let words = (buffer.count - index) / 8
        if words > 0 {
            let pointer = (buffer.baseAddress! + index).assumingMemoryBound(to: UInt64.self)
            for word in 0..<words { pointer[word] ^= wide }
            index += words * 8
        }
        // 8 is a multiple of 4: the phase is unchanged after whole words.
        while index < buffer.count {
            buffer[index] ^= keyBytes[phase]
            phase = (phase + 1) & 3
            index += 1
        }
    }
}

/// Encodes frames to bytes (RFC 6455 §5.2).
public enum WebSocketFrameEncoder {
    /// The frame on the wire: header, extended length, masking key, masked payload.
    public static func encode(_ frame: WebSocketFrame) -> [UInt8] {
        var bytes: [UInt8] = []
        let length = frame.payload.count
        bytes.reserveCapacity(14 + length)
        var first = frame.opcode.rawValue
        if frame.fin { first |= 0x80 }
        if frame.rsv1 { first |= 0x40 }
        if frame.rsv2 { first |= 0x20 }
        if frame.rsv3 { first |= 0x10 }
        bytes.append(first)
        let maskBit: UInt8 = frame.maskingKey == nil ? 0 : 0x80
        if length < 126 {
            bytes.append(maskBit | UInt8(length))
        } else if length <= 0xFFFF {
            bytes.append(maskBit | 126)
            bytes.append(UInt8(length >> 8))
            bytes.append(UInt8(length & 0xFF))
        } else {
            bytes.append(maskBit | 127)
            for shift in stride(from: 56, through: 0, by: -8) {
                bytes.append(UInt8(truncatingIfNeeded: UInt64(length) >> UInt64(shift)))
            }
        }
        if let key = frame.maskingKey {
            for shift in stride(from: 24, through: 0, by: -8) {
                bytes.append(UInt8(truncatingIfNeeded: key >> UInt32(shift)))
            }
            let start = bytes.count
            bytes.append(contentsOf: frame.payload)
            bytes.withUnsafeMutableBytes { raw in
                apply(key: key, to: UnsafeMutableRawBufferPointer(rebasing: raw[start...]))
            }
        } else {
            bytes.append(contentsOf: frame.payload)
        }
        return bytes
    }

    private static func apply(key: UInt32, to buffer: UnsafeMutableRawBufferPointer) {
        WebSocketMasking.apply(key: key, to: buffer)
    }
}
