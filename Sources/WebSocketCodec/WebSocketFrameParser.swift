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
///
/// It parses as bytes are fed: a frame's header is kept (at most 14 bytes) and its payload goes straight from
/// the bytes fed into the frame's own array, unmasked on the way, so a payload is copied once whatever the
/// reads that bring it (no buffer of raw frames that is copied out and unmasked later). A violation is thrown
/// by ``nextFrame()`` after the frames before it; nothing after it is parsed. Set ``allowsCompressedFrames`` and
/// ``maximumFrameSize`` before feeding the bytes they apply to.
///
/// A receive into a caller's buffer (``feed(_:placingInto:)``) goes one step further: the payload of a message in
/// one frame is unmasked straight into that buffer, with no array of its own (``takePlaced()``).
public struct WebSocketFrameParser: Sendable {
    /// Whose frames this parser reads: `.server` parses what clients send (masked).
    public let role: WebSocketRole
    /// The largest payload accepted in one frame.
    public var maximumFrameSize: Int
    /// RSV1 is allowed: permessage-deflate was agreed (RFC 7692 §6).
    public var allowsCompressedFrames = false

    private struct Header: Sendable {
        var fin: Bool
        var rsv1: Bool
        var opcode: WebSocketOpcode
        var key: UInt32?
        var length: Int
    }

    /// The current frame's header bytes so far (kept inline: a parser allocates only payloads and its list of
    /// parsed frames).
    private var headerBytes = HeaderBytes()
    /// The current frame's header, once all of it arrived.
    private var current: Header?
    /// The current frame's payload so far, unmasked: `payload[..<filled]` (a payload made at its full size when
    /// its first piece came holds zeros after that).
    private var payload: [UInt8] = []
    private var filled = 0
    /// Whole frames not yet returned, from `readyHead` on.
    private var ready: [WebSocketFrame] = []
    private var readyHead = 0
    /// The violation found; thrown once the frames before it were returned.
    private var failure: WebSocketProtocolError?
    /// The current frame's payload goes to the caller's buffer (`destination[..<filled]` so far), not to `payload`.
    private var placing = false
    /// A frame whose payload was placed in the caller's buffer, not yet taken.
    private var placed: (opcode: WebSocketOpcode, count: Int)?

    /// A parser for the given end of the connection.
    public init(role: WebSocketRole, maximumFrameSize: Int = 16 * 1024 * 1024 + 1024) {
        self.role = role
        self.maximumFrameSize = maximumFrameSize
    }

    /// Adds received bytes.
    public mutating func feed(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { feed($0) }
    }

    /// The `[UInt8]` form of `feed(_:)` for any collection of bytes.
    public mutating func feed<Bytes: Collection>(_ bytes: Bytes) where Bytes.Element == UInt8 {
        let done: Void? = bytes.withContiguousStorageIfAvailable { feed(UnsafeRawBufferPointer($0)) }
        if done == nil { Array(bytes).withUnsafeBytes { feed($0) } }
    }

    /// Adds received bytes from a buffer the caller keeps (a read buffer): payloads are copied out of it as
    /// they are parsed, so it can be reused as soon as this returns.
    public mutating func feed(_ input: UnsafeRawBufferPointer) {
        precondition(!placing, "a frame is being placed: feed(_:placingInto:) with the same buffer, or stopPlacing")
        feed(input, destination: nil, stoppingAfterPlaced: false)
    }

    /// Adds received bytes as ``feed(_:)-(UnsafeRawBufferPointer)`` does, but places the payload of the next message that comes in one
    /// frame (FIN, text or binary, not compressed) and fits in `destination` there, unmasked, instead of in a
    /// frame: when no parsed frame is waiting, the first such frame whose header arrives is placed, and
    /// ``takePlaced()`` returns it once complete. One frame at most; the bytes after it are parsed as usual.
    ///
    /// A frame may take several calls to arrive: each must pass the same buffer, until ``takePlaced()`` returns
    /// it or ``stopPlacing(copyingFrom:)`` copies its bytes so far into the parser (a receive that is cancelled
    /// or fails loses nothing).
    public mutating func feed(_ input: UnsafeRawBufferPointer, placingInto destination: UnsafeMutableRawBufferPointer) {
        feed(input, destination: placed == nil ? destination : nil, stoppingAfterPlaced: false)
    }

