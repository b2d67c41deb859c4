/// The connection logic of RFC 6455 without I/O: frames in, actions out. Reassembles fragmented messages,
/// inflates compressed ones (RFC 7692, when ``deflate`` was agreed), validates text incrementally (1007, failing
/// fast, after inflation), enforces the message size limit on what it delivers (1009: a deflate bomb stops at the
/// limit), answers pings, runs the close handshake, and never puts 1005 or 1006 on the wire. Tested without
/// sockets.
public struct WebSocketStateMachine: Sendable {
    /// What the caller must do.
    public enum Action: Sendable, Hashable {
        /// A whole message arrived.
        case deliver(text: Bool, payload: [UInt8])
        /// Send this frame (a pong, a close reply, a close that fails the connection).
        case send(WebSocketFrame)
        /// A ping arrived (its payload); the pong that answers it follows as a ``send(_:)``.
        case pingReceived([UInt8])
        /// A pong arrived (its payload), for a ping we sent.
        case pongReceived([UInt8])
        /// The peer's close frame: its code (1005 when it sent none) and reason.
        case closeReceived(WebSocketCloseCode, String)
        /// The peer broke the protocol; a close frame with the error's code has been queued (`send`).
        case failed(WebSocketProtocolError)
        /// Close the TCP connection now.
        case closeConnection
    }

    /// Where the close handshake stands.
    public enum State: Sendable, Hashable {
        case open
        /// We sent a close frame and wait for the peer's.
        case closing
        case closed
    }

    public let role: WebSocketRole
    /// The largest message accepted (reassembled size); 1009 above it.
    public var maximumMessageSize: Int
    public private(set) var state: State = .open
    /// The peer's close code and reason, once received.
    public private(set) var peerClose: (code: WebSocketCloseCode, reason: String)?

    /// permessage-deflate as the handshake agreed it (`nil`: not in use, RSV1 is a protocol error).
    public let deflate: WebSocketDeflateAgreement?

    private var fragments: [UInt8] = []
    private var fragmentIsText: Bool?
    private var fragmentIsCompressed = false
    private var validator = UTF8Validator()
    /// Created with the first compressed message (a connection that never gets one pays nothing).
    private var inflater: WebSocketInflater?

    public init(
        role: WebSocketRole, maximumMessageSize: Int = 64 * 1024 * 1024, deflate: WebSocketDeflateAgreement? = nil
    ) {
        self.role = role
        self.maximumMessageSize = maximumMessageSize
        self.deflate = deflate
    }

    /// Handles one frame from the peer.
    public mutating func receive(_ frame: WebSocketFrame) -> [Action] {
        guard state != .closed else { return [] }
        if frame.rsv2 || frame.rsv3 || (frame.rsv1 && deflate == nil) {
            return fail(.protocolError, "reserved bits set without a negotiated extension")
        }
        if frame.rsv1 && (frame.opcode.isControl || frame.opcode == .continuation) {
            // RFC 7692 §6.1: only a message's first frame says it is compressed; control frames never are.
            return fail(.protocolError, "RSV1 set on a \(frame.opcode) frame")
        }
        switch frame.opcode {
        case .ping:
            guard state == .open else { return [] }
            return [.pingReceived(frame.payload), .send(WebSocketFrame(opcode: .pong, payload: frame.payload))]
        case .pong:
            return [.pongReceived(frame.payload)]
        case .close:
            return receiveClose(frame.payload)
        case .text, .binary:
            guard fragmentIsText == nil else {
                return fail(.protocolError, "a new message began before the fragmented one ended")
            }
            fragmentIsText = frame.opcode == .text
            fragmentIsCompressed = frame.rsv1
            fragments.removeAll(keepingCapacity: true)
            validator = UTF8Validator()
            return appendFragment(frame)
        case .continuation:
            guard fragmentIsText != nil else {
                return fail(.protocolError, "a continuation frame with no message to continue")
            }
            return appendFragment(frame)
        default:
            return fail(.protocolError, "unknown \(frame.opcode)")
        }
    }

    /// What to do with a message whose one frame (FIN, text or binary, not compressed) the caller received
    /// into a buffer of its own (``WebSocketFrameParser/feed(_:placingInto:)``).
    public enum PlacedOutcome: Sendable, Hashable {
        /// The message is good: the buffer holds it.
        case deliver
        /// Act as for a frame (``receive(_:)``): a violation, or nothing when the connection is closing.
        case actions([Action])
    }

    /// Handles a message in one frame that the caller received into its own buffer, by the rules
    /// ``receive(_:)`` applies to the same frame: it must not interrupt a fragmented message, must fit
    /// ``maximumMessageSize``, and text must be valid UTF-8.
    public mutating func receivePlaced(text: Bool, payload: UnsafeRawBufferPointer) -> PlacedOutcome {
        guard state != .closed else { return .actions([]) }
        guard fragmentIsText == nil else {
            return .actions(fail(.protocolError, "a new message began before the fragmented one ended"))
        }
        guard payload.count <= maximumMessageSize else {
            return .actions(fail(.messageTooBig, "a message exceeds the limit of \(maximumMessageSize) bytes"))
        }
        if text && !UTF8Validator.isValid(payload) {
            return .actions(fail(.invalidFramePayloadData, "invalid UTF-8 in a text message"))
        }
        return state == .open ? .deliver : .actions([])
    }

