// swift-format-ignore-file
// The Swift code samples of README.md and docs/, compiled: each lies between `// snippet` markers inside a
// function, and DocSnippetTests checks that every ```swift block of the docs is one of them (imports, blank lines
// and indentation aside). A sample that stops compiling fails the build; one changed in the docs alone fails
// the test. DocSnippetRunTests runs the client ones against echo servers on port 9000 (the docs' examples) in a
// network namespace of its own; the others are never called.

import NIOCore
import NIOPosix
import OpenCombine
import SocketStyles
import SocketStylesCombine
import Logging
import SocketStylesLogging

enum DocSnippets {
    // snippet: README.md
    static func README_1() async throws {
        let connection = try await Backend.bsd.connect(to: Endpoint(url: "tcp://127.0.0.1:9000"))
        try await connection.send(Array("hello".utf8))
        let reply = try await connection.receive(exactly: 5)   // TCP is a byte stream: read a known size
        print(String(decoding: reply, as: UTF8.self))
        await connection.close()
    }
    // end snippet

    // snippet: docs/styles.md
    static func docs_styles_2() async throws {
        let socket = try BSDSocket.connect(to: Endpoint(url: "tcp://127.0.0.1:9000"))
        defer { socket.close() }
        try socket.sendAll(Array("hello".utf8))
        var reply: [UInt8] = []
        while reply.count < 5 {
            let bytes = try socket.receive(maximumLength: 5 - reply.count)
            if bytes.isEmpty { break }          // the server closed
            reply += bytes                      // TCP may deliver the 5 bytes in pieces
        }
    }
    // end snippet

    // snippet: docs/styles.md
    static func docs_styles_3() async throws {
        let loop = try UVLoop()
        loop.execute {
            let client = try! UVTCP(loop: loop)
            try! client.connect(to: .loopbackIPv4(port: 9000)) { error in
                if let error { print("connect failed: \(error)"); return client.close() }
                try? client.write(Array("hello".utf8)) { _ in }     // bytes kept alive until this callback
                var reply: [UInt8] = []
                try? client.readStart { result in
                    switch result {
                    case .data(let bytes): reply += bytes          // valid only inside the callback: copy
                    case .endOfStream, .failure: client.close()
                    }
                    if reply.count == 5 { client.close() }
                }
            }
        }
    }
    // end snippet

    // snippet: docs/styles.md
    static func docs_styles_4() async throws {
        final class EchoClient: SocketStreamDelegate {
            let input: SocketInputStream, output: SocketOutputStream
            var unsent = Array("hello".utf8)                      // what is left to write
            var reply: [UInt8] = []

            init(_ endpoint: Endpoint, on runLoop: SocketRunLoop) {
                (input, output) = getStreamsToHost(endpoint)
                for stream in [input, output] as [SocketStream] {
                    stream.delegate = self
                    stream.schedule(in: runLoop)
                    stream.open()
                }
            }

            func stream(_ stream: SocketStream, handle event: StreamEvent) {
                switch event {
                case .hasSpaceAvailable where stream === output && !unsent.isEmpty:
                    let written = output.write(unsent)              // may be partial: returns the count (-1: error)
                    if written > 0 { unsent.removeFirst(written) }  // write each byte once, then ignore the event
                case .hasBytesAvailable:
                    while input.hasBytesAvailable { reply += input.read(maxLength: 5) }
                    if reply.count == 5 { input.close(); output.close() }
                case .endEncountered, .errorOccurred:
                    input.close(); output.close()
                default: break
                }
            }
        }

        let runLoop = SocketRunLoop.current
        let client = EchoClient(try Endpoint(url: "tcp://127.0.0.1:9000"), on: runLoop)
        withExtendedLifetime(client) { runLoop.run(for: .seconds(1)) }   // the delegate is held weakly
    }
    // end snippet

