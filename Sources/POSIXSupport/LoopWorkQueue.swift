@_spi(Loop) package import ConnectionCore
import Glibc
import Synchronization

/// One item of work for a loop thread: a block, or a job of a task that prefers the loop as its executor.
package enum LoopWork: Sendable {
    case block(@Sendable () -> Void)
    case job(UnownedJob)

    /// Runs it on the calling (loop) thread; a job runs as `executor`.
    @inline(__always)
    package func run(as executor: UnownedTaskExecutor) {
        switch self {
        case .block(let block): block()
        case .job(let job): job.runSynchronously(on: executor)
        }
    }
}

/// The work queue and wake-up of a loop thread, written once for the package's loop executors (``EpollLoop``, the
/// bsd reader thread, the libuv loop).
///
/// Work added from another thread goes into a locked list, and the loop is signalled (an eventfd write) only when
/// it has said it is about to sleep (``prepareToSleep()``), and then once however much work comes; work the loop
/// thread adds itself goes into a list only that thread touches: no lock, no signal.
/// ``runAll(jobsAs:)`` swaps each list with a spare buffer that keeps its capacity, so a steady loop allocates
/// nothing. A job may wait in place for the loop's own events (a receive on bsd's reader thread blocks in the poll
/// the loop would make): ``hasUnrunWork`` tells it not to sleep while work the loop already took is still to run,
/// since one of those jobs may be the send its reply depends on.
///
/// Once ``close()`` has returned, ``add(_:)`` refuses work (the caller runs it elsewhere or drops it) and no signal
/// is in flight or sent again, so the caller may then release what `signal` writes to (bsd's reader and the libuv
/// loop close their eventfds).
package final class LoopWorkQueue: Sendable {
    private struct Shared {
        var items: [LoopWork] = []
        /// The loop said it is about to sleep: the next item added must signal it.
        var sleeping = false
        /// A ``wake()`` came while the loop was awake: its next ``prepareToSleep()`` says no.
        var wakePending = false
        var open = true
    }

    private struct Local {
        var items: [LoopWork] = []
        var spare: [LoopWork] = []
        /// Items of the batches being run that have not run yet (batches nest when a job runs the loop again).
        var unrun = 0
        /// Cleared by a ``close()`` on the loop thread.
        var open = true
        /// ``turn``.
        var turn: UInt32 = 0
        /// Run at the next ``prepareToSleep()`` (``beforeSleep(_:)``).
        var beforeSleep: [() -> Void] = []
    }

    private let shared = Guarded(Shared())
    private let local = LoopConfined(Local())
    private let signal: @Sendable () -> Void
    /// Signals decided under the lock and not yet finished: ``close()`` waits for them.
    private let signalsInFlight = Atomic<Int>(0)

    /// `signal` wakes the loop from another thread. It is called after the queue's lock is released: a woken loop
    /// thread on the same CPU may run at once, and must not find the lock still held by the thread that woke it
    /// (measured with `sockbench microbench perform --placement same`: p90 38 us with the signal under the lock,
    /// 6 us without; and in an open-loop run with a spinning pacer, the bsd reader spun in the lock's slow path
    /// while its holder waited for the CPU: 30 us per hand-over). ``close()`` waits for a signal already decided,
    /// so none reaches a target the caller releases after closing.
    package init(signal: @escaping @Sendable () -> Void) {
        self.signal = signal
    }

    /// Calls `signal` for a wake-up decided under the lock (counted there, so a ``close()`` after it waits).
    private func sendSignal() {
        signal()
        signalsInFlight.subtract(1, ordering: .releasing)
    }

    /// Makes the calling thread the loop thread (its adds are local from now on).
    package func bindToCurrentThread() { local.bindToCurrentThread() }

    /// The loop thread has ended: adds from any thread go through the locked list.
    package func unbind() { local.unbind() }

    /// `true` on the loop thread.
    package var isLoopThread: Bool { local.isOwnerThread }

    /// The loop's thread, for the state its objects confine to it (`LoopConfined`).
    package var thread: LoopThread { local.owner }

    /// Queues `work` for the loop: locally on the loop thread, otherwise in the locked list, signalling a loop that
    /// sleeps. Returns `false` once closed (the work is not taken).
    @discardableResult
    package func add(_ work: LoopWork) -> Bool {
        if local.isOwnerThread {
            return local.withValue { local in
                guard local.open else { return false }
                local.items.append(work)
                return true
            }
        }
        let (taken, wake) = shared.withLock { shared -> (Bool, Bool) in
            guard shared.open else { return (false, false) }
            shared.items.append(work)
            guard shared.sleeping else { return (true, false) }
            shared.sleeping = false
            signalsInFlight.add(1, ordering: .relaxed)
            return (true, true)
        }
        if wake { sendSignal() }
        return taken
    }

    /// Wakes the loop from any thread (to look at something other than work: a close, room in a queue). A loop that
    /// is awake is told by its next ``prepareToSleep()``.
    package func wake() {
        let wake = shared.withLock { shared -> Bool in
            guard shared.open else { return false }
            guard shared.sleeping else {
                shared.wakePending = true
                return false
            }
            shared.sleeping = false
            signalsInFlight.add(1, ordering: .relaxed)
            return true
        }
        if wake { sendSignal() }
    }

    /// Loop thread: work is queued locally, or taken in a batch and not run yet.
    package var hasUnrunWork: Bool {
        local.withValue { $0.unrun > 0 || !$0.items.isEmpty }
    }

    /// Loop thread: how many times the loop has asked to sleep (``prepareToSleep()``), wrapping. Work that runs
    /// between two asks runs in one turn, with no poll between: a connection's second send in a turn follows its
    /// first with nothing received in between, and gathers (`WriteThrough`).
    package var turn: UInt32 { local.withValue { $0.turn } }

    /// Loop thread: runs `block` once, the next time the loop asks to sleep, before the queue answers (work the
    /// block adds keeps the loop awake): a write of the sends a connection gathered in this turn.
    package func beforeSleep(_ block: @escaping () -> Void) {
        local.withValue { $0.beforeSleep.append(block) }
    }

    /// Loop thread, before it polls: starts a new ``turn`` and runs the blocks given to ``beforeSleep(_:)``.
    /// ``prepareToSleep()`` does it first; a loop that polls without asking to sleep calls it itself.
    package func endTurn() {
        let blocks = local.withValue { local -> [() -> Void] in
            local.turn &+= 1
            if local.beforeSleep.isEmpty { return [] }
            defer { local.beforeSleep = [] }
            return local.beforeSleep
        }
        for block in blocks { block() }
    }

    /// Loop thread, before it sleeps: `true` when it may (nothing queued, no wake-up pending, and ``add(_:)`` from
    /// now on signals it); `false` when it must look again at once. Ends the turn first (``endTurn()``).
    package func prepareToSleep() -> Bool {
        endTurn()
        if hasUnrunWork { return false }
        return shared.withLock { shared in
            guard shared.items.isEmpty, !shared.wakePending else {
                shared.wakePending = false
                return false
            }
            shared.sleeping = true
            return true
        }
    }

    /// Loop thread, after its sleep ended: adds no longer signal.
    package func awoke() {
        shared.withLock { $0.sleeping = false }
    }

    /// Loop thread: runs what the loop queued itself, then what other threads added, until neither has any left
    /// (work added by the work included). Jobs run as `executor`. Returns whether anything ran.
    @discardableResult
    package func runAll(jobsAs executor: UnownedTaskExecutor) -> Bool {
        var ranAny = false
        while true {
            let ranLocal = runBatch(fromLoopThread: true, executor)
            let ranShared = runBatch(fromLoopThread: false, executor)
            if !ranLocal && !ranShared { return ranAny }
            ranAny = true
        }
    }

    private func runBatch(fromLoopThread: Bool, _ executor: UnownedTaskExecutor) -> Bool {
        var batch = local.withValue { local in
            var batch: [LoopWork] = []
            swap(&batch, &local.spare)
            if fromLoopThread { swap(&batch, &local.items) }
            return batch
        }
        if !fromLoopThread { shared.withLock { swap(&$0.items, &batch) } }
        if batch.isEmpty {
            local.withValue { $0.spare = batch }
            return false
        }
        local.withValue { $0.unrun += batch.count }
        for work in batch {
            local.withValue { $0.unrun -= 1 }
            work.run(as: executor)
        }
        batch.removeAll(keepingCapacity: true)
        local.withValue { $0.spare = batch }
        return true
    }

    /// Refuses work from now on and returns what was added and not run (the loop's own list too, when called on
    /// the loop thread), once no signal is in flight. Returns `nil` when it was already closed.
    package func close() -> [LoopWork]? {
        let added: [LoopWork]? = shared.withLock { shared in
            guard shared.open else { return nil }
            shared.open = false
            defer { shared.items = [] }
            return shared.items
        }
        guard var added else { return nil }
        // A signal decided before the queue closed is between the lock and its write: a few instructions, so
        // yield the CPU to it (it may be waiting for this one) rather than sleep.
        while signalsInFlight.load(ordering: .acquiring) > 0 { sched_yield() }
        if local.isOwnerThread {
            added =
                local.withValue { local in
                    local.open = false
                    // Before-sleep blocks of a loop that will not sleep again (bsd's reader ends with its connection)
                    // are dropped: each holds its connection, which holds this queue, so one left here leaked both
                    // (a gathering buffer of 64 KiB with them: the churn test's bsd x wss server held 0.93 KiB a
                    // connection). A connection's close writes what it gathered itself.
                    local.beforeSleep = []
                    defer { local.items = [] }
                    return local.items
                } + added
        }
        return added
    }

    /// `false` once ``close()`` was called.
    package var isOpen: Bool { shared.withLock { $0.open } }

    // MARK: A thread that is a task executor

    /// A job for a loop thread that is a `TaskExecutor` (bsd's reader, the open-loop pacer): queued for it, or,
    /// once the queue is closed (the thread has ended), run by Swift's global executor, so no task is lost.
    package func enqueue(_ job: UnownedJob) {
        if !add(.job(job)) { globalConcurrentExecutor.enqueue(ExecutorJob(job)) }
    }

    /// The loop thread ends: closes the queue, unbinds the thread and hands the jobs it had not run to Swift's
    /// global executor (as ``enqueue(_:)`` does with later ones). Returns `false` when it was closed already.
    @discardableResult
    package func end() -> Bool {
        let left = close()
        unbind()
        guard let left else { return false }
        for case .job(let job) in left { globalConcurrentExecutor.enqueue(ExecutorJob(job)) }
        return true
    }
}
