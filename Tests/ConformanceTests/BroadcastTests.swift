import BenchmarkDriver
import ConnectionTestKit
import Foundation
import Histogram
import POSIXSupport
import SocketStyles
import Testing

/// Broadcast to many clients (``Broadcast``), run for real on every backend: every message the asker asks for
/// reaches every other client exactly once and in order, and the asker gets its answer; and the merging of client
/// processes' reports counts what it should.
@Suite("Broadcast: every message to every client, once, in order", .timeLimit(.minutes(20)))
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

    @Test("A broadcast workload is written as the user says it, and named so that the name says what ran")
    func specification() throws {
        let spec = try Workload.Specification(
            parsing: "broadcast=5k, rate=20/s, duration=10s, transport=ws, p95=100ms")
        #expect(spec.workload == nil)
        #expect(spec.broadcast == BroadcastLoad(clients: 5000, perSecond: 20, seconds: 10))
        #expect(spec.transport == .ws && spec.p95Bound == 100_000_000 && spec.p99Bound == nil)
        #expect(spec.broadcast?.description == "broadcast-5000-20/s-10s")
        #expect(try BroadcastLoad(name: "5000-20/s-10s") == spec.broadcast)
        let plain = try Workload.Specification(parsing: "broadcast=100")
        #expect(plain.broadcast == BroadcastLoad(clients: 100) && plain.broadcast?.description == "broadcast-100")
        #expect(plain.broadcast?.warmup == 5 && plain.broadcast?.measured(fallbackSeconds: 3) == 30)
        #expect(try BroadcastLoad(name: "100-600/min").perSecond == 10)
        for bad in [
            "broadcast=0", "broadcast=100,size=64", "broadcast=100,bulk=2", "broadcast=100,connections=5",
            "broadcast=100,transport=udp", "broadcast=100,rate=5000/s", "broadcast=many",
            "connections=10,rate=1/s,p95=1ms",
        ] {
            #expect(throws: ScenarioError.self, "\(bad)") { try Workload.Specification(parsing: bad) }
        }
        for bad in ["100-fast", "100-20/s-10s-x", "-20/s", "100-0/s"] {
            #expect(throws: ScenarioError.self, "\(bad)") { try BroadcastLoad(name: bad) }
        }
    }

    /// One backend's repetitions with the given last-receipt p95s (ns), missing deliveries and server CPU per
    /// delivery (us), as a run would report them.
    private func runs(p95s: [UInt64], missing: Int = 0, cpu: Double) throws -> [ScenarioResult] {
        try p95s.map { p95 in
            let json = """
                {"clients": 100, "processes": 1, "messages": 20, "missing": \(missing), "duplicates": 0,
                 "outOfOrder": 0, "clientCPUNanoseconds": 0,
                 "firstReceipt": {"p50": 1000, "p95": 2000, "p99": 3000, "max": 4000},
                 "lastReceipt": {"p50": \(p95 / 2), "p95": \(p95), "p99": \(p95 * 2), "max": \(p95 * 3)}}
                """
            var result = ScenarioResult()
            result.broadcast = try JSONDecoder().decode(BroadcastFigures.self, from: Data(json.utf8))
            result.messages = 2_000
            var server = ResourceUsage()
            server.cpuClockNanoseconds = UInt64(cpu * 1000 * 2_000)
            result.server = server
            return result
        }
    }

    @Test(
        "The broadcast verdict: every delivery made and the lowest p95 within the bound wins; ties go to the cheapest")
    func verdict() throws {
        let load = BroadcastLoad(clients: 100)
        let verdict = BroadcastVerdict(
            load: load, transport: "ws", p95Bound: 250_000_000,
            runs: [
                ("fast-dear", try runs(p95s: [20_000_000, 21_000_000, 26_000_000], cpu: 40)),
                ("close-cheap", try runs(p95s: [25_000_000, 25_500_000, 27_000_000], cpu: 20)),
                ("slow", try runs(p95s: [90_000_000, 95_000_000, 99_000_000], cpu: 5)),
                ("over-bound", try runs(p95s: [300_000_000, 280_000_000, 400_000_000], cpu: 1)),
                ("lost-some", try runs(p95s: [10_000_000, 10_000_000, 10_000_000], missing: 3, cpu: 1)),
            ])
        #expect(verdict.best == "close-cheap")
        #expect(verdict.tiedOnP95 == ["fast-dear"])
        #expect(verdict.entries.map(\.backend) == ["close-cheap", "fast-dear", "slow", "over-bound", "lost-some"])
        #expect(verdict.entries.map(\.held) == [true, true, true, false, false])
        let best = try #require(verdict.entries.first)
        #expect(best.p95 == 25_500_000 && best.p95Range == [25_000_000, 27_000_000])
        #expect(best.serverCPUPerDeliveryMicroseconds == 20)
        // Of those that did not hold it, one that made every delivery comes before one that lost some.
        #expect(verdict.entries[3].shortfalls == ["last receipt p95 300.0 ms over the 250.0 ms bound"])
        #expect(verdict.entries[3].repetitionsHeld == 0)
        #expect(verdict.entries[4].shortfalls == ["3 deliveries missing"])
        #expect(verdict.lines.count == 7 && verdict.lines[0].hasPrefix("broadcast-100 over ws: 100 clients"))
        #expect(verdict.lines.last == "  Best choice for this load: close-cheap. Why: \(verdict.reason).")

        let none = BroadcastVerdict(
            load: load, transport: "tcp", p95Bound: 50_000_000,
            runs: [
                ("a", try runs(p95s: [60_000_000], cpu: 5)), ("b", try runs(p95s: [70_000_000], missing: 1, cpu: 5)),
            ])
        #expect(none.best == nil && none.closest == "a")
        #expect(none.reason.contains("60.0 ms over the 50.0 ms bound"), "\(none.reason)")
    }
}
