import ConnectionCore
import Synchronization

/// Faults a ``Relay`` injects in one direction, in user space (no root, no netem): every figure is applied to
/// what the relay forwards, drawn from a seeded generator so that a run can be repeated.
public struct FaultPlan: Sendable, Hashable {
    /// Added to every message's (or chunk's) trip.
    public var delay: Duration = .zero
    /// A random extra delay from 0 to this, per message.
    public var jitter: Duration = .zero
    /// With jitter: let a message overtake an earlier one (udp, ws). A byte stream (tcp, tls) never reorders.
    public var reorder = false
    /// Probability (0-1) that a message is dropped: udp datagrams and ws messages. A byte stream cannot lose
    /// bytes without breaking, so for tcp and tls it must stay 0 (use ``blackHoleAfterBytes`` for a stall).
    public var loss = 0.0
    /// Probability (0-1) that a udp datagram is sent twice.
    public var duplication = 0.0
    /// Bytes per second at most (`nil`: no cap).
    public var bandwidth: Int? = nil
    /// After this many bytes, reset both the client's connection and the upstream one (a TCP RST each way, see
    /// `Connection.abort()`; `nil`: never).
    public var cutAfterBytes: Int? = nil
    /// After this many bytes, stop forwarding but keep both connections open: the peer sees silence, as behind
    /// a dead router (`nil`: never). What keep-alive is for.
    public var blackHoleAfterBytes: Int? = nil
    /// One message or chunk held back longer than the rest (`nil`: none): what one late or retransmitted
    /// segment does to what follows it. Unless ``reorder`` is on, everything behind it waits too.
    public var hold: Hold? = nil

    /// The message that carries byte ``byte`` (counted from 0 in this direction, over every message's bytes)
    /// waits ``duration`` more; on a byte stream, that byte and the rest of its chunk (the bytes before it go on
    /// time), as one late segment would.
    public struct Hold: Sendable, Hashable {
        public var byte: Int
        public var duration: Duration

        public init(byte: Int, duration: Duration) {
            self.byte = byte
            self.duration = duration
        }
    }

    public init() {}

    /// The defaults, changed by `configure`.
    public static func with(_ configure: (inout FaultPlan) -> Void) -> FaultPlan {
        var plan = FaultPlan()
        configure(&plan)
        return plan
    }

    /// Whether nothing is injected.
    public var isNone: Bool { self == FaultPlan() }

    /// Faults that `transport` cannot carry, as an error.
    func check(for transport: Transport) throws(ConnectionError) {
        guard (0...1).contains(loss), (0...1).contains(duplication) else {
            throw ConnectionError(.unsupported, "loss and duplication are probabilities from 0 to 1")
        }
        if transport.isByteStream && loss > 0 {
            throw ConnectionError(
                .unsupported,
                "a \(transport) byte stream cannot lose bytes without breaking; use a black hole (a stall) instead")
        }
        if transport != .udp && duplication > 0 {
            throw ConnectionError(.unsupported, "duplication applies to udp datagrams only")
        }
        if transport.isByteStream && reorder {
            throw ConnectionError(.unsupported, "a \(transport) byte stream never reorders")
        }
    }
}
