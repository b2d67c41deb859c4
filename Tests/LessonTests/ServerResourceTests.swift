import ConnectionTestKit
import Foundation
import Lessons
import POSIXSupport
import SocketStyles
import Testing

/// A server must give back what each client took: thousands of connect, echo, close cycles against a
/// `sockbench serve` child process (so that nothing else in the test process blurs its memory), every backend x
/// transport, and its resident memory and descriptors must come back to where they were after a warm-up.
///
/// The bound is loose for allocator noise and tight for a leak: the libuv backend once kept every connection's
/// handle and 64 KiB read buffer (a retain cycle through its read callback), ~10.9 KB per connection in RSS.
@Suite("Server resources come back", .serialized, .timeLimit(.minutes(20)))
struct ServerResourceTests {
    static let transports: [Transport] = [.tcp, .udp, .ws, .tls, .wss]

    @Test("Connect/close cycles leave the server's memory and descriptors where they were", arguments: Backend.allCases)
    func cycles(backend: Backend) async throws {
        for transport in Self.transports where backend.transports.contains(transport) {
            try await cycle(backend, transport)
        }
    }

    private func cycle(_ backend: Backend, _ transport: Transport) async throws {
        let secure = transport.isSecure
        // Everything that opens descriptors (openssl making the certificates too) runs inside SocketTest.run,
        // where socket tests take turns: outside it, another test's descriptor count would see them.
        try await SocketTest.run(timeLimit: .seconds(300)) {
            let certificates = secure ? try TestCertificates.make() : nil
            defer { certificates?.remove() }
            var arguments = [
                NetworkLab.selfPath(), "serve", "\(transport)://127.0.0.1:0", "--backend", backend.rawValue,
                "--exit-on-stdin-eof", "--max-udp-peers", "64",
            ]
            if let certificates {
                arguments += ["--cert", certificates.server.certificate, "--key", certificates.server.key]
            }
            let server = try ChildProcess(arguments, mergeErrors: false)
            defer { NetworkLab.stop(server) }
            let line = try await blocking { server.readLine() }
            try #require(line.hasPrefix("listening on "), "the server said: \(line)")
            let endpoint = try Endpoint(url: String(line.dropFirst(13)))
            let tls = certificates?.client ?? TLSConfiguration()
            let cycles = secure ? 100 : 500
            try await run(cycles / 5, against: endpoint, tls: tls)
            let before = try await settled(server.pid)
            try await run(cycles, against: endpoint, tls: tls)
            let after = try await settled(server.pid, descriptorsAtMost: before.descriptors)
            let grown = after.residentKiB - before.residentKiB
            let allowedKiB = (1024 + cycles / 4) * SocketTest.residentMemoryAllowance
            #expect(
                after.descriptors <= before.descriptors,
                "\(backend) x \(transport): \(after.descriptors - before.descriptors) descriptor(s) not given back after \(after.waited) ms; before: \(before.kinds), after: \(after.kinds)"
            )
            #expect(
                grown <= allowedKiB,
                "\(backend) x \(transport): resident memory grew \(grown) KiB over \(cycles) connections (\(grown * 1024 / cycles) bytes each; at most \(allowedKiB) KiB allowed)"
            )
        }
    }

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

    /// `count` clients one after another: connect, one 64-byte echo, close.
    private func run(_ count: Int, against endpoint: Endpoint, tls: TLSConfiguration) async throws {
        let payload = [UInt8](repeating: 0x61, count: 64)
        for _ in 0..<count {
            let client = try await Backend.bsd.connect(to: endpoint, tls: tls)
            do {
                if endpoint.transport == .udp {
                    try await udpEcho(client, payload)
                } else if endpoint.transport.isByteStream {
                    try await client.send(payload)
                    #expect(try await client.receive(exactly: payload.count) == payload)
                } else {
                    try await client.send(payload)
                    #expect(try await client.receive()?.bytes == payload)
                }
            } catch {
                await client.close()
                throw error
            }
            await client.close()
        }
    }

    /// One UDP echo, re-sent if the datagram or its echo is lost.
    private func udpEcho(_ client: any Connection, _ payload: [UInt8]) async throws {
        for _ in 0..<10 {
            try await client.send(payload)
            let reply: [UInt8]?? = try? await withTimeLimit(.milliseconds(500)) { try await client.receive()?.bytes }
            if let reply, reply == payload { return }
        }
        throw SocketTest.Failure(description: "no UDP echo after 10 attempts")
    }

    private struct Usage {
        var residentKiB: Int
        var descriptors: Int
        /// What the descriptors are, by kind (socket, eventfd, pipe...), for a failure message.
        var kinds: [String: Int]
        var waited = 0
    }

    /// The server's usage once its last client is gone: polls (for at most 10 s, as a loaded machine can be slow to
    /// run the server's last close) until its descriptors are back to `descriptorsAtMost`.
    private func settled(_ pid: Int32, descriptorsAtMost limit: Int = .max) async throws -> Usage {
        var usage = try Self.usage(pid)
        var waited = 0
        while usage.descriptors > limit && waited < 10_000 {
            try await Task.sleep(for: .milliseconds(20))
            waited += 20
            usage = try Self.usage(pid)
        }
        usage.waited = waited
        return usage
    }

    private static func usage(_ pid: Int32) throws -> Usage {
        let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
        let rss = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") }
            .flatMap { Int($0.split(separator: " ", omittingEmptySubsequences: true)[1]) }
        let names = try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")
        var kinds: [String: Int] = [:]
        for name in names {
            let target = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\(name)")) ?? "?"
            // "socket:[123]" -> "socket", "anon_inode:[eventfd]" -> "anon_inode:[eventfd]", paths as they are.
            let kind = target.hasPrefix("socket:") ? "socket" : target.hasPrefix("pipe:") ? "pipe" : target
            kinds[kind, default: 0] += 1
        }
        return Usage(residentKiB: rss ?? 0, descriptors: names.count, kinds: kinds)
    }
}
