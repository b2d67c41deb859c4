import BenchmarkDriver
import ConnectionCore
import Foundation
import Glibc
import POSIXSupport
import SocketStyles
import Synchronization

extension Lesson {
    /// Ten thousand idle connections: what a thread per connection costs a server, against a loop.
    static let c10k = Lesson(
        name: "c10k",
        summary:
            "10,000 idle TCP connections to a bsd server (a thread each) and to a loop backend's: the server's threads, memory and context switches, and one active connection's round trip among them"
    ) { backend, print in
        let out = LessonOutput("c10k", print)
        let loop = backend.rawValue == "bsd" ? try Backend(name: "async") : backend
        let count = C10K.connections
        out.say("A server in a process of its own (sockbench serve, an echo), first with the bsd backend (a thread per")
        out.say("connection, blocked in its read), then with \(loop) (one loop for them all). One connection does")
        out.say(
            "2,000 round trips of 64 bytes; then \(grouped(count)) more connections open and stay idle, and the same")
        out.say("connection does 2,000 round trips again among them. The server's threads and memory are read from")
        out.say("/proc every 50 ms; its context switches (every thread's) before and after each part.")
        out.say("The client side is the async backend in this process, the same for both.")
        out.say()
        var results: [C10K.Result] = []
        for server in [try Backend(name: "bsd"), loop] {
            let result = try await C10K.measure(server, count: count, out)
            results.append(result)
        }
        out.say()
        C10K.explain(results, out)
        return out.report
    }
}

/// The c10k lesson's measures.
enum C10K {
    /// Idle connections opened.
    static let connections = 10_000

    struct Result {
        let server: String
        let phase: Int
        var threads: (alone: Int, among: Int) = (0, 0)
        var rss: (alone: Double, among: Double) = (0, 0)
        var p50: (alone: Double, among: Double) = (0, 0)
        var p99: (alone: Double, among: Double) = (0, 0)
        /// Context switches of all the server's threads per round trip, alone and among the idle connections.
        var switchesPerRoundTrip: (alone: Double, among: Double) = (0, 0)
        /// The server's context switches a second while every connection was idle.
        var idleSwitchesPerSecond = 0.0
        var openSeconds = 0.0
        var count = 0
        var bytesPerConnection: Double { count > 0 ? (rss.among - rss.alone) / Double(count) : 0 }
    }

    /// The server process as /proc shows it.
    struct Process {
        let pid: Int32

        func status() -> (threads: Int, rssBytes: Double) {
            guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return (0, 0) }
            var threads = 0
            var rss = 0.0
            for line in text.split(separator: "\n") {
                let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
                if fields.first == "Threads:", fields.count > 1 { threads = Int(fields[1]) ?? 0 }
                if fields.first == "VmRSS:", fields.count > 1 { rss = (Double(fields[1]) ?? 0) * 1024 }
            }
            return (threads, rss)
        }

