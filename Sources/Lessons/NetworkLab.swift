import ConnectionCore
import Foundation
public import POSIXSupport
import SocketStyles
import Synchronization

/// Network namespaces of our own, for the lessons that need a real network path with real packet loss or a real
/// queue. Traffic stays inside these namespaces; they are removed afterwards, also on SIGINT or SIGTERM.
///
/// Joined directly (``init()``): host A (the client) is 10.201.77.1 in namespace `ss<pid>n<k>a`, host B (the
/// server) 10.201.77.2 in `ss<pid>n<k>b`, one veth pair between them. Through a router (``init(routed:)``): A is
/// 10.201.78.1, B 10.201.79.1, and a third namespace `ss<pid>n<k>r` forwards between them; its link toward B is
/// where ``setBottleneck(bitsPerSecond:queueBytes:)`` puts a rate limit and its queue. The queue has to be in a
/// host of its own: in the sender's own namespace, TCP Small Queues would keep each socket's share of it to a
/// millisecond or two, and no queue would ever fill.
public final class NetworkLab: Sendable {
    public let clientNamespace: String
    public let serverNamespace: String
    /// The forwarding host between A and B (``init(routed:)``), else `nil`.
    public let routerNamespace: String?
    public let clientAddress: String
    public let serverAddress: String
    /// The router's device toward host B, where the bottleneck is.
    private let bottleneckDevice: String?
    /// Every host of a bridged lab (``init(bridgedHosts:)``), first the server's, with its address; else A and B.
    public let hosts: [(namespace: String, address: String)]
    /// Every namespace this lab made.
    private let namespaces: [String]

