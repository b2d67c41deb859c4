package import ConnectionCore
import Synchronization
package import WebSocketCodec

/// What a ``WebSocketFrameLink`` read: a frame, a frame the RFC forbids (the connection fails with its close
/// code), or nothing.
package enum WebSocketLinkInput: Sendable {
    /// A whole frame, payload unmasked.
    case frame(WebSocketFrame)
    /// Bytes that are not a valid frame for this role.
    case invalid(WebSocketProtocolError)
}

/// What carries frames under a ``WebSocketConnection``: the seam between the framing (bytes on the wire) and
/// everything above it (the state machine, pings, the close handshake), which is written once.
///
/// Every backend gets ``ByteStreamFrameLink`` (our parser and encoder over its TCP or TLS connection); a
/// backend whose TCP connection frames natively offers its own link through ``WebSocketFramingConnection``
/// (nio: SwiftNIO's `WebSocketFrameDecoder` and `WebSocketFrameEncoder` in the channel pipeline).
package protocol WebSocketFrameLink: Sendable {
    /// Whose code parses and encodes the frames (``WebSocketConnection/framing``).
    var framing: String { get }
    /// Sends frames in order; a client's frames carry their masking key (the link masks).
    func send(_ frames: [WebSocketFrame]) async throws(ConnectionError)
    /// The next frame; `nil` when the byte stream ended (whatever the state of the WebSocket).
    func receive() async throws(ConnectionError) -> WebSocketLinkInput?
}

/// A TCP connection that can carry WebSocket frames in its own way after the opening handshake.
package protocol WebSocketFramingConnection: Connection {
    /// Switches the connection to frames. `leftover` holds bytes read past the handshake (the start of the first
    /// frames). Returns `nil` when the connection cannot switch (it ended meanwhile): the caller then frames the
    /// bytes itself, and loses nothing.
    /// `allowsCompressedFrames`: permessage-deflate was agreed, RSV1 may be set.
    func webSocketFrameLink(
        role: WebSocketRole, maximumFrameSize: Int, allowsCompressedFrames: Bool, leftover: [UInt8]
    ) async throws(ConnectionError) -> (any WebSocketFrameLink)?
}

/// Frames over any byte stream: our encoder out, our parser in.
package final class ByteStreamFrameLink: WebSocketFrameLink {
    private let stream: any Connection
    private let parser: Mutex<WebSocketFrameParser>

    package var framing: String { "SocketStyles WebSocketCodec" }

    package init(
        over stream: any Connection, role: WebSocketRole, maximumFrameSize: Int, allowsCompressedFrames: Bool,
        leftover: [UInt8]
    ) {
        self.stream = stream
        var parser = WebSocketFrameParser(role: role, maximumFrameSize: maximumFrameSize)
        parser.allowsCompressedFrames = allowsCompressedFrames
        parser.feed(leftover)
        self.parser = Mutex(parser)
    }

    package func send(_ frames: [WebSocketFrame]) async throws(ConnectionError) {
        for frame in frames { try await stream.send(WebSocketFrameEncoder.encode(frame)) }
    }

    package func receive() async throws(ConnectionError) -> WebSocketLinkInput? {
        while true {
            // Whole frames already buffered first.
            do throws(WebSocketProtocolError) {
                if let frame = try parser.withLock({ (parser) throws(WebSocketProtocolError) in try parser.nextFrame() }
                ) {
                    return .frame(frame)
                }
            } catch {
                return .invalid(error)
            }
            guard let chunk = try await stream.receive() else { return nil }
            parser.withLock { $0.feed(chunk.bytes) }
        }
    }
}

/// A backend's own frame link under a ``ConnectionDecorator``: the frames bypass the decorator, so each one is
/// reported to it (a listener's idle timeout must see WebSocket traffic as activity).
package struct ObservedFrameLink: WebSocketFrameLink {
    private let link: any WebSocketFrameLink
    private let observer: any ConnectionDecorator

    package init(_ link: any WebSocketFrameLink, observer: any ConnectionDecorator) {
        self.link = link
        self.observer = observer
    }

    package var framing: String { link.framing }

    package func send(_ frames: [WebSocketFrame]) async throws(ConnectionError) {
        try await link.send(frames)
        observer.noteActivity()
    }

    package func receive() async throws(ConnectionError) -> WebSocketLinkInput? {
        let input = try await link.receive()
        observer.noteActivity()
        return input
    }
}
