import ConnectionTestKit
import NativeStyles
import SocketStyles
import Testing

/// The relay written in each backend's own style (`sockbench proxy --native`, compare's `proxy` scenario): bytes
/// come back exact in both directions at once (more than the relay's window, so reading pauses and resumes), a FIN
/// is carried while the other direction goes on, an unreachable upstream ends the client, and many clients relay
/// at once.
@Suite("Native relays", .timeLimit(.minutes(20)))
struct NativeRelayTests {
    private let tcp = ConformanceCase(backend: .async, transport: .tcp)

    @Test("2 MiB each way at once comes back byte for byte", arguments: Backend.allCases)
    func exact(_ backend: Backend) async throws {
        try await SocketTest.run {
            let server = try await tcp.echoServer()
            let relay = try await backend.nativeRelay(listen: tcp.anyPort, upstream: server.endpoint)
            let client = try await tcp.connect(to: relay.localEndpoint)
            let payload = pattern(2 << 20, seed: 9)
            async let sent: Void = {
                for start in stride(from: 0, to: payload.count, by: 100_000) {
                    try await client.send(Array(payload[start..<min(start + 100_000, payload.count)]))
                }
            }()
            let echoed = try await client.receive(exactly: payload.count)
            try await sent
            #expect(echoed == payload)
            #expect(relay.clients == 1)
            await client.close()
            await relay.stop()
            await server.stop()
        }
    }

    @Test("A FIN is carried and the other direction finishes", arguments: Backend.allCases)
    func halfClose(_ backend: Backend) async throws {
        try await SocketTest.run {
            let server = try await tcp.echoServer()
            let relay = try await backend.nativeRelay(listen: tcp.anyPort, upstream: server.endpoint)
            let client = try await tcp.connect(to: relay.localEndpoint)
            let payload = pattern(300_000, seed: 5)
            try await client.send(payload)
            try await client.closeOutput()  // the echo server answers everything, then ends: its FIN comes back
            var echoed: [UInt8] = []
            while let message = try await client.receive() { echoed += message.bytes }
            #expect(echoed == payload)
            await client.close()
            await relay.stop()
            await server.stop()
        }
    }

    @Test("An upstream that refuses ends the client, not a hang", arguments: Backend.allCases)
    func upstreamRefused(_ backend: Backend) async throws {
        try await SocketTest.run {
            let refusing = try RefusingPort()
            defer { refusing.close() }
            let relay = try await backend.nativeRelay(listen: tcp.anyPort, upstream: try refusing.endpoint(.tcp))
            let client = try await tcp.connect(to: relay.localEndpoint)
            let outcome: Message?? = try? await withTimeLimit(.seconds(10)) { try await client.receive() }
            // A clean end (nil) or a reset (the error): anything but data, and within the limit.
            #expect(outcome.map { $0 == nil } ?? true, "the client got data from nowhere")
            await client.close()
            await relay.stop()
        }
    }

    @Test("100 clients at once, each verified", arguments: Backend.allCases)
    func manyClients(_ backend: Backend) async throws {
        try await SocketTest.run(timeLimit: .seconds(120)) {
            let server = try await tcp.echoServer()
            let relay = try await backend.nativeRelay(listen: tcp.anyPort, upstream: server.endpoint)
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<100 {
                    group.addTask {
                        let client = try await tcp.connect(to: relay.localEndpoint)
                        let payload = pattern(4096, seed: UInt8(truncatingIfNeeded: index))
                        try await client.send(payload)
                        #expect(try await client.receive(exactly: payload.count) == payload)
                        await client.close()
                    }
                }
                try await group.waitForAll()
            }
            #expect(relay.clients == 100)
            await relay.stop()
            await server.stop()
        }
    }

    @Test("Other transports are refused with a clear error")
    func tcpOnly() async throws {
        let error = await #expect(throws: ConnectionError.self) {
            _ = try await Backend.uv.nativeRelay(
                listen: try Endpoint(url: "udp://127.0.0.1:0"), upstream: try Endpoint(url: "udp://127.0.0.1:9"))
        }
        #expect(error?.kind == .unsupported)
    }
}
