import BenchmarkDriver
import ConnectionTestKit
import POSIXSupport
import SocketStyles
import Synchronization
import Testing

/// A user's own load (`compare --workload`): how it is written, run for real on every backend's executor, and
/// judged.
@Suite("Workloads: the user's load, run and judged", .timeLimit(.minutes(20)))
struct WorkloadTests {
    @Test("A workload is written as the user says it; rate is per connection, total over all")
    func specification() throws {
        let spec = try Workload.Specification(parsing: "connections=1000,rate=10/s,size=200,transport=ws")
        #expect(spec.workload == Workload(connections: 1000, perSecond: 10, size: 200, seconds: 3))
        #expect(spec.transport == .ws)
        #expect(spec.p99Bound == nil)
        #expect(spec.workload?.totalPerSecond == 10_000)
        #expect(spec.broadcast == nil)
        let total = try Workload.Specification(
            parsing: "connections=16, total=20k/s, transport=tcp, duration=500ms, p99=250us")
        #expect(total.workload?.perSecond == 1250)
        #expect(total.workload?.seconds == 0.5)
        #expect(total.workload?.size == 64)
        #expect(total.p99Bound == 250_000)
        for bad in [
            "connections=10", "connections=10,rate=5/s,total=50/s", "connections=0,rate=1/s", "rate=10/s,size=4",
            "rate=10/s,speed=3", "rate=10/s,transport=carrier-pigeon", "rate=ten", "connections=1,rate=0.5/s",
            "connections=100000,rate=100000/s",
        ] {
            #expect(throws: ScenarioError.self, "\(bad)") { try Workload.Specification(parsing: bad) }
        }
    }

