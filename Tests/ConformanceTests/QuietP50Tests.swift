import BenchmarkDriver
import Testing

/// The quiet p50 of `sockbench compare`: on made-up round trips from a machine with two speeds.
@Suite("Quiet p50")
struct QuietP50Tests {
    /// `stretches` of 10 ms each, in the order given: `true` a fast one (6 us round trips, a few at 7 us), `false`
    /// a slow one (9 us, a few at 11 us).
    static func run(_ stretches: [Bool]) -> [UInt64] {
        var samples: [UInt64] = []
        for fast in stretches {
            let (typical, late): (UInt64, UInt64) = fast ? (6_000, 7_000) : (9_000, 11_000)
            var elapsed: UInt64 = 0
            var index = 0
            while elapsed < 10_000_000 {
                let sample = index % 5 == 4 ? late : typical
                samples.append(sample)
                elapsed += sample
                index += 1
            }
        }
        return samples
    }

    @Test("Mostly slow or mostly fast, the plain p50 flips; the quiet p50 stays at the fast speed")
    func steadyAcrossMixtures() throws {
        let mostlySlow = Self.run((0..<20).map { $0 % 5 == 0 })  // 4 fast stretches of 20
        let mostlyFast = Self.run((0..<20).map { $0 % 5 != 0 })  // 16 fast of 20
        func p50(_ samples: [UInt64]) -> UInt64 { samples.sorted()[samples.count / 2] }
        #expect(p50(mostlySlow) == 9_000)
        #expect(p50(mostlyFast) == 6_000)
        #expect(try #require(QuietP50.of(mostlySlow)) == 6_000)
        #expect(try #require(QuietP50.of(mostlyFast)) == 6_000)
    }

    @Test("A run that never had a quick stretch reports its own speed")
    func allSlow() throws {
        #expect(try #require(QuietP50.of(Self.run(Array(repeating: false, count: 12)))) == 9_000)
    }

    @Test("Too short a run has none: fewer than ten whole stretches")
    func tooShort() {
        #expect(QuietP50.of(Self.run(Array(repeating: true, count: 4))) == nil)
        #expect(QuietP50.of([]) == nil)
    }

    @Test("The stretches follow the samples' own durations, in measured order")
    func order() throws {
        // The same samples, fast stretches first or interleaved: the same quiet p50; sorted by size they would
        // not be stretches of time at all (the quickest tenth of all samples), which is not what it measures.
        let interleaved = Self.run((0..<20).map { $0 % 4 == 0 })
        let grouped = Self.run((0..<20).map { $0 < 5 })
        #expect(QuietP50.of(interleaved) == QuietP50.of(grouped))
    }

    /// An open-loop run at `perSecond`: `stretches` of 20 ms of messages each, fast (14 us from the send, a few at
    /// 20) or slow (21 us, a few at 30), in send order.
    static func openLoop(_ stretches: [Bool], perSecond: Int) -> [UInt64] {
        let messages = QuietP50.openLoopMessages(perSecond: perSecond)
        return stretches.flatMap { fast -> [UInt64] in
            (0..<messages).map { index in
                let (typical, late): (UInt64, UInt64) = fast ? (14_000, 20_000) : (21_000, 30_000)
                return index % 5 == 4 ? late : typical
            }
        }
    }

    @Test("Open loop: stretches of messages in send order; mostly slow or mostly fast, the same quiet p50")
    func openLoopStretches() throws {
        // 0.5 s at 5,000 a second: 25 stretches of 100 messages. Mostly slow or mostly fast, the same quiet p50.
        #expect(QuietP50.openLoopMessages(perSecond: 5_000) == 100)
        #expect(QuietP50.openLoopMessages(perSecond: 1_000) == 50)
        let mostlySlow = Self.openLoop((0..<25).map { $0 % 5 == 0 }, perSecond: 5_000)
        let mostlyFast = Self.openLoop((0..<25).map { $0 % 5 != 0 }, perSecond: 5_000)
        #expect(mostlySlow.sorted()[mostlySlow.count / 2] == 21_000)
        #expect(try #require(QuietP50.of(mostlySlow, messages: 100)) == 14_000)
        #expect(try #require(QuietP50.of(mostlyFast, messages: 100)) == 14_000)
        // A run that never had a quick stretch reports its own speed.
        let allSlow = Self.openLoop(Array(repeating: false, count: 12), perSecond: 5_000)
        #expect(try #require(QuietP50.of(allSlow, messages: 100)) == 21_000)
        // Fewer than ten whole stretches: none.
        #expect(QuietP50.of(Self.openLoop(Array(repeating: true, count: 9), perSecond: 5_000), messages: 100) == nil)
    }
}
