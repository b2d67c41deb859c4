import ConnectionTestKit
import Glibc
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
            let (port, held) = try Self.boundNotListening(on: ["127.0.0.1", "127.0.0.2"])
            defer { for fd in held { close(fd) } }
            let endpoint = try Endpoint(url: "\(test.transport)://\(ConformanceCase.twoAddresses):\(port)")
            await expectConnectionError(.refused) { () throws(ConnectionError) in try await test.connect(to: endpoint) }
        }
    }

    /// TCP sockets bound to one port on each of `hosts` (the first picks it) and not listening, open until the
    /// caller closes them. A few ports are tried, in case another socket has the first one on a later host.
    static func boundNotListening(on hosts: [String]) throws -> (port: UInt16, descriptors: [Int32]) {
        struct Failed: Error { let what: String }
        for _ in 0..<20 {
            var port: UInt16 = 0
            var held: [Int32] = []
            for host in hosts {
                let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
                guard fd >= 0 else { throw Failed(what: "socket: errno \(errno)") }
                var address = sockaddr_in()
                address.sin_family = sa_family_t(AF_INET)
                address.sin_port = port.bigEndian
                inet_pton(AF_INET, host, &address.sin_addr)
                let bound = withUnsafePointer(to: &address) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                    }
                }
                guard bound == 0 else {
                    close(fd)
                    break
                }
                held.append(fd)
                if port == 0 {
                    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
                    _ = withUnsafeMutablePointer(to: &address) {
                        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
                    }
                    port = UInt16(bigEndian: address.sin_port)
                }
            }
            if held.count == hosts.count { return (port, held) }
            for fd in held { close(fd) }
        }
        throw Failed(what: "no port free on \(hosts)")
    }
}