    // snippet: docs/styles.md
    static func docs_styles_5() async throws {
        let socket = AsyncSocket(to: try Endpoint(url: "tcp://127.0.0.1:9000"))
        try await socket.start()                              // setup -> preparing -> ready
        try await socket.send(Array("hello".utf8))
        var reply: [UInt8] = []
        for try await chunk in socket.messages {              // an AsyncSequence of what arrives
            reply += chunk
            if reply.count == 5 { break }
        }
        await socket.close()
    }
    // end snippet

    // snippet: docs/styles.md
    static func docs_styles_6() async throws {
        // Any backend, the same code: .bsd, .uv, .runloop, .async, .nio or .uring.
        let connection = try await Backend.uv.connect(to: Endpoint(url: "tcp://127.0.0.1:9000"))
        try await connection.send(Array("hello".utf8))
        let reply = try await connection.receive(exactly: 5)
        print(String(decoding: reply, as: UTF8.self))
        await connection.close()
    }
    // end snippet

    // snippet: docs/tls.md
    static func docs_tls_7() async throws {
        // Client: verify against the system store (the default), or a private CA.
        var tls = TLSConfiguration()
        tls.trustRoots = .file("ca.pem")
        let connection = try await Backend.async.connect(to: Endpoint(url: "tls://localhost:8443"), tls: tls)
        if let secure = connection as? TLSConnection { print(secure.negotiatedVersion, secure.cipherSuite) }

        // Server: a certificate chain and its key.
        let server = TLSConfiguration.server(certificateChainFile: "cert.pem", privateKeyFile: "key.pem")
        let listener = try await Backend.uv.listen(on: Endpoint(url: "wss://127.0.0.1:0/"), tls: server)
        print("serving", listener.localEndpoint)
    }
    // end snippet

    // snippet: docs/websocket.md
    static func docs_websocket_8() async throws {
        let ws = try await Backend.async.connectWebSocket(     // a WebSocketConnection, no cast
            to: Endpoint(url: "ws://127.0.0.1:9000/chat"),
            webSocket: .with { $0.headers = [.init(name: "Authorization", value: "Bearer token")] })
        try await ws.send(text: "hello")                       // or send(Message(bytes)) for binary
        let message = try await ws.receive()                   // a whole message; .kind is .text or .binary
        print(message?.text ?? "the server closed")
        try await ws.sendPing(timeout: .seconds(5))            // its pong, a receive running or not; .timedOut after 5 s
        await ws.close(code: .goingAway, reason: "bye")        // the close handshake, bounded by closeTimeout
        print(ws.peerCloseCode as Any, ws.peerCloseReason as Any)
    }
    // end snippet

    // snippet: docs/websocket.md
    static func docs_websocket_9() async throws {
        let listener = try await Backend.nio.listenWebSocket(on: Endpoint(url: "ws://127.0.0.1:0/chat")) { request in
            // request.path, .query, .headers, .subprotocols, .origin
            request.header("Authorization") == nil
                ? .refuse(status: 401, reason: "log in first")
                : .accept(subprotocol: request.subprotocols.first)
        }
        while let client = try? await listener.acceptWebSocket() {
            Task {
                print("joined:", client.request?.query ?? "", client.subprotocol ?? "no subprotocol")
                for try await message in client.messages { try await client.send(message) }  // echo until the end
            }
        }
    }
    // end snippet

    // snippet: docs/proxy.md
    static func docs_proxy_1() async throws {
        let relay = try await Relay.start(
            listen: Endpoint(url: "udp://127.0.0.1:0"), upstream: Endpoint(url: "udp://127.0.0.1:9000"), backend: .uv,
            toUpstream: .with { $0.loss = 0.1; $0.jitter = .milliseconds(20); $0.reorder = true })
        print("relaying on", relay.endpoint)
        await relay.stop()
        print(relay.statistics.dropped, "dropped")
    }
    // end snippet

