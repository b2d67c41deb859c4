internal import CURing
@_spi(Loop) internal import ConnectionCore
internal import Glibc
@_spi(Loop) internal import POSIXSupport
import Synchronization

/// A listener's clients, accepted by one multishot accept (Linux 5.19): the kernel completes it once per client
/// with no new entry, and the descriptors wait here until ``UringListener/accept()`` takes them.
///
/// Bounded: once ``limit`` descriptors wait untaken, the multishot is cancelled and further clients wait in the
/// kernel's backlog, as they do for a listener nobody accepts from; it is armed again when an accept finds nothing
/// waiting. An error the kernel ends it with (out of descriptors, say) goes to the next accept, which arms it again
/// after. Everything here runs on the ring's thread; ``next()`` may be called from any task.
final class UringAcceptor: Sendable {
    /// Descriptors accepted ahead of the application, at most.
    static let limit = 64
    /// What ``next()`` returns when the kernel refused the multishot: the caller accepts one at a time instead.
    static let unsupported = -EOPNOTSUPP

    private struct State {
        var ready: [Int32] = []
        /// The first of `ready` not taken yet (taken ones are dropped when the array is compacted).
        var head = 0
        /// An error the multishot ended with, for the next ``next()``.
        var failure: Int32 = 0
        var waiter: (continuation: UnsafeContinuation<Int32, Never>, wait: Wait)?
        /// The multishot's id while it is armed.
        var armed: UInt64?
        /// Cancelled because ``limit`` descriptors were waiting.
        var pausing = false
        var anyAccepted = false
        var refused = false
        var closed = false
        /// ``close()`` calls waiting for the multishot's last completion.
        var closing: [UnsafeContinuation<Void, Never>] = []

        var count: Int { ready.count - head }

        mutating func takeFirst() -> Int32? {
            guard head < ready.count else { return nil }
            let fd = ready[head]
            head += 1
            if head == ready.count {
                ready.removeAll(keepingCapacity: true)
                head = 0
            }
            return fd
        }
    }

    /// One call of ``next()``: cancelled before or after it reached the ring's thread.
    private final class Wait: Sendable {
        let cancelled = Atomic<Bool>(false)
    }

    private let loop: UringLoop
    private let descriptor: SocketDescriptor
    private let submissions: UringDescriptorGuard
    private let state: LoopConfined<State>

    init(loop: UringLoop, descriptor: SocketDescriptor, submissions: UringDescriptorGuard) {
        self.loop = loop
        self.descriptor = descriptor
        self.submissions = submissions
        state = LoopConfined(State(), on: loop.thread)
    }

    /// The next accepted descriptor, or `-errno`: `-ECANCELED` when the task was cancelled or the listener closed,
    /// ``unsupported`` when this kernel has no multishot accept.
    func next() async -> Int32 {
        let wait = Wait()
        return await withTaskCancellationHandler {
            await withUnsafeContinuation { continuation in
                loop.perform { [self] in take(continuation, wait) }
            }
        } onCancel: {
            wait.cancelled.store(true, ordering: .releasing)
            loop.perform { [self] in dropWaiter(wait) }
        }
    }

    /// Ends the multishot and closes every descriptor not taken; returns once the kernel has posted the multishot's
    /// last completion, so no client is accepted after it (any thread; once the listener is closing).
    func close() async {
        await withUnsafeContinuation { (closed: UnsafeContinuation<Void, Never>) in
            loop.perform { [self] in
                let armed = state.withValue { state -> UInt64? in
                    if state.armed != nil { state.closing.append(closed) }
                    return state.armed
                }
                shut()
                if let armed { loop.cancelMultishot(armed) } else { closed.resume() }
            }
        }
    }

    /// ``close()`` without waiting, for a listener that goes without being closed.
    func closeSoon() {
        loop.perform { [self] in
            if let armed = state.withValue({ $0.armed }) { loop.cancelMultishot(armed) }
            shut()
        }
    }

    /// Ring's thread: closed; the descriptors not taken closed, a waiting ``next()`` answered.
    private func shut() {
        let (waiting, untaken) = state.withValue { state in
            state.closed = true
            let untaken = Array(state.ready[state.head...])
            state.ready = []
            state.head = 0
            let waiting = state.waiter?.continuation
            state.waiter = nil
            return (waiting, untaken)
        }
        for fd in untaken { Syscall.close(fd) }
        waiting?.resume(returning: -ECANCELED)
    }

