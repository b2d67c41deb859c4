import BenchmarkDriver
import ConnectionCore
import Foundation
import POSIXSupport
import SocketStyles
import Synchronization

/// `broadcast-N[-RATE/s][-SECONDSs]`: N clients connected to one server (tcp, ws); one more client, the asker, asks
/// 10 times a second (or RATE) for a broadcast, and the server sends the market-data JSON to every other client, then answers the asker (the
/// request form of the WebSocket shootouts, ``Broadcast``). Per message: from the request's intended send time to
/// the first and the last client's receipt (p50, p95, p99), and the asker's answer; every client's latency; whether
/// every message reached every client once and in order. The clients run in processes of at most 5,000 each
/// (`sockbench broadcast-clients`, async-style connections), pinned to the CPU the server is not on when there is
/// one, so that what is measured is the server; their CPU is shown beside the server's.
struct BroadcastScenario: ScenarioKind {
    static let prefix = "broadcast"
    static let usage = "broadcast-N[-RATE/s][-SECONDSs]"
    static let about =
        "N clients connected; one more asks 10 times a second (or RATE) for a broadcast, the server sends the market-data JSON to all N, then answers: per message the time to the first and the last client's receipt"
    var load: BroadcastLoad
    var clients: Int { load.clients }

    init(_ load: BroadcastLoad) { self.load = load }

    init(argument: String?, name: String) throws(ScenarioError) {
        guard let argument else { throw ScenarioError(message: "'\(name)' needs its clients, e.g. broadcast-5000") }
        load = try BroadcastLoad(name: argument)
    }

    var loadName: String? { "One message to many clients (the last receipt, p95)" }

    var name: String { load.description }
    /// The clients and the asker.
    var connections: Int? { clients + 1 }

    /// Clients per client process.
    static let perProcess = 5_000
    /// The 95th percentile of the last receipt a server must keep to serve N clients (hashrocket's
    /// websocket-shootout measure).
    static let bound = BroadcastVerdict.defaultBound

    /// `sockbench serve --broadcast`, as many connections as the descriptor limit allows.
    static let server = ServerRole(mode: "broadcast") { start in
        guard start.backend != nil, start.transport == .tcp || start.transport == .ws else { return nil }
        return try await start.serve("broadcast", ["--max-connections", "1000000"])
    }

    func skipReason(_ target: Compare.Target, remote: Bool) -> String? {
        guard target.transport == .tcp || target.transport == .ws else { return "broadcast runs over tcp and ws" }
        if remote { return "broadcast's clients run on the server's host (they read its clock)" }
        return target.backend == nil ? Scenario.floorRuns : nil
    }

