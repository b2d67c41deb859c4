import ConnectionCore
import ConnectionTestKit
import Glibc
import POSIXSupport
import Testing

/// The socket layer under every backend (POSIXSupport's Socket.swift, SocketDescriptor.swift, HostPins), without
/// the backends.
@Suite("Socket layer")
struct SocketLayerTests {
    @Test("ConnectAttempts: addresses in order, the last error kept, cancel and timeout end the search")
    func connectAttempts() throws {
        let endpoint = try Endpoint(url: "tcp://example.test:80")
        let addresses = try ["127.0.0.2", "127.0.0.3", "127.0.0.1"].map {
            try Syscall.resolve(Endpoint(url: "tcp://\($0):80"))[0]
        }
        var attempts = ConnectAttempts(addresses, endpoint: endpoint, timeout: .seconds(10))
        #expect(try attempts.next() == addresses[0])
        try attempts.failed(ConnectionError(.refused, "first"))
        #expect(try attempts.next() == addresses[1])
        try attempts.failed(ConnectionError(.unreachable, "second"))
        #expect(attempts.lastError.kind == .unreachable)
        #expect(try attempts.next() == addresses[2])
        #expect(try attempts.next() == nil)
        // A cancelled or timed-out attempt ends the search: it is rethrown, not kept.
        #expect(throws: ConnectionError.self) { try attempts.failed(.cancelled("stop")) }
        #expect(attempts.lastError.kind == .unreachable)

        var expired = ConnectAttempts(addresses, endpoint: endpoint, timeout: .zero)
        #expect(try expired.next() == addresses[0])  // the first address is always tried
        #expect(throws: ConnectionError.self) { _ = try expired.next() }
    }

    @Test("Socket.connect(toFirstOf:) returns the first success and reports the last failure")
    func connectToFirstOf() throws {
        let endpoint = try Endpoint(url: "tcp://example.test:80")
        let addresses = try ["127.0.0.2", "127.0.0.1"].map { try Syscall.resolve(Endpoint(url: "tcp://\($0):80"))[0] }
        var tried: [SocketAddress] = []
        let chosen = try Socket.connect(toFirstOf: addresses, endpoint: endpoint, options: ConnectionOptions()) {
            (address, _) throws(ConnectionError) -> SocketAddress in
            tried.append(address)
            if address == addresses[0] { throw ConnectionError(.refused, "no one there") }
            return address
        }
        #expect(chosen == addresses[1])
        #expect(tried == addresses)
        do {
            _ = try Socket.connect(toFirstOf: addresses, endpoint: endpoint, options: ConnectionOptions()) {
                (address, _) throws(ConnectionError) -> Int in
                throw ConnectionError(.refused, "\(address)")
            }
            Issue.record("every address failed, yet it returned")
        } catch {
            #expect(error.kind == .refused)
            #expect(error.detail.contains("127.0.0.1"))
        }
    }

    @Test("HostPins: a pinned name resolves to its addresses in order, case-insensitive; unpinned it is gone")
    func hostPins() throws {
        try HostPins.pin("Pinned-Name.test", to: ["127.0.0.9", "::1"])
        let resolved = try Syscall.resolve(Endpoint(url: "tcp://pinned-name.TEST.:7"))
        #expect(resolved.map(\.description) == ["127.0.0.9:7", "[::1]:7"])
        HostPins.unpin("pinned-name.test")
        #expect(HostPins.addresses(for: "pinned-name.test") == nil)  // the system resolver's again (not asked here)
        #expect(throws: ConnectionError.self) { try HostPins.pin("bad.test", to: ["not-an-address"]) }
        #expect(throws: ConnectionError.self) { try HostPins.pin("empty.test", to: []) }
    }

    @Test("SocketDescriptor closes once: close, release and deinit never close a number twice")
    func descriptorClosesOnce() async throws {
        try await SocketTest.run { try Self.closesOnce() }
    }

    static func closesOnce() throws {
        let owner = SocketDescriptor(adopting: try Syscall.socket(family: .ipv4, datagram: true))
        let fd = owner.raw
        #expect(fcntl(fd, F_GETFD) >= 0)
        var unregistered: [Int32] = []
        #expect(owner.close(beforeClosing: { unregistered.append($0) }))
        #expect(!owner.close(beforeClosing: { unregistered.append($0) }))
        #expect(unregistered == [fd])
        #expect(owner.isClosed && owner.raw == -1)
        #expect(owner.release() == nil)

        let released = SocketDescriptor(adopting: try Syscall.socket(family: .ipv4, datagram: true))
        let number = try #require(released.release())
        #expect(!released.close())
        #expect(fcntl(number, F_GETFD) >= 0)  // still open: the new owner closes it
        Syscall.close(number)
    }
}
