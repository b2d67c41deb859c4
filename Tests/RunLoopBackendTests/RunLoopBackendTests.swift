import BSDSocketBackend
import ConnectionCore
import ConnectionTestKit
import POSIXSupport
import RunLoopBackend
import Synchronization
import Testing

/// Records every delegate event as "in.event" / "out.event", and reads or writes only when told.
final class Recorder: SocketStreamDelegate, @unchecked Sendable {
    let events = Guarded<[String]>([])
    var input: SocketInputStream?
    var output: SocketOutputStream?

    func stream(_ stream: SocketStream, handle event: StreamEvent) {
        let name = stream === input ? "in" : "out"
        events.withLock { $0.append("\(name).\(event)") }
    }

    var recorded: [String] { events.withLock { $0 } }
}

@Suite("run-loop backend", .timeLimit(.minutes(20)))
struct RunLoopBackendTests {
    let runLoop: SocketRunLoop

    init() throws {
        runLoop = RunLoopBackend.shared.runLoop
    }

    /// Runs `body` on the run loop's thread and returns its result.
    func onLoop<R: Sendable>(_ body: @escaping @Sendable () -> R) async -> R {
        await withCheckedContinuation { continuation in runLoop.perform { continuation.resume(returning: body()) } }
    }

    /// Waits (one run-loop turn at a time) until `recorder` has at least `count` events.
    func waitForEvents(_ recorder: Recorder, _ count: Int) async {
        while recorder.recorded.count < count { _ = await onLoop { 0 } }
    }

    @Test("Delegate events come in Darwin's order: connect, read, write, peer close")
    func eventOrder() async throws {
        try await SocketTest.run {
            let server = try BSDSocket.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let endpoint = try server.localAddress.endpoint(.tcp)
            let recorder = Recorder()
            await onLoop { [runLoop] in
                let (input, output) = getStreamsToHost(endpoint)
                recorder.input = input
                recorder.output = output
                input.delegate = recorder
                output.delegate = recorder
                input.schedule(in: runLoop)
                output.schedule(in: runLoop)
                input.open()
                output.open()
            }
            let peer = try server.accept()
            await waitForEvents(recorder, 3)
            #expect(recorder.recorded == ["in.openCompleted", "out.openCompleted", "out.hasSpaceAvailable"])

            // Data arrives: one hasBytesAvailable, and no more until the delegate reads, however much comes.
            try peer.sendAll(Array("abc".utf8))
            await waitForEvents(recorder, 4)
            try peer.sendAll(Array("def".utf8))
            _ = await onLoop { 0 }
            _ = await onLoop { 0 }
            #expect(recorder.recorded.last == "in.hasBytesAvailable")
            #expect(recorder.recorded.count == 4)

            // The familiar pattern: read while bytes are available. Reading re-arms the event.
            let read: [UInt8] = await onLoop {
                var bytes: [UInt8] = []
                while recorder.input!.hasBytesAvailable { bytes += recorder.input!.read(maxLength: 2) }
                return bytes
            }
            #expect(read == Array("abcdef".utf8))
            try peer.sendAll(Array("g".utf8))
            await waitForEvents(recorder, 5)
            #expect(recorder.recorded[4] == "in.hasBytesAvailable")

            // Writing re-arms hasSpaceAvailable; a write may be partial and returns its count.
            let written = await onLoop { recorder.output!.write(Array("xyz".utf8)) }
            #expect(written == 3)
            await waitForEvents(recorder, 6)
            #expect(recorder.recorded[5] == "out.hasSpaceAvailable")
            #expect(try peer.receive(maximumLength: 3) == Array("xyz".utf8))

            // The peer closes: after the last bytes are read, endEncountered, once.
            peer.close()
            let rest: [UInt8] = await onLoop { recorder.input!.read(maxLength: 10) }
            #expect(rest == Array("g".utf8))
            await waitForEvents(recorder, 7)
            #expect(recorder.recorded[6] == "in.endEncountered")
            let status = await onLoop { recorder.input!.streamStatus }
            #expect(status == .atEnd)
            _ = await onLoop { 0 }
            #expect(recorder.recorded.filter { $0 == "in.endEncountered" }.count == 1)

            await onLoop {
                recorder.input!.close()
                recorder.output!.close()
            }
            server.close()
        }
    }

    @Test("A refused connect gives errorOccurred once per stream, with the error readable")
    func errorEvent() async throws {
        try await SocketTest.run {
            let refusing = try RefusingPort()
            defer { refusing.close() }
            let endpoint = try refusing.endpoint(.tcp)
            let recorder = Recorder()
            await onLoop { [runLoop] in
                let (input, output) = getStreamsToHost(endpoint)
                recorder.input = input
                recorder.output = output
                input.delegate = recorder
                output.delegate = recorder
                input.schedule(in: runLoop)
                output.schedule(in: runLoop)
                input.open()
                output.open()
            }
            await waitForEvents(recorder, 2)
            _ = await onLoop { 0 }
            #expect(recorder.recorded == ["in.errorOccurred", "out.errorOccurred"])
            let (status, kind) = await onLoop { (recorder.input!.streamStatus, recorder.input!.streamError?.kind) }
            #expect(status == .error)
            #expect(kind == .refused)
            await onLoop {
                recorder.input!.close()
                recorder.output!.close()
            }
        }
    }

    @Test("perform from another thread wakes a sleeping run loop; timers fire in order")
    func performAndTimers() async throws {
        try await SocketTest.run {
            let order = Guarded<[Int]>([])
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                runLoop.perform { [runLoop] in
                    runLoop.schedule(after: .milliseconds(20)) { order.withLock { $0.append(2) } }
                    runLoop.schedule(after: .milliseconds(10)) { order.withLock { $0.append(1) } }
                    let cancelled = runLoop.schedule(after: .milliseconds(5)) { order.withLock { $0.append(99) } }
                    cancelled.invalidate()
                    runLoop.schedule(after: .milliseconds(30)) {
                        order.withLock { $0.append(3) }
                        continuation.resume()
                    }
                }
            }
            #expect(order.withLock { $0 } == [1, 2, 3])
        }
    }

    @Test("A run loop of the calling thread runs for a while and stops")
    func currentRunLoop() async throws {
        try await SocketTest.run {
            let ran: Bool = try await withCheckedThrowingContinuation { continuation in
                PosixThread.spawn(name: "own-runloop") {
                    let fired = {
                        let loop = SocketRunLoop.current
                        nonisolated(unsafe) var fired = false
                        loop.schedule(after: .milliseconds(5)) {
                            fired = true
                            loop.stop()
                        }
                        loop.run(for: .seconds(10))
                        return fired
                    }()
                    // Free it (and its epoll and eventfd descriptors) now, not at thread exit, which may come
                    // after the descriptor count.
                    SocketRunLoop.releaseCurrent()
                    continuation.resume(returning: fired)
                }
            }
            #expect(ran)
        }
    }
}
