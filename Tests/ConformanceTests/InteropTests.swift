import ConnectionTestKit
import SocketStyles
import Testing

/// A client of one backend against a server of another: the wire is the same whatever the style.
struct InteropCase: Sendable, CustomTestStringConvertible {
    let client: Backend
    let server: Backend
    let transport: Transport

    var testDescription: String { "\(client) client -> \(server) server, \(transport)" }

    static let all: [InteropCase] = Backend.allCases.flatMap { client in
        Backend.allCases.filter { $0 != client }.flatMap { server in
            [Transport.tcp, .udp].filter { client.transports.contains($0) && server.transports.contains($0) }.map {
                InteropCase(client: client, server: server, transport: $0)
            }
        }
    }
}

@Suite("Interop between backends", .timeLimit(.minutes(20)))
struct InteropTests {
    @Test("Echo across backends", arguments: InteropCase.all)
    func echo(_ test: InteropCase) async throws {
        try await SocketTest.run {
            let server = try await EchoServer.start(
                test.server, on: try Endpoint(url: "\(test.transport)://127.0.0.1:0"))
            let client = try await test.client.connect(to: server.endpoint)
            if test.transport == .tcp {
                let payload = pattern(300_000, seed: 11)
                async let sent: Void = client.send(payload)
                #expect(try await client.receive(exactly: payload.count) == payload)
                try await sent
                try await client.closeOutput()
                #expect(try await client.receive() == nil)  // the echo server closes after our half-close
            } else {
                for size in [0, 1, 1400, 65_507] {
                    let payload = pattern(size, seed: 5)
                    #expect(try await udpRequest(client, payload) == payload)
                }
            }
            await client.close()
            await server.stop()
        }
    }
}
