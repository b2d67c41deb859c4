import BenchmarkDriver
import ConnectionTestKit
import Histogram
import POSIXSupport
import SocketStyles
import Testing

/// Broadcast to many clients (``Broadcast``), run for real on every backend: every message the asker asks for
/// reaches every other client exactly once and in order, and the asker gets its answer; and the merging of client
/// processes' reports counts what it should.
@Suite("Broadcast: every message to every client, once, in order", .timeLimit(.minutes(10)))
struct BroadcastTests {
    @Test(
        "Every broadcast message reaches every client exactly once and in order, and every request is answered",
        arguments: ConformanceCase.all.filter { [.tcp, .ws].contains($0.transport) })
    func everyClientOnceInOrder(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = EchoServer(listener: try await test.listen(), mode: .broadcast)
            server.begin()
            let endpoint = server.endpoint
            let count = 12
            var clients: [any Connection] = []
            for _ in 0..<count {
                let client = try await test.connect(to: endpoint)
                try await BroadcastReceipts.hello(on: client)
                clients.append(client)
            }
            let messages = 20
            let receiving = clients.map { client in
                Task { await BroadcastReceipts.receive(on: client) { $0 >= UInt64(messages - 1) } }
            }
            let asker = try await test.connect(to: endpoint)
            for sequence in 0..<messages {
                let request = Broadcast.encode(
                    Broadcast.Header(kind: .request, sequence: UInt64(sequence), sent: MonotonicClock.nanoseconds()))
                try await Broadcast.send(request, on: asker)
                let answer = try #require(try await Broadcast.receive(on: asker))
                let header = try #require(Broadcast.decode(answer))
                #expect(header.kind == .answer && header.sequence == UInt64(sequence))
                #expect(header.server >= header.sent, "the server's time is after the request's")
            }
            for (index, task) in receiving.enumerated() {
                let receipts = await task.value
                #expect(receipts.sequences == (0..<UInt64(messages)).map { $0 }, "client \(index) got every message")
                #expect(receipts.duplicates == 0 && receipts.outOfOrder == 0)
            }
            await asker.close()
            for client in clients { await client.close() }
            await server.stop()
        }
    }

    @Test("A header encodes and decodes; anything else is not one")
    func header() {
        let header = Broadcast.Header(kind: .message, sequence: 42, sent: 0x0123_4567_89ab_cdef, server: .max)
        let bytes = Broadcast.encode(header, body: "{}")
        #expect(bytes.count == Broadcast.headerSize + 2)
        #expect(Broadcast.decode(bytes) == header)
        #expect(Broadcast.decode(Array("Bx 0000000000000000 0000000000000000 0000000000000000\n".utf8)) == nil)
        #expect(Broadcast.decode(Array("Bm 000000000000000g 0000000000000000 0000000000000000\n".utf8)) == nil)
        #expect(Broadcast.decode(Array("Bm 0".utf8)) == nil)
    }

    @Test("Receipts count a message that comes twice or after a later one")
    func receipts() {
        var receipts = BroadcastReceipts()
        for sequence: UInt64 in [0, 1, 1, 3, 2] {
            receipts.record(Broadcast.Header(kind: .message, sequence: sequence, sent: 100), at: 150)
        }
        #expect(receipts.sequences == [0, 1, 3, 2])
        #expect(receipts.duplicates == 1 && receipts.outOfOrder == 1)
        #expect(receipts.latencies == [50, 50, 50, 50])
    }

    @Test("Merged over processes: first and last receipt per message, what is missing, the fairness over clients")
    func merge() {
        // Two processes: two clients and one. Message 0 sent at 1,000, message 1 at 2,000; warm-up below 0.
        func client(_ arrivals: [(UInt64, UInt64)]) -> BroadcastReceipts {
            var receipts = BroadcastReceipts()
            for (sequence, at) in arrivals {
                receipts.record(
                    Broadcast.Header(kind: .message, sequence: sequence, sent: sequence == 0 ? 1_000 : 2_000), at: at)
            }
            return receipts
        }
        let one = BroadcastClientReport(
            [client([(0, 1_100), (1, 2_100)]), client([(0, 1_300), (1, 2_500)])], warmup: 0, cpuNanoseconds: 7)
        let other = BroadcastClientReport([client([(0, 1_200)])], warmup: 0, cpuNanoseconds: 3)
        let (figures, latency, fairness) = BroadcastFigures.merge(
            [one, other], sent: [0: 1_000, 1: 2_000], answers: [400, 600])
        #expect(figures.clients == 3 && figures.processes == 2 && figures.messages == 2)
        #expect(figures.missing == 1, "the third client never got message 1")
        #expect(figures.firstReceipt?.p50 == 100 && figures.firstReceipt?.max == 100)
        // Only message 0 reached everyone: its last receipt is 300 after its send.
        #expect(figures.lastReceipt?.p50 == 300 && figures.lastReceipt?.max == 300)
        #expect(figures.answer?.p50 == 400)
        #expect(figures.clientCPUNanoseconds == 10)
        #expect(latency?.count == 5)
        #expect(fairness.connections == 3 && fairness.jainIndex < 1, "one client got half of what the others got")
    }
}
