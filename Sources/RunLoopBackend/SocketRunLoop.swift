public import ConnectionCore
import Glibc
public import POSIXSupport
import Synchronization

/// A run loop of our own, over epoll, for the delegate style (Foundation's `RunLoop` on Linux cannot serve
/// sockets: no socket streams, stream delegates never fire, `perform` does not wake a sleeping loop).
///
/// - One run loop per thread: ``current`` is the calling thread's, made on first use.
/// - ``perform(_:)`` hands a block over from any thread; an eventfd wakes the loop.
/// - ``schedule(after:_:)`` sets a timer (a binary heap feeding `epoll_wait`'s timeout).
/// - ``run()`` turns until ``stop()``; ``run(until:)`` until a deadline, ``run(for:)`` for a duration.
/// - ``startThread(name:)`` makes a run loop that turns on a new thread of its own.
public final class SocketRunLoop: Sendable {
    /// The epoll loop underneath (also a `TaskExecutor`).
    public let loop: EpollLoop

    private init(name: String) throws(ConnectionError) {
        loop = try EpollLoop(name: name)
    }

    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        pthread_key_create(&key) { pointer in
            if let pointer { Unmanaged<SocketRunLoop>.fromOpaque(pointer).release() }
        }
        return key
    }()

    /// The calling thread's run loop (made on first use; it turns only while this thread calls ``run()``).
    public static var current: SocketRunLoop {
        if let existing = pthread_getspecific(key) {
            return Unmanaged<SocketRunLoop>.fromOpaque(existing).takeUnretainedValue()
        }
        guard let loop = try? SocketRunLoop(name: "runloop") else { fatalError("cannot create a run loop (epoll)") }
        pthread_setspecific(key, Unmanaged.passRetained(loop).toOpaque())
        return loop
    }

    /// Lets go of the calling thread's run loop, if ``current`` made one (it is freed, with its descriptors, once
    /// nothing else holds it). For a thread that lives on, or that must not leave the descriptors to its exit.
    public static func releaseCurrent() {
        guard let existing = pthread_getspecific(key) else { return }
        pthread_setspecific(key, nil)
        Unmanaged<SocketRunLoop>.fromOpaque(existing).release()
    }

    /// A run loop turning on a new thread of its own until ``stop()``.
    public static func startThread(name: String = "runloop") throws(ConnectionError) -> SocketRunLoop {
        let loop = try SocketRunLoop(name: name)
        PosixThread.spawnAndWait(
            name: name, started: { pthread_setspecific(key, Unmanaged.passRetained(loop).toOpaque()) }
        ) { loop.run() }
        return loop
    }

    /// `true` on the thread this run loop turns on.
    public var isCurrent: Bool { loop.inLoop }

    /// Runs `block` on the run loop's thread (from any thread; wakes the loop).
    public func perform(_ block: @escaping @Sendable () -> Void) {
        loop.perform(block)
    }

    /// Runs `block` on the run loop after `delay` (call on the run loop's thread).
    @discardableResult
    public func schedule(after delay: Duration, _ block: @escaping () -> Void) -> RunLoopTimer {
        RunLoopTimer(loop: loop, id: loop.schedule(after: delay, block))
    }

    /// Turns until ``stop()`` (call on the thread that owns this run loop).
    public func run() {
        loop.run(until: nil)
    }

    /// Turns for at most `duration`, or until ``stop()``.
    public func run(for duration: Duration) {
        loop.run(until: MonotonicClock.nanoseconds() + duration.wholeNanoseconds)
    }

    /// Turns until `deadline` passes, or until ``stop()``.
    public func run(until deadline: ContinuousClock.Instant) {
        run(for: ContinuousClock.now.duration(to: deadline))
    }

    /// Makes the current ``run()`` return after its turn (from any thread).
    public func stop() {
        loop.stop()
    }
}

/// A timer scheduled on a ``SocketRunLoop``.
public struct RunLoopTimer: Sendable {
    let loop: EpollLoop
    let id: UInt64

    /// Cancels the timer if it has not fired (call on the run loop's thread).
    public func invalidate() { loop.cancelTimer(id) }
}
