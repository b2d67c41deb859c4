/// Whether a reader that is about to wait for readiness should first try one non-blocking read.
///
/// A server that has just answered a request, or a client that has just sent one, usually waits next; but when
/// the peer shares the CPU and ran as soon as the answer woke it, its next message is already in the socket by
/// then, and the wait (poll or epoll_wait, and for a task a suspension and a resumption) only reports what a read
/// would have taken at once. A blocking recv(2), as the C floor's client uses, never pays that. Measured here
/// (docs/benchmarks.md, session 40): a bsd UDP echo server against a C ping-pong client answered in 12.8 us
/// instead of 13.8 when it read before waiting.
///
/// A read that finds nothing (EAGAIN) costs a system call before the wait, and in an open-loop run, where the
/// next message comes long after the answer, every such read misses. So the reader keeps a score of its reads
/// made first, as a two-way branch predictor does: one up for a hit, one down for a miss, between 0 and
/// ``ceiling``. It reads first after each read that found data while the score is above zero; at zero it waits
/// first, and tries again every ``probeEvery``-th wait. A request-response exchange where most reads made first
/// hit keeps reading first; a paced or idle peer costs one missed read per ``probeEvery`` messages.
///
/// Any reader may use it: reading before a level-triggered wait is always correct; an edge-triggered reader that
/// reads first keeps its edge, which reports at most a readiness already consumed (a read that finds nothing).
public struct ReadBeforeWait: Sendable {
    /// Hits minus misses of the reads made first, between 0 and ``ceiling``.
    private var score = 1
    /// Waits made (and found data) since the score fell to zero.
    private var waits = 0
    /// Whether the last read found data.
    private var found = false

    /// The highest score: how many misses in a row turn reading first off.
    public static let ceiling = 4
    /// At a score of zero, every this many waits a read is made first again.
    public static let probeEvery = 8

    public init() {}

    /// Whether to read before the wait about to be made.
    public var readsFirst: Bool { found && (score > 0 || waits >= Self.probeEvery) }

    /// A read found data: `afterWait` when a wait came before it, otherwise it was made first (a hit).
    public mutating func found(afterWait: Bool) {
        if afterWait {
            if score == 0 { waits += 1 }
        } else {
            score = min(Self.ceiling, score + 1)
            waits = 0
        }
        found = true
    }

    /// A read made first found nothing.
    public mutating func missed() {
        score = max(0, score - 1)
        waits = 0
        found = false
    }
}
