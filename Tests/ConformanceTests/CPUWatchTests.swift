import BenchmarkDriver
import Glibc
import Testing

/// The disturbance detector of `sockbench compare`: /proc/stat parsing and the foreign-share rule, on made-up
/// figures (the live side is exercised by every compare run).
@Suite("CPU watch")
struct CPUWatchTests {
    static let before = """
        cpu  1000 100 500 9000 10 0 20 30 0 0
        cpu0 500 50 250 4500 5 0 10 15 0 0
        cpu1 500 50 250 4500 5 0 10 15 0 0
        intr 1 2 3
        """
    static let after = """
        cpu  1150 100 550 9100 10 0 25 35 0 0
        cpu0 520 50 255 4580 5 0 12 15 0 0
        cpu1 630 50 295 4520 5 0 13 20 0 0
        intr 1 2 3
        """

    var tick: UInt64 { 1_000_000_000 / UInt64(sysconf(Int32(_SC_CLK_TCK))) }

    @Test("Busy time is user + nice + system + irq + softirq of the CPUs asked for; steal apart; idle and iowait not")
    func parse() throws {
        let cpu1 = try #require(CPUTimes.parse(Self.before, cpus: [1]))
        #expect(cpu1.busyNanoseconds == 810 * tick)
        #expect(cpu1.stealNanoseconds == 15 * tick)
        let all = try #require(CPUTimes.parse(Self.before, cpus: nil))
        #expect(all.busyNanoseconds == 1620 * tick)
        #expect(CPUTimes.parse(Self.before, cpus: [7]) == nil)
    }

    @Test("A window is disturbed when others used at least 20% of the watched CPUs, and at least 50 ms")
    func share() throws {
        let before = try #require(CPUTimes.parse(Self.before, cpus: [1]))
        let after = try #require(CPUTimes.parse(Self.after, cpus: [1]))
        // CPU 1: 178 busy ticks and 5 of steal in a 2-second window; the measured processes used 100 ticks' worth.
        let window: UInt64 = 2_000_000_000
        let share = CPUShare(
            windowNanoseconds: window, before: before, after: after, measuredNanoseconds: 100 * tick, cpus: 1)
        #expect(share.foreignNanoseconds == 83 * tick)
        #expect(share.isDisturbed == (Double(83 * tick) / Double(window) >= 0.20))
        let quiet = CPUShare(
            windowNanoseconds: window, before: before, after: after, measuredNanoseconds: 190 * tick, cpus: 1)
        #expect(quiet.foreignNanoseconds == 0)
        #expect(!quiet.isDisturbed)
        // Above 20% but below five ticks' worth: too little for /proc/stat's sampling to tell.
        let short = CPUShare(
            windowNanoseconds: 20_000_000, before: before, after: after, measuredNanoseconds: 181 * tick, cpus: 1)
        #expect(short.foreignShare >= 0.20)
        #expect(short.isDisturbed == (short.foreignNanoseconds >= 50_000_000))
    }
}

extension CPUWatchTests {
    @Test("Short windows are judged together: their times add up")
    func combined() throws {
        let before = try #require(CPUTimes.parse(Self.before, cpus: [1]))
        let after = try #require(CPUTimes.parse(Self.after, cpus: [1]))
        let one = CPUShare(
            windowNanoseconds: 1_000_000_000, before: before, after: after, measuredNanoseconds: 150 * tick, cpus: 1)
        let sum = try #require(CPUShare.combined([one, one, one]))
        #expect(sum.windowNanoseconds == 3_000_000_000)
        #expect(sum.foreignNanoseconds == 3 * one.foreignNanoseconds)
        #expect(CPUShare.combined([CPUShare]()) == nil)
    }
}
