import ArgumentParser
import BenchmarkDriver
import ConnectionTestKit
import Dispatch
import Foundation
import Lessons
import NativeStyles
import POSIXSupport
import SocketStyles

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run an echo server until SIGINT or SIGTERM.",
        discussion: "Prints `listening on URL` (with the real port when 0 was asked) once it accepts clients."
    )

    @Argument(
        help: "Where to listen, e.g. tcp://127.0.0.1:0, udp://[::1]:9000, wss://127.0.0.1:0 (with --cert, --key).")
    var url: String

    @Option(help: "The connection style: \(Backend.allCases.map(\.rawValue).joined(separator: ", ")).")
    var backend: String = Backend.bsd.name

    @Option(help: "Pin the server to this CPU.")
    var cpu: Int?

    @Option(
        help: ArgumentHelp(
            "Serve on this many loops (threads), a listening socket each on the one address (SO_REUSEPORT).",
            discussion: "bsd already runs a thread per connection: more only adds acceptor threads."))
    var threads: Int = 1

    @Option(
        help:
            "With --threads: how connections reach the loops: reuseport (a listening socket per loop) or handoff (one acceptor hands each to the loops in turn; async only)."
    )
    var spread: String = ServerSpread.reusePort.rawValue

    @OptionGroup var tls: TLSServerOptions

    @Flag(help: "Count and discard instead of echoing (the receiving end of `compare`'s pump scenarios).")
    var sink = false

    @Flag(
        help:
            "tcp, ws: send what a client asks for to every other client connected, then answer it (the server of `compare`'s broadcast-N; docs/benchmarks.md)."
    )
    var broadcast = false

    @Flag(
        help:
            "Serve in the backend's own style instead of through Listener/Connection (tcp; \(Backend.nio.name) also ws with NIOWebSocket, tls and wss with swift-nio-ssl): the server side of `compare`'s native-SIZE."
    )
    var native = false

    @Flag(
        help:
            "\(Backend.nio.name), tcp: serve with SwiftNIO's async/await bridge (NIOAsyncChannel, a task per connection): the server side of `compare`'s asyncchannel-SIZE."
    )
    var asyncChannel = false

    @Flag(
        help:
            "Be an agent for `sockbench compare --server HOST:PORT` on another host: URL is the control address; servers are started on request, on the same host address (pinned with --cpu)."
    )
    var agent = false

    @Flag(help: "With --agent: exit once the first control session ends (a load agent that is a Kubernetes Job's pod).")
    var once = false

    @Flag(help: "Stop when standard input reaches its end (used by `sockbench compare` for its child servers).")
    var exitOnStdinEOF = false

    @Flag(help: "Print no line when stopping (compare's child servers: compare reports for them).")
    var quiet = false

    @Option(help: "udp: forget a peer that sent nothing for this many seconds (its state is freed).")
    var udpPeerIdle: Double = 60

    @Option(help: "udp: the most peers kept at once; a new address beyond it makes the server forget the quietest.")
    var maxUDPPeers: Int = 4096

    @Option(help: "tcp, tls, ws, wss: the most connections open at once; a client beyond it is closed at once.")
    var maxConnections: Int = 16_384

    @Option(help: "Close a connection that sends and receives nothing for this many seconds (0: never).")
    var idleTimeout: Double = 300

    @OptionGroup var buffers: SocketBufferOption

    @Option(
        help: ArgumentHelp(
            "Record every send and receive (CLOCK_MONOTONIC nanoseconds, bytes, the number a numbered datagram or message starts with; the first 200,000) and write them to this file as JSON when stopping: how a lesson draws a server that runs in another network namespace.",
            valueName: "file"))
    var trace: String?

    @Flag(help: "ws, wss: accept permessage-deflate (RFC 7692) when a client offers it.")
    var deflate = false

    @Option(help: "With --deflate: zlib's compression level, 0-9 (1: fastest; 6: zlib's default).")
    var deflateLevel: Int = 6

    func validate() throws {
        guard maxConnections >= 1 else { throw ValidationError("--max-connections must be at least 1") }
        guard idleTimeout >= 0 else { throw ValidationError("--idle-timeout must be 0 or more") }
        guard udpPeerIdle > 0 else { throw ValidationError("--udp-peer-idle must be above 0") }
        guard maxUDPPeers >= 1 else { throw ValidationError("--max-udp-peers must be at least 1") }
        guard (0...9).contains(deflateLevel) else { throw ValidationError("--deflate-level must be 0-9") }
        guard !(sink && broadcast) else { throw ValidationError("--sink and --broadcast are two different servers") }
        if once && !agent { throw ValidationError("--once is for --agent") }
        guard threads >= 1 else { throw ValidationError("--threads must be at least 1") }
        guard ServerSpread(rawValue: spread) != nil else {
            throw ValidationError("--spread: reuseport or handoff, not \(spread)")
        }
        if threads > 1 {
            guard !native, !asyncChannel, !agent else {
                throw ValidationError(
                    "--threads serves through Connection: not with --native, --async-channel or --agent")
            }
            guard cpu == nil else { throw ValidationError("--cpu would put every one of the --threads on one CPU") }
        }
    }

    func run() async throws {
        let (endpoint, backend) = try parseTarget(url: url, backend: backend)
        if agent {
            let stdinEOF = exitOnStdinEOF
            do throws(ConnectionError) {
                var agent = Agent(control: endpoint, cpu: cpu)
                agent.once = once
                try await agent.run { await StopSignal.wait(stdinEOF: stdinEOF) }
            } catch {
                throw fail(error.description)
            }
            return
        }
        try pin(toCPU: cpu)
        if native || asyncChannel { return try await serveNative(endpoint, backend) }
        let tlsConfiguration = try tls.configuration(for: endpoint.transport)
        let server: EchoServer
        let recorder = trace.map { _ in LessonTrace.recorder() }
        do throws(ConnectionError) {
            let options = ConnectionOptions.with {
                $0.udpPeerIdleTimeout = .milliseconds(Int64(udpPeerIdle * 1000))
                $0.maximumUDPPeers = maxUDPPeers
                $0.maximumConnections = maxConnections
                $0.idleTimeout = idleTimeout > 0 ? .milliseconds(Int64(idleTimeout * 1000)) : nil
                buffers.apply(to: &$0)
            }
            let listener = try await backend.listen(
                on: endpoint, options: options,
                webSocket: WebSocketOptions.with {
                    $0.deflate = deflate ? WebSocketDeflateOptions.with { $0.compressionLevel = deflateLevel } : nil
                },
                tls: tlsConfiguration, threads: threads, spread: ServerSpread(rawValue: spread)!)
            let numbered = endpoint.transport.isByteStream ? nil : LessonTrace.leadingNumber
            server = EchoServer(
                listener: recorder.map { $0.trace(listener, phase: 0, number: numbered) } ?? listener,
                mode: sink ? .sink : broadcast ? .broadcast : .echo)
            server.begin()
        } catch {
            throw fail(error.description)
        }
        Console.line("listening on \(server.endpoint)")
        let reason = await StopSignal.wait(stdinEOF: exitOnStdinEOF)
        await server.stop()
        if let trace, let recorder {
            do {
                try JSONEncoder().encode(recorder.observations).write(to: URL(fileURLWithPath: trace))
            } catch {
                throw fail("could not write \(trace): \(error.localizedDescription)")
            }
            if recorder.notRecorded > 0 {
                Console.error(
                    "sockbench serve: --trace kept the first 200,000 sends and receives; \(recorder.notRecorded) more were not recorded"
                )
            }
        }
        guard !quiet else { return }
        Console.error("sockbench serve: \(reason); served \(server.connectionsServed) connection(s)")
    }
}

