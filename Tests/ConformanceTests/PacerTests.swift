import ConnectionTestKit
import POSIXSupport
import Testing

@testable import BenchmarkDriver

/// The open-loop sender's clock: a wait returns once its message is due, never before; a message already due
/// does not wait; stopping lets a waiting sender go.
// The tests take turns with the socket tests (`SocketTest.run`, which bounds each one's own run to a minute), so the
// suite's limit covers the wait for its turn too.
@Suite("Pacer", .timeLimit(.minutes(20)))
struct PacerTests {
    @Test(
        "Each wait returns at or after its message's time, in order, and a late sender does not wait",
        arguments: Pacing.allCases)
    func waitsUntilDue(pacing: Pacing) async throws {
        try await withPacer(interval: 1_000_000, count: 20, pacing: pacing) { pacer in
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
    }

    @Test(
        "stop() lets a sender waiting for a later message go at once, and a spinning pacer ends",
        arguments: Pacing.allCases)
    func stopResumesTheWaiter(pacing: Pacing) async throws {
        try await withPacer(after: 0, interval: 0.5e9, count: 3, pacing: pacing) { pacer in
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
    }

    /// A workload's senders, one per connection, wait on one pacer for their own messages (connection k sends
    /// messages k, k + N, ...): each is resumed at its own messages' times, none early, none forgotten.
    @Test("Senders of many connections each wait for their own messages", arguments: Pacing.allCases)
    func manySenders(pacing: Pacing) async throws {
        try await withPacer(interval: 300_000, count: 60, pacing: pacing) { pacer in
            let connections = 5
            let early = await withTaskGroup(of: Int.self) { group in
                for connection in 0..<connections {
                    group.addTask { await waitEach(pacer, stride(from: connection, to: 60, by: connections)).early }
                }
                return await group.reduce(0, +)
            }
            #expect(early == 0)
            #expect(!pacer.hasWaiter)
        }
    }

    /// A sender that prefers the pacer (its connection sends from any thread) runs on the pacer's thread: resumed
    /// there at each of its messages' times, never early; and a job that comes from another thread while the
    /// pacer waits for a far send time runs at once, whether it spins or sleeps.
    @Test(
        "A sender on the pacer's executor runs on its thread, and work from elsewhere runs while it waits",
        arguments: Pacing.allCases)
    func senderOnThePacer(pacing: Pacing) async throws {
        try await withPacer(interval: 1_000_000, count: 10, pacing: pacing) { pacer in
            let (early, elsewhere) = await Task(executorPreference: pacer) { await waitEach(pacer, 0..<10) }.value
            #expect(early == 0)
            #expect(elsewhere == 0, "the sender ran off the pacer's thread")

            // The next send time is 10 s away: a job handed to the pacer meanwhile must not wait for it.
            let far = Pacer(
                start: MonotonicClock.nanoseconds() + 10_000_000_000, interval: 1e9, count: 2, pacing: pacing)
            let handed = MonotonicClock.nanoseconds()
            let onPacer = await Task(executorPreference: far) { far.isCurrent }.value
            #expect(onPacer)
            #expect(MonotonicClock.nanoseconds() - handed < 2_000_000_000, "the job waited for the next send time")
            _ = await far.end()
        }
    }
}

/// Waits on `pacer` for each of `indices` in turn. Returns how many waits returned before their message's time,
/// and how many returned off the pacer's thread.
private func waitEach(_ pacer: Pacer, _ indices: some Sequence<Int>) async -> (early: Int, offPacer: Int) {
    var early = 0
    var offPacer = 0
    for index in indices {
        await pacer.wait(for: index)
        if MonotonicClock.nanoseconds() < pacer.due(index) { early += 1 }
        if !pacer.isCurrent { offPacer += 1 }
    }
    return (early, offPacer)
}

/// Runs `body` with a pacer whose first message is due `after` nanoseconds from now, then ends the pacer; under
/// the socket tests' lock, since a sleeping pacer holds an eventfd until its thread ends.
private func withPacer(
    after: UInt64 = 2_000_000, interval: Double, count: Int, pacing: Pacing,
    _ body: @escaping @Sendable (Pacer) async throws -> Void
) async throws {
    try await SocketTest.run {
        let pacer = Pacer(start: MonotonicClock.nanoseconds() + after, interval: interval, count: count, pacing: pacing)
        try await body(pacer)
        _ = await pacer.end()
    }
}
