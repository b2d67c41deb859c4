import BenchmarkDriver
import Foundation
import Histogram
import POSIXSupport
import SocketStyles

/// One run: agents connected, clocks read, loads prepared, one window, results merged.
struct FleetRun {
    let load: FleetShare.Load
    let backend: String
    let url: String
    let window: Double
    let timeout: Double
    let samples: Bool
    /// The server's backend, when an agent started it.
    let serverBackend: String?
    /// Seconds to keep trying an agent that is not reachable yet.
    let waitForAgents: Double

    /// The asker of a broadcast load: `total` requests to the broadcast server on a schedule from `start` (the
    /// first 10 ms after it, while every agent's clients listen), whatever the answers do; the answers' latencies
    /// from each request's intended time, past the warm-up.
    private func ask(
        _ total: Int, warmup: Int, every interval: UInt64, from start: UInt64
    ) async -> (sent: [UInt64: UInt64], answers: [UInt64], error: String?) {
        let asker: any Connection
        do throws(ConnectionError) {
            asker = try await Backend(name: backend).connect(to: try Endpoint(url: url))
        } catch {
            return ([:], [], "the asker could not connect: \(error)")
        }
        let first = start + 10_000_000
        let answers = Task {
            var latencies: [UInt64] = []
            while let bytes = try? await Broadcast.receive(on: asker) {
                guard let header = Broadcast.decode(bytes), header.kind == .answer else { break }
                if header.sequence >= UInt64(warmup) { latencies.append(MonotonicClock.nanoseconds() &- header.sent) }
                if header.sequence == UInt64(total - 1) { break }
            }
            return latencies
        }
        let giveUp = Task {
            guard (try? await Task.sleep(for: .nanoseconds(Int64(UInt64(total) * interval) + 30_000_000_000))) != nil
            else { return }
            await asker.close()
        }
        var sent: [UInt64: UInt64] = [:]
        var failure: String?
        for sequence in 0..<total {
            let intended = first + UInt64(sequence) * interval
            let now = MonotonicClock.nanoseconds()
            if intended > now { try? await Task.sleep(for: .nanoseconds(intended - now)) }
            let request = Broadcast.encode(Broadcast.Header(kind: .request, sequence: UInt64(sequence), sent: intended))
            do throws(ConnectionError) {
                try await Broadcast.send(request, on: asker)
            } catch {
                failure = "the asker's request \(sequence) failed: \(error)"
                break
            }
            if sequence >= warmup { sent[UInt64(sequence)] = intended }
        }
        if failure != nil { await asker.close() }
        let answered = await answers.value
        giveUp.cancel()
        await asker.close()
        return (sent, answered, failure)
    }

    private func usage(of server: (agent: FleetAgent, id: String)?) async -> ResourceUsage? {
        guard let server else { return nil }
        return try? await server.agent.usage(server.id, within: timeout)
    }