    /// ``feed(_:placingInto:)`` that stops right after the placed frame is complete and returns how many bytes
    /// of `input` it took: the rest (the start of the next frame, say) stays with the caller, to be fed with the
    /// buffer of the next receive, where its payload can be placed too, instead of being parsed into an array of
    /// its own now. Takes nothing while a placed frame waits for ``takePlaced()``.
    public mutating func feedUntilPlaced(
        _ input: UnsafeRawBufferPointer, placingInto destination: UnsafeMutableRawBufferPointer
    ) -> Int {
        guard placed == nil else { return 0 }
        return feed(input, destination: destination, stoppingAfterPlaced: true)
    }

    /// The frame placed by ``feed(_:placingInto:)``, once all of its payload is in the buffer: its opcode and
    /// length. Frames parsed before it come first (``nextFrame()``); it comes before those parsed after it.
    public mutating func takePlaced() -> (opcode: WebSocketOpcode, count: Int)? {
        defer { placed = nil }
        return placed
    }

    /// A frame waits to be returned by ``takePlaced()``.
    public var hasPlaced: Bool { placed != nil }

    /// Ends placing: a frame partly placed in `destination` (the buffer the last ``feed(_:placingInto:)`` was
    /// given) is copied into the parser and goes on as an ordinary frame. Does nothing when no frame is partly
    /// placed. A frame already complete must have been taken (``takePlaced()``).
    public mutating func stopPlacing(copyingFrom destination: UnsafeRawBufferPointer) {
        precondition(placed == nil, "a placed frame was not taken")
        guard placing, let frame = current else { return }
        placing = false
        let sofar = UnsafeRawBufferPointer(rebasing: destination[..<filled])
        guard frame.length - filled <= 256 * 1024 else {
            // As in `feed`: a declared size is not allocated ahead of the bytes that make it.
            payload = Array(sofar)
            return
        }
        payload = [UInt8](unsafeUninitializedCapacity: frame.length) { out, initialized in
            UnsafeMutableRawBufferPointer(rebasing: UnsafeMutableRawBufferPointer(out)[..<filled]).copyMemory(
                from: sofar)
            initialized = frame.length  // the tail is written by the pieces still to come, as in `feed`
        }
    }

