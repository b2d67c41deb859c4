import ArgumentParser
import Foundation
import POSIXSupport
import SocketStyles

@main
struct Sockbench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sockbench",
        abstract:
            "Compare connection styles (blocking sockets, libuv, run loop, async/await, SwiftNIO) over TCP, UDP, TLS and WebSocket.",
        discussion: """
            Backends: \(Backend.allCases.map(\.rawValue).joined(separator: ", ")). URLs: tcp://host:port, udp://host:port, \
            tls://host:port, ws://host:port/path, wss://host:port/path.
            Start with `sockbench compare`: it starts echo servers in separate processes and prints a side-by-side table.
            """,
        version: SocketStylesVersion.current,
        subcommands: [
            Compare.self, Serve.self, Ping.self, PumpCommand.self, Soak.self, ChurnCommand.self, Proxy.self,
            LessonCommand.self, DiffCommand.self,
            Backends.self,
            Microbench.self,
            FloorServe.self,
            FleetCommand.self, LessonProbeCommand.self, AutobahnClient.self, RenderReport.self, BroadcastClients.self,
        ],
        defaultSubcommand: nil
    )
}

/// Prints one line to stderr and exits non-zero: bad input gets a clear message, never a stack trace.
func fail(_ message: String) -> ExitCode {
    Console.error("sockbench: error: \(message)")
    return ExitCode.failure
}

/// Unbuffered output (stdout may be a pipe read line by line by `sockbench compare`).
enum Console {
    /// A line to standard output. When its reader has gone (`sockbench backends | head -1`: the pipe is closed,
    /// and SIGPIPE is ignored for the sockets' sake), there is no one left to tell anything: the process ends
    /// quietly, as a tool killed by SIGPIPE would, instead of crashing in `FileHandle.write`.
    static func line(_ text: String) {
        do {
            try FileHandle.standardOutput.write(contentsOf: Data((text + "\n").utf8))
        } catch {
            exit(0)
        }
    }

    static func error(_ text: String) {
        try? FileHandle.standardError.write(contentsOf: Data((text + "\n").utf8))
    }

    /// `value` as pretty-printed JSON with sorted keys, the one form every `--json` prints.
    static func json<T: Encodable>(_ value: T) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        line(String(decoding: try encoder.encode(value), as: UTF8.self))
    }
}

/// Parses what the user typed into an endpoint and a backend, or fails with one line.
func parseTarget(url: String, backend: String) throws -> (Endpoint, Backend) {
    let endpoint: Endpoint
    let parsedBackend: Backend
    do throws(ConnectionError) {
        endpoint = try Endpoint(url: url)
        parsedBackend = try Backend(name: backend)
    } catch {
        throw fail(error.detail)
    }
    guard parsedBackend.transports.contains(endpoint.transport) else {
        let offered = parsedBackend.transports.map(\.rawValue).sorted().joined(separator: ", ")
        throw fail("the \(parsedBackend) backend offers \(offered), not \(endpoint.transport) (yet)")
    }
    return (endpoint, parsedBackend)
}

/// Pins this process to a CPU, or fails with one line.
func pin(toCPU cpu: Int?) throws {
    guard let cpu else { return }
    guard cpu >= 0, cpu < Syscall.cpuCount else {
        throw fail("--cpu \(cpu): this machine has CPUs 0 to \(Syscall.cpuCount - 1)")
    }
    do throws(ConnectionError) {
        try Syscall.pinProcess(toCPU: cpu)
    } catch {
        throw fail(error.description)
    }
}

struct Backends: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List the backends and their transports.")

    @Flag(
        help:
            "One JSON object per backend, a line each: name, available (or the reason it is not), transports, summary, and what the project's scripts read from its registration (module, colour, autobahn, autobahnDeflate, allocationsPerRoundTrip)."
    )
    var json = false

    /// A backend as `--json` prints it.
    struct Entry: Encodable {
        var name: String
        var available: Bool
        var unavailableReason: String?
        var transports: [String]
        var summary: String
        var module: String?
        var colour: String?
        var autobahn: String?
        var autobahnDeflate: String?
        var allocationsPerRoundTrip: Int?
    }

    /// The sides CI runs the permessage-deflate cases against, comma-separated (`server`, `client`), or `nil`.
    private func deflateSides(_ tooling: Backend.Tooling?) -> String? {
        guard let sides = tooling?.autobahnDeflate, !sides.isEmpty else { return nil }
        return sides.map(\.rawValue).joined(separator: ",")
    }

    func run() throws {
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            for backend in Backend.everyCase {
                let tooling = backend.tooling
                let entry = Entry(
                    name: backend.name, available: backend.unavailableReason == nil,
                    unavailableReason: backend.unavailableReason,
                    transports: backend.transports.map(\.rawValue).sorted(), summary: backend.summary,
                    module: tooling?.module, colour: tooling?.colour, autobahn: tooling?.autobahn?.rawValue,
                    autobahnDeflate: deflateSides(tooling), allocationsPerRoundTrip: tooling?.allocationsPerRoundTrip
                )
                Console.line(String(decoding: try encoder.encode(entry), as: UTF8.self))
            }
            return
        }
        let width = Backend.everyCase.map { $0.transports.map(\.rawValue).joined(separator: ",").count }.max() ?? 0
        for backend in Backend.everyCase {
            let name = backend.rawValue.padding(toLength: 8, withPad: " ", startingAt: 0)
            if let reason = backend.unavailableReason {
                Console.line(
                    "\(name) \("unavailable".padding(toLength: width, withPad: " ", startingAt: 0))  \(reason)")
                continue
            }
            let transports = backend.transports.map(\.rawValue).sorted().joined(separator: ",")
            Console.line(
                "\(name) \(transports.padding(toLength: width, withPad: " ", startingAt: 0))  \(backend.summary)")
        }
    }
}

/// The version `sockbench --version` prints.
enum SocketStylesVersion {
    static let current = "0.3.0 (2026-11-23)"
}
