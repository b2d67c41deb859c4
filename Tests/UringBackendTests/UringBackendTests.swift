import ConnectionCore
import ConnectionTestKit
import Glibc
import POSIXSupport
import Synchronization
import Testing
import UringBackend

/// The uring style's own API, and the ring's threading under the sanitizers (CI runs this target under ASan and TSan
/// with one backend of each other style). The Connection contract is the conformance suite's job.
@Suite("uring backend", .timeLimit(.minutes(10)), .enabled(if: UringBackend.unavailableReason == nil))
struct UringBackendTests {
    private static func pair() async throws -> (UringListener, UringSocket, UringSocket) {
        let listener = try await UringListener.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"))
        async let accepted = listener.accept()
        let client = try await UringSocket.connect(to: listener.localEndpoint)
        return (listener, client, try await accepted)
    }

    /// A connected pair whose server end echoes what it receives (a task); `body` gets the client. Everything is
    /// closed afterwards, also when `body` throws.
    private static func withEcho(_ body: (UringSocket) async throws -> Void) async throws {
        let (listener, client, server) = try await pair()
        let echo = Task {
            while let bytes = try await server.receive() { try await server.send(bytes) }
        }
        let outcome: Result<Void, any Error>
        do {
            try await body(client)
            outcome = .success(())
        } catch {
            outcome = .failure(error)
        }
        await client.close()
        _ = try? await echo.value
        await server.close()
        await listener.close()
        try outcome.get()
    }

    @Test("Bytes both ways, from a task on the ring and from one elsewhere; the end of the stream once")
    func echo() async throws {
        try await SocketTest.run {
            let (listener, client, server) = try await Self.pair()
            // From a task that does not prefer the ring: each operation is handed to the ring's thread.
            try await client.send(Array("hello".utf8))
            #expect(try await server.receive(maximumLength: 5) == Array("hello".utf8))
            // From a task on the ring: submitted directly.
            try await withTaskExecutorPreference(server.loop) {
                try await server.send(Array("world".utf8))
            }
            #expect(try await client.receive(maximumLength: 5) == Array("world".utf8))
            try await client.closeOutput()
            #expect(try await server.receive() == nil)
            await client.close()
            await server.close()
            await listener.close()
        }
    }

    @Test("A cancelled receive throws .cancelled, and the data that comes later goes to the next receive")
    func cancelledReceive() async throws {
        try await SocketTest.run {
            let (listener, client, server) = try await Self.pair()
            let waiting = Task { try await server.receive() }
            waiting.cancel()
            let error = await #expect(throws: ConnectionError.self) { try await waiting.value }
            #expect(error?.kind == .cancelled)
            try await client.send([1, 2, 3])
            #expect(try await server.receive(maximumLength: 3) == [1, 2, 3])
            await client.close()
            await server.close()
            await listener.close()
        }
    }

    @Test("Closing ends a receive and an accept in flight with .closed, and leaves no descriptor")
    func closeInFlight() async throws {
        try await SocketTest.run {
            let (listener, client, server) = try await Self.pair()
            let receiving = Task { try await server.receive() }
            let accepting = Task { try await listener.accept() }
            await server.close()
            await listener.close()
            let receiveError = await #expect(throws: ConnectionError.self) { try await receiving.value }
            #expect(receiveError?.kind == .closed)
            let acceptError = await #expect(throws: ConnectionError.self) { try await accepting.value }
            #expect(acceptError?.kind == .closed)
            await client.close()
        }
    }

    @Test("UringRing: a send with its receive linked behind it, both in one turn, the reply in the handler")
    func linkedSendAndReceive() async throws {
        try await SocketTest.run {
            try await Self.withEcho { client in
                let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64, alignment: 16)
                defer { buffer.deallocate() }
                let probe = Array("ping".utf8)
                let request = UnsafeMutableRawBufferPointer.allocate(byteCount: probe.count, alignment: 16)
                defer { request.deallocate() }
                request.copyBytes(from: probe)
                let fd = client.fileDescriptor
                let address = UInt(bitPattern: buffer.baseAddress)
                let outgoing = UInt(bitPattern: request.baseAddress)
                let results = await withCheckedContinuation { (done: CheckedContinuation<[Int32], Never>) in
                    client.loop.execute { ring in
                        let sent = UnsafeRawBufferPointer(
                            start: UnsafeRawPointer(bitPattern: outgoing), count: probe.count)
                        let into = UnsafeMutableRawBufferPointer(
                            start: UnsafeMutableRawPointer(bitPattern: address), count: 64)
                        let order = Mutex<[Int32]>([])
                        ring.send(fd, sent, linked: true) { result in order.withLock { $0.append(result) } }
                        ring.receive(fd, into: into) { result in
                            done.resume(returning: order.withLock { $0 + [result] })
                        }
                    }
                }
                #expect(results == [Int32(probe.count), Int32(probe.count)])
                #expect(Array(buffer[..<probe.count]) == probe)
            }
        }
    }

    @Test("UringRing.sendThenReceive: the reply in one completion; a failed send ends it with the send's error")
    func sendThenReceive() async throws {
        try await SocketTest.run {
            try await Self.withEcho { client in
                let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64, alignment: 16)
                defer { buffer.deallocate() }
                let probe = Array("ping".utf8)
                buffer.copyBytes(from: probe)
                let fd = client.fileDescriptor
                let address = UInt(bitPattern: buffer.baseAddress)
                /// The pair on the ring; every handler call, in order, until the first.
                func exchange(_ count: Int) async -> [Int32] {
                    await withCheckedContinuation { (done: CheckedContinuation<[Int32], Never>) in
                        client.loop.execute { ring in
                            let memory = UnsafeMutableRawBufferPointer(
                                start: UnsafeMutableRawPointer(bitPattern: address), count: 64)
                            ring.sendThenReceive(fd, UnsafeRawBufferPointer(rebasing: memory[..<count]), into: memory) {
                                done.resume(returning: [$0])
                            }
                        }
                    }
                }
                #expect(await exchange(probe.count) == [Int32(probe.count)])
                #expect(Array(buffer[..<probe.count]) == probe)
                // The client's sending side shut: the send fails (EPIPE), the receive never runs, one completion.
                try Syscall.shutdown(fd, .write)
                #expect(await exchange(probe.count) == [-EPIPE])
            }
        }
    }

    @Test("The UDP server sorts datagrams from several clients by sender, received by one multishot recvmsg")
    func udpServer() async throws {
        try await SocketTest.run {
            let backend = UringBackend()
            let listener = try await backend.listen(
                on: try Endpoint(url: "udp://127.0.0.1:0"), options: ConnectionOptions())
            var clients: [any Connection] = []
            for index in 0..<3 {
                let client = try await backend.connect(to: listener.localEndpoint, options: ConnectionOptions())
                try await client.send([UInt8(index)])
                clients.append(client)
            }
            var seen: Set<UInt8> = []
            for _ in 0..<3 {
                let peer = try await listener.accept()
                let first = try await peer.receive()
                seen.insert(first?.bytes.first ?? 255)
                try await peer.send([0xEE])
                await peer.close()
            }
            #expect(seen == [0, 1, 2])
            for client in clients {
                #expect(try await client.receive()?.bytes == [0xEE])
                await client.close()
            }
            await listener.close()
        }
    }
}