    /// `nil` with the reason when namespaces cannot be made here (not root, no `ip`, no `iptables`; with
    /// `bottleneck`, no `tc`).
    public static func unavailableReason(bottleneck: Bool = false) -> String? {
        if getuid() != 0 { return "creating network namespaces needs root" }
        for tool in ["ip", "iptables"] + (bottleneck ? ["tc"] : []) where which(tool) == nil {
            return
                "the `\(tool)` command is missing (apt-get install -y \(tool == "iptables" ? "iptables" : "iproute2"))"
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

    /// Labs made by this process so far: each one's namespaces have names of their own.
    private static let made = Atomic<Int>(0)

    /// Creates A and B and the link between them, with no loss yet.
    public convenience init() throws { try self.init(routed: false) }

    /// Creates A and B, joined directly or (`routed`) through a forwarding host R, with no loss and no bottleneck
    /// yet.
    public init(routed: Bool) throws {
        let tag = Self.newTag()
        clientNamespace = tag + "a"
        serverNamespace = tag + "b"
        routerNamespace = routed ? tag + "r" : nil
        clientAddress = routed ? "10.201.78.1" : "10.201.77.1"
        serverAddress = routed ? "10.201.79.1" : "10.201.77.2"
        bottleneckDevice = routed ? tag + "rb" : nil
        hosts = [(serverNamespace, serverAddress), (clientNamespace, clientAddress)]
        namespaces = [clientNamespace, serverNamespace] + (routerNamespace.map { [$0] } ?? [])
        Self.installSignalCleanup()
        Self.live.withLock { $0[tag] = namespaces }
        if let routerNamespace {
            do {
                try Self.route(tag, client: clientNamespace, router: routerNamespace, server: serverNamespace)
            } catch {
                remove()
                throw error
            }
            return
        }
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

    /// `count` hosts on one switch, as a cluster's nodes are: namespaces `ss<pid>n<k>h0` ... with addresses
    /// 10.201.80.1 ... (host 0 is ``serverNamespace``, host 1 ``clientNamespace``), each joined by a veth pair to a
    /// bridge in a namespace of its own (`ss<pid>n<k>s`), so that no address or device is added outside the lab.
    public init(bridgedHosts count: Int) throws {
        precondition((2...200).contains(count), "a bridged lab has 2 to 200 hosts")
        let tag = Self.newTag()
        let made = (0..<count).map { (namespace: tag + "h\($0)", address: "10.201.80.\($0 + 1)") }
        hosts = made
        serverNamespace = made[0].namespace
        serverAddress = made[0].address
        clientNamespace = made[1].namespace
        clientAddress = made[1].address
        routerNamespace = nil
        bottleneckDevice = nil
        let hub = tag + "s"
        namespaces = made.map(\.namespace) + [hub]
        Self.installSignalCleanup()
        Self.live.withLock { $0[tag] = namespaces }
        do {
            for namespace in namespaces { try Self.sh("ip", "netns", "add", namespace) }
            try Self.sh("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
            try Self.sh("ip", "-n", hub, "link", "set", "br0", "up")
            for (index, host) in made.enumerated() {
                let (device, port) = (tag + "v\(index)", "p\(index)")
                try Self.sh(
                    "ip", "link", "add", device, "netns", host.namespace, "type", "veth", "peer", "name", port,
                    "netns", hub)
                try Self.sh("ip", "-n", hub, "link", "set", port, "master", "br0")
                try Self.sh("ip", "-n", hub, "link", "set", port, "up")
                try Self.sh("ip", "-n", host.namespace, "addr", "add", host.address + "/24", "dev", device)
                try Self.sh("ip", "-n", host.namespace, "link", "set", device, "up")
                try Self.sh("ip", "-n", host.namespace, "link", "set", "lo", "up")
            }
        } catch {
            remove()
            throw error
        }
    }

    private static func newTag() -> String { "ss\(getpid())n\(made.add(1, ordering: .relaxed).newValue)" }

    /// A ---- R ---- B: a veth pair each side of R, R forwarding, A and B routed through it.
    private static func route(_ tag: String, client: String, router: String, server: String) throws {
        for namespace in [client, router, server] { try sh("ip", "netns", "add", namespace) }
        for (host, side, net) in [(client, "a", "78"), (server, "b", "79")] {
            let (hostDevice, routerDevice) = (tag + "v" + side, tag + "r" + side)
            try sh(
                "ip", "link", "add", hostDevice, "netns", host, "type", "veth", "peer", "name", routerDevice, "netns",
                router)
            try sh("ip", "-n", host, "addr", "add", "10.201.\(net).1/24", "dev", hostDevice)
            try sh("ip", "-n", router, "addr", "add", "10.201.\(net).254/24", "dev", routerDevice)
            for (namespace, device) in [(host, hostDevice), (router, routerDevice), (host, "lo"), (router, "lo")] {
                try sh("ip", "-n", namespace, "link", "set", device, "up")
            }
            try sh("ip", "-n", host, "route", "add", "default", "via", "10.201.\(net).254")
        }
        try sh("ip", "netns", "exec", router, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
    }

    /// The bottleneck on the router's link toward B (a routed lab only): a token bucket (`tbf`) sending at most
    /// `bitsPerSecond`, holding at most `queueBytes` waiting, and dropping what arrives at a full queue. Replacing
    /// it empties the queue.
    public func setBottleneck(bitsPerSecond: Int, queueBytes: Int) throws {
        guard let routerNamespace, let bottleneckDevice else {
            throw ConnectionError(.unsupported, "a bottleneck needs a routed lab (NetworkLab(routed: true))")
        }
        // A bucket of 3,000 bytes: two full-size packets at line rate, then the rate.
        try Self.sh(
            "tc", "-n", routerNamespace, "qdisc", "replace", "dev", bottleneckDevice, "root", "tbf", "rate",
            "\(bitsPerSecond)bit", "burst", "3000", "limit", String(queueBytes))
    }

    /// The congestion control TCP connections from host A start with (a routed lab only): set on A's route
    /// (`ip route ... congctl`), which the kernel applies to every connection it opens over it, whatever opens it.
    /// (Root may pick any algorithm the kernel has; a namespace's `tcp_congestion_control` sysctl refuses one it
    /// would have to load, as this kernel does cubic.)
    public func setCongestionControl(_ algorithm: String) throws {
        guard routerNamespace != nil else {
            throw ConnectionError(.unsupported, "a route's congestion control needs a routed lab")
        }
        try Self.sh(
            "ip", "-n", clientNamespace, "route", "replace", "default", "via", "10.201.78.254", "congctl", algorithm)
    }

    /// The router's bottleneck as `tc` reports it (`sent ... dropped ... backlog ...`), for the lesson's record.
    public func bottleneckStatistics() -> String {
        guard let routerNamespace, let bottleneckDevice else { return "" }
        return (try? Self.sh("tc", "-n", routerNamespace, "-s", "qdisc", "show", "dev", bottleneckDevice)) ?? ""
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

    /// Removes every namespace of the lab (and with them the veth pairs, the bridge and the rules). Safe to call
    /// twice.
    public func remove() {
        for namespace in namespaces { _ = try? Self.sh("ip", "netns", "del", namespace) }
        Self.live.withLock { lives in lives = lives.filter { $0.value != namespaces } }
    }

    /// Labs alive now (by tag, their namespaces), removed on SIGINT/SIGTERM.
    private static let live = Guarded<[String: [String]]>([:])

    /// Installs, once per process, the SIGINT/SIGTERM handling that removes every live lab's namespaces before
    /// exiting (a self-pipe and a thread: no work in the signal handler itself).
    public static func installSignalCleanup() {
        SignalForwarder.install { _ in
            for namespace in live.withLock({ $0.values.flatMap { $0 } }) {
                _ = try? NetworkLab.sh("ip", "netns", "del", namespace)
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