    /// Parses `input`; returns how many of its bytes were taken (all of them unless `stoppingAfterPlaced`).
    @discardableResult
    private mutating func feed(
        _ input: UnsafeRawBufferPointer, destination: UnsafeMutableRawBufferPointer?, stoppingAfterPlaced: Bool
    ) -> Int {
        var destination = destination
        var offset = 0
        let count = input.count
        while offset < count, failure == nil {
            if let frame = current {
                let take = min(frame.length - filled, count - offset)
                let slice = UnsafeRawBufferPointer(rebasing: input[offset..<(offset + take)])
                offset += take
                let at = filled
                if placing, let destination {
                    Self.place(
                        slice, into: UnsafeMutableRawBufferPointer(rebasing: destination[at..<(at + take)]),
                        key: frame.key, offset: at)
                } else if filled == 0 && take == frame.length {
                    // The whole payload is here: one pass into an array of its size.
                    payload = [UInt8](unsafeUninitializedCapacity: take) { out, initialized in
                        Self.place(slice, into: UnsafeMutableRawBufferPointer(out), key: frame.key, offset: 0)
                        initialized = take
                    }
                } else {
                    // Part of it. When the rest is at most 256 KiB beyond what came (a peer cannot make us allocate
                    // its declared size by sending one byte), the payload is made at its full size now and each
                    // piece unmasked straight into its place: one pass per piece. Its tail is written by the pieces
                    // still to come before anything reads it (the frame is delivered only once `filled` reaches
                    // its length, and dropped with the parser otherwise), so it is not zeroed first: a 64 KiB
                    // memset was a tenth of a WebSocket server's time in a 64 KiB pump.
                    if filled == 0 && frame.length - take <= 256 * 1024 {
                        payload = [UInt8](unsafeUninitializedCapacity: frame.length) { out, initialized in
                            Self.place(
                                slice,
                                into: UnsafeMutableRawBufferPointer(
                                    rebasing: UnsafeMutableRawBufferPointer(out)[..<take]), key: frame.key,
                                offset: 0)
                            initialized = frame.length
                        }
                    } else if payload.count == frame.length {
                        payload.withUnsafeMutableBytes { raw in
                            Self.place(
                                slice, into: UnsafeMutableRawBufferPointer(rebasing: raw[at..<(at + take)]),
                                key: frame.key, offset: at)
                        }
                    } else {
                        // A larger frame grows as its bytes come, unmasked while they are still in the cache.
                        if filled == 0 { payload.reserveCapacity(256 * 1024) }
                        payload.append(contentsOf: slice.bindMemory(to: UInt8.self))
                        if let key = frame.key {
                            payload.withUnsafeMutableBytes { raw in
                                WebSocketMasking.apply(
                                    key: key, to: UnsafeMutableRawBufferPointer(rebasing: raw[at...]), offset: at)
                            }
                        }
                    }
                }
                filled += take
                if filled == frame.length {
                    completeFrame()
                    if placed != nil {
                        if stoppingAfterPlaced { return offset }
                        destination = nil
                    }
                }
                continue
            }
            // The header: the first two bytes say how long the rest of it is.
            let needed = headerBytes.count < 2 ? 2 : fullHeaderLength()
            let take = min(needed - headerBytes.count, count - offset)
            for index in offset..<(offset + take) { headerBytes.append(input[index]) }
            offset += take
            guard headerBytes.count == needed else { continue }
            do throws(WebSocketProtocolError) {
                if needed == 2 {
                    try checkFirstTwoBytes()
                    if fullHeaderLength() > 2 { continue }
                }
                try finishHeader(room: destination?.count)
                if placed != nil {
                    if stoppingAfterPlaced { return offset }
                    destination = nil
                }
            } catch {
                failure = error
            }
        }
        // After a violation nothing more is parsed: the rest counts as taken.
        return count
    }

    /// Copies payload bytes into their place, unmasking them on the way when the frame is masked.
    private static func place(
        _ slice: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer, key: UInt32?, offset: Int
    ) {
        if let key {
            WebSocketMasking.copy(slice, to: out, key: key, offset: offset)
        } else {
            out.copyMemory(from: slice)
        }
    }

    /// Payload bytes of frames not yet returned, and the bytes of the frame being received so far.
    public var bufferedCount: Int {
        ready[readyHead...].reduce(headerBytes.count + filled) { $0 + $1.payload.count }
    }

    /// The next complete frame, or `nil` when more bytes are needed.
    public mutating func nextFrame() throws(WebSocketProtocolError) -> WebSocketFrame? {
        if readyHead < ready.count {
            let frame = ready[readyHead]
            ready[readyHead].payload = []  // the caller holds the only reference: no copy if it changes it
            readyHead += 1
            if readyHead == ready.count {
                ready.removeAll(keepingCapacity: true)
                readyHead = 0
            }
            return frame
        }
        if let failure { throw failure }
        return nil
    }

    // MARK: Header

    /// The header's length, known from its first two bytes.
    private func fullHeaderLength() -> Int {
        let code = headerBytes[1] & 0x7F
        let extended = code == 126 ? 2 : code == 127 ? 8 : 0
        return 2 + extended + (headerBytes[1] & 0x80 != 0 ? 4 : 0)
    }

