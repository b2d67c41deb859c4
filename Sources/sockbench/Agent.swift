import BenchmarkDriver
import ConnectionTestKit
import Foundation
import POSIXSupport
import SocketStyles

/// Lines of text over a `Connection`: the control channel between `sockbench compare --server` and
/// `sockbench serve --agent`.
final class LineChannel {
    let connection: any Connection
    private var buffer: [UInt8] = []

    init(_ connection: any Connection) { self.connection = connection }

    /// The next line without its newline, or `nil` at the end of the stream.
    func readLine() async throws(ConnectionError) -> String? {
        while true {
            if let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: buffer[..<newline], as: UTF8.self)
                buffer.removeSubrange(...newline)
                return line
            }
            guard buffer.count < 1 << 20 else { throw ConnectionError(.protocolViolation, "control line too long") }
            guard let message = try await connection.receive() else { return nil }
            buffer += message.bytes
        }
    }

    func send(_ line: String) async throws(ConnectionError) {
        try await connection.send(Array((line + "\n").utf8))
    }
}

/// `sockbench serve --agent URL`: starts and stops servers for a `sockbench compare --server HOST:PORT` on
/// another host, over a line protocol on one TCP control connection:
///
/// | request | answer |
/// |---|---|
/// | `start BACKEND TRANSPORT echo|sink|native|broadcast` (BACKEND may be `c-floor`) | `ok ID URL` |
/// | `usage ID` | `ok JSON` (the server process's CPU, context switches, memory) |
/// | `ca [HOST]` | `ok BASE64` (the PEM of the throwaway CA that signed the tls/wss servers' certificate, which names the agent's address and HOST, the address the client reaches it at; ask before starting tls/wss servers) |
/// | `clock` | `ok NANOSECONDS` (this host's monotonic clock: `sockbench fleet` estimates its offset) |
/// | `load fanin-N\|rate-R\|workload-... BACKEND URL [samples]` | `ok ready N` once N connections of BACKEND to the echo server at URL are open and warm (``FleetShare``) |
/// | `go DELAY_NS WINDOW_MS [MESSAGES WARMUP OFFSET_NS]` | `ok JSON` (``FleetShare/Outcome``) after a window of WINDOW_MS that opened DELAY_NS after the request came (a broadcast load: once every client has had message MESSAGES - 1, arrivals taken OFFSET_NS back to the asker's clock); the load's connections are then closed |
///
/// Anything else, or a failure, is answered `error MESSAGE` and the session goes on. Every server of a
/// session stops when its control connection ends; a session starts at most ``maximumServers``.
struct Agent {
    let control: Endpoint
    let cpu: Int?
    /// A session may start this many servers (a full compare needs 3 per backend x transport: 75 at most).
    static let maximumServers = 100

    /// Stop once the first control session has ended (an agent that is one pod of a Kubernetes Job).
    var once = false

    func run(until stop: @escaping @Sendable () async -> String) async throws(ConnectionError) {
        let listener = try await Backend.async.listen(on: control)
        Console.line("listening on \(listener.localEndpoint)")
        let (reasons, reason) = AsyncStream<String>.makeStream()
        let once = once
        let sessions = Task {
            await withDiscardingTaskGroup { group in
                while let connection = try? await listener.accept() {
                    group.addTask {
                        await session(connection)
                        if once { reason.yield("its one control session ended (--once)") }
                    }
                }
            }
        }
        let signal = Task { reason.yield(await stop()) }
        var why = "stopped"
        for await first in reasons {
            why = first
            break
        }
        signal.cancel()
        await listener.close()
        sessions.cancel()
        await sessions.value
        Console.error("sockbench serve --agent: \(why)")
    }

