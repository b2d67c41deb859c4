/// The one error vocabulary of every backend: "connection refused" reads the same from blocking sockets, libuv,
/// the run loop, async/await and SwiftNIO.
///
/// ``kind`` is what a program switches on; ``systemCode`` keeps the raw code the backend saw (an errno, a uv
/// status, an OpenSSL or getaddrinfo code) with its symbolic name, for diagnostics; ``detail`` says what was
/// being done.
public struct ConnectionError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The kind of failure. A struct over a private enum, so that kinds can be added without breaking users.
    public struct Kind: Sendable, Hashable, CustomStringConvertible {
        private enum Base: String, Sendable, Hashable {
            case refused = "connection refused"
            case timedOut = "timed out"
            case reset = "connection reset by peer"
            case closed = "connection closed"
            case hostNotFound = "host not found"
            case addressInUse = "address already in use"
            case addressNotAvailable = "address not available"
            case messageTooLarge = "message too large"
            case invalidEndpoint = "invalid endpoint"
            case protocolViolation = "protocol violation"
            case unreachable = "network unreachable"
            case cancelled = "cancelled"
            case unsupported = "not supported"
            case permissionDenied = "permission denied"
            case resourceExhausted = "resource exhausted"
            case tls = "TLS failure"
            case certificateRejected = "certificate rejected"
            case system = "system error"
        }
        private let base: Base
        private init(_ base: Base) { self.base = base }

        /// Nobody listens at the address (ECONNREFUSED; for UDP, an ICMP port-unreachable came back).
        public static let refused = Kind(.refused)
        /// A connect (or another bounded wait) ran out of time.
        public static let timedOut = Kind(.timedOut)
        /// The peer reset the connection, or the pipe is broken (ECONNRESET, EPIPE).
        public static let reset = Kind(.reset)
        /// The connection (or listener) was closed locally, or its end was already reported.
        public static let closed = Kind(.closed)
        /// The host name does not resolve.
        public static let hostNotFound = Kind(.hostNotFound)
        /// Another socket already holds the address (EADDRINUSE).
        public static let addressInUse = Kind(.addressInUse)
        /// The local address cannot be assigned (EADDRNOTAVAIL).
        public static let addressNotAvailable = Kind(.addressNotAvailable)
        /// A datagram or message exceeds what the transport can carry (EMSGSIZE, WebSocket 1009).
        public static let messageTooLarge = Kind(.messageTooLarge)
        /// The URL or address cannot be used.
        public static let invalidEndpoint = Kind(.invalidEndpoint)
        /// The peer broke the protocol (a malformed WebSocket frame or handshake, for example).
        public static let protocolViolation = Kind(.protocolViolation)
        /// No route to the host or network (ENETUNREACH, EHOSTUNREACH).
        public static let unreachable = Kind(.unreachable)
        /// The waiting task was cancelled.
        public static let cancelled = Kind(.cancelled)
        /// The operation does not apply to this transport or backend.
        public static let unsupported = Kind(.unsupported)
        /// The system refused for lack of privilege (EACCES, EPERM).
        public static let permissionDenied = Kind(.permissionDenied)
        /// Out of descriptors, memory or buffers (EMFILE, ENFILE, ENOBUFS, ENOMEM).
        public static let resourceExhausted = Kind(.resourceExhausted)
        /// A TLS failure: a failed handshake (a peer that does not speak TLS, no common version or cipher, an
        /// alert from the peer), or a TCP end without the peer's close_notify (possible truncation).
        public static let tls = Kind(.tls)
        /// The peer's certificate failed verification: untrusted, expired, or not for this host. The system code
        /// (domain `x509`) names the check that failed, e.g. `X509_V_ERR_HOSTNAME_MISMATCH`.
        public static let certificateRejected = Kind(.certificateRejected)
        /// Any other system error; see ``ConnectionError/systemCode``.
        public static let system = Kind(.system)

        /// A short English phrase, e.g. "connection refused".
        public var description: String { base.rawValue }
    }

    /// The raw code a backend saw, kept for diagnostics.
    public struct SystemCode: Sendable, Hashable, CustomStringConvertible {
        /// Where the code comes from: `errno`, `uv`, `gai` (getaddrinfo), `ssl`, `websocket`, `nio`.
        public var domain: String
        /// The numeric value in that domain.
        public var code: Int32
        /// The symbolic name, e.g. `ECONNREFUSED` or `UV_ECONNREFUSED`.
        public var name: String

        /// Creates a system code.
        public init(domain: String, code: Int32, name: String) {
            self.domain = domain
            self.code = code
            self.name = name
        }

        public var description: String { "\(name) (\(domain) \(code))" }
    }

    /// What kind of failure this is.
    public var kind: Kind
    /// What was being done, and anything else that helps (an address, a limit).
    public var detail: String {
        get { details.detail }
        set { details = Details(detail: newValue, systemCode: details.systemCode) }
    }
    /// The raw code the backend saw, if any.
    public var systemCode: SystemCode? {
        get { details.systemCode }
        set { details = Details(detail: details.detail, systemCode: newValue) }
    }

    /// The detail and the code, behind one reference: the error is 16 bytes instead of 64. Every `try` of a
    /// function that throws it keeps room for one in the caller's frame, and an async caller's frame is memory
    /// its task keeps (an idle connection's task, for as long as it lives): docs/benchmarks.md.
    private var details: Details

    private final class Details: Sendable {
        let detail: String
        let systemCode: SystemCode?
        init(detail: String, systemCode: SystemCode?) {
            self.detail = detail
            self.systemCode = systemCode
        }
    }

    /// Creates an error.
    public init(_ kind: Kind, _ detail: String = "", systemCode: SystemCode? = nil) {
        self.kind = kind
        self.details = Details(detail: detail, systemCode: systemCode)
    }

    public static func == (lhs: ConnectionError, rhs: ConnectionError) -> Bool {
        lhs.kind == rhs.kind && lhs.detail == rhs.detail && lhs.systemCode == rhs.systemCode
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(kind)
        hasher.combine(detail)
        hasher.combine(systemCode)
    }

    /// One line: kind, detail and raw code, e.g. `connection refused: connect to tcp://127.0.0.1:9 [ECONNREFUSED (errno 111)]`.
    public var description: String {
        var text = kind.description
        if !detail.isEmpty { text += ": " + detail }
        if let systemCode { text += " [\(systemCode)]" }
        return text
    }

    /// `.closed`: the connection was closed locally.
    public static func closed(_ detail: String = "the connection is closed") -> ConnectionError {
        ConnectionError(.closed, detail)
    }

    /// `.cancelled`: the waiting task was cancelled.
    public static func cancelled(_ detail: String = "the waiting task was cancelled") -> ConnectionError {
        ConnectionError(.cancelled, detail)
    }

    /// Maps any error to a ``ConnectionError``: itself when it already is one, `.cancelled` for Swift's
    /// `CancellationError`, `.system` otherwise.
    public static func from(_ error: any Error) -> ConnectionError {
        if let error = error as? ConnectionError { return error }
        if error is CancellationError { return .cancelled() }
        return ConnectionError(.system, "\(error)")
    }
}
