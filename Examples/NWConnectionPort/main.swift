// NWConnection, ported (docs/porting-from-apple.md). The Darwin code this replaces:
//
//     let connection = NWConnection(host: "127.0.0.1", port: 9000, using: .tcp)
//     connection.stateUpdateHandler = { state in ... }  // preparing, ready, waiting, failed, cancelled
//     connection.start(queue: .main)
//     connection.send(content: data, completion: .contentProcessed { error in ... })
//     connection.receive(minimumIncompleteLength: 1, maximumLength: 65536) { data, _, isComplete, error in ... }
//     connection.cancel()
//
// `Backend.connection(to:)` gives the same object model: it starts connecting at once, reports NWConnection's
// states, queues sends made before `ready` (each send returns when its bytes went out, or throws the error
// that lost them), and does not reconnect. It works for tcp, udp, tls, ws and wss URLs alike; for ws and wss
// it also pings, as NWProtocolWebSocket's `.ping` metadata does. Exits non-zero when an echo differs.
//
//     swift run sockbench serve tcp://127.0.0.1:9000 --backend nio &
//     swift run NWConnectionPort tcp://127.0.0.1:9000 --backend bsd --messages 3
import Glibc
import SocketStyles

@main
struct NWConnectionPort {
    static func main() async {
        do {
            try await run()
        } catch {
            print("nwconnection: \(error)")
            exit(1)
        }
    }

    static func run() async throws {
        let arguments = Array(CommandLine.arguments.dropFirst())
        let url = arguments.first { !$0.hasPrefix("--") } ?? "tcp://127.0.0.1:9000"
        let backend = try Backend(name: option("--backend", in: arguments) ?? "async")
        let count = Int(option("--messages", in: arguments) ?? "") ?? 3

        // NWConnection(...) + start(queue:): connecting begins now.
        let connection = backend.connection(to: try Endpoint(url: url))
        // stateUpdateHandler, as a sequence (it ends after .cancelled).
        let states = Task {
            var seen: [ConnectionState] = []
            for await state in connection.states {
                print("state: \(state)")
                seen.append(state)
            }
            return seen
        }

        for number in 1...count {
            let text = "message \(number)"
            // send(content:completion: .contentProcessed): called before ready, it waits for the connection.
            try await connection.send(.text(text))
            // receive(minimumIncompleteLength:maximumLength:): a byte stream may split or join what was sent, so
            // read exactly the bytes expected; datagrams and WebSocket messages come whole.
            let reply =
                connection.transport.isByteStream
                ? try await connection.receive(exactly: text.utf8.count)
                : try await connection.receive()?.bytes
            guard let reply, reply == Array(text.utf8) else {
                throw ConnectionError(.protocolViolation, "wrong echo for \(text)")
            }
            print("received: \(String(decoding: reply, as: UTF8.self))")
        }
        if connection.transport == .ws || connection.transport == .wss {
            try await connection.sendPing(timeout: .seconds(5))
            print("pong received")
        }
        // cancel()
        await connection.close()
        let seen = await states.value
        guard seen.contains(.ready), seen.last == .cancelled else {
            throw ConnectionError(.protocolViolation, "unexpected states \(seen)")
        }
        print("ok: \(count) messages echoed over \(connection.transport) on \(backend)")
    }

    static func option(_ name: String, in arguments: [String]) -> String? {
        guard let index = arguments.firstIndex(of: name), index + 1 < arguments.count else { return nil }
        return arguments[index + 1]
    }
}
