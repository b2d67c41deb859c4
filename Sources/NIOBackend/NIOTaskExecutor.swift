import ConnectionCore
import NIOCore
import NIOPosix
import POSIXSupport
import Synchronization

/// A SwiftNIO event loop as a `TaskExecutor`, so a task that prefers it runs on the loop thread and is resumed
/// by channel events without a thread hop (what ``Connection/preferredExecutor`` is for; SwiftNIO 2.101 has no
/// such conformance of its own).
///
/// A job enqueued while a handler of ours delivers a read on the loop thread (``delivering(_:)``: a read resumes
/// the task waiting in a receive) is kept in a loop-local list and run when that delivery returns, still inside
/// the handler's `channelRead`: the task continues at once, as a native handler would, instead of going through
/// the loop's task queue (a lock, a closure allocated per job, and the run of the queue after the tick's
/// events). A job never runs inside `enqueue`. Any other job goes through `EventLoop.execute`.
final class EventLoopTaskExecutor: TaskExecutor, Sendable {
    let loop: any EventLoop
    /// Jobs made ready during a delivery, and whether one is in progress.
    private struct Collected {
        var jobs: [UnownedJob] = []
        var collecting = false
    }
    /// SwiftNIO's loop-bound box: touched on the loop thread only (each access checks).
    private let collected: NIOLoopBoundBox<Collected>

    init(_ loop: any EventLoop) {
        self.loop = loop
        collected = .makeBoxSendingValue(Collected(), eventLoop: loop)
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        // `collected` is only touched on the loop thread: test the thread first.
        if loop.inEventLoop
            && collected.withValue({ collected in
                guard collected.collecting else { return false }
                collected.jobs.append(job)
                return true
            })
        {
            return
        }
        loop.execute { [self] in job.runSynchronously(on: asUnownedTaskExecutor()) }
    }

    /// Runs `body` (a handler handing over what it read, on the loop thread), then the jobs it made ready and
    /// those they make ready in turn, before returning.
    func delivering<Result>(_ body: () -> Result) -> Result {
        let outermost = collected.withValue { collected in
            defer { collected.collecting = true }
            return !collected.collecting
        }
        guard outermost else { return body() }
        let result = body()
        var index = 0
        // Each job copied out first: it may enqueue more (an access to the list held across it would overlap).
        while let job = collected.withValue({ index < $0.jobs.count ? $0.jobs[index] : nil }) {
            job.runSynchronously(on: asUnownedTaskExecutor())
            index += 1
        }
        collected.withValue { collected in
            collected.jobs.removeAll(keepingCapacity: true)
            collected.collecting = false
        }
        return result
    }

    private static let executors = Guarded<[ObjectIdentifier: EventLoopTaskExecutor]>([:])

    /// One executor per loop.
    static func of(_ loop: any EventLoop) -> EventLoopTaskExecutor {
        executors.withLock { executors in
            let key = ObjectIdentifier(loop)
            if let executor = executors[key] { return executor }
            let executor = EventLoopTaskExecutor(loop)
            executors[key] = executor
            return executor
        }
    }
}