    private func session(_ connection: any Connection) async {
        let channel = LineChannel(connection)
        var children: [ChildServer] = []
        var certificates: TestCertificates?
        var share: FleetShare?
        var samplesAsked = false
        defer {
            for child in children { child.stop() }
            certificates?.remove()
        }
        let host = control.host
        while let line = try? await channel.readLine() {
            let received = MonotonicClock.nanoseconds()
            let words = line.split(separator: " ").map(String.init)
            var answer: String
            do {
                switch words.first {
                case "clock" where words.count == 1:
                    answer = "ok \(received)"
                case "load" where words.count == 4 || (words.count == 5 && words[4] == "samples"):
                    if let old = share {
                        share = nil
                        await old.close()
                    }
                    share = try await Self.prepare(words)
                    answer = "ok ready \(share.map { "\($0.load)" } ?? "")"
                case "go" where words.count == 3 || words.count == 6:
                    guard let prepared = share else {
                        throw ConnectionError(.unsupported, "no load: send `load` first")
                    }
                    guard let delay = UInt64(words[1]), delay <= 60_000_000_000, let window = Int(words[2]),
                        (1...600_000).contains(window)
                    else { throw ConnectionError(.unsupported, "go DELAY_NS WINDOW_MS (at most 60 s and 600 s)") }
                    // A broadcast load's order also says how many messages come, how many warm up, and this
                    // host's clock offset from the asker's.
                    var broadcast: (messages: Int, warmup: Int, offset: Int64)?
                    if case .broadcast = prepared.load {
                        guard words.count == 6, let messages = Int(words[3]), messages >= 1, let warmup = Int(words[4]),
                            warmup >= 0, let offset = Int64(words[5])
                        else { throw ConnectionError(.unsupported, "go DELAY_NS WINDOW_MS MESSAGES WARMUP OFFSET_NS") }
                        broadcast = (messages, warmup, offset)
                    }
                    share = nil
                    Console.line("go: \(prepared.load), a window of \(window) ms in \(delay / 1_000_000) ms")
                    // The window opens DELAY_NS after the request came, on this host's clock (the coordinator
                    // allowed for the request's way here): no wall-clock time is compared between hosts.
                    let opens = received &+ delay
                    let now = MonotonicClock.nanoseconds()
                    if opens > now { try? await Task.sleep(for: .nanoseconds(opens - now)) }
                    let outcome =
                        if let broadcast {
                            // Messages still on their way after the window get 20 s.
                            await prepared.receiveBroadcasts(
                                messages: broadcast.messages, warmup: broadcast.warmup, clockOffset: broadcast.offset,
                                deadline: .milliseconds(window) + .seconds(20), keepsSamples: samplesAsked)
                        } else {
                            await prepared.run(window: .milliseconds(window), keepsSamples: samplesAsked)
                        }
                    await prepared.close()
                    answer = "ok " + String(decoding: try JSONEncoder().encode(outcome), as: UTF8.self)
                case "start" where words.count == 4:
                    guard children.count < Self.maximumServers else {
                        throw ConnectionError(
                            .resourceExhausted, "at most \(Self.maximumServers) servers per control connection")
                    }
                    let backend = words[1] == Report.floorName ? nil : try Backend(name: words[1])
                    guard let transport = Transport(rawValue: words[2]) else {
                        throw ConnectionError(.invalidEndpoint, "unknown transport \(words[2])")
                    }
                    var arguments: [String]
                    switch words[3] {
                    case "echo": arguments = []
                    case "sink": arguments = ["--sink"]
                    case let mode where mode.hasPrefix("sink:"):
                        // A udp sink with its receive buffer (compare's --udp-sink-buffer).
                        guard let bytes = Int(mode.dropFirst("sink:".count)), bytes >= 1 else {
                            throw ConnectionError(.unsupported, "bad mode \(mode) (sink:BYTES)")
                        }
                        arguments = ["--sink", "--socket-buffer", "\(bytes)"]
                    case "native": arguments = ["--native"]
                    case "broadcast": arguments = ["--broadcast", "--max-connections", "1000000"]
                    case "async-channel": arguments = ["--async-channel"]
                    default:
                        throw ConnectionError(
                            .unsupported,
                            "unknown mode \(words[3]) (echo, sink, sink:BYTES, native, async-channel, broadcast)")
                    }
                    if transport.isSecure {
                        let made = try certificates ?? TestCertificates.make(extraServerHosts: [host.literal])
                        certificates = made
                        arguments += ["--cert", made.server.certificate, "--key", made.server.key]
                    }
                    let url = "\(transport)://\(host.urlForm):0"
                    let child = try ChildServer.start(backend: backend, url: url, cpu: cpu, extraArguments: arguments)
                    children.append(child)
                    answer = "ok \(children.count - 1) \(child.endpoint)"
                case "usage" where words.count == 2:
                    guard let index = Int(words[1]), children.indices.contains(index),
                        let usage = ResourceUsage.read(pid: children[index].pid)
                    else { throw ConnectionError(.unsupported, "no server \(words[1])") }
                    answer = "ok " + String(decoding: try JSONEncoder().encode(usage), as: UTF8.self)
                case "ca" where words.count <= 2:
                    // The client may name the address it reaches us at (we may listen on a wildcard address).
                    let made =
                        try certificates ?? TestCertificates.make(extraServerHosts: [host.literal] + words.dropFirst())
                    certificates = made
                    answer = "ok " + (try Data(contentsOf: URL(fileURLWithPath: made.caFile)).base64EncodedString())
                default:
                    throw ConnectionError(.protocolViolation, "unknown request '\(line)'")
                }
            } catch {
                answer = "error \(error)".replacingOccurrences(of: "\n", with: " ")
            }
            if words.first == "load" { samplesAsked = words.count == 5 }
            do throws(ConnectionError) {
                try await channel.send(answer)
            } catch {
                break
            }
        }
        if let share { await share.close() }
        await connection.close()
    }

