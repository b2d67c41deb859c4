import BSDSocketBackend
import CSocketShims
import ConnectionCore
import ConnectionTestKit
import Glibc
import POSIXSupport
import Synchronization
import Testing

/// The native blocking style, used as its users would: from threads of their own.
@Suite("BSDSocket (native blocking API)", .timeLimit(.minutes(20)))
struct BSDSocketTests {
    /// Runs `body` on a new thread and returns its result without blocking the test's task.
    func onThread<R: Sendable>(_ body: @escaping @Sendable () throws -> R) async throws -> R {
        try await withCheckedThrowingContinuation { continuation in
            PosixThread.spawn(name: "test") { continuation.resume(with: Result { try body() }) }
        }
    }

    @Test("TCP echo with blocking calls on two threads")
    func tcpEcho() async throws {
        try await SocketTest.run {
            let listener = try BSDSocket.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let port = try listener.localAddress.port
            async let served: Int = onThread {
                let client = try listener.accept()
                defer { client.close() }
                var total = 0
                while true {
                    let bytes = try client.receive(maximumLength: 4096)
                    if bytes.isEmpty { return total }  // the peer half-closed
                    total += bytes.count
                    try client.sendAll(bytes)
                }
            }
            let echoed: [UInt8] = try await onThread {
                let socket = try BSDSocket.connect(to: try Endpoint(url: "tcp://127.0.0.1:\(port)"))
                defer { socket.close() }
                let payload = [UInt8](repeating: 0xab, count: 100_000)
                try socket.sendAll(payload)
                try socket.shutdown(.write)
                var received: [UInt8] = []
                while true {
                    let bytes = try socket.receive(maximumLength: 65_536)
                    if bytes.isEmpty { break }
                    received += bytes
                }
                return received
            }
            #expect(echoed == [UInt8](repeating: 0xab, count: 100_000))
            #expect(try await served == 100_000)
            listener.close()
        }
    }

    @Test("UDP sendto/recvfrom: the server answers each peer at its own address")
    func udpServer() async throws {
        try await SocketTest.run {
            let server = try BSDSocket.listen(on: try Endpoint(url: "udp://127.0.0.1:0"))
            let address = try server.localAddress
            async let served: Void = onThread {
                for _ in 0..<2 {
                    let (bytes, from) = try server.receiveFrom()
                    try server.send(bytes + [UInt8(truncatingIfNeeded: from.port)], to: from)
                }
            }
            let replies: [[UInt8]] = try await onThread {
                let a = try BSDSocket.connect(to: address.endpoint(.udp))
                let b = try BSDSocket.connect(to: address.endpoint(.udp))
                defer {
                    a.close()
                    b.close()
                }
                try a.sendAll([1])
                try b.sendAll([2])
                let replyA = try a.receive(maximumLength: 100)
                let replyB = try b.receive(maximumLength: 100)
                #expect(replyA.last == UInt8(truncatingIfNeeded: try a.localAddress.port))
                #expect(replyB.last == UInt8(truncatingIfNeeded: try b.localAddress.port))
                return [replyA, replyB]
            }
            try await served
            #expect(replies.map(\.first) == [1, 2])
            server.close()
        }
    }

    @Test(
        "recvmmsg (DatagramBatch) takes a burst in batches: every datagram in order, its length and sender; one larger than a slot shows its real length"
    )
    func datagramBatch() async throws {
        // Its sockets are counted with the other socket tests', one test at a time.
        try await SocketTest.run { try Self.batchesABurst() }
    }