    // snippet: docs/websocket.md
    static func docs_websocket_deflate() async throws {
        // A client offers it; the server decides (ws.deflate is nil when it declined).
        let ws = try await Backend.uv.connectWebSocket(
            to: Endpoint(url: "ws://127.0.0.1:9000/feed"), webSocket: .with { $0.deflate = WebSocketDeflateOptions() })
        print(ws.deflate.map { "agreed: \($0)" } ?? "the server declined")
        // A server accepts it when a client offers it; a 4 KiB window and zlib memory level 5 keep each connection small.
        let listener = try await Backend.async.listenWebSocket(
            on: Endpoint(url: "ws://127.0.0.1:0/"),
            webSocket: .with { $0.deflate = .with { $0.serverMaxWindowBits = 12; $0.memoryLevel = 5 } })
        print("serving", listener.localEndpoint)
    }
    // end snippet

    // snippet: docs/websocket.md
    static func docs_websocket_states() async throws {
        let connection = Backend.uv.connection(to: try Endpoint(url: "wss://127.0.0.1:9000/feed"))
        Task {
            for await state in connection.states {
                switch state {
                case .ready: print("ready")
                case .closed(let code, let reason): print("closed by the server:", code.map(String.init(describing:)) ?? "-", reason)
                case .failed(let error): print("failed:", error)
                default: break
                }
            }
        }
        try await connection.send(.text("subscribe"))    // waits in the queue until ready
        for try await message in connection.messages { print(message.text ?? "binary") }
        await connection.close()
    }
    // end snippet

    // snippet: docs/websocket.md
    static func docs_websocket_reconnect() async throws {
        let chat = ReconnectingConnection(
            backend: .async, endpoint: try Endpoint(url: "ws://127.0.0.1:9000/chat"),
            policy: .with { $0.maximumDelay = .seconds(5); $0.whileDisconnected = .queue(maximumMessages: 100) })
        Task { for await state in chat.states { print("state:", state) } }   // .waiting(error) while the server is away
        try await chat.send(.text("hello"))
        for try await message in chat.messages { print(message.text ?? "binary") }
        await chat.close()
    }
    // end snippet

    // snippet: docs/styles.md (io_uring)
    static func docs_styles_uring() async throws {
        let socket = try await UringSocket.connect(to: Endpoint(url: "tcp://127.0.0.1:9000"))
        try await socket.send(Array("hello".utf8))               // one IORING_OP_SEND, awaited until it completed
        var reply: [UInt8] = []
        while reply.count < 5 {                                  // TCP may deliver the 5 bytes in pieces
            guard let bytes = try await socket.receive(maximumLength: 5 - reply.count) else { break }  // one IORING_OP_RECV
            reply += bytes
        }
        print(String(decoding: reply, as: UTF8.self))
        await socket.close()
    }
    // end snippet

    // snippet: docs/backends/uring.md
    static func docs_backends_uring() async throws {
        let socket = try await UringSocket.connect(to: Endpoint(url: "tcp://127.0.0.1:9000"))
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
        defer { buffer.deallocate() }
        // On the ring's thread: each operation goes straight into the submission queue, and its completion
        // resumes this task there.
        try await withTaskExecutorPreference(socket.loop) {
            try await socket.send(Array("hello".utf8))
            var received = 0
            while received < 5 {
                let free = UnsafeMutableRawBufferPointer(rebasing: buffer[received...])
                guard let count = try await socket.receive(into: free) else { break }  // the kernel wrote them there
                received += count
            }
            print(String(decoding: UnsafeRawBufferPointer(rebasing: buffer[..<received]), as: UTF8.self))
        }
        await socket.close()
    }
    // end snippet

