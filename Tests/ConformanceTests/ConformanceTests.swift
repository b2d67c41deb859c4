import ConnectionCore
import ConnectionTestKit
import POSIXSupport
import SocketStyles
import Synchronization
import Testing

/// The conformance suite: each scenario written once, run for every backend x transport.
/// Every scenario runs through `SocketTest.run`, which bounds it in time and fails it if a descriptor is left
/// open.
@Suite("Conformance", .timeLimit(.minutes(20)))
struct ConformanceTests {
    // MARK: Echo

    @Test("TCP echo keeps every byte in order", arguments: ContractCases.streams, [1, 65_536, 8 * 1024 * 1024])
    func tcpEcho(_ test: ConformanceCase, size: Int) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            let client = try await test.connect(to: server.endpoint)
            let payload = pattern(size, seed: 7)
            // Send and receive at once: a client that sent 8 MiB before reading would stall both ends.
            async let sent: Void = {
                var offset = 0
                while offset < payload.count {
                    let end = min(offset + 100_000, payload.count)
                    try await client.send(Array(payload[offset..<end]))
                    offset = end
                }
            }()
            let echoed = try await client.receive(exactly: size)
            try await sent
            #expect(echoed == payload)
            await client.close()
            await server.stop()
        }
    }

    @Test("UDP datagrams arrive whole", arguments: ContractCases.udp, [0, 1, 1400, 65_507])
    func udpDatagramsArriveWhole(_ test: ConformanceCase, size: Int) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            let client = try await test.connect(to: server.endpoint)
            let payload = pattern(size, seed: 3)
            let echoed = try await udpRequest(client, payload)
            #expect(echoed.count == size)
            #expect(echoed == payload)
            await client.close()
            await server.stop()
        }
    }

    // One server thread: the bound is each listening socket's, and two share the peers between them.
    @Test(
        "A UDP listener keeps at most maximumUDPPeers peers and forgets idle ones",
        arguments: ConformanceCase.udp)
    func udpPeersBounded(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let idle = Duration.milliseconds(300)
            let listener = try await test.listen(
                options: .with {
                    $0.maximumUDPPeers = 4
                    $0.udpPeerIdleTimeout = idle
                })
            var clients: [any Connection] = []
            var peers: [any Connection] = []
            /// A datagram from a new client socket (a new source port), and the peer the listener makes for it.
            func newPeer(_ tag: UInt8) async throws {
                let client = try await test.connect(to: listener.localEndpoint)
                clients.append(client)
                for _ in 0..<5 {
                    try await client.send([tag])
                    if let peer = try? await withTimeLimit(.milliseconds(500), { try await listener.accept() }) {
                        #expect(try await peer.receive()?.bytes == [tag])
                        peers.append(peer)
                        return
                    }
                }
                throw SocketTest.Failure(description: "no peer for client \(tag)")
            }
            for tag in 0..<8 { try await newPeer(UInt8(tag)) }
            // At the cap, each new address made the listener forget the quietest peer: the first four.
            for peer in peers[0..<4] {
                await expectConnectionError(.resourceExhausted) { () throws(ConnectionError) in try await peer.receive()
                }
            }
            // Quiet past the idle timeout (a deadline being tested, not a race), the next new address sweeps the
            // other four away.
            try await Task.sleep(for: idle + .milliseconds(100))
            try await newPeer(8)
            for peer in peers[4..<8] {
                await expectConnectionError(.timedOut) { () throws(ConnectionError) in try await peer.receive() }
            }
            // The newest peer is served as usual.
            try await peers[8].send([9])
            #expect(try await clients[8].receive()?.bytes == [9])
            for connection in clients + peers { await connection.close() }
            await listener.close()
        }
    }

    static let streamListeners = ContractCases.all.filter { $0.transport != .udp }

    @Test(
        "A stream listener keeps at most maximumConnections; one more is closed at once and the others go on",
        arguments: streamListeners)
    func connectionLimit(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer(on: test.anyPort, options: .with { $0.maximumConnections = 2 })
            let first = try await test.connect(to: server.endpoint)
            let second = try await test.connect(to: server.endpoint)
            for client in [first, second] { try await expectEcho(client, "in") }
            // The third is closed before any TLS or WebSocket handshake: its connect fails, or (tcp) the stream
            // ends. Either way it is never served.
            do {
                let third = try await test.connect(to: server.endpoint)
                let outcome: Message?? = try? await withTimeLimit(.seconds(10)) {
                    try? await third.send(.text("refused?"))
                    return try await third.receive()
                }
                #expect(outcome.map { $0 == nil } ?? true, "the third client was served")
                await third.close()
            } catch {
                #expect(
                    (error as? ConnectionError)?.kind != .timedOut,
                    "the third client waited instead of being refused: \(error)")
            }
            for client in [first, second] { try await expectEcho(client, "still") }
            // Once one leaves, a new client is served (the server frees the slot when it sees the close).
            await first.close()
            var served = false
            for _ in 0..<100 where !served {
                if let client = try? await test.connect(to: server.endpoint) {
                    served =
                        (try? await withTimeLimit(.seconds(5)) { try await self.expectEcho(client, "again") }) != nil
                    await client.close()
                }
                if !served { try await Task.sleep(for: .milliseconds(20)) }
            }
            #expect(served, "no client was served after one of the two left")
            await second.close()
            await server.stop()
        }
    }

    @Test(
        "A connection idle for idleTimeout is closed by the server; an active one is not", arguments: streamListeners)
    func idleTimeout(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let idle = Duration.milliseconds(300)
            let listener = try await test.listen(options: .with { $0.idleTimeout = idle })
            let quiet = try await test.connect(to: listener.localEndpoint)
            let quietServed = try await listener.accept()
            let active = try await test.connect(to: listener.localEndpoint)
            let activeServed = try await listener.accept()
            let clock = ContinuousClock()
            let start = clock.now
            async let quietEnd: ConnectionError? = {
                do {
                    _ = try await quietServed.receive()
                    return nil
                } catch {
                    return error as? ConnectionError
                }
            }()
            // The active client talks every 100 ms, for twice the idle time.
            for round in 0..<6 {
                try await active.send(.text("round \(round)"))
                let received = try await activeServed.receive()
                #expect(received?.bytes == Array("round \(round)".utf8))
                try await activeServed.send(received!)
                #expect(try await active.receive()?.bytes == Array("round \(round)".utf8))
                try await Task.sleep(for: .milliseconds(100))
            }
            let error = await quietEnd
            #expect(clock.now - start >= idle)
            #expect(error != nil, "the idle connection's receive ended without an error")
            if test.transport == .tcp { #expect(error?.kind == .timedOut, "\(String(describing: error))") }
            // The quiet client sees its connection end.
            let seen: Message?? = try? await withTimeLimit(.seconds(10)) { try await quiet.receive() }
            #expect(seen.map { $0 == nil } ?? true)
            for connection in [quiet, quietServed, active, activeServed] { await connection.close() }
            await listener.close()
        }
    }

    @Test(
        "Backend.connection gives NWConnection's states: setup, preparing, ready, the peer's close (with a WebSocket's code and reason), cancelled",
        arguments: ContractCases.all)
    func statesWithoutReconnection(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let listener = try await test.listen()
            let client = test.backend.connection(to: listener.localEndpoint, tls: test.clientTLS)
            let seen = Guarded<[ConnectionState]>([])
            let watcher = Task { for await state in client.states { seen.withLock { $0.append(state) } } }
            try await client.send(Array("hi".utf8))  // queued until ready (udp: sent at once once connected)
            let server = try await listener.accept()
            let message = try await server.receive()
            #expect(message.map { String(decoding: $0.bytes, as: UTF8.self) } == "hi")
            // Queued sends go out just before the state turns ready: the server may read them first.
            try await withTimeLimit(.seconds(5)) {
                while client.state != .ready { try await Task.sleep(for: .milliseconds(5)) }
            }
            let expectedEnd: ConnectionState?
            switch test.transport {
            case .udp:
                expectedEnd = nil  // a udp peer cannot end the association
                await server.close()
            case .ws, .wss:
                expectedEnd = .closed(code: .goingAway, reason: "bye")
                let webSocket = try #require(server as? WebSocketConnection)
                let closing = Task { await webSocket.close(code: .goingAway, reason: "bye") }
                #expect(try await client.receive() == nil)
                await closing.value
            default:
                expectedEnd = .closed(code: nil, reason: "")
                await server.close()
                #expect(try await client.receive() == nil)
            }
            if let expectedEnd {
                #expect(client.state == expectedEnd)
                // The end is reported once; the connection is not replaced.
                await expectConnectionError(.closed) { () throws(ConnectionError) in try await client.receive() }
                await expectConnectionError(.closed) { () throws(ConnectionError) in
                    try await client.send(Array("late".utf8))
                }
            }
            await client.close()
            await watcher.value
            var expected: [ConnectionState] = [.setup, .preparing, .ready]
            if let expectedEnd { expected.append(expectedEnd) }
            expected.append(.cancelled)
            #expect(seen.withLock { $0 } == expected)
            await listener.close()
        }
    }

    @Test(
        "ReconnectPolicy.never: a refused connect is preparing, then failed(refused), and sends fail with it",
        arguments: ContractCases.all.filter { $0.transport != .udp })
    func refusedWithoutReconnection(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let refusing = try RefusingPort()
            defer { refusing.close() }
            let endpoint = try refusing.endpoint(test.transport)
            let client = ReconnectingConnection(
                backend: test.backend, endpoint: endpoint, tls: test.clientTLS, policy: .never)
            let seen = Guarded<[ConnectionState]>([])
            let watcher = Task { for await state in client.states { seen.withLock { $0.append(state) } } }
            await expectConnectionError(.refused) { () throws(ConnectionError) in try await client.receive() }
            await expectConnectionError(.refused) { () throws(ConnectionError) in try await client.send([1]) }
            await client.close()
            await watcher.value
            let states = seen.withLock { $0 }
            #expect(states.prefix(2) == [.setup, .preparing])
            #expect(states.count == 4 && states.last == .cancelled)
            if states.count == 4, case .failed(let error) = states[2] {
                #expect(error.kind == .refused)
            } else {
                Issue.record("no failed state: \(states)")
            }
        }
    }

    private func expectEcho(_ client: any Connection, _ text: String) async throws {
        try await client.send(Array(text.utf8))
        let bytes =
            client.transport.isByteStream
            ? try await client.receive(exactly: text.utf8.count) : try await client.receive()?.bytes
        #expect(bytes == Array(text.utf8))
    }

    @Test("A 65,508-byte UDP datagram is too large", arguments: ContractCases.udp)
    func udpTooLarge(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            let client = try await test.connect(to: server.endpoint)
            await expectConnectionError(.messageTooLarge) { () throws(ConnectionError) in
                try await client.send(pattern(65_508))
            }
            // The connection still works afterwards.
            #expect(try await udpRequest(client, [1, 2, 3]) == [1, 2, 3])
            await client.close()
            await server.stop()
        }
    }

    // MARK: Byte stream versus messages

    @Test("TCP joins and splits sends; receive(exactly:) reassembles", arguments: ContractCases.streams)
    func tcpCoalescingAndSplitting(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let listener = try await test.listen()
            let client = try await test.connect(to: listener.localEndpoint)
            let server = try await listener.accept()
            // 100 small sends, read back as 10 records of 100 bytes however the stream cut them.
            let sends = (0..<100).map { pattern(10, seed: UInt8($0)) }
            for chunk in sends { try await client.send(chunk) }
            var records: [[UInt8]] = []
            for _ in 0..<10 { records.append(try await server.receive(exactly: 100)) }
            #expect(records.flatMap { $0 } == sends.flatMap { $0 })
            // One large send, read with a small limit: several receives, none above the limit.
            let big = pattern(50_000, seed: 9)
            try await client.send(big)
            var got: [UInt8] = []
            var receives = 0
            while got.count < big.count {
                let message = try #require(try await server.receive(maximumLength: 1000))
                #expect(message.count <= 1000 && message.count > 0)
                got += message.bytes
                receives += 1
            }
            #expect(got == big)
            #expect(receives >= 50)
            await client.close()
            await server.close()
            await listener.close()
        }
    }

    @Test("UDP keeps each datagram separate", arguments: ContractCases.udp)
    func udpBoundaries(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let (listener, client, server) = try await test.connectedPair(sending: [1])
            #expect(try await server.receive()?.bytes == [1])
            // Sizes chosen so that a joined or split datagram would be visible.
            for size in [10, 1, 300, 0, 7] {
                try await client.send(pattern(size, seed: UInt8(truncatingIfNeeded: size)))
            }
            var sizes: [Int] = []
            for _ in 0..<5 {
                let message = try #require(try await server.receive())
                #expect(message.bytes == pattern(message.count, seed: UInt8(truncatingIfNeeded: message.count)))
                sizes.append(message.count)
            }
            #expect(sizes == [10, 1, 300, 0, 7])  // loopback neither loses nor reorders such a short burst
            // Replies go back to the sender's address.
            try await server.send([42])
            #expect(try await client.receive()?.bytes == [42])
            await client.close()
            await server.close()
            await listener.close()
        }
    }

    // MARK: Failures with clear errors

    @Test("Connecting to a closed TCP port is refused", arguments: ContractCases.streams)
    func tcpRefused(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            // A socket bound and not listening: the port is ours, and a SYN to it is answered with RST.
            let refusing = try RefusingPort()
            defer { refusing.close() }
            let error = await expectConnectionError(.refused) { () throws(ConnectionError) in
                try await test.connect(to: try refusing.endpoint(.tcp))
            }
            #expect(error?.systemCode?.name.contains("ECONNREFUSED") == true)
        }
    }

    @Test(
        "A refused connect names the URL asked for (ws://, not the tcp:// under it)", arguments: ContractCases.streams
    )
    func refusedNamesTheURL(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let refusing = try RefusingPort()
            defer { refusing.close() }
            let endpoint = try refusing.endpoint(test.transport)
            let error = await expectConnectionError(.refused) { () throws(ConnectionError) in
                try await test.connect(to: endpoint)
            }
            #expect(error?.detail.contains("\(endpoint)") == true, "\(String(describing: error))")
            if test.transport != .tcp { #expect(error?.detail.contains("tcp://") == false) }
        }
    }

    @Test("A UDP datagram to a closed port comes back refused", arguments: ContractCases.udp)
    func udpRefused(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let placeholder = try BSDSocket.listen(on: try Endpoint(url: "udp://127.0.0.1:0"))
            let port = try placeholder.localAddress.port
            placeholder.close()
            let client = try await test.connect(to: try Endpoint(url: "udp://127.0.0.1:\(port)"))
            try await client.send([1])  // UDP sends without asking; the ICMP "port unreachable" comes back later
            await expectConnectionError(.refused) { () throws(ConnectionError) in try await client.receive() }
            await client.close()
        }
    }

    @Test("An unknown host is reported as such", arguments: ContractCases.all)
    func unknownHost(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let endpoint = try Endpoint(url: "\(test.transport)://no-such-host.invalid:9")
            await expectConnectionError(.hostNotFound) { () throws(ConnectionError) in
                try await test.connect(to: endpoint)
            }
        }
    }

    @Test("Listening on a taken address fails with addressInUse", arguments: ContractCases.all)
    func addressInUse(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let first = try await test.listen()
            await expectConnectionError(.addressInUse) { () throws(ConnectionError) in
                try await test.backend.listen(on: first.localEndpoint, tls: test.serverTLS)
            }
            await first.close()
        }
    }

    @Test("A connect that cannot complete times out", arguments: ContractCases.streams)
    func connectTimeout(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            // A listener with a backlog of 1 whose queue is full drops further SYNs, so the handshake never
            // completes: a real, local connect that hangs.
            let (endpoint, closeListener) = try await test.listenerNobodyAccepts(backlog: 1)
            var fillers: [any Connection] = []
            let short = ConnectionOptions.with { $0.connectTimeout = .milliseconds(300) }
            var timedOut = false
            for _ in 0..<8 {
                do throws(ConnectionError) {
                    fillers.append(try await test.connect(to: endpoint, options: short))
                } catch {
                    #expect(error.kind == .timedOut, "\(error)")
                    timedOut = error.kind == .timedOut
                    break
                }
            }
            #expect(timedOut)
            for filler in fillers { await filler.close() }
            await closeListener()
        }
    }

    // MARK: Ending

    @Test("A peer's half-close is a clean end, reported exactly once", arguments: ContractCases.streams)
    func halfClose(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let listener = try await test.listen()
            let client = try await test.connect(to: listener.localEndpoint)
            let server = try await listener.accept()
            try await client.send([1, 2, 3])
            try await client.closeOutput()
            #expect(try await server.receive(exactly: 3) == [1, 2, 3])
            #expect(try await server.receive() == nil)
            await expectConnectionError(.closed) { () throws(ConnectionError) in try await server.receive() }
            // The other direction still works after a half-close.
            try await server.send([4, 5])
            #expect(try await client.receive(exactly: 2) == [4, 5])
            await expectConnectionError(.closed) { () throws(ConnectionError) in try await client.send([6]) }
            await server.close()
            #expect(try await client.receive() == nil)
            await client.close()
            await listener.close()
        }
    }

    /// close() from one task while others half-close and send: each call returns (done, or `.closed`), none is
    /// left waiting. A half-close queued on the loop just after close() took the streams away once waited forever
    /// (runloop), and hung a relay's stop under it. Repeated, because it depends on how the calls interleave.
    @Test("close() racing closeOutput() and send(): every call returns", arguments: ContractCases.streams)
    func closeRacesHalfCloseAndSend(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let listener = try await test.listen()
            for _ in 0..<100 {
                let client = try await test.connect(to: listener.localEndpoint)
                let server = try await listener.accept()
                await withDiscardingTaskGroup { group in
                    group.addTask { try? await client.closeOutput() }
                    group.addTask { try? await client.send([1]) }
                    group.addTask { await client.close() }
                }
                await expectConnectionError(.closed) { () throws(ConnectionError) in try await client.closeOutput() }
                await server.close()
            }
            await listener.close()
        }
    }

    /// A receiver that emptied the kernel's queue and waits again, when data and the FIN (or a reset) then come
    /// together: the receive after the data must find the end. The readiness that announced both is spent on the
    /// data; a backend that waits for more readiness after a short read (to save a read that would find
    /// nothing) must still see an end that is a state, not data. Repeated, on and off the connection's executor,
    /// because it depends on both arriving before the receiver's loop looks.
    @Test(
        "Data followed at once by the end (FIN or reset) is followed by the end, on and off the executor",
        arguments: ContractCases.streams)
    func endRightBehindData(_ test: ConformanceCase) async throws {
        try await SocketTest.run(timeLimit: .seconds(120)) {
            let listener = try await test.listen()
            for round in 0..<24 {
                let resets = round % 4 == 3
                let client = try await test.connect(to: listener.localEndpoint)
                let server = try await listener.accept()
                let executor = round % 2 == 0 ? server.preferredExecutor : nil
                let receiving = Task(executorPreference: executor) { () -> ([UInt8], ConnectionError?) in
                    var got: [UInt8] = []
                    do throws(ConnectionError) {
                        got = try await server.receive(exactly: 1)
                        // The queue is empty now: this receive waits, then data and the end come together.
                        while let message = try await server.receive() { got += message.bytes }
                    } catch {
                        return (got, error)
                    }
                    return (got, nil)
                }
                try await client.send([0])
                try await client.send([1, 2, 3])
                if resets {
                    await client.abort()
                } else {
                    try await client.closeOutput()
                }
                let (got, error) = await receiving.value
                if resets {
                    // What came before a reset may be read first (Linux keeps it readable); the end is a reset.
                    #expect([0, 1, 2, 3].starts(with: got), "round \(round): \(got)")
                    #expect(error?.kind == .reset, "round \(round): \(String(describing: error))")
                } else {
                    #expect(got == [0, 1, 2, 3], "round \(round)")
                    #expect(error == nil, "round \(round): \(String(describing: error))")
                }
                await client.close()
                await server.close()
            }
            await listener.close()
        }
    }

    @Test(
        "Bytes the kernel holds when a reset comes are all read before the reset, reading paused meanwhile",
        arguments: ContractCases.all.filter { $0.transport == .tcp })
    func resetBehindHeldBytes(_ test: ConformanceCase) async throws {
        try await SocketTest.run(timeLimit: .seconds(60)) {
            var options = ConnectionOptions()
            // The receiver reads at most a few KiB, then stops: the rest stays in its kernel when the reset comes.
            options.readChunkSize = 4096
            options.receiveQueueLimit = 4096
            let listener = try await test.listen(options: options)
            let raw = try await test.rawPeer(to: listener.localEndpoint)
            let server = try await listener.accept()
            let sent = pattern(64 * 1024)
            try await raw.deliverThenReset(sent)
            var got: [UInt8] = []
            var failure: ConnectionError?
            do throws(ConnectionError) {
                while let message = try await server.receive() { got += message.bytes }
            } catch {
                failure = error
            }
            let intact = got == sent
            #expect(intact, "\(got.count) of \(sent.count) bytes, in order: \(sent.starts(with: got))")
            #expect(failure?.kind == .reset, "\(String(describing: failure))")
            await server.close()
            await raw.close()
            await listener.close()
        }
    }

    @Test(
        "abort() resets: the peer reads what came before, then gets reset; the aborted side is closed",
        arguments: ContractCases.all.filter { $0.transport != .udp })
    func abortResets(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let listener = try await test.listen()
            for serverAborts in [true, false] {
                let client = try await test.connect(to: listener.localEndpoint)
                let server = try await listener.accept()
                let (aborting, peer) = serverAborts ? (server, client) : (client, server)
                try await aborting.send([1, 2, 3])
                if test.transport.isByteStream {
                    #expect(try await peer.receive(exactly: 3) == [1, 2, 3])
                } else {
                    #expect(try await peer.receive()?.bytes == [1, 2, 3])
                }
                await aborting.abort()
                await expectConnectionError(.reset) { () throws(ConnectionError) in
                    while try await peer.receive() != nil {}
                }
                await expectConnectionError(.closed) { () throws(ConnectionError) in try await aborting.send([4]) }
                await aborting.close()
                await peer.close()
            }
            await listener.close()
        }
    }

    @Test(
        "A peer that never reads holds the sender back: a bounded amount goes in, then a send waits",
        arguments: ContractCases.all.filter { $0.transport != .udp })
    func sendIsBounded(_ test: ConformanceCase) async throws {
        try await SocketTest.run(timeLimit: .seconds(120)) {
            let listener = try await test.listen()
            let client = try await test.connect(to: listener.localEndpoint)
            let server = try await listener.accept()  // held, never read
            // 256 MiB: what a sender that buffers without bound would take in seconds.
            let (sent, stalled) = try await sendUntilHeldBack(
                client, chunk: [UInt8](repeating: 7, count: 64 * 1024), limit: 256 << 20, wait: .seconds(1))
            #expect(stalled, "\(sent) bytes went in and no send waited")
            // The kernel's buffers on loopback (a few MiB each way) and a backend's bounded queues: far below this.
            #expect(sent < 32 << 20, "\(sent) bytes went in before a send waited")
            // Over WebSocket the client's close frame waits behind what the server never read: the server's own
            // close reads up to it.
            await closeBoth(client, server)
            await listener.close()
        }
    }

    @Test("close() twice is a no-op; send and receive after close throw closed", arguments: ContractCases.all)
    func closeTwiceAndUseAfterClose(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            let client = try await test.connect(to: server.endpoint)
            await client.close()
            await client.close()
            await expectConnectionError(.closed) { () throws(ConnectionError) in try await client.send([1]) }
            await expectConnectionError(.closed) { () throws(ConnectionError) in try await client.receive() }
            await server.listener.close()
            await server.listener.close()
            await expectConnectionError(.closed) { () throws(ConnectionError) in try await server.listener.accept() }
            await server.stop()
        }
    }

    @Test(
        "messages ends normally when this side closes, from either end of a WebSocket, and throws when reset",
        arguments: ContractCases.all)
    func messagesEndOnClose(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let (listener, client, server) = try await test.connectedPair()
            // This side closes while the loop waits: the loop ends without an error (URLSessionWebSocketTask's
            // users stop on cancel(with:reason:); a close is not a failure).
            let (arrivals, arrived) = AsyncStream.makeStream(of: Int.self)
            let loop = Task { () async throws -> Int in
                var count = 0
                for try await _ in server.messages {
                    count += 1
                    arrived.yield(count)
                }
                arrived.finish()
                return count
            }
            var seen = arrivals.makeAsyncIterator()
            #expect(await seen.next() == 1)  // the loop runs and has read the first message
            // The other end's loop ends normally too when this side's close reaches it (not over UDP: nothing
            // tells a UDP peer).
            let peerLoop =
                test.transport == .udp ? nil : Task { () async throws in for try await _ in client.messages {} }
            await server.close()
            let result = await loop.result
            #expect(throws: Never.self) { try result.get() }
            if let peerLoop {
                let peerResult = await peerLoop.result
                #expect(throws: Never.self) { try peerResult.get() }
            }
            await client.close()
            // An abnormal end (a reset, no close handshake) still throws.
            if test.transport != .udp {
                let client = try await test.connect(to: listener.localEndpoint)
                let server = try await listener.accept()
                let loop = Task { () async throws -> Int in
                    var count = 0
                    for try await _ in client.messages { count += 1 }
                    return count
                }
                await server.abort()
                let result = await loop.result
                #expect(throws: ConnectionError.self) { try result.get() }
                if case .failure(let error) = result { #expect((error as? ConnectionError)?.kind == .reset) }
                await client.close()
            }
            await listener.close()
        }
    }

    @Test("close() wakes a receive that is waiting", arguments: ContractCases.all)
    func closeWakesReceive(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            let client = try await test.connect(to: server.endpoint)
            let waiting = Task { () throws(ConnectionError) in try await client.receive() }
            await client.close()
            let result = await waiting.result
            #expect(throws: ConnectionError.self) { try result.get() }
            if case .failure(let error) = result { #expect((error as? ConnectionError)?.kind == .closed) }
            await server.stop()
        }
    }

    @Test("Cancelling a waiting receive returns promptly and loses nothing", arguments: ContractCases.all)
    func cancelPendingReceive(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            try await expectCancelledReceiveLosesNothing(test) { server in
                _ = try await server.receive()
            } readBack: { server in
                try await test.transport.isByteStream ? server.receive(exactly: 3) : server.receive()?.bytes ?? []
            }
        }
    }

    /// A receive that waits on the connection's own executor (where a backend may wait for the socket in place,
    /// as bsd does) must not hold that executor: another task there still runs, and cancelling or closing ends
    /// the wait at once, losing nothing.
    @Test(
        "On the connection's executor, a waiting receive lets other tasks run and ends when cancelled or closed",
        arguments: ContractCases.all)
    func waitingReceiveOnItsExecutor(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let (listener, client, server) = try await test.connectedPair()
            let executor = server.preferredExecutor
            let stream = test.transport.isByteStream
            @Sendable func receiveOne(
                _ connection: any Connection, _ count: Int
            ) async throws(ConnectionError)
                -> [UInt8]?
            {
                stream ? try await connection.receive(exactly: count) : try await connection.receive()?.bytes
            }
            #expect(try await Task(executorPreference: executor) { try await receiveOne(server, 1) }.value == [0])
            for ending in ["cancel", "run another task, then cancel", "close"] {
                let (started, didStart) = AsyncStream.makeStream(of: Void.self)
                let waiting = Task(executorPreference: executor) { () throws(ConnectionError) -> Message? in
                    didStart.yield()
                    return try await server.receive()
                }
                for await _ in started { break }
                if ending == "cancel" {
                    waiting.cancel()
                } else if ending.hasSuffix("cancel") {
                    // Another task on the same executor runs while the receive waits.
                    try await Task(executorPreference: executor) { try await server.send([5]) }.value
                    #expect(try await receiveOne(client, 1) == [5])
                    waiting.cancel()
                } else {
                    // The client reads meanwhile, so it answers a WebSocket close frame or TLS close_notify (UDP:
                    // no close reaches the client, which is not waited for).
                    let draining = Task { while test.transport != .udp, (try? await client.receive()) != nil {} }
                    await server.close()
                    await draining.value
                }
                let result = await waiting.result
                if case .failure(let error) = result {
                    #expect((error as? ConnectionError)?.kind == (ending == "close" ? .closed : .cancelled))
                } else {
                    Issue.record("a receive ended by \(ending) returned \(result)")
                }
                if ending != "close" {
                    try await client.send([9, 8, 7])
                    let next = try await Task(executorPreference: executor) { try await receiveOne(server, 3) }.value
                    #expect(next == [9, 8, 7])
                }
            }
            await client.close()
            await listener.close()
        }
    }

    /// A receive and the send whose reply it waits for, started together on the connection's executor (an
    /// open-loop client's receiver and sender): however the executor batches their jobs, the receive must not
    /// wait in a way that keeps the send from running. bsd once blocked its reader thread in poll(2) for the
    /// reply while the send sat behind it in the same batch of jobs.
    @Test(
        "On the connection's executor, a receive started just before the send it waits for still gets its reply",
        arguments: ContractCases.all)
    func receiveStartedBeforeItsSend(_ test: ConformanceCase) async throws {
        try await SocketTest.run(timeLimit: .seconds(20)) {
            let (listener, client, server) = try await test.connectedPair()
            let stream = test.transport.isByteStream
            let first = try await stream ? server.receive(exactly: 1) : server.receive()?.bytes
            #expect(first == [0])
            for round in 0..<3 {
                // The server answers the client's [7] with [7, round]: the reply needs the send.
                let answering = Task {
                    let asked = stream ? try await server.receive(exactly: 1) : try await server.receive()?.bytes
                    try await server.send((asked ?? []) + [UInt8(round)])
                }
                let reply = try await Task(executorPreference: client.preferredExecutor) {
                    try await withThrowingTaskGroup(of: [UInt8]?.self) { group in
                        group.addTask {
                            stream ? try await client.receive(exactly: 2) : try await client.receive()?.bytes
                        }
                        group.addTask {
                            try await client.send([7])
                            return nil
                        }
                        var reply: [UInt8]?
                        while let result = try await group.next() { reply = reply ?? result }
                        return reply
                    }
                }.value
                #expect(reply == [7, UInt8(round)])
                try await answering.value
            }
            await closeBoth(client, server)  // neither end is reading
            await listener.close()
        }
    }

    // MARK: Servers

    @Test("One server serves 100 concurrent clients", arguments: ContractCases.all)
    func hundredConcurrentClients(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<100 {
                    group.addTask {
                        let client = try await test.connect(to: server.endpoint)
                        let payload = pattern(64 + index, seed: UInt8(index))
                        let echoed =
                            test.transport.isByteStream
                            ? try await { () async throws -> [UInt8] in
                                try await client.send(payload)
                                return try await client.receive(exactly: payload.count)
                            }()
                            : try await udpRequest(client, payload)
                        #expect(echoed == payload)
                        await client.close()
                    }
                }
                try await group.waitForAll()
            }
            #expect(server.connectionsServed == 100)
            await server.stop()
        }
    }

    @Test("A server keeps serving after a client vanishes", arguments: ContractCases.streams)
    func serverSurvivesVanishingClient(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            // A client that sends a lot and disappears without reading its echo.
            let rude = try await test.connect(to: server.endpoint)
            try await rude.send(pattern(200_000))
            await rude.close()
            let polite = try await test.connect(to: server.endpoint)
            try await polite.send([1, 2, 3])
            #expect(try await polite.receive(exactly: 3) == [1, 2, 3])
            await polite.close()
            await server.stop()
        }
    }

    @Test("IPv6 loopback works", arguments: ContractCases.all)
    func ipv6(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer(on: try Endpoint(url: "\(test.transport)://[::1]:0"))
            #expect(server.endpoint.host == .ipv6("::1"))
            let client = try await test.connect(to: server.endpoint)
            let payload = pattern(100, seed: 6)
            let echoed =
                test.transport.isByteStream
                ? try await { () async throws -> [UInt8] in
                    try await client.send(payload)
                    return try await client.receive(exactly: 100)
                }() : try await udpRequest(client, payload)
            #expect(echoed == payload)
            #expect(client.remoteEndpoint == server.endpoint)
            await client.close()
            await server.stop()
        }
    }

    @Test("Host names resolve (localhost)", arguments: ContractCases.all)
    func hostName(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            let client = try await test.connect(
                to: try Endpoint(url: "\(test.transport)://localhost:\(server.endpoint.port)"))
            let echoed =
                test.transport.isByteStream
                ? try await { () async throws -> [UInt8] in
                    try await client.send([5])
                    return try await client.receive(exactly: 1)
                }() : try await udpRequest(client, [5])
            #expect(echoed == [5])
            await client.close()
            await server.stop()
        }
    }
}

