import ArgumentParser
import Foundation
import SocketStyles

/// The client driver for Autobahn's fuzzingserver (scripts/autobahn client BACKEND).
struct AutobahnClient: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "autobahn-client",
        abstract: "Drive Autobahn|Testsuite's fuzzingserver with our WebSocket client (used by scripts/autobahn).",
        shouldDisplay: false)

    @Argument(help: "The fuzzingserver, e.g. ws://127.0.0.1:9001 or wss://127.0.0.1:9001.")
    var url: String

    @Option var backend: String = Backend.bsd.name
    @Option var agent: String = "socketstyles"
    @OptionGroup var tls: TLSClientOptions
    @Flag(help: "Offer permessage-deflate (cases 12 and 13).") var deflate = false
    @Option(help: "With --deflate: zlib's compression level, 0-9.") var deflateLevel: Int = 6

    func run() async throws {
        let (base, backend) = try parseTarget(url: url, backend: backend)
        var options = WebSocketOptions()
        options.maximumMessageSize = 64 * 1024 * 1024
        options.maximumFrameSize = 64 * 1024 * 1024
        if deflate { options.deflate = WebSocketDeflateOptions.with { $0.compressionLevel = deflateLevel } }
        func open(_ path: String) async throws(ConnectionError) -> any Connection {
            try await backend.connect(
                to: Endpoint(transport: base.transport, host: base.host, port: base.port, path: path),
                webSocket: options,
                tls: tls.configuration)
        }
        let counter = try await open("/getCaseCount")
        guard let text = try await counter.receive()?.text, let count = Int(text) else {
            throw fail("the fuzzingserver did not send a case count")
        }
        await counter.close()
        Console.error("autobahn-client: \(count) cases, agent \(agent), backend \(backend)")
        for index in 1...count {
            do throws(ConnectionError) {
                let connection = try await open("/runCase?case=\(index)&agent=\(agent)")
                do throws(ConnectionError) {
                    while let message = try await connection.receive() { try await connection.send(message) }
                } catch {
                    // The fuzzingserver breaks the protocol on purpose; our side closes with the right code.
                }
                await connection.close()
            } catch {
                Console.error("case \(index): \(error)")
            }
        }
        let report = try await open("/updateReports?agent=\(agent)")
        _ = try? await report.receive()
        await report.close()
    }
}
