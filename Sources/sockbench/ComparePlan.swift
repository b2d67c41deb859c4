import ArgumentParser
import BenchmarkDriver
import ConnectionCore
import ConnectionTestKit
import Foundation
import Histogram
import NativeStyles
import POSIXSupport
import SocketStyles
import Synchronization

/// What a compare run is made of: its plan (from the flags), the descriptor limit it needs, its targets.
extension Compare {
    /// Where client and server run: one CPU, different CPUs, or wherever the scheduler puts them.
    enum Placement: String, ExpressibleByArgument, Codable {
        case same, cross, none
    }

    /// The knobs a run uses, resolved from the flags (recorded in results.json).
    struct Plan: Codable {
        var backends: [String]
        var transports: [String]
        var scenarios: [Scenario]
        var repetitions: Int
        /// Round trips per repetition when fixed (--count), and of each row's calibration run otherwise.
        var pingpongCount: Int
        /// Seconds of round trips per repetition (the count calibrated per row), `nil` when --count fixes it.
        var pingpongSeconds: Double?
        /// Round-trip scenarios: the passes over every target each repetition is measured in (1 with --count).
        var slices = 1
        /// Rounds of measuring disturbed passes again (`nil` in reports made before there was a choice).
        var remeasure: Int?
        var pingpongWarmup: Int
        var rateSeconds: Double
        /// How the rate senders wait for each send time (`nil` in reports made before there was a choice: sleep).
        var pacing: Pacing?
        /// Bytes of a pump's measured pass when ``pumpSeconds`` is `nil` (reports made before there was a choice);
        /// its warm-up pass moves an eighth of them.
        var pumpBytes: Int
        /// Seconds a pump's measured pass lasts: its bytes are sized from the rate of the warm-up pass before it.
        var pumpSeconds: Double?
        /// SO_RCVBUF asked for each udp pump sink, in bytes; `nil`: the system's default (and in reports made
        /// before there was a choice).
        var udpSinkBuffer: Int?
        var connectCount: Int
        var faninCount: Int
        /// The p99 (from the intended send time, nanoseconds) a backend must keep to hold a load: a workload
        /// without its own `p99=`, a sweep's step (`nil` in reports made before there was a choice: 1 ms).
        var p99Bound: UInt64?
        /// The broadcast workload (`--workload broadcast=N,...`): its `broadcast-N` rows get a verdict.
        var broadcastWorkload: BroadcastLoad?
        /// The bound on its last receipt's p95, nanoseconds (`nil`: 250 ms).
        var p95Bound: UInt64?
        /// The rates of a sweep (`--sweep`), per second: its `rate-N` rows are one curve per backend x transport.
        var sweep: [Int]?
        /// `--server-threads`: the thread counts its fan-in and workload scenarios ran their servers on (`nil`:
        /// one, placed as ``placement`` says).
        var serverThreads: [Int]?
        var placement: Placement
        var serverCPU: Int?
        var clientCPU: Int?
        var tcpNoDelay = true
        var options: String
        /// Where the servers ran: `local` (child processes here) or the agent's HOST:PORT.
        var servers = "local"
        static let defaultP99Bound: UInt64 = 1_000_000
        /// 4 MiB: room for about 900 datagrams of 1,400 bytes (each takes about 4.5 KiB of buffer on loopback).
        static let defaultUDPSinkBuffer = 4 << 20

        /// fanin-N: `faninCount` round trips per connection up to 1,000 connections; beyond, `faninCount` x 1,000
        /// in all (at least 10 per connection), so that fanin-10000 takes seconds, not minutes.
        /// The bytes of a pump's measured pass, from its warm-up pass (`warmupBytes` in `warmupNanoseconds`: the
        /// pass's own time, its udp sending or its tcp bytes up to the sink's count): enough to last
        /// ``pumpSeconds`` at the warm-up's rate, in whole writes of `size`, at least the warm-up's bytes and at most
        /// 64 GiB; ``pumpBytes`` without a time.
        func pumpPassBytes(size: Int, warmupBytes: Int, warmupNanoseconds: UInt64) -> Int {
            guard let pumpSeconds else { return pumpBytes }
            let perSecond = Double(warmupBytes) * 1e9 / Double(max(1, warmupNanoseconds))
            let bytes = min(max(perSecond * pumpSeconds, Double(warmupBytes)), Double(64 << 30))
            return max(size, Int(bytes) / size * size)
        }

