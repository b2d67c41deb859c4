// URLSessionWebSocketTask and its delegate, ported (docs/porting-from-apple.md). The Darwin code this replaces:
//
//     let task = session.webSocketTask(with: url)      // session with a URLSessionWebSocketDelegate
//     task.resume()                                     // didOpenWithProtocol comes later
//     task.send(.string("hello")) { error in ... }
//     task.receive { result in ... }                    // once per message, called again by hand
//     task.sendPing { error in ... }
//     task.cancel(with: .goingAway, reason: nil)        // didCloseWith comes later
//
// Here every callback is an `await`. It sends --messages text messages to an echo server, checks each echo,
// pings, and closes with going-away; it exits non-zero when anything differs.
//
//     swift run sockbench serve ws://127.0.0.1:9000 --backend async &
//     swift run WebSocketTaskPort ws://127.0.0.1:9000 --backend uv --messages 3
import Glibc
import SocketStyles

@main
struct WebSocketTaskPort {
    static func main() async {
        do {
            try await run()
        } catch {
            print("websocket-task: \(error)")
            exit(1)
        }
    }

    static func run() async throws {
        let arguments = Array(CommandLine.arguments.dropFirst())
        let url = arguments.first { !$0.hasPrefix("--") } ?? "ws://127.0.0.1:9000"
        let backend = try Backend(name: option("--backend", in: arguments) ?? "async")
        let count = Int(option("--messages", in: arguments) ?? "") ?? 3

        // resume(): connect, and return once the handshake is done (didOpenWithProtocol has happened).
        let task = try await backend.connectWebSocket(to: try Endpoint(url: url))
        // The delegate: open and close as events, in order, on one sequence.
        let delegate = Task {
            for await event in task.events {
                switch event {
                case .opened(let subprotocol): print("didOpenWithProtocol: \(subprotocol ?? "none")")
                case .closed(let code, let reason):
                    print("didCloseWith: \(code.map { "\($0)" } ?? "no code") \(reason)")
                case .ping, .pong: break  // shown only with WebSocketOptions.reportsControlFrames
                }
            }
        }

        for number in 1...count {
            // send(_:completionHandler:): returns once the frame is handed to the socket, or throws.
            try await task.send(.text("message \(number)"))
            // receive(completionHandler:): one message; no need to call it again from inside a callback.
            guard let reply = try await task.receive() else { throw ConnectionError(.closed, "the server closed") }
            switch reply.kind {
            case .text: print("received string: \(reply.text ?? "")")
            case .binary: print("received data: \(reply.bytes.count) bytes")
            }
            guard reply.text == "message \(number)" else { throw ConnectionError(.protocolViolation, "wrong echo") }
        }
        // sendPing(pongReceiveHandler:): returns when the pong arrives; throws .timedOut past pongDeadline.
        try await task.sendPing()
        print("pong received")
        // cancel(with:reason:): sends the close frame and waits (bounded) for the server's.
        await task.close(code: .goingAway, reason: "done")
        await delegate.value
        print("ok: \(count) messages echoed over \(backend)")
    }

    static func option(_ name: String, in arguments: [String]) -> String? {
        guard let index = arguments.firstIndex(of: name), index + 1 < arguments.count else { return nil }
        return arguments[index + 1]
    }
}
