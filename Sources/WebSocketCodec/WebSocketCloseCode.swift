/// A close status code (RFC 6455 §7.4).
public struct WebSocketCloseCode: RawRepresentable, Sendable, Hashable, CustomStringConvertible {
    public let rawValue: UInt16
    public init(rawValue: UInt16) { self.rawValue = rawValue }

    public static let normalClosure = WebSocketCloseCode(rawValue: 1000)
    public static let goingAway = WebSocketCloseCode(rawValue: 1001)
    public static let protocolError = WebSocketCloseCode(rawValue: 1002)
    public static let unsupportedData = WebSocketCloseCode(rawValue: 1003)
    /// Never sent: "no status code was present".
    public static let noStatusReceived = WebSocketCloseCode(rawValue: 1005)
    /// Never sent: "the connection closed without a close frame".
    public static let abnormalClosure = WebSocketCloseCode(rawValue: 1006)
    public static let invalidFramePayloadData = WebSocketCloseCode(rawValue: 1007)
    public static let policyViolation = WebSocketCloseCode(rawValue: 1008)
    public static let messageTooBig = WebSocketCloseCode(rawValue: 1009)
    public static let mandatoryExtension = WebSocketCloseCode(rawValue: 1010)
    public static let internalServerError = WebSocketCloseCode(rawValue: 1011)

    /// Whether the code may appear in a close frame on the wire: 1000-1003, 1007-1011 (1012-1014 are
    /// registered since and accepted), and 3000-4999. Never 1004, 1005, 1006, 1015, nor below 1000.
    public var isValidOnWire: Bool {
        switch rawValue {
        case 1000...1003, 1007...1014, 3000...4999: true
        default: false
        }
    }

    public var description: String {
        switch rawValue {
        case 1000: "1000 normal closure"
        case 1001: "1001 going away"
        case 1002: "1002 protocol error"
        case 1003: "1003 unsupported data"
        case 1005: "1005 no status received"
        case 1006: "1006 abnormal closure"
        case 1007: "1007 invalid frame payload data"
        case 1008: "1008 policy violation"
        case 1009: "1009 message too big"
        case 1010: "1010 mandatory extension"
        case 1011: "1011 internal server error"
        default: "\(rawValue)"
        }
    }
}

/// A violation of RFC 6455 by the peer: the connection must be failed with ``closeCode``.
public struct WebSocketProtocolError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The code to close with (1002, 1007 or 1009).
    public var closeCode: WebSocketCloseCode
    /// What was wrong.
    public var reason: String

    public init(_ closeCode: WebSocketCloseCode, _ reason: String) {
        self.closeCode = closeCode
        self.reason = reason
    }

    public var description: String { "\(closeCode): \(reason)" }
}
