import ConnectionTestKit
import Foundation
import Lessons
import POSIXSupport
import SocketStyles
import Testing

/// A server out of descriptors waits without spinning and serves again (a child `sockbench serve` of every backend,
/// its descriptor limit set low). What a server gives back over a churn of connections is ChurnTests'.
@Suite("Server resources", .serialized, .timeLimit(.minutes(20)))
struct ServerResourceTests {
    @Test(
        "A server out of descriptors stays idle while clients wait, and serves again once they leave",
        arguments: Backend.allCases)
    func descriptorLimit(backend: Backend) async throws {
        try await SocketTest.run(timeLimit: .seconds(120)) {
            // 64 descriptors: fewer than the 80 clients below need on the server's side.
            let server = try ChildProcess(
                [
                    "/bin/sh", "-c",
                    "ulimit -n 64 && exec \"$0\" serve tcp://127.0.0.1:0 --backend \(backend.rawValue) --exit-on-stdin-eof",
                    NetworkLab.selfPath(),
                ], mergeErrors: false)
            defer { NetworkLab.stop(server) }
            let line = try await blocking { server.readLine() }
            try #require(line.hasPrefix("listening on "), "the server said: \(line)")
            let endpoint = try Endpoint(url: String(line.dropFirst(13)))
            var clients: [any Connection] = []
            for _ in 0..<80 { clients.append(try await Backend.bsd.connect(to: endpoint)) }
            // Let the server run into its limit, then count the CPU it burns while the clients wait.
            try await Task.sleep(for: .milliseconds(300))
            let before = try Self.cpuTicks(server.pid)
            try await Task.sleep(for: .seconds(1))
            let burned = try Self.cpuTicks(server.pid) - before
            #expect(burned <= 20, "\(backend): \(burned * 10) ms of CPU in 1 s while out of descriptors")
            for client in clients { await client.close() }
            // Served again: a new client gets its echo (the accept may wait out one back-off).
            let client = try await Backend.bsd.connect(to: endpoint)
            try await client.send([1, 2, 3])
            #expect(try await withTimeLimit(.seconds(10)) { try await client.receive(exactly: 3) } == [1, 2, 3])
            await client.close()
        }
    }

    /// bsd gives each connection a reader thread, so a server can run out of threads before descriptors. Its process
    /// is put in a pids cgroup of its own that allows 40 tasks (threads count), and 80 clients connect: the server
    /// must not stop (pthread_create's EAGAIN once ended the process), the clients it has no thread for are closed,
    /// the log says "thread limit", and once the clients leave a new one is served. Needs root and cgroup v1's pids
    /// controller (the cgroup is removed afterwards, also on failure); without them it says so and checks nothing.
    @Test("A thread-per-connection server out of threads closes what it cannot serve, stays up, and serves again")
    func threadLimit() async throws {
        let group = "/sys/fs/cgroup/pids/socketstyles-test-\(getpid())"
        guard getuid() == 0, mkdir(group, 0o755) == 0 else {
            print("ServerResourceTests.threadLimit: skipped: needs root and a pids cgroup (/sys/fs/cgroup/pids)")
            return
        }
        defer { rmdir(group) }
        try "40".write(toFile: group + "/pids.max", atomically: false, encoding: .utf8)
        try await SocketTest.run(timeLimit: .seconds(120)) {
            let server = try ChildProcess(
                [
                    "/bin/sh", "-c",
                    "echo $$ > \(group)/cgroup.procs && exec \"$0\" serve tcp://127.0.0.1:0 --backend bsd --exit-on-stdin-eof",
                    NetworkLab.selfPath(),
                ])
            var stopped = false
            defer { if !stopped { NetworkLab.stop(server) } }
            let line = try await blocking { server.readLine() }
            try #require(line.hasPrefix("listening on "), "the server said: \(line)")
            let endpoint = try Endpoint(url: String(line.dropFirst(13)))
            var clients: [any Connection] = []
            for _ in 0..<80 { clients.append(try await Backend.bsd.connect(to: endpoint)) }
            // Each client asks for an echo; a served one gets it, one the server had no thread for gets the end
            // of its stream (or a reset) when the server closes it, or nothing before the time limit while it
            // waits in the backlog.
            var served = 0
            for client in clients {
                guard (try? await client.send([1, 2, 3])) != nil else { continue }  // closed by the server already
                if (try? await withTimeLimit(.milliseconds(500)) { try await client.receive(exactly: 3) }) != nil {
                    served += 1
                }
            }
            #expect(served >= 1 && served < 80, "\(served) of 80 clients served with 40 tasks allowed")
            #expect(kill(server.pid, 0) == 0, "the server is gone")
            for client in clients { await client.close() }
            // Served again once the clients have left (their threads end; the accept may wait out a back-off).
            var again = false
            for _ in 0..<20 where !again {
                let client = try await Backend.bsd.connect(to: endpoint)
                try await client.send([4, 5, 6])
                again = (try? await withTimeLimit(.seconds(1)) { try await client.receive(exactly: 3) }) == [4, 5, 6]
                await client.close()
            }
            #expect(again, "no echo after the clients left")
            server.closeInput()  // it exits at the end of its input; its output ends then
            let said = try await blocking { server.readToEnd() }
            NetworkLab.stop(server)
            stopped = true
            #expect(server.status == 0, "the server exited \(server.status): \(said.suffix(2000))")
            #expect(said.contains("thread limit"), "\(said.suffix(2000))")
        }
    }

    /// User plus system CPU of a process, in clock ticks (1/100 s).
    private static func cpuTicks(_ pid: Int32) throws -> Int {
        let stat = try String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)
        // Fields after the command name, which is in parentheses and may hold spaces.
        let fields = stat[stat.index(after: stat.lastIndex(of: ")")!)...].split(separator: " ")
        return Int(fields[11])! + Int(fields[12])!
    }
}
