// A chat client as the seed apps write it with URLSessionWebSocketTask, on Linux and any backend: a receive
// loop, a ping every 10 s (keep-alive), reconnection with backoff when the server goes away, and a close with
// going-away and a reason. It sends --messages numbered lines, waits until it has heard them back from the room,
// and leaves.
//
//     swift run RoutingServer ws://127.0.0.1:9000/ &
//     swift run ChatClient ws://127.0.0.1:9000/chat --name alice --messages 3
import Glibc
import SocketStyles

@main
struct ChatClient {
    static func main() async {
        do {
            try await run()
        } catch {
            print("chat: \(error)")
            exit(1)
        }
    }

    static func run() async throws {
        let arguments = Array(CommandLine.arguments.dropFirst())
        let url = arguments.first { !$0.hasPrefix("--") } ?? "ws://127.0.0.1:9000/chat"
        let backend = try Backend(name: option("--backend", in: arguments) ?? "async")
        let name = option("--name", in: arguments) ?? "guest"
        let count = Int(option("--messages", in: arguments) ?? "") ?? 3

        let chat = ReconnectingConnection(
            backend: backend, endpoint: try Endpoint(url: url),
            webSocket: .with { $0.keepAliveInterval = .seconds(10) },
            policy: .with { $0.maximumAttempts = 5 })

        // NWConnection's stateUpdateHandler, as a sequence: preparing, ready, waiting(error) between attempts...
        let states = Task {
            for await state in chat.states { print("state: \(state)") }
        }

        // The receive loop: every message the room relays, ours included.
        let mine = Task {
            var heard = 0
            do {
                for try await message in chat.messages {
                    let text = message.text ?? "\(message.bytes.count) bytes"
                    print("received: \(text)")
                    if text.hasPrefix("\(name): ") { heard += 1 }
                    if heard == count { break }
                }
            } catch {
                print("receive failed: \(error)")
            }
            return heard
        }

        for number in 1...count {
            try await chat.send(.text("\(name): message \(number)"))  // queued while not yet connected
        }
        let heard = await mine.value

        await chat.close(code: .goingAway, reason: "\(name) is leaving")
        await states.value
        print("heard \(heard) of \(count) messages back")
        if heard != count { throw ConnectionError(.closed, "the room did not relay all of \(name)'s messages") }
    }

    static func option(_ name: String, in arguments: [String]) -> String? {
        guard let index = arguments.firstIndex(of: name), index + 1 < arguments.count else { return nil }
        return arguments[index + 1]
    }
}
