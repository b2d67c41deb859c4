import ConnectionCore
import Synchronization
import Testing

/// The deadline timer under `DeadlineClock.continuous`: a wait ends at its deadline, and a cancelled one ends at once
/// and is taken out of the timer then, not at its deadline (what `Task.sleep` does not do).
@Suite("deadline timer", .serialized, .timeLimit(.minutes(1)))
struct DeadlineTimerTests {
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
                _ = DeadlineTimer.shared.schedule(after: .milliseconds(delay)) {
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
        let before = DeadlineTimer.shared.pending
        for _ in 0..<10_000 {
            let task = Task { try await DeadlineClock.continuous.sleep(for: .seconds(60)) }
            task.cancel()
            await #expect(throws: CancellationError.self) { try await task.value }
        }
        #expect(start.duration(to: clock.now) < .seconds(30))
        let after = DeadlineTimer.shared.pending
        #expect(after.actions <= before.actions, "waits still held: \(after.actions - before.actions)")
        #expect(after.heap <= max(64, 2 * after.actions) + 1, "heap slots of cancelled waits not swept: \(after.heap)")
    }

    @Test("A task cancelled before it waits does not wait")
    func cancelledBefore() async {
        let task = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            try await DeadlineClock.continuous.sleep(for: .seconds(60))
        }
        await #expect(throws: CancellationError.self) { try await task.value }
    }
}
