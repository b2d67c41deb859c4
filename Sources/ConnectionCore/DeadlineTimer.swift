import Glibc
import Synchronization

/// The process's timer for deadlines and timeouts (``DeadlineClock/continuous``): one thread, a min-heap of
/// deadlines, and waits that, cancelled, end at once and hold nothing until their deadline.
///
/// It exists because `Task.sleep` does not let go when cancelled: the sleeping task's wake-up stays scheduled on the
/// global executor until the deadline, with the task's memory (measured: 10,000 cancelled 5 s sleeps held 7.3 MB for
/// 5 s, about 730 bytes each). Every TLS and WebSocket handshake is bounded by a deadline that is cancelled as soon as
/// the handshake succeeds, so a server under a churn of connections held about 1 KiB per connection for 10 s (TLS)
/// or 5 s (WebSocket) after each one ended: memory in proportion to the connection rate times the timeout. Here a
/// cancelled wait is taken out of the timer at once (its entry is dropped; a 16-byte heap slot waits to be swept).
package final class DeadlineTimer: @unchecked Sendable {
    package static let shared = DeadlineTimer()

    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let condition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    // Guarded by `mutex`.
    private var heap: [(deadline: UInt64, id: UInt64)] = []
    private var actions: [UInt64: @Sendable () -> Void] = [:]
    private var nextID: UInt64 = 1
    private var threadStarted = false

    /// A timer of its own (for a test): it must live as long as the process, as its thread holds it unretained.
    package init() {
        pthread_mutex_init(mutex, nil)
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(condition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    /// CLOCK_MONOTONIC, nanoseconds.
    static func now() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) &* 1_000_000_000 &+ UInt64(time.tv_nsec)
    }

    /// Runs `action` on the timer's thread after `delay` (keep it short: hand real work to a task). Returns the id
    /// that ``cancel(_:)`` takes.
    package func schedule(after delay: Duration, _ action: @escaping @Sendable () -> Void) -> UInt64 {
        let deadline =
            Self.now() &+ UInt64(clamping: max(0, delay.components.seconds) * 1_000_000_000)
            &+ UInt64(clamping: max(0, delay.components.attoseconds / 1_000_000_000))
        pthread_mutex_lock(mutex)
        let id = nextID
        nextID += 1
        actions[id] = action
        push((deadline, id))
        if !threadStarted {
            threadStarted = true
            startThread()
        }
        // A new earliest deadline: the thread waits for a later one, so wake it.
        if heap[0].id == id { pthread_cond_signal(condition) }
        pthread_mutex_unlock(mutex)
        return id
    }

    /// Takes the action out before it runs (its captures are released now). `false` when it ran, or is running.
    @discardableResult
    package func cancel(_ id: UInt64) -> Bool {
        pthread_mutex_lock(mutex)
        let removed = actions.removeValue(forKey: id) != nil
        // Cancelled entries are swept once they are most of the heap, so it stays in proportion to the waits alive.
        if heap.count > 64 && heap.count > 2 * actions.count {
            heap = heap.filter { actions[$0.id] != nil }
            for index in stride(from: heap.count / 2 - 1, through: 0, by: -1) { siftDown(index) }
        }
        pthread_mutex_unlock(mutex)
        return removed
    }

    /// Waits (and the timer entries alive), for a test.
    package var pending: (actions: Int, heap: Int) {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return (actions.count, heap.count)
    }

    /// Waits `duration` on the shared timer; throws `CancellationError` at once when the task is cancelled.
    package static func sleep(for duration: Duration) async throws {
        try await shared.sleep(for: duration)
    }

    /// Waits `duration` on this timer; throws `CancellationError` at once when the task is cancelled.
    package func sleep(for duration: Duration) async throws {
        let wait = Wait(timer: self)
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                wait.start(continuation, after: duration)
            }
        } onCancel: {
            wait.cancel()
        }
    }

    /// One wait: started (its continuation and timer entry), then fired or cancelled, once.
    private final class Wait: @unchecked Sendable {
        private enum State {
            case new
            case waiting(CheckedContinuation<Void, any Error>, id: UInt64)
            case over
        }
        private let lock = Guarded(State.new)
        private let timer: DeadlineTimer

        init(timer: DeadlineTimer) { self.timer = timer }

        func start(_ continuation: CheckedContinuation<Void, any Error>, after duration: Duration) {
            let cancelledFirst = lock.withLock { state -> Bool in
                guard case .new = state else { return true }
                // The entry is made under the wait's lock, so a cancel that comes now finds it.
                let id = timer.schedule(after: duration) { [self] in fire() }
                state = .waiting(continuation, id: id)
                return false
            }
            if cancelledFirst { continuation.resume(throwing: CancellationError()) }
        }

        private func fire() {
            let continuation = lock.withLock { state -> CheckedContinuation<Void, any Error>? in
                guard case .waiting(let continuation, _) = state else { return nil }
                state = .over
                return continuation
            }
            continuation?.resume()
        }

        func cancel() {
            let taken = lock.withLock { state -> (CheckedContinuation<Void, any Error>, UInt64)? in
                switch state {
                case .new:
                    state = .over
                    return nil
                case .waiting(let continuation, let id):
                    state = .over
                    return (continuation, id)
                case .over:
                    return nil
                }
            }
            guard let (continuation, id) = taken else { return }
            timer.cancel(id)
            continuation.resume(throwing: CancellationError())
        }
    }

    // MARK: The thread

    private func startThread() {
        var thread = pthread_t()
        let context = Unmanaged.passUnretained(self).toOpaque()  // a timer lives as long as the process
        let created = pthread_create(
            &thread, nil,
            { context in
                Unmanaged<DeadlineTimer>.fromOpaque(context!).takeUnretainedValue().run()
                return nil
            }, context)
        precondition(created == 0, "cannot start the deadline timer's thread (pthread_create: \(created))")
        pthread_detach(thread)
    }

    private func run() {
        pthread_mutex_lock(mutex)
        while true {
            // Cancelled entries at the top are dropped on the way.
            while let top = heap.first, actions[top.id] == nil { pop() }
            guard let top = heap.first else {
                pthread_cond_wait(condition, mutex)
                continue
            }
            let now = Self.now()
            if top.deadline > now {
                var until = timespec(
                    tv_sec: Int(top.deadline / 1_000_000_000), tv_nsec: Int(top.deadline % 1_000_000_000))
                pthread_cond_timedwait(condition, mutex, &until)
                continue
            }
            pop()
            let action = actions.removeValue(forKey: top.id)
            pthread_mutex_unlock(mutex)
            action?()
            pthread_mutex_lock(mutex)
        }
    }

    // MARK: The heap (under `mutex`)

    private func push(_ entry: (deadline: UInt64, id: UInt64)) {
        heap.append(entry)
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard heap[child].deadline < heap[parent].deadline else { break }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    private func pop() {
        let last = heap.removeLast()
        guard !heap.isEmpty else { return }
        heap[0] = last
        siftDown(0)
    }

    private func siftDown(_ start: Int) {
        var parent = start
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var smallest = parent
            if left < heap.count && heap[left].deadline < heap[smallest].deadline { smallest = left }
            if right < heap.count && heap[right].deadline < heap[smallest].deadline { smallest = right }
            guard smallest != parent else { return }
            heap.swapAt(parent, smallest)
            parent = smallest
        }
    }
}