    private mutating func appendFragment(_ frame: WebSocketFrame) -> [Action] {
        let isText = fragmentIsText!
        if fragmentIsCompressed {
            let before = fragments.count
            do throws(WebSocketProtocolError) {
                if inflater == nil, let deflate { inflater = try WebSocketInflater(agreement: deflate, role: role) }
                try inflater?.inflate(frame.payload, final: frame.fin, into: &fragments, limit: maximumMessageSize)
            } catch {
                if error.closeCode == .messageTooBig {
                    return fail(
                        .messageTooBig, "a message exceeds the limit of \(maximumMessageSize) bytes once inflated")
                }
                return failConnection(error)
            }
            if isText && !validator.feed(fragments[before...]) {
                return fail(.invalidFramePayloadData, "invalid UTF-8 in a text message")
            }
        } else {
            guard fragments.count + frame.payload.count <= maximumMessageSize else {
                return fail(.messageTooBig, "a message exceeds the limit of \(maximumMessageSize) bytes")
            }
            if isText && !validator.feed(frame.payload) {
                return fail(.invalidFramePayloadData, "invalid UTF-8 in a text message")
            }
            if frame.fin && fragments.isEmpty {
                // A message in one frame (the common case) is delivered as the frame's payload: no copy.
                if isText && !validator.isComplete {
                    return fail(.invalidFramePayloadData, "a text message ends inside a code point")
                }
                fragmentIsText = nil
                return state == .open ? [.deliver(text: isText, payload: frame.payload)] : []
            }
            fragments.append(contentsOf: frame.payload)
        }
        guard frame.fin else { return [] }
        if isText && !validator.isComplete {
            return fail(.invalidFramePayloadData, "a text message ends inside a code point")
        }
        fragmentIsText = nil
        let payload = fragments
        fragments = []
        return state == .open ? [.deliver(text: isText, payload: payload)] : []
    }

    private mutating func receiveClose(_ payload: [UInt8]) -> [Action] {
        var code = WebSocketCloseCode.noStatusReceived
        var reason = ""
        if payload.count == 1 { return fail(.protocolError, "a close frame with a 1-byte payload") }
        if payload.count >= 2 {
            code = WebSocketCloseCode(rawValue: UInt16(payload[0]) << 8 | UInt16(payload[1]))
            guard code.isValidOnWire else { return fail(.protocolError, "close code \(code.rawValue) is not allowed") }
            let reasonBytes = payload[2...]
            guard UTF8Validator.isValid(reasonBytes) else {
                return fail(.invalidFramePayloadData, "the close reason is not valid UTF-8")
            }
            reason = String(decoding: reasonBytes, as: UTF8.self)
        }
        peerClose = (code, reason)
        if state == .closing {
            state = .closed
            return [.closeReceived(code, reason), .closeConnection]
        }
        state = .closed
        // Echo the code (1000 when the peer sent none: 1005 never goes on the wire).
        let reply = code == .noStatusReceived ? WebSocketCloseCode.normalClosure : code
        return [.closeReceived(code, reason), .send(Self.closeFrame(reply, "")), .closeConnection]
    }

    /// Starts the close handshake: the close frame to send. Later frames from the peer are ignored but for
    /// its close frame.
    public mutating func close(_ code: WebSocketCloseCode = .normalClosure, reason: String = "") -> [Action] {
        guard state == .open else { return [] }
        state = .closing
        let onWire = code.isValidOnWire ? code : .normalClosure
        return [.send(Self.closeFrame(onWire, reason))]
    }

    /// The connection ended (TCP closed) without a close handshake.
    public mutating func connectionLost() {
        state = .closed
    }

    private mutating func fail(_ code: WebSocketCloseCode, _ reason: String) -> [Action] {
        failConnection(WebSocketProtocolError(code, reason))
    }

    /// Fails the connection for `error` (from the frame parser, say): the close frame to send, then close.
    public mutating func failConnection(_ error: WebSocketProtocolError) -> [Action] {
        let code = error.closeCode
        let reason = error.reason
        let wasOpen = state == .open
        state = .closed
        fragments = []
        fragmentIsText = nil
        return [.failed(error)] + (wasOpen ? [.send(Self.closeFrame(code, reason))] : []) + [.closeConnection]
    }

    /// A close frame; the reason is cut (on a UTF-8 boundary) to fit the 125-byte control limit.
    public static func closeFrame(_ code: WebSocketCloseCode, _ reason: String) -> WebSocketFrame {
        var reasonBytes = Array(reason.utf8.prefix(123))
        while !UTF8Validator.isValid(reasonBytes) { reasonBytes.removeLast() }
        return WebSocketFrame(
            opcode: .close, payload: [UInt8(code.rawValue >> 8), UInt8(code.rawValue & 0xFF)] + reasonBytes)
    }

    /// The frames for one outgoing message, fragmented into frames of at most `fragmentSize` bytes. A
    /// `compressed` payload (permessage-deflate) has RSV1 on its first frame only.
    public static func frames(
        text: Bool, payload: [UInt8], fragmentSize: Int = .max, compressed: Bool = false
    ) -> [WebSocketFrame] {
        let size = max(1, fragmentSize)
        guard payload.count > size else {
            return [WebSocketFrame(opcode: text ? .text : .binary, payload: payload, rsv1: compressed)]
        }
        var frames: [WebSocketFrame] = []
        var offset = 0
        while offset < payload.count {
            let end = min(payload.count, offset + size)
            frames.append(
                WebSocketFrame(
                    fin: end == payload.count, opcode: offset == 0 ? (text ? .text : .binary) : .continuation,
                    payload: Array(payload[offset..<end]), rsv1: compressed && offset == 0))
            offset = end
        }
        return frames
    }
}
