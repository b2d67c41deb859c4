import BenchmarkDriver
import ConnectionTestKit
import SocketStyles
import Testing

/// permessage-deflate (RFC 7692) over every backend's ws and wss, both roles.
@Suite("WebSocket permessage-deflate", .timeLimit(.minutes(20)))
struct DeflateConformanceTests {
    static let deflate = WebSocketOptions.with { $0.deflate = WebSocketDeflateOptions() }

    @Test(
        "Both ends agree on deflate and every message comes back whole: text, binary, empty, small, fragmented, 4 MiB",
        arguments: ConformanceCase.ws)
    func echo(_ test: ConformanceCase) async throws {
        try await SocketTest.run(timeLimit: .seconds(120)) {
            let server = try await test.echoServer(webSocket: Self.deflate)
            for takeover in [true, false] {
                var options = Self.deflate
                options.fragmentSize = 1000
                if !takeover {
                    options.deflate?.clientNoContextTakeover = true
                    options.deflate?.serverNoContextTakeover = true
                }
                let client = try await test.backend.connectWebSocket(
                    to: server.endpoint, webSocket: options, tls: test.clientTLS)
                let agreed = try #require(client.deflate)
                #expect(agreed.serverNoContextTakeover == !takeover && agreed.clientNoContextTakeover == !takeover)
                for sequence in 0..<20 {
                    try await client.send(.text(MarketData.book(sequence)))
                    #expect(try await client.receive()?.text == MarketData.book(sequence), "book \(sequence)")
                }
                for message in [
                    Message.text(""), .text("tiny"), Message([]), Message(pattern(100_000, seed: 3)),
                    .text(String(repeating: "κόσμε 🎉 ", count: 5_000)), Message([UInt8](repeating: 9, count: 4 << 20)),
                ] {
                    try await client.send(message)
                    #expect(try await client.receive() == message, "\(message.kind) of \(message.bytes.count) bytes")
                }
                await client.close()
            }
            await server.stop()
        }
    }

    @Test(
        "What the server sends is compressed on the wire (RSV1, under half the size) and inflates to the message",
        arguments: ConformanceCase.ws)
    func onTheWire(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let server = try await test.echoServer(webSocket: Self.deflate)
            var raw = try await RawWebSocketClient.connect(
                test, to: server.endpoint, deflate: WebSocketDeflateOptions())
            let agreed = try #require(raw.deflate)
            let book = Array(MarketData.book(1).utf8)
            // We send it uncompressed (allowed: compression is per message); the server compresses its echo.
            try await raw.sendFrame(WebSocketFrame(opcode: .text, payload: book))
            let echoed = try await raw.nextFrame()
            #expect(echoed.rsv1 && echoed.opcode == .text)
            #expect(echoed.payload.count * 2 < book.count, "\(echoed.payload.count) of \(book.count) bytes on the wire")
            var inflater = WebSocketStateMachine(role: .client, deflate: agreed)
            #expect(inflater.receive(echoed) == [.deliver(text: true, payload: book)])
            await raw.close()
            await server.stop()
        }
    }

    @Test("Either end without deflate: the connection goes on uncompressed", arguments: ConformanceCase.ws)
    func oneSideOnly(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            for (serverOptions, clientOptions) in [
                (Self.deflate, WebSocketOptions()), (WebSocketOptions(), Self.deflate),
            ] {
                let server = try await test.echoServer(webSocket: serverOptions)
                let client = try await test.backend.connectWebSocket(
                    to: server.endpoint, webSocket: clientOptions, tls: test.clientTLS)
                #expect(client.deflate == nil)
                try await client.send(.text(MarketData.book(2)))
                #expect(try await client.receive()?.text == MarketData.book(2))
                await client.close()
                await server.stop()
            }
        }
    }

    @Test(
        "A deflate bomb gets 1009, a bad compressed stream 1007, RSV1 on a ping 1002; the server serves on",
        arguments: ConformanceCase.ws)
    func refusedByServer(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            var limited = Self.deflate
            limited.maximumMessageSize = 1 << 20
            let server = try await test.echoServer(webSocket: limited)
            let bomb = try WebSocketDeflater(
                agreement: WebSocketDeflateAgreement(), role: .client, options: WebSocketDeflateOptions()
            ).compress([UInt8](repeating: 0, count: 64 << 20))
            let cases: [(String, WebSocketFrame, WebSocketCloseCode)] = [
                (
                    "a 64 MiB bomb in \(bomb.count) bytes", WebSocketFrame(opcode: .binary, payload: bomb, rsv1: true),
                    .messageTooBig
                ),
                (
                    "not deflate data", WebSocketFrame(opcode: .binary, payload: [0xFF, 0xFF, 0xFF], rsv1: true),
                    .invalidFramePayloadData
                ),
                ("a compressed ping", WebSocketFrame(opcode: .ping, payload: [0x00], rsv1: true), .protocolError),
            ]
            for (name, frame, code) in cases {
                var raw = try await RawWebSocketClient.connect(
                    test, to: server.endpoint, deflate: WebSocketDeflateOptions())
                #expect(raw.deflate != nil)
                try await raw.sendFrame(frame)
                try await raw.expectClose(code, name)
                await raw.close()
            }
            let client = try await test.backend.connectWebSocket(
                to: server.endpoint, webSocket: Self.deflate, tls: test.clientTLS)
            try await client.send(.text("still here"))
            #expect(try await client.receive()?.text == "still here")
            await client.close()
            await server.stop()
        }
    }

    @Test(
        "A client refuses a bomb from its server with 1009 and reports .messageTooLarge", arguments: ConformanceCase.ws)
    func refusedByClient(_ test: ConformanceCase) async throws {
        try await SocketTest.run {
            let listener = try await test.listenStream()
            let bomb = try WebSocketDeflater(
                agreement: WebSocketDeflateAgreement(), role: .server, options: WebSocketDeflateOptions()
            ).compress([UInt8](repeating: 0, count: 64 << 20))
            // A raw server: agrees to deflate, sends the bomb, reads the client's close.
            let rawServer = Task { () throws -> [UInt8]? in
                let tcp = try await listener.accept()
                var parser = WebSocketFrameParser(role: .server)
                parser.feed(
                    try await answerWebSocketHandshake(
                        on: tcp, deflate: WebSocketDeflateOptions(),
                        along: WebSocketFrameEncoder.encode(WebSocketFrame(opcode: .binary, payload: bomb, rsv1: true)))
                )
                var close: [UInt8]?
                while close == nil, let chunk = try? await tcp.receive() {
                    parser.feed(chunk.bytes)
                    if let frame = try parser.nextFrame(), frame.opcode == .close { close = frame.payload }
                }
                await tcp.close()
                return close
            }
            var options = Self.deflate
            options.maximumMessageSize = 1 << 20
            let client = try await test.backend.connectWebSocket(
                to: listener.localEndpoint.with(transport: test.transport), webSocket: options, tls: test.clientTLS)
            let error = await expectConnectionError(.messageTooLarge) { () async throws(ConnectionError) in
                _ = try await client.receive()
            }
            #expect(error?.systemCode?.code == 1009)
            let close = try await rawServer.value
            #expect(close.map { Array($0.prefix(2)) } == [0x03, 0xF1])  // 1009
            await client.close()
            await listener.close()
        }
    }
}
