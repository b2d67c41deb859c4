import BenchmarkDriver
import SocketStyles

extension Lesson {
    /// TCP joins and splits sends; UDP keeps each datagram whole.
    static let boundaries = Lesson(
        name: "boundaries",
        summary:
            "100 small sends: TCP delivers a byte stream (joined or split); UDP datagrams and WebSocket messages "
            + "arrive whole"
    ) { backend, print in
        let out = LessonOutput("boundaries", print)
        let sends = 100
        let size = 10
        out.say(
            "Sending \(sends) messages of \(size) bytes, back to back, over TCP, UDP and WebSocket (\(backend) backend)."
        )
        out.say()

        // TCP: the receiver sees a stream of bytes; how they are cut depends on timing, not on the sends.
        let tcpPhase = out.trace.phase("TCP: \(sends) sends of \(size) B", .tcp)
        let listener = try await backend.listen(on: loopback(.tcp))
        let client = out.trace.trace(
            try await backend.connect(to: listener.localEndpoint), side: .client, phase: tcpPhase)
        let server = out.trace.trace(try await listener.accept(), side: .server, phase: tcpPhase)
        for index in 0..<sends { try await client.send([UInt8](repeating: UInt8(index), count: size)) }
        try await client.closeOutput()
        var receiveSizes: [Int] = []
        var stream: [UInt8] = []
        while let message = try await server.receive() {
            receiveSizes.append(message.count)
            stream += message.bytes
        }
        let inOrder = stream == (0..<sends).flatMap { [UInt8](repeating: UInt8($0), count: size) }
        await client.close()
        await server.close()
        await listener.close()
        out.say("TCP: \(sends) sends arrived as \(receiveSizes.count) receive(s) of \(summarize(receiveSizes)) bytes.")
        out.say("     All \(stream.count) bytes arrived, in order: \(inOrder ? "yes" : "NO").")
        out.figure("tcp.sends", Double(sends))
        out.figure("tcp.receives", Double(receiveSizes.count))
        out.figure("tcp.bytes", Double(stream.count))
        out.figure("tcp.inOrder", inOrder ? 1 : 0)

        // UDP: every datagram is one receive, whole.
        let udpPhase = out.trace.phase("UDP: \(sends) datagrams of \(size) B", .udp)
        let byFirstByte: @Sendable ([UInt8]) -> Int? = { $0.first.map(Int.init) }
        let udpListener = try await backend.listen(on: loopback(.udp))
        let udpClient = out.trace.trace(
            try await backend.connect(to: udpListener.localEndpoint), side: .client, phase: udpPhase,
            number: byFirstByte)
        for index in 0..<sends { try await udpClient.send([UInt8](repeating: UInt8(index), count: size)) }
        let peer = out.trace.trace(try await udpListener.accept(), side: .server, phase: udpPhase, number: byFirstByte)
        var datagrams: [[UInt8]] = []
        // Loopback does not lose such a short burst; a bounded wait keeps the lesson finite if it did.
        while datagrams.count < sends {
            guard let message = try? await withDeadline(.seconds(1), { try await peer.receive() }), let message
            else { break }
            datagrams.append(message.bytes)
        }
        let whole = datagrams.allSatisfy { $0.count == size && Set($0).count == 1 }
        await udpClient.close()
        await peer.close()
        await udpListener.close()
        out.say(
            "UDP: \(sends) sends arrived as \(datagrams.count) receive(s) of \(summarize(datagrams.map(\.count))) bytes; each whole: \(whole ? "yes" : "NO")."
        )
        out.figure("udp.sends", Double(sends))
        out.figure("udp.receives", Double(datagrams.count))
        out.figure("udp.whole", whole ? 1 : 0)

        // WebSocket: messages over TCP, framed, so boundaries survive the stream.
        let wsPhase = out.trace.phase("WebSocket: \(sends) messages of \(size) B", .ws)
        let wsListener = try await backend.listen(on: loopback(.ws))
        let wsClient = out.trace.trace(
            try await backend.connect(to: wsListener.localEndpoint), side: .client, phase: wsPhase)
        let wsServer = out.trace.trace(try await wsListener.accept(), side: .server, phase: wsPhase)
        for index in 0..<sends { try await wsClient.send([UInt8](repeating: UInt8(index), count: size)) }
        var messages: [[UInt8]] = []
        while messages.count < sends, let message = try await wsServer.receive() { messages.append(message.bytes) }
        let wsWhole = messages.enumerated().allSatisfy {
            $0.element == [UInt8](repeating: UInt8($0.offset), count: size)
        }
        await wsClient.close()
        await wsServer.close()
        await wsListener.close()
        out.say(
            "WebSocket: \(sends) sends arrived as \(messages.count) receive(s) of \(summarize(messages.map(\.count))) bytes, in order and whole: \(wsWhole ? "yes" : "NO")."
        )
        out.figure("ws.receives", Double(messages.count))
        out.figure("ws.whole", wsWhole ? 1 : 0)
        out.say()
        out.say("Why: TCP is a byte stream. The kernel coalesces what you send into segments and the receiver gets")
        out.say("whatever has arrived when it reads, so message boundaries are yours to mark (a length prefix, a")
        out.say("delimiter). UDP sends datagrams: each send is one packet and each receive returns one whole")
        out.say("datagram, or nothing. WebSocket runs over TCP but frames each message (a header with its length),")
        out.say("so the receiver reassembles exactly the messages that were sent, whatever TCP did to the bytes.")
        let receives = Int(out.report.figures["tcp.receives"] ?? 0)
        if receives < sends {
            out.say(
                "Here TCP joined them: \(sends) sends came out as \(receives) receive(s), each returning whatever had arrived: in the picture, several arrows end at one receive.",
                pointingAt: tcpPhase)
        } else {
            out.say(
                "Here each send came out as a receive of its own: the receiver read each segment as it arrived.",
                pointingAt: tcpPhase)
            out.say("Nothing in TCP promised that; with other timing the same sends are joined (run it again).")
        }
        return out.report
    }
}

/// "97 x 10, 1 x 30" style summary of sizes.
func summarize(_ sizes: [Int]) -> String {
    guard !sizes.isEmpty else { return "nothing" }
    var counts: [Int: Int] = [:]
    for size in sizes { counts[size, default: 0] += 1 }
    return counts.sorted { $0.value > $1.value || ($0.value == $1.value && $0.key < $1.key) }.prefix(4)
        .map { "\($0.value) x \($0.key)" }.joined(separator: ", ") + (counts.count > 4 ? ", ..." : "")
}

/// Runs `body`, giving up with `nil` after `limit`.
func withDeadline<R: Sendable>(_ limit: Duration, _ body: @escaping @Sendable () async throws -> R) async throws -> R? {
    try await withThrowingTaskGroup(of: R?.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try? await Task.sleep(for: limit)
            return nil
        }
        defer { group.cancelAll() }
        return try await group.next() ?? nil
    }
}