        func faninRoundTrips(connections: Int) -> Int {
            connections <= 1000 ? faninCount : max(10, faninCount * 1000 / connections)
        }
    }

    func makePlan() throws -> Plan {
        let chosenBackends: [Backend]
        do throws(ConnectionError) {
            chosenBackends =
                backends == "all"
                ? Backend.allCases
                : try backends.split(separator: ",").map { name throws(ConnectionError) in
                    try Backend(name: String(name))
                }
        } catch {
            throw fail(error.detail)
        }
        if let pumpSeconds, !(pumpSeconds > 0) { throw fail("--pump-seconds must be above 0") }
        guard udpSinkBuffer >= 0 else { throw fail("--udp-sink-buffer must be 0 or more") }
        guard let chosenPacing = Pacing(rawValue: pacing) else {
            throw fail("unknown pacing '\(pacing)' (spin, sleep)")
        }
        let specification: Workload.Specification?
        do throws(ScenarioError) {
            specification = try load.workload.map { text throws(ScenarioError) in
                try Workload.Specification(parsing: text)
            }
        } catch {
            throw fail("--workload: \(error.message)")
        }
        guard let bound = Workload.duration(load.bound), bound >= 1e-6 else {
            throw fail("--bound \(load.bound): expected a latency, e.g. 1ms or 500us")
        }
        var sweepRates: [Int]?
        if load.sweep {
            sweepRates = try load.sweepRates.split(separator: ",").map { text in
                guard let rate = Workload.rate(String(text)), rate >= 1 else {
                    throw fail("--sweep-rates: '\(text)' is not a rate (e.g. 5k)")
                }
                return Int(rate)
            }.sorted()
        }
        var chosenTransports: [Transport] = []
        let transportList =
            transports ?? specification?.transport?.rawValue ?? (specification?.broadcast != nil ? "tcp,ws" : nil)
        for name in (transportList ?? (full ? "tcp,udp,ws,tls,wss" : "tcp,udp,ws")).split(separator: ",") {
            guard let transport = Transport(rawValue: String(name)) else {
                throw fail("unknown transport '\(name)' (tcp, udp, ws, tls, wss)")
            }
            chosenTransports.append(transport)
        }
        let defaultScenarios =
            full
            ? "pingpong-64,native-64,asyncchannel-64,proxy-64,proxypump-64k,pingpong-1k,pingpong-64k,rate-10k,rate-50k,pump-1400,pump-64k,connect,fanin-1,fanin-10,fanin-100,fanin-1000,json,json-deflate,workload-1000x10/s-200B-2s"
            : "pingpong-64,native-64,asyncchannel-64,rate-5000,pump-64k,pump-1400,connect,fanin-16"
        var chosenScenarios: [Scenario] = []
        // --workload and --sweep run alone, unless --scenarios names others to run beside them.
        let scenarioList = scenarios ?? (specification == nil && sweepRates == nil ? defaultScenarios : "")
        for name in scenarioList.split(separator: ",") {
            do throws(ScenarioError) {
                chosenScenarios.append(try Scenario(name: String(name)))
            } catch {
                throw fail(error.message)
            }
        }
        for rate in sweepRates ?? [] where !chosenScenarios.contains(.rate(perSecond: rate)) {
            chosenScenarios.append(.rate(perSecond: rate))
        }
        if let workload = specification?.workload { chosenScenarios.append(.workload(workload)) }
        if let load = specification?.broadcast, !chosenScenarios.contains(.broadcast(load)) {
            chosenScenarios.append(.broadcast(load))
        }
        var threadCounts: [Int]?
        var serverThreadsNote = ""
        if let serverThreads {
            let counts = try serverThreads.split(separator: ",").map { text in
                guard let count = Int(text), count >= 1 else {
                    throw fail("--server-threads: '\(text)' is not a thread count (e.g. 1,2)")
                }
                return count
            }
            guard !counts.isEmpty else { throw fail("--server-threads: expected thread counts, e.g. 1,2") }
            guard server == nil else { throw fail("--server-threads starts its servers here: not with --server") }
            let threaded = chosenScenarios.filter { type(of: $0.kind).takesServerThreads && $0.serverThreads == nil }
            guard !threaded.isEmpty else {
                throw fail("--server-threads applies to fanin and workload scenarios: name one (e.g. fanin-64)")
            }
            threadCounts = Array(Set(counts)).sorted()
            serverThreadsNote =
                "; fan-in and workload servers on \(threadCounts!.map(String.init).joined(separator: ", ")) threads (--server-threads), not pinned"
            chosenScenarios = chosenScenarios.flatMap { scenario in
                threaded.contains(scenario) ? threadCounts!.map { scenario.onServerThreads($0) } : [scenario]
            }
        }
        let (serverCPU, clientCPU): (Int?, Int?) =
            switch placement {
            case .same: (Syscall.cpuCount - 1, Syscall.cpuCount - 1)
            case .cross: (0, min(1, Syscall.cpuCount - 1))
            case .none: (nil, nil)
            }
        let defaults = ConnectionOptions()
        return Plan(
            backends: chosenBackends.map(\.rawValue), transports: chosenTransports.map(\.rawValue),
            scenarios: chosenScenarios, repetitions: repetitions ?? (full ? 5 : 3),
            pingpongCount: count ?? 2_000, pingpongSeconds: count == nil ? (seconds ?? 1) : nil,
            slices: count == nil ? max(1, slices) : 1, remeasure: max(0, remeasure), pingpongWarmup: warmup,
            rateSeconds: full ? 2 : 0.5, pacing: chosenPacing,
            pumpBytes: full ? 1024 << 20 : 256 << 20, pumpSeconds: pumpSeconds ?? (full ? 1 : 0.25),
            udpSinkBuffer: udpSinkBuffer > 0 ? udpSinkBuffer : nil,
            connectCount: full ? 200 : 30, faninCount: full ? 500 : 100,
            p99Bound: specification?.p99Bound ?? UInt64(bound * 1e9), broadcastWorkload: specification?.broadcast,
            p95Bound: specification?.p95Bound, sweep: sweepRates, serverThreads: threadCounts, placement: placement,
            serverCPU: serverCPU, clientCPU: clientCPU,
            options:
                "TCP_NODELAY on; SO_RCVBUF/SO_SNDBUF system defaults\(udpSinkBuffer > 0 ? " (udp pump sinks: SO_RCVBUF \(udpSinkBuffer) B asked\(Syscall.receiveBufferLimit.map { ", net.core.rmem_max \($0) B here" } ?? ""))" : ""); read chunk \(defaults.readChunkSize) B; UDP buffer \(defaults.maxDatagramSize) B; receive queue \(defaults.receiveQueueLimit) B; TLS \(TLSLibrary.version), TLS 1.3, certificate verified against a throwaway CA\(serverThreadsNote)"
        )
    }

