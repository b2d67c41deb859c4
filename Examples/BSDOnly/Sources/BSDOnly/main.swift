import BSDSocketBackend
import ConnectionCore
import WebSocketTransport

// A WebSocket echo over blocking BSD sockets, both ends in this process, on a port the system picks.
let backend = BSDBackend()
let tcpListener = try await backend.listen(on: Endpoint(url: "tcp://127.0.0.1:0"), options: ConnectionOptions())
let listener = WebSocketListener(tcp: tcpListener)
let port = listener.localEndpoint.port

let server = Task {
    let connection = try await listener.acceptWebSocket()
    while let message = try await connection.receive() {
        try await connection.send(message)
    }
    await connection.close()
}

let endpoint = try Endpoint(url: "ws://127.0.0.1:\(port)/")
let tcp = try await backend.connect(to: Endpoint(url: "tcp://127.0.0.1:\(port)"), options: ConnectionOptions())
let client = try await WebSocketConnection.client(over: tcp, endpoint: endpoint)
try await client.send(text: "hello over bsd")
guard let echo = try await client.receive(), echo.text == "hello over bsd" else {
    fatalError("no echo")
}
print("echoed: \(echo.text ?? "")")
await client.close()
try await server.value
await listener.close()
