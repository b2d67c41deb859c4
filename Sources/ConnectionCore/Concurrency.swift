import Synchronization

/// Waits for `body` to deliver a value, from any thread (a loop's, a reader's), exactly once. The deliverer makes a
/// releasing change to an atomic before it resumes, and the task an acquiring load after: the concurrency runtime
/// orders a resume and the resumed task's run with atomics ThreadSanitizer cannot see, so an object made on a loop's
/// thread and handed over by the resume alone reads as unpublished under TSan; the atomic makes the hand-off one it
/// checks. (A lock-guarded slot did the same at the cost of 1-1.5 us a runloop udp connect: `compare --backends
/// runloop --scenarios connect --transports udp --repetitions 27`, three rounds.)
public func awaitHandOff<Value: Sendable>(
    _ body: (_ deliver: @escaping @Sendable (Value) -> Void) -> Void
) async -> Value {
    let value = await withCheckedContinuation { (continuation: CheckedContinuation<Value, Never>) in
        body { value in
            handOffFence.add(1, ordering: .releasing)
            continuation.resume(returning: value)
        }
    }
    _ = handOffFence.load(ordering: .acquiring)
    return value
}

/// The hand-offs' one atomic (``awaitHandOff(_:)``): only its ordering matters, not its count.
private let handOffFence = Atomic<Int>(0)

/// True for the first caller of ``claim()`` only.
public final class OnceFlag: Sendable {
    private let flag = Guarded(false)

    /// A flag not yet claimed.
    public init() {}

    /// `true` the first time only.
    public func claim() -> Bool {
        flag.withLock { taken in
            defer { taken = true }
            return !taken
        }
    }

    /// Whether someone claimed the flag.
    public var isClaimed: Bool { flag.withLock { $0 } }
}

/// Runs `operation`; if it has not finished after `limit`, runs `onTimeout` (which must make the operation
/// return, for example by closing what it waits on) and then waits for the operation. Returns `true` when the
/// operation finished in time. Cancelling the caller cancels the operation and never counts as a timeout.
public func runBounded(
    by limit: Duration, on clock: DeadlineClock = .continuous, onTimeout: @escaping @Sendable () async -> Void,
    _ operation: @escaping @Sendable () async -> Void
) async -> Bool {
    enum Outcome { case finished, limitReached, timerCancelled }
    return await withTaskGroup(of: Outcome.self) { group in
        group.addTask {
            await operation()
            return .finished
        }
        group.addTask {
            do {
                try await clock.sleep(for: limit)
                return .limitReached
            } catch {
                return .timerCancelled
            }
        }
        var inTime = true
        while let outcome = await group.next() {
            switch outcome {
            case .finished:
                group.cancelAll()
                return inTime
            case .limitReached:
                inTime = false
                await onTimeout()
            case .timerCancelled:
                continue
            }
        }
        return inTime
    }
}

/// Runs one step of setting a connection up (a TLS or WebSocket opening handshake) with a deadline: when `limit`
/// passes first, `connection` is closed, which ends whatever the step waits for, and `.timedOut` is thrown with
/// `what` in its message. A peer that connects and then says nothing, or too little, is let go in bounded time.
public func withDeadline<R: Sendable>(
    _ limit: Duration, on clock: DeadlineClock = .continuous, closing connection: any Connection, _ what: String,
    _ operation: @escaping @Sendable () async throws(ConnectionError) -> R
) async throws(ConnectionError) -> R {
    let outcome = Guarded<Result<R, ConnectionError>?>(nil)
    let finished = await runBounded(by: limit, on: clock, onTimeout: { await connection.close() }) {
        let result: Result<R, ConnectionError>
        do throws(ConnectionError) {
            result = .success(try await operation())
        } catch {
            result = .failure(error)
        }
        outcome.withLock { $0 = result }
    }
    guard finished else { throw ConnectionError(.timedOut, "\(what) took longer than \(limit)") }
    return try outcome.withLock { $0 ?? .failure(.cancelled()) }.get()
}
