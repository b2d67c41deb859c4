import ConnectionCore
// Re-exported: `import SocketStylesCombine` brings `sink`, `AnyCancellable`, subjects and operators, as `import
// Combine` does on Apple platforms (the package's users need not add OpenCombine themselves).
@_exported @preconcurrency public import OpenCombine
public import SocketStyles
import Synchronization

/// OpenCombine publishers for code ported from Apple platforms, where apps wrap `URLSessionWebSocketTask` and
/// `NWConnection` in subjects: received messages, connection states, WebSocket events and send results, as
/// publishers on Linux.
///
/// The sequence publishers honour demand: nothing is received from the connection until a subscriber asks, so a
/// slow subscriber slows the peer (the connection's bounded receive queue, then TCP) instead of buffering.
extension Connection {
    /// Every received message, then `.finished` when the peer ends the stream or this side closes the connection
    /// (see ``ConnectionCore/Connection/messages``), or `.failure` with the error of an abnormal end.
    /// One subscriber at a time (receives are served in call order).
    public var messagePublisher: AsyncSequencePublisher<ConnectionMessages> {
        AsyncSequencePublisher(messages)
    }

    /// Sends `message` once subscribed: `()` then `.finished`, or `.failure`. Like `Future`, but lazy: nothing
    /// is sent until a subscriber asks.
    public func sendPublisher(_ message: Message) -> AnyPublisher<Void, ConnectionError> {
        Deferred {
            Future<Void, ConnectionError> { promise in
                let promise = UncheckedSendable(promise)
                Task {
                    do throws(ConnectionError) {
                        try await self.send(message)
                        promise.value(.success(()))
                    } catch {
                        promise.value(.failure(error))
                    }
                }
            }
        }
        .eraseToAnyPublisher()
    }
}

extension ReconnectingConnection {
    /// ``ReconnectingConnection/states`` as a publisher (the states' one consumer).
    public var statePublisher: AsyncSequencePublisher<AsyncStream<ConnectionState>> {
        AsyncSequencePublisher(states)
    }
}

extension ReconnectingConnection {
    /// ``ReconnectingConnection/webSocketEvents`` (every connection's opened, pings and pongs when reported,
    /// closed) as a publisher.
    public var webSocketEventPublisher: AsyncSequencePublisher<AsyncStream<WebSocketEvent>> {
        AsyncSequencePublisher(webSocketEvents)
    }
}

extension WebSocketConnection {
    /// ``WebSocketConnection/events`` (opened, closed with the peer's code and reason) as a publisher.
    public var eventPublisher: AsyncSequencePublisher<AsyncStream<WebSocketEvent>> {
        AsyncSequencePublisher(events)
    }
}

/// Any `AsyncSequence` as a publisher that pulls one element per unit of demand, on a task of its own; cancelling
/// the subscription cancels the task.
public struct AsyncSequencePublisher<Base: AsyncSequence & Sendable>: Publisher
where Base.Element: Sendable {
    public typealias Output = Base.Element
    public typealias Failure = Base.Failure

    let base: Base

    public init(_ base: Base) { self.base = base }

    public func receive<S: Subscriber>(subscriber: S) where S.Input == Output, S.Failure == Failure {
        let subscription = PullSubscription(base: base, subscriber: AnySubscriber(subscriber))
        subscriber.receive(subscription: subscription)
    }
}

private final class PullSubscription<Base: AsyncSequence & Sendable>: Subscription, Sendable
where Base.Element: Sendable {
    typealias S = AnySubscriber<Base.Element, Base.Failure>
    private struct State {
        var subscriber: S?
        var demand = Subscribers.Demand.none
        var started = false
        var waiter: CheckedContinuation<Bool, Never>?
        var task: Task<Void, Never>?
    }
    private let state: Guarded<UncheckedSendable<State>>
    private let base: Base

    init(base: Base, subscriber: S) {
        self.base = base
        state = Guarded(UncheckedSendable(State(subscriber: subscriber)))
    }

    var combineIdentifier: CombineIdentifier { CombineIdentifier(self) }

    func request(_ demand: Subscribers.Demand) {
        let (start, waiter): (Bool, CheckedContinuation<Bool, Never>?) = state.withLock { box in
            guard box.value.subscriber != nil else { return (false, nil) }
            box.value.demand += demand
            let waiter = box.value.waiter
            box.value.waiter = nil
            if box.value.started { return (false, waiter) }
            box.value.started = true
            return (true, waiter)
        }
        waiter?.resume(returning: true)
        if start {
            let task = Task { await self.pump() }
            state.withLock { $0.value.task = task }
        }
    }

    func cancel() {
        let (task, waiter) = state.withLock { box in
            box.value.subscriber = nil
            defer { box.value.waiter = nil }
            return (box.value.task, box.value.waiter)
        }
        task?.cancel()
        waiter?.resume(returning: false)
    }

    /// Waits for demand; `false` once cancelled.
    private func awaitDemand() async -> Bool {
        await withCheckedContinuation { continuation in
            let answer: Bool? = state.withLock { box in
                if box.value.subscriber == nil { return false }
                if box.value.demand > 0 { return true }
                box.value.waiter = continuation
                return nil
            }
            if let answer { continuation.resume(returning: answer) }
        }
    }

    private func pump() async {
        var iterator = base.makeAsyncIterator()
        do {
            while await awaitDemand() {
                guard let element = try await iterator.next() else {
                    finish(.finished)
                    return
                }
                guard
                    let subscriber = state.withLock({ box in
                        box.value.demand -= 1
                        return box.value.subscriber
                    })
                else { return }
                let more = subscriber.receive(element)
                state.withLock { $0.value.demand += more }
            }
        } catch let error as Base.Failure {
            finish(.failure(error))
        } catch {
            // Base.Failure is the only error an iterator of Base throws.
        }
    }

    private func finish(_ completion: Subscribers.Completion<Base.Failure>) {
        let subscriber = state.withLock { box in
            defer { box.value.subscriber = nil }
            return box.value.subscriber
        }
        subscriber?.receive(completion: completion)
    }
}

/// A value the compiler cannot prove Sendable, used only under the subscription's lock or once.
struct UncheckedSendable<Value>: @unchecked Sendable {
    var value: Value
    init(_ value: Value) { self.value = value }
}
