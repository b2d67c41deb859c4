import ConnectionTestKit
import POSIXSupport
import SocketStyles
import Testing

/// `receive(into:)` and `send(contentsOf:)`, receiving into and sending from buffers the caller owns, against the
/// same contract as `receive` and `send`: run for every backend x transport, on the connection's own executor
/// (where backends read straight into the buffer and write straight from it) and off it.
@Suite("Conformance: receive(into:) and send(contentsOf:)", .timeLimit(.minutes(20)))
struct ReceiveIntoTests {

    @Test(
        "A byte stream fills the buffer in order, ends once, and an empty buffer is refused",
        arguments: ConformanceCase.streams, [true, false])
    func byteStream(_ test: ConformanceCase, onItsExecutor: Bool) async throws {
        try await SocketTest.run {
            let listener = try await test.listen()
            let client = try await test.connect(to: listener.localEndpoint)
            let server = try await listener.accept()
            // 30,000-byte pieces, then 3 MB in one send (more than the kernel takes at once: the sender copies
            // the rest, and the receiver sees it in many reads), every piece sent with send(contentsOf:) from one
            // reused buffer that is overwritten as soon as each send returns.
            let pieces = [Int](repeating: 30_000, count: 6) + [3_000_000]
            let payload = pattern(pieces.reduce(0, +), seed: 5)
            async let sent: Void = {
                let reused = OwnedBuffer(count: pieces.max()!)
                defer { reused.buffer.deallocate() }
                var start = 0
                for piece in pieces {
                    payload[start..<(start + piece)].withUnsafeBytes { reused.buffer.copyMemory(from: $0) }
                    try await client.send(contentsOf: UnsafeRawBufferPointer(rebasing: reused.buffer[..<piece]))
                    reused.buffer.initializeMemory(as: UInt8.self, repeating: 0xEE)
                    start += piece
                }
                try await client.closeOutput()
            }()
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 16_000, alignment: 1)
            defer { buffer.deallocate() }
            let (received, ends) = try await withTaskExecutorPreference(onItsExecutor ? server.preferredExecutor : nil)
            {
                () async throws -> ([UInt8], Int) in
                var received: [UInt8] = []
                var ends = 0
                while true {
                    guard let chunk = try await server.receive(into: buffer) else {
                        ends += 1
                        break
                    }
                    #expect(chunk.count > 0 && chunk.count <= buffer.count && chunk.kind == .binary)
                    received += UnsafeRawBufferPointer(rebasing: buffer[..<chunk.count])
                }
                return (received, ends)
            }
            try await sent
            #expect(received == payload)
            #expect(ends == 1)
            await expectConnectionError(.closed) { () throws(ConnectionError) in try await server.receive(into: buffer)
            }
            await expectConnectionError(.unsupported) { () throws(ConnectionError) in
                try await client.receive(into: UnsafeMutableRawBufferPointer(rebasing: buffer[..<0]))
            }
            await closeBoth(client, server)
            await listener.close()
        }
    }

    @Test(
        "A message transport gives one whole message (and its kind); one larger than the buffer is refused, the next comes",
        arguments: ConformanceCase.messages, [true, false])
    func messages(_ test: ConformanceCase, onItsExecutor: Bool) async throws {
        try await SocketTest.run {
            let (listener, client, server) = try await test.connectedPair()
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1000, alignment: 1)
            defer { buffer.deallocate() }
            try await withTaskExecutorPreference(onItsExecutor ? server.preferredExecutor : nil) { () async throws in
                #expect(try await server.receive(into: buffer)?.count == 1)
                let sizes = [0, 10, 999, 1000]
                for size in sizes { try await client.send(pattern(size, seed: UInt8(size & 0xFF))) }
                for size in sizes {
                    let got = try await server.receive(into: buffer)
                    #expect(got?.count == size)
                    #expect(
                        Array(UnsafeRawBufferPointer(rebasing: buffer[..<(got?.count ?? 0)]))
                            == pattern(size, seed: UInt8(size & 0xFF)))
                }
                try await client.send(pattern(1001))
                let sevens = OwnedBuffer(count: 3)
                defer { sevens.buffer.deallocate() }
                sevens.buffer.initializeMemory(as: UInt8.self, repeating: 7)
                try await client.send(contentsOf: UnsafeRawBufferPointer(sevens.buffer))
                await expectConnectionError(.messageTooLarge) { () throws(ConnectionError) in
                    try await server.receive(into: buffer)
                }
                #expect(try await server.receive(into: buffer)?.count == 3)
                #expect(buffer[0] == 7 && buffer[2] == 7)
                if test.transport != .udp {
                    try await client.send(.text("héllo"))
                    let text = try await server.receive(into: buffer)
                    #expect(text?.kind == .text)
                    #expect(
                        String(decoding: UnsafeRawBufferPointer(rebasing: buffer[..<(text?.count ?? 0)]), as: UTF8.self)
                            == "héllo")
                }
            }
            await closeBoth(client, server)
            await listener.close()
        }
    }

    @Test(
        "send(batch:) sends every buffer in order, as one message each (datagrams, WebSocket) or appended (streams)",
        arguments: ConformanceCase.all, [true, false])
    func batch(_ test: ConformanceCase, onItsExecutor: Bool) async throws {
        // A lost datagram would leave the receive waiting: bounded well above the ~50 ms a case takes.
        try await SocketTest.run(timeLimit: .seconds(15)) {
            let (listener, client, server) = try await test.connectedPair()
            #expect(try await server.receive()?.bytes == [0])
            // Runs of equal sizes (one segmented send each where the kernel has UDP GSO), a shorter one ending a
            // run, an empty message between runs, a larger one starting a new run; small enough in all that a
            // loopback UDP receive buffer holds it.
            let sizes = [1000, 1000, 1000, 1000, 400, 1000, 1000, 0, 7, 7, 1200, 3]
            let messages = sizes.enumerated().map { pattern($0.element, seed: UInt8($0.offset)) }
            let owned = OwnedBuffer(count: sizes.reduce(0, +))
            defer { owned.buffer.deallocate() }
            var batch: [UnsafeRawBufferPointer] = []
            var offset = 0
            for message in messages {
                let slot = UnsafeMutableRawBufferPointer(rebasing: owned.buffer[offset..<(offset + message.count)])
                message.withUnsafeBytes { slot.copyMemory(from: $0) }
                batch.append(UnsafeRawBufferPointer(slot))
                offset += message.count
            }
            let executor = onItsExecutor ? client.preferredExecutor : nil
            try await withTaskExecutorPreference(executor) { () async throws in
                try await client.send(batch: batch)
                try await client.send(batch: [])
            }
            // The connection no longer refers to the buffers once the call returned.
            owned.buffer.initializeMemory(as: UInt8.self, repeating: 0xEE)
            if test.transport.isByteStream {
                #expect(try await server.receive(exactly: offset) == Array(messages.joined()))
            } else {
                for message in messages { #expect(try await server.receive()?.bytes == message) }
            }
            await closeBoth(client, server)
            await listener.close()
        }
    }

    @Test(
        "WebSocket: messages sent with send(contentsOf:) from a reused buffer arrive whole and in order through receive(into:), back to back, both ways",
        arguments: ConformanceCase.ws)
    func webSocketBulk(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let (listener, client, server) = try await test.connectedPair()
            #expect(try await server.receive()?.bytes == [0])
            // 64 KiB messages (the frame link's send buffer holds one; reads of 64 KiB then end inside the next
            // message, whose start waits in the link for the next receive), larger ones (encoded into an array of
            // their own), tiny and empty ones between them.
            let sizes = [65_536, 65_536, 70_000, 1, 0, 65_536, 100_000, 3, 65_536, 65_536]
            for (sender, receiver) in [(client, server), (server, client)] {
                async let sent: Void = {
                    let reused = OwnedBuffer(count: sizes.max()!)
                    defer { reused.buffer.deallocate() }
                    for (index, size) in sizes.enumerated() {
                        pattern(size, seed: UInt8(index)).withUnsafeBytes { reused.buffer.copyMemory(from: $0) }
                        try await sender.send(contentsOf: UnsafeRawBufferPointer(rebasing: reused.buffer[..<size]))
                        // The connection no longer refers to the bytes once the send returned.
                        reused.buffer.initializeMemory(as: UInt8.self, repeating: 0xEE)
                    }
                }()
                let buffer = OwnedBuffer(count: 128 * 1024)
                defer { buffer.buffer.deallocate() }
                try await withTaskExecutorPreference(receiver.preferredExecutor) { () async throws in
                    for (index, size) in sizes.enumerated() {
                        let got = try await receiver.receive(into: buffer.buffer)
                        #expect(got == Received(count: size, kind: .binary), "message \(index)")
                        #expect(
                            Array(UnsafeRawBufferPointer(rebasing: buffer.buffer[..<(got?.count ?? 0)]))
                                == pattern(size, seed: UInt8(index)), "message \(index)")
                    }
                }
                try await sent
            }
            await closeBoth(client, server)
            await listener.close()
        }
    }

    @Test(
        "Cancelling a waiting receive(into:) returns promptly and loses nothing", arguments: ConformanceCase.all,
        [true, false])
    func cancel(_ test: ConformanceCase, onItsExecutor: Bool) async throws {
        try await SocketTest.run {
            let owned = OwnedBuffer(count: 100)
            defer { owned.buffer.deallocate() }
            try await expectCancelledReceiveLosesNothing(test, onItsExecutor: onItsExecutor) { server in
                _ = try await server.receive(into: owned.buffer)
            } readBack: { server in
                var got: [UInt8] = []
                while got.count < 3, let chunk = try await server.receive(into: owned.buffer) {
                    got += UnsafeRawBufferPointer(rebasing: owned.buffer[..<chunk.count])
                }
                return got
            }
        }
    }
}

/// A buffer handed to a task that fills it while this one waits (never both at once).
private struct OwnedBuffer: @unchecked Sendable {
    let buffer: UnsafeMutableRawBufferPointer
    init(count: Int) { buffer = .allocate(byteCount: count, alignment: 1) }
}
