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

/// One measurement of one scenario on one target, watched: what the client, the server and everything else on
/// the measured CPUs did meanwhile; and which scenarios a target does not run.
extension Compare {
    /// The CPUs a run's processes are pinned to (every CPU with `--placement none`).
    static func watchedCPUs(_ plan: Plan) -> Set<Int>? {
        guard let client = plan.clientCPU else { return nil }
        return Set([client] + (plan.serverCPU.map { [$0] } ?? []))
    }

    /// One measurement with the client's and the server's resource use over its window, and what else used the
    /// measured CPUs meanwhile (``CPUShare``).
    /// `also`: other local processes of the measurement (the upstream a relay forwards to) whose CPU time counts
    /// as the run's own.
    func measureWatched(
        _ scenario: Scenario, _ target: Target, server: any ServerHandle, also: [any ServerHandle], plan: Plan,
        tls: TLSConfiguration, roundTrips: Int
    ) async throws -> ScenarioResult {
        let cpus = Self.watchedCPUs(plan)
        // Usage at the start of the measured window: taken here, and again where the scenario sets up first
        // (a workload's connections are opened before its window starts).
        struct WindowStart: Sendable {
            var cpu: CPUTimes?
            var client: ResourceUsage?
            var server: ResourceUsage?
            var others: [ResourceUsage?]
            var at: UInt64
        }
        let windowStart = Guarded<WindowStart?>(nil)
        let startWindow: () async -> Void = {
            let cpu = CPUTimes.read(cpus: cpus)
            let client = ResourceUsage.read()
            let server = await server.usage()
            var others: [ResourceUsage?] = []
            for other in also { others.append(await other.usage()) }
            windowStart.withLock {
                $0 = WindowStart(
                    cpu: cpu, client: client, server: server, others: others, at: MonotonicClock.nanoseconds())
            }
        }
        await startWindow()
        // Usage at the end of the measured window: taken before the connection closes where the scenario allows
        // (a bsd server's reader thread, and its counts, end with the connection).
        struct WindowEnd: Sendable {
            var client: ResourceUsage?
            var server: ResourceUsage?
            var cpu: CPUTimes?
            var others: UInt64
            var at: UInt64
        }
        let windowEnd = Guarded<WindowEnd?>(nil)
        let endWindow: () async -> Void = {
            let client = ResourceUsage.read()
            let server = await server.usage()
            var others: UInt64 = 0
            let othersBefore = windowStart.withLock { $0?.others } ?? []
            for (other, before) in zip(also, othersBefore) {
                if let after = await other.usage(), let before { others += after.since(before).cpuNanoseconds }
            }
            let cpu = CPUTimes.read(cpus: cpus)
            windowEnd.withLock {
                $0 = WindowEnd(
                    client: client, server: server, cpu: cpu, others: others, at: MonotonicClock.nanoseconds())
            }
        }
        do throws(ConnectionError) {
            var measurement = try await scenario.kind.measure(
                MeasureContext(
                    target: target, server: server, plan: plan, tls: tls, roundTrips: roundTrips,
                    startWindow: startWindow, endWindow: endWindow))
            if windowEnd.withLock({ $0 }) == nil { await endWindow() }
            let end = windowEnd.withLock { $0 }!
            let start = windowStart.withLock { $0 }!
            let (clientBefore, serverBefore, cpuBefore) = (start.client, start.server, start.cpu)
            if let after = end.client, let clientBefore { measurement.client = after.since(clientBefore) }
            if let after = end.server, let serverBefore { measurement.server = after.since(serverBefore) }
            // The measured processes: with a remote server, only the client runs on the watched CPUs.
            let measured =
                (measurement.client?.cpuNanoseconds ?? 0)
                + (agentless(server) ? (measurement.server?.cpuNanoseconds ?? 0) : 0) + end.others
            if let cpuBefore, let cpuAfter = end.cpu {
                measurement.cpuShare = CPUShare(
                    windowNanoseconds: end.at &- start.at, before: cpuBefore, after: cpuAfter,
                    measuredNanoseconds: measured, cpus: cpus?.count ?? Syscall.cpuCount)
            }
            return measurement
        } catch {
            throw fail("\(scenario) \(target.name): \(error)")
        }
    }

    private func agentless(_ server: any ServerHandle) -> Bool { !(server is RemoteServer) }

    /// Why a sweep does not run a rate on a target in this repetition: it saturated at a lower one.
    func saturation(_ scenario: Scenario, _ target: Target, _ saturated: [String: Int]) -> String? {
        guard let rate = scenario.as(RateScenario.self)?.perSecond, let limit = saturated[target.name], rate > limit
        else { return nil }
        return
            "the sweep stopped at rate-\(limit) in a repetition: \(target.name) did not keep up there (answered < 95% of the offered rate, > 1% lost, or p50 over the bound)"
    }

    /// Why a scenario does not apply to a target, or `nil`.
    func skipReason(_ scenario: Scenario, _ target: Target) -> String? {
        var limit = rlimit()
        if let connections = scenario.connections, target.backend != nil,
            getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0,
            limit.rlim_cur < Self.descriptors(for: connections)
        {
            return
                "\(scenario) needs \(Self.descriptors(for: connections)) descriptors per process; the limit is \(limit.rlim_cur)"
        }
        return scenario.skipReason(target, remote: server != nil)
    }

    /// A pump scenario: a warm-up pass of an eighth of ``Plan/pumpBytes`` (its rate also sizes the next pass),
    /// then the measured pass, sized to last ``Plan/pumpSeconds``, so that every row is measured over the same time
    /// (a fixed byte count gave a slower row a longer pass, and a 1,400-byte UDP pass half the time of a tcp one).
    static func pump(
        plan: Plan, size: Int, pass: (Int) async throws(ConnectionError) -> ScenarioResult
    ) async throws(ConnectionError) -> ScenarioResult {
        let warmupBytes = max(size, plan.pumpBytes / 8 / size * size)
        let start = MonotonicClock.nanoseconds()
        let warmup = try await pass(warmupBytes)
        // The pass's own time (udp: its sending; tcp: to the sink's count) when it has one: a udp count request
        // lost in a full receive buffer is asked again 200 ms later, and that wait is not the row's rate.
        let elapsed = warmup.elapsedNanoseconds > 0 ? warmup.elapsedNanoseconds : MonotonicClock.nanoseconds() &- start
        return try await pass(plan.pumpPassBytes(size: size, warmupBytes: warmupBytes, warmupNanoseconds: elapsed))
    }

    static func measurement(_ result: PingRunner.Result, size: Int, count: Int) -> ScenarioResult {
        var measurement = ScenarioResult()
        measurement.latency = result.latency
        measurement.messages = count
        measurement.lost = result.lost
        measurement.elapsedNanoseconds = result.elapsedNanoseconds
        measurement.messagesPerSecond = result.roundTripsPerSecond
        measurement.bytesPerSecond = result.roundTripsPerSecond * Double(size)
        measurement.quietP50 = result.samples.flatMap { QuietP50.of($0) }
        return measurement
    }
}

/// The foreign share of a pass (its windows together), `nil` when it was not disturbed.
func disturbed(_ results: some Collection<ScenarioResult>) -> Double? {
    guard let share = CPUShare.combined(results.compactMap(\.cpuShare)), share.isDisturbed else { return nil }
    return share.foreignShare
}
