import AsyncBackend
import ConnectionCore
import ConnectionTestKit
import Glibc
import POSIXSupport
import Synchronization
import Testing

@Suite("async backend", .timeLimit(.minutes(20)))
struct AsyncBackendTests {
    @Test("States go setup -> preparing -> ready -> cancelled, as NWConnection reports them")
    func states() async throws {
        try await SocketTest.run {
            let listener = try AsyncListener(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let socket = AsyncSocket(to: listener.localEndpoint)
            #expect(socket.state == .setup)
            try await socket.start()
            #expect(socket.state == .ready)
            let server = try await listener.accept()
            await socket.close()
            var seen: [AsyncSocket.State] = []
            for await state in socket.stateUpdates { seen.append(state) }
            #expect(seen == [.setup, .preparing, .ready, .cancelled])
            await server.close()
            await listener.close()
        }
    }

    /// A datagram socket's write space changes with every datagram it sends, and an EPOLLOUT watched all the time
    /// woke the reactor once per send made from another thread. UDP sockets are watched for writability only while
    /// a send waits for room; TCP, whose write-space edge comes only after a full buffer, always. Read from the
    /// kernel's own account of the reactor's epoll set (/proc/self/fdinfo).
    @Test("UDP sockets are not watched for writability while no send waits; TCP sockets are")
    func writabilityWatchedOnDemand() async throws {
        try await SocketTest.run {
            let listener = try await AsyncBackend().listen(on: try Endpoint(url: "udp://127.0.0.1:0"), options: .init())
            let udp = AsyncSocket(to: listener.localEndpoint)
            try await udp.start()
            try await udp.send([1, 2, 3])
            let tcpListener = try AsyncListener(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let tcp = AsyncSocket(to: tcpListener.localEndpoint)
            try await tcp.start()
            let accepted = try await tcpListener.accept()
            let udpEvents = try #require(try udp.withDescriptor { epollEvents(watching: $0.number) })
            let tcpEvents = try #require(try tcp.withDescriptor { epollEvents(watching: $0.number) })
            #expect(udpEvents & Syscall.epollIn != 0)
            #expect(udpEvents & Syscall.epollOut == 0, "an idle UDP socket is watched for writability")
            #expect(tcpEvents & Syscall.epollOut != 0)
            await accepted.close()
            await tcp.close()
            await tcpListener.close()
            await udp.close()
            await listener.close()
        }
    }

    @Test("A refused connect ends in .failed with the error")
    func failedState() async throws {
        try await SocketTest.run {
            let refusing = try RefusingPort()
            defer { refusing.close() }
            let endpoint = try refusing.endpoint(.tcp)
            let socket = AsyncSocket(to: endpoint)
            let error = await #expect(throws: ConnectionError.self) { try await socket.start() }
            #expect(error?.kind == .refused)
            if case .failed(let stateError) = socket.state {
                #expect(stateError.kind == .refused)
            } else {
                Issue.record("state is \(socket.state)")
            }
            await socket.close()
        }
    }

    @Test("The listener is an AsyncSequence of connections; messages is an AsyncSequence of chunks")
    func sequences() async throws {
        try await SocketTest.run {
            let listener = try AsyncListener(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let server = Task {
                var total: [UInt8] = []
                for try await client in listener {
                    for try await chunk in client.messages { total += chunk }
                    await client.close()
                    break
                }
                return total
            }
            let client = AsyncSocket(to: listener.localEndpoint)
            try await client.start()
            for index in 0..<10 { try await client.send([UInt8](repeating: UInt8(index), count: 1000)) }
            try await client.closeOutput()
            let total = try await server.value
            #expect(total == (0..<10).flatMap { [UInt8](repeating: UInt8($0), count: 1000) })
            await client.close()
            await listener.close()
        }
    }

    @Test("Cancelling a waiting receive: .cancelled at once, the socket stays ready, nothing is lost")
    func cancelReceive() async throws {
        try await SocketTest.run {
            let listener = try AsyncListener(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let client = AsyncSocket(to: listener.localEndpoint)
            try await client.start()
            let server = try await listener.accept()
            let waiting = Task { () throws(ConnectionError) in try await server.receive() }
            waiting.cancel()
            let result = await waiting.result
            #expect((result.failureValue as? ConnectionError)?.kind == .cancelled)
            #expect(server.state == .ready)
            try await client.send([1, 2, 3])
            var got: [UInt8] = []
            while got.count < 3 { got += try #require(try await server.receive()) }
            #expect(got == [1, 2, 3])
            await client.close()
            await server.close()
            await listener.close()
        }
    }

    @Test("Cancelling a send blocked by a full peer: .cancelled; a partial write closes the output")
    func cancelSend() async throws {
        try await SocketTest.run {
            let listener = try AsyncListener(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let options = ConnectionOptions.with {
                $0.sendBufferSize = 16 * 1024
                $0.receiveBufferSize = 16 * 1024
            }
            let client = AsyncSocket(to: listener.localEndpoint, options: options)
            try await client.start()
            let server = try await listener.accept()  // never reads: the client's send must block
            let big = [UInt8](repeating: 7, count: 8 * 1024 * 1024)
            let sending = Task { () async throws -> Bool in
                try await client.send(big)
                return true
            }
            // Wait until the send is parked on a full socket buffer: the reactor then holds its writer.
            while sending.isCancelled == false {
                if try client.withDescriptor({ Syscall.bytesUnsent($0) }) > 0 { break }
                await Task.yield()
            }
            sending.cancel()
            let result = await sending.result
            #expect((result.failureValue as? ConnectionError)?.kind == .cancelled)
            // Part of the 8 MiB went out: the output is closed, receiving still works.
            let error = await #expect(throws: ConnectionError.self) { try await client.send([1]) }
            #expect(error?.kind == .closed)
            #expect(client.state == .ready)
            await client.close()
            await server.close()
            await listener.close()
        }
    }

    @Test("Cancelling a connect that cannot complete ends it with .cancelled and state .cancelled")
    func cancelConnect() async throws {
        try await SocketTest.run {
            // A backlog-1 listener whose queue is full drops further SYNs: connects to it hang.
            let full = try BSDFullListener()
            var fillers: [AsyncSocket] = []
            let socket: AsyncSocket
            while true {
                let candidate = AsyncSocket(
                    to: full.endpoint, options: .with { $0.connectTimeout = .milliseconds(200) })
                do throws(ConnectionError) {
                    try await candidate.start()
                    fillers.append(candidate)
                } catch {
                    #expect(error.kind == .timedOut)
                    break
                }
            }
            socket = AsyncSocket(to: full.endpoint)
            let connecting = Task { () async throws -> Bool in
                try await socket.start()
                return true
            }
            while socket.state != .preparing { await Task.yield() }
            connecting.cancel()
            let result = await connecting.result
            #expect((result.failureValue as? ConnectionError)?.kind == .cancelled)
            #expect(socket.state == .cancelled)
            await socket.close()
            for filler in fillers { await filler.close() }
            full.close()
        }
    }

    /// A task on the reactor that reads a socket whose buffer never runs dry finds data at every read and would
    /// never suspend: the reactor would poll no other socket until that one ran dry. Here 64 KiB wait in one
    /// socket and its reader takes them a byte at a time; after its 100th byte it sends the probe's byte to the
    /// other socket, whose reader must have it while the first still has most of its bytes to read.
    @Test("A reader that always finds data gives the reactor's other sockets their turn")
    func readerThatNeverWaitsYields() async throws {
        try await SocketTest.run {
            // The shared reactor: a reactor of the test's own would close its descriptors only once its thread
            // has ended and its last reference gone, after the test's descriptor check.
            let reactor = AsyncReactor.shared
            let listener = try AsyncListener(on: try Endpoint(url: "tcp://127.0.0.1:0"), reactor: reactor)
            let bulkClient = AsyncSocket(to: listener.localEndpoint, reactor: reactor)
            try await bulkClient.start()
            let bulk = try await listener.accept()
            let probeClient = AsyncSocket(to: listener.localEndpoint, reactor: reactor)
            try await probeClient.start()
            let probe = try await listener.accept()
            let total = 65_536
            try await bulkClient.send([UInt8](repeating: 7, count: total))
            // On loopback the bytes are in the peer's buffer once the send returned, or soon after.
            while try bulk.withDescriptor({ Syscall.bytesReadable($0) }) < total { await Task.yield() }
            let read = SharedCount()
            let probeSawBulkAt = Task(executorPreference: reactor) { () async throws -> Int in
                let byte = UnsafeMutableRawBufferPointer.allocate(byteCount: 1, alignment: 1)
                defer { byte.deallocate() }
                _ = try await probe.receive(into: byte)
                return read.value.load(ordering: .relaxed)
            }
            let reader = Task(executorPreference: reactor) { () async throws in
                let byte = UnsafeMutableRawBufferPointer.allocate(byteCount: 1, alignment: 1)
                defer { byte.deallocate() }
                while read.value.load(ordering: .relaxed) < total {
                    guard try await bulk.receive(into: byte) == 1 else { break }
                    if read.value.add(1, ordering: .relaxed).newValue == 100 { try await probeClient.send([1]) }
                }
            }
            try await reader.value
            let seenAt = try await probeSawBulkAt.value
            #expect(read.value.load(ordering: .relaxed) == total)
            #expect(
                seenAt < 1_000,
                "the probe's byte was read after \(seenAt) of the bulk socket's \(total) bytes: its reader never gave way"
            )
            for socket in [bulkClient, bulk, probeClient, probe] { await socket.close() }
            await listener.close()
        }
    }

    @Test("1,000 concurrent TCP echo connections against one server; every echo checked")
    func thousandConnections() async throws {
        try await SocketTest.run(timeLimit: .seconds(120)) {
            let count = 1000
            let listener = try AsyncListener(
                on: try Endpoint(url: "tcp://127.0.0.1:0"), options: .with { $0.backlog = 2048 })
            let server = Task(executorPreference: listener.reactor) {
                try await withThrowingDiscardingTaskGroup { group in
                    for try await client in listener {
                        group.addTask(executorPreference: client.reactor) {
                            do {
                                for try await chunk in client.messages { try await client.send(chunk) }
                            } catch {}
                            await client.close()
                        }
                    }
                }
            }
            let residentBefore = residentBytes()
            // Open every connection first and keep it idle, then measure, then echo on all at once.
            var clients: [AsyncSocket] = []
            for _ in 0..<count {
                let socket = AsyncSocket(to: listener.localEndpoint)
                try await socket.start()
                clients.append(socket)
            }
            let perConnection = (residentBytes() - residentBefore) / count
            print(
                "async backend: \(count) idle TCP connections (client and server side in one process) added \(perConnection) bytes of resident memory each"
            )
            try await withThrowingTaskGroup(of: Void.self) { group in
                for (index, socket) in clients.enumerated() {
                    group.addTask(executorPreference: socket.reactor) {
                        let payload = (0..<64).map { UInt8(truncatingIfNeeded: $0 &+ index) }
                        try await socket.send(payload)
                        var got: [UInt8] = []
                        while got.count < payload.count { got += try #require(try await socket.receive()) }
                        #expect(got == payload)
                    }
                }
                try await group.waitForAll()
            }
            for socket in clients { await socket.close() }
            await listener.close()
            _ = await server.result
        }
    }

    @Test(
        "A UDP server read on the reactor takes a burst of more than one turn's 32 datagrams that came under one edge, all of it, in order"
    )
    func udpBurstUnderOneEdge() async throws {
        try await SocketTest.run(timeLimit: .seconds(30)) {
            let reactor = AsyncReactor.shared
            let listener = try await AsyncBackend(reactor: reactor).listen(
                on: try Endpoint(url: "udp://127.0.0.1:0"), options: ConnectionOptions())
            let client = try Syscall.socket(family: .ipv4, datagram: true)
            let released = Atomic<Bool>(false)
            defer {
                released.store(true, ordering: .releasing)
                client.close()
            }
            let server = SocketAddress.loopbackIPv4(port: listener.localEndpoint.port)
            func send(_ number: UInt8) throws {
                _ = try [number].withBytes { (raw) throws(ConnectionError) in
                    try client.withDescriptor { (fd) throws(ConnectionError) in try Syscall.sendTo(fd, raw, to: server)
                    }
                }
            }
            try send(0)
            let peer = try await listener.accept()
            #expect(try await peer.receive()?.bytes == [0])
            // Hold the reactor's thread while 100 datagrams arrive: epoll reports them with one edge, and no other
            // edge comes for those a turn leaves.
            await withCheckedContinuation { (entered: CheckedContinuation<Void, Never>) in
                reactor.loop.perform {
                    entered.resume()
                    while !released.load(ordering: .acquiring) { sched_yield() }
                }
            }
            for number in 1...100 { try send(UInt8(number)) }
            released.store(true, ordering: .releasing)
            var received: [UInt8] = []
            for _ in 1...100 { received += try await peer.receive()?.bytes ?? [] }
            #expect(received == (1...100).map { UInt8($0) })
            await peer.close()
            await listener.close()
        }
    }
}

extension Result {
    var failureValue: Failure? {
        if case .failure(let error) = self { return error }
        return nil
    }
}

/// Resident memory of this process, from /proc/self/statm.
func residentBytes() -> Int {
    guard let file = fopen("/proc/self/statm", "r") else { return 0 }
    defer { fclose(file) }
    var size = 0
    var resident = 0
    _ = withUnsafeMutablePointer(to: &size) { sizePointer in
        withUnsafeMutablePointer(to: &resident) { residentPointer in
            withVaList([sizePointer, residentPointer]) { vfscanf(file, "%ld %ld", $0) }
        }
    }
    return resident * Int(sysconf(Int32(_SC_PAGESIZE)))
}

/// A TCP listener with a backlog of 1 that never accepts: once its queue is full, further SYNs are dropped.
struct BSDFullListener {
    let socket: SocketDescriptor
    let endpoint: Endpoint

    init() throws {
        let address = SocketAddress.loopbackIPv4(port: 0)
        socket = try Syscall.socket(family: .ipv4, datagram: false)
        do {
            endpoint = try socket.withDescriptor { (fd) throws(ConnectionError) in
                try Syscall.bind(fd, to: address)
                try Syscall.listen(fd, backlog: 1)
                return try Syscall.localAddress(fd).endpoint(.tcp)
            }
        } catch {
            socket.close()
            throw error
        }
    }

    func close() { socket.close() }
}

/// A count that tasks share.
final class SharedCount: Sendable {
    let value = Atomic<Int>(0)
}

/// The events an epoll set of this process watches on `fd`, from /proc/self/fdinfo ("tfd: FD events: MASK ...").
func epollEvents(watching fd: Int32) -> UInt32? {
    guard let directory = opendir("/proc/self/fdinfo") else { return nil }
    defer { closedir(directory) }
    while let entry = readdir(directory) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        guard let file = fopen("/proc/self/fdinfo/\(name)", "r") else { continue }
        defer { fclose(file) }
        var line = [CChar](repeating: 0, count: 512)
        while fgets(&line, Int32(line.count), file) != nil {
            let text = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            let fields = text.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" })
            guard fields.count >= 4, fields[0] == "tfd:", fields[1] == "\(fd)", fields[2] == "events:" else { continue }
            return UInt32(fields[3], radix: 16)
        }
    }
    return nil
}
