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
            var measurement = try await measure(
                scenario, target, server: server, plan: plan, tls: tls, roundTrips: roundTrips,
                startWindow: startWindow, endWindow: endWindow)
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
        guard case .rate(let rate) = scenario, let limit = saturated[target.name], rate > limit else { return nil }
        return
            "the sweep stopped at rate-\(limit) in a repetition: \(target.name) did not keep up there (answered < 95% of the offered rate, > 1% lost, or p50 over the bound)"
    }

    /// Why a scenario does not apply to a target, or `nil`.
    func skipReason(_ scenario: Scenario, _ target: Target) -> String? {
        var limit = rlimit()
        if let connections = scenario.connections, let backend = target.backend,
            getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0,
            limit.rlim_cur < Self.descriptors(for: connections, backend: backend)
        {
            return
                "\(scenario) on \(backend) needs \(Self.descriptors(for: connections, backend: backend)) descriptors per process (\(Backend.bsd.name): a socket and an eventfd per connection); the limit is \(limit.rlim_cur)"
        }
        if scenario.kind == .json, target.transport != .ws && target.transport != .wss {
            return "JSON text messages are WebSocket's (ws, wss)"
        }
        if case .pump(let size) = scenario, target.transport == .udp, size > 65_507 {
            return "a UDP datagram carries at most 65,507 bytes"
        }
        if case .workload(let workload) = scenario, target.transport == .udp, workload.size > 65_507 {
            return "a UDP datagram carries at most 65,507 bytes"
        }
        if scenario.kind == .proxy || scenario.kind == .proxyPump, target.transport != .tcp || server != nil {
            return server != nil
                ? "proxy runs on this host only (not with --server)" : "the native relays are tcp -> tcp"
        }
        guard target.backend != nil else {
            // In native-SIZE and asyncchannel-SIZE passes the C floor's ping-pong (C written in its own style) runs
            // beside the rows, so that their ratios over it pair measurements taken in the same pass.
            if scenario.kind == .native || scenario.kind == .asyncChannel {
                return target.transport == .tcp ? nil : "the C floor's native row is tcp"
            }
            return ([.pingpong, .rate, .pump, .proxy, .proxyPump] as [Scenario.Kind]).contains(scenario.kind)
                ? nil
                : "the C floor runs pingpong, native, rate, pump, proxy and proxypump (the direct paths) only; its open-loop client drives one connection"
        }
        if scenario.kind == .native, target.native == nil {
            return
                "native styles: every backend over tcp; \(Backend.nio.name) also over ws (NIOWebSocket), tls and wss (swift-nio-ssl)"
        }
        if scenario.kind == .asyncChannel, target.asyncChannel == nil {
            return "NIOAsyncChannel is SwiftNIO's async/await bridge: \(Backend.nio.name) over tcp only"
        }
        return nil
    }

    func measure(
        _ scenario: Scenario, _ target: Target, server: any ServerHandle, plan: Plan, tls: TLSConfiguration,
        roundTrips: Int, startWindow: () async -> Void, endWindow: () async -> Void
    ) async throws(ConnectionError) -> ScenarioResult {
        let endpoint = server.endpoint
        guard let backend = target.backend else {
            switch scenario {
            case .pingpong(let size), .proxy(let size), .native(let size), .asyncChannel(let size):
                let result = try await runFloorPing(
                    endpoint: endpoint, size: size, count: roundTrips, warmup: plan.pingpongWarmup)
                return Self.measurement(result, size: size, count: roundTrips)
            case .pump(let size), .proxyPump(let size):
                return try await Self.pump(plan: plan, size: size) { bytes throws(ConnectionError) in
                    try await runFloorPump(endpoint: endpoint, size: size, totalBytes: bytes)
                }
            case .rate(let perSecond):
                return try await runFloorRate(
                    endpoint: endpoint, perSecond: perSecond, duration: .milliseconds(Int(plan.rateSeconds * 1000)),
                    warmup: .milliseconds(250), pacing: plan.pacing ?? .sleep)
            default:
                throw ConnectionError(.unsupported, "the C floor runs pingpong, native, rate, pump and proxy only")
            }
        }
        let connect: @Sendable () async throws(ConnectionError) -> any Connection = {
            try await backend.connect(to: endpoint, tls: tls)
        }
        switch scenario {
        case .pingpong(let size):
            let connection = try await connect()
            defer { Task { await connection.close() } }
            var runner = PingRunner(size: size, count: roundTrips, warmup: plan.pingpongWarmup)
            runner.keepsSamples = true  // in order, for the quiet p50
            let result = try await runner.run(on: connection)
            await endWindow()
            await connection.close()
            return Self.measurement(result, size: size, count: roundTrips)
        case .proxy(let size):
            // The C client, through the backend's relay, to the C echo server.
            let result = try await runFloorPing(
                endpoint: endpoint, size: size, count: roundTrips, warmup: plan.pingpongWarmup)
            return Self.measurement(result, size: size, count: roundTrips)
        case .proxyPump(let size):
            // The C pump, through the backend's relay, to the C sink.
            return try await Self.pump(plan: plan, size: size) { bytes throws(ConnectionError) in
                try await runFloorPump(endpoint: endpoint, size: size, totalBytes: bytes)
            }
        case .native(let size):
            let result = try await backend.nativePingPong(
                to: endpoint, size: size, count: roundTrips, warmup: plan.pingpongWarmup, tls: tls)
            return Self.measurement(result, size: size, count: roundTrips)
        case .asyncChannel(let size):
            let result = try await backend.asyncChannelPingPong(
                to: endpoint, size: size, count: roundTrips, warmup: plan.pingpongWarmup)
            return Self.measurement(result, size: size, count: roundTrips)
        case .rate(let perSecond):
            let connection = try await connect()
            let runner = RateRunner(
                perSecond: perSecond, duration: .milliseconds(Int(plan.rateSeconds * 1000)),
                pacing: plan.pacing ?? .sleep)
            do throws(ConnectionError) {
                let result = try await runner.run(on: connection)
                await connection.close()
                return result
            } catch {
                await connection.close()
                throw error
            }
        case .pump(let size):
            // Each pass on its own connection.
            return try await Self.pump(plan: plan, size: size) { bytes throws(ConnectionError) in
                let connection = try await connect()
                do throws(ConnectionError) {
                    let result = try await PumpRunner(size: size, totalBytes: bytes).run(on: connection)
                    await connection.close()
                    return result
                } catch {
                    await connection.close()
                    throw error
                }
            }
        case .connect:
            return try await ConnectRunner(count: plan.connectCount).run(connect: connect)
        case .workload(let workload):
            return try await WorkloadRunner(workload, pacing: plan.pacing ?? .sleep).run(
                serverUsage: { await server.usage() }, startWindow: startWindow, endWindow: endWindow, connect: connect)
        case .fanin(let connections):
            let count = plan.faninRoundTrips(connections: connections)
            return try await FaninRunner(connections: connections, count: count, warmup: min(20, count)).run(
                serverUsage: { await server.usage() }, connect: connect)
        case .json(let deflate):
            let connection = try await backend.connectWebSocket(
                to: endpoint, webSocket: .with { $0.deflate = deflate ? WebSocketDeflateOptions() : nil }, tls: tls)
            if deflate && connection.deflate == nil {
                await connection.close()
                throw ConnectionError(.unsupported, "the server did not agree to permessage-deflate")
            }
            var runner = PingRunner(count: roundTrips, warmup: plan.pingpongWarmup)
            runner.keepsSamples = true
            runner.messageMaker = { .text(MarketData.book($0)) }
            let before = connection.sent
            do throws(ConnectionError) {
                let result = try await runner.run(on: connection)
                await endWindow()
                let sent = connection.sent
                await connection.close()
                let messages = Double(max(1, sent.messages - before.messages))
                var measurement = Self.measurement(result, size: 0, count: roundTrips)
                measurement.messageBytes = Double(sent.messageBytes - before.messageBytes) / messages
                measurement.wireBytes = Double(sent.payloadBytes - before.payloadBytes) / messages
                measurement.bytesPerSecond = result.roundTripsPerSecond * (measurement.messageBytes ?? 0)
                return measurement
            } catch {
                await connection.close()
                throw error
            }
        }
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
