public import Foundation

/// Headless Chromium for tests (Debian's `chromium`, from `scripts/ensure-deps --browser`), started so that it
/// talks to nothing but the loopback pages it is pointed at.
///
/// `--disable-background-networking` and its friends are not enough: Chromium 156 still builds requests of its
/// own (network time, component updates, the account list), and without a resolver rule it sends their DNS
/// queries to the system's resolver. `--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1` makes every name
/// but 127.0.0.1 unresolvable, so no query leaves the machine (pages use 127.0.0.1), and each launch writes a network
/// log that ``trafficBeyondLoopback(netLog:)`` reads back, so a test can check that claim on every run.
public enum HeadlessChromium {
    /// The browser, or `nil` when it is not installed.
    public static let path: String? = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].first {
        FileManager.default.isExecutableFile(atPath: $0)
    }

    /// The command-line flags: headless, no profile of the user's, no background requests, no name resolution;
    /// its network log goes to `netLog`.
    public static func flags(profile: URL, netLog: URL) -> [String] {
        [
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-default-apps",
            "--disable-extensions", "--disable-client-side-phishing-detection", "--disable-domain-reliability",
            "--no-pings", "--disable-features=NetworkTimeServiceQuerying,MediaRouter,OptimizationHints,Translate",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--user-data-dir=\(profile.path)",
            "--log-net-log=\(netLog.path)",
        ]
    }

    /// What the network log shows going beyond loopback: every TCP connect attempted to another address, and
    /// every socket aimed at another address that then sent bytes. (Chromium's IPv6 reachability probe
    /// connects a UDP socket to a public address to learn its route, and sends nothing: not listed.) An
    /// unreadable log is reported as such.
    public static func trafficBeyondLoopback(netLog: URL) -> [String] {
        guard var data = try? Data(contentsOf: netLog) else {
            return ["the network log \(netLog.path) is missing"]
        }
        if (try? JSONSerialization.jsonObject(with: data)) == nil {
            // A browser stopped by a signal may leave the events array open, even its last line cut short: keep
            // the events up to the last complete line (one per line, each ending "},") and close the array.
            let bytes = [UInt8](data)
            var end = bytes.count
            while end > 1, !(bytes[end - 2] == UInt8(ascii: "}") && bytes[end - 1] == UInt8(ascii: ",")) { end -= 1 }
            data = Data(bytes[..<max(0, end - 1)]) + Data("]}".utf8)
        }
        guard let log = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
            let constants = log["constants"] as? [String: Any],
            let types = constants["logEventTypes"] as? [String: Int],
            let events = log["events"] as? [[String: Any]]
        else { return ["the network log \(netLog.path) is missing or unreadable"] }
        let names = Dictionary(types.map { ($0.value, $0.key) }, uniquingKeysWith: { first, _ in first })
        var aimed: [Int: String] = [:]  // socket source id -> a remote address that is not loopback
        var found: [String] = []
        for event in events {
            guard let type = (event["type"] as? Int).flatMap({ names[$0] }),
                let source = (event["source"] as? [String: Any])?["id"] as? Int
            else { continue }
            let params = event["params"] as? [String: Any] ?? [:]
            if let address = params["address"] as? String, !isLoopback(address),
                type.hasSuffix("_CONNECT") || type.hasSuffix("_CONNECT_ATTEMPT")
            {
                if type.hasPrefix("TCP_") { found.append("\(type) \(address)") }
                aimed[source] = address
            }
            if type.hasSuffix("_BYTES_SENT"), let address = aimed[source] {
                found.append("\(type) to \(address)")
            }
        }
        return found
    }

    /// `true` for 127.0.0.0/8 and ::1 (with a port).
    public static func isLoopback(_ address: String) -> Bool {
        address.hasPrefix("127.") || address.hasPrefix("[::1]")
    }
}
