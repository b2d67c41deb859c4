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
}
