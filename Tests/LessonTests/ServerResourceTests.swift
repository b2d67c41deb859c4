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

    /// User plus system CPU of a process, in clock ticks (1/100 s).
    private static func cpuTicks(_ pid: Int32) throws -> Int {
        let stat = try String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)
        // Fields after the command name, which is in parentheses and may hold spaces.
        let fields = stat[stat.index(after: stat.lastIndex(of: ")")!)...].split(separator: " ")
        return Int(fields[11])! + Int(fields[12])!
    }
}
