import BenchmarkDriver
import ConnectionCore
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
final class BSDNativeEchoServer: NativeEchoServer, @unchecked Sendable {
    let localEndpoint: Endpoint
    private let listener: BSDSocket
    private let done = ConditionLock()
    // Guarded by `done`.
    private var clients: [Int32: BSDSocket] = [:]
    private var threads = 1
    private var stopping = false

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
            let admitted = done.withLock {
                guard !stopping else { return false }
                clients[client.descriptor] = client
                threads += 1
                return true
            }
            guard admitted else {
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
            done.withLock { _ = clients.removeValue(forKey: client.descriptor) }
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

    private func threadEnded() {
        done.withLock {
            threads -= 1
            done.broadcast()
        }
    }

    func stop() async {
        let open = done.withLock {
            stopping = true
            return Array(clients.values)
        }
        try? listener.shutdown(.both)  // wakes accept(2)
        for client in open { try? client.shutdown(.both) }  // wakes recv(2)
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            PosixThread.spawn(name: "bsd-native-stop") { [self] in
                done.withLock { done.wait(until: { threads == 0 }) }
                continuation.resume()
            }
        }
        listener.close()
    }
}
