internal import CURing
import ConnectionCore
internal import Glibc
import POSIXSupport
import Synchronization

/// A TCP socket's bytes on their way into the ring: a send of up to ``limit`` bytes is copied here and returns; the
/// ring's thread submits what has gathered as one IORING_OP_SEND (MSG_WAITALL) before the loop next enters the
/// kernel, and while that send is in flight the next sends gather behind it. So a stream of small sends costs one
/// submission per batch instead of one per send, and a request followed by a receive goes to the kernel with the
/// receive in the same `io_uring_enter`.
///
/// What a caller is promised is what a send into the kernel's buffer promises: the bytes will go, in order, unless
/// the connection fails first; a failure that comes after a send returned is thrown by the next send, `closeOutput()`
/// or the drain in `close()`. At most ``limit`` bytes gather and at most one batch is in flight, so a peer that does
/// not read holds the sender back (``append(_:)`` waits) within 2 x ``limit`` of user-space memory; an idle socket
/// keeps no buffer.
///
/// Any thread may append (in order: the socket's write gate is held); the send and its completion run on the ring's
/// thread.
final class UringSendQueue: Sendable {
    /// What gathers before a send waits for the batch in flight to complete; a send of more than this goes straight to
    /// the ring from the caller's buffer once the queue is empty.
    static let limit = 64 * 1024

    private struct Buffer {
        var base: UnsafeMutableRawPointer
        var capacity: Int
        var count = 0
    }

    private struct State {
        /// Bytes gathered, not submitted yet.
        var gathering: Buffer?
        /// Bytes submitted, not yet all sent (the kernel reads them from here), and how many of them went so far.
        var flying: Buffer?
        var sent = 0
        /// A flush is queued on the ring's thread.
        var scheduled = false
        /// Why the queue failed: every later call throws it.
        var failure: ConnectionError?
        /// The failure when the kernel refused a batch (not a close or an abort).
        var refused: ConnectionError?
        /// Senders waiting for room, and callers waiting for everything to be sent.
        var roomWaiters: [UnsafeContinuation<Void, Never>] = []
        var drainWaiters: [UnsafeContinuation<Void, Never>] = []

        /// Nothing in flight, and nothing left to send (or it never will be: the queue failed).
        var drained: Bool { flying == nil && (failure != nil || (gathering?.count ?? 0) == 0) }
    }

    private let state = Guarded(State())
    private let loop: UringLoop
    /// Kept open while a batch is queued or in flight (the socket's deinit leaves closing it to its last owner).
    private let descriptor: SocketDescriptor

    init(loop: UringLoop, descriptor: SocketDescriptor) {
        self.loop = loop
        self.descriptor = descriptor
    }

    deinit {
        state.withLock { state in
            state.gathering.map { $0.base.deallocate() }
            state.flying.map { $0.base.deallocate() }
        }
    }

    enum Appended {
        case appended
        /// Not appended: room comes when the batch in flight completes (``waitForRoom(_:)``).
        case full
        case failed(ConnectionError)
    }

    /// Copies `bytes` (at most ``limit``) into the queue when there is room; the ring's thread sends it.
    func tryAppend(_ bytes: UnsafeRawBufferPointer) -> Appended {
        precondition(bytes.count <= Self.limit)
        // Read under the lock only, while the caller keeps it (as an address: a pointer is not Sendable).
        let address = UInt(bitPattern: bytes.baseAddress)
        let count = bytes.count
        let (appended, schedule) = state.withLock { state -> (Appended, Bool) in
            if let failure = state.failure { return (.failed(failure), false) }
            let gathered = state.gathering?.count ?? 0
            if gathered > 0 && gathered + count > Self.limit { return (.full, false) }
            Self.copy(
                UnsafeRawBufferPointer(start: UnsafeRawPointer(bitPattern: address), count: count),
                into: &state.gathering)
            let schedule = !state.scheduled && state.flying == nil
            if schedule { state.scheduled = true }
            return (.appended, schedule)
        }
        if schedule { loop.perform { [self] in flush() } }
        return appended
    }

