import ConnectionTestKit
import SocketStyles
import Testing

/// A name that resolves to several addresses connects on every backend alike: each address is tried in the
/// resolver's order, and when all fail the last failure is reported (`ConnectAttempts`, POSIXSupport).
///
/// The name is pinned (`HostPins`) to 127.0.0.2, where nobody listens on the server's port (a SYN there is
/// answered with RST: refused), then to 127.0.0.1, where the server is. UDP is not here: a UDP connect sends
/// nothing and cannot fail on a missing listener, so the first address always "succeeds" on every backend.
@Suite("Address order", .timeLimit(.minutes(20)))  // socket tests wait their turn (SocketTest)
struct AddressOrderTests {
    static let cases = ConformanceCase.all.filter { $0.transport != .udp }

    @Test("A name whose first address refuses connects to its second", arguments: cases)
    func secondAddress(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            let endpoint = try Endpoint(
                url: "\(test.transport)://\(ConformanceCase.twoAddresses):\(server.endpoint.port)")
            let client = try await test.connect(to: endpoint)
            // Only 127.0.0.1 has a server: an echo proves the connection went there.
            let message = Array("second address".utf8)
            try await client.send(message)
            let echoed =
                test.transport.isByteStream
                ? try await client.receive(exactly: message.count) : try await client.receive()?.bytes
            #expect(echoed == message)
            await client.close()
            await server.stop()
        }
    }

    @Test("When every address refuses, the last refusal is reported", arguments: cases)
    func everyAddressRefuses(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            // A TCP port that is ours on both addresses, bound but not listening, for the whole test: both refuse
            // (a SYN to it is answered with RST), and no test running beside this one can listen on it meanwhile
            // (a port only noted and let go was once taken by another test's listener: the connect succeeded).
            let refusing = try RefusingPort(hosts: ["127.0.0.1", "127.0.0.2"])
            defer { refusing.close() }
            let endpoint = try refusing.endpoint(test.transport, host: ConformanceCase.twoAddresses)
            await expectConnectionError(.refused) { () throws(ConnectionError) in try await test.connect(to: endpoint) }
        }
    }
}
