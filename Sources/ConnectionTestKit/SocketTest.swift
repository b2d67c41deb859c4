import ConnectionCore
import Foundation
import POSIXSupport
public import SocketStyles
import Synchronization

/// Runs socket tests one at a time, each bounded in time and checked for leaked file descriptors.
///
/// Test runners run tests in parallel, which would make descriptor counts meaningless; every test that opens
/// sockets goes through ``run(timeLimit:_:)``, which serialises them on one async lock (tests without sockets
/// still run in parallel). `timeLimit` bounds a test's own time; a suite's `.timeLimit` also counts the wait for
/// the lock, which grows with every socket test of the run, so every suite of socket tests gives 20 minutes: the
/// process of all targets but the lessons took 472 s here and 617 s on a slower CI machine (2026-12-03), where
/// four suites that gave 10 minutes failed with 71 issues at 611-617 s, their tests still waiting for a turn.
public enum SocketTest {
    /// A test exceeded its time limit, or left descriptors open.
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
        public init(description: String) { self.description = description }
    }

    private static let lock = AsyncLock()

    /// Runs `body` alone among socket tests, within `timeLimit`, and fails if the process has more open
    /// descriptors afterwards than before (listing the new ones).
    public static func run<R: Sendable>(
        timeLimit: Duration = .seconds(60), _ body: @escaping @Sendable () async throws -> R
    ) async throws -> R {
        try await lock.withLock {
            warmUpProcessWideResources()
            let before = ownedDescriptors()
            let result = try await withTimeLimit(timeLimit, body)
            let after = ownedDescriptors()
            if after.count > before.count {
                let new = after.filter { !before.contains($0) }
                throw Failure(
                    description:
                        "\(after.count - before.count) file descriptor(s) left open: \(new.joined(separator: ", "))")
            }
            return result
        }
    }

    /// ``run(timeLimit:_:)`` for a test that must open no socket (protocol code over `MemoryConnection` or
    /// `MemoryBackend`): it also fails when the process's open sockets differ afterwards from before. Socket tests
    /// run one at a time under the same lock, so a socket that appears or goes meanwhile is this test's.
    public static func runWithoutSockets<R: Sendable>(
        timeLimit: Duration = .seconds(60), _ body: @escaping @Sendable () async throws -> R
    ) async throws -> R {
        try await run(timeLimit: timeLimit) {
            let before = openSockets()
            let result = try await body()
            let after = openSockets()
            guard after == before else {
                throw Failure(
                    description:
                        "a socket-free test changed the open sockets: before \(before.sorted()), after \(after.sorted())"
                )
            }
            return result
        }
    }

    /// The process's open socket descriptors (`N -> socket:[inode]`).
    static func openSockets() -> Set<String> {
        Set(Syscall.openDescriptors().filter { $0.contains("socket:") })
    }

    /// The open descriptors, less the concurrency runtime's timerfd: Dispatch opens it while a task sleeps
    /// (the time limit itself sleeps) and closes it on its own thread some time after, so it comes and goes
    /// independently of the code under test. No code of this package creates a timerfd. A descriptor whose
    /// target can no longer be read (`-> ?`) was closed while the directory was being listed: it is not open
    /// (a leaked one stays readable); seen once when that timerfd closed mid-listing. A source or a
    /// doc of this package (`.swift`, `.md`) is open only while a test that reads it runs in parallel: no code under
    /// test opens one, and counting it failed a socket test once, with `54 -> .../UringSocket.swift` left open by a
    /// source-scanning test of another suite (CI, 2026-12-04).
    static func ownedDescriptors() -> [String] {
        Syscall.openDescriptors().filter {
            !$0.hasSuffix("anon_inode:[timerfd]") && !$0.hasSuffix(" -> ?") && !isPackageText($0)
        }
    }

    private static func isPackageText(_ descriptor: String) -> Bool {
        descriptor.contains(" -> \(packageRoot)/") && (descriptor.hasSuffix(".swift") || descriptor.hasSuffix(".md"))
    }

    /// The package's directory (this file is in `Sources/ConnectionTestKit`).
    private static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().path

    private static let warmedUp = Guarded(false)
    private static let extraWarmUps = Guarded<[@Sendable () -> Void]>([])

    /// Registers something that lives as long as the process once made (a signal handler, a shared loop),
    /// to be made before the next test counts descriptors. Suites call this from their initialiser, which
    /// may run while another suite's test is counting: the work itself waits for the lock.
    /// How much looser a bound on resident memory is in this run: 8 under AddressSanitizer (its quarantine of
    /// freed memory and its redzones inflate RSS without any leak; `scripts/sanitize address` says it runs), 1
    /// otherwise. Bounds on bytes in flight and on descriptors stay as they are.
    public static var residentMemoryAllowance: Int {
        getenv("SOCKETSTYLES_SANITIZER").map { String(cString: $0) } == "address" ? 8 : 1
    }

    public static func addWarmUp(_ body: @escaping @Sendable () -> Void) {
        extraWarmUps.withLock { $0.append(body) }
    }

    /// Opens, once, what lives as long as the process by design, so that it is not counted as a test's leak:
    /// each backend's shared event loop (libuv's loop with its signal pipe and reserve descriptor, the run-loop
    /// and async reactors' epoll and eventfd) and Foundation's child-process monitor (a thread with its own
    /// run loop, started by the first `Process`).
    static func warmUpProcessWideResources() {
        for body in extraWarmUps.withLock({ list in
            defer { list.removeAll() }
            return list
        }) {
            body()
        }
        guard !warmedUp.withLock({ $0 }) else { return }
        startSanitizerSymbolizer()
        for backend in Backend.allCases { _ = backend.implementation }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/true")
        let exited = DispatchSemaphore(value: 0)
        process.terminationHandler = { _ in exited.signal() }
        if (try? process.run()) != nil { exited.wait() }
        warmedUp.withLock { $0 = true }
    }

    /// Under a sanitizer (`scripts/sanitize`), starts its symbolizer: llvm-symbolizer, a child process it talks to
    /// over a pipe pair, started the first time a stack is symbolized (under ThreadSanitizer, when a race is
    /// checked against the suppressions file) and kept for the rest of the process. Started in the middle of a
    /// test, its two pipes were counted as that test's leak (seen in the uring backend's first test, with
    /// `/usr/bin/llvm-symbolizer` running as a child of the test process). Nothing without a sanitizer: the
    /// runtime's entry point is looked up, not linked.
    private static func startSanitizerSymbolizer() {
        guard getenv("SOCKETSTYLES_SANITIZER") != nil, let process = dlopen(nil, RTLD_NOW),
            let entry = dlsym(process, "__sanitizer_symbolize_pc")
        else { return }
        typealias Symbolize =
            @convention(c) (
                UnsafeMutableRawPointer?, UnsafePointer<CChar>, UnsafeMutablePointer<CChar>, Int
            ) -> Void
        var text = [CChar](repeating: 0, count: 256)
        let count = text.count
        text.withUnsafeMutableBufferPointer {
            unsafeBitCast(entry, to: Symbolize.self)(entry, "%p %F %L", $0.baseAddress!, count)
        }
    }

    /// The number of open descriptors of this process.
    public static var openDescriptorCount: Int { Syscall.openDescriptorCount() }
}

