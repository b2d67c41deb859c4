// A WebSocket server that routes by path, as a CFSocket or NWListener server would: `/echo` sends every message
// back, `/chat` relays each message to everyone in the room, and any other path is refused with 404 before the
// upgrade. One task per client, on the executor where that client's I/O completes.
//
//     swift run RoutingServer ws://127.0.0.1:9000/ --backend async
import SocketStyles

@main
struct RoutingServer {
    static func main() async throws {
        let arguments = Array(CommandLine.arguments.dropFirst())
        let url = arguments.first { !$0.hasPrefix("--") } ?? "ws://127.0.0.1:9000/"
        let backend = try Backend(name: option("--backend", in: arguments) ?? "async")

        // The endpoint's path is "/": every path reaches `decide`, which routes.
        let listener = try await backend.listenWebSocket(on: Endpoint(url: url)) { request in
            switch request.path {
            case "/echo", "/chat": .accept
            default: .refuse(status: 404, reason: "Not Found")
            }
        }
        print("listening on \(listener.localEndpoint)")

        let room = ChatRoom()
        await withDiscardingTaskGroup { group in
            while let client = try? await listener.acceptWebSocket() {
                group.addTask(executorPreference: client.preferredExecutor) {
                    if client.request?.path == "/chat" {
                        await chat(client, in: room)
                    } else {
                        await echo(client)
                    }
                }
            }
        }
    }

    static func echo(_ client: WebSocketConnection) async {
        do {
            for try await message in client.messages {
                try await client.send(message)
            }
        } catch {
            print("echo: \(client.remoteEndpoint): \(error)")
        }
        await client.close()
    }

    /// Relays what `member` says to everyone in the room (the sender too), until it leaves.
    static func chat(_ member: WebSocketConnection, in room: ChatRoom) async {
        print("chat: \(member.remoteEndpoint) joined (\(await room.join(member)) in the room)")
        do {
            for try await message in member.messages {
                for other in await room.members {
                    try? await other.send(message)  // a member that went away is removed by its own task
                }
            }
        } catch {
            print("chat: \(member.remoteEndpoint): \(error)")
        }
        let left = await room.leave(member)
        let code = member.peerCloseCode.map { " with \($0)" } ?? ""
        print("chat: \(member.remoteEndpoint) left\(code) (\(left) in the room)")
        await member.close()
    }

    static func option(_ name: String, in arguments: [String]) -> String? {
        guard let index = arguments.firstIndex(of: name), index + 1 < arguments.count else { return nil }
        return arguments[index + 1]
    }
}

/// Who is in the chat room. Sends happen outside the actor, so a slow member never holds up joins and leaves.
actor ChatRoom {
    private var connections: [ObjectIdentifier: WebSocketConnection] = [:]

    var members: [WebSocketConnection] { Array(connections.values) }

    func join(_ member: WebSocketConnection) -> Int {
        connections[ObjectIdentifier(member)] = member
        return connections.count
    }

    func leave(_ member: WebSocketConnection) -> Int {
        connections[ObjectIdentifier(member)] = nil
        return connections.count
    }
}