    /// Inside the socket's write gate (off the ring's thread, or on it for a send that follows a receive): when
    /// nothing is queued or in flight, sends what the socket takes now (MSG_DONTWAIT) on the calling thread and
    /// returns how much; 0 when bytes are queued (these go behind them) or the socket is full. The rest goes
    /// through the queue, so the stream keeps its order. A failure fails the queue exactly as a batch's would, and
    /// counts as taken: the send returns as a queued one does, and the failure reaches the next send, the
    /// half-close, and (a reset this send took from the socket) the receive that finds only the end afterwards.
    func sendNow(_ bytes: UnsafeRawBufferPointer) -> Int {
        let address = UInt(bitPattern: bytes.baseAddress)
        let count = bytes.count
        return state.withLock { state -> Int in
            guard state.failure == nil, state.flying == nil, !state.scheduled, (state.gathering?.count ?? 0) == 0
            else { return 0 }
            do throws(ConnectionError) {
                let raw = UnsafeRawBufferPointer(start: UnsafeRawPointer(bitPattern: address), count: count)
                let result = try descriptor.ifOpen { (fd) throws(ConnectionError) in
                    try Syscall.send(fd, raw, dontWait: true)
                }
                guard case .processed(let sent) = result else { return 0 }
                return sent
            } catch {
                state.failure = error
                state.refused = error
                return count
            }
        }
    }

