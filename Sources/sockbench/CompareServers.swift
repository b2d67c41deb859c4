import ArgumentParser
import BenchmarkDriver
import ConnectionTestKit
import Foundation
import SocketStyles

/// A server `compare` measures against: a child process here, or one an agent runs on another host.
protocol ServerHandle: AnyObject {
    /// Where clients connect.
    var endpoint: Endpoint { get }
    /// The server process's CPU time, context switches and memory so far.
    func usage() async -> ResourceUsage?
    /// Stops it (an agent's servers stop when its control connection ends).
    func stop()
}

/// A server an agent started on another host.
final class RemoteServer: ServerHandle {
    let endpoint: Endpoint
    let id: String
    let agent: AgentClient

    init(endpoint: Endpoint, id: String, agent: AgentClient) {
        self.endpoint = endpoint
        self.id = id
        self.agent = agent
    }

    func usage() async -> ResourceUsage? {
        guard let json = try? await agent.request("usage \(id)") else { return nil }
        return try? JSONDecoder().decode(ResourceUsage.self, from: Data(json.utf8))
    }

    func stop() {}
}

extension AgentClient {
    /// Asks the agent for a server; its address is taken with the agent's host (the agent may listen on a
    /// wildcard address).
    nonisolated func start(_ backend: Backend?, _ transport: Transport, _ mode: String) async throws -> any ServerHandle
    {
        let answer = try await request("start \(backend?.rawValue ?? Report.floorName) \(transport) \(mode)")
        let words = answer.split(separator: " ").map(String.init)
        guard words.count == 2, var endpoint = try? Endpoint(url: words[1]) else {
            throw fail("the agent answered '\(answer)'")
        }
        endpoint.host = host
        return RemoteServer(endpoint: endpoint, id: words[0], agent: self)
    }

    /// The agent's throwaway CA, written to a temporary file (the caller deletes it).
    func fetchCA() async throws -> String {
        guard let pem = Data(base64Encoded: try await request("ca \(host.literal)")) else {
            throw fail("the agent sent no CA")
        }
        let path = NSTemporaryDirectory() + "/sockbench-agent-ca-\(getpid()).pem"
        try pem.write(to: URL(fileURLWithPath: path))
        return path
    }
}

extension Optional {
    func asyncMap<T>(_ transform: (Wrapped) async throws -> T) async rethrows -> T? {
        guard let value = self else { return nil }
        return try await transform(value)
    }
}

/// A `sockbench serve` child process. It stops when we close its standard input (or on SIGTERM), so it cannot
/// outlive this process.
final class ChildServer: ServerHandle {
    let process: Process
    let stdin: Pipe
    let endpoint: Endpoint

    private init(process: Process, stdin: Pipe, endpoint: Endpoint) {
        self.process = process
        self.stdin = stdin
        self.endpoint = endpoint
    }

    var pid: Int32 { process.processIdentifier }

    func usage() async -> ResourceUsage? { ResourceUsage.read(pid: pid) }

    static func start(backend: Backend?, url: String, cpu: Int?, extraArguments: [String] = []) throws -> ChildServer {
        try start(
            command: backend.map { ["serve", url, "--backend", $0.rawValue] } ?? ["floor-serve", url], cpu: cpu,
            extraArguments: extraArguments, label: "the \(backend?.rawValue ?? "C floor") server for \(url)")
    }

    /// Starts `sockbench COMMAND...` that prints `listening on URL` first and stops at the end of its input.
    static func start(
        command: [String], cpu: Int?, extraArguments: [String] = [], label: String
    ) throws -> ChildServer {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executablePath())
        process.arguments =
            command + ["--exit-on-stdin-eof", "--quiet"] + (cpu.map { ["--cpu", "\($0)"] } ?? []) + extraArguments
        let input = Pipe()
        let output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        try process.run()
        // The first line is "listening on URL".
        var line: [UInt8] = []
        while true {
            let byte = output.fileHandleForReading.readData(ofLength: 1)
            if byte.isEmpty || byte.first == UInt8(ascii: "\n") { break }
            line.append(byte.first!)
        }
        let text = String(decoding: line, as: UTF8.self)
        guard text.hasPrefix("listening on "),
            let endpoint = try? Endpoint(url: String(text.dropFirst("listening on ".count)))
        else {
            process.terminate()
            throw fail("\(label) did not start (it said: '\(text)')")
        }
        return ChildServer(process: process, stdin: input, endpoint: endpoint)
    }

    func stop() {
        try? stdin.fileHandleForWriting.close()
        process.waitUntilExit()
    }

    static func executablePath() -> String {
        var buffer = [CChar](repeating: 0, count: 4096)
        let count = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        guard count > 0 else { return CommandLine.arguments[0] }
        return String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

extension Compare {
    /// Starts one server: a child process here, or one the agent starts there.
    static func startServer(
        _ backend: Backend?, _ transport: Transport, _ mode: String, extraArguments: [String] = [],
        agent: AgentClient?, certificates: TestCertificates?, plan: Plan, pinned: Bool = true
    ) async throws -> any ServerHandle {
        // A udp sink's receive buffer (--udp-sink-buffer): the agent's mode `sink:BYTES`, a local server's flag.
        let sinkBuffer = mode == "sink" && transport == .udp ? plan.udpSinkBuffer : nil
        if let agent { return try await agent.start(backend, transport, mode + (sinkBuffer.map { ":\($0)" } ?? "")) }
        var arguments =
            transport.isSecure ? ["--cert", certificates!.server.certificate, "--key", certificates!.server.key] : []
        if mode != "echo" { arguments.append("--\(mode)") }
        if let sinkBuffer { arguments += ["--socket-buffer", "\(sinkBuffer)"] }
        arguments += extraArguments
        // WebSocket echo servers accept permessage-deflate; only the json-deflate clients offer it.
        if mode == "echo", transport == .ws || transport == .wss, backend != nil { arguments.append("--deflate") }
        return try ChildServer.start(
            backend: backend, url: "\(transport)://127.0.0.1:0", cpu: pinned ? plan.serverCPU : nil,
            extraArguments: arguments)
    }
}

/// `compare`'s options for a load the user describes: their own workload, or a sweep of rates.
struct LoadOptions: ParsableArguments {
    @Option(
        help: ArgumentHelp(
            "Your own load, run on every backend and ending in a verdict: connections=N,rate=R/s,size=S,transport=T[,duration=D][,p99=B][,bulk=K] (rate per connection, or total=R/s over all; default size 64, duration 3s, p99 bound --bound; bulk=K: K bulk connections to the same server beside it, 64 KiB writes or udp 1,400-byte datagrams, every byte echoed). Or a broadcast: broadcast=N[,rate=R/s][,duration=D][,transport=T][,p95=B]: N clients, one message to all of them R times a second (default 10/s, tcp and ws), held when every message reaches every client and the last receipt's p95 stays within B (default 250ms).",
            valueName: "spec"))
    var workload: String?

    @Flag(
        help:
            "Latency against load: open-loop 64-byte rates stepped up (--sweep-rates) on every backend x transport until each saturates; names each backend's highest rate that keeps p99 under 1 ms and under --bound, and report.html draws the curves."
    )
    var sweep = false

    @Option(help: "The rates a sweep steps through, per second, comma-separated.")
    var sweepRates = "1k,2k,5k,10k,20k,50k,100k,200k"

    @Option(help: "The p99 a backend must keep to hold a load (a workload without p99=, a sweep), e.g. 1ms, 500us.")
    var bound = "1ms"
}
