import Glibc

/// Masking keys for a client's frames. RFC 6455 §5.3 wants them unpredictable, "derived from a strong source of
/// entropy": they come from the system's generator (glibc's `arc4random_buf`, which reads the kernel's
/// getrandom(2)), fetched 256 at a time. Swift's `SystemRandomNumberGenerator` makes one getrandom call per
/// value, which was a system call per frame sent (`crng_make_state` alone was 2.7% of a WebSocket pump
/// client's samples). The buffer is made on first use, so a server's connections, which never mask, carry
/// nothing.
struct MaskingKeys {
    private var keys: [UInt32] = []
    private var index = 0

    /// The next key.
    mutating func next() -> UInt32 {
        if index == keys.count {
            if keys.isEmpty { keys = [UInt32](repeating: 0, count: 256) }
            keys.withUnsafeMutableBytes { arc4random_buf($0.baseAddress!, $0.count) }
            index = 0
        }
        defer { index += 1 }
        return keys[index]
    }
}
