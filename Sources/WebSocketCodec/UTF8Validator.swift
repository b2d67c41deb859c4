/// Incremental UTF-8 validation (RFC 3629): bytes can be fed in any pieces (a code point split across frames
/// is fine), and an invalid sequence is reported as soon as its first wrong byte is seen (fail fast, as
/// RFC 6455 §8.1 asks). Rejects overlong forms, surrogates (U+D800-DFFF) and code points above U+10FFFF.
public struct UTF8Validator: Sendable, Hashable {
    /// Continuation bytes still expected in the current code point.
    private var remaining = 0
    /// Allowed range of the next byte (narrower than 0x80-0xBF right after some lead bytes).
    private var lower: UInt8 = 0x80
    private var upper: UInt8 = 0xBF

    public init() {}

    /// Feeds bytes; `false` as soon as they cannot be (the start of) valid UTF-8. Contiguous storage (arrays,
    /// slices, buffers) takes the fast path of ``feed(_:)-(UnsafeRawBufferPointer)``.
    public mutating func feed<Bytes: Sequence>(_ bytes: Bytes) -> Bool where Bytes.Element == UInt8 {
        if let result = bytes.withContiguousStorageIfAvailable({ feed(UnsafeRawBufferPointer($0)) }) {
            return result
        }
        for byte in bytes where !step(byte) { return false }
        return true
    }

    /// Feeds bytes from memory: ASCII runs are skipped 8 bytes at a time, everything else byte by byte.
    public mutating func feed(_ buffer: UnsafeRawBufferPointer) -> Bool {
        var index = 0
        let count = buffer.count
        while index < count {
            if remaining == 0 {
                while index + 8 <= count,
                    buffer.loadUnaligned(fromByteOffset: index, as: UInt64.self) & 0x8080_8080_8080_8080 == 0
                {
                    index += 8
                }
                guard index < count else { break }
            }
            guard step(buffer[index]) else { return false }
            index += 1
        }
        return true
    }

    /// One byte through the state machine.
    @inline(__always)
    private mutating func step(_ byte: UInt8) -> Bool {
        if remaining == 0 {
            switch byte {
            case 0x00...0x7F: return true
            case 0xC2...0xDF: remaining = 1
            case 0xE0: (remaining, lower, upper) = (2, 0xA0, 0xBF)  // no overlong 3-byte forms
            case 0xE1...0xEC, 0xEE...0xEF: remaining = 2
            case 0xED: (remaining, lower, upper) = (2, 0x80, 0x9F)  // no surrogates
            case 0xF0: (remaining, lower, upper) = (3, 0x90, 0xBF)  // no overlong 4-byte forms
            case 0xF1...0xF3: remaining = 3
            case 0xF4: (remaining, lower, upper) = (3, 0x80, 0x8F)  // nothing above U+10FFFF
            default: return false  // 0x80-0xC1 as a lead byte, 0xF5-0xFF
            }
            return true
        }
        guard byte >= lower && byte <= upper else { return false }
        remaining -= 1
        (lower, upper) = (0x80, 0xBF)
        return true
    }

    /// `true` when everything fed so far ends on a code point boundary.
    public var isComplete: Bool { remaining == 0 }

    /// Validates a whole buffer.
    public static func isValid<Bytes: Sequence>(_ bytes: Bytes) -> Bool where Bytes.Element == UInt8 {
        var validator = UTF8Validator()
        return validator.feed(bytes) && validator.isComplete
    }
}