    /// Waits until `count` more bytes fit (the batch gathered went into flight), or the queue failed.
    func waitForRoom(_ count: Int) async {
        await withUnsafeContinuation { continuation in
            let now = state.withLock { state in
                let gathered = state.gathering?.count ?? 0
                guard state.failure == nil, gathered > 0, gathered + count > Self.limit else { return true }
                state.roomWaiters.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Waits until every byte appended has been sent, or the queue failed and its batch in flight (if any) has
    /// completed, then throws the failure, if any. After it, the kernel holds no buffer of the queue.
    func drain() async throws(ConnectionError) {
        await withUnsafeContinuation { continuation in
            let now = state.withLock { state in
                guard !state.drained else { return true }
                state.drainWaiters.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
        if let failure = state.withLock({ $0.failure }) { throw failure }
    }

    /// Bytes appended that the kernel has not taken yet (gathered, and the rest of the batch in flight).
    var buffered: Int {
        state.withLock { state in
            state.failure != nil ? 0 : (state.gathering?.count ?? 0) + ((state.flying?.count ?? 0) - state.sent)
        }
    }

    /// The error the kernel gave a batch, if one failed: a reset that this send took from the socket (the kernel
    /// reports it once) and that a receive, finding only the end of the stream afterwards, must report instead.
    var refusal: ConnectionError? { state.withLock { $0.refused } }

    /// `true` when every byte appended has been sent, or the queue failed.
    var isDrained: Bool { state.withLock { $0.drained } }

    /// Fails the queue (close, abort): what has not been submitted is dropped, senders waiting for room are resumed,
    /// appends throw `error`. A batch in flight stays the kernel's until its completion (the caller cancels it;
    /// ``drain()`` returns after that completion).
    func fail(_ error: ConnectionError) {
        let waiters = state.withLock { state in
            if state.failure == nil { state.failure = error }
            state.gathering.map { $0.base.deallocate() }
            state.gathering = nil
            return Self.takeWaiters(&state)
        }
        for waiter in waiters { waiter.resume() }
    }

    private static func copy(_ bytes: UnsafeRawBufferPointer, into buffer: inout Buffer?) {
        guard bytes.count > 0 else { return }
        if var gathering = buffer {
            if gathering.count + bytes.count > gathering.capacity {
                // Growing: more sends follow one another, so straight to the most a batch holds.
                let capacity = max(limit, gathering.count + bytes.count)
                let base = UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: 16)
                base.copyMemory(from: gathering.base, byteCount: gathering.count)
                gathering.base.deallocate()
                gathering.base = base
                gathering.capacity = capacity
            }
            (gathering.base + gathering.count).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count)
            gathering.count += bytes.count
            buffer = gathering
        } else {
            // A send after a pause is often the only one: its own size.
            let base = UnsafeMutableRawPointer.allocate(byteCount: bytes.count, alignment: 16)
            base.copyMemory(from: bytes.baseAddress!, byteCount: bytes.count)
            buffer = Buffer(base: base, capacity: bytes.count, count: bytes.count)
        }
    }

    private static func takeWaiters(_ state: inout State) -> [UnsafeContinuation<Void, Never>] {
        var waiters = state.roomWaiters
        state.roomWaiters = []
        if state.drained {
            waiters += state.drainWaiters
            state.drainWaiters = []
        }
        return waiters
    }

    /// Ring's thread: submits what has gathered when nothing is in flight; the senders waiting for room go on.
    private func flush() {
        let (batch, waiters) = state.withLock { state -> (Buffer?, [UnsafeContinuation<Void, Never>]) in
            state.scheduled = false
            guard state.failure == nil, state.flying == nil, let gathering = state.gathering, gathering.count > 0
            else { return (nil, []) }
            state.flying = gathering
            state.gathering = nil
            state.sent = 0
            return (gathering, Self.takeWaiters(&state))
        }
        if let batch { submit(batch, from: 0) }
        for waiter in waiters { waiter.resume() }
    }

    /// Ring's thread: the send of `batch` from byte `offset` on.
    private func submit(_ batch: Buffer, from offset: Int) {
        // The socket's close() waits for this send to complete (it drains the queue after cancelling what is in
        // flight) before the number is closed.
        let submitted = descriptor.ifOpen { fd in
            let operation = UringOperation.send(
                fd: fd.number, buffer: UInt(bitPattern: batch.base + offset), length: batch.count - offset,
                flags: Int32(MSG_NOSIGNAL | MSG_WAITALL))
            return loop.submit(operation, linked: false) { [self] result in sent(result) }
        }
        switch submitted {
        case nil: sent(-ECANCELED)
        case false: sent(-EBUSY)
        case true: return
        }
    }

    /// Ring's thread: a send completed. The rest of a short send goes again; a complete one makes way for what
    /// gathered meanwhile (its buffer is reused for the next batch); a failure fails the queue.
    private func sent(_ result: Int32) {
        enum Next {
            case resend(Buffer, Int)
            case done
        }
        let (next, waiters) = state.withLock { state -> (Next, [UnsafeContinuation<Void, Never>]) in
            guard var flying = state.flying else { return (.done, []) }
            if result > 0 && state.failure == nil {
                state.sent += Int(result)
                if state.sent < flying.count { return (.resend(flying, state.sent), []) }
            }
            if result <= 0 && state.failure == nil {
                state.failure =
                    result == -ECANCELED
                    ? .closed("the connection was closed before its queued bytes were sent")
                    : result == 0 ? .closed("the kernel sent nothing") : .errno(-result, "send")
                state.refused = state.failure
            }
            state.flying = nil
            if state.failure != nil {
                flying.base.deallocate()
                state.gathering.map { $0.base.deallocate() }
                state.gathering = nil
                return (.done, Self.takeWaiters(&state))
            }
            if let gathering = state.gathering, gathering.count > 0 {
                // What gathered meanwhile goes next; the buffer just sent gathers the sends after it.
                flying.count = 0
                state.flying = gathering
                state.gathering = flying
                state.sent = 0
                return (.resend(gathering, 0), Self.takeWaiters(&state))
            }
            // Idle: no buffer kept.
            flying.base.deallocate()
            state.gathering.map { $0.base.deallocate() }
            state.gathering = nil
            return (.done, Self.takeWaiters(&state))
        }
        if case .resend(let batch, let offset) = next { submit(batch, from: offset) }
        for waiter in waiters { waiter.resume() }
    }
}
