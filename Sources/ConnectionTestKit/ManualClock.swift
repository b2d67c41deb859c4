public import ConnectionCore
import Synchronization

/// A clock that moves only when the test says so: waits on it (`deadlineClock.sleep(for:)`) end when
/// ``advance(by:)`` has moved it past their deadline, in deadline order, however little real time went by. Give
/// ``deadlineClock`` to a layer's options (`WebSocketOptions.clock`) and a ping deadline, a keep-alive interval
/// or a close timeout of minutes is reached at once, deterministically, with no sleep in the test.
///
/// ```swift
/// let clock = ManualClock()
/// let options = WebSocketOptions.with { $0.clock = clock.deadlineClock; $0.pongDeadline = .seconds(30) }
/// // ... a ping starts waiting for its pong ...
/// await clock.waitForSleepers(1)   // the deadline is armed
/// clock.advance(by: .seconds(30))  // and reached: the ping fails with .timedOut now
/// ```
public final class ManualClock: Sendable {
    private struct Sleeper {
        let deadline: Duration
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var now: Duration = .zero
        var nextID = 0
        var sleepers: [Int: Sleeper] = [:]
        /// Tests waiting until this many sleepers wait.
        var watchers: [(count: Int, continuation: CheckedContinuation<Void, Never>)] = []
    }

    private let state = Guarded(State())

    public init() {}

    /// Time on this clock since it was made.
    public var now: Duration { state.withLock { $0.now } }

    /// Waits now on the clock.
    public var sleeperCount: Int { state.withLock { $0.sleepers.count } }

    /// The clock for a layer's options.
    public var deadlineClock: DeadlineClock {
        DeadlineClock(owner: self) { [self] duration in try await sleep(for: duration) }
    }

    /// Moves the clock on by `duration`, ending (in deadline order) every wait whose deadline it reaches.
    public func advance(by duration: Duration) {
        let due = state.withLock { state -> [Sleeper] in
            state.now += duration
            let now = state.now
            let ready = state.sleepers.filter { $0.value.deadline <= now }
            for id in ready.keys { state.sleepers[id] = nil }
            return ready.values.sorted { $0.deadline < $1.deadline }
        }
        for sleeper in due { sleeper.continuation.resume() }
    }

    /// Returns once at least `count` waits are waiting on the clock (what the code under test armed), so a test
    /// advances the clock after the deadline it means to reach exists.
    public func waitForSleepers(_ count: Int) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = state.withLock { state -> Bool in
                if state.sleepers.count >= count { return true }
                state.watchers.append((count, continuation))
                return false
            }
            if now { continuation.resume() }
        }
    }

    private func sleep(for duration: Duration) async throws {
        let id = state.withLock { state in
            defer { state.nextID += 1 }
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let (immediately, watchers) = state.withLock {
                    state -> (Bool, [CheckedContinuation<Void, Never>]) in
                    if duration <= .zero || Task.isCancelled { return (true, []) }
                    state.sleepers[id] = Sleeper(deadline: state.now + duration, continuation: continuation)
                    let count = state.sleepers.count
                    let met = state.watchers.filter { $0.count <= count }.map(\.continuation)
                    state.watchers.removeAll { $0.count <= count }
                    return (false, met)
                }
                for watcher in watchers { watcher.resume() }
                if immediately {
                    if Task.isCancelled {
                        continuation.resume(throwing: CancellationError())
                    } else {
                        continuation.resume()
                    }
                }
            }
        } onCancel: {
            state.withLock { $0.sleepers.removeValue(forKey: id) }?.continuation.resume(throwing: CancellationError())
        }
    }
}
