import BenchmarkDriver
import ConnectionTestKit
import NativeStyles
import SocketStyles
import Testing

/// The native-style ping-pong and echo server of each backend (sockbench compare's `native-SIZE`): they must
/// move and check every byte, with both small probes and probes bigger than a socket buffer (partial reads and
/// writes), against their own server and against another style's.
@Suite("Native styles", .timeLimit(.minutes(10)))
struct NativeStyleTests {
    @Test("Every round trip is echoed, checked and sampled", arguments: Backend.allCases, [64, 300_000])
    func pingpong(_ backend: Backend, size: Int) async throws {
        try await SocketTest.run {
            let server = try await backend.nativeEchoServer(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let count = size > 1000 ? 20 : 300
            let result = try await backend.nativePingPong(
                to: server.localEndpoint, size: size, count: count, warmup: 10)
            #expect(result.latency.count == UInt64(count))
            #expect(result.latency.min > 0)
            #expect(result.roundTripsPerSecond > 0)
            await server.stop()
        }
    }

    @Test(
        "Native clients and servers interoperate (each client against the bsd server and the nio server)",
        arguments: Backend.allCases)
    func crossed(_ backend: Backend) async throws {
        try await SocketTest.run {
            for serverStyle in [Backend.bsd, .nio] {
                let server = try await serverStyle.nativeEchoServer(on: try Endpoint(url: "tcp://127.0.0.1:0"))
                let result = try await backend.nativePingPong(
                    to: server.localEndpoint, size: 1000, count: 50, warmup: 0)
                #expect(result.latency.count == 50)
                await server.stop()
            }
        }
    }

    @Test("A refused connection is an error, not a hang", arguments: Backend.allCases)
    func refused(_ backend: Backend) async throws {
        try await SocketTest.run {
            // Bind a port and close it again: nothing listens there now.
            let server = try await Backend.bsd.nativeEchoServer(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let endpoint = server.localEndpoint
            await server.stop()
            await #expect(throws: ConnectionError.self) {
                _ = try await backend.nativePingPong(to: endpoint, size: 64, count: 10, warmup: 0)
            }
        }
    }

    @Test("A server that echoes something else is caught", arguments: Backend.allCases)
    func wrongEcho(_ backend: Backend) async throws {
        try await SocketTest.run {
            // A sink answers nothing; a server that sends a fixed reply answers wrongly. Use the unified echo
            // server in sink mode plus one reply: the simplest wrong peer is a listener that sends garbage.
            let listener = try await Backend.async.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let peer = Task {
                let connection = try await listener.accept()
                _ = try await connection.receive()
                try await connection.send([UInt8](repeating: 0xEE, count: 64))
                _ = try? await connection.receive()
                await connection.close()
            }
            let error = await #expect(throws: ConnectionError.self) {
                _ = try await backend.nativePingPong(to: listener.localEndpoint, size: 64, count: 10, warmup: 0)
            }
            #expect(error?.kind == .protocolViolation)
            _ = try? await peer.value
            await listener.close()
        }
    }
}
