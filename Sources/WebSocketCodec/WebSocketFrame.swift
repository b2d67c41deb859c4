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

    /// Copies `source` into `destination` (at least as large) masked with `key`, in one pass: what a frame's
    /// payload needs on its way into or out of a buffer, without a copy and then a second pass to mask it.
    /// `offset` is the position of `source[0]` in the payload.
    public static func copy(
        _ source: UnsafeRawBufferPointer, to destination: UnsafeMutableRawBufferPointer, key: UInt32, offset: Int = 0
    ) {
        let count = source.count
        guard count > 0, let from = source.baseAddress, let to = destination.baseAddress else { return }
        precondition(destination.count >= count, "the destination is smaller than the source")
        let phase = offset & 3
        // The key in wire order, rotated to the phase, twice: byte i of the word masks byte i of 8.
        var wide: UInt64 = 0
        withUnsafeMutableBytes(of: &wide) { raw in
            for position in 0..<8 {
                raw[position] = UInt8(truncatingIfNeeded: key >> (24 - 8 * ((phase + position) & 3)))
            }
        }
        var index = 0
        // 32 bytes a turn in two 16-byte vectors (SSE2 on any x86-64): the scalar word loop ran at about a third
        // of the kernel's copy, and was a fifth of a WebSocket client's time in a 64 KiB pump.
        let vector = unsafeBitCast(SIMD2<UInt64>(repeating: wide), to: SIMD16<UInt8>.self)
        while index + 32 <= count {
            let first = from.loadUnaligned(fromByteOffset: index, as: SIMD16<UInt8>.self) ^ vector
            let second = from.loadUnaligned(fromByteOffset: index + 16, as: SIMD16<UInt8>.self) ^ vector
            to.storeBytes(of: first, toByteOffset: index, as: SIMD16<UInt8>.self)
            to.storeBytes(of: second, toByteOffset: index + 16, as: SIMD16<UInt8>.self)
            index += 32
        }
        while index + 8 <= count {
            let word = from.loadUnaligned(fromByteOffset: index, as: UInt64.self) ^ wide
            to.storeBytes(of: word, toByteOffset: index, as: UInt64.self)
            index += 8
        }
        // 8 is a multiple of 4: the phase is unchanged after whole words.
        while index < count {
            let mask = UInt8(truncatingIfNeeded: key >> (24 - 8 * ((phase + index) & 3)))
            to.storeBytes(
                of: from.load(fromByteOffset: index, as: UInt8.self) ^ mask, toByteOffset: index, as: UInt8.self)
            index += 1
        }
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
        let vector = unsafeBitCast(SIMD2<UInt64>(repeating: wide), to: SIMD16<UInt8>.self)
        let base16 = buffer.baseAddress!
        while index + 32 <= buffer.count {
            let first = base16.loadUnaligned(fromByteOffset: index, as: SIMD16<UInt8>.self) ^ vector
            let second = base16.loadUnaligned(fromByteOffset: index + 16, as: SIMD16<UInt8>.self) ^ vector
            base16.storeBytes(of: first, toByteOffset: index, as: SIMD16<UInt8>.self)
            base16.storeBytes(of: second, toByteOffset: index + 16, as: SIMD16<UInt8>.self)
            index += 32
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
    /// The frame on the wire: header, extended length, masking key, masked payload. One allocation.
    public static func encode(_ frame: WebSocketFrame) -> [UInt8] {
        let size = encodedSize(frame)
        return [UInt8](unsafeUninitializedCapacity: size) { out, initialized in
            initialized = encode(frame, into: UnsafeMutableRawBufferPointer(out))
        }
    }

    /// The frame's size on the wire: header and payload.
    public static func encodedSize(_ frame: WebSocketFrame) -> Int {
        encodedSize(payloadLength: frame.payload.count, masked: frame.maskingKey != nil)
    }

    /// The size on the wire of a frame carrying `payloadLength` bytes, masked or not.
    public static func encodedSize(payloadLength length: Int, masked: Bool) -> Int {
        let extended = length < 126 ? 0 : length <= 0xFFFF ? 2 : 8
        return 2 + extended + (masked ? 4 : 0) + length
    }

    /// Encodes the frame into the start of `buffer` (at least ``encodedSize(_:)`` bytes: a sender's reused
    /// buffer) and returns the count written. The payload is masked on the way in: one pass, not a copy and
    /// then a second pass.
    public static func encode(_ frame: WebSocketFrame, into buffer: UnsafeMutableRawBufferPointer) -> Int {
        frame.payload.withUnsafeBytes { payload in
            encode(
                fin: frame.fin, opcode: frame.opcode, rsv1: frame.rsv1, rsv2: frame.rsv2, rsv3: frame.rsv3,
                maskingKey: frame.maskingKey, payload: payload, into: buffer)
        }
    }

    /// Encodes a frame whose payload lies in memory the caller keeps (a send from borrowed bytes) into the start
    /// of `buffer` (at least ``encodedSize(payloadLength:masked:)`` bytes), masking it on the way when
    /// `maskingKey` is set, and returns the count written.
    public static func encode(
        fin: Bool = true, opcode: WebSocketOpcode, rsv1: Bool = false, rsv2: Bool = false, rsv3: Bool = false,
        maskingKey: UInt32?, payload: UnsafeRawBufferPointer, into buffer: UnsafeMutableRawBufferPointer
    ) -> Int {
        let length = payload.count
        let total = encodedSize(payloadLength: length, masked: maskingKey != nil)
        precondition(buffer.count >= total, "the buffer is smaller than the frame")
        var first = opcode.rawValue
        if fin { first |= 0x80 }
        if rsv1 { first |= 0x40 }
        if rsv2 { first |= 0x20 }
        if rsv3 { first |= 0x10 }
        buffer[0] = first
        let maskBit: UInt8 = maskingKey == nil ? 0 : 0x80
        var next = 2
        if length < 126 {
            buffer[1] = maskBit | UInt8(length)
        } else if length <= 0xFFFF {
            buffer[1] = maskBit | 126
            buffer[2] = UInt8(length >> 8)
            buffer[3] = UInt8(length & 0xFF)
            next = 4
        } else {
            buffer[1] = maskBit | 127
            for index in 0..<8 {
                buffer[2 + index] = UInt8(truncatingIfNeeded: UInt64(length) >> UInt64(56 - 8 * index))
            }
            next = 10
        }
        if let key = maskingKey {
            for index in 0..<4 { buffer[next + index] = UInt8(truncatingIfNeeded: key >> UInt32(24 - 8 * index)) }
            next += 4
        }
        let rest = UnsafeMutableRawBufferPointer(rebasing: buffer[next..<total])
        if let key = maskingKey {
            WebSocketMasking.copy(payload, to: rest, key: key)
        } else if length > 0 {
            rest.copyMemory(from: payload)
        }
        return total
    }
}