/// Runs `body`, cancelling it and throwing ``SocketTest/Failure`` when it takes longer than `limit`.
///
/// On timeout this returns at once, without waiting for `body` to notice the cancellation: a body stuck in
/// something that ignores cancellation must fail its own test, not hold every later test behind it.
public func withTimeLimit<R: Sendable>(
    _ limit: Duration, _ body: @escaping @Sendable () async throws -> R
) async throws -> R {
    let race = TimeLimitRace()
    return try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<R, any Error>) in
        let task = Task {
            let result: Result<R, any Error>
            do {
                result = .success(try await body())
            } catch {
                result = .failure(error)
            }
            if race.decided.claim() {
                race.timer.withLock { $0 }?.cancel()
                continuation.resume(with: result)
            }
        }
        race.work.withLock { $0 = task }
        let sleeper = Task {
            try? await Task.sleep(for: limit)
            if !Task.isCancelled, race.decided.claim() {
                race.work.withLock { $0 }?.cancel()
                continuation.resume(throwing: SocketTest.Failure(description: "time limit of \(limit) exceeded"))
            }
        }
        race.timer.withLock { $0 = sleeper }
        if race.decided.isClaimed { sleeper.cancel() }
    }
}

/// Who finished first in ``withTimeLimit(_:_:)``, and the two tasks racing.
private final class TimeLimitRace: Sendable {
    let decided = OnceFlag()
    let work = Guarded<Task<Void, Never>?>(nil)
    let timer = Guarded<Task<Void, Never>?>(nil)
}

/// Runs bodies one at a time, in arrival order, on ConnectionCore's ``AsyncGate``.
final class AsyncLock: Sendable {
    private let gate = AsyncGate()

    func withLock<R: Sendable>(_ body: () async throws -> R) async throws -> R {
        await gate.enter()
        defer { gate.leave() }
        return try await body()
    }
}

/// Runs blocking work (a child process's output, its exit) on a thread of its own, off Swift's cooperative pool.
public func blocking<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    let result = await withCheckedContinuation { (continuation: CheckedContinuation<Result<T, any Error>, Never>) in
        PosixThread.spawn(name: "test-blocking") { continuation.resume(returning: Result { try body() }) }
    }
    return try result.get()
}

/// Sends `chunk` again and again until one send has not finished after `wait` (the peer's back pressure reached
/// the sender: that send is left to fail when the connection closes) or `limit` bytes went in. Returns the bytes
/// that went in and whether a send was held back.
public func sendUntilHeldBack(
    _ connection: any Connection, chunk: [UInt8], limit: Int, wait: Duration
) async throws -> (sent: Int, heldBack: Bool) {
    var sent = 0
    while sent < limit {
        do {
            try await withTimeLimit(wait) { try await connection.send(chunk) }
        } catch is SocketTest.Failure {
            return (sent, true)
        }
        sent += chunk.count
    }
    return (sent, false)
}