    static func batchesABurst() throws {
        let server = try Syscall.socket(family: .ipv4, datagram: true)
        let clients = try [
            Syscall.socket(family: .ipv4, datagram: true), Syscall.socket(family: .ipv4, datagram: true),
        ]
        defer { for socket in [server] + clients { socket.close() } }
        let address = try server.withDescriptor { (fd) throws(ConnectionError) in
            try Syscall.bind(fd, to: .loopbackIPv4(port: 0))
            return try Syscall.localAddress(fd)
        }
        // 41 datagrams from two senders, sizes 0-99, one of 150 bytes (more than a 100-byte slot).
        var sent: [(port: UInt16, bytes: [UInt8])] = []
        for index in 0..<41 {
            let size = index == 20 ? 150 : (index * 37) % 100
            let bytes = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ index) }
            let client = clients[index % 2]
            let port = try client.withDescriptor { (fd) throws(ConnectionError) in
                _ = try bytes.withBytes { (raw) throws(ConnectionError) in try Syscall.sendTo(fd, raw, to: address) }
                return try Syscall.localAddress(fd).port
            }
            sent.append((port, bytes))
        }
        // Loopback delivers at sendto: all 41 wait in the socket now, so receives never block.
        let batch = DatagramBatch(capacity: 16, slotSize: 100)
        var received: [(port: UInt16, length: Int, bytes: [UInt8])] = []
        var perCall: [Int] = []
        while received.count < sent.count {
            guard
                case .processed(let count) = try server.withDescriptor({ (fd) throws(ConnectionError) in
                    try batch.receive(fd, dontWait: true)
                })
            else {
                Issue.record("only \(received.count) of \(sent.count) datagrams arrived")
                return
            }
            perCall.append(count)
            for index in 0..<count {
                received.append((try batch.sender(index).port, batch.length(index), Array(batch.bytes(index))))
            }
        }
        #expect(perCall == [16, 16, 9])
        #expect(received.map(\.port) == sent.map(\.port))
        #expect(received.map(\.length) == sent.map(\.bytes.count))
        #expect(received.map(\.bytes) == sent.map { Array($0.bytes.prefix(100)) })
        guard
            case .wouldBlock = try server.withDescriptor({ (fd) throws(ConnectionError) in
                try batch.receive(fd, dontWait: true)
            })
        else {
            Issue.record("a datagram nobody sent")
            return
        }
    }

    @Test(
        "DatagramBatch after single datagrams asks for one (drained hinted) and probes for a batch every eighth receive: a burst is back to batches"
    )
    func datagramBatchSingles() async throws {
        // Its sockets are counted with the other socket tests', one test at a time.
        try await SocketTest.run { try Self.singlesThenABurst() }
    }

    static func singlesThenABurst() throws {
        let server = try Syscall.socket(family: .ipv4, datagram: true)
        let client = try Syscall.socket(family: .ipv4, datagram: true)
        defer { for socket in [server, client] { socket.close() } }
        let address = try server.withDescriptor { (fd) throws(ConnectionError) in
            try Syscall.bind(fd, to: .loopbackIPv4(port: 0))
            return try Syscall.localAddress(fd)
        }
        var next: UInt8 = 0
        func send(_ count: Int) throws {
            for _ in 0..<count {
                _ = try [next].withBytes { (raw) throws(ConnectionError) in
                    try client.withDescriptor { (fd) throws(ConnectionError) in try Syscall.sendTo(fd, raw, to: address)
                    }
                }
                next &+= 1
            }
        }
        let batch = DatagramBatch(capacity: 16, slotSize: 100, singlesAfterSingles: true)
        var order: [UInt8] = []
        func receive() throws -> Int {
            guard
                case .processed(let count) = try server.withDescriptor({ (fd) throws(ConnectionError) in
                    try batch.receive(fd, dontWait: true)
                })
            else {
                Issue.record("no datagram waiting")
                return 0
            }
            for index in 0..<count { order.append(batch.bytes(index)[0]) }
            return count
        }
        // A request-response exchange: one datagram per receive; the first (a batch asked, one found) says
        // drained, and so does every one after it (one asked).
        try send(1)
        #expect(try receive() == 1)
        #expect(batch.drained)
        // Five waiting now: receives 2-6 ask for one each.
        try send(5)
        var counts: [Int] = []
        for _ in 0..<5 {
            counts.append(try receive())
            #expect(batch.drained)
        }
        #expect(counts == [1, 1, 1, 1, 1])
        // A burst of 20: the seventh receive in the run of singles asks for one, so does the eighth, the ninth
        // probes for a batch and takes 16, and batches go on while they find more than one.
        try send(20)
        counts = []
        for _ in 0..<4 { counts.append(try receive()) }
        #expect(counts == [1, 1, 16, 2])
        #expect(order == (0..<26).map { UInt8($0) })
        #expect(batch.drained)
        guard
            case .wouldBlock = try server.withDescriptor({ (fd) throws(ConnectionError) in
                try batch.receive(fd, dontWait: true)
            })
        else {
            Issue.record("a datagram nobody sent")
            return
        }
    }

    @Test("A signal that interrupts a blocked recv (EINTR) is retried, not reported")
    func eintrIsRetried() async throws {
        try await SocketTest.run {
            #expect(csock_install_interrupting_handler(SIGUSR1) == 0)
            let listener = try BSDSocket.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let client = try BSDSocket.connect(to: try listener.localAddress.endpoint(.tcp))
            let server = try listener.accept()
            let readerTID = Atomic<Int32>(0)
            let before = csock_interruptions()
            let readerDone = Atomic<Bool>(false)
            async let received: [UInt8] = onThread {
                defer { readerDone.store(true, ordering: .releasing) }
                _ = csock_unblock_signal(SIGUSR1)
                readerTID.store(csock_gettid(), ordering: .releasing)
                return try server.receive(maximumLength: 10)
            }
            var tid: Int32 = 0
            while tid == 0 {
                tid = readerTID.load(ordering: .acquiring)
                await Task.yield()
            }
            // Wait until the reader is inside recvfrom(2) (x86_64 syscall 45, per /proc), interrupt it, and
            // check that it went back into recvfrom instead of failing.
            for round in 1...3 {
                while !(readerDone.load(ordering: .acquiring) || Self.isBlockedInRecv(tid)) { await Task.yield() }
                if readerDone.load(ordering: .acquiring) { break }
                #expect(csock_signal_thread(tid, SIGUSR1) == 0)
                while csock_interruptions() < before + round { await Task.yield() }
            }
            while !(readerDone.load(ordering: .acquiring) || Self.isBlockedInRecv(tid)) { await Task.yield() }
            try client.sendAll([42])
            #expect(try await received == [42])
            client.close()
            server.close()
            listener.close()
        }
    }

    /// Whether thread `tid` is blocked in recvfrom(2), from /proc/self/task/TID/syscall.
    static func isBlockedInRecv(_ tid: Int32) -> Bool {
        guard let file = fopen("/proc/self/task/\(tid)/syscall", "r") else { return false }
        defer { fclose(file) }
        var buffer = [CChar](repeating: 0, count: 64)
        guard fgets(&buffer, 64, file) != nil else { return false }
        let text = String(decoding: buffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return text.hasPrefix("45 ")  // __NR_recvfrom on x86_64
    }

    @Test("Send to a peer that closed gives .reset, never SIGPIPE")
    func noSigpipe() async throws {
        try await SocketTest.run {
            let listener = try BSDSocket.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let client = try BSDSocket.connect(to: try listener.localAddress.endpoint(.tcp))
            let server = try listener.accept()
            server.close()
            // The first send may still be accepted (the RST comes back afterwards); a later one must fail.
            var failure: ConnectionError?
            for _ in 0..<100 where failure == nil {
                do throws(ConnectionError) {
                    try client.sendAll([UInt8](repeating: 1, count: 1000))
                } catch {
                    failure = error
                }
                await Task.yield()
            }
            #expect(failure?.kind == .reset)
            client.close()
            listener.close()
        }
    }

    @Test("shutdown(.both) wakes a thread blocked in accept")
    func shutdownWakesAccept() async throws {
        try await SocketTest.run {
            let listener = try BSDSocket.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let started = Atomic<Bool>(false)
            async let outcome: Bool = onThread {
                started.store(true, ordering: .releasing)
                do {
                    _ = try listener.accept()
                    return false
                } catch {
                    return true
                }
            }
            while !started.load(ordering: .acquiring) { await Task.yield() }
            try listener.shutdown(.both)
            #expect(try await outcome)
            listener.close()
        }
    }

    @Test("close() twice closes the descriptor once")
    func closeTwice() async throws {
        try await SocketTest.run {
            let socket = try BSDSocket.listen(on: try Endpoint(url: "udp://127.0.0.1:0"))
            socket.close()
            socket.close()
            #expect(socket.isClosed)
        }
    }
}