    /// Raises this process's descriptor limit (RLIMIT_NOFILE, which the server processes inherit) so that each
    /// can hold `connections` connections (a descriptor each, on every backend) and a thousand descriptors more,
    /// when it is lower; returns what it did, or `nil` when nothing was needed. Past the hard limit only a process
    /// with CAP_SYS_RESOURCE may go; otherwise the error says how to raise it.
    static func raiseDescriptorLimit(toHold connections: Int) throws -> String? {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return nil }
        let wanted = rlim_t(descriptors(for: connections))
        guard limit.rlim_cur < wanted else { return nil }
        let before = limit.rlim_cur
        var raised = limit
        raised.rlim_cur = wanted
        raised.rlim_max = max(limit.rlim_max, wanted)
        guard setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) == 0 else {
            throw fail(
                "\(connections) connections need \(wanted) descriptors in each process, and the limit is \(before) (hard \(limit.rlim_max)); raise it (`ulimit -n \(wanted)`, as root for more than the hard limit) or run fewer connections"
            )
        }
        return
            "descriptor limit raised from \(before) to \(wanted) for \(connections) connections (RLIMIT_NOFILE, inherited by the servers)"
    }

    /// Descriptors a client or server process needs for `connections` (one each, on every backend), with room for
    /// the rest.
    static func descriptors(for connections: Int) -> Int { connections + 1024 }

    /// The servers of one backend x transport: its echo server, and one of each other kind the planned
    /// scenarios run against (``ServerRole``: a sink, the backend's own-style server, a relay, ...).
    struct Target {
        var backend: Backend?
        var transport: Transport
        var echo: any ServerHandle
        /// The other servers, by ``ServerRole/mode``.
        var servers: [String: any ServerHandle]
        var name: String { "\(backend?.rawValue ?? Report.floorName)/\(transport)" }

        /// Stops every server of the target.
        func stop() {
            echo.stop()
            for server in servers.values { server.stop() }
        }
    }
}
