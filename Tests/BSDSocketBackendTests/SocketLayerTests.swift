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
        let owner = try Syscall.socket(family: .ipv4, datagram: true)
        let fd = try #require(owner.ifOpen { $0.number })
        #expect(fcntl(fd, F_GETFD) >= 0)
        var unregistered: [Int32] = []
        #expect(owner.close(beforeClosing: { unregistered.append($0.number) }))
        #expect(!owner.close(beforeClosing: { unregistered.append($0.number) }))
        #expect(unregistered == [fd])
        #expect(owner.isClosed && owner.ifOpen { $0.number } == nil)
        #expect(throws: ConnectionError.self) { try owner.withDescriptor { $0.number } }
        #expect(owner.release() == nil)

        let released = try Syscall.socket(family: .ipv4, datagram: true)
        let number = try #require(released.release())
        #expect(!released.close())
        #expect(fcntl(number, F_GETFD) >= 0)  // still open: the new owner closes it
        Syscall.close(number)
    }

    @Test("SocketDescriptor: a close while the number is lent waits for the borrower, and nothing borrows it after")
    func descriptorLendsAcrossClose() async throws {
        try await SocketTest.run { try Self.lendsAcrossClose() }
    }

    /// A stream socket pair: the owner's end and the other, whose read sees the end once the owner's is closed (a
    /// descriptor number says nothing then: another test may have been given it).
    private static func pair() throws -> (SocketDescriptor, Int32) {
        var ends: [Int32] = [-1, -1]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &ends) == 0)
        return (SocketDescriptor(adopting: ends[0]), ends[1])
    }

    /// Whether the other end sees its peer closed (a read returns 0) rather than nothing to read yet.
    private static func peerClosed(_ other: Int32) -> Bool {
        var byte: UInt8 = 0
        return recv(other, &byte, 1, Int32(MSG_DONTWAIT)) == 0
    }

    static func lendsAcrossClose() throws {
        let (owner, other) = try pair()
        defer { Syscall.close(other) }
        var closedInside = false
        var openInside = false
        try owner.withDescriptor { (fd) throws(ConnectionError) in
            closedInside = owner.close()
            // Closing marked it: no new borrow, but this borrower's number is still the socket.
            openInside = !peerClosed(other) && owner.isClosed && owner.ifOpen { $0.number } == nil
        }
        #expect(closedInside && openInside)
        #expect(peerClosed(other), "the last borrower's return closed it")
        #expect(!owner.close())

        // Two borrowers: the close waits for both; the first to return leaves it open.
        let (shared, sharedOther) = try pair()
        defer { Syscall.close(sharedOther) }
        try shared.withDescriptor { (outer) throws(ConnectionError) in
            try shared.withDescriptor { (inner) throws(ConnectionError) in
                #expect(inner.number == outer.number)
                shared.close()
            }
            #expect(!peerClosed(sharedOther), "the outer borrow still holds it")
        }
        #expect(peerClosed(sharedOther))

        // An empty owner lends nothing until it adopts.
        let empty = SocketDescriptor()
        #expect(empty.ifOpen { $0.number } == nil)
        let (adopted, adoptedOther) = try pair()
        defer { Syscall.close(adoptedOther) }
        let number = try #require(adopted.release())
        empty.adopt(number)
        #expect(empty.ifOpen { $0.number } == number)
        #expect(empty.close())
        #expect(peerClosed(adoptedOther))
    }
}
