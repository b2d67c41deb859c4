import ConnectionCore
import POSIXSupport
import SocketStyles
import Synchronization

/// One thing a lesson saw happen, at a time: a send or a receive at one end, or a mark (a connection opened or
/// closed, a fault the relay applied, the kernel's view sampled). A send is drawn as an arrow from its end to
/// the other, ending where the receive that delivered its last byte happened, or in a cross when nothing did.
public struct LessonEvent: Codable, Sendable, Hashable {
    public enum Kind: String, Codable, Sendable {
        /// Bytes, a datagram or a message handed to the connection.
        case send
        /// What one receive returned.
        case receive
        /// Something else that happened at that time (``text`` says what).
        case mark
        /// The kernel's view of this end's TCP connection then (TCP_INFO through sock_diag), in ``text``.
        case kernel
    }

    /// Which end: the connecting side, the accepting side, or what lies between (the relay).
    public enum Side: String, Codable, Sendable {
        case client, server, between
    }

    /// The diagram (``LessonPhase``) it belongs to: an index into ``LessonReport/phases``.
    public var phase: Int
    /// Microseconds since the lesson began.
    public var at: Double
    public var side: Side
    public var kind: Kind
    /// Bytes sent or received (0 for a mark).
    public var bytes: Int = 0
    /// A send's number in its direction (from 0); a receive's: the last send it completed, if any.
    public var number: Int? = nil
    /// A send: when the receive that delivered its last byte happened (microseconds since the lesson began);
    /// `nil` when none did (lost, or still unread when the lesson ended).
    public var arrived: Double? = nil
    /// A mark's text; a send's or a receive's note (a fault on its way, say).
    public var text: String? = nil
}

/// One time-sequence diagram: two ends over time (a transport, a setting).
public struct LessonPhase: Codable, Sendable, Hashable {
    public var title: String
    public var transport: String
    /// Sends and receives this diagram did not record: past the cap, so that a flood stays a picture.
    public var notDrawn: Int = 0
}
