import ConnectionCore
import NIOCore
import NIOWebSocket
import WebSocketCodec
import WebSocketTransport

/// nio's ws:// frames with SwiftNIO's own `WebSocketFrameDecoder` and `WebSocketFrameEncoder` in the channel
/// pipeline, as a SwiftNIO user would, under the same WebSocket state machine, pings and close handshake as every
/// other backend. (wss:// runs over our TLS, which reads bytes, so it keeps our parser.)
extension NIOStreamConnection: WebSocketFramingConnection {
    func webSocketFrameLink(
        role: WebSocketRole, maximumFrameSize: Int, allowsCompressedFrames: Bool, leftover: [UInt8]
    ) async throws(ConnectionError) -> (any WebSocketFrameLink)? {
        let channel = channel
        let inbox = inbox
        let frames = ReceiveQueue<WebSocketLinkInput>(
            capacity: options.receiveQueueLimit,
            weigh: { input in
                if case .frame(let frame) = input { max(1, frame.payload.count) } else { 1 }
            },
            onSpaceAvailable: { channel.setOption(ChannelOptions.autoRead, value: true).whenComplete { _ in } })
        let maximumFrameSize = Int(min(UInt64(maximumFrameSize), UInt64(UInt32.max)))
        let switched: Bool
        do {
            switched = try await channel.eventLoop.submit {
                // On the loop, so no read lands between taking the buffered bytes and installing the decoder.
                guard channel.isActive, !inbox.isEnded else { return false }
                var pending = leftover
                for chunk in inbox.close() { pending += chunk }
                let pipeline = channel.pipeline.syncOperations
                pipeline.removeHandler(name: StreamInboxHandler.name, promise: nil)
                try pipeline.addHandlers([
                    ByteToMessageHandler(WebSocketFrameDecoder(maxFrameSize: maximumFrameSize)),
                    WebSocketFrameEncoder(),
                    WebSocketFrameInboxHandler(
                        role: role, allowsCompressedFrames: allowsCompressedFrames, frames: frames),
                ])
                try channel.syncOptions?.setOption(.autoRead, value: true)
                if !pending.isEmpty {
                    pipeline.fireChannelRead(NIOAny(channel.allocator.buffer(bytes: pending)))
                    pipeline.fireChannelReadComplete()
                }
                return true
            }.get()
        } catch {
            throw connectionError(error, "switch to WebSocket frames")
        }
        return switched ? NIOWebSocketFrameLink(connection: self, frames: frames) : nil
    }
}

/// Sends through `WebSocketFrameEncoder`; receives what ``WebSocketFrameInboxHandler`` queued.
final class NIOWebSocketFrameLink: WebSocketFrameLink {
    let connection: NIOStreamConnection
    let frames: ReceiveQueue<WebSocketLinkInput>
    var framing: String { "SwiftNIO NIOWebSocket" }

    init(connection: NIOStreamConnection, frames: ReceiveQueue<WebSocketLinkInput>) {
        self.connection = connection
        self.frames = frames
    }

    func send(_ frames: [WebSocketCodec.WebSocketFrame]) async throws(ConnectionError) {
        let allocator = connection.channel.allocator
        try await connection.write(
            frames.map { frame in
                NIOWebSocket.WebSocketFrame(
                    fin: frame.fin, rsv1: frame.rsv1, rsv2: frame.rsv2, rsv3: frame.rsv3,
                    opcode: NIOWebSocket.WebSocketOpcode(encodedWebSocketOpcode: frame.opcode.rawValue) ?? .binary,
                    maskKey: frame.maskingKey.map(Self.maskingKey), data: Self.buffer(frame.payload, allocator))
            })
    }

    func receive() async throws(ConnectionError) -> WebSocketLinkInput? {
        try await frames.next()
    }

    /// The payload with room in front for the frame header, which the encoder then writes in place (one buffer
    /// per frame instead of a header buffer and a payload buffer).
    static func buffer(_ payload: [UInt8], _ allocator: ByteBufferAllocator) -> ByteBuffer {
        let headroom = 14
        var buffer = allocator.buffer(capacity: headroom + payload.count)
        buffer.moveWriterIndex(forwardBy: headroom)
        buffer.moveReaderIndex(forwardBy: headroom)
        buffer.writeBytes(payload)
        return buffer
    }