    func measure(_ addresses: [String], server: (agent: FleetAgent, id: String)?) async -> FleetReport {
        var rows = addresses.map { FleetReport.AgentRow(agent: $0) }
        // Connect, estimate each clock, prepare each share: every agent at once.
        let prepared = await withTaskGroup(of: (Int, Result<(FleetAgent, Int64, UInt64), FleetError>).self) { group in
            for (index, address) in addresses.enumerated() {
                group.addTask {
                    do {
                        let agent = try await FleetAgent.connect(address, within: timeout, wait: waitForAgents)
                        do {
                            let (offset, roundTrip) = try await agent.clockOffset(within: timeout)
                            // Connections are opened 64 at a time: allow a second per batch as well.
                            let batches = Double(load.connections / 64 + 1)
                            _ = try await agent.request(
                                "load \(load) \(backend) \(url)" + (samples ? " samples" : ""),
                                within: timeout + batches)
                            return (index, .success((agent, offset, roundTrip)))
                        } catch {
                            await agent.close()
                            throw error
                        }
                    } catch let error as FleetError {
                        return (index, .failure(error))
                    } catch {
                        return (index, .failure(FleetError("\(error)")))
                    }
                }
            }
            var results: [(Int, Result<(FleetAgent, Int64, UInt64), FleetError>)] = []
            for await result in group { results.append(result) }
            return results
        }
        var ready: [(index: Int, agent: FleetAgent, offset: Int64, roundTrip: UInt64)] = []
        for (index, result) in prepared {
            switch result {
            case .success(let (agent, offset, roundTrip)):
                rows[index].clockOffsetNanoseconds = offset
                rows[index].clockRoundTripNanoseconds = roundTrip
                rows[index].connections = load.connections
                ready.append((index, agent, offset, roundTrip))
            case .failure(let error): rows[index].error = error.message
            }
        }
        let serverBefore = await usage(of: server)
        // The window opens `lead` from now on this host's clock; each agent is told how long after it reads
        // its order, less the order's way there (half the clock round trip).
        let slowest = ready.map(\.roundTrip).max() ?? 0
        let lead = UInt64(50_000_000) + 4 * slowest
        let opens = MonotonicClock.nanoseconds() + lead
        let windowMs = Int(window * 1000)
        // The server's threads and memory are read halfway through the window, with every connection busy.
        let halfway = Task { () -> ResourceUsage? in
            let at = opens + UInt64(window * 0.5e9)
            let now = MonotonicClock.nanoseconds()
            if at > now { try? await Task.sleep(for: .nanoseconds(at - now)) }
            return await usage(of: server)
        }
        // A broadcast load: this process is the asker, its requests timed on this clock from the window's start.
        var broadcast: (load: BroadcastLoad, warmup: Int, total: Int, interval: UInt64)?
        if case .broadcast(let shape) = load {
            let total = shape.warmup + shape.measured(fallbackSeconds: window)
            broadcast = (shape, shape.warmup, total, UInt64(1e9 / shape.perSecond))
        }
        let orders = broadcast
        let entries = ready
        let agentsDone = Task {
            await withTaskGroup(of: (Int, Result<FleetShare.Outcome, FleetError>).self) { group in
                for entry in entries {
                    group.addTask {
                        let now = MonotonicClock.nanoseconds()
                        let delay = opens > now + entry.roundTrip / 2 ? opens - now - entry.roundTrip / 2 : 0
                        var order = "go \(delay) \(windowMs)"
                        var limit = Double(lead) / 1e9 + window + timeout
                        if let orders {
                            order += " \(orders.total) \(orders.warmup) \(entry.offset)"
                            limit += 20
                        }
                        do {
                            let answer = try await entry.agent.request(order, within: limit)
                            let outcome = try JSONDecoder().decode(FleetShare.Outcome.self, from: Data(answer.utf8))
                            return (entry.index, .success(outcome))
                        } catch let error as FleetError {
                            return (entry.index, .failure(FleetError("died or went silent mid-run: " + error.message)))
                        } catch {
                            return (entry.index, .failure(FleetError("answered what is not a result: \(error)")))
                        }
                    }
                }
                var results: [(Int, Result<FleetShare.Outcome, FleetError>)] = []
                for await result in group { results.append(result) }
                return results
            }
        }
        var asked: (sent: [UInt64: UInt64], answers: [UInt64], error: String?)?
        if let broadcast {
            asked = await ask(broadcast.total, warmup: broadcast.warmup, every: broadcast.interval, from: opens)
        }
        let outcomes = await agentsDone.value
        let serverAfter = await usage(of: server)
        let serverDuring = await halfway.value
        for entry in ready { await entry.agent.close() }

        var merged = LatencySummary.makeHistogram()
        var starts: [Int64] = []
        var (count, lost, agentsMerged) = (0, 0, 0)
        for (index, result) in outcomes {
            switch result {
            case .success(let outcome):
                let histogram = outcome.histogram.histogram
                merged.add(histogram)
                count += outcome.count
                lost += outcome.lost
                agentsMerged += 1
                rows[index].outcome = outcome
                rows[index].latency = outcome.count > 0 ? LatencySummary(histogram) : nil
                rows[index].perSecond = Double(outcome.count) / window
                if let offset = rows[index].clockOffsetNanoseconds {
                    let start = Int64(bitPattern: outcome.start) - offset
                    rows[index].startSkewNanoseconds = start - Int64(bitPattern: opens)
                    starts.append(start)
                }
            case .failure(let error):
                rows[index].error = error.message
            }
        }
        var report = FleetReport(
            load: "\(load)", backend: backend, target: url, windowSeconds: window, agents: rows,
            merged: .init(
                agents: agentsMerged, count: count, lost: lost, perSecond: Double(count) / window,
                latency: count > 0 ? LatencySummary(merged) : nil, histogram: SparseHistogram(merged),
                startSpreadNanoseconds: starts.isEmpty ? nil : UInt64(starts.max()! - starts.min()!)))
        if let asked {
            let reports = outcomes.compactMap { try? $0.1.get().broadcast }
            report.broadcast = BroadcastFigures.merge(reports, sent: asked.sent, answers: asked.answers).figures
            report.askerError = asked.error
        }
        if server != nil, let before = serverBefore, let after = serverAfter {
            let cpu = after.cpuNanoseconds &- before.cpuNanoseconds
            report.server = .init(
                backend: serverBackend ?? "", cpuNanoseconds: cpu,
                cpuPerMessageNanoseconds: count > 0 ? Double(cpu) / Double(count) : nil,
                residentKiB: serverDuring?.residentKiB, threads: serverDuring?.threads ?? 0)
        }
        return report
    }

}