@Suite("Reconnection", .timeLimit(.minutes(20)))
struct ReconnectionTests {
    static let cases = ContractCases.all.filter { $0.transport != .udp }

    @Test(
        "ReconnectingConnection shows waiting while the server is down, queues sends, and carries on once it is back",
        arguments: cases)
    func serverRestart(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let first = try await test.echoServer()
            let endpoint = first.endpoint
            let client = ReconnectingConnection(
                backend: test.backend, endpoint: endpoint, tls: test.clientTLS,
                policy: .with {
                    $0.initialDelay = .milliseconds(20)
                    $0.maximumDelay = .milliseconds(100)
                })
            let seen = Guarded<[ConnectionState]>([])
            let watcher = Task { for await state in client.states { seen.withLock { $0.append(state) } } }
            try await expectEcho(client, "one")
            #expect(client.state == .ready)
            // A receive runs across the outage: it sees the loss, and gets what comes after the reconnection.
            let receiver = Task { try await self.receiveText(client, until: "three") }
            await first.stop()
            let lost = try await withTimeLimit(.seconds(10)) { () -> Bool in
                while true {
                    if case .waiting = client.state { return true }
                    try await Task.sleep(for: .milliseconds(10))
                }
            }
            #expect(lost)
            // Sent while down: queued, delivered after the reconnection; the send returns only then.
            let queued = Task { try await client.send(Array("three".utf8)) }
            let second = try await test.echoServer(on: endpoint)
            try await withTimeLimit(.seconds(20)) { try await queued.value }
            let echoed = try await withTimeLimit(.seconds(20)) { try await receiver.value }
            #expect(echoed.hasSuffix("three"))
            #expect(client.state == .ready)
            await client.close()
            #expect(client.state == .cancelled)
            await watcher.value
            let states = seen.withLock { $0 }
            #expect(states.first == .setup)
            #expect(states.contains { if case .waiting = $0 { true } else { false } })
            #expect(states.last == .cancelled)
            await second.stop()
        }
    }

    @Test(
        "A queued send reports what became of its message: the error that lost it, or cancelled by close()",
        arguments: cases)
    func queuedSendsReportTheirOutcome(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let refusing = try RefusingPort()  // refused for the whole test
            defer { refusing.close() }
            let endpoint = try refusing.endpoint(test.transport)
            // Three refused attempts, at least 40 + 80 ms apart: a send made now is queued, and must throw the
            // refusal once the connection gives up, not return as if it had been sent.
            let failing = ReconnectingConnection(
                backend: test.backend, endpoint: endpoint, tls: test.clientTLS,
                policy: .with {
                    $0.initialDelay = .milliseconds(40)
                    $0.jitter = 0
                    $0.maximumAttempts = 3
                })
            await expectConnectionError(.refused) { () throws(ConnectionError) in try await failing.send([1]) }
            if case .failed(let error) = failing.state {
                #expect(error.kind == .refused)
            } else {
                Issue.record("not failed: \(failing.state)")
            }
            await failing.close()
            // Queued while it keeps trying; close() ends the wait with cancelled. With room for one message, of
            // two sends one is refused as too many at once, so the other is known to be queued before the close.
            let closing = ReconnectingConnection(
                backend: test.backend, endpoint: endpoint, tls: test.clientTLS,
                policy: .with {
                    $0.initialDelay = .milliseconds(20)
                    $0.maximumDelay = .milliseconds(50)
                    $0.whileDisconnected = .queue(maximumMessages: 1)
                })
            let sends = Task { () async -> [ConnectionError.Kind?] in
                await withTaskGroup(of: ConnectionError.Kind?.self) { group in
                    for byte: UInt8 in [1, 2] {
                        group.addTask {
                            do {
                                try await closing.send([byte])
                                return nil
                            } catch {
                                return (error as? ConnectionError)?.kind
                            }
                        }
                    }
                    var kinds: [ConnectionError.Kind?] = []
                    // The refused one comes back first; then close, and the queued one comes back.
                    if let first = await group.next() {
                        kinds.append(first)
                        await closing.close()
                    }
                    for await kind in group { kinds.append(kind) }
                    return kinds
                }
            }
            let kinds = try await withTimeLimit(.seconds(10)) { await sends.value }
            #expect(kinds == [.resourceExhausted, .cancelled])
        }
    }

    @Test(
        "sendPing waits for the connection and its pong; pongs and the close show in webSocketEvents",
        arguments: cases)
    func pingOnReconnecting(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            let client = ReconnectingConnection(
                backend: test.backend, endpoint: server.endpoint,
                webSocket: .with { $0.reportsControlFrames = true }, tls: test.clientTLS, policy: .never)
            guard test.transport == .ws || test.transport == .wss else {
                await expectConnectionError(.unsupported) { () throws(ConnectionError) in
                    try await client.sendPing()
                }
                await client.close()
                await server.stop()
                return
            }
            // Called at once, before the connection is ready: it waits for it, then for the pong.
            try await client.sendPing([7, 7], timeout: .seconds(5))
            try await client.sendPing()
            try await expectEcho(client, "after the pings")
            await client.close()
            var events: [WebSocketEvent] = []
            for await event in client.webSocketEvents { events.append(event) }
            #expect(events.first == .opened(subprotocol: nil))
            #expect(events.contains(.pong([7, 7])) && events.contains(.pong([])))
            #expect(events.last.map { if case .closed = $0 { true } else { false } } == true)
            await server.stop()
        }
    }

    private func expectEcho(_ client: any Connection, _ text: String) async throws {
        try await client.send(Array(text.utf8))
        #expect(try await receiveText(client, until: text) == text)
    }

    /// Receives until the text so far ends with `suffix` (a byte stream may split or join).
    private func receiveText(_ client: any Connection, until suffix: String) async throws -> String {
        var text = ""
        while !text.hasSuffix(suffix) {
            guard let message = try await client.receive() else { break }
            text += String(decoding: message.bytes, as: UTF8.self)
        }
        return text
    }
}

/// What the contract suite runs: every backend x transport with the server on one thread, and every socket backend
/// x transport with it on two (``ConformanceCase/onTwoServerThreads``).
enum ContractCases {
    static let all = ConformanceCase.all + ConformanceCase.onTwoServerThreads
    static let streams = all.filter { $0.transport.isByteStream }
    static let udp = all.filter { $0.transport == .udp }
}
