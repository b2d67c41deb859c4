/// What one ``Connection/send(_:)`` hands over and one ``Connection/receive(maximumLength:)`` returns.
///
/// For TCP and TLS a message is just a chunk of the byte stream: the chunk boundaries you receive are not the
/// ones that were sent. For UDP a message is one datagram. For WebSocket it is one whole message, and ``kind``
/// says whether it was sent as text or binary; other transports always report ``Kind/binary``.
public struct Message: Sendable, Hashable, CustomStringConvertible {
    /// Text or binary, as WebSocket distinguishes them.
    public enum Kind: Sendable, Hashable {
        case binary
        case text
    }

    /// Text or binary.
    public var kind: Kind
    /// The payload.
    public var bytes: [UInt8]

    /// A binary message.
    public init(_ bytes: [UInt8]) {
        self.kind = .binary
        self.bytes = bytes
    }

    /// A message of the given kind.
    public init(kind: Kind, bytes: [UInt8]) {
        self.kind = kind
        self.bytes = bytes
    }

    /// A text message holding the UTF-8 encoding of `string`.
    public static func text(_ string: String) -> Message {
        Message(kind: .text, bytes: Array(string.utf8))
    }

    /// The payload decoded as UTF-8, or `nil` when it is not valid UTF-8.
    public var text: String? {
        String(validating: bytes, as: UTF8.self)
    }

    /// The payload size in bytes.
    public var count: Int { bytes.count }

    public var description: String {
        "\(kind == .text ? "text" : "binary") message of \(bytes.count) bytes"
    }
}
