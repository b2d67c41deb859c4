import ConnectionCore
import ConnectionTestKit
import POSIXSupport
import SocketStyles
import Synchronization
import Testing

/// `Connection.sendsFromAnyThread` is a promise: a send from a thread other than the connection's own makes its
/// system call there, with no hand-over. Checked by keeping the connection's executor busy: a connection that
/// handed the datagram to its loop would send it only once the loop was free again.
@Suite("Sends from any thread", .timeLimit(.minutes(20)))
struct SendFromAnyThreadTests {
    @Test(
        "A connection that sends from any thread sends while its own executor is busy",
        arguments: ConformanceCase.withSockets.filter { $0.transport == .tcp || $0.transport == .udp })
    func sendsWhileItsExecutorIsBusy(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let listening = try BSDSocket.listen(on: try Endpoint(url: "\(test.transport)://127.0.0.1:0"))
            defer { listening.close() }
            let client = try await test.connect(to: try listening.localAddress.endpoint(test.transport))
            let peer = test.transport == .tcp ? try listening.accept() : listening
            defer { if peer !== listening { peer.close() } }
            guard client.sendsFromAnyThread, let executor = client.preferredExecutor else {
                await client.close()
                return
            }
            // The executor's thread waits on an eventfd (for at most 20 s) until the test releases it.
            let release = try WakeEvent()
            defer { release.close() }
            let deadline = MonotonicClock.nanoseconds() + 20_000_000_000
            let busy = Guarded<Task<Void, Never>?>(nil)
            await withCheckedContinuation { (started: CheckedContinuation<Void, Never>) in
                busy.withLock {
                    $0 = Task(executorPreference: executor) {
                        started.resume()
                        _ = release.ifOpen { Syscall.waitReadable($0, untilMonotonic: deadline) }
                    }
                }
            }
            let sending = Task.detached { try await client.send([7, 8, 9]) }
            let arrived = try peer.withDescriptor {
                Syscall.waitReadable($0, untilMonotonic: MonotonicClock.nanoseconds() + 5_000_000_000)
            }
            #expect(arrived, "the bytes left only after the connection's executor was free")
            release.signal()
            await busy.withLock { $0 }?.value
            try await sending.value
            if arrived { #expect(try peer.receive() == [7, 8, 9]) }
            await client.close()
        }
    }
}
