import ConnectionTestKit
import Foundation
import POSIXSupport
import SocketStyles
import Synchronization
import Testing

/// A real browser as the WebSocket client: headless Chromium (Debian's `chromium`, installed by
/// scripts/ensure-deps) opens a local page whose script talks to our server, over ws and wss, on every backend.
/// Chromium always offers permessage-deflate, and our server accepts it here, so this is also the deflate interop
/// check with a browser. Chromium runs with the flags that keep it from making requests of its own and is pointed
/// only at a file and at 127.0.0.1.
@Suite("Chromium as a WebSocket client", .timeLimit(.minutes(20)))
struct ChromiumWebSocketTests {

    /// The page: 20 order books, an empty text, 200 KB of multi-byte text and 100 KB of binary, each echoed and
    /// compared; then one `RESULT` line (not echoed) and a close with 1000.
    static func page(url: String) -> String {
        """
        <!doctype html><meta charset="utf-8"><script>
        const ws = new WebSocket("\(url)");
        ws.binaryType = "arraybuffer";
        const book = (n) => JSON.stringify({type: "book", symbol: "BTC-USD", sequence: n,
            bids: Array.from({length: 40}, (_, l) => [10000 - 5 * l, (7 * l + n) % 90 + 1]),
            asks: Array.from({length: 40}, (_, l) => [10005 + 5 * l, (3 * l + n) % 70 + 1])});
        const binary = new Uint8Array(100000).map((_, i) => (i * 31 + 7) % 251);
        const messages = [...Array.from({length: 20}, (_, n) => book(n)), "", "κόσμε 🎉 ".repeat(15000), binary];
        let next = 0, failures = [];
        const same = (a, b) => typeof b === "string" ? a === b
            : a instanceof ArrayBuffer && a.byteLength === b.length && new Uint8Array(a).every((x, i) => x === b[i]);
        ws.onopen = () => ws.send(messages[0]);
        ws.onmessage = (event) => {
            if (!same(event.data, messages[next])) failures.push(next);
            next += 1;
            if (next < messages.length) { ws.send(messages[next]); return; }
            ws.send("RESULT " + (failures.length ? "failed " + failures.join(",") : "ok") + " extensions=" + ws.extensions);
            ws.close(1000, "done");
        };
        ws.onerror = () => ws.readyState === WebSocket.CLOSED || ws.send("RESULT error");
        </script>
        """
    }

    @Test(
        "Chromium echoes through our server: ws and wss, permessage-deflate agreed",
        arguments: ConformanceCase.ws.filter(\.usesSockets))
    func browserClient(_ test: ConformanceCase) async throws {
        guard let chromium = HeadlessChromium.path else {
            print("skipped: no chromium (scripts/ensure-deps installs it)")
            return
        }
        try await SocketTest.run(timeLimit: .seconds(90)) {
            let listener = try await test.listen(webSocket: .with { $0.deflate = WebSocketDeflateOptions() })
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
                "socketstyles-chromium-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: directory) }
            let page = directory.appendingPathComponent("page.html")
            try Self.page(url: "\(listener.localEndpoint)").write(to: page, atomically: true, encoding: .utf8)
            let netLog = directory.appendingPathComponent("netlog.json")
            let profile = directory.appendingPathComponent("profile")
            var flags = HeadlessChromium.flags(profile: profile, netLog: netLog, devTools: true)
            if test.transport.isSecure {
                // Trust our test server's key (the certificate's SPKI hash), as a browser would after pinning it.
                let certificate = ConformanceCase.certificates.server.certificate
                let hash = try ChildProcess.run([
                    "/bin/sh", "-c",
                    "openssl x509 -in '\(certificate)' -pubkey -noout | openssl pkey -pubin -outform der"
                        + " | openssl dgst -sha256 -binary | base64",
                ])
                try #require(hash.status == 0)
                flags.append(
                    "--ignore-certificate-errors-spki-list=\(hash.output.trimmingCharacters(in: .whitespacesAndNewlines))"
                )
            }
            let browser = try ChildProcess([chromium] + flags + [page.absoluteString])
            defer {
                browser.terminate(force: true)  // when the test failed before closing it
                _ = try? browser.wait()
            }
            let connection = try #require(try await listener.accept() as? WebSocketConnection)
            #expect(connection.request?.headers.contains { $0.name.lowercased() == "sec-websocket-extensions" } == true)
            #expect(connection.deflate != nil, "Chromium offers permessage-deflate; our server accepts it")
            var result: String?
            while let message = try await connection.receive() {
                if let text = message.text, text.hasPrefix("RESULT") {
                    result = text
                } else {
                    try await connection.send(message)
                }
            }
            #expect(result?.hasPrefix("RESULT ok extensions=permessage-deflate") == true, "\(result ?? "no result")")
            #expect(connection.peerCloseCode == .normalClosure)
            #expect(connection.received.payloadBytes < connection.received.messageBytes / 2, "compressed by Chromium")
            await connection.close()
            await listener.close()
            let closing = await HeadlessChromium.close(browser, profile: profile)
            #expect(closing == nil, "\(closing ?? "")")
            let remote = HeadlessChromium.trafficBeyondLoopback(netLog: netLog)
            #expect(remote.isEmpty, "Chromium sent traffic beyond loopback: \(remote)")
        }
    }
}
