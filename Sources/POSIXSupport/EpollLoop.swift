@_spi(Loop) public import ConnectionCore
import Synchronization

/// Receives readiness events from an ``EpollLoop`` (called on the loop thread).
public protocol EpollHandler: AnyObject, Sendable {
    /// `events` is the epoll mask that fired (`Syscall.epollIn`, `epollOut`, `epollError`, `epollHangUp`...).
    func epollReady(_ events: UInt32)
}

/// An epoll event loop on one thread: descriptor readiness, timers (a binary heap feeding `epoll_wait`'s timeout),
/// and blocks or jobs handed over from any thread (woken by an eventfd). It is a `TaskExecutor`: tasks that
/// prefer it run on the loop thread, so a continuation resumed by a readiness event continues right there,
/// with no hop to another thread.
///
/// The run-loop backend builds its run loop on it (run, run(until:), stop, perform); the async backend uses it
/// as its reactor.
public final class EpollLoop: TaskExecutor, Sendable {
    private let epoll: Int32
    private let wake: WakeEvent
    private static let wakeToken: UInt64 = .max
    private let work: LoopWorkQueue
    private let stopRequested = Atomic<Bool>(false)
    private let handlers = Guarded(HandlerTable())
    private let confined = LoopConfined(Confined())
    /// A name for the thread that runs the loop.
    public let name: String

    /// The handlers by descriptor number, in an array: an event finds its handler by index, where a dictionary
    /// hashed the number for every event (a run-loop round trip through `Connection` spent 0.6% of its client's
    /// samples in the hasher). Descriptor numbers are small and dense (the lowest free one is reused), so the array
    /// is as long as the highest number watched, 16 bytes a slot.
    private struct HandlerTable {
        private var slots: [(any EpollHandler)?] = []
        private(set) var count = 0

        subscript(fd: Int32) -> (any EpollHandler)? {
            get { fd >= 0 && Int(fd) < slots.count ? slots[Int(fd)] : nil }
            set {
                guard fd >= 0 else { return }
                let index = Int(fd)
                if index >= slots.count {
                    guard newValue != nil else { return }
                    slots.append(contentsOf: repeatElement(nil, count: max(index + 1, slots.count * 2) - slots.count))
                }
                if (slots[index] == nil) != (newValue == nil) { count += newValue == nil ? -1 : 1 }
                slots[index] = newValue
            }
        }
    }

    /// What only the loop thread touches.
    private struct Confined {
        var timers = TimerHeap()
        var nextTimerID: UInt64 = 0
        var cancelledTimers: Set<UInt64> = []
        /// Set before the loop runs.
        var jobExecutor: UnownedTaskExecutor?
        /// Run once each, the next time the loop is about to wait (``beforeNextWait(for:_:)``), with their owners.
        var beforeWait: [(owner: ObjectIdentifier?, block: () -> Bool)] = []
        /// The owners with a block in ``beforeWait``.
        var waitingOwners: Set<ObjectIdentifier> = []
        /// Tasks that gave up their turn (``yieldUntilPolled()``): resumed after the loop's next `epoll_wait`.
        var yielded: [UnsafeContinuation<Void, Never>] = []
    }

    /// Creates the epoll instance and its wake-up eventfd. Nothing runs until ``run(until:)`` is called on some
    /// thread, or ``startThread()``.
    public init(name: String) throws(ConnectionError) {
        self.name = name
        let epoll = try Syscall.epollCreate()
        self.epoll = epoll
        let wake: WakeEvent
        do {
            wake = try WakeEvent()
            try wake.withDescriptor { (fd) throws(ConnectionError) in
                try Syscall.epollControl(epoll, Syscall.epollAdd, fd, events: Syscall.epollIn, data: Self.wakeToken)
            }
        } catch {
            Syscall.close(epoll)
            throw error
        }
        self.wake = wake
        work = LoopWorkQueue(signal: { wake.signal() })
    }

    deinit {
        Syscall.close(epoll)
    }