    /// Our key (the four bytes in network order as one integer) as SwiftNIO's.
    static func maskingKey(_ key: UInt32) -> WebSocketMaskingKey {
        [
            UInt8(truncatingIfNeeded: key >> 24), UInt8(truncatingIfNeeded: key >> 16),
            UInt8(truncatingIfNeeded: key >> 8), UInt8(truncatingIfNeeded: key),
        ]
    }
}

/// The decoder's frames into a bounded queue (reading stops while it is full), checked against what RFC 6455
/// asks and SwiftNIO's decoder leaves to its user: masking by role, no reserved bits (but RSV1 with
/// permessage-deflate) or opcodes.
final class WebSocketFrameInboxHandler: ChannelInboundHandler {
    typealias InboundIn = NIOWebSocket.WebSocketFrame
    let role: WebSocketRole
    let allowsCompressedFrames: Bool
    let frames: ReceiveQueue<WebSocketLinkInput>
    /// After an invalid frame nothing more is read: the connection is failing.
    private var failed = false

    init(role: WebSocketRole, allowsCompressedFrames: Bool, frames: ReceiveQueue<WebSocketLinkInput>) {
        self.role = role
        self.allowsCompressedFrames = allowsCompressedFrames
        self.frames = frames
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !failed else { return }
        let input = Self.input(
            Self.unwrapInboundIn(data), role: role, allowsCompressedFrames: allowsCompressedFrames)
        if case .invalid = input { failed = true }
        if !frames.push(input).hasSpace { try? context.channel.syncOptions?.setOption(.autoRead, value: false) }
    }

    static func input(
        _ frame: NIOWebSocket.WebSocketFrame, role: WebSocketRole, allowsCompressedFrames: Bool
    ) -> WebSocketLinkInput {
        let opcode = WebSocketCodec.WebSocketOpcode(rawValue: UInt8(webSocketOpcode: frame.opcode))
        do throws(WebSocketProtocolError) {
            try WebSocketFrameParser.checkReservedBits(
                rsv1: frame.rsv1, rsv2: frame.rsv2, rsv3: frame.rsv3, allowsCompressedFrames: allowsCompressedFrames)
        } catch {
            return .invalid(error)
        }
        guard opcode.isKnown else { return .invalid(WebSocketProtocolError(.protocolError, "unknown \(opcode)")) }
        switch (role, frame.maskKey) {
        case (.server, nil):
            return .invalid(WebSocketProtocolError(.protocolError, "a client frame must be masked"))
        case (.client, .some):
            return .invalid(WebSocketProtocolError(.protocolError, "a server frame must not be masked"))
        default:
            break
        }
        // SwiftNIO hands over the payload as it came (masked) and unmasks a byte at a time (`unmaskedData`; its
        // documentation suggests unmasking by hand for speed): unmasked 8 bytes at a time as it is copied out.
        let key = frame.maskKey.map { key in key.reduce(UInt32(0)) { $0 << 8 | UInt32($1) } }
        let payload: [UInt8]
        if let key {
            let count = frame.data.readableBytes
            payload = frame.data.withUnsafeReadableBytes { masked in
                [UInt8](unsafeUninitializedCapacity: count) { out, initialized in
                    WebSocketMasking.copy(masked, to: UnsafeMutableRawBufferPointer(out), key: key)
                    initialized = count
                }
            }
        } else {
            payload = Array(frame.data.readableBytesView)
        }
        return .frame(
            WebSocketCodec.WebSocketFrame(
                fin: frame.fin, opcode: opcode, payload: payload, maskingKey: key, rsv1: frame.rsv1))
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        switch error {
        case let error as NIOWebSocketError:
            guard !failed else { return }
            failed = true
            let (code, reason): (WebSocketCloseCode, String) =
                switch error {
                case .invalidFrameLength: (.messageTooBig, "a frame exceeds the limit or its length is invalid")
                case .fragmentedControlFrame: (.protocolError, "a control frame must not be fragmented")
                case .multiByteControlFrameLength: (.protocolError, "a control frame carries at most 125 bytes")
                }
            frames.push(.invalid(WebSocketProtocolError(code, reason)))
        case is ByteToMessageDecoderError:
            // After a decoding error (already reported), or a partial frame when the stream ended (the end follows).
            break
        default:
            frames.finish(.failed(connectionError(error, "read")))
            context.close(promise: nil)
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed { frames.finish(.finished) }
        context.fireUserInboundEventTriggered(event)
    }

    func channelInactive(context: ChannelHandlerContext) {
        frames.finish(.finished)
        context.fireChannelInactive()
    }
}