    func measure(_ context: MeasureContext) async throws(ConnectionError) -> ScenarioResult {
        let plan = context.plan
        // Three times the round-trip scenarios' window, unless the load names its own duration.
        let measured =
            load.seconds != nil || plan.pingpongSeconds != nil
            ? load.measured(fallbackSeconds: (plan.pingpongSeconds ?? 1) * 3) : plan.pingpongCount
        let warmup = load.warmup
        let total = warmup + measured
        let processes = (clients + Self.perProcess - 1) / Self.perProcess
        let clientCPU = plan.serverCPU.map { $0 == 0 ? min(1, Syscall.cpuCount - 1) : 0 }
        var started: [ClientProcess] = []
        defer { for process in started { process.kill() } }
        for index in 0..<processes {
            let share = clients / processes + (index < clients % processes ? 1 : 0)
            do {
                started.append(
                    try ClientProcess(
                        arguments: [
                            "broadcast-clients", "\(context.endpoint)", "--connections", "\(share)", "--messages",
                            "\(total)", "--warmup", "\(warmup)",
                        ] + (clientCPU.map { ["--cpu", "\($0)"] } ?? [])))
            } catch {
                throw ConnectionError(.unsupported, "could not start broadcast-clients: \(error)")
            }
        }
        // Connecting thousands takes seconds; a process that fails says why and ends.
        let all = started
        let setupDeadline = Task {
            // A cancelled sleep throws: the deadline was not reached.
            guard (try? await Task.sleep(for: .seconds(60 + clients / 200))) != nil else { return }
            for process in all { process.kill() }
        }
        for process in started {
            guard let line = await process.nextLine(), line.hasPrefix("ready ") else {
                setupDeadline.cancel()
                throw ConnectionError(
                    .timedOut, "broadcast-clients did not get its connections: \(process.errorText())")
            }
        }
        setupDeadline.cancel()
        let asker = try await context.connect()
        await context.startWindow()
        let interval = UInt64(1e9 / load.perSecond)
        let start = MonotonicClock.nanoseconds() + 10_000_000
        let sentTimes = (0..<total).map { start + UInt64($0) * interval }
        let answers = Task {
            var latencies: [UInt64] = []
            let deadline = MonotonicClock.nanoseconds() + UInt64(total) * interval + 60_000_000_000
            while MonotonicClock.nanoseconds() < deadline {
                let bytes: [UInt8]?
                do throws(ConnectionError) { bytes = try await Broadcast.receive(on: asker) } catch { break }
                guard let bytes, let header = Broadcast.decode(bytes), header.kind == .answer else { break }
                if header.sequence >= UInt64(warmup) {
                    latencies.append(MonotonicClock.nanoseconds() &- header.sent)
                }
                if header.sequence == UInt64(total - 1) { break }
            }
            return latencies
        }
        // The requests go on schedule whatever the answers do: a server that falls behind shows in every latency
        // after, not only in its own (coordinated omission).
        let answerDeadline = Task {
            guard (try? await Task.sleep(for: .nanoseconds(Int64(UInt64(total) * interval) + 60_000_000_000))) != nil
            else { return }
            await asker.close()
        }
        for (sequence, intended) in sentTimes.enumerated() {
            let now = MonotonicClock.nanoseconds()
            if intended > now { try? await Task.sleep(for: .nanoseconds(Int64(intended - now))) }
            let request = Broadcast.encode(
                Broadcast.Header(kind: .request, sequence: UInt64(sequence), sent: intended))
            do throws(ConnectionError) { try await Broadcast.send(request, on: asker) } catch {
                answers.cancel()
                answerDeadline.cancel()
                await asker.close()
                throw error
            }
        }
        let answered = await answers.value
        answerDeadline.cancel()
        await context.endWindow()
        let elapsed = MonotonicClock.nanoseconds() &- start
        await asker.close()
        // Each client process ends once every one of its clients has had the last message; one that has not after
        // 20 s is told to stop and report what it has.
        let reportDeadline = Task {
            guard (try? await Task.sleep(for: .seconds(20))) != nil else { return }
            for process in all { process.send("stop") }
            guard (try? await Task.sleep(for: .seconds(10))) != nil else { return }
            for process in all { process.kill() }
        }
        defer { reportDeadline.cancel() }
        var reports: [BroadcastClientReport] = []
        for process in started {
            guard let line = await process.nextLine() else {
                throw ConnectionError(.closed, "a broadcast-clients process sent no report: \(process.errorText())")
            }
            do {
                reports.append(try JSONDecoder().decode(BroadcastClientReport.self, from: Data(line.utf8)))
            } catch {
                throw ConnectionError(.protocolViolation, "a broadcast-clients report could not be read: \(error)")
            }
        }
        guard answered.count == measured else {
            throw ConnectionError(
                .timedOut, "the asker got \(answered.count) of \(measured) answers from the broadcast server")
        }
        var sent: [UInt64: UInt64] = [:]
        for sequence in warmup..<total { sent[UInt64(sequence)] = sentTimes[sequence] }
        let (figures, latency, fairness) = BroadcastFigures.merge(reports, sent: sent, answers: answered)
        var result = ScenarioResult()
        result.latency = latency
        result.messages = clients * measured
        result.elapsedNanoseconds = elapsed
        result.messagesPerSecond = Double(clients * measured) / (Double(max(1, elapsed)) / 1e9)
        result.lost = figures.missing
        result.broadcast = figures
        result.fairness = fairness
        return result
    }

    /// Judged by the 95th percentile of the last client's receipt.
    var mainFigureName: String { "last receipt p95 us" }
    var judgedByP50: Bool { false }

    func mainFigure(_ measurement: ScenarioResult) -> Double {
        Double(measurement.broadcast?.lastReceipt?.p95 ?? 0)
    }

    func brief(_ m: ScenarioResult) -> String {
        guard let b = m.broadcast else { return "no broadcast figures" }
        return
            "last receipt p50 \(Self.ms(b.lastReceipt?.p50)) p95 \(Self.ms(b.lastReceipt?.p95)) ms, first p50 \(Self.ms(b.firstReceipt?.p50)) ms, missing \(b.missing)"
    }

    static func ms(_ nanoseconds: UInt64?) -> String { nanoseconds.map { fixed(Double($0) / 1e6, 1) } ?? "-" }

