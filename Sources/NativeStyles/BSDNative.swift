import BenchmarkDriver
import ConnectionCore
import POSIXSupport
import SocketStyles
import Synchronization

/// Style 1 by hand: blocking calls on a thread of our own.
enum BSDNative {
    static func pingpong(
        to endpoint: Endpoint, tally: PingPongTally
    ) async throws(ConnectionError)
        -> PingRunner.Result
    {
        try await onOwnThread(name: "bsd-native-ping") {
            Result { () throws(ConnectionError) in
                let socket = try BSDSocket.connect(to: endpoint)
                defer { socket.close() }
                let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
                defer { buffer.deallocate() }
                while true {
                    try socket.sendAll(tally.next())
                    var step = PingPongTally.Step.needMore
                    while step == .needMore {
                        let count = try socket.receive(into: buffer)
                        guard count > 0 else { throw .closed("the server ended the connection") }
                        step = try tally.consume(UnsafeRawBufferPointer(rebasing: buffer[..<count]))
                    }
                    if step == .finished { return tally.result() }
                }
            }
        }
    }
}

/// An accept thread and a thread per client, each blocking in recv and echoing with send.
final class BSDNativeEchoServer: NativeEchoServer {
    let localEndpoint: Endpoint
    private let listener: BSDSocket
    private let done = ConditionLock(BSDNativeThreads())

    init(on endpoint: Endpoint) throws(ConnectionError) {
        listener = try BSDSocket.listen(on: endpoint)
        do throws(ConnectionError) {
            localEndpoint = try listener.localAddress.endpoint(.tcp)
        } catch {
            listener.close()
            throw error
        }
        PosixThread.spawn(name: "bsd-native-accept") { [self] in acceptLoop() }
    }

    private func acceptLoop() {
        defer { threadEnded() }
        while let client = try? listener.accept() {
            guard done.withLock({ $0.admit(client, threads: 1) }) else {
                client.close()
                return
            }
            PosixThread.spawn(name: "bsd-native-echo") { [self] in echo(client) }
        }
    }

    private func echo(_ client: BSDSocket) {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
        defer {
            buffer.deallocate()
            done.withLock { _ = $0.open.removeValue(forKey: ObjectIdentifier(client)) }
            client.close()
            threadEnded()
        }
        while let count = try? client.receive(into: buffer), count > 0 {
            var offset = 0
            while offset < count {
                guard let sent = try? client.send(UnsafeRawBufferPointer(rebasing: buffer[offset..<count])) else {
                    return
                }
                offset += sent
            }
        }
    }

    private func threadEnded() { done.threadEnded() }

    func stop() async { await done.stop(listener) }
}

/// What the threads of a blocking server share, under its lock: the sockets open (so a stop can wake their
/// blocked calls), the threads still running, and whether it is stopping.
struct BSDNativeThreads {
    var open: [ObjectIdentifier: BSDSocket] = [:]
    /// The accept thread counts from the start.
    var threads = 1
    var stopping = false

    /// Registers a socket (and a thread that will end) unless stopping.
    mutating func admit(_ socket: BSDSocket, threads more: Int) -> Bool {
        guard !stopping else { return false }
        open[ObjectIdentifier(socket)] = socket
        threads += more
        return true
    }
}

extension ConditionLock where State == BSDNativeThreads {
    /// One of the server's threads has ended.
    func threadEnded() {
        withLock {
            $0.threads -= 1
            broadcast()
        }
    }

    /// Stops the server: admits no one more, wakes every blocked call (shutdown of each open socket, then of the
    /// listener), waits for every thread to end, and closes the listener.
    func stop(_ listener: BSDSocket) async {
        withLock {
            $0.stopping = true
            // Under the lock: a socket still in `open` is not closed yet, so its descriptor is not reused.
            for socket in $0.open.values { try? socket.shutdown(.both) }  // wakes recv(2)
        }
        try? listener.shutdown(.both)  // wakes accept(2)
        await waitUntilThreadsEnded()
        listener.close()
    }

