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
    }

    private let state = Guarded(State())

    func epollReady(_ events: UInt32) {
        let readable = events & (Syscall.epollIn | Syscall.epollHangUp | Syscall.epollError | Syscall.epollReadHangUp)
        let writable = events & (Syscall.epollOut | Syscall.epollHangUp | Syscall.epollError)
        let (reader, writer): (Waiter?, Waiter?) = state.withLock { state in
            var reader: Waiter?
            var writer: Waiter?
            if events & (Syscall.epollHangUp | Syscall.epollError | Syscall.epollReadHangUp) != 0 {
                state.hungUp = true
            }
            if readable != 0 {
                if let waiting = state.reader {
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
            return (reader, writer)
        }
        reader?.resume(returning: .success(()))
        writer?.resume(returning: .success(()))
    }

    /// Waits until the socket may be readable again (or fails with `.closed` / `.cancelled`).
    @inline(__always)
    func waitReadable() async throws(ConnectionError) { try await wait(reading: true) }

    /// Before a read that follows one that drained the socket (a short read): waits for the next edge, unless one
    /// came since (remembered) or the socket has hung up or failed. A drained socket has nothing to read until
    /// something new arrives, and each arrival is an edge, so this saves the read that would only find EAGAIN.
    /// After a full read more may be waiting with no edge to come: read first.
    func waitReadableAfterDrain() async throws(ConnectionError) {
        if state.withLock({ $0.hungUp }) { return }
        try await wait(reading: true)
    }

    /// Waits until the socket may be writable again (or fails with `.closed` / `.cancelled`).
    @inline(__always)
    func waitWritable() async throws(ConnectionError) { try await wait(reading: false) }

    private func wait(reading: Bool) async throws(ConnectionError) {
        let id: UInt64? = try state.withLock { (state) throws(ConnectionError) -> UInt64? in
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
        guard let id else { return }
        let result = await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: Waiter) in
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
        } onCancel: {
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
        state.withLock { state in
            if !state.cancelled.isEmpty { state.cancelled.remove(id) }
        }
        try result.get()
    }

    /// Fails the waiting tasks (and every later wait) with `error`.
    func close(_ error: ConnectionError = .closed()) {
        let waiters: [Waiter] = state.withLock { state in
            state.closed = error
            let waiters = [state.reader?.continuation, state.writer?.continuation].compactMap { $0 }
            state.reader = nil
            state.writer = nil
            return waiters
        }
        for waiter in waiters { waiter.resume(returning: .failure(error)) }
    }
}
