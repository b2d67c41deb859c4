import ConnectionCore
import Synchronization

/// One direction's queue of a ``Relay``: messages with the time each may leave (delay plus jitter), dropped or
/// duplicated as the plan says, in order unless the plan lets them reorder; bounded, so the receiving side waits
/// when it is full.
final class FaultLine: Sendable {
    enum Item: Sendable {
        case message(Message)
        case end
    }

    enum Admission { case queued, dropped, duplicated, held }

    private struct Entry {
        var due: ContinuousClock.Instant
        var order: UInt64
        var item: Item
    }

    private struct State {
        var entries: [Entry] = []
        var order: UInt64 = 0
        var bytes = 0
        var lastDue: ContinuousClock.Instant?
        var ended = false
        var abandoned = false
        var random: SplitMix64
        var reader: CheckedContinuation<Void, Never>?
        var writer: CheckedContinuation<Void, Never>?
    }

    private let plan: FaultPlan
    private let capacity: Int
    private let state: Guarded<State>

    init(plan: FaultPlan, seed: UInt64, capacity: Int) {
        self.plan = plan
        self.capacity = capacity
        state = Guarded(State(random: SplitMix64(seed: seed)))
    }

    /// Queues a received message (or not: loss), at its due time. A chunk of a byte stream (`byteStream`) that
    /// carries the held byte is split there: the bytes before it go on time, the rest is held.
    func admit(_ message: Message, byteStream: Bool = false) -> Admission {
        let (admission, reader) = state.withLock { state -> (Admission, CheckedContinuation<Void, Never>?) in
            let first = state.bytes
            state.bytes += message.bytes.count
            if plan.loss > 0, state.random.unit() < plan.loss { return (.dropped, nil) }
            let copies = plan.duplication > 0 && state.random.unit() < plan.duplication ? 2 : 1
            var extra = Duration.zero
            if let hold = plan.hold, (first..<state.bytes).contains(hold.byte) {
                extra = hold.duration
                if byteStream && hold.byte > first {
                    let split = hold.byte - first
                    enqueue(.message(Message(kind: message.kind, bytes: Array(message.bytes[..<split]))), &state)
                    enqueue(
                        .message(Message(kind: message.kind, bytes: Array(message.bytes[split...]))), &state,
                        extra: extra)
                    defer { state.reader = nil }
                    return (.held, state.reader)
                }
            }
            for _ in 0..<copies { enqueue(.message(message), &state, extra: extra) }
            defer { state.reader = nil }
            return (extra > .zero ? .held : copies == 2 ? .duplicated : .queued, state.reader)
        }
        reader?.resume()
        return admission
    }

    private func enqueue(_ item: Item, _ state: inout State, extra: Duration = .zero) {
        var due = ContinuousClock.now + plan.delay + extra
        if plan.jitter > .zero {
            due += .nanoseconds(Int64(state.random.unit() * Double(plan.jitter.wholeNanoseconds)))
        }
        if !plan.reorder, let last = state.lastDue, due < last { due = last }
        state.lastDue = due
        state.order += 1
        state.entries.append(Entry(due: due, order: state.order, item: item))
    }

    /// The source ended: after everything queued, ``next()`` returns `.end`.
    func finish() async {
        let reader = state.withLock { state -> CheckedContinuation<Void, Never>? in
            enqueue(.end, &state)
            state.ended = true
            defer { state.reader = nil }
            return state.reader
        }
        reader?.resume()
    }

    /// The sending side stopped (the sink failed, was cut or the end was carried): nothing will be taken any more,
    /// so a receiving side waiting for room goes on (and finds its source closed).
    func abandon() {
        let writer = state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.abandoned = true
            defer { state.writer = nil }
            return state.writer
        }
        writer?.resume()
    }

    /// Waits while the queue is full (not once the sending side has stopped).
    func waitForSpace() async {
        await withCheckedContinuation { continuation in
            let now = state.withLock { state -> Bool in
                if state.entries.count < capacity || state.abandoned { return true }
                state.writer = continuation
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Waits `duration`, or less when ``admit(_:)`` or ``finish()`` queues something meanwhile (with reordering, a
    /// new item can be due before the one waited for; a plain sleep held it back until then). A wake-up for an
    /// item that is not due yet only makes ``next()`` look again.
    private func sleep(for duration: Duration) async {
        let deadline = ContinuousClock.now + duration
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let parked = state.withLock { state -> Bool in
                // Something may have come between the look and here.
                if state.entries.contains(where: { $0.due < deadline }) { return false }
                state.reader = continuation
                return true
            }
            guard parked else { return continuation.resume() }
            Task { [self] in
                try? await Task.sleep(until: deadline)
                state.withLock { state -> CheckedContinuation<Void, Never>? in
                    defer { state.reader = nil }
                    return state.reader
                }?.resume()
            }
        }
    }

    /// The next item once due (the earliest due first), or `nil` after the end.
    func next() async -> Item? {
        while true {
            let (ready, wait, writer) = state.withLock {
                state -> (Item?, Duration?, CheckedContinuation<Void, Never>?) in
                guard
                    let index = state.entries.indices.min(by: {
                        (state.entries[$0].due, state.entries[$0].order) < (
                            state.entries[$1].due, state.entries[$1].order
                        )
                    })
                else { return (nil, nil, nil) }
                let entry = state.entries[index]
                let now = ContinuousClock.now
                if entry.due > now { return (nil, entry.due - now, nil) }
                state.entries.remove(at: index)
                defer { state.writer = nil }
                return (entry.item, nil, state.writer)
            }
            writer?.resume()
            if let ready { return ready }
            if let wait {
                await sleep(for: wait)
                continue
            }
            // Empty: wait for an item.
            await withCheckedContinuation { continuation in
                let now = state.withLock { state -> Bool in
                    if !state.entries.isEmpty { return true }
                    state.reader = continuation
                    return false
                }
                if now { continuation.resume() }
            }
        }
    }
}
