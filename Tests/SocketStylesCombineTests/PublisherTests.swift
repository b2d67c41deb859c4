import ConnectionCore
import ConnectionTestKit
import OpenCombine
import SocketStyles
import SocketStylesCombine
import Synchronization
import Testing

@Suite("OpenCombine publishers")
struct PublisherTests {
    /// What a sink saw, as a stream the test can await without polling.
    enum Seen: Sendable {
        case value(Message)
        case finished
        case failed(ConnectionError)
    }

    static func watch(_ publisher: AsyncSequencePublisher<ConnectionMessages>) -> (AsyncStream<Seen>, AnyCancellable) {
        let (stream, sink) = AsyncStream.makeStream(of: Seen.self)
        let cancellable = publisher.sink(
            receiveCompletion: { completion in
                switch completion {
                case .finished: sink.yield(.finished)
                case .failure(let error): sink.yield(.failed(error))
                }
                sink.finish()
            },
            receiveValue: { sink.yield(.value($0)) })
        return (stream, cancellable)
    }

    static func completion(
        of publisher: AnyPublisher<Void, ConnectionError>
    ) async -> Subscribers.Completion<ConnectionError> {
        let (stream, sink) = AsyncStream.makeStream(of: Subscribers.Completion<ConnectionError>.self)
        let cancellable = publisher.sink(receiveCompletion: { sink.yield($0) }, receiveValue: { _ in })
        var iterator = stream.makeAsyncIterator()
        let result = await iterator.next()!
        cancellable.cancel()
        return result
    }

    @Test(
        "sendPublisher sends, messagePublisher receives every byte back, and finishes when the peer ends",
        arguments: Backend.allCases, [Transport.tcp, .ws])
    func echo(backend: Backend, transport: Transport) async throws {
        try await SocketTest.run(timeLimit: .seconds(30)) {
            let server = try await EchoServer.start(backend, on: Endpoint(url: "\(transport)://127.0.0.1:0"))
            let connection = try await backend.connect(to: server.endpoint)
            let (seen, cancellable) = Self.watch(connection.messagePublisher)
            var sent: [UInt8] = []
            for number in 0..<3 {
                let message = Message(Array(repeating: UInt8(number), count: 1000))
                sent += message.bytes
                guard case .finished = await Self.completion(of: connection.sendPublisher(message)) else {
                    Issue.record("send \(number) failed")
                    return
                }
            }
            var received: [UInt8] = []
            var iterator = seen.makeAsyncIterator()
            while received.count < sent.count, case .value(let message) = await iterator.next() {
                received += message.bytes
            }
            #expect(received == sent)
            // The server ends the connection when we close our output (tcp) or close (ws): the publisher finishes.
            if transport == .tcp {
                try await connection.closeOutput()
                let end = await iterator.next()
                guard case .finished = end else {
                    Issue.record("expected .finished, got \(String(describing: end))")
                    return
                }
            }
            cancellable.cancel()
            await connection.close()
            await server.stop()
        }
    }

    /// A subscriber that asks for one message at a time and says when it has it.
    final class OneAtATime: Subscriber, @unchecked Sendable {
        typealias Input = Message
        typealias Failure = ConnectionError
        let got = Guarded<[Message]>([])
        // Set in receive(subscription:), which runs inside subscribe(_:) before the test goes on.
        nonisolated(unsafe) var subscription: (any Subscription)?
        let arrivals: AsyncStream<Int>.Continuation
        let stream: AsyncStream<Int>

        init() { (stream, arrivals) = AsyncStream.makeStream(of: Int.self) }

        func receive(subscription: any Subscription) {
            self.subscription = subscription
            subscription.request(.max(1))
        }

        func receive(_ input: Message) -> Subscribers.Demand {
            let count = got.withLock {
                $0.append(input)
                return $0.count
            }
            arrivals.yield(count)
            return .none  // the test asks for more itself
        }

        func receive(completion: Subscribers.Completion<ConnectionError>) { arrivals.finish() }

        func more() { subscription?.request(.max(1)) }
    }

    @Test("Demand drives receiving: one message per request, nothing taken ahead", arguments: Backend.allCases)
    func demand(backend: Backend) async throws {
        try await SocketTest.run(timeLimit: .seconds(30)) {
            let server = try await EchoServer.start(backend, on: Endpoint(url: "ws://127.0.0.1:0"))
            let connection = try await backend.connectWebSocket(to: server.endpoint)
            for number in 0..<3 { try await connection.send(.text("message \(number)")) }
            let subscriber = OneAtATime()
            connection.messagePublisher.subscribe(subscriber)
            var arrivals = subscriber.stream.makeAsyncIterator()
            #expect(await arrivals.next() == 1)
            // With no demand, the other two echoes stay with the connection: a receive gets the second one.
            let second = try await connection.receive()
            #expect(second?.text == "message 1")
            subscriber.more()
            #expect(await arrivals.next() == 2)
            #expect(subscriber.got.withLock { $0.map(\.text) } == ["message 0", "message 2"])
            subscriber.subscription?.cancel()
            await connection.close()
            await server.stop()
        }
    }

    @Test("statePublisher reports setup, preparing and ready, then cancelled after close")
    func states() async throws {
        try await SocketTest.run(timeLimit: .seconds(30)) {
            let server = try await EchoServer.start(.async, on: Endpoint(url: "ws://127.0.0.1:0"))
            let connection = ReconnectingConnection(backend: .async, endpoint: server.endpoint)
            let (stream, sink) = AsyncStream.makeStream(of: ConnectionState.self)
            let cancellable = connection.statePublisher.sink { state in
                sink.yield(state)
                if state == .cancelled { sink.finish() }
            }
            var seen: [ConnectionState] = []
            for await state in stream {
                seen.append(state)
                if state == .ready { await connection.close() }
            }
            #expect(seen == [.setup, .preparing, .ready, .cancelled])
            cancellable.cancel()
            await server.stop()
        }
    }
}
