import BenchmarkDriver
import Testing

/// Jain's fairness index and its companions, on made-up splits whose answers are known.
@Suite("Fairness between connections", .timeLimit(.minutes(1)))
struct FairnessTests {
    @Test("An equal split is perfectly fair, in any unit")
    func equalSplit() {
        for value in [1.0, 250.0, 1e9] {
            let fairness = Fairness(throughputs: Array(repeating: value, count: 16))
            #expect(fairness.jainIndex == 1)
            #expect(fairness.slowestShare == 1)
            #expect(fairness.connections == 16)
        }
    }

    @Test("A starved connection lowers the index: k of n served equally gives k/n")
    func starved() {
        var split = Array(repeating: 100.0, count: 16)
        split[3] = 0
        let oneStarved = Fairness(throughputs: split)
        #expect(abs(oneStarved.jainIndex - 15.0 / 16) < 1e-12)
        #expect(oneStarved.slowestShare == 0)
        let oneServed = Fairness(throughputs: [100] + Array(repeating: 0, count: 15))
        #expect(abs(oneServed.jainIndex - 1.0 / 16) < 1e-12)
        // Half speed for one connection is less fair than an equal split and fairer than starving it.
        split[3] = 50
        let halfSpeed = Fairness(throughputs: split)
        #expect(halfSpeed.jainIndex < 1 && halfSpeed.jainIndex > oneStarved.jainIndex)
        #expect(abs(halfSpeed.slowestShare - 50 / (1550.0 / 16)) < 1e-12)
    }

    @Test("Nothing measured, or nothing served, is not called unfair")
    func degenerate() {
        #expect(Fairness(throughputs: []).jainIndex == 1)
        #expect(Fairness(throughputs: [0, 0, 0]).jainIndex == 1)
        #expect(Fairness(throughputs: []).medianP99 == nil)
    }

    @Test("The median connection's p99 beside the worst one's")
    func percentiles() {
        // Three connections: 100 samples each, the third with its slowest 5% at 9 ms.
        let quick = (1...100).map { UInt64($0) * 1000 }
        var slow = quick
        for index in 95..<100 { slow[index] = 9_000_000 }
        let fairness = Fairness(throughputs: [1, 1, 1], latencies: [quick, quick.reversed(), slow])
        #expect(fairness.medianP99 == 99_000)
        #expect(fairness.worstP99 == 9_000_000)
    }
}
