import ConnectionCore
import POSIXSupport
import Synchronization

/// Readiness of one non-blocking socket, fed by the reactor (edge-triggered epoll) and awaited by tasks.
///
/// A task first tries the system call; only when it would block does it wait here. An edge that arrives while
/// nobody waits is remembered (`readReady`/`writeReady`), so a task that registers just after the edge does
/// not miss it. One reader and one writer wait at a time (the socket's gates ensure it).
final class SocketReadiness: EpollHandler, Sendable {
    private typealias Waiter = UnsafeContinuation<Result<Void, ConnectionError>, Never>

    private struct State {
        var readReady = true
        var writeReady = true
        /// An edge said the peer ended its side or the socket failed: from then on a read is tried at once.
        var hungUp = false
        var reader: (id: UInt64, continuation: Waiter)?
        var writer: (id: UInt64, continuation: Waiter)?
        var cancelled: Set<UInt64> = []
        var nextID: UInt64 = 0
        var closed: ConnectionError?
        /// A datagram server's reader: readable edges call it (on the reactor's thread) instead of resuming a task.
        var onReadable: (@Sendable () -> Void)?
    }

    private let state = Guarded(State())

    func epollReady(_ events: UInt32) {
        let readable = events & (Syscall.epollIn | Syscall.epollHangUp | Syscall.epollError | Syscall.epollReadHangUp)
        let writable = events & (Syscall.epollOut | Syscall.epollHangUp | Syscall.epollError)
        let (reader, writer, onReadable): (Waiter?, Waiter?, (@Sendable () -> Void)?) = state.withLock { state in
            var reader: Waiter?
            var writer: Waiter?
            var onReadable: (@Sendable () -> Void)?
            if events & (Syscall.epollHangUp | Syscall.epollError | Syscall.epollReadHangUp) != 0 {
                state.hungUp = true
            }
            if readable != 0 {
                if let handler = state.onReadable {
                    onReadable = handler
                } else if let waiting = state.reader {
                    reader = waiting.continuation
                    state.reader = nil
                } else {
                    state.readReady = true
                }
            }
            if writable != 0 {
                if let waiting = state.writer {
                    writer = waiting.continuation
                    state.writer = nil
                } else {
                    state.writeReady = true
                }
            }
            return (reader, writer, onReadable)
        }
        onReadable?()
        reader?.resume(returning: .success(()))
        writer?.resume(returning: .success(()))
    }

    /// From now on readable edges call `handler` on the reactor's thread (a datagram server reading there) until
    /// ``close(_:)``.
    func onReadable(_ handler: @escaping @Sendable () -> Void) {
        state.withLock { $0.onReadable = handler }
    }

    /// Waits until the socket may be readable again (or fails with `.closed` / `.cancelled`).
    @inline(__always)
    func waitReadable() async throws(ConnectionError) { try await wait(reading: true) }

    /// Waits until the socket may be writable again (or fails with `.closed` / `.cancelled`).
    @inline(__always)
    func waitWritable() async throws(ConnectionError) { try await wait(reading: false) }

    /// The wait. Its locking steps are functions that are not `async`, so that the frame a waiting task keeps
    /// (an idle connection's, for as long as it is idle) holds only the id and the result.
    private func wait(reading: Bool) async throws(ConnectionError) {
        guard let id = try ticket(reading: reading) else { return }
        let result = await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: Waiter) in park(continuation, id: id, reading: reading) }
        } onCancel: {
            cancel(id, reading: reading)
        }
        finished(id)
        try result.get()
    }

    /// `nil` when an edge already came (taken now); otherwise the id of the wait to park.
    @inline(never)
    private func ticket(reading: Bool) throws(ConnectionError) -> UInt64? {
        try state.withLock { (state) throws(ConnectionError) -> UInt64? in
            if let closed = state.closed { throw closed }
            if reading, state.readReady {
                state.readReady = false
                return nil
            }
            if !reading, state.writeReady {
                state.writeReady = false
                return nil
            }
            state.nextID &+= 1
            return state.nextID
        }
    }

    /// Parks `continuation` as the reader or writer, or resumes it at once when the wait is already over.
    @inline(never)
    private func park(_ continuation: Waiter, id: UInt64, reading: Bool) {
        let immediate: Result<Void, ConnectionError>? = state.withLock { state in
            if state.cancelled.remove(id) != nil { return .failure(.cancelled()) }
            if let closed = state.closed { return .failure(closed) }
            if reading {
                if state.readReady {
                    state.readReady = false
                    return .success(())
                }
                state.reader = (id, continuation)
            } else {
                if state.writeReady {
                    state.writeReady = false
                    return .success(())
                }
                state.writer = (id, continuation)
            }
            return nil
        }
        if let immediate { continuation.resume(returning: immediate) }
    }

    /// The waiting task was cancelled: resumes it with `.cancelled`, or marks the id for `park` to refuse.
    @inline(never)
    private func cancel(_ id: UInt64, reading: Bool) {
        let waiter: Waiter? = state.withLock { state in
            if reading, let waiting = state.reader, waiting.id == id {
                state.reader = nil
                return waiting.continuation
            }
            if !reading, let waiting = state.writer, waiting.id == id {
                state.writer = nil
                return waiting.continuation
            }
            state.cancelled.insert(id)
            return nil
        }
        waiter?.resume(returning: .failure(.cancelled()))
    }

    /// A wait that ended: forgets the mark a cancellation that came too late to resume it left.
    @inline(never)
    private func finished(_ id: UInt64) {
        state.withLock { state in
            if !state.cancelled.isEmpty { state.cancelled.remove(id) }
        }
    }

    /// Fails the waiting tasks (and every later wait) with `error`.
    func close(_ error: ConnectionError = .closed()) {
        let waiters: [Waiter] = state.withLock { state in
            state.closed = error
            state.onReadable = nil  // it holds the socket
            let waiters = [state.reader?.continuation, state.writer?.continuation].compactMap { $0 }
            state.reader = nil
            state.writer = nil
            return waiters
        }
        for waiter in waiters { waiter.resume(returning: .failure(error)) }
    }
}
