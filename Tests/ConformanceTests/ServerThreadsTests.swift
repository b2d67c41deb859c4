import ConnectionTestKit
import SocketStyles
import Testing

/// A server on two threads (`Backend.listen(on:options:webSocket:tls:threads:)`): a listening socket per loop on
/// one address, the kernel spreading clients over them. The contract suite (`ConformanceTests`) runs every socket
/// backend on two server threads as well as one; these check that the two are really used.
@Suite("Conformance: a server on two threads", .timeLimit(.minutes(10)))
struct ServerThreadsTests {
    static let clients = 24

    @Test(
        "Clients are spread over both loops, and each is served on the loop that accepted it",
        arguments: ConformanceCase.onTwoServerThreads)
    func spread(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let listener = try await test.listen()
            var clients: [any Connection] = []
            var served: [any Connection] = []
            var executors = Set<ObjectIdentifier>()
            for index in 0..<Self.clients {
                let client = try await test.connect(to: listener.localEndpoint)
                clients.append(client)
                // A UDP listener yields a peer on its first datagram.
                try await client.send([UInt8(index)])
                let server = try await listener.accept()
                served.append(server)
                let executor = try #require(server.preferredExecutor, "a socket connection runs on its loop")
                executors.insert(ObjectIdentifier(executor))
                try await server.send([UInt8(index)])
                #expect(try await client.receive()?.bytes == [UInt8(index)])
            }
            // 24 clients hashed over two sockets all on one: 1 chance in 2^23. bsd has a thread per tcp connection
            // and one per listening UDP socket.
            if test.backend == .bsd {
                #expect(executors.count >= 2)
            } else {
                #expect(executors.count == 2)
            }
            // Both ends at once: a TLS close waits (up to 2 s) for the peer's close_notify.
            await withDiscardingTaskGroup { group in
                for connection in clients + served { group.addTask { await connection.close() } }
            }
            await listener.close()
        }
    }

    @Test("Hand-off (async): one acceptor, connections handed to the two reactors in turn; the others say they do not")
    func handOff() async throws {
        // async's second loop lives as long as the process once made (`Backend.loops`): made as a warm-up, under
        // the socket tests' lock before this test counts descriptors, as `ConformanceCase.onTwoServerThreads` makes
        // it when async is among the backends under test. (With SOCKETSTYLES_CONFORMANCE_BACKENDS=uring it was not
        // made, and its epoll and eventfd counted as this test's leak; made here outside the lock, they counted as
        // the leak of whichever socket test of another suite was counting then.)
        SocketTest.addWarmUp { _ = try? Backend.async.loops(2) }
        try await SocketTest.run {
            let listener = try await Backend.async.listen(
                on: try Endpoint(url: "tcp://127.0.0.1:0"), threads: 2, spread: .handOff)
            var clients: [any Connection] = []
            var executors: [ObjectIdentifier] = []
            for index in 0..<8 {
                let client = try await Backend.async.connect(to: listener.localEndpoint)
                clients.append(client)
                let server = try await listener.accept()
                clients.append(server)
                executors.append(ObjectIdentifier(try #require(server.preferredExecutor)))
                try await client.send([UInt8(index)])
                #expect(try await server.receive(exactly: 1) == [UInt8(index)])
            }
            // In turn: the first reactor, the second, the first, ...
            #expect(Set(executors).count == 2)
            for index in 2..<executors.count { #expect(executors[index] == executors[index - 2]) }
            #expect(executors[0] != executors[1])
            for connection in clients { await connection.close() }
            await listener.close()
            for backend in Backend.allCases where backend != .async {
                let error = await expectConnectionError(.unsupported) { () async throws(ConnectionError) in
                    _ = try await backend.listen(
                        on: try Endpoint(url: "tcp://127.0.0.1:0"), threads: 2, spread: .handOff)
                }
                #expect(error?.detail.contains("does not hand accepted connections over") == true, "\(backend)")
            }
        }
    }

    @Test("A backend with one loop per process says it cannot serve on two threads")
    func oneLoopBackend() async throws {
        let endpoint = try Endpoint(url: "tcp://127.0.0.1:0")
        let error = await expectConnectionError(.unsupported) { () async throws(ConnectionError) in
            _ = try await Backend.memory.listen(on: endpoint, threads: 2)
        }
        #expect(error?.detail.contains("one loop per process") == true)
    }
}
