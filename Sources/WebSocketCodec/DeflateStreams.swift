import CZlib

/// One direction's compressor: raw deflate (no zlib header), a sync flush per message.
///
/// zlib refuses a raw 256-byte window (window bits 8). With 8 agreed it compresses with 9 bits: zlib never refers
/// further back than its window less its 262-byte lookahead, 250 bytes for a 512-byte window, so the stream
/// stays within the 256 bytes the peer keeps (checked against zlib's own 8-bit inflater in the tests).
public final class WebSocketDeflater: @unchecked Sendable {
    // zlib keeps a pointer to its stream: the stream must not move, so it lives on the heap.
    private let stream = UnsafeMutablePointer<z_stream>.allocate(capacity: 1)
    private let resetsAfterMessage: Bool

    /// A compressor for `role`'s messages under `agreement`.
    public init(
        agreement: WebSocketDeflateAgreement, role: WebSocketRole, options: WebSocketDeflateOptions
    ) throws(WebSocketProtocolError) {
        stream.initialize(to: z_stream())
        let bits = max(9, agreement.sendingWindowBits(role))
        let status = socketstyles_deflate_init(
            stream, Int32(min(9, max(0, options.compressionLevel))), -Int32(bits),
            Int32(min(9, max(1, options.memoryLevel))), Z_DEFAULT_STRATEGY)
        guard status == Z_OK else {
            stream.deallocate()
            throw WebSocketProtocolError(.internalServerError, "zlib could not start a compressor (\(status))")
        }
        resetsAfterMessage = agreement.resetsAfterSending(role)
    }

    deinit {
        deflateEnd(stream)
        stream.deallocate()
    }

    /// The compressed payload of one message (the sync flush's empty block stripped).
    public func compress(_ message: [UInt8]) -> [UInt8] {
        var output: [UInt8] = []
        output.reserveCapacity(message.count / 2 + 64)
        message.withUnsafeBufferPointer { input in
            stream.pointee.next_in = UnsafeMutablePointer(mutating: input.baseAddress)
            stream.pointee.avail_in = UInt32(input.count)
            // Output goes through a buffer on the stack: a connection keeps no scratch memory between messages.
            let chunk = 16 * 1024
            withUnsafeTemporaryAllocation(of: UInt8.self, capacity: chunk) { buffer in
                repeat {
                    stream.pointee.next_out = buffer.baseAddress
                    stream.pointee.avail_out = UInt32(chunk)
                    // Z_BUF_ERROR (nothing to do) cannot lose data; any other failure is a bug in this code.
                    let status = deflate(stream, Z_SYNC_FLUSH)
                    precondition(status == Z_OK || status == Z_BUF_ERROR, "deflate failed (\(status))")
                    output.append(contentsOf: buffer[0..<(chunk - Int(stream.pointee.avail_out))])
                } while stream.pointee.avail_out == 0
            }
            stream.pointee.next_in = nil
        }
        if output.count >= 4 && Array(output.suffix(4)) == deflateTail { output.removeLast(4) }
        if output.isEmpty { output = [0x00] }  // an empty message: one empty block, as RFC 7692 §7.2.3.6 shows
        if resetsAfterMessage { deflateReset(stream) }
        return output
    }
}

/// One direction's decompressor. It always inflates with a 32 KiB window (a larger window than the sender's
/// inflates its stream correctly) and never produces more than a caller's limit: a deflate bomb is refused
/// after at most one scratch buffer past the limit, not allocated in full.
public final class WebSocketInflater: @unchecked Sendable {
    private let stream = UnsafeMutablePointer<z_stream>.allocate(capacity: 1)
    private let resetsAfterMessage: Bool

    /// A decompressor for the messages `role` receives under `agreement`.
    public init(agreement: WebSocketDeflateAgreement, role: WebSocketRole) throws(WebSocketProtocolError) {
        stream.initialize(to: z_stream())
        let status = socketstyles_inflate_init(stream, -15)
        guard status == Z_OK else {
            stream.deallocate()
            throw WebSocketProtocolError(.internalServerError, "zlib could not start a decompressor (\(status))")
        }
        resetsAfterMessage = agreement.resetsAfterReceiving(role)
    }

    deinit {
        inflateEnd(stream)
        stream.deallocate()
    }

    /// Inflates one frame's compressed payload, appending to `output`; the message's last frame passes
    /// `final` (the stripped tail is put back). Fails with 1009 once `output` would exceed `limit` bytes and with
    /// 1007 on data that is not a deflate stream.
    public func inflate(
        _ payload: [UInt8], final: Bool, into output: inout [UInt8], limit: Int
    ) throws(WebSocketProtocolError) {
        try run(payload, into: &output, limit: limit)
        if final {
            try run(deflateTail, into: &output, limit: limit)
            if resetsAfterMessage { inflateReset(stream) }
        }
    }

    private func run(_ input: [UInt8], into output: inout [UInt8], limit: Int) throws(WebSocketProtocolError) {
        guard !input.isEmpty else { return }
        var failure: WebSocketProtocolError?
        input.withUnsafeBufferPointer { input in
            stream.pointee.next_in = UnsafeMutablePointer(mutating: input.baseAddress)
            stream.pointee.avail_in = UInt32(input.count)
            let chunk = 16 * 1024
            withUnsafeTemporaryAllocation(of: UInt8.self, capacity: chunk) { buffer in
                while true {
                    stream.pointee.next_out = buffer.baseAddress
                    stream.pointee.avail_out = UInt32(chunk)
                    let status = CZlib.inflate(stream, Z_SYNC_FLUSH)
                    let produced = chunk - Int(stream.pointee.avail_out)
                    if produced > 0 {
                        guard output.count + produced <= limit else {
                            failure = WebSocketProtocolError(
                                .messageTooBig, "a compressed message inflates past the limit of \(limit) bytes")
                            return
                        }
                        output.append(contentsOf: buffer[0..<produced])
                    }
                    switch status {
                    case Z_OK:
                        if stream.pointee.avail_in == 0 && stream.pointee.avail_out != 0 { return }
                    case Z_BUF_ERROR:
                        return  // no progress possible: all input used and flushed
                    case Z_STREAM_END:
                        // The sender ended its stream (BFINAL): whatever follows starts a new one.
                        inflateReset(stream)
                        if stream.pointee.avail_in == 0 { return }
                    default:
                        let reason = stream.pointee.msg.map { String(cString: $0) } ?? "error \(status)"
                        failure = WebSocketProtocolError(
                            .invalidFramePayloadData, "a compressed message is not valid deflate data (\(reason))")
                        return
                    }
                }
            }
            stream.pointee.next_in = nil
        }
        if let failure { throw failure }
    }
}
