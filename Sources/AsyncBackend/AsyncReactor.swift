public import ConnectionCore
public import POSIXSupport

/// The reactor of the async style: one thread running an `EpollLoop`. Sockets register their descriptor once
/// (edge-triggered); the reactor resumes the task waiting for readiness. It is also a `TaskExecutor`: a task
/// that prefers it runs on the reactor thread, where readiness resumes it without a thread hop.
public final class AsyncReactor: TaskExecutor, Sendable {
    /// The epoll loop.
    public let loop: EpollLoop

    /// The process-wide reactor used by default.
    public static let shared: AsyncReactor = {
        do {
            return try AsyncReactor(name: "async-reactor")
        } catch {
            fatalError("cannot start the async reactor: \(error)")
        }
    }()

    /// Starts a reactor thread.
    public init(name: String) throws(ConnectionError) {
        loop = try EpollLoop(name: name)
        // Jobs run as the reactor, the executor tasks name in their preference (see `EpollLoop.runJobs(as:)`).
        loop.runJobs(as: asUnownedTaskExecutor())
        loop.startThread()
    }

    public func enqueue(_ job: consuming ExecutorJob) {
        loop.enqueue(job)
    }
}
