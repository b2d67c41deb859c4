import ConnectionCore
import ConnectionTestKit
import POSIXSupport
import Synchronization
import Testing

/// The policy that decides whether a reader reads before it waits, and the epoll loop's hook that runs those
/// reads: no sockets needed.
@Suite("read before wait", .timeLimit(.minutes(20)))
struct ReadBeforeWaitTests {
    @Test("reads first after data while most reads made first hit; a paced peer costs one miss per probe")
    func policy() {
        var policy = ReadBeforeWait()
        #expect(!policy.readsFirst)  // nothing read yet
        policy.found(afterWait: true)
        #expect(policy.readsFirst)
        // A request-response run: every read made first hits, and a miss now and then does not stop it.
        for _ in 0..<10 { policy.found(afterWait: false) }
        policy.missed()
        #expect(!policy.readsFirst)  // the next read waits first
        policy.found(afterWait: true)
        #expect(policy.readsFirst)
        // Misses in a row (an open-loop peer): after `ceiling` of them, reads wait first.
        for _ in 0..<ReadBeforeWait.ceiling {
            policy.missed()
            policy.found(afterWait: true)
        }
        var firstReads = 0
        for _ in 0..<(ReadBeforeWait.probeEvery * 3) {
            if policy.readsFirst {
                firstReads += 1
                policy.missed()
            }
            policy.found(afterWait: true)
        }
        #expect(firstReads == 3)  // one probe per `probeEvery` waits
        // A probe that hits turns reading first back on.
        while !policy.readsFirst { policy.found(afterWait: true) }
        policy.found(afterWait: false)
        #expect(policy.readsFirst)
    }

    @Test("the epoll loop runs a block asked for before its next wait, with no event to wake it")
    func loopHook() async throws {
        // Under the socket tests' lock: the loop's epoll and eventfd descriptors are closed before it returns.
        let runs = try await SocketTest.run { try Self.runHooks() }
        #expect(runs == ["read 2", "work 2", "read 1", "work 1", "read 0"])
    }

    @Test("reads that find data before every wait do not keep the loop from its other descriptors")
    func floodDoesNotStarve() async throws {
        let (served, floodReads, queued) = try await SocketTest.run { try Self.runFlood() }
        #expect(served, "the other descriptor's event was handled before the deadline")
        // Found data each time, yet the loop polled its descriptors within its bound.
        #expect(floodReads <= EpollLoop.turnsWithoutWait + 1, "\(floodReads) reads before the event was handled")
        // The event came while the flood's read was put off: asking again for the same owner added nothing.
        #expect(queued == 1)
    }

    /// An endless flood read before every wait, beside an eventfd that is readable from the start; the eventfd's
    /// handler asks for a read before the next wait for the flood's owner (as a socket's event does) and stops the
    /// loop (ten seconds at most). Whether it ran, how many flood reads came before it, and how many blocks then
    /// waited for the next wait.
    static func runFlood() throws -> (Bool, Int, Int) {
        final class Ready: EpollHandler {
            unowned let loop: EpollLoop
            let wake: WakeEvent
            let handled = Atomic<Bool>(false)
            let queued = Atomic<Int>(0)
            init(loop: EpollLoop, wake: WakeEvent) {
                self.loop = loop
                self.wake = wake
            }
            func epollReady(_ events: UInt32) {
                wake.drain()
                handled.store(true, ordering: .relaxed)
                loop.beforeNextWait(for: self) { false }
                queued.store(loop.blocksBeforeNextWait, ordering: .relaxed)
                loop.stop()
            }
        }
        let loop = try EpollLoop(name: "flood-test")
        let wake = try WakeEvent()
        defer { wake.close() }
        let ready = Ready(loop: loop, wake: wake)
        try wake.withDescriptor { (fd) throws(ConnectionError) in
            try loop.register(fd, events: Syscall.epollIn, handler: ready)
        }
        defer { wake.ifOpen { loop.unregister($0) } }
        let reads = Mutex(0)
        // The blocks hold the loop weakly: one is still waiting for its turn when the loop stops, and the loop
        // (its epoll and eventfd descriptors) must go when this returns.
        loop.perform { [weak loop] in
            func flood() {
                loop?.beforeNextWait(for: ready) {
                    let count = reads.withLock { count in
                        count += 1
                        return count
                    }
                    if !ready.handled.load(ordering: .relaxed) && count < 100_000 { flood() }
                    return true
                }
            }
            flood()
            wake.signal()
        }
        loop.run(until: MonotonicClock.nanoseconds() + 10_000_000_000)
        return (ready.handled.load(ordering: .relaxed), reads.withLock { $0 }, ready.queued.load(ordering: .relaxed))
    }

    /// Runs a loop on this thread until its third block stops it (or ten seconds pass).
    static func runHooks() throws -> [String] {
        let loop = try EpollLoop(name: "read-before-wait-test")
        let runs = Mutex<[String]>([])
        loop.perform {
            var left = 3
            func ask() {
                loop.beforeNextWait {
                    left -= 1
                    runs.withLock { $0.append("read \(left)") }
                    if left > 0 {
                        // Found something: its work runs before the loop waits, then the block runs again.
                        let label = "work \(left)"
                        loop.perform { runs.withLock { $0.append(label) } }
                        ask()
                        return true
                    }
                    loop.stop()
                    return false
                }
            }
            ask()
        }
        loop.run(until: MonotonicClock.nanoseconds() + 10_000_000_000)
        return runs.withLock { $0 }
    }
}