    /// Every message goes on its own connection in turn and comes back on it: the run counts each echo once,
    /// loses none over a reliable transport, and spreads the load over every connection.
    @Test(
        "A workload's echoes are matched to their sends over many connections",
        arguments: ConformanceCase.all.filter { [.tcp, .udp, .ws].contains($0.transport) })
    func run(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            let endpoint = server.endpoint
            // 600 messages/s: what every backend's debug build serves with a CPU to spare on a CI machine running
            // other tests beside this one (at 1,800/s nio's server, all its channels on one event-loop thread
            // shared with the clients', fell behind and the kernel dropped what its socket buffer could not hold).
            let workload = Workload(connections: 12, perSecond: 50, size: 100, seconds: 1)
            let runner = WorkloadRunner(workload, warmup: .milliseconds(50))
            let windows = Counter()
            let result = try await runner.run(
                serverUsage: { ResourceUsage.read() }, startWindow: { windows.add(1) }, endWindow: { windows.add(10) }
            ) { () throws(ConnectionError) in try await test.connect(to: endpoint) }
            #expect(windows.value == 11, "the window opened once and closed once")
            let total = Int((workload.totalPerSecond * 1.05).rounded())
            // Loopback keeps every datagram at this rate; a busy CI machine may drop one now and then.
            #expect(result.lost ?? 0 <= (test.transport == .udp ? total / 100 : 0))
            let corrected = try #require(result.latency)
            let uncorrected = try #require(result.uncorrectedLatency)
            #expect(corrected.count == uncorrected.count)
            #expect(Int(corrected.count) + (result.lost ?? 0) >= result.messages - 1)
            #expect(corrected.p50 >= uncorrected.p50)
            #expect(result.serverKiBPerConnection != nil)
            // Every connection was offered the same and (lost aside) answered: counts differ by at most one.
            let fairness = try #require(result.fairness)
            #expect(fairness.connections == 12)
            #expect(fairness.jainIndex > (test.transport == .udp ? 0.9 : 0.99), "\(fairness)")
            await server.stop()
        }
    }

    /// `bulk=K`: bulk connections beside the load move bytes during its window, and the load's messages are still
    /// all answered on a reliable transport.
    @Test(
        "A workload with bulk connections beside it: every echo matched, the bulk flows moved bytes",
        arguments: ConformanceCase.all.filter { [.tcp, .udp, .ws].contains($0.transport) })
    func bulkBeside(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer()
            let endpoint = server.endpoint
            let workload = Workload(connections: 4, perSecond: 100, size: 64, seconds: 0.3, bulk: 2)
            let result = try await WorkloadRunner(workload, warmup: .milliseconds(50)).run {
                () throws(ConnectionError) in try await test.connect(to: endpoint)
            }
            if test.transport != .udp { #expect(result.lost ?? 0 == 0) }
            #expect(try #require(result.latency).count > 0)
            #expect((result.bulkBytesPerSecond ?? 0) > 0, "the bulk connections moved bytes in the window")
            await server.stop()
        }
    }

    @Test("bulk=K is part of the workload's name and its specification")
    func bulkNames() throws {
        let spec = try Workload.Specification(parsing: "connections=16,rate=100/s,bulk=4")
        #expect(spec.workload?.bulk == 4)
        #expect(spec.workload?.description == "workload-16x100/s-64B-3s-bulk4")
        #expect(try Workload(name: "16x100/s-64B-3s-bulk4") == spec.workload)
        #expect(try Workload.Specification(parsing: "connections=16,rate=100/s,bulk=0").workload?.bulk == nil)
        #expect(throws: ScenarioError.self) { try Workload.Specification(parsing: "connections=1,rate=1/s,bulk=x") }
        #expect(throws: ScenarioError.self) { try Workload(name: "16x100/s-bulkx") }
    }

    private final class Counter: Sendable {
        private let count = Guarded(0)
        func add(_ value: Int) { count.withLock { $0 += value } }
        var value: Int { count.withLock { $0 } }
    }

    /// One backend's repetitions with the given p99s (ns), rate answered and CPU per message (us).
    private func runs(p99s: [UInt64], answered: Double = 1000, lost: Int = 0, cpu: Double) -> [ScenarioResult] {
        p99s.map { p99 in
            var result = ScenarioResult()
            var latency = LatencySummary(
                count: 1000, min: 1000, p50: p99 / 4, p90: p99 / 2, p99: p99, p999: p99 * 2, p9999: p99 * 3,
                max: p99 * 4, mean: Double(p99 / 4), stddev: 1)
            latency.count = 1000
            result.latency = latency
            result.messagesPerSecond = answered
            result.messages = 1000
            result.lost = lost
            // CPU per message: (client + server CPU) / messages.
            var client = ResourceUsage()
            client.cpuClockNanoseconds = UInt64(cpu * 1000 * 1000)
            var server = ResourceUsage()
            server.cpuClockNanoseconds = 0
            result.client = client
            result.server = server
            return result
        }
    }

    @Test("The verdict: lowest p99 that holds wins; p99s it cannot tell apart are decided by CPU per message")
    func verdict() throws {
        let workload = Workload(connections: 10, perSecond: 100, size: 64, seconds: 1)
        let verdict = WorkloadVerdict(
            workload: workload, transport: "tcp", p99Bound: 1_000_000,
            runs: [
                ("fast-dear", runs(p99s: [200_000, 210_000, 260_000], cpu: 40)),
                ("close-cheap", runs(p99s: [250_000, 255_000, 270_000], cpu: 20)),
                ("slow-cheapest", runs(p99s: [400_000, 410_000, 420_000], cpu: 5)),
                ("over-bound", runs(p99s: [1_500_000, 1_400_000, 1_600_000], cpu: 1)),
                ("fell-behind", runs(p99s: [100_000, 100_000, 100_000], answered: 800, cpu: 1)),
            ])
        #expect(verdict.best == "close-cheap")
        #expect(verdict.tiedOnP99 == ["fast-dear"])
        #expect(
            verdict.entries.map(\.backend) == [
                "close-cheap", "fast-dear", "slow-cheapest", "over-bound", "fell-behind",
            ])
        #expect(verdict.entries.map(\.held) == [true, true, true, false, false])
        let close = try #require(verdict.entries.first)
        #expect(close.p99 == 255_000 && close.p99Range == [250_000, 270_000])
        #expect(close.cpuPerMessageMicroseconds == 20)
        // Of those that did not hold it, the one that answered more of the offered rate comes first.
        #expect(verdict.entries[3].shortfalls == ["p99 1.50 ms over the 1.00 ms bound"])
        #expect(verdict.entries[4].shortfalls == ["answered 80.0% of the offered rate"])
        #expect(verdict.lines.last == "  Best choice for this load: close-cheap. Why: \(verdict.reason).")
        #expect(verdict.reason.contains("255.0 us") && verdict.reason.contains("fast-dear"))

        // A p99 clear of the others' wins on its own, whatever it costs.
        let clear = WorkloadVerdict(
            workload: workload, transport: "tcp", p99Bound: 1_000_000,
            runs: [
                ("fast-dear", runs(p99s: [200_000, 210_000, 220_000], cpu: 40)),
                ("slow-cheap", runs(p99s: [300_000, 310_000, 320_000], cpu: 5)),
            ])
        #expect(clear.best == "fast-dear" && clear.tiedOnP99.isEmpty)

        // Ties are not transitive: "tied" overlaps the fastest, "between" (lower p99, cheaper) overlaps "tied" but
        // not the fastest. Naming "tied" would name a backend another beats on both p99 and cost: the fastest wins.
        let chain = WorkloadVerdict(
            workload: workload, transport: "tcp", p99Bound: 1_000_000,
            runs: [
                ("fastest", runs(p99s: [200_000, 200_000, 215_000], cpu: 40)),
                ("tied", runs(p99s: [214_000, 226_000, 240_000], cpu: 30)),
                ("between", runs(p99s: [216_000, 221_000, 230_000], cpu: 20)),
            ])
        #expect(chain.best == "fastest", "\(chain.reason)")
        // "tied" is still named as tied with it, and the reason does not say the fastest costs the least.
        #expect(chain.tiedOnP99 == ["tied"])
        #expect(chain.reason.contains("none of those beats it on both p99 and cost"), "\(chain.reason)")

        // None held it: no best, the closest named with what it missed.
        let none = WorkloadVerdict(
            workload: workload, transport: "tcp", p99Bound: 100_000,
            runs: [
                ("a", runs(p99s: [300_000], answered: 700, cpu: 5)),
                ("b", runs(p99s: [200_000], answered: 990, lost: 50, cpu: 5)),
            ])
        #expect(none.best == nil && none.closest == "b")
        #expect(none.entries.allSatisfy { !$0.held })
        #expect(none.reason.contains("5.00% of messages unanswered"), "\(none.reason)")
    }
}