        /// Context switches, voluntary and not, summed over every thread.
        func contextSwitches() -> Int {
            guard let tasks = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task") else {
                return 0
            }
            var total = 0
            for task in tasks {
                guard let text = try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/status", encoding: .utf8)
                else { continue }
                for line in text.split(separator: "\n") {
                    if line.hasPrefix("voluntary_ctxt_switches:") || line.hasPrefix("nonvoluntary_ctxt_switches:") {
                        total += Int(line.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) ?? 0
                    }
                }
            }
            return total
        }
    }

    /// Round trips of 64 bytes on `connection`: each one's time (microseconds) at its start (microseconds on the
    /// lesson's clock).
    static func roundTrips(
        _ connection: any Connection, count: Int, clock: @Sendable () -> Double
    ) async throws -> [LessonChart.Point] {
        let payload = [UInt8](repeating: 9, count: 64)
        var points: [LessonChart.Point] = []
        for index in 0..<(count + 200) {
            let start = clock()
            let began = MonotonicClock.nanoseconds()
            try await connection.send(payload)
            _ = try await connection.receive(exactly: 64)
            let took = Double(MonotonicClock.nanoseconds() - began) / 1000
            if index >= 200 { points.append(.init(at: start, value: took)) }
        }
        return points
    }

    static func measure(_ server: Backend, count: Int, _ out: LessonOutput) async throws -> Result {
        let child = try ChildProcess(
            [
                NetworkLab.selfPath(), "serve", "tcp://127.0.0.1:0", "--backend", server.rawValue,
                "--exit-on-stdin-eof", "--quiet",
            ], mergeErrors: false)
        defer { NetworkLab.stop(child) }
        let endpoint = try Endpoint(url: String(child.readLine().dropFirst("listening on ".count)))
        let process = Process(pid: child.pid)
        let phase = out.trace.phase("\(server) server, \(grouped(count)) idle connections", .tcp)
        var result = Result(server: server.rawValue, phase: phase)
        result.count = count
        let clock: @Sendable () -> Double = { [trace = out.trace] in trace.now() }

        // The server's threads and memory every 50 ms, on a thread of its own.
        let samples = Guarded<[(at: Double, threads: Int, rss: Double)]>([])
        let stop = Atomic<Bool>(false)
        let done = Latch()
        if PosixThread.trySpawn(
            name: "c10k-watch", stackSize: 128 * 1024,
            {
                while !stop.load(ordering: .relaxed) {
                    let (threads, rss) = process.status()
                    samples.withLock { $0.append((clock(), threads, rss)) }
                    usleep(50_000)
                }
                done.open()
            }) != nil
        {
            done.open()
        }
        defer {
            stop.store(true, ordering: .relaxed)
            done.wait()
        }

        let client = try Backend(name: "async")
        let active = try await client.connect(to: endpoint)
        defer { Task { await active.close() } }
        var marks: [LessonChart.Mark] = []
        // Context switches read between the parts only: reading 10,000 threads' files must not run beside the
        // timed round trips.
        var counted: [(at: Double, count: Int)] = []
        func countSwitches() -> Int {
            let count = process.contextSwitches()
            counted.append((clock(), count))
            return count
        }
        func measured(_ label: String) async throws -> (points: [LessonChart.Point], switches: Double) {
            let before = countSwitches()
            marks.append(.init(at: clock(), text: label))
            let points = try await roundTrips(active, count: 2000, clock: clock)
            return (points, Double(countSwitches() - before) / Double(points.count + 200))
        }
        let alone = try await measured("2,000 round trips alone")
        let before = process.status()

        marks.append(.init(at: clock(), text: "\(grouped(count)) connections open"))
        let opening = MonotonicClock.nanoseconds()
        let idle = try await ConnectionBatch.open(count) { () throws(ConnectionError) in
            try await client.connect(to: endpoint)
        } prepare: { connection throws(ConnectionError) in
            // One round trip each: the server has accepted it and serves it.
            try await connection.send([1])
            _ = try await connection.receive(exactly: 1)
        }
        result.openSeconds = Double(MonotonicClock.nanoseconds() - opening) / 1e9
        let quietFrom = countSwitches()
        try await Task.sleep(for: .seconds(1))
        result.idleSwitchesPerSecond = Double(countSwitches() - quietFrom)
        let full = process.status()
        let among = try await measured("2,000 round trips among them")
        for connection in idle { await connection.close() }
        await active.close()

        result.threads = (before.threads, full.threads)
        result.rss = (before.rssBytes, full.rssBytes)
        let aloneTimes = alone.points.map(\.value).sorted()
        let amongTimes = among.points.map(\.value).sorted()
        result.p50 = (aloneTimes[aloneTimes.count / 2], amongTimes[amongTimes.count / 2])
        result.p99 = (aloneTimes[aloneTimes.count * 99 / 100], amongTimes[amongTimes.count * 99 / 100])
        result.switchesPerRoundTrip = (alone.switches, among.switches)
        record(result, out)

        let watched = samples.withLock { $0 }
        // Each part's rate, held over the part.
        var rates = zip(counted, counted.dropFirst()).map { previous, next in
            LessonChart.Point(
                at: previous.at, value: Double(next.count - previous.count) / max(1e-3, (next.at - previous.at) / 1e6))
        }
        if let last = rates.last, let end = counted.last { rates.append(.init(at: end.at, value: last.value)) }
        let start = watched.first?.at ?? 0
        let end = max(clock(), start + 1)
        out.chart(
            LessonChart(
                phase: phase, start: start, end: end,
                panels: [
                    .init(
                        label: "server threads", unit: .segments, maximum: nil,
                        lines: [
                            .init(
                                name: "threads", style: 0, steps: true,
                                points: watched.map { .init(at: $0.at, value: Double($0.threads)) })
                        ]),
                    .init(
                        label: "server memory (resident)", unit: .bytes, maximum: nil,
                        lines: [
                            .init(
                                name: "resident memory", style: 1, steps: true,
                                points: watched.map { .init(at: $0.at, value: $0.rss) })
                        ]),
                    .init(
                        label: "context switches a second, all threads", unit: .segments, maximum: nil,
                        lines: [.init(name: "context switches a second", style: 2, steps: true, points: rates)]),
                    .init(
                        label: "the active connection's round trips (top: 2x p99)",
                        unit: .microseconds, maximum: 2 * max(result.p99.alone, result.p99.among),
                        lines: [
                            .init(name: "round trip alone", style: 4, steps: false, points: alone.points),
                            .init(
                                name: "round trip among the idle connections", style: 3, steps: false,
                                points: among.points),
                        ]),
                ], marks: marks))
        return result
    }

    static func record(_ result: Result, _ out: LessonOutput) {
        let name = result.server
        out.figure("\(name).threadsAlone", Double(result.threads.alone))
        out.figure("\(name).threadsAmong", Double(result.threads.among))
        out.figure("\(name).bytesPerConnection", result.bytesPerConnection)
        out.figure("\(name).p50usAlone", result.p50.alone)
        out.figure("\(name).p50usAmong", result.p50.among)
        out.figure("\(name).p99usAlone", result.p99.alone)
        out.figure("\(name).p99usAmong", result.p99.among)
        out.figure("\(name).switchesPerRoundTripAlone", result.switchesPerRoundTrip.alone)
        out.figure("\(name).switchesPerRoundTripAmong", result.switchesPerRoundTrip.among)
        out.figure("\(name).idleSwitchesPerSecond", result.idleSwitchesPerSecond)
        out.figure("\(name).openSeconds", result.openSeconds)
        out.say(
            "\(name): threads \(grouped(result.threads.alone)) with one connection, \(grouped(result.threads.among)) with \(grouped(result.count + 1)); resident memory \(LessonPage.bytes(result.rss.alone)) -> \(LessonPage.bytes(result.rss.among)) (\(grouped(Int(result.bytesPerConnection))) B a connection); opened in \(fixed(result.openSeconds, 1)) s; idle, \(Int(result.idleSwitchesPerSecond)) context switches in a second."
        )
        out.say(
            "     round trip p50 \(fixed(result.p50.alone, 0)) us alone, \(fixed(result.p50.among, 0)) us among them; p99 \(fixed(result.p99.alone, 0)) -> \(fixed(result.p99.among, 0)) us; context switches a round trip \(fixed(result.switchesPerRoundTrip.alone, 1)) -> \(fixed(result.switchesPerRoundTrip.among, 1))."
        )
    }

    static func explain(_ results: [Result], _ out: LessonOutput) {
        guard results.count == 2 else { return }
        let (threaded, loop) = (results[0], results[1])
        out.say("Why: a blocking server needs a thread for every connection, because each thread can wait on one")
        out.say("socket only; every thread has a stack and kernel state, whether its connection talks or not. A loop")
        out.say("asks the kernel (epoll, io_uring) which of all its sockets are ready and serves those, so an idle")
        out.say("connection costs its socket and a few bookkeeping bytes. Idle connections cost neither CPU: a thread")
        out.say("blocked in read() is not scheduled, and a socket with nothing to read is not reported.")
        let grew = threaded.threads.among - threaded.threads.alone
        if grew >= threaded.count * 9 / 10 {
            out.say(
                "Here the bsd server grew by \(grouped(grew)) threads for \(grouped(threaded.count)) connections, and \(loop.server)'s by \(loop.threads.among - loop.threads.alone): the threads graphs.",
                pointingAt: threaded.phase)
        } else {
            out.say(
                "Here the bsd server grew by only \(grouped(grew)) threads for \(grouped(threaded.count)) connections: fewer than one a connection."
            )
        }
        if threaded.bytesPerConnection > loop.bytesPerConnection {
            out.say(
                "Here a connection cost the bsd server \(grouped(Int(threaded.bytesPerConnection))) bytes of resident memory and \(loop.server)'s \(grouped(Int(loop.bytesPerConnection))) (\(fixed(threaded.bytesPerConnection / max(1, loop.bytesPerConnection), 1))x): the memory graphs.",
                pointingAt: threaded.phase)
        } else {
            out.say(
                "Here a connection cost the bsd server no more resident memory than \(loop.server)'s (\(grouped(Int(threaded.bytesPerConnection))) against \(grouped(Int(loop.bytesPerConnection))) bytes)."
            )
        }
        let quiet = results.allSatisfy { $0.idleSwitchesPerSecond < Double($0.count) / 10 }
        out.say(
            quiet
                ? "Here the idle connections cost no work: \(Int(threaded.idleSwitchesPerSecond)) and \(Int(loop.idleSwitchesPerSecond)) context switches in an idle second for \(grouped(threaded.count)) connections."
                : "Here the idle servers still switched context \(Int(threaded.idleSwitchesPerSecond)) and \(Int(loop.idleSwitchesPerSecond)) times in an idle second: something woke them."
        )
        out.say(
            "Here the active connection's p50 went from \(fixed(threaded.p50.alone, 0)) to \(fixed(threaded.p50.among, 0)) us on bsd and from \(fixed(loop.p50.alone, 0)) to \(fixed(loop.p50.among, 0)) us on \(loop.server) with \(grouped(threaded.count)) idle connections beside it: the round-trip graphs, left of the second mark and right of it.",
            pointingAt: loop.phase)
    }
}
