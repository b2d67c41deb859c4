import ConnectionCore
import ConnectionTestKit
import POSIXSupport
import SocketStyles
import Testing

/// Sends made back to back by a task on the connection's own executor (a bulk flow of small writes, a burst of
/// replies): uv and runloop gather them into one system call (`WriteThrough`), uring into its send queue, the
/// others write each. Whatever a backend does, every byte of every send that returned reaches the peer, in order:
/// before a half-close, before a close, and when the task goes on to wait for something else entirely (the loop
/// writes what gathered before it sleeps). The peer is a plain blocking socket, so nothing of the backend's own
/// is on the reading side.
@Suite("Back-to-back sends", .timeLimit(.minutes(10)))
struct GatheredSendTests {
    static let cases = ConformanceCase.withSockets.filter { $0.transport == .tcp }

    /// The bytes of send `index`: 1 to 2,000 bytes, each naming its send and its place in it.
    static func message(_ index: Int) -> [UInt8] {
        let count = 1 + (index &* 7_919) % 2_000
        return (0..<count).map { UInt8(truncatingIfNeeded: index &* 31 &+ $0) }
    }

    /// Reads from `peer` until it has `count` bytes or the stream ends (then `ended`), each read bounded by 10 s.
    static func read(_ peer: BSDSocket, count: Int?) throws(ConnectionError) -> (bytes: [UInt8], ended: Bool) {
        try peer.withDescriptor { (fd) throws(ConnectionError) in
            try Syscall.setReceiveTimeout(fd, milliseconds: 10_000)
        }
        var bytes: [UInt8] = []
        while count.map({ bytes.count < $0 }) ?? true {
            let chunk = try peer.receive(maximumLength: 65_536)
            if chunk.isEmpty { return (bytes, true) }
            bytes += chunk
        }
        return (bytes, false)
    }

    /// The bytes that arrived are the ones sent: how many, and where they first differ (not the arrays themselves).
    static func expectSame(_ bytes: [UInt8], _ expected: [UInt8], sourceLocation: SourceLocation = #_sourceLocation) {
        let difference = (0..<min(bytes.count, expected.count)).first { bytes[$0] != expected[$0] }
        #expect(
            bytes.count == expected.count && difference == nil,
            "\(bytes.count) of \(expected.count) bytes arrived; first difference at \(difference.map(String.init) ?? "none")",
            sourceLocation: sourceLocation)
    }

    /// Runs `body` (as a socket test) with a connected client of `test`'s backend and the plain socket it reaches,
    /// closed afterwards.
    static func withPair(
        _ test: ConformanceCase, _ body: @Sendable @escaping (any Connection, BSDSocket) async throws -> Void
    ) async throws {
        try await SocketTest.run {
            let listening = try BSDSocket.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            defer { listening.close() }
            let client = try await test.connect(to: try listening.localAddress.endpoint(.tcp))
            let peer = try listening.accept()
            defer { peer.close() }
            try await body(client, peer)
        }
    }

    @Test(
        "2,000 sends back to back on the connection's executor, then a half-close: every byte, in order, then the end",
        arguments: cases)
    func backToBackThenHalfClose(_ test: ConformanceCase) async throws {
        try await Self.withPair(test) { client, peer in
            let sending = Task(executorPreference: client.preferredExecutor) {
                for index in 0..<2_000 { try await client.send(Self.message(index)) }
                try await client.closeOutput()
            }
            let expected = (0..<2_000).flatMap { Self.message($0) }
            let (bytes, ended) = try await Task.detached { try Self.read(peer, count: nil) }.value
            try await sending.value
            #expect(ended)
            Self.expectSame(bytes, expected)
            await client.close()
        }
    }

    @Test(
        "Bursts of sends back to back, the task waiting for something else after each: every burst leaves by itself",
        arguments: cases)
    func backToBackThenWaitElsewhere(_ test: ConformanceCase) async throws {
        try await Self.withPair(test) { client, peer in
            for burst in 0..<3 {
                let indices = (burst * 5)..<(burst * 5 + 5)
                let expected = indices.flatMap { Self.message($0) }
                let (received, release) = AsyncStream.makeStream(of: Void.self)
                let sending = Task(executorPreference: client.preferredExecutor) {
                    for index in indices { try await client.send(Self.message(index)) }
                    // Suspended on something that is not the connection until the peer has every byte: gathered
                    // bytes that waited for the connection's next call would never arrive.
                    for await _ in received { break }
                }
                let bytes = try await Task.detached { try Self.read(peer, count: expected.count).bytes }.value
                release.yield()
                release.finish()
                try await sending.value
                Self.expectSame(bytes, expected)
            }
            await client.close()
        }
    }

    @Test("Sends back to back, then close(): every byte, then the end", arguments: cases)
    func backToBackThenClose(_ test: ConformanceCase) async throws {
        try await Self.withPair(test) { client, peer in
            let expected = (0..<20).flatMap { Self.message($0) }
            let sending = Task(executorPreference: client.preferredExecutor) {
                for index in 0..<20 { try await client.send(Self.message(index)) }
                await client.close()
            }
            let (bytes, ended) = try await Task.detached { try Self.read(peer, count: nil) }.value
            try await sending.value
            #expect(ended)
            Self.expectSame(bytes, expected)
        }
    }
}
