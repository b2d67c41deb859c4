import ConnectionCore
import Synchronization
import Testing

/// The deadline timer under `DeadlineClock.continuous`: a wait ends at its deadline, and a cancelled one ends at once
/// and is taken out of the timer then, not at its deadline (what `Task.sleep` does not do).
@Suite("deadline timer", .serialized, .timeLimit(.minutes(1)))
struct DeadlineTimerTests {
    /// A timer of this suite's own, so that other tests' waits (handshake deadlines) are not counted.
    static let timer = DeadlineTimer()

    @Test("A wait ends after its duration, not before")
    func fires() async throws {
        let clock = ContinuousClock()
        let start = clock.now
        try await DeadlineClock.continuous.sleep(for: .milliseconds(50))
        #expect(start.duration(to: clock.now) >= .milliseconds(50))
    }

    @Test("Actions run in deadline order, whatever order they were scheduled in")
    func order() async {
        let order = Guarded<[Int]>([])
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            for (index, delay) in [30, 10, 20].enumerated() {
                _ = Self.timer.schedule(after: .milliseconds(delay)) {
                    let count = order.withLock { list in
                        list.append(index)
                        return list.count
                    }
                    if count == 3 { done.resume() }
                }
            }
        }
        #expect(order.withLock { $0 } == [1, 2, 0])
    }

    @Test("10,000 waits of 60 s, cancelled: each ends at once, and the timer holds none of them afterwards")
    func cancelledWaitsLetGo() async throws {
        let clock = ContinuousClock()
        let start = clock.now
        let before = Self.timer.pending
        for _ in 0..<10_000 {
            let task = Task { try await Self.timer.sleep(for: .seconds(60)) }
            task.cancel()
            await #expect(throws: CancellationError.self) { try await task.value }
        }
        #expect(start.duration(to: clock.now) < .seconds(30))
        let after = Self.timer.pending
        #expect(after.actions == before.actions, "waits still held: \(after.actions - before.actions)")
        #expect(after.heap <= 65, "heap slots of cancelled waits not swept: \(after.heap)")
    }

    @Test("A task cancelled before it waits does not wait")
    func cancelledBefore() async {
        let task = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            try await Self.timer.sleep(for: .seconds(60))
        }
        await #expect(throws: CancellationError.self) { try await task.value }
    }
}