    func table(_ report: Report, rows: [ReportRow]) -> (header: [String], cells: [[String]]) {
        let header = [
            "backend", "transport", "clients", "last p50 ms", "last p95 ms", "p95 range", "last p99 ms",
            "within 250 ms",
            "first p50 ms", "first p95 ms", "answer p50 ms", "client p99 median ms", "worst ms", "deliveries/s",
            "missing", "dup/late", "server cpu %", "clients cpu %",
        ]
        let cells = rows.map { row -> [String] in
            let m = row.median
            let b = m.broadcast
            func share(_ nanoseconds: UInt64?) -> String {
                guard let nanoseconds, m.elapsedNanoseconds > 0 else { return "-" }
                return fixed(Double(nanoseconds) / Double(m.elapsedNanoseconds) * 100, 0)
            }
            return [
                row.backend, row.transport, "\(clients)", Self.ms(b?.lastReceipt?.p50), Self.ms(b?.lastReceipt?.p95),
                "\(Self.ms(UInt64(row.spread[0])))-\(Self.ms(UInt64(row.spread[1])))", Self.ms(b?.lastReceipt?.p99),
                b?.lastReceipt.map { $0.p95 <= Self.bound ? "yes" : "no" } ?? "no",
                Self.ms(b?.firstReceipt?.p50), Self.ms(b?.firstReceipt?.p95), Self.ms(b?.answer?.p50),
                Self.ms(m.fairness?.medianP99), Self.ms(m.fairness?.worstP99),
                m.messagesPerSecond.map { fixed($0, 0) } ?? "-", b.map { "\($0.missing)" } ?? "-",
                b.map { "\($0.duplicates + $0.outOfOrder)" } ?? "-", share(m.server?.cpuNanoseconds),
                share(b?.clientCPUNanoseconds),
            ]
        }
        return (header, cells)
    }

    /// The last `broadcast-N` of the plan draws the last receipt's p95 against N, a line per backend.
    func chart(_ page: ReportHTML, rows: [ReportRow]) -> String {
        let planned = page.report.plan.scenarios.compactMap { $0.as(BroadcastScenario.self) }
        guard planned.count > 1, planned.last == self else { return "" }
        return page.perTransport(page.report.rows.filter { $0.scenario.is(BroadcastScenario.self) }) { group in
            var lines: [String: [(Double, Double)]] = [:]
            for row in group {
                guard let n = row.scenario.as(BroadcastScenario.self)?.clients,
                    let p95 = row.median.broadcast?.lastReceipt?.p95
                else { continue }
                lines[row.backend, default: []].append((Double(n), Double(p95) / 1000))
            }
            return page.lineChart(
                lines, x: "clients (N)", y: "last client's receipt, p95 (us, log scale)", logY: true)
        }
    }

    /// Per transport and rate: each backend's largest N whose last receipt kept p95 within 250 ms (and had every
    /// message reach every client), of the N the run measured; then the verdict on the user's broadcast workload.
    static func summary(_ report: Report, _ scenarios: [Self]) -> [String] {
        guard !scenarios.isEmpty else { return [] }
        var lines: [String] = []
        let rates = scenarios.map(\.load.perSecond).reduce(into: [Double]()) { if !$0.contains($1) { $0.append($1) } }
        for transport in report.plan.transports {
            for rate in rates {
                let sized = scenarios.filter { $0.load.perSecond == rate }
                // The workload alone has its verdict below.
                if let asked = report.plan.broadcastWorkload, sized.map(\.load) == [asked] { continue }
                lines += largestWithinBound(report, transport, sized)
            }
        }
        for verdict in report.broadcastVerdicts ?? [] {
            let text = verdict.lines
            lines.append("- Your broadcast, " + text[0])
            lines += text.dropFirst()
        }
        return lines
    }

