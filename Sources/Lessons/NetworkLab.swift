import ConnectionCore
import Foundation
public import POSIXSupport
import SocketStyles
import Synchronization

/// Two network namespaces of our own, joined by a veth pair, for the lessons that need a real network path
/// with real packet loss. Traffic stays inside these namespaces; they are removed afterwards, also on SIGINT
/// or SIGTERM.
///
/// Host A (the client) is 10.201.77.1 in namespace `ss<pid>a`, host B (the server) 10.201.77.2 in `ss<pid>b`.
public final class NetworkLab: Sendable {
    public let clientNamespace: String
    public let serverNamespace: String
    public let clientAddress = "10.201.77.1"
    public let serverAddress = "10.201.77.2"

    /// `nil` with the reason when namespaces cannot be made here (not root, no `ip`, no `iptables`).
    public static func unavailableReason() -> String? {
        if getuid() != 0 { return "creating network namespaces needs root" }
        for tool in ["ip", "iptables"] where which(tool) == nil {
            return "the `\(tool)` command is missing (apt-get install -y \(tool == "ip" ? "iproute2" : "iptables"))"
        }
        return nil
    }

    static func which(_ tool: String) -> String? {
        for directory in ["/usr/sbin", "/sbin", "/usr/bin", "/bin"] {
            let path = directory + "/" + tool
            if FileManager.default.isExecutableFile(atPath: path) { return path }
        }
        return nil
    }

    /// Creates the namespaces and the link, with no loss yet.
    public init() throws {
        let tag = "ss\(getpid())"
        clientNamespace = tag + "a"
        serverNamespace = tag + "b"
        Self.installSignalCleanup()
        _ = Self.live.withLock { $0.insert(tag) }
        do {
            try Self.sh("ip", "netns", "add", clientNamespace)
            try Self.sh("ip", "netns", "add", serverNamespace)
            try Self.sh(
                "ip", "link", "add", tag + "va", "netns", clientNamespace, "type", "veth", "peer", "name",
                tag + "vb", "netns", serverNamespace)
            for (namespace, device, address) in [
                (clientNamespace, tag + "va", clientAddress), (serverNamespace, tag + "vb", serverAddress),
            ] {
                try Self.sh("ip", "-n", namespace, "addr", "add", address + "/24", "dev", device)
                try Self.sh("ip", "-n", namespace, "link", "set", device, "up")
                try Self.sh("ip", "-n", namespace, "link", "set", "lo", "up")
            }
        } catch {
            remove()
            throw error
        }
    }

    /// Drops each packet arriving at host B with probability `probability` (iptables statistic match).
    public func setLoss(_ probability: Double) throws {
        _ = try? Self.sh("ip", "netns", "exec", serverNamespace, "iptables", "-F", "INPUT")
        if probability > 0 {
            try Self.sh(
                "ip", "netns", "exec", serverNamespace, "iptables", "-A", "INPUT", "-m", "statistic", "--mode",
                "random", "--probability", String(probability), "-j", "DROP")
        }
    }

    /// Removes both namespaces (and with them the veth pair and the rules). Safe to call twice.
    public func remove() {
        _ = try? Self.sh("ip", "netns", "del", clientNamespace)
        _ = try? Self.sh("ip", "netns", "del", serverNamespace)
        Self.live.withLock { _ = $0.remove(String(clientNamespace.dropLast())) }
    }

    /// Namespace pairs alive now (their common prefix), removed on SIGINT/SIGTERM.
    private static let live = Guarded<Set<String>>([])

    /// Installs, once per process, the SIGINT/SIGTERM handling that removes every live lab's namespaces before
    /// exiting (a self-pipe and a thread: no work in the signal handler itself).
    public static func installSignalCleanup() {
        SignalForwarder.install { _ in
            for tag in live.withLock({ $0 }) {
                _ = try? NetworkLab.sh("ip", "netns", "del", tag + "a")
                _ = try? NetworkLab.sh("ip", "netns", "del", tag + "b")
            }
            FileHandle.standardError.write(Data("\ninterrupted: network namespaces removed\n".utf8))
            exit(130)
        }
    }

    /// Runs a command and fails with its output when it fails.
    @discardableResult
    static func sh(_ arguments: String...) throws -> String {
        try run(arguments)
    }

    @discardableResult
    static func run(_ arguments: [String]) throws -> String {
        let path = which(arguments[0]) ?? arguments[0]
        let (status, output) = try ChildProcess.run([path] + arguments.dropFirst())
        guard status == 0 else {
            throw ConnectionError(.system, "`\(arguments.joined(separator: " "))` failed: \(output)")
        }
        return output
    }

    /// Starts `sockbench` (this executable) with `arguments` inside `namespace`.
    public func start(in namespace: String, _ arguments: [String]) throws -> ChildProcess {
        try ChildProcess(
            [Self.which("ip")!, "netns", "exec", namespace, Self.selfPath()] + arguments, mergeErrors: false)
    }

    /// Runs `sockbench` (this executable) inside `namespace` to completion and returns its output.
    public func runToEnd(in namespace: String, _ arguments: [String]) throws -> String {
        try Self.run(["ip", "netns", "exec", namespace, Self.selfPath()] + arguments)
    }

    /// The `sockbench` executable that plays the hosts: this process when it is sockbench, otherwise
    /// (in tests) the one built beside it, or `$SOCKBENCH` when set.
    public static func selfPath() -> String {
        if let path = ProcessInfo.processInfo.environment["SOCKBENCH"] { return path }
        var buffer = [CChar](repeating: 0, count: 4096)
        let count = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        let me =
            count > 0
            ? String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
            : CommandLine.arguments[0]
        if me.hasSuffix("/sockbench") { return me }
        var directory = URL(fileURLWithPath: me).deletingLastPathComponent()
        // A test bundle may sit one level down (SocketStylesPackageTests.xctest/...).
        for _ in 0..<3 {
            let candidate = directory.appendingPathComponent("sockbench").path
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
            directory = directory.deletingLastPathComponent()
        }
        return me
    }

    /// Stops a child started with ``start(in:_:)`` by closing its standard input, and waits for it to exit.
    public static func stop(_ child: ChildProcess) {
        child.closeInput()
        _ = try? child.wait()
    }
}

/// Where a lesson's server in another namespace writes what it observed (`sockbench serve --trace FILE`).
struct ServerTrace {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent(
        "sockbench-trace-\(getpid())-\(UInt64.random(in: 0...UInt64.max)).json"
    ).path

    /// What the server wrote when it stopped (nothing when it wrote nothing).
    func observations() -> [LessonTrace.Observation] {
        guard let data = FileManager.default.contents(atPath: path) else { return [] }
        return (try? JSONDecoder().decode([LessonTrace.Observation].self, from: data)) ?? []
    }

    func remove() { try? FileManager.default.removeItem(atPath: path) }
}