    // MARK: Ring's thread

    private func take(_ continuation: UnsafeContinuation<Int32, Never>, _ wait: Wait) {
        enum Next {
            case answer(Int32)
            case waitArmed
            case waitAndArm
        }
        let next = state.withValue { state -> Next in
            if state.closed || wait.cancelled.load(ordering: .acquiring) { return .answer(-ECANCELED) }
            if let fd = state.takeFirst() { return .answer(fd) }
            if state.failure != 0 {
                defer { state.failure = 0 }
                return .answer(state.failure)
            }
            if state.refused { return .answer(Self.unsupported) }
            state.waiter = (continuation, wait)
            return state.armed == nil ? .waitAndArm : .waitArmed
        }
        switch next {
        case .answer(let result): continuation.resume(returning: result)
        case .waitArmed: break
        case .waitAndArm: arm()
        }
    }

    private func dropWaiter(_ wait: Wait) {
        let waiting = state.withValue { state -> UnsafeContinuation<Int32, Never>? in
            guard let waiter = state.waiter, waiter.wait === wait else { return nil }
            state.waiter = nil
            return waiter.continuation
        }
        waiting?.resume(returning: -ECANCELED)
    }

    private func arm() {
        // The multishot names the number in the kernel until it is cancelled; the listener's close() cancels it
        // (closeSoon, close) before it closes the descriptor.
        let id =
            descriptor.ifOpen { fd in
                loop.acceptClients(on: fd, guardedBy: submissions) { [self] result, flags in
                    completed(result, more: csur_more(flags) != 0)
                }
            } ?? nil
        guard let id else {
            // The listener closed, or the ring had no room: the waiter hears it now rather than never.
            let waiting = state.withValue { state -> UnsafeContinuation<Int32, Never>? in
                defer { state.waiter = nil }
                return state.waiter?.continuation
            }
            waiting?.resume(returning: submissions.isClosed ? -ECANCELED : -EBUSY)
            return
        }
        state.withValue { $0.armed = id }
    }

    private func completed(_ result: Int32, more: Bool) {
        enum Then {
            case nothing
            case hand(UnsafeContinuation<Int32, Never>, Int32)
            case closeIt(Int32)
            case pause(UInt64)
            case rearm
            case closed([UnsafeContinuation<Void, Never>])
        }
        var then = state.withValue { state -> Then in
            guard result >= 0 else { return .nothing }
            state.anyAccepted = true
            if state.closed || submissions.isClosed { return .closeIt(result) }
            if let waiter = state.waiter {
                state.waiter = nil
                return .hand(waiter.continuation, result)
            }
            state.ready.append(result)
            if state.count >= Self.limit, more, !state.pausing, let armed = state.armed {
                state.pausing = true
                return .pause(armed)
            }
            return .nothing
        }
        switch then {
        case .hand(let continuation, let fd): continuation.resume(returning: fd)
        case .closeIt(let fd): Syscall.close(fd)
        case .pause(let id): loop.cancelMultishot(id)
        case .nothing, .rearm, .closed: break
        }
        guard !more else { return }
        // The multishot has ended: cancelled (closing, or paused at the limit), refused, or failed.
        then = state.withValue { state -> Then in
            state.armed = nil
            state.pausing = false
            if state.closed {
                defer { state.closing = [] }
                return .closed(state.closing)
            }
            if result < 0 && result != -ECANCELED {
                let failure = result == -EINVAL && !state.anyAccepted ? Self.unsupported : result
                if failure == Self.unsupported { state.refused = true }
                if let waiter = state.waiter {
                    state.waiter = nil
                    return .hand(waiter.continuation, failure)
                }
                state.failure = failure
                return .nothing
            }
            // Ended with nothing to report (paused, or the kernel stopped it): armed again only for a waiter.
            return state.waiter != nil && state.count == 0 ? .rearm : .nothing
        }
        switch then {
        case .hand(let continuation, let failure): continuation.resume(returning: failure)
        case .rearm: arm()
        case .closed(let waiting): for closed in waiting { closed.resume() }
        default: break
        }
    }
}