    /// Starts a thread of its own that runs the loop until ``stop()``.
    public func startThread() {
        PosixThread.spawnAndWait(name: name, started: { [self] in work.bindToCurrentThread() }) { [self] in
            run(until: nil)
        }
    }

    /// `true` on the thread running the loop.
    public var inLoop: Bool { work.isLoopThread }

    /// Loop thread: the loop's turn, which changes each time it is about to wait (sends of one connection in one turn
    /// gather: `WriteThrough`).
    public var turn: UInt32 { work.turn }

    /// Loop thread: runs `block` once, the next time the loop is about to wait for events, before it decides
    /// whether it may (work the block adds is run first).
    public func beforeSleep(_ block: @escaping () -> Void) { work.beforeSleep(block) }

    /// The loop's thread, for state that only its handlers touch (`LoopConfined`).
    package var thread: LoopThread { work.thread }

    // MARK: Handing work over

    /// Runs `block` on the loop thread: at once in order with other work when called from it, otherwise after
    /// waking the loop (eventfd). Safe from any thread.
    public func perform(_ block: @escaping @Sendable () -> Void) {
        work.add(.block(block))
    }

    /// TaskExecutor: a job of a task that prefers this loop runs on the loop thread.
    public func enqueue(_ job: consuming ExecutorJob) {
        work.add(.job(UnownedJob(job)))
    }

    /// Runs every job as `executor` instead of as the loop itself: for an executor that wraps this loop and
    /// forwards its jobs here (``AsyncReactor``-like). A task that prefers the wrapper must find that same
    /// executor current when its jobs run, or the runtime re-enqueues the task at every `await` (measured: a
    /// quarter of a round trip's CPU). Call before the loop runs; `executor` must outlive it.
    public func runJobs(as executor: UnownedTaskExecutor) {
        confined.withValue { $0.jobExecutor = executor }
    }

    // MARK: Descriptors (from any thread)

    /// Watches the descriptor for `events`; `handler` is called on the loop thread when they fire.
    public func register(
        _ descriptor: borrowing BorrowedDescriptor, events: UInt32, handler: any EpollHandler
    ) throws(ConnectionError) {
        let number = descriptor.number
        handlers.withLock { $0[number] = handler }
        do {
            try Syscall.epollControl(
                epoll, Syscall.epollAdd, descriptor, events: events, data: UInt64(UInt32(bitPattern: number)))
        } catch {
            handlers.withLock { $0[number] = nil }
            throw error
        }
    }

    /// Changes the events watched on the descriptor (thread-safe: epoll_ctl only).
    public func modify(_ descriptor: borrowing BorrowedDescriptor, events: UInt32) throws(ConnectionError) {
        try Syscall.epollControl(
            epoll, Syscall.epollModify, descriptor, events: events,
            data: UInt64(UInt32(bitPattern: descriptor.number)))
    }

    /// Stops watching the descriptor. Call before closing the descriptor; an event already fetched for it is dropped.
    public func unregister(_ descriptor: borrowing BorrowedDescriptor) {
        try? Syscall.epollControl(epoll, Syscall.epollDelete, descriptor, events: 0, data: 0)
        let number = descriptor.number
        handlers.withLock { $0[number] = nil }
    }

    /// The number of descriptors watched.
    public var registeredCount: Int { handlers.withLock { $0.count } }

    // MARK: Timers (loop thread)

    /// Runs `block` on the loop thread after `delay`. Returns an id for ``cancelTimer(_:)``.
    @discardableResult
    public func schedule(after delay: Duration, _ block: @escaping () -> Void) -> UInt64 {
        let deadline = MonotonicClock.nanoseconds() + delay.wholeNanoseconds
        return confined.withValue { confined in
            confined.nextTimerID += 1
            confined.timers.insert(TimerHeap.Entry(deadline: deadline, id: confined.nextTimerID, block: block))
            return confined.nextTimerID
        }
    }

