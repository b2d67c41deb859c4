import ConnectionCore
import ConnectionTestKit
import Glibc
import POSIXSupport
import Synchronization
import Testing
import UringBackend

/// The uring style's own API, and the ring's threading under the sanitizers (CI runs this target under ASan and TSan
/// with one backend of each other style). The Connection contract is the conformance suite's job.
@Suite("uring backend", .timeLimit(.minutes(20)), .enabled(if: UringBackend.unavailableReason == nil))
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

    /// TCP receives pick their buffers from the ring's 8 (IOSQE_BUFFER_SELECT). With more sockets readable at once
    /// than that, the kernel turns the rest away with ENOBUFS, and those read what is there another way: every
    /// receive still gets its own bytes, whole and in order.
    @Test("More sockets readable at once than the ring has receive buffers: every receive gets its own bytes")
    func moreReadersThanBuffers() async throws {
        try await SocketTest.run {
            let listener = try await UringListener.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            var pairs: [(client: UringSocket, server: UringSocket)] = []
            for _ in 0..<96 {
                async let accepted = listener.accept()
                let client = try await UringSocket.connect(to: listener.localEndpoint)
                pairs.append((client, try await accepted))
            }
            // The bytes wait in the sockets before any receive is made: the receives, submitted in one turn of the
            // ring, find data at once, and all but the ring's 8 find no buffer.
            for (index, pair) in pairs.enumerated() {
                try await pair.client.send([UInt8](repeating: UInt8(index), count: 3000))
            }
            let loop = pairs[0].server.loop
            let turnedAwayBefore = loop.turnedAwayReceives
            let servers = pairs.map(\.server)
            let results = try await withThrowingTaskGroup(of: (Int, [UInt8]).self) { group in
                for (index, server) in servers.enumerated() {
                    group.addTask {
                        try await withTaskExecutorPreference(server.loop) {
                            var received: [UInt8] = []
                            while received.count < 3000, let bytes = try await server.receive() {
                                received += bytes
                            }
                            return (index, received)
                        }
                    }
                }
                var results: [Int: [UInt8]] = [:]
                for try await (index, bytes) in group { results[index] = bytes }
                return results
            }
            #expect(loop.turnedAwayReceives > turnedAwayBefore)
            for index in 0..<pairs.count {
                #expect(results[index] == [UInt8](repeating: UInt8(index), count: 3000), "socket \(index)")
            }
            for pair in pairs {
                await pair.client.close()
                await pair.server.close()
            }
            await listener.close()
        }
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

    @Test(
        "A burst of clients larger than the multishot's accept-ahead bound: each accepted once, with its own address",
        arguments: [true, false])
    func acceptBurst(multishot: Bool) async throws {
        try await SocketTest.run {
            let listener = try await UringListener.listen(
                on: try Endpoint(url: "tcp://127.0.0.1:0"), multishot: multishot)
            #expect(listener.acceptsMultishot == multishot)
            // The first accept arms the multishot; the 99 clients after it arrive with nobody accepting, so the
            // kernel takes 64 ahead, is paused, and is armed again once those are taken.
            async let first = listener.accept()
            var clients = [try await UringSocket.connect(to: listener.localEndpoint)]
            var accepted = [try await first]
            for _ in 1..<100 { clients.append(try await UringSocket.connect(to: listener.localEndpoint)) }
            for (index, client) in clients.enumerated() { try await client.send([UInt8(index)]) }
            for _ in 1..<100 { accepted.append(try await listener.accept()) }
            var byAddress: [Endpoint: UInt8] = [:]
            for (index, client) in clients.enumerated() { byAddress[client.localEndpoint] = UInt8(index) }
            #expect(Set(accepted.map(\.remoteEndpoint)) == Set(byAddress.keys))
            for server in accepted {
                // What arrives on each accepted socket is what the client at its peer address sent.
                #expect(try await server.receive(maximumLength: 1) == byAddress[server.remoteEndpoint].map { [$0] })
            }
            for socket in clients + accepted { await socket.close() }
            await listener.close()
        }
    }

    @Test("Clients the multishot accepted ahead and nobody took are closed with the listener: each sees the end")
    func untakenClientsAreClosed() async throws {
        try await SocketTest.run {
            let listener = try await UringListener.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            #expect(listener.acceptsMultishot)
            async let first = listener.accept()
            let firstClient = try await UringSocket.connect(to: listener.localEndpoint)
            let firstServer = try await first
            let sockets = { Syscall.openDescriptors().filter { $0.contains("socket:") }.count }
            let before = sockets()
            var clients: [UringSocket] = []
            for _ in 0..<5 { clients.append(try await UringSocket.connect(to: listener.localEndpoint)) }
            // Each client is a socket here and, once the armed multishot took it, another on the listener's side.
            let deadline = ContinuousClock.now + .seconds(10)
            while sockets() < before + 10, ContinuousClock.now < deadline { await Task.yield() }
            #expect(sockets() == before + 10)
            await listener.close()
            for client in clients {
                let (bytes, error) = await Self.readAll(client)
                #expect(bytes.isEmpty && (error == nil || error?.kind == .reset))
                await client.close()
            }
            await firstClient.close()
            await firstServer.close()
        }
    }

    @Test(
        "A zero-copy send: queued bytes first, then 4 MiB from the caller's buffer, then queued bytes again, in order")
    func zeroCopySend() async throws {
        try await SocketTest.run {
            let (listener, client, server) = try await Self.pair()
            let large = (0..<(4 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ $0 >> 12) }
            let reading = Task { await Self.readAll(server) }
            try await client.send([1, 2, 3])
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: large.count, alignment: 16)
            defer { buffer.deallocate() }
            large.withUnsafeBytes { buffer.copyMemory(from: $0) }
            try await client.send(zeroCopy: UnsafeRawBufferPointer(buffer))
            try await client.send([4, 5, 6])
            try await client.closeOutput()
            let (got, error) = await reading.value
            #expect(error == nil)
            #expect(got.count == large.count + 6)
            #expect(got == [1, 2, 3] + large + [4, 5, 6])
            await client.close()
            await server.close()
            await listener.close()
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
                let address = UInt(bitPattern: buffer.baseAddress)
                let outgoing = UInt(bitPattern: request.baseAddress)
                // The ring's operations name the number: borrowed until they have completed.
                let results = try await client.withDescriptorAsync { (fd) async throws(ConnectionError) in
                    let fd = fd.number
                    return await withCheckedContinuation { (done: CheckedContinuation<[Int32], Never>) in
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
                }
                #expect(results == [Int32(probe.count), Int32(probe.count)])
                #expect(Array(buffer[..<probe.count]) == probe)
            }
        }
    }

    @Test(
        "UringRing.sendThenReceive: the reply in one completion, also when it was waiting already; a failed send ends it with the send's error"
    )
    func sendThenReceive() async throws {
        try await SocketTest.run {
            try await Self.withEcho { client in
                let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64, alignment: 16)
                defer { buffer.deallocate() }
                let probe = Array("ping".utf8)
                buffer.copyBytes(from: probe)
                let address = UInt(bitPattern: buffer.baseAddress)
                /// The pair on the ring; every handler call, in order, until the first. The ring's operations
                /// name the number: borrowed until they have completed.
                func exchange(_ count: Int) async throws -> [Int32] {
                    try await client.withDescriptorAsync { (fd) async throws(ConnectionError) in
                        let fd = fd.number
                        return await withCheckedContinuation { (done: CheckedContinuation<[Int32], Never>) in
                            client.loop.execute { ring in
                                let memory = UnsafeMutableRawBufferPointer(
                                    start: UnsafeMutableRawPointer(bitPattern: address), count: 64)
                                ring.sendThenReceive(
                                    fd, UnsafeRawBufferPointer(rebasing: memory[..<count]), into: memory
                                ) {
                                    done.resume(returning: [$0])
                                }
                            }
                        }
                    }
                }
                #expect(try await exchange(probe.count) == [Int32(probe.count)])
                #expect(Array(buffer[..<probe.count]) == probe)
                // A reply already waiting when the pair is submitted (the receive arms its poll first where the
                // kernel has IORING_RECVSEND_POLL_FIRST): the receive takes it at once, not after the next reply.
                let early = Array("early".utf8)
                _ = try early.withUnsafeBytes { bytes throws(ConnectionError) in
                    try client.withDescriptor { (fd) throws(ConnectionError) in try Syscall.send(fd, bytes) }
                }
                #expect(
                    try client.withDescriptor { (fd) throws(ConnectionError) in
                        try Syscall.poll(fd, events: Syscall.pollIn, timeoutMilliseconds: 10_000)
                    } != 0)
                let first = try await exchange(probe.count)
                let taken = Int(first.first ?? 0)
                try #require(taken >= early.count && taken <= early.count + probe.count, "\(first)")
                // The rest (the second reply, unless it came in the same read) is read here, so that the next
                // exchange starts from an empty socket: every byte, in order.
                var replies = Array(buffer[..<taken])
                var rest = [UInt8](repeating: 0, count: early.count + probe.count - taken)
                var got = 0
                while got < rest.count {
                    let result = try rest.withUnsafeMutableBytes { bytes throws(ConnectionError) in
                        try client.withDescriptor { (fd) throws(ConnectionError) in
                            try Syscall.recv(fd, UnsafeMutableRawBufferPointer(rebasing: bytes[got...]))
                        }
                    }
                    guard case .processed(let count) = result, count > 0 else { break }
                    got += count
                }
                replies += rest
                #expect(replies == early + probe)
                // The client's sending side shut: the send fails (EPIPE), the receive never runs, one completion.
                try client.withDescriptor { (fd) throws(ConnectionError) in try Syscall.shutdown(fd, .write) }
                #expect(try await exchange(probe.count) == [-EPIPE])
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

    @Test("A UDP server's sends from the ring's thread wait for no completion: 100 echoes arrive, in order")
    func udpSendsWithoutWaiting() async throws {
        try await SocketTest.run {
            let backend = UringBackend()
            let listener = try await backend.listen(
                on: try Endpoint(url: "udp://127.0.0.1:0"), options: ConnectionOptions())
            let client = try await backend.connect(to: listener.localEndpoint, options: ConnectionOptions())
            try await client.send([0])
            let peer = try await listener.accept()
            #expect(try await peer.receive()?.bytes == [0])
            // On the ring's thread each send only queues its entry; all of them go with the loop's next enter. (As
            // many as the client's receive buffer holds at once: a burst beyond it would be dropped there.)
            let count = 100
            let sending = Task(executorPreference: peer.preferredExecutor) {
                for index in 0..<count { try await peer.send([UInt8(index)]) }
            }
            try await sending.value
            for index in 0..<count {
                #expect(try await client.receive()?.bytes == [UInt8(index)])
            }
            // Closing at once after a burst frees every copy (AddressSanitizer: scripts/sanitize address).
            for index in 0..<100 { try await peer.send([UInt8(index)]) }
            await peer.close()
            await listener.close()
            await client.close()
        }
    }

    @Test("A failed send without waiting is thrown by the next send to the same address only, once")
    func udpSendFailuresBySender() throws {
        let failures = UringSendFailures()
        let first = SocketAddress.loopbackIPv4(port: 1000)
        let second = SocketAddress.loopbackIPv4(port: 1001)
        failures.record(-ENETUNREACH, to: first)
        #expect(failures.take(for: second) == nil)
        let error = try #require(failures.take(for: first))
        #expect(error.systemCode?.code == ENETUNREACH)
        #expect(failures.take(for: first) == nil)
        // While a send waits for room, sends do not take the way without waiting; its failure is kept too.
        failures.waitForRoom()
        #expect(failures.isWaitingForRoom)
        failures.roomCame((code: -EPERM, address: second))
        #expect(!failures.isWaitingForRoom)
        #expect(failures.take(for: second)?.systemCode?.code == EPERM)
    }

    /// Reads until the end of the stream; the bytes, and the error that ended it, if any.
    private static func readAll(_ socket: UringSocket) async -> ([UInt8], ConnectionError?) {
        var got: [UInt8] = []
        do throws(ConnectionError) {
            while let bytes = try await socket.receive() { got += bytes }
        } catch {
            return (got, error)
        }
        return (got, nil)
    }

    @Test(
        "TCP sends gather in the send queue: small, large and small again arrive in order, all before a close's FIN",
        arguments: [true, false])
    func sendQueueKeepsOrderThroughClose(onRing: Bool) async throws {
        try await SocketTest.run {
            let (listener, client, server) = try await Self.pair()
            let reading = Task { await Self.readAll(server) }
            var expected: [UInt8] = []
            let sends: [[UInt8]] =
                (0..<500).map { index in [UInt8](repeating: UInt8(index % 251), count: 1400) }
                + [[UInt8](repeating: 0xAB, count: 1 << 20)]  // more than the queue holds: from the caller's bytes
                + (0..<500).map { index in [UInt8](repeating: UInt8(index % 241), count: 1 + index % 300) }
            for bytes in sends { expected += bytes }
            try await withTaskExecutorPreference(onRing ? client.loop : nil) {
                for bytes in sends { try await client.send(bytes) }
                // Right behind the last send: the queued bytes go first, then the FIN.
                await client.close()
            }
            let (got, error) = await reading.value
            #expect(error == nil)
            #expect(got.count == expected.count)
            #expect(got == expected)
            await server.close()
            await listener.close()
        }
    }

    @Test("A batch the kernel refuses fails the queue: a later send says why; close() still returns")
    func sendQueueReportsFailure() async throws {
        try await SocketTest.run {
            let (listener, client, server) = try await Self.pair()
            await server.abort()  // the client's next bytes meet a reset
            var failure: ConnectionError?
            // Each send returns once queued; the reset comes back on a later one.
            for _ in 0..<1000 where failure == nil {
                do throws(ConnectionError) {
                    try await client.send([UInt8](repeating: 1, count: 1000))
                } catch {
                    failure = error
                }
            }
            #expect(failure?.kind == .reset || failure?.kind == .closed, "\(String(describing: failure))")
            await client.close()
            await listener.close()
        }
    }

    @Test("A reset the queue's send took from the socket is what a receive then reports, not the end of the stream")
    func resetTakenBySendIsReceived() async throws {
        try await SocketTest.run {
            let (listener, client, server) = try await Self.pair()
            await client.abort()
            // Until the reset has reached the server's socket (poll reports it without taking it; under load the
            // loopback may deliver it after abort() returned).
            let (polled, revents) = try server.withDescriptor { (fd) throws(ConnectionError) in
                var poller = pollfd(fd: fd.number, events: Int16(POLLIN), revents: 0)
                return (poll(&poller, 1, 10_000), poller.revents)
            }
            try #require(polled == 1 && revents & Int16(POLLERR) != 0, "poll: \(polled), \(revents)")
            // The kernel reports the reset once: to this send's batch, sent after the reset came.
            try await server.send([1])
            await #expect(throws: ConnectionError.self) { try await server.closeOutput() }
            do {
                let bytes = try await server.receive()
                Issue.record("the receive ended without the reset: \(String(describing: bytes))")
            } catch {
                #expect((error as? ConnectionError)?.kind == .reset, "\(error)")
            }
            await server.close()
            await listener.close()
        }
    }

    @Test("close() drops queued bytes a peer never takes after closeLinger, and leaves no descriptor")
    func sendQueueLingerIsBounded() async throws {
        try await SocketTest.run(timeLimit: .seconds(60)) {
            var options = ConnectionOptions()
            options.receiveBufferSize = 4096
            options.sendBufferSize = 4096
            let listener = try await UringListener.listen(
                on: try Endpoint(url: "tcp://127.0.0.1:0"), options: options)
            async let accepted = listener.accept()
            let client = try await UringSocket.connect(to: listener.localEndpoint, options: options)
            let server = try await accepted  // never reads
            // Until a send waits: the kernel's buffers and the queue are full.
            let filling = Task {
                while true { try await client.send([UInt8](repeating: 2, count: 16 * 1024)) }
            }
            // The peer never reads: once a batch is stuck in flight and the next one gathers behind it, they stay.
            let deadline = ContinuousClock.now + .seconds(20)
            while client.bufferedAmount <= UringSocket.sendQueueLimit && ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(10))
            }
            try #require(client.bufferedAmount > UringSocket.sendQueueLimit, "the queue never filled")
            let closing = ContinuousClock.now
            await client.close()
            let took = ContinuousClock.now - closing
            #expect(took >= UringSocket.closeLinger - .milliseconds(50) && took < UringSocket.closeLinger + .seconds(3))
            let result = await filling.result
            #expect(throws: ConnectionError.self) { try result.get() }
            await server.close()
            await listener.close()
        }
    }
}