    /// Waits, on a thread of its own (so no task blocks), until every thread has ended.
    private func waitUntilThreadsEnded() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            PosixThread.spawn(name: "bsd-native-stop") { [self] in
                withLock(waitingUntil: { $0.threads == 0 }) { _ in }
                continuation.resume()
            }
        }
    }
}

/// A relay in blocking calls: an accept thread, and per client a blocking connect upstream and two threads,
/// each a recv -> send loop for one direction. A send that blocks stops that thread from reading, so a slow
/// reader slows the other end through TCP flow control; recv returning 0 becomes shutdown(SHUT_WR).
final class BSDNativeRelay: NativeRelay {
    let localEndpoint: Endpoint
    private let listener: BSDSocket
    private let upstream: Endpoint
    private let accepted = ClientCounter()
    private let done = ConditionLock(BSDNativeThreads())

    var clients: Int { accepted.value }

    private init(listener: BSDSocket, local: Endpoint, upstream: Endpoint) {
        self.listener = listener
        self.localEndpoint = local
        self.upstream = upstream
    }

    static func start(listen: Endpoint, upstream: Endpoint) async throws(ConnectionError) -> BSDNativeRelay {
        let listener = try BSDSocket.listen(on: listen)
        let local: Endpoint
        do throws(ConnectionError) {
            local = try listener.localAddress.endpoint(.tcp)
        } catch {
            listener.close()
            throw error
        }
        let relay = BSDNativeRelay(listener: listener, local: local, upstream: upstream)
        PosixThread.spawn(name: "bsd-relay-accept") { relay.acceptLoop() }
        return relay
    }

    /// Registers a socket (and a thread that will end) unless stopping.
    private func admit(_ socket: BSDSocket, threads more: Int) -> Bool {
        done.withLock { $0.admit(socket, threads: more) }
    }

    private func acceptLoop() {
        defer { threadEnded() }
        while let client = try? listener.accept() {
            accepted.increment()
            guard admit(client, threads: 1) else {
                client.close()
                return
            }
            PosixThread.spawn(name: "bsd-relay-up") { [self] in connectAndRelay(client) }
        }
    }

    private func connectAndRelay(_ client: BSDSocket) {
        defer { threadEnded() }
        guard let server = try? BSDSocket.connect(to: upstream) else {
            forget(client)
            return
        }
        guard admit(server, threads: 1) else {
            server.close()
            forget(client)
            return
        }
        let pair = PairEnd()
        PosixThread.spawn(name: "bsd-relay-down") { [self] in
            pump(from: server, to: client)
            if pair.finishOne() { forget(client, server) }
            threadEnded()
        }
        pump(from: client, to: server)
        if pair.finishOne() { forget(client, server) }
    }

    /// Both directions must end before the descriptors are closed.
    private final class PairEnd: Sendable {
        private let remaining = Atomic<Int>(2)
        func finishOne() -> Bool { remaining.subtract(1, ordering: .acquiringAndReleasing).newValue == 0 }
    }

    /// One direction until its end of stream (carried as a FIN) or an error (which ends both directions).
    private func pump(from source: BSDSocket, to sink: BSDSocket) {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
        defer { buffer.deallocate() }
        do throws(ConnectionError) {
            while true {
                let count = try source.receive(into: buffer)
                if count == 0 {
                    try sink.shutdown(.write)
                    return
                }
                var offset = 0
                while offset < count {
                    offset += try sink.send(UnsafeRawBufferPointer(rebasing: buffer[offset..<count]))
                }
            }
        } catch {
            try? source.shutdown(.both)
            try? sink.shutdown(.both)
        }
    }

    private func forget(_ sockets: BSDSocket...) {
        done.withLock { for socket in sockets { $0.open[ObjectIdentifier(socket)] = nil } }
        for socket in sockets { socket.close() }
    }

    private func threadEnded() { done.threadEnded() }

    func stop() async { await done.stop(listener) }
}
