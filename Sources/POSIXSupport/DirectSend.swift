import ConnectionCore
internal import Glibc
import Synchronization

/// Sends on a loop-owned socket from a thread other than the loop's: the system call is made on the calling
/// thread when the socket has room, with no hand-over to the loop (which costs an eventfd write, a wake-up and a
/// turn of the loop's thread before the bytes leave). Written once for the loop backends whose connections
/// declare ``Connection/sendsFromAnyThread`` with it (uv, runloop).
///
/// The descriptor belongs to the loop, which closes it: ``close()``, called on the loop thread before the
/// descriptor is closed, waits for a send in progress and refuses later ones, so a send never reaches a reused
/// descriptor. A datagram is whole or not sent at all, so a send from here and one from the loop need no order
/// between them beyond what each task's own awaits give it (a task sends its next datagram after its previous
/// one has left, whichever way that went).
///
/// Noncopyable, stored in the handle it sends for: a class of its own would be one more allocation per connection.
package struct DirectSend: ~Copyable, Sendable {
    // Internal, not private: see AsyncGate's State.
    struct State {
        /// The socket, -1 until ``open(_:)`` and from ``close()`` on.
        var fd: Int32 = -1
        /// Datagrams the loop holds for room in the socket buffer: later ones wait behind them.
        var held = 0
    }

    private let state = Guarded(State())

    package init() {}

    /// The socket is connected and may be sent on from any thread.
    package func open(_ fd: Int32) {
        state.withLock { $0.fd = fd }
    }

    /// Before the loop closes the socket: returns once no send from another thread is in progress, and none
    /// starts after.
    package func close() {
        state.withLock { $0.fd = -1 }
    }

    /// The loop queued datagrams for room in the socket buffer (`count` > 0), or sent queued ones (`count` < 0).
    /// While it holds any, sends from here go to the loop too, so that they leave after them, in order.
    package func loopHolds(_ count: Int) {
        state.withLock { $0.held += count }
    }

    /// What a send from another thread did.
    package enum Outcome: Equatable, Sendable {
        /// send(2) took this many bytes: a datagram whole; of a stream's bytes, maybe only the first ones (the
        /// caller hands the rest to the loop, ahead of any later send: a stream's connection lets one send at a
        /// time through, its rest included).
        case sent(Int)
        /// Not sent: the socket is closed, its send buffer is full, or the loop holds datagrams sent before it;
        /// the caller hands it to the loop.
        case handOver
        /// send(2) failed with this errno (a refused peer after an ICMP port-unreachable, an oversized datagram, a
        /// reset); the backend reports it as its loop's send would.
        case failed(errno: Int32)
    }

    /// One send(2) of `bytes` now (MSG_DONTWAIT), when the socket is open and nothing the loop holds is ahead.
    package func send(_ bytes: UnsafeRawBufferPointer) -> Outcome {
        state.withLock { state in
            let fd = state.fd
            guard fd >= 0, state.held == 0 else { return .handOver }
            while true {
                let sent = Glibc.send(fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
                if sent >= 0 { return .sent(sent) }
                switch Glibc.errno {
                case EINTR: continue
                case EAGAIN, EWOULDBLOCK: return .handOver
                case let code: return .failed(errno: code)
                }
            }
        }
    }
}