extension Serve {
    func serveNative(_ endpoint: Endpoint, _ backend: Backend) async throws {
        let flag = asyncChannel ? "--async-channel" : "--native"
        guard !sink, !broadcast, !(native && asyncChannel) else {
            throw fail("\(flag) serves an echo (no --sink, not both --native and --async-channel)")
        }
        let tlsConfiguration = try tls.configuration(for: endpoint.transport)
        let server: any NativeEchoServer
        do throws(ConnectionError) {
            server =
                asyncChannel
                ? try await backend.asyncChannelEchoServer(on: endpoint)
                : try await backend.nativeEchoServer(on: endpoint, tls: tlsConfiguration)
        } catch {
            throw fail(error.description)
        }
        Console.line("listening on \(server.localEndpoint)")
        let reason = await StopSignal.wait(stdinEOF: exitOnStdinEOF)
        await server.stop()
        guard !quiet else { return }
        Console.error("sockbench serve \(flag): \(reason)")
    }
}

/// Waits for SIGINT, SIGTERM or (optionally) the end of standard input.
enum StopSignal {
    static func wait(stdinEOF: Bool) async -> String {
        let (stream, continuation) = AsyncStream<String>.makeStream()
        var sources: [any DispatchSourceSignal] = []
        for (number, name) in [(SIGINT, "SIGINT"), (SIGTERM, "SIGTERM")] {
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { continuation.yield("stopped by \(name)") }
            source.resume()
            sources.append(source)
        }
        if stdinEOF {
            PosixThread.spawn(name: "stdin-watch") {
                // A line `memory` is answered on standard output: `memory RSS_KIB HEAP_BYTES` (resident memory,
                // and what the allocator has handed out and not had back), for a test that watches the server.
                var byte: UInt8 = 0
                var line: [UInt8] = []
                while read(0, &byte, 1) > 0 {
                    guard byte == UInt8(ascii: "\n") else {
                        if line.count < 64 { line.append(byte) }
                        continue
                    }
                    if line == Array("memory".utf8) {
                        let resident = ResourceUsage.read()?.residentKiB ?? 0
                        Console.line("memory \(resident) \(Syscall.heapInUseBytes())")
                    }
                    line.removeAll()
                }
                continuation.yield("standard input closed")
            }
        }
        var reason = "stopped"
        for await value in stream {
            reason = value
            break
        }
        for source in sources { source.cancel() }
        return reason
    }
}
