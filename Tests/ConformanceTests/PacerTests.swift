import POSIXSupport
import Testing

@testable import BenchmarkDriver

/// The open-loop sender's clock: a wait returns once its message is due, never before; a message already due
/// does not wait; stopping lets a waiting sender go.
@Suite("Pacer", .timeLimit(.minutes(1)))
struct PacerTests {
    @Test(
        "Each wait returns at or after its message's time, in order, and a late sender does not wait",
        arguments: Pacing.allCases)
    func waitsUntilDue(pacing: Pacing) async {
        let pacer = Pacer(
            start: MonotonicClock.nanoseconds() + 2_000_000, interval: 1_000_000, count: 20, pacing: pacing)
        defer { pacer.stop() }
        for index in 0..<10 {
            await pacer.wait(for: index)
            #expect(MonotonicClock.nanoseconds() >= pacer.due(index))
        }
        // Message 10's time passes while the sender is busy: its wait returns at once.
        while MonotonicClock.nanoseconds() < pacer.due(12) { await Task.yield() }
        let before = MonotonicClock.nanoseconds()
        await pacer.wait(for: 10)
        #expect(MonotonicClock.nanoseconds() - before < pacer.due(1) - pacer.due(0) + 1_000_000)
    }

    @Test(
        "stop() lets a sender waiting for a later message go at once, and a spinning pacer ends",
        arguments: Pacing.allCases)
    func stopResumesTheWaiter(pacing: Pacing) async {
        // Its thread ends 0.5 s on when sleeping; a spinning one ends at the stop.
        let pacer = Pacer(start: MonotonicClock.nanoseconds(), interval: 0.5e9, count: 3, pacing: pacing)
        let waiting = Task { await pacer.wait(for: 2) }
        while pacer.hasWaiter == false { await Task.yield() }
        let stopped = MonotonicClock.nanoseconds()
        pacer.stop()
        await waiting.value
        #expect(MonotonicClock.nanoseconds() < stopped + 250_000_000, "the waiter went only at its message's time")
        if pacing == .spin {
            let deadline = stopped + 250_000_000
            while pacer.cpuNanoseconds == nil && MonotonicClock.nanoseconds() < deadline { await Task.yield() }
            #expect(pacer.cpuNanoseconds != nil, "the spinning pacer went on after stop()")
        }
    }

    /// A workload's senders, one per connection, wait on one pacer for their own messages (connection k sends
    /// messages k, k + N, ...): each is resumed at its own messages' times, none early, none forgotten.
    @Test("Senders of many connections each wait for their own messages", arguments: Pacing.allCases)
    func manySenders(pacing: Pacing) async {
        let connections = 5
        let pacer = Pacer(
            start: MonotonicClock.nanoseconds() + 2_000_000, interval: 300_000, count: 60, pacing: pacing)
        defer { pacer.stop() }
        let early = await withTaskGroup(of: Int.self) { group in
            for connection in 0..<connections {
                group.addTask {
                    var early = 0
                    for index in stride(from: connection, to: 60, by: connections) {
                        await pacer.wait(for: index)
                        if MonotonicClock.nanoseconds() < pacer.due(index) { early += 1 }
                    }
                    return early
                }
            }
            return await group.reduce(0, +)
        }
        #expect(early == 0)
        #expect(!pacer.hasWaiter)
    }
}