    private static func largestWithinBound(_ report: Report, _ transport: String, _ scenarios: [Self]) -> [String] {
        let rows = report.rows.filter { row in
            row.transport == transport && Backend(rawValue: row.backend) != nil
                && scenarios.contains { Scenario($0) == row.scenario }
        }
        guard !rows.isEmpty else { return [] }
        var best: [String: (clients: Int, p95: UInt64, within: Int, repetitions: Int)] = [:]
        for row in rows {
            guard let n = row.scenario.as(BroadcastScenario.self)?.clients,
                let b = row.median.broadcast, b.missing == 0, let p95 = b.lastReceipt?.p95, p95 <= bound
            else { continue }
            let each = row.repetitions.map { $0.broadcast?.lastReceipt?.p95 ?? .max }
            if n > best[row.backend]?.clients ?? 0 {
                best[row.backend] = (n, p95, each.filter { $0 <= bound }.count, each.count)
            }
        }
        let backends = Array(Set(rows.map(\.backend)))
        let ordered = backends.sorted {
            (best[$0]?.clients ?? 0, -Int(best[$0]?.p95 ?? 0)) > (best[$1]?.clients ?? 0, -Int(best[$1]?.p95 ?? 0))
        }
        let measured = scenarios.map(\.clients).sorted().map { $0.formatted() }.joined(separator: ", ")
        let rate = scenarios[0].load.perSecond
        let at = rate == BroadcastLoad.defaultPerSecond ? "" : " at \(Workload.number(rate)) messages/s"
        return [
            "- Broadcast over \(transport)\(at), the most clients served with the last one's p95 within 250 ms (of \(measured) measured): "
                + ordered.map { backend in
                    best[backend].map {
                        "\(backend) \($0.clients.formatted()) (p95 \(ms($0.p95)) ms"
                            + ($0.within < $0.repetitions
                                ? ", \($0.within) of \($0.repetitions) repetitions within)" : ")")
                    }
                        ?? "\(backend) none"
                }.joined(separator: ", ") + "."
        ]
    }

    /// Per transport, the verdict on the broadcast workload (`--workload broadcast=N,...`) over the backends' runs.
    static func verdicts(plan: Compare.Plan, runs: [RowKey: [ScenarioResult]]) -> [BroadcastVerdict] {
        guard let load = plan.broadcastWorkload else { return [] }
        return plan.transports.compactMap { transport in
            let each = plan.backends.compactMap { backend in
                runs[RowKey(scenario: .broadcast(load), source: backend, transport: transport)].map {
                    (backend: backend, results: $0)
                }
            }
            guard !each.isEmpty else { return nil }
            return BroadcastVerdict(
                load: load, transport: transport, p95Bound: plan.p95Bound ?? BroadcastVerdict.defaultBound, runs: each)
        }
    }
}

extension Scenario {
    static func broadcast(clients: Int) -> Scenario { Scenario(BroadcastScenario(BroadcastLoad(clients: clients))) }
    static func broadcast(_ load: BroadcastLoad) -> Scenario { Scenario(BroadcastScenario(load)) }
}

/// A `sockbench broadcast-clients` child process: its lines of standard output as they come, its standard error
/// kept for a failure's message.
///
/// `@unchecked Sendable`: the measurement's deadline tasks hold it to `kill()` and `send(_:)` it from another task,
/// and Foundation's `Process` and `Pipe` are not `Sendable` on Linux (their methods used here take their own locks
/// or are single system calls); the one mutable field, the line iterator, is only read by the measuring task.
private final class ClientProcess: @unchecked Sendable {
    private let process = Process()
    private let input = Pipe()
    private let errors = Pipe()
    private let lines: AsyncStream<String>
    // Read by one task at a time (the measurement's), as `AsyncStream`'s iterator must be.
    private var iterator: AsyncStream<String>.Iterator

    init(arguments: [String]) throws {
        process.executableURL = URL(fileURLWithPath: ChildServer.executablePath())
        process.arguments = arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardInput = input
        process.standardError = errors
        let (stream, continuation) = AsyncStream<String>.makeStream()
        lines = stream
        iterator = stream.makeAsyncIterator()
        try process.run()
        let handle = output.fileHandleForReading
        PosixThread.spawn(name: "broadcast-clients-out") {
            var line: [UInt8] = []
            while true {
                let data = handle.availableData
                if data.isEmpty { break }
                for byte in data {
                    if byte == UInt8(ascii: "\n") {
                        continuation.yield(String(decoding: line, as: UTF8.self))
                        line.removeAll(keepingCapacity: true)
                    } else {
                        line.append(byte)
                    }
                }
            }
            if !line.isEmpty { continuation.yield(String(decoding: line, as: UTF8.self)) }
            continuation.finish()
        }
    }

    /// The next line, `nil` once the process ended.
    func nextLine() async -> String? { await iterator.next() }

    func send(_ line: String) { try? input.fileHandleForWriting.write(contentsOf: Data((line + "\n").utf8)) }

    /// What it said on standard error (once it ended), or its exit status.
    func errorText() -> String {
        kill()
        let text = String(decoding: errors.fileHandleForReading.availableData, as: UTF8.self)
            .trimmingCharacters(in: .whitespacesAndNewlines)
        return text.isEmpty ? "it exited with status \(process.terminationStatus)" : text
    }

    /// Ends it (its input closed, then SIGKILL) and waits for it.
    func kill() {
        try? input.fileHandleForWriting.close()
        if process.isRunning { process.terminate() }
        process.waitUntilExit()
    }
}
