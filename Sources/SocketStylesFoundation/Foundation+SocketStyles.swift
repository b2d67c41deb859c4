// Opt-in Foundation conveniences for code ported from Apple platforms, where messages are `Data` and addresses
// are `URL`: `import SocketStylesFoundation` adds them; the rest of SocketStyles does not link Foundation.
public import Foundation
public import SocketStyles

extension Message {
    /// A binary message with the bytes of `data` (URLSessionWebSocketTask.Message.data).
    public init(data: Data) {
        self.init(kind: .binary, bytes: [UInt8](data))
    }

    /// A binary message with the bytes of `data`.
    public static func data(_ data: Data) -> Message {
        Message(data: data)
    }

    /// The bytes as `Data`, whatever the kind (a text message's UTF-8).
    public var data: Data { Data(bytes) }
}

extension Endpoint {
    /// The endpoint of a `tcp://`, `udp://`, `tls://`, `ws://` or `wss://` URL, as ``Endpoint/init(url:)`` reads
    /// its string (an `http://` or `https://` URL is refused: say `ws://` or `wss://`).
    public init(url: URL) throws(ConnectionError) {
        try self.init(url: url.absoluteString)
    }
}

extension Connection {
    /// Sends `data` as one binary message (a datagram over UDP, bytes of the stream over TCP and TLS).
    public func send(data: Data) async throws(ConnectionError) {
        try await send(Message(data: data))
    }
}

extension WebSocketConnection {
    /// Closes with `code` and a reason given as `Data` (URLSessionWebSocketTask.cancel(with:reason:) takes
    /// `Data?`); a reason that is not UTF-8 is refused by the peer, so it is decoded leniently here.
    public func close(code: WebSocketCloseCode, reason: Data?) async {
        await close(code: code, reason: reason.map { String(decoding: $0, as: UTF8.self) } ?? "")
    }
}
