import ConnectionCore
import ConnectionTestKit
import Glibc
import LibUVBackend
import POSIXSupport
import Synchronization
import Testing

@Suite("libuv backend", .timeLimit(.minutes(20)))
struct LibUVBackendTests {

    @Test("A loop with everything closed shuts down: uv_loop_close succeeds")
    func loopClosesCleanly() async throws {
        try await SocketTest.run {
            let backend = try LibUVBackend(loopName: "uv-test")
            let listener = try await backend.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"), options: .init())
            let udp = try await backend.listen(on: try Endpoint(url: "udp://127.0.0.1:0"), options: .init())
            let client = try await backend.connect(to: listener.localEndpoint, options: .init())
            let server = try await listener.accept()
            try await client.send([1, 2, 3])
            #expect(try await server.receive(exactly: 3) == [1, 2, 3])
            await client.close()
            await server.close()
            await listener.close()
            await udp.close()
            try await backend.shutdown()
        }
    }

    @Test("A handle left open makes shutdown report EBUSY, naming it; the loop is still released")
    func leakedHandleIsReported() async throws {
        try await SocketTest.run {
            let backend = try LibUVBackend(loopName: "uv-leak")
            let loop = backend.loop
            await withCheckedContinuation { continuation in
                loop.execute {
                    _ = try? UVTimer(loop: loop)  // never closed: a leak libuv must report
                    continuation.resume()
                }
            }
            let error = await #expect(throws: ConnectionError.self) { try await backend.shutdown() }
            #expect(error?.systemCode?.name == "UV_EBUSY")
            #expect(error?.detail.contains("timer") == true)
        }
    }

    @Test("The native style: a UVTCP echo written with callbacks on the loop thread")
    func nativeEcho() async throws {
        try await SocketTest.run {
            let backend = try LibUVBackend(loopName: "uv-native")
            let loop = backend.loop
            let reply: [UInt8] = try await withCheckedThrowingContinuation { continuation in
                loop.execute {
                    do {
                        let server = try UVTCP(loop: loop)
                        try server.bind(.loopbackIPv4(port: 0))
                        try server.listen(backlog: 16) { _ in
                            guard let peer = try? server.accept() else { return }
                            try? peer.readStart { result in
                                switch result {
                                case .data(let bytes): try? peer.write([UInt8](bytes)) { _ in }
                                case .endOfStream, .failure: peer.close()
                                }
                            }
                        }
                        let client = try UVTCP(loop: loop)
                        var received: [UInt8] = []
                        try client.connect(to: try server.localAddress) { error in
                            if let error { return continuation.resume(throwing: error) }
                            try? client.write(Array("hello".utf8)) { _ in }
                            try? client.readStart { result in
                                if case .data(let bytes) = result { received += bytes }
                                if received.count == 5 {
                                    client.close()
                                    server.close()
                                    continuation.resume(returning: received)
                                }
                            }
                        }
                    } catch {
                        continuation.resume(throwing: error)
                    }
                }
            }
            #expect(reply == Array("hello".utf8))
            try await backend.shutdown()
        }
    }

    /// Resident memory of this process, from /proc/self/statm.
    static func residentBytes() -> Int {
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

    @Test("Backpressure: 256 MiB to a deliberately slow reader; the sender is slowed, memory stays bounded")
    func slowReader() async throws {
        try await SocketTest.run(timeLimit: .seconds(150)) {
            let backend = LibUVBackend.shared
            let listener = try await backend.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"), options: .init())
            let sender = try await backend.connect(to: listener.localEndpoint, options: .init())
            let reader = try await listener.accept()
            let total = 256 * 1024 * 1024
            let chunk = 64 * 1024
            let sent = Atomic<Int>(0)
            let received = Atomic<Int>(0)
            let maxInFlight = Atomic<Int>(0)
            let baseline = Self.residentBytes()
            let peakResident = Atomic<Int>(baseline)
            let payload = (0..<chunk).map { UInt8(truncatingIfNeeded: $0 &* 7) }

            async let sending: Void = {
                while sent.load(ordering: .relaxed) < total {
                    try await sender.send(payload)
                    let now = sent.add(chunk, ordering: .relaxed).newValue
                    let inFlight = now - received.load(ordering: .relaxed)
                    _ = maxInFlight.max(inFlight, ordering: .relaxed)
                }
                try await sender.closeOutput()
            }()
            // The slow reader: small reads, and a pause of 1 ms after every MiB.
            var sinceLastPause = 0
            var checked = 0
            var mismatches = 0
            while let message = try await reader.receive(maximumLength: 16 * 1024) {
                // Every byte checked against the pattern, however the stream cut the chunks.
                payload.withUnsafeBufferPointer { expected in
                    message.bytes.withUnsafeBufferPointer { got in
                        var offset = checked % chunk
                        for byte in got {
                            if byte != expected[offset] { mismatches += 1 }
                            offset += 1
                            if offset == chunk { offset = 0 }
                        }
                    }
                }
                checked += message.count
                received.add(message.count, ordering: .relaxed)
                sinceLastPause += message.count
                if sinceLastPause >= 1024 * 1024 {
                    sinceLastPause = 0
                    _ = peakResident.max(Self.residentBytes(), ordering: .relaxed)
                    try await Task.sleep(for: .milliseconds(1))
                }
            }
            try await sending
            #expect(checked == total)
            #expect(mismatches == 0)
            let growth = peakResident.load(ordering: .relaxed) - baseline
            // Kernel socket buffers hold a few MiB; the receive queue 256 KiB. Nothing near 256 MiB may pile up.
            #expect(maxInFlight.load(ordering: .relaxed) < 32 * 1024 * 1024, "bytes sent but not yet read")
            #expect(
                growth < 64 * 1024 * 1024 * SocketTest.residentMemoryAllowance,
                "resident memory grew by \(growth) bytes")
            print(
                "slow reader: 256 MiB sent; max in flight \(maxInFlight.load(ordering: .relaxed) / 1024) KiB; resident memory grew \(growth / 1024) KiB"
            )
            await sender.close()
            await reader.close()
            await listener.close()
        }
    }
}
