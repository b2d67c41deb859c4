import ConnectionCore
import Synchronization
import Testing

/// The shared half of every backend's receive path, tested without sockets.
@Suite("ReceiveQueue", .timeLimit(.minutes(10)))
struct ReceiveQueueTests {
    @Test("Elements come out in order; a clean end is reported exactly once")
    func orderAndEnd() async throws {
        let queue = ReceiveQueue<[UInt8]>.datagrams(capacity: 100)
        queue.push([1])
        queue.push([2, 2])
        queue.finish(.finished)
        #expect(try await queue.next() == [1])
        #expect(try await queue.next() == [2, 2])
        #expect(try await queue.next() == nil)
        await #expect(throws: ConnectionError.self) { try await queue.next() }
    }

    @Test("A byte stream splits a chunk for a smaller limit and keeps the rest")
    func splitting() async throws {
        let queue = ReceiveQueue<[UInt8]>.byteStream(capacity: 100)
        queue.push([1, 2, 3, 4, 5])
        #expect(try await queue.next(maximumLength: 2) == [1, 2])
        #expect(try await queue.next(maximumLength: 2) == [3, 4])
        #expect(try await queue.next(maximumLength: 2) == [5])
    }

    @Test("A waiting receiver gets the next push; receivers are served in call order")
    func waiters() async throws {
        let queue = ReceiveQueue<Int>(capacity: 10)
        let first = Task { try await queue.next() }
        // Let the first receiver register before the second: wait until it is parked.
        while queue.waitingReceivers < 1 { await Task.yield() }
        let second = Task { try await queue.next() }
        while queue.waitingReceivers < 2 { await Task.yield() }
        queue.push(1)
        queue.push(2)
        #expect(try await first.value == 1)
        #expect(try await second.value == 2)
    }

    @Test("Cancelling a waiting receiver returns .cancelled and loses nothing")
    func cancellation() async throws {
        let queue = ReceiveQueue<Int>(capacity: 10)
        let waiting = Task { () throws(ConnectionError) -> Int? in try await queue.next() }
        while queue.waitingReceivers < 1 { await Task.yield() }
        waiting.cancel()
        let result = await waiting.result
        guard case .failure(let error) = result else {
            Issue.record("expected cancellation, got \(result)")
            return
        }
        #expect((error as? ConnectionError)?.kind == .cancelled)
        queue.push(7)
        #expect(try await queue.next() == 7)
    }

    @Test("A task cancelled before it waits returns .cancelled at once")
    func alreadyCancelled() async throws {
        let queue = ReceiveQueue<Int>(capacity: 10)
        let task = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return try await queue.next()
        }
        await #expect(throws: ConnectionError.self) { try await task.value }
        queue.push(1)
        #expect(try await queue.next() == 1)
    }

    @Test("close() fails waiters and later receives, and returns what was queued")
    func close() async throws {
        let queue = ReceiveQueue<Int>(capacity: 10)
        queue.push(1)
        queue.push(2)
        #expect(queue.close() == [1, 2])
        let error = await #expect(throws: ConnectionError.self) { try await queue.next() }
        #expect(error?.kind == .closed)
        #expect(queue.push(3).accepted == false)
    }

    @Test("The producer is told when the queue is full and when there is room again")
    func backpressure() async throws {
        let signalled = Atomic<Int>(0)
        let queue = ReceiveQueue<[UInt8]>.byteStream(
            capacity: 10, onSpaceAvailable: { signalled.add(1, ordering: .relaxed) })
        #expect(queue.push([UInt8](repeating: 0, count: 6)).hasSpace)
        #expect(!queue.push([UInt8](repeating: 0, count: 6)).hasSpace)
        #expect(signalled.load(ordering: .relaxed) == 0)
        _ = try await queue.next()
        #expect(signalled.load(ordering: .relaxed) == 1)
        #expect(queue.hasSpace)
    }

    @Test("The space callback set after the queue was made (an owner's [weak self]) is the one called, once per wait")
    func backpressureCallbackSetLater() async throws {
        let signalled = Atomic<Int>(0)
        let queue = ReceiveQueue<[UInt8]>.byteStream(capacity: 10)
        queue.setOnSpaceAvailable { signalled.add(1, ordering: .relaxed) }
        #expect(!queue.push([UInt8](repeating: 0, count: 12)).hasSpace)
        #expect(try await queue.next(maximumLength: 4)?.count == 4)
        #expect(signalled.load(ordering: .relaxed) == 1)
        // Not full any more: taking more says nothing until the producer is held up again.
        #expect(try await queue.next(maximumLength: 4)?.count == 4)
        #expect(signalled.load(ordering: .relaxed) == 1)
        #expect(!queue.push([UInt8](repeating: 0, count: 8)).hasSpace)
        #expect(try await queue.next()?.count == 12)
        #expect(signalled.load(ordering: .relaxed) == 2)
    }

    @Test("A failure that does not end the stream is thrown once, then data flows again")
    func transientFailure() async throws {
        let queue = ReceiveQueue<Int>(capacity: 10)
        queue.pushFailure(ConnectionError(.refused))
        queue.push(5)
        let error = await #expect(throws: ConnectionError.self) { try await queue.next() }
        #expect(error?.kind == .refused)
        #expect(try await queue.next() == 5)
    }

    @Test("A read on the producer's thread: the surplus waits for the next receive; a drained source is not read")
    func directReads() async throws {
        let queue = ReceiveQueue<[UInt8]>.byteStream(capacity: 100)
        let reads = Atomic<Int>(0)
        // Everything the read brought comes out, the part beyond the limit at the next receive, with no read.
        let first = try await queue.next(maximumLength: 2) {
            reads.add(1, ordering: .relaxed)
            return .element([1, 2, 3, 4, 5], drained: false)
        }
        #expect(first == [1, 2])
        let rest = try await queue.next(maximumLength: 10) {
            reads.add(1, ordering: .relaxed)
            return .nothing
        }
        #expect(rest == [3, 4, 5])
        #expect(reads.load(ordering: .relaxed) == 1)
        // A short read: the next receive does not read, it waits for the producer.
        let short = try await queue.next(maximumLength: 10) {
            reads.add(1, ordering: .relaxed)
            return .element([6], drained: true)
        }
        #expect(short == [6])
        let waiting = Task {
            try await queue.next(maximumLength: 10) {
                reads.add(1, ordering: .relaxed)
                return .element([99], drained: true)
            }
        }
        while queue.waitingReceivers == 0 { await Task.yield() }
        #expect(reads.load(ordering: .relaxed) == 2)
        // The producer's read filled its buffer: the receive after it reads again.
        queue.push([7, 8], sourceDrained: false)
        #expect(try await waiting.value == [7, 8])
        let again = try await queue.next(maximumLength: 10) {
            reads.add(1, ordering: .relaxed)
            return .element([9], drained: true)
        }
        #expect(again == [9])
        #expect(reads.load(ordering: .relaxed) == 3)
    }
}