    /// Cancels a timer that has not fired.
    public func cancelTimer(_ id: UInt64) {
        confined.withValue { _ = $0.cancelledTimers.insert(id) }
    }

    /// Runs `block` on the loop thread once, the next time the loop has run its work and is about to wait in
    /// epoll_wait: for a reader that reads before it waits (``ReadBeforeWait``). `block` returns whether it found
    /// something (then the loop runs the work that made before it waits, and `block` may have asked again).
    /// With an `owner` (the socket that reads), one block per owner waits at a time: asked again before its block
    /// has run, the read is already asked for (a socket's event can come in a turn that put the reads off,
    /// ``turnsWithoutWait``, and each such turn would otherwise add one more read of the same socket).
    /// Loop thread only.
    public func beforeNextWait(for owner: AnyObject? = nil, _ block: @escaping () -> Bool) {
        confined.withValue { confined in
            let key = owner.map(ObjectIdentifier.init)
            if let key, !confined.waitingOwners.insert(key).inserted { return }
            confined.beforeWait.append((key, block))
        }
    }

    /// Suspends the calling task, which runs on the loop thread, until the loop has polled its descriptors once
    /// more (without blocking, as it has work) and queued what they made ready: a task that keeps finding data
    /// (a connection whose peer never lets its buffer run dry) gives the loop's other sockets their turn.
    /// Resumed in the order the tasks yielded, after the jobs the poll readied. Loop thread only.
    public func yieldUntilPolled() async {
        await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
            confined.withValue { $0.yielded.append(continuation) }
        }
    }

    private func takeYielded() -> [UnsafeContinuation<Void, Never>] {
        confined.withValue { confined in
            defer { confined.yielded = [] }
            return confined.yielded
        }
    }

    /// Runs the blocks waiting for the loop's next wait; whether any found something.
    private func runBeforeWait() -> Bool {
        // By index, no copy of the list: a block that asks again appends, for the next wait.
        let count = confined.withValue { $0.beforeWait.count }
        if count == 0 { return false }
        var found = false
        for index in 0..<count {
            let block = confined.withValue { confined in
                let entry = confined.beforeWait[index]
                if let owner = entry.owner { confined.waitingOwners.remove(owner) }
                return entry.block
            }
            if block() { found = true }
        }
        confined.withValue { $0.beforeWait.removeFirst(count) }
        return found
    }

    /// How many blocks wait for the loop's next wait (tests). Loop thread only.
    package var blocksBeforeNextWait: Int { confined.withValue { $0.beforeWait.count } }

    // MARK: Running

    /// How many turns in a row may skip `epoll_wait` because the reads made before it found data. Past that
    /// the loop polls its descriptors (without blocking) before it reads first again: a socket that never runs
    /// dry (a UDP flood, a bulk flow) must not keep the loop from every other descriptor it watches.
    public static let turnsWithoutWait = 16

    /// Runs the loop on the calling thread until ``stop()`` is called or `deadline` (monotonic nanoseconds)
    /// passes. Each turn: due timers, handed-over work, the reads made before a wait, then `epoll_wait` until the
    /// next timer (at most ``turnsWithoutWait`` turns in a row without it).
    public func run(until deadline: UInt64?) {
        work.bindToCurrentThread()
        let executor = confined.withValue { $0.jobExecutor } ?? asUnownedTaskExecutor()
        stopRequested.store(false, ordering: .relaxed)
        let capacity: Int32 = 64
        let events = UnsafeMutablePointer<UInt32>.allocate(capacity: Int(capacity))
        let data = UnsafeMutablePointer<UInt64>.allocate(capacity: Int(capacity))
        defer {
            events.deallocate()
            data.deallocate()
        }
        var skippedWaits = 0
        while !stopRequested.load(ordering: .relaxed) {
            runDueTimers()
            work.runAll(jobsAs: executor)
            if stopRequested.load(ordering: .relaxed) { break }
            let now = MonotonicClock.nanoseconds()
            if let deadline, now >= deadline { break }
            // After the deadline's check: reads that keep finding data must not keep run(until:) from returning.
            let pollsFirst = skippedWaits >= Self.turnsWithoutWait
            if !pollsFirst, runBeforeWait() {
                skippedWaits += 1
                continue
            }
            skippedWaits = 0
            var timeout: Int32 = -1
            if let next = confined.withValue({ $0.timers.first?.deadline }) {
                timeout = next <= now ? 0 : Int32(clamping: (next - now + 999_999) / 1_000_000)
            }
            if let deadline {
                let untilDeadline = Int32(clamping: (deadline - now + 999_999) / 1_000_000)
                timeout = timeout < 0 ? untilDeadline : min(timeout, untilDeadline)
            }
            // Announce sleep, then look once more for work handed over meanwhile.
            let yielded = takeYielded()
            if !yielded.isEmpty { work.endTurn() }  // a poll without sleep is a turn's end too
            let sleeps = yielded.isEmpty && work.prepareToSleep()
            // The reads put off and the tasks that yielded wait for their turn, not for an event.
            if !sleeps || pollsFirst { timeout = 0 }
            let count =
                (try? Syscall.epollWait(
                    epoll, events: events, data: data, capacity: capacity,
                    timeoutMilliseconds: timeout)) ?? 0
            if sleeps { work.awoke() }
            for index in 0..<count {
                let token = data[index]
                if token == Self.wakeToken {
                    wake.drain()
                    continue
                }
                let fd = Int32(bitPattern: UInt32(truncatingIfNeeded: token))
                handlers.withLock { $0[fd] }?.epollReady(events[index])
            }
            for continuation in yielded { continuation.resume() }
        }
        for continuation in takeYielded() { continuation.resume() }
        work.runAll(jobsAs: executor)
    }

    /// Makes ``run(until:)`` return after its current turn. Safe from any thread.
    public func stop() {
        stopRequested.store(true, ordering: .relaxed)
        wake.signal()
    }

    /// Runs each timer that is due (outside the confined access: a timer may schedule or cancel others).
    private func runDueTimers() {
        if confined.withValue({ $0.timers.isEmpty }) { return }  // no clock read on a turn without timers
        let now = MonotonicClock.nanoseconds()
        while let due = confined.withValue({ confined -> TimerHeap.Entry?? in
            guard let first = confined.timers.first, first.deadline <= now else {
                if confined.timers.isEmpty && !confined.cancelledTimers.isEmpty { confined.cancelledTimers.removeAll() }
                return nil
            }
            let entry = confined.timers.removeFirst()
            return confined.cancelledTimers.remove(entry.id) != nil ? .some(nil) : .some(entry)
        }) {
            due?.block()
        }
    }
}

/// A binary min-heap of timers ordered by deadline (then by id, so equal deadlines fire in scheduling order).
struct TimerHeap {
    struct Entry {
        var deadline: UInt64
        var id: UInt64
        var block: () -> Void
        func precedes(_ other: Entry) -> Bool {
            deadline < other.deadline || (deadline == other.deadline && id < other.id)
        }
    }
    private var entries: [Entry] = []

    var isEmpty: Bool { entries.isEmpty }
    var first: Entry? { entries.first }

    mutating func insert(_ entry: Entry) {
        entries.append(entry)
        var child = entries.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard entries[child].precedes(entries[parent]) else { break }
            entries.swapAt(child, parent)
            child = parent
        }
    }

    mutating func removeFirst() -> Entry {
        let first = entries[0]
        let last = entries.removeLast()
        if !entries.isEmpty {
            entries[0] = last
            var parent = 0
            while true {
                let left = 2 * parent + 1
                let right = left + 1
                var smallest = parent
                if left < entries.count && entries[left].precedes(entries[smallest]) { smallest = left }
                if right < entries.count && entries[right].precedes(entries[smallest]) { smallest = right }
                if smallest == parent { break }
                entries.swapAt(parent, smallest)
                parent = smallest
            }
        }
        return first
    }
}
