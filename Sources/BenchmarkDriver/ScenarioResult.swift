/// A scenario name that cannot be parsed.
public struct ScenarioError: Error, CustomStringConvertible {
    public let message: String
    public var description: String { message }

    public init(message: String) { self.message = message }
}

/// What one run of one scenario measured. Fields a scenario does not produce are `nil`.
public struct ScenarioResult: Sendable, Codable {
    /// Latency, nanoseconds: round trips (pingpong, fanin), from the intended send time (rate), handshakes
    /// (connect).
    public var latency: LatencySummary?
    /// rate only: latency from the actual send time (what a closed-loop tool would report).
    public var uncorrectedLatency: LatencySummary?
    /// Messages (round trips, datagrams, connections) per second.
    public var messagesPerSecond: Double?
    /// Payload bytes per second delivered (pump), or echoed both ways (pingpong, fanin: one direction counted).
    public var bytesPerSecond: Double?
    /// Messages counted (round trips, datagrams sent, connections).
    public var messages: Int = 0
    /// UDP: datagrams lost (pingpong: re-sent probes; pump and rate: sent but never received).
    public var lost: Int?
    /// UDP pump: datagrams the sink received.
    public var received: Int?
    /// UDP pump: datagrams that arrived after a later one.
    public var reordered: Int?
    /// UDP pump: the kernel's RcvbufErrors delta during the run (system-wide).
    public var kernelReceiveBufferDrops: Int?
    /// json: the average message, bytes, and what it took on the wire from the client (frame payloads: after
    /// permessage-deflate, frame headers not counted).
    public var messageBytes: Double?
    public var wireBytes: Double?
    /// fanin: how much the server's resident memory (VmRSS) grew per connection, KiB, between before the
    /// connections were opened and when all of them were open and had made one round trip, before the measured
    /// window (so: memory per open, idle connection).
    public var serverKiBPerConnection: Double?
    /// fanin: the same for the client (the load generator).
    public var clientKiBPerConnection: Double?
    /// fanin: the server process's threads at that moment, every connection open (a thread per connection shows
    /// here; the usage read after the run, once the connections are closed, does not).
    public var serverThreadsOpen: Int?
    /// fanin, workload, loaded (its bulk connections) and broadcast: whether every connection got its share
    /// (``Fairness``).
    public var fairness: Fairness?
    /// workload with `bulk=K`: the bytes per second the bulk connections beside it got echoed during its window.
    public var bulkBytesPerSecond: Double?
    /// broadcast: per message, the first and the last client's receipt, the asker's answer, what went missing.
    public var broadcast: BroadcastFigures?
    /// Wall-clock time of the measured window, nanoseconds.
    public var elapsedNanoseconds: UInt64 = 0
    /// The client process during the window (peak memory: so far).
    public var client: ResourceUsage?
    /// The server process during the window (peak memory: so far).
    public var server: ResourceUsage?
    /// What else used the measured CPUs during the window (`nil` where /proc/stat could not be read).
    public var cpuShare: CPUShare?
    /// A re-measured pass's result: the foreign share of the disturbed pass it replaced (`nil`: measured once).
    public var replacedForeignShare: Double?
    /// UDP pump: datagrams the sink received per second of the send window (goodput; what iperf3 reports as the
    /// receiver's rate).
    public var receivedPerSecond: Double?
    /// Closed-loop round trips: the median round trip in the run's quiet stretches (``QuietP50``), nanoseconds;
    /// open-loop (rate) rows: the median latency from the actual send time in theirs (stretches of 20 ms of
    /// messages). What the report's ratios compare.
    public var quietP50: UInt64?
    /// rate: the CPU time the sender's clock spent waiting for send times (all of it while spinning), part of the
    /// client's CPU time and left out of ``cpuPerMessageNanoseconds``: it is the load generator's, not the cost of
    /// a message.
    public var pacingCPUNanoseconds: UInt64?

    public init() {}

    /// CPU time of both sides per message, nanoseconds (the cost of a message; a rate sender's waiting left out).
    public var cpuPerMessageNanoseconds: Double? {
        guard messages > 0, let client, let server else { return nil }
        let spent = client.cpuNanoseconds + server.cpuNanoseconds
        return Double(spent - min(spent, pacingCPUNanoseconds ?? 0)) / Double(messages)
    }
}