    // snippet: docs/styles.md (SwiftNIO)
    static func docs_styles_nio() async throws {
        final class EchoClientHandler: ChannelInboundHandler {
            typealias InboundIn = ByteBuffer
            typealias OutboundOut = ByteBuffer
            private var reply = ByteBuffer()
            private let done: EventLoopPromise<String>

            init(done: EventLoopPromise<String>) { self.done = done }

            func channelActive(context: ChannelHandlerContext) {
                let hello = context.channel.allocator.buffer(string: "hello")
                context.writeAndFlush(Self.wrapOutboundOut(hello), promise: nil)
            }

            func channelRead(context: ChannelHandlerContext, data: NIOAny) {
                var bytes = Self.unwrapInboundIn(data)
                reply.writeBuffer(&bytes)                         // TCP may deliver the 5 bytes in pieces
                if reply.readableBytes >= 5 {
                    done.succeed(reply.readString(length: 5) ?? "")
                    context.close(promise: nil)
                }
            }
        }

        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let done = group.next().makePromise(of: String.self)
        let channel = try await ClientBootstrap(group: done.futureResult.eventLoop)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(EchoClientHandler(done: done))
                }
            }
            .connect(host: "127.0.0.1", port: 9000).get()
        print(try await done.futureResult.get())
        try await channel.closeFuture.get()
        try await group.shutdownGracefully()
    }
    // end snippet


    // snippet: docs/websocket.md
    static func docs_websocket_combine() async throws {
        let chat = ReconnectingConnection(backend: .nio, endpoint: try Endpoint(url: "ws://127.0.0.1:9000/chat"))
        var bag = Set<AnyCancellable>()
        chat.statePublisher.sink { state in print("state:", state) }.store(in: &bag)
        chat.messagePublisher
            .compactMap(\.text)
            .sink(receiveCompletion: { print("ended:", $0) }, receiveValue: { print("received:", $0) })
            .store(in: &bag)
        chat.sendPublisher(.text("hello")).sink(receiveCompletion: { print("sent:", $0) }, receiveValue: {}).store(in: &bag)
    }
    // end snippet

    // snippet: Sources/SocketStyles/SocketStyles.docc/ChoosingABackend.md
    static func docc_choosing_bsd_only() async throws {
        let tcp = try await BSDBackend().connect(to: Endpoint(url: "tcp://127.0.0.1:9000"), options: ConnectionOptions())
        let socket = try await WebSocketConnection.client(over: tcp, endpoint: Endpoint(url: "ws://127.0.0.1:9000/"))
        try await socket.send(text: "hello")
    }
    // end snippet

    // snippet: Sources/SocketStyles/SocketStyles.docc/ChoosingABackend.md
    static func docc_choosing_logging() {
        BoundsLog.handler = BoundsLog.logging(to: Logger(label: "chat-server"))
    }
    // end snippet

    // snippet: Sources/SocketStyles/SocketStyles.docc/TheConnectionContract.md
    static func docc_contract_receive_loop() async throws {
        let connection = try await Backend.async.connect(to: Endpoint(url: "tcp://127.0.0.1:9000"))
        try await connection.send(Array("ping".utf8))
        try await connection.closeOutput()                     // TCP FIN: the echo server ends after echoing
        while let message = try await connection.receive() {   // nil once: the peer finished sending
            print(message.bytes.count, "bytes")
        }
        await connection.close()                               // a second close() does nothing
    }
    // end snippet

    // snippet: Sources/SocketStyles/SocketStyles.docc/TheConnectionContract.md
    static func docc_contract_server() async throws {
        let listener = try await Backend.async.listen(on: Endpoint(url: "tcp://127.0.0.1:0"))
        print("listening on", listener.localEndpoint)
        while true {
            let connection = try await listener.accept()
            Task(executorPreference: connection.preferredExecutor) {
                while let message = try await connection.receive() { try await connection.send(message) }
                await connection.close()
            }
        }
    }
    // end snippet

    // snippet: Sources/SocketStyles/SocketStyles.docc/TheConnectionContract.md
    static func docc_contract_owned_buffers() async throws {
        let connection = try await Backend.uv.connect(to: Endpoint(url: "tcp://127.0.0.1:9000"))
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
        defer { buffer.deallocate() }
        try await connection.send(Array("ping".utf8))
        try await connection.closeOutput()                     // the echo server ends after echoing
        try await withTaskExecutorPreference(connection.preferredExecutor) {
            var total = 0
            while let received = try await connection.receive(into: buffer) {   // nil once at the end
                total += received.count                                          // the bytes are buffer[..<received.count]
            }
            print(total, "bytes")
        }
        await connection.close()
    }
    // end snippet
}
