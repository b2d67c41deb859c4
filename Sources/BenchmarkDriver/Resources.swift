import Glibc

/// CPU time, context switches and peak memory of one process, read from /proc (so the same code reads the
/// client itself and the server child). CPU times come in clock ticks (10 ms on Linux), so short runs are
/// coarse; the driver's windows last long enough for that to be a few per cent at most.
public struct ResourceUsage: Sendable, Codable, Hashable {
    /// User-mode CPU time, nanoseconds.
    public var userNanoseconds: UInt64 = 0
    /// Kernel-mode CPU time, nanoseconds.
    public var systemNanoseconds: UInt64 = 0
    /// Voluntary context switches (a thread waited: for I/O, a lock, a sleep). For this process: every thread,
    /// including those that ended (getrusage). For another process: summed over its live threads (/proc has no
    /// total), so a thread that ended during the window takes its count with it.
    public var voluntaryContextSwitches: UInt64 = 0
    /// Involuntary context switches (the scheduler took the CPU away).
    public var involuntaryContextSwitches: UInt64 = 0
    /// Peak resident memory so far (VmHWM), KiB.
    public var peakResidentKiB: UInt64 = 0
    /// Resident memory now (VmRSS), KiB: the process's user-space pages in RAM (socket buffers are the kernel's
    /// and not in it).
    public var residentKiB: UInt64?
    /// Threads right now.
    public var threads: UInt64 = 0
    /// CPU time in both modes from the process's CPU-time clock (nanosecond resolution, every thread
    /// including those that ended), when the kernel lets us read it.
    public var cpuClockNanoseconds: UInt64?

    public init() {}

    /// CPU time in both modes: the precise clock when read, else user + system from the 10 ms ticks.
    public var cpuNanoseconds: UInt64 { cpuClockNanoseconds ?? (userNanoseconds + systemNanoseconds) }

    /// The usage of process `pid` (`nil` for this process), or `nil` when /proc cannot be read.
    public static func read(pid: Int32? = nil) -> ResourceUsage? {
        let base = pid.map { "/proc/\($0)" } ?? "/proc/self"
        guard let stat = readFile("\(base)/stat"), let status = readFile("\(base)/status") else { return nil }
        var usage = ResourceUsage()
        // Fields after the command name (which may hold spaces), from field 3 on.
        if let close = stat.lastIndex(of: ")") {
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            let tick = UInt64(max(1, sysconf(Int32(_SC_CLK_TCK))))
            if fields.count > 12 {
                usage.userNanoseconds = (UInt64(fields[11]) ?? 0) * 1_000_000_000 / tick
                usage.systemNanoseconds = (UInt64(fields[12]) ?? 0) * 1_000_000_000 / tick
            }
        }
        let fields = statusFields(status)
        usage.voluntaryContextSwitches = fields["voluntary_ctxt_switches"] ?? 0
        usage.involuntaryContextSwitches = fields["nonvoluntary_ctxt_switches"] ?? 0
        usage.peakResidentKiB = fields["VmHWM"] ?? 0
        usage.residentKiB = fields["VmRSS"]
        usage.threads = fields["Threads"] ?? 0
        // Context switches: /proc/PID/status counts the main thread only, so add up every live thread's.
        if let tasks = opendir("\(base)/task") {
            var voluntary: UInt64 = 0
            var involuntary: UInt64 = 0
            while let entry = readdir(tasks) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                    String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
                }
                guard name.first?.isNumber == true, let text = readFile("\(base)/task/\(name)/status") else { continue }
                let fields = statusFields(text)
                voluntary += fields["voluntary_ctxt_switches"] ?? 0
                involuntary += fields["nonvoluntary_ctxt_switches"] ?? 0
            }
            closedir(tasks)
            usage.voluntaryContextSwitches = voluntary
            usage.involuntaryContextSwitches = involuntary
        }
        if pid == nil {
            var own = rusage()
            if getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &own) == 0 {
                usage.voluntaryContextSwitches = UInt64(max(0, own.ru_nvcsw))
                usage.involuntaryContextSwitches = UInt64(max(0, own.ru_nivcsw))
            }
        }
        var clock = clockid_t()
        if clock_getcpuclockid(pid ?? getpid(), &clock) == 0 {
            var now = timespec()
            if clock_gettime(clock, &now) == 0 {
                usage.cpuClockNanoseconds = UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
            }
        }
        return usage
    }

    /// `now - then`, or 0 when the count went down.
    static func increase(_ now: UInt64, since then: UInt64) -> UInt64 { now >= then ? now - then : 0 }

    /// What was used between `earlier` and this reading (peak memory and threads are kept as read now).
    public func since(_ earlier: ResourceUsage) -> ResourceUsage {
        var delta = self
        delta.userNanoseconds = userNanoseconds &- earlier.userNanoseconds
        delta.systemNanoseconds = systemNanoseconds &- earlier.systemNanoseconds
        // Another process's switches are the sum over its live threads: a thread that ended between the two
        // readings takes its count with it, so the sum can go down. Such a delta counts from 0, never wraps.
        delta.voluntaryContextSwitches = Self.increase(
            voluntaryContextSwitches, since: earlier.voluntaryContextSwitches)
        delta.involuntaryContextSwitches = Self.increase(
            involuntaryContextSwitches, since: earlier.involuntaryContextSwitches)
        if let now = cpuClockNanoseconds, let then = earlier.cpuClockNanoseconds {
            delta.cpuClockNanoseconds = now &- then
        } else {
            delta.cpuClockNanoseconds = nil
        }
        return delta
    }

    /// The numeric fields of a /proc status file ("Threads:\t5", "VmHWM:\t  1234 kB"), by name.
    static func statusFields(_ text: String) -> [Substring: UInt64] {
        var fields: [Substring: UInt64] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: ":", maxSplits: 1)
            guard parts.count == 2,
                let value = UInt64(parts[1].split(whereSeparator: { $0 == " " || $0 == "\t" }).first ?? "")
            else { continue }
            fields[parts[0]] = value
        }
        return fields
    }

    /// A whole small file (/proc files report size 0, so read until the end).
    static func readFile(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = Glibc.read(fd, &buffer, buffer.count)
            if count < 0 && errno == EINTR { continue }
            if count <= 0 { break }
            bytes += buffer[..<count]
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}

/// The kernel's UDP counters (/proc/net/snmp), system-wide: `RcvbufErrors` counts datagrams dropped because a
/// socket's receive buffer was full.
public struct UDPCounters: Sendable, Codable, Hashable {
    public var inDatagrams: UInt64 = 0
    public var receiveBufferErrors: UInt64 = 0
    public var sendBufferErrors: UInt64 = 0

    /// Reads the counters, or `nil` when /proc/net/snmp cannot be read.
    public static func read() -> UDPCounters? {
        guard let text = ResourceUsage.readFile("/proc/net/snmp") else { return nil }
        let lines = text.split(separator: "\n").filter { $0.hasPrefix("Udp:") }
        guard lines.count >= 2 else { return nil }
        let names = lines[0].split(separator: " ")
        let values = lines[1].split(separator: " ")
        var counters = UDPCounters()
        for (name, value) in zip(names, values) {
            switch name {
            case "InDatagrams": counters.inDatagrams = UInt64(value) ?? 0
            case "RcvbufErrors": counters.receiveBufferErrors = UInt64(value) ?? 0
            case "SndbufErrors": counters.sendBufferErrors = UInt64(value) ?? 0
            default: break
            }
        }
        return counters
    }
}
