import ConnectionTestKit
import Foundation
import SocketStyles
import SocketStylesFoundation
import Testing

@Suite("Foundation conveniences", .timeLimit(.minutes(20)))
struct FoundationTests {
    @Test("Data and URL in, Data out: a binary echo over ws on every backend", arguments: Backend.allCases)
    func dataEcho(_ backend: Backend) async throws {
        try await SocketTest.run {
            let server = try await EchoServer.start(backend, on: try Endpoint(url: "ws://127.0.0.1:0"))
            let url = try #require(URL(string: "\(server.endpoint)"))
            let client = try await backend.connectWebSocket(to: try Endpoint(url: url))
            let payload = Data((0..<300).map { UInt8(truncatingIfNeeded: $0) })
            try await client.send(data: payload)
            let reply = try await client.receive()
            #expect(reply?.kind == .binary)
            #expect(reply?.data == payload)
            #expect(Message.data(payload).bytes == [UInt8](payload))
            await client.close(code: .goingAway, reason: Data("bye".utf8))
            await server.stop()
        }
    }

    @Test("A URL the endpoint cannot take is refused with a clear error")
    func badURL() throws {
        let url = try #require(URL(string: "https://127.0.0.1:443/"))
        #expect(throws: ConnectionError.self) { try Endpoint(url: url) }
    }
}
