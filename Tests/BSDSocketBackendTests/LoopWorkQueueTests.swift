import ConnectionCore
import Glibc
import POSIXSupport
import Synchronization
import Testing

/// The loop work queue every loop executor shares, without a loop: when it signals, what runs in which order, and
/// what a closed queue does. A "loop thread" here is a POSIX thread the test starts and binds.
@Suite("loop work queue", .timeLimit(.minutes(2)))
struct LoopWorkQueueTests {
    final class Counter: Sendable {
        let value = Atomic<Int>(0)
        func add() { value.add(1, ordering: .relaxed) }
        var count: Int { value.load(ordering: .relaxed) }
    }

    final class Log: Sendable {
        let entries = Guarded<[String]>([])
        func add(_ entry: String) { entries.withLock { $0.append(entry) } }
        var all: [String] { entries.withLock { $0 } }
    }

    /// Runs `body` on a new thread bound to `queue` as its loop thread, and waits for it.
    static func onLoopThread(_ queue: LoopWorkQueue, _ body: @escaping @Sendable () -> Void) {
        let finished = Latch()
        PosixThread.spawn(name: "queue-test") {
            queue.bindToCurrentThread()
            body()
            finished.open()
        }
        finished.wait()
    }

    static let executor = UnownedTaskExecutor(ordinary: globalConcurrentExecutor)

    @Test("Work from another thread signals only a loop that said it sleeps, and once per sleep")
    func signalsOnlyASleepingLoop() {
        let signals = Counter()
        let queue = LoopWorkQueue(signal: { signals.add() })
        let ran = Counter()
        // No loop thread is bound: every add below comes from "another thread".
        queue.add(.block({ ran.add() }))
        #expect(signals.count == 0, "an awake loop is not signalled")
        #expect(!queue.prepareToSleep(), "work is waiting: the loop must not sleep")
        queue.runAll(jobsAs: Self.executor)
        #expect(ran.count == 1)
        #expect(queue.prepareToSleep())
        queue.add(.block({ ran.add() }))
        queue.add(.block({ ran.add() }))
        #expect(signals.count == 1, "two adds to a sleeping loop: one signal")
        queue.awoke()
        queue.runAll(jobsAs: Self.executor)
        #expect(ran.count == 3)
    }

    @Test("A wake-up that comes while the loop is awake makes its next prepareToSleep say no, once")
    func wakeWhileAwakeIsRemembered() {
        let signals = Counter()
        let queue = LoopWorkQueue(signal: { signals.add() })
        queue.wake()
        #expect(signals.count == 0)
        #expect(!queue.prepareToSleep())
        #expect(queue.prepareToSleep())
        queue.wake()
        #expect(signals.count == 1, "a sleeping loop is signalled")
    }

    @Test("The loop thread's own work runs first, work it adds while running runs in the same call, nothing waits")
    func orderAndNestedWork() {
        let signals = Counter()
        let queue = LoopWorkQueue(signal: { signals.add() })
        let log = Log()
        let unrun = Guarded<[Bool]>([])
        queue.add(.block({ log.add("other thread") }))
        Self.onLoopThread(queue) {
            queue.add(.block({ log.add("local 1") }))
            queue.add(
                .block({
                    log.add("local 2")
                    queue.add(.block({ log.add("added while running") }))
                }))
            unrun.withLock { $0.append(queue.hasUnrunWork) }
            queue.runAll(jobsAs: Self.executor)
            unrun.withLock { $0.append(queue.hasUnrunWork) }
        }
        #expect(log.all == ["local 1", "local 2", "other thread", "added while running"])
        #expect(unrun.withLock { $0 } == [true, false])
        #expect(signals.count == 0, "nothing was signalled: the loop never said it sleeps")
    }

    @Test("A job of a batch being run sees the rest of its batch as unrun work, and may not sleep")
    func unrunBatchWork() {
        let queue = LoopWorkQueue(signal: {})
        let seen = Guarded<[Bool]>([])
        Self.onLoopThread(queue) {
            queue.add(
                .block({
                    let unrun = queue.hasUnrunWork
                    let sleeps = queue.prepareToSleep()
                    seen.withLock { $0 += [unrun, sleeps] }
                }))
            queue.add(.block({}))
            queue.runAll(jobsAs: Self.executor)
            seen.withLock { $0.append(queue.hasUnrunWork) }
        }
        #expect(seen.withLock { $0 } == [true, false, false])
    }

    @Test("A closed queue returns what was not run, refuses new work and never signals again")
    func closeRefuses() {
        let signals = Counter()
        let queue = LoopWorkQueue(signal: { signals.add() })
        let ran = Counter()
        let leftLocal = Counter()
        let refusedLocal = Counter()
        queue.add(.block({ ran.add() }))
        Self.onLoopThread(queue) {
            queue.add(.block({ ran.add() }))
            let left = queue.close()
            leftLocal.value.store(left?.count ?? -1, ordering: .relaxed)
            if !queue.add(.block({ ran.add() })) { refusedLocal.add() }
        }
        #expect(leftLocal.count == 2, "the local item and the other thread's")
        #expect(refusedLocal.count == 1, "the loop thread's own add is refused too")
        #expect(queue.close() == nil, "a second close finds it closed")
        #expect(!queue.add(.block({ ran.add() })))
        queue.wake()
        #expect(signals.count == 0)
        #expect(ran.count == 0)
        #expect(!queue.isOpen)
    }

    @Test("close() returns only once a signal decided before it has finished, so its target may then be released")
    func closeWaitsForASignalInFlight() {
        let inSignal = Latch()
        let finished = Counter()
        let queue = Guarded<LoopWorkQueue?>(nil)
        // The signal goes on until the queue is closed (close() marks it closed before anything else), then ends.
        let made = LoopWorkQueue(signal: {
            inSignal.open()
            while queue.withLock({ $0?.isOpen ?? true }) { sched_yield() }
            finished.add()
        })
        queue.withLock { $0 = made }
        #expect(made.prepareToSleep())
        // Another thread adds work to the sleeping loop: it decides to signal, and is inside the signal.
        PosixThread.spawn(name: "queue-signaller") { _ = made.add(.block({})) }
        inSignal.wait()
        _ = made.close()
        #expect(finished.count == 1, "close() returned while the signal was still being sent")
    }
}
