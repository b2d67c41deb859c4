internal import CSocketShims
package import ConnectionCore
internal import Glibc
import Synchronization

/// Wakes one thread out of poll(2) without a descriptor of its own: the wake-up of bsd's reader threads, one per
/// connection, so that a connection holds one descriptor (its socket) and 10,000 of them fit a process limit of
/// 20,000 on either end.
///
/// The wake-up is a signal sent to that thread alone (`pthread_kill`, SIGRTMIN + 3, whose handler does nothing).
/// The waiting thread keeps it blocked except inside the poll itself (ppoll(2) with a mask that lets it through),
/// so a wake-up sent while the thread runs stays pending and ends its next wait at once, and no other call on
/// that thread is ever interrupted. A program that uses SIGRTMIN + 3 for something else must not use bsd.
///
/// The thread that waits is the one that called ``poll(_:events:)`` first; ``signal()`` before that does
/// nothing (its owner, ``LoopWorkQueue``, signals only a thread that said it is about to sleep). ``unbind()``
/// ends the signals; the caller makes sure none is in flight then (``LoopWorkQueue/close()`` waits for them), so
/// no signal reaches a thread that has exited.
package final class ThreadWake: Sendable {
    /// The waiting thread (`pthread_t`), 0 while there is none.
    private let thread = Atomic<UInt>(0)

    package init() {}

    /// Wakes the waiting thread, if there is one.
    package func signal() {
        let target = thread.load(ordering: .acquiring)
        if target != 0 { _ = csock_wake_thread(target) }
    }

    /// On the waiting thread, before the work queue is told it may sleep: makes the calling thread the one that
    /// ``signal()`` wakes (and blocks the signal there, once).
    package func bindToCurrentThread() {
        let me = UInt(csock_thread_self())
        guard thread.load(ordering: .relaxed) != me else { return }
        csock_wake_prepare_thread()
        thread.store(me, ordering: .releasing)
    }

    /// Signals go to no thread from now on.
    package func unbind() { thread.store(0, ordering: .releasing) }

    /// On the bound thread: waits until the descriptor has `events` or a ``signal()`` comes (or came since the
    /// last wait). Returns the revents, 0 when woken.
    package func poll(_ descriptor: borrowing BorrowedDescriptor, events: Int16) throws(ConnectionError) -> Int16 {
        try Self.wait(descriptor.number, events: events)
    }

    /// On the bound thread: waits until a ``signal()`` comes (or came since the last wait).
    package func waitForSignal() throws(ConnectionError) {
        _ = try Self.wait(-1, events: 0)
    }

    /// `csock_wake_poll`: ppoll(2) on `number` (< 0: none) with the wake-up signal let in only while it waits.
    private static func wait(_ number: Int32, events: Int16) throws(ConnectionError) -> Int16 {
        let result = csock_wake_poll(number, events)
        if result < 0 { throw .errno(Glibc.errno, "ppoll") }
        return Int16(truncatingIfNeeded: result)
    }
}
