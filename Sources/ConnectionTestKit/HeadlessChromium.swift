public import Foundation
public import POSIXSupport
import SocketStyles

/// Headless Chromium for tests (Debian's `chromium`, from `scripts/ensure-deps --browser`), started so that it
/// talks to nothing but the loopback pages it is pointed at.
///
/// `--disable-background-networking` and its friends are not enough: Chromium 156 still builds requests of its
/// own (network time, component updates, the account list), and without a resolver rule it sends their DNS
/// queries to the system's resolver. `--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1` makes every name
/// but 127.0.0.1 unresolvable, so no query leaves the machine (pages use 127.0.0.1), and each launch writes a network
/// log that ``trafficBeyondLoopback(netLog:)`` reads back, so a test can check that claim on every run. A browser
/// that is to be stopped (rather than one that ends by itself, as with `--dump-dom`) is closed with
/// ``close(_:profile:)``: a signal stops it before it has written its log.
public enum HeadlessChromium {
    /// The browser, or `nil` when it is not installed.
    public static let path: String? = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].first {
        FileManager.default.isExecutableFile(atPath: $0)
    }

    /// The command-line flags: headless, no profile of the user's, no background requests, no name resolution;
    /// its network log goes to `netLog`. With `devTools` (for a browser that is to be closed by
    /// ``close(_:profile:)``, not for `--dump-dom`, which it would keep running), DevTools listens on a port of
    /// 127.0.0.1 that the kernel chooses.
    public static func flags(profile: URL, netLog: URL, devTools: Bool = false) -> [String] {
        [
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-default-apps",
            "--disable-extensions", "--disable-client-side-phishing-detection", "--disable-domain-reliability",
            "--no-pings", "--disable-features=NetworkTimeServiceQuerying,MediaRouter,OptimizationHints,Translate",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--user-data-dir=\(profile.path)",
            "--log-net-log=\(netLog.path)",
        ] + (devTools ? ["--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0"] : [])
    }

    /// Closes `browser` as its user would, with DevTools' `Browser.close` over a WebSocket of our own (bsd) to
    /// the port Chromium wrote in `profile`/DevToolsActivePort, and waits for it to exit. Chromium writes its
    /// network log in batches and completes it only on such a close: stopped by SIGTERM it leaves the log cut
    /// short, at times with none of the events in it. When DevTools does not answer, or the browser has not
    /// exited 20 s later, it gets SIGTERM and then SIGKILL, and the reason is returned (`nil`: closed as asked).
    @discardableResult
    public static func close(_ browser: ChildProcess, profile: URL) async -> String? {
        var problem: String?
        do {
            let activePort = profile.appendingPathComponent("DevToolsActivePort")
            let deadline = ContinuousClock.now + .seconds(10)
            var lines: [Substring] = []
            while lines.count < 2 {
                if let text = try? String(contentsOf: activePort, encoding: .utf8) {
                    lines = text.split(separator: "\n")
                }
                if lines.count < 2 {
                    guard ContinuousClock.now < deadline else {
                        throw ConnectionError(.timedOut, "no \(activePort.path)")
                    }
                    try await Task.sleep(for: .milliseconds(20))
                }
            }
            let endpoint = try Endpoint(url: "ws://127.0.0.1:\(lines[0])\(lines[1])")
            let devTools = try await Backend.bsd.connectWebSocket(to: endpoint)
            try await withDeadline(.seconds(10), closing: devTools, "DevTools' Browser.close") {
                () async throws(ConnectionError) in
                try await devTools.send(.text(#"{"id":1,"method":"Browser.close"}"#))
                // The answer, then the end of the connection as the browser exits (with or without a close frame).
                while (try? await devTools.receive()) != nil {}
            }
            await devTools.close()
        } catch {
            problem = "DevTools did not close the browser (\(error)); stopped it with a signal"
            browser.terminate()
        }
        if browser.wait(upTo: .seconds(20)) == nil {
            problem = (problem ?? "the browser did not exit after Browser.close") + "; killed it"
            browser.terminate(force: true)
        }
        _ = try? browser.wait()
        return problem
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
