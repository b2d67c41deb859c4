import ConnectionCore
import ConnectionTestKit
import Glibc
import POSIXSupport
import Synchronization
import Testing

@testable import BSDSocketBackend

/// The reader thread as an executor: wake-ups are never lost, jobs run on the reader thread, and once the reader
/// has ended, jobs still run (elsewhere).
@Suite("bsd reader executor", .timeLimit(.minutes(20)))
struct ReaderExecutorTests {
    final class Flag: Sendable {
        let value = Atomic<Bool>(false)
    }

    /// The reader's loop on a thread of its own, until `done`: run jobs, wait; then stop. Returns the thread's id
    /// and a stream that ends once the reader has stopped.
    static func startReader(
        _ executor: ReaderExecutor, until done: Flag
    ) async -> (thread: UInt, stopped: AsyncStream<Never>) {
        let (stopped, ended) = AsyncStream.makeStream(of: Never.self)
        let thread = await withCheckedContinuation { continuation in
            PosixThread.spawn(name: "reader-test") {
                continuation.resume(returning: UInt(pthread_self()))
                while !done.value.load(ordering: .acquiring) {
                    executor.runJobs()
                    try? executor.waitForJobs()
                }
                executor.stop()
                ended.finish()
            }
        }
        return (thread, stopped)
    }

    @Test("A wake-up that comes before the reader waits is kept: the wait returns at once")
    func wakeBeforeWait() async throws {
        try await SocketTest.run(timeLimit: .seconds(20)) {
            let executor = ReaderExecutor()
            executor.wake()
            // Returns (this test's time limit would end a wait that missed the wake-up).
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                PosixThread.spawn(name: "reader-test") {
                    continuation.resume(with: Result { () throws(ConnectionError) in try executor.waitForJobs() })
                }
            }
            executor.stop()
        }
    }

    @Test(
        "A job from another thread wakes the waiting reader and runs on the reader thread; after stop, jobs still run")
    func jobsRunOnTheReader() async throws {
        try await SocketTest.run(timeLimit: .seconds(20)) {
            let executor = ReaderExecutor()
            let done = Flag()
            let (reader, stopped) = await Self.startReader(executor, until: done)
            for _ in 0..<100 {
                let ranOn = await withTaskExecutorPreference(executor) { UInt(pthread_self()) }
                #expect(ranOn == reader)
            }
            done.value.store(true, ordering: .releasing)
            executor.wake()
            for await _ in stopped {}
            // The reader has stopped: the job goes to the global executor and still runs.
            let ranAfterStop = await withTaskExecutorPreference(executor) { true }
            #expect(ranAfterStop)
        }
    }

    @Test("A bsd connection holds one descriptor, its socket: no eventfd for its reader, at either end")
    func oneDescriptorPerConnection() async throws {
        try await SocketTest.run(timeLimit: .seconds(60)) {
            let backend = BSDBackend()
            let listener = try await backend.listen(
                on: try Endpoint(url: "tcp://127.0.0.1:0"), options: ConnectionOptions())
            let before = Syscall.openDescriptors()
            var connections: [any Connection] = []
            for _ in 0..<20 {
                connections.append(try await backend.connect(to: listener.localEndpoint, options: ConnectionOptions()))
                connections.append(try await listener.accept())
            }
            // Each reader has started and sleeps in its poll: a job wakes it and runs there.
            for connection in connections {
                try await connection.send([1])
            }
            for connection in connections {
                let echoed = try await withTaskExecutorPreference(connection.preferredExecutor) {
                    try await connection.receive(exactly: 1)
                }
                #expect(echoed == [1])
            }
            // Less Dispatch's timerfd, which comes and goes with sleeping tasks (SocketTest.ownedDescriptors).
            let added = Set(Syscall.openDescriptors()).subtracting(before).filter { !$0.hasSuffix("[timerfd]") }
            #expect(added.count == 40, "\(added.sorted())")
            #expect(added.allSatisfy { $0.contains("socket:") }, "\(added.sorted())")
            for connection in connections { await connection.close() }
            await listener.close()
        }
    }
}
