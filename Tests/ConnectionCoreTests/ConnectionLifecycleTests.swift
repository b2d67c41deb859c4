import ConnectionCore
import Synchronization
import Testing

/// Every transition of the one connection lifecycle, with no socket: what each request gets in each state.
@Suite("connection lifecycle", .timeLimit(.minutes(1)))
struct ConnectionLifecycleTests {
    typealias Event = ConnectionLifecycle.Event
    typealias Action = ConnectionLifecycle.Action

    final class Record: Sendable {
        let bodies = Atomic<Int>(0)
        let order = Guarded<[String]>([])
        func body() { bodies.add(1, ordering: .relaxed) }
        func note(_ what: String) { order.withLock { $0.append(what) } }
        var seen: [String] { order.withLock { $0 } }
        var bodyCount: Int { bodies.load(ordering: .relaxed) }
    }

    /// A lifecycle taken through `events`, and the actions it returned.
    static func run(_ events: [Event]) -> (ConnectionLifecycle, [Action]) {
        var lifecycle = ConnectionLifecycle()
        let actions = events.map { lifecycle.handle($0) }
        return (lifecycle, actions)
    }

    @Test("Open: sends and receives proceed")
    func openProceeds() {
        let (lifecycle, actions) = Self.run([.send, .receive, .send])
        #expect(actions == [.proceed, .proceed, .proceed])
        #expect(lifecycle.isOpen)
    }

    @Test("Half-close: FIN once, later sends refused, receives still proceed, a second half-close does nothing")
    func halfClose() {
        let (lifecycle, actions) = Self.run([.closeOutput, .send, .receive, .closeOutput])
        #expect(actions[0] == .shutdownOutput)
        #expect(actions[1] == .refuse(.closed("the output was closed (half-close)")))
        #expect(actions[2] == .proceed)
        #expect(actions[3] == .none)
        #expect(lifecycle.isOpen && lifecycle.outputClosed)
    }

    @Test("Close: the first begins, a second waits, closeFinished completes once, a close after that does nothing")
    func closeOnce() {
        let (lifecycle, actions) = Self.run([
            .close, .close, .send, .receive, .closeOutput, .closeFinished, .closeFinished, .close,
        ])
        #expect(
            actions == [
                .beginClose, .waitForClose, .refuse(.closed()), .refuse(.closed()), .refuse(.closed()), .closeComplete,
                .none, .none,
            ])
        #expect(lifecycle.phase == .closed)
    }

    @Test("The peer's end is reported once, and not after a failure or a close")
    func peerEnd() {
        #expect(Self.run([.peerEnded, .peerEnded]).1 == [.reportEnd, .none])
        let failure = ConnectionError(.reset, "read")
        #expect(Self.run([.failed(failure), .peerEnded]).1 == [.reportFailure(failure), .none])
        #expect(Self.run([.close, .peerEnded]).1 == [.beginClose, .none])
        #expect(Self.run([.peerEnded, .send]).1 == [.reportEnd, .proceed], "a half-open connection still sends")
    }

    @Test("A failure is reported once; later sends and half-closes are refused with it")
    func failure() {
        let first = ConnectionError(.reset, "read")
        let second = ConnectionError(.timedOut, "keep-alive")
        let (lifecycle, actions) = Self.run([.failed(first), .failed(second), .send, .closeOutput, .close])
        #expect(actions == [.reportFailure(first), .none, .refuse(first), .refuse(first), .beginClose])
        #expect(lifecycle.failure == first)
    }

    @Test("Shared: every close returns after the one close finished; the first runs its body once")
    func sharedCloseWaitsForTheFirst() async {
        let life = SharedLifecycle()
        let record = Record()
        let (started, startedSink) = AsyncStream.makeStream(of: Void.self)
        let (release, releaseSink) = AsyncStream.makeStream(of: Void.self)
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await life.close {
                    record.body()
                    startedSink.yield()
                    for await _ in release { break }
                    record.note("body done")
                }
                record.note("first returned")
            }
            for await _ in started { break }
            group.addTask {
                await life.close { record.body() }
                record.note("second returned")
            }
            while life.closesWaiting == 0 { await Task.yield() }
            // The second close is waiting: it may not return before the body ends.
            #expect(record.seen.isEmpty)
            releaseSink.yield()
        }
        #expect(record.bodyCount == 1)
        let seen = record.seen
        #expect(seen.first == "body done")
        #expect(Set(seen.dropFirst()) == ["first returned", "second returned"])
        #expect(life.current.phase == .closed)
        await life.close { record.body() }
        #expect(record.bodyCount == 1, "a close after the close does nothing")
    }

    @Test("Shared: a close begun from deinit is the first; a later close waits for closeFinished")
    func beginWithoutWaiting() async {
        let life = SharedLifecycle()
        #expect(life.beginCloseWithoutWaiting())
        #expect(!life.beginCloseWithoutWaiting())
        #expect(!life.isOpen)
        let waiter = Task { await life.close { _ in Issue.record("a second close must not run its body") } }
        life.closeFinished()
        await waiter.value
        #expect(life.current.phase == .closed)
    }
}
