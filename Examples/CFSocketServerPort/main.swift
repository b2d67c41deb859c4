// A CFSocket server, ported (docs/porting-from-apple.md): the seed's local proxy, which accepts a client with a
// CFSocket accept callback, wraps the socket in a stream pair (CFStreamCreatePairWithSocket), and relays to a
// remote server through a second stream pair. The Darwin code this replaces:
//
//     let socket = CFSocketCreate(nil, PF_INET, SOCK_STREAM, IPPROTO_TCP,
//                                 CFSocketCallBackType.acceptCallBack.rawValue, acceptCallback, &context)
//     CFSocketSetAddress(socket, address)   // bind + listen
//     CFRunLoopAddSource(CFRunLoopGetCurrent(), CFSocketCreateRunLoopSource(nil, socket, 0), .defaultMode)
//     // acceptCallback: CFStreamCreatePairWithSocket(nil, handle, &readStream, &writeStream) ...
//
// `SocketListener` is the accept callback with the stream pair made for you. Prints `listening on URL`, relays
// every client to UPSTREAM until killed (half-closes pass through: a client's end of request reaches upstream).
//
//     swift run sockbench serve tcp://127.0.0.1:9000 --backend nio &
//     swift run CFSocketServerPort tcp://127.0.0.1:0 tcp://127.0.0.1:9000 &
//     swift run StreamDelegatePort tcp://127.0.0.1:PORT --bytes 100000
import Glibc
import SocketStyles

/// One direction of a relay: reads from `from`, writes to `to`, keeps what the writer has not taken yet.
final class Pipe {
    let from: SocketInputStream
    let to: SocketOutputStream
    var pending: [UInt8] = []
    var ended = false

    init(from: SocketInputStream, to: SocketOutputStream) {
        self.from = from
        self.to = to
    }

    /// Moves what can move now; at the input's end (once all is written) half-closes the output.
    func pump() {
        while true {
            if !pending.isEmpty {
                let count = pending.withUnsafeBytes { to.write($0) }
                if count <= 0 { return }  // full (wait for hasSpaceAvailable) or failed
                pending.removeFirst(count)
                continue
            }
            if ended {
                to.close()
                return
            }
            guard from.hasBytesAvailable else { return }
            pending = from.read(maxLength: 64 * 1024)
        }
    }
}

/// A client and its upstream connection, as the seed's ServerSocket + ClientSocket pair.
final class Relay: SocketStreamDelegate {
    let toUpstream: Pipe
    let toClient: Pipe
    var streams: [SocketStream] { [toUpstream.from, toUpstream.to, toClient.from, toClient.to] }
    /// The streams hold their delegate weakly (as on Darwin): the relay holds itself until it finishes.
    private var keepAlive: Relay?

    init(client: (SocketInputStream, SocketOutputStream), upstream: Endpoint, runLoop: SocketRunLoop) {
        let (upstreamInput, upstreamOutput) = getStreamsToHost(upstream)
        toUpstream = Pipe(from: client.0, to: upstreamOutput)
        toClient = Pipe(from: upstreamInput, to: client.1)
        upstreamInput.schedule(in: runLoop)
        upstreamOutput.schedule(in: runLoop)
        for stream in streams {
            stream.delegate = self
            stream.open()
        }
        keepAlive = self
    }

    func stream(_ stream: SocketStream, handle event: StreamEvent) {
        switch event {
        case .hasBytesAvailable, .hasSpaceAvailable, .openCompleted:
            toUpstream.pump()
            toClient.pump()
        case .endEncountered:
            if stream === toUpstream.from { toUpstream.ended = true } else { toClient.ended = true }
            toUpstream.pump()
            toClient.pump()
            if toUpstream.ended && toClient.ended && toUpstream.pending.isEmpty && toClient.pending.isEmpty {
                finish()
            }
        case .errorOccurred:
            print("relay: \(stream.streamError.map { "\($0)" } ?? "error")")
            finish()
        }
    }

    func finish() {
        for stream in streams { stream.close() }
        keepAlive = nil
    }
}

let arguments = Array(CommandLine.arguments.dropFirst())
guard arguments.count >= 2 else {
    print("usage: CFSocketServerPort LISTEN-URL UPSTREAM-URL")
    exit(2)
}
do {
    let runLoop = SocketRunLoop.current
    let upstream = try Endpoint(url: arguments[1])
    let listener = try SocketListener(on: try Endpoint(url: arguments[0]), runLoop: runLoop) { input, output in
        _ = Relay(client: (input, output), upstream: upstream, runLoop: runLoop)
    }
    print("listening on \(listener.localEndpoint)")
    runLoop.run()
} catch {
    print("cfsocket-server: \(error)")
    exit(1)
}
