import Synchronization

/// Whether a receive was called on a stream connection since its last send: if so, the next send answers it (a
/// reply) or asks what the awaited reply answers, and is written at once instead of gathered. Without it, a task on
/// the loop's thread that finds its reply already there sends again in the same loop turn, and the send would wait
/// for the turn's end (``SendGathering``) or for the ring's next submission (uring's send queue): a round trip would
/// take more system calls, or wait longer, than one written at once.
///
/// One relaxed store a receive, one relaxed load a send (and an exchange when it was set). A noncopyable struct
/// stored in the connection.
@_spi(Loop) public struct ReceiveMark: ~Copyable, Sendable {
    private let received = Atomic<Bool>(false)

    public init() {}

    /// A receive was called.
    @inline(__always) public func note() {
        received.store(true, ordering: .relaxed)
    }

    /// Whether a receive was called since the last `take()`; clears it.
    @inline(__always) public func take() -> Bool {
        received.load(ordering: .relaxed) && received.exchange(false, ordering: .relaxed)
    }
}