    /// `load LOAD BACKEND URL [samples]`: the connections of this host's share, open and warm.
    private static func prepare(_ words: [String]) async throws(ConnectionError) -> FleetShare {
        guard let load = FleetShare.Load(words[1]) else {
            throw ConnectionError(
                .unsupported,
                "unknown load \(words[1]) (fanin-N up to 10000, rate-PERSECOND, workload-NxRATE/s-SIZEB-SECONDSs)")
        }
        let backend = try Backend(name: words[2])
        let endpoint = try Endpoint(url: words[3])
        guard !endpoint.transport.isSecure else {
            throw ConnectionError(
                .unsupported, "tls and wss loads are not offered: the agents would need the server's CA")
        }
        guard backend.transports.contains(endpoint.transport) else {
            throw ConnectionError(.unsupported, "the \(backend) backend does not offer \(endpoint.transport)")
        }
        return try await FleetShare.prepare(load) { () async throws(ConnectionError) -> any Connection in
            try await backend.connect(to: endpoint)
        }
    }
}

extension Endpoint.Host {
    /// The address as written in a certificate or on a command line (no brackets).
    var literal: String {
        switch self {
        case .ipv4(let text), .ipv6(let text), .name(let text): text
        }
    }

    /// The address as written in a URL (IPv6 in brackets).
    var urlForm: String {
        if case .ipv6(let text) = self { return "[\(text)]" }
        return literal
    }
}

/// The client side: asks an agent for servers and reads their usage. An actor: its requests take turns on the
/// one control connection.
actor AgentClient {
    private let channel: LineChannel
    /// The host the agent was reached at (its servers are reached at the same address).
    let host: Endpoint.Host

    private init(channel: LineChannel, host: Endpoint.Host) {
        self.channel = channel
        self.host = host
    }

    /// Connects to `HOST:PORT`.
    static func connect(_ address: String) async throws -> AgentClient {
        let endpoint: Endpoint
        do {
            endpoint = try Endpoint(url: address.contains("://") ? address : "tcp://\(address)")
        } catch {
            throw fail("--server \(address): \(error)")
        }
        do throws(ConnectionError) {
            let connection = try await Backend.async.connect(to: endpoint)
            return AgentClient(channel: LineChannel(connection), host: endpoint.host)
        } catch {
            throw fail("--server \(address): \(error) (is `sockbench serve --agent` running there?)")
        }
    }

    /// One request, one answer; `error ...` answers throw.
    func request(_ line: String) async throws -> String {
        try await channel.send(line)
        guard let answer = try await channel.readLine() else { throw fail("the agent closed the control connection") }
        guard answer.hasPrefix("ok") else { throw fail("the agent says: \(answer)") }
        return String(answer.dropFirst(3))
    }

    func close() async { await channel.connection.close() }
}
