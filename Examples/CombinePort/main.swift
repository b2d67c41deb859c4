// The Combine wrappers of the seed apps, ported (docs/porting-from-apple.md). The Darwin code this replaces
// wraps URLSessionWebSocketTask or NWConnection in subjects by hand:
//
//     let received = PassthroughSubject<String, Never>()
//     func receive() { task.receive { result in
//         if case .success(.string(let text)) = result { received.send(text) }; receive() } }
//     received.receive(on: DispatchQueue.main).sink { text in ... }.store(in: &cancellables)
//
// SocketStylesCombine gives the publishers (`messagePublisher`, `statePublisher`, `sendPublisher`) and re-exports
// OpenCombine, the Combine API on Linux. The subject stays, fed by `messagePublisher`, so the rest of the app
// is unchanged. The state and message publishers are separate sequences with no order between them: act on
// `.ready` from `statePublisher`, as here, not on the order two sinks print in. Exits non-zero on a wrong echo.
//
//     swift run sockbench serve ws://127.0.0.1:9000 --backend async &
//     swift run CombinePort ws://127.0.0.1:9000 --backend runloop --messages 3
import Glibc
import SocketStyles
import SocketStylesCombine

@main
struct CombinePort {
    static func main() async {
        do {
            try await run()
        } catch {
            print("combine: \(error)")
            exit(1)
        }
    }

    static func run() async throws {
        let arguments = Array(CommandLine.arguments.dropFirst())
        let url = arguments.first { !$0.hasPrefix("--") } ?? "ws://127.0.0.1:9000"
        let backend = try Backend(name: option("--backend", in: arguments) ?? "async")
        let count = Int(option("--messages", in: arguments) ?? "") ?? 3

        let connection = backend.connection(to: try Endpoint(url: url))
        let received = PassthroughSubject<String, Never>()
        var cancellables = Set<AnyCancellable>()
        // Bridges the sinks' callbacks (any thread) to this task.
        let (events, event) = AsyncStream.makeStream(of: String.self)

        connection.messagePublisher
            .compactMap(\.text)
            .sink(
                receiveCompletion: { completion in event.yield("completion: \(completion)") },
                receiveValue: { received.send($0) }
            )
            .store(in: &cancellables)
        received.sink { event.yield("received: \($0)") }.store(in: &cancellables)
        connection.statePublisher
            .sink { state in event.yield("state: \(state)") }
            .store(in: &cancellables)

        var echoed = 0
        var sent = false
        for await line in events {
            print(line)
            if line == "state: ready", !sent {
                sent = true
                // sendPublisher: one send per subscription, `()` then finished, or the error.
                for number in 1...count {
                    connection.sendPublisher(.text("message \(number)"))
                        .sink(
                            receiveCompletion: { if case .failure(let error) = $0 { event.yield("send: \(error)") } },
                            receiveValue: {}
                        )
                        .store(in: &cancellables)
                }
            }
            if line.hasPrefix("received: message ") { echoed += 1 }
            if line.hasPrefix("send: ") { throw ConnectionError(.closed, line) }
            if echoed == count { break }
        }
        // close() ends messagePublisher normally: `.finished`, not a failure.
        await connection.close()
        for await line in events {
            print(line)
            if line.hasPrefix("completion: ") {
                guard line == "completion: finished" else { throw ConnectionError(.protocolViolation, line) }
                break
            }
        }
        cancellables.removeAll()
        print("ok: \(echoed) messages through Combine over \(backend)")
    }

    static func option(_ name: String, in arguments: [String]) -> String? {
        guard let index = arguments.firstIndex(of: name), index + 1 < arguments.count else { return nil }
        return arguments[index + 1]
    }
}
