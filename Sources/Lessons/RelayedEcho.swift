import ConnectionTestKit
import SocketStyles

/// What the relay lessons talk through: an echo server whose connections the trace records as the server's, behind
/// a ``Relay`` that applies `toUpstream` on the way to it; the client end is traced with ``traced(_:)``.
struct RelayedEcho {
    let server: EchoServer
    let relay: Relay
    let trace: LessonTrace
    let phase: Int
    /// Datagrams and WebSocket messages carry their number first; a byte stream is matched by offsets.
    let number: (@Sendable ([UInt8]) -> Int?)?

    static func start(
        _ out: LessonOutput, _ backend: Backend, _ transport: Transport, phase: Int, toUpstream: FaultPlan,
        seed: UInt64 = 1
    ) async throws -> RelayedEcho {
        let number = transport.isByteStream ? nil : LessonTrace.leadingNumber
        let server = try await EchoServerHandle.start(backend, transport, traced: (out.trace, phase), number: number)
        do {
            let relay = try await Relay.start(
                listen: loopback(transport), upstream: server.endpoint, backend: backend, toUpstream: toUpstream,
                seed: seed)
            return RelayedEcho(server: server, relay: relay, trace: out.trace, phase: phase, number: number)
        } catch {
            await server.stop()
            throw error
        }
    }

    /// Where clients connect.
    var endpoint: Endpoint { relay.endpoint }

    /// `connection` (to ``endpoint``) recorded as the client's.
    func traced(_ connection: any Connection) -> any Connection {
        trace.trace(connection, side: .client, phase: phase, number: number)
    }

    func stop() async {
        await relay.stop()
        await server.stop()
    }
}
