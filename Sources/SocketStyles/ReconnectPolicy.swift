import ConnectionCore
import Synchronization

/// Connection states as Network.framework's `NWConnection` reports them.
public enum ConnectionState: Sendable, Hashable {
    /// Created, not started.
    case setup
    /// Connecting (resolving, TCP, TLS and WebSocket handshakes).
    case preparing
    /// Connected: data flows.
    case ready
    /// Not connected, trying again after a pause: the error that ended the last attempt or connection.
    case waiting(ConnectionError)
    /// The peer ended the connection cleanly: for WebSocket, the code and reason of its close frame (`nil` code:
    /// none came, or another transport's end of stream). With reconnection, `waiting` follows; with
    /// ``ReconnectPolicy/never`` it is the last state but `cancelled`.
    case closed(code: WebSocketCloseCode?, reason: String)
    /// Gave up (``ReconnectPolicy/maximumAttempts`` reached, or the connection failed under
    /// ``ReconnectPolicy/never``): the last error.
    case failed(ConnectionError)
    /// Closed by the user.
    case cancelled
}

/// How a ``ReconnectingConnection`` tries again.
public struct ReconnectPolicy: Sendable, Hashable {
    /// The pause before the first retry; each later pause is `multiplier` times the previous, up to
    /// `maximumDelay`, and each is shortened by up to `jitter` of itself at random, so that many clients cut off
    /// together do not come back together.
    public var initialDelay: Duration = .milliseconds(100)
    public var maximumDelay: Duration = .seconds(10)
    public var multiplier: Double = 2
    /// 0 to 1.
    public var jitter: Double = 0.3
    /// Attempts in a row before giving up with `.failed` (`nil`: never give up).
    public var maximumAttempts: Int? = nil
    /// What `send` does while disconnected.
    public var whileDisconnected: WhileDisconnected = .queue(maximumMessages: 64)
    /// Whether a connection that was lost is replaced (`false`: ``never``).
    public var reconnects = true

    /// NWConnection's model: one attempt, one connection, its states (`setup`, `preparing`, `ready`, then
    /// `closed`, `failed` or `cancelled`), no retry; sends before `ready` are queued.
    public static let never = ReconnectPolicy.with {
        $0.reconnects = false
        $0.maximumAttempts = 1
    }

    public enum WhileDisconnected: Sendable, Hashable {
        /// Keep up to this many messages and send them, in order, once connected again; beyond it, `send` throws
        /// `.resourceExhausted`.
        case queue(maximumMessages: Int)
        /// `send` throws `.closed` at once.
        case refuse
    }

    public init() {}

    /// The defaults, changed by `configure`.
    public static func with(_ configure: (inout ReconnectPolicy) -> Void) -> ReconnectPolicy {
        var policy = ReconnectPolicy()
        configure(&policy)
        return policy
    }

    /// The pause before retry number `attempt` (1-based), jitter applied.
    func delay(before attempt: Int) -> Duration {
        let base = min(
            Double(initialDelay.wholeNanoseconds) * pow(multiplier, Double(max(0, attempt - 1))),
            Double(maximumDelay.wholeNanoseconds))
        let shortened = base * (1 - Double.random(in: 0...max(0, min(1, jitter))))
        return .nanoseconds(Int64(shortened))
    }

    private func pow(_ base: Double, _ exponent: Double) -> Double {
        var result = 1.0
        for _ in 0..<Int(min(exponent, 64)) { result *= base }
        return result
    }
}