    private func checkFirstTwoBytes() throws(WebSocketProtocolError) {
        let first = headerBytes[0]
        let second = headerBytes[1]
        try Self.checkReservedBits(
            rsv1: first & 0x40 != 0, rsv2: first & 0x20 != 0, rsv3: first & 0x10 != 0,
            allowsCompressedFrames: allowsCompressedFrames)
        let opcode = WebSocketOpcode(rawValue: first & 0x0F)
        guard opcode.isKnown else { throw WebSocketProtocolError(.protocolError, "unknown \(opcode)") }
        let masked = second & 0x80 != 0
        switch role {
        case .server where !masked: throw WebSocketProtocolError(.protocolError, "a client frame must be masked")
        case .client where masked: throw WebSocketProtocolError(.protocolError, "a server frame must not be masked")
        default: break
        }
        if opcode.isControl {
            guard first & 0x80 != 0 else {
                throw WebSocketProtocolError(.protocolError, "a control frame must not be fragmented")
            }
            guard second & 0x7F <= 125 else {
                throw WebSocketProtocolError(.protocolError, "a control frame carries at most 125 bytes")
            }
        }
    }

    /// `room`: the size of the caller's buffer a message in one frame may be placed in (`nil`: none).
    private mutating func finishHeader(room: Int?) throws(WebSocketProtocolError) {
        let first = headerBytes[0]
        var length = UInt64(headerBytes[1] & 0x7F)
        var next = 2
        if length == 126 {
            length = UInt64(headerBytes[2]) << 8 | UInt64(headerBytes[3])
            next = 4
        } else if length == 127 {
            length = 0
            for index in 2..<10 { length = length << 8 | UInt64(headerBytes[index]) }
            guard length & (1 << 63) == 0 else {
                throw WebSocketProtocolError(.protocolError, "the most significant bit of a 64-bit length must be 0")
            }
            next = 10
        }
        guard length <= UInt64(maximumFrameSize) else {
            throw WebSocketProtocolError(
                .messageTooBig, "a \(length)-byte frame exceeds the limit of \(maximumFrameSize)")
        }
        var key: UInt32?
        if headerBytes[1] & 0x80 != 0 {
            key = (next..<(next + 4)).reduce(UInt32(0)) { $0 << 8 | UInt32(headerBytes[$1]) }
        }
        let header = Header(
            fin: first & 0x80 != 0, rsv1: first & 0x40 != 0, opcode: WebSocketOpcode(rawValue: first & 0x0F), key: key,
            length: Int(length))
        current = header
        if let room {
            // Frames parsed before it are returned first; a fragment or a compressed message goes through the
            // state machine's reassembly, and so does anything larger than the buffer (it throws too large there).
            placing =
                readyHead == ready.count && header.fin && (header.opcode == .binary || header.opcode == .text)
                && !header.rsv1 && header.length <= room
        }
        if length == 0 { completeFrame() }
    }

    private mutating func completeFrame() {
        guard let frame = current else { return }
        if placing {
            placed = (frame.opcode, frame.length)
            placing = false
            filled = 0
            current = nil
            headerBytes = HeaderBytes()
            return
        }
        ready.append(
            WebSocketFrame(
                fin: frame.fin, opcode: frame.opcode, payload: payload, maskingKey: frame.key, rsv1: frame.rsv1))
        payload = []
        filled = 0
        current = nil
        headerBytes = HeaderBytes()
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

/// Up to 14 header bytes, inline (two words, little end first).
private struct HeaderBytes: Sendable {
    private var low: UInt64 = 0
    private var high: UInt64 = 0
    private(set) var count = 0

    subscript(index: Int) -> UInt8 {
        index < 8
            ? UInt8(truncatingIfNeeded: low >> UInt64(8 * index))
            : UInt8(truncatingIfNeeded: high >> UInt64(8 * (index - 8)))
    }

    mutating func append(_ byte: UInt8) {
        precondition(count < 16, "a frame header has at most 14 bytes")
        if count < 8 {
            low |= UInt64(byte) << UInt64(8 * count)
        } else {
            high |= UInt64(byte) << UInt64(8 * (count - 8))
        }
        count += 1
    }
}
