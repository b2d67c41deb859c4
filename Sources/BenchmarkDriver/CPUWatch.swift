import Glibc

/// What the measured CPUs did during a measurement window, from /proc/stat: their busy time (user, nice, system)
/// and the time the hypervisor took from them (steal). Compared with the CPU time of the processes measured, it
/// says how much of the CPUs something else used: a run taken while a build, a browser or another VM ran there.
///
/// /proc/stat counts in clock ticks (10 ms at USER_HZ 100) by sampling, so a window shorter than a second or so
/// cannot tell a few percent of foreign use from noise; ``CPUShare/isDisturbed`` asks for both a share and an
/// absolute amount. Interrupt and softirq time count as busy: on this kernel a process's CPU-time clock includes
/// the softirq work done in its context (loopback packet processing), which /proc/stat files under softirq
/// (measured: a pingpong window of 541 ms, both processes' clocks 539 ms, user + nice + system 400 ms).
public struct CPUTimes: Sendable, Equatable {
    /// user + nice + system + irq + softirq (every non-idle column but steal), nanoseconds.
    public var busyNanoseconds: UInt64 = 0
    /// steal, nanoseconds.
    public var stealNanoseconds: UInt64 = 0

    public init() {}

    /// The sum over `cpus` (all CPUs when `nil`), or `nil` when /proc/stat cannot be read.
    public static func read(cpus: Set<Int>?) -> CPUTimes? {
        guard let text = ResourceUsage.readFile("/proc/stat") else { return nil }
        return parse(text, cpus: cpus)
    }

    /// Parses /proc/stat's text (split out for tests).
    public static func parse(_ text: String, cpus: Set<Int>?) -> CPUTimes? {
        let tick = UInt64(max(1, sysconf(Int32(_SC_CLK_TCK))))
        var times = CPUTimes()
        var found = false
        for line in text.split(separator: "\n") where line.hasPrefix("cpu") {
            let fields = line.split(separator: " ")
            guard fields.count >= 9 else { continue }
            let name = fields[0].dropFirst(3)
            if let cpus {
                guard let number = Int(name), cpus.contains(number) else { continue }
            } else {
                guard name.isEmpty else { continue }  // the "cpu" line: every CPU
            }
            let value = { (index: Int) in UInt64(fields[index]) ?? 0 }
            times.busyNanoseconds += (value(1) + value(2) + value(3) + value(6) + value(7)) * 1_000_000_000 / tick
            times.stealNanoseconds += value(8) * 1_000_000_000 / tick
            found = true
        }
        return found ? times : nil
    }
}

/// The share of the measured CPUs that something other than the measured processes used in one window.
public struct CPUShare: Sendable, Codable, Hashable {
    /// Wall time of the window.
    public var windowNanoseconds: UInt64
    /// Busy time of the watched CPUs (user, nice, system, irq, softirq) in the window.
    public var busyNanoseconds: UInt64
    /// Time the hypervisor took from the watched CPUs.
    public var stealNanoseconds: UInt64
    /// CPU time of the measured processes (client and server) in the window.
    public var measuredNanoseconds: UInt64
    /// How many CPUs were watched.
    public var cpus: Int

    public init(
        windowNanoseconds: UInt64, before: CPUTimes, after: CPUTimes, measuredNanoseconds: UInt64, cpus: Int
    ) {
        self.windowNanoseconds = windowNanoseconds
        busyNanoseconds = after.busyNanoseconds &- before.busyNanoseconds
        stealNanoseconds = after.stealNanoseconds &- before.stealNanoseconds
        self.measuredNanoseconds = measuredNanoseconds
        self.cpus = max(1, cpus)
    }

    /// Busy time that was not the measured processes', plus steal (never below 0).
    public var foreignNanoseconds: UInt64 {
        let busy = busyNanoseconds + stealNanoseconds
        return busy > measuredNanoseconds ? busy - measuredNanoseconds : 0
    }

    /// ``foreignNanoseconds`` as a share of the watched CPUs' time in the window.
    public var foreignShare: Double {
        Double(foreignNanoseconds) / Double(max(1, windowNanoseconds * UInt64(cpus)))
    }

    /// Something else used at least 20% of the watched CPUs, and at least five clock ticks (50 ms) of it: below
    /// that, /proc/stat's sampling and the kernel's own work cannot be told from a disturbance. Measured on a quiet
    /// machine: a single 0.1 s window read up to 27% (two or three ticks); passes of a few seconds 0-8.3%, and
    /// 10-15% for `connect` (closing connections is kernel work outside the measured processes); a CPU-bound
    /// process pinned beside the measurement, 48-50%. Judge windows of a second or more: ``combined(_:)`` sums
    /// short ones.
    public var isDisturbed: Bool {
        foreignShare >= Self.disturbedShare && foreignNanoseconds >= Self.smallestVisibleNanoseconds
    }

    public static let disturbedShare = 0.20
    public static let smallestVisibleNanoseconds: UInt64 = 50_000_000

    /// Several windows on the same CPUs as one (their times summed), `nil` for none.
    public static func combined(_ shares: some Sequence<CPUShare>) -> CPUShare? {
        var total: CPUShare?
        for share in shares {
            guard var sum = total else {
                total = share
                continue
            }
            sum.windowNanoseconds += share.windowNanoseconds
            sum.busyNanoseconds += share.busyNanoseconds
            sum.stealNanoseconds += share.stealNanoseconds
            sum.measuredNanoseconds += share.measuredNanoseconds
            total = sum
        }
        return total
    }
}
