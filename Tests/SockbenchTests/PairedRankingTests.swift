import Testing

@testable import sockbench

/// The pingpong ranking orders backends by what varies least: their passes set side by side, slice for slice.
@Suite("Rankings judged slice for slice", .timeLimit(.minutes(1)))
struct PairedRankingTests {
    private func show(_ value: Double) -> String { String(value) }

    /// A machine that switches between two speeds 1.5x apart: each row's passes spread over both, so their ranges
    /// overlap, yet one row is 10% behind the other in every slice. That is an order, and the note says how sure.
    @Test("An order that holds in every slice is one, though the ranges over the passes overlap")
    func speedSwitchCancels() {
        let fast = [10.0, 15, 10, 15, 10, 15]
        let a = PairedRanking.Entry(name: "a", center: 12.5, slices: fast)
        let b = PairedRanking.Entry(name: "b", center: 13.75, slices: fast.map { $0 * 1.1 })
        #expect(PairedRanking.text([b, a], lowerIsBetter: true, show: show) == "a 12.5, b 13.75 (+10%, 6/6)")
        // Higher is better (a pump's MB/s): the same order read the other way.
        #expect(PairedRanking.text([a, b], lowerIsBetter: false, show: show) == "b 13.75, a 12.5 (-9%, 6/6)")
    }

    /// Two rows that take turns being ahead are not ordered, whatever their medians say.
    @Test("Rows that take turns are not distinguishable")
    func turnsAreNotAnOrder() {
        let a = PairedRanking.Entry(name: "a", center: 10, slices: [10, 10, 10, 10, 10, 10])
        let b = PairedRanking.Entry(name: "b", center: 10.2, slices: [11, 9, 11, 9, 11, 10.2])
        #expect(PairedRanking.text([a, b], lowerIsBetter: true, show: show) == "a 10.0 ~ b 10.2 (+4%, 4/6)")
    }

    /// With too few paired passes (one repetition, or another tool's single row), the ranges decide.
    @Test("Few passes: rows are ordered only when their ranges do not overlap")
    func fewPassesUseRanges() {
        let a = PairedRanking.Entry(name: "a", center: 10, slices: [9, 11])
        let b = PairedRanking.Entry(name: "b", center: 10.5, slices: [10, 11.5])
        let c = PairedRanking.Entry(name: "c", center: 20, slices: [19, 21])
        #expect(PairedRanking.text([c, b, a], lowerIsBetter: true, show: show) == "a 10.0 ~ b 10.5, c 20.0")
    }
}

/// The price of the unified API sets a pingpong row against a native row of another pass; the C floor measured in
/// each pass takes the machine's speed of that pass out.
@Suite("The price of the unified API, pass by pass", .timeLimit(.minutes(1)))
struct UnifiedPriceTests {
    /// The machine runs 1.5x slower in some passes: a backend 1.4x dearer through Connection in every pair of
    /// passes is 1.4x, though its pingpong pass and its native pass fell in different speeds.
    @Test("The floor in each pass takes the machine's speed out of the price")
    func speedTakenOut() throws {
        let pingpongSpeed = [1.0, 1.5, 1.5, 1.0, 1.0]
        let nativeSpeed = [1.5, 1.0, 1.5, 1.0, 1.5]
        let floor = pingpongSpeed.map { Optional(7.0 * $0) }
        let nativeFloor = nativeSpeed.map { Optional(7.0 * $0) }
        let row = pingpongSpeed.map { Optional(14.0 * $0) }
        let native = nativeSpeed.map { Optional(10.0 * $0) }
        let price = try #require(Report.overFloors(row, native, floor, nativeFloor))
        #expect(abs(price.center - 1.4) < 1e-9 && abs(price.low - 1.4) < 1e-9 && abs(price.high - 1.4) < 1e-9)
        // Without the floors the same passes say anything from 0.93x to 2.1x.
        let plain = try #require(Report.overFloors(row, native, floor.map { _ in 1 }, nativeFloor.map { _ in 1 }))
        #expect(plain.low < 1 && plain.high > 2)
    }

    /// A pass without a figure (a row that failed in it) is left out, not counted as zero.
    @Test("A pass missing a figure is left out")
    func missingPass() throws {
        let price = try #require(
            Report.overFloors([20, nil, 20], [10, 10, 10], [10, 10, 10], [10, 10, 10]))
        #expect(price.center == 2 && price.low == 2 && price.high == 2)
    }
}
