// Stream delegates (Stream.getStreamsToHost / CFStreamCreatePairWithSocketToHost + StreamDelegate), ported
// (docs/porting-from-apple.md). The Darwin code this replaces, as the seed apps write it:
//
//     Stream.getStreamsToHost(withName: host, port: port, inputStream: &input, outputStream: &output)
//     input.delegate = self; input.schedule(in: .current, forMode: .default); input.open()   // output alike
//     func stream(_ stream: Stream, handle event: Stream.Event) {
//         switch event {
//         case .hasBytesAvailable: while input.hasBytesAvailable { input.read(&buffer, maxLength: 4096) }
//         case .endEncountered: ...
//
// The same delegate, the same read loop, on SocketRunLoop (Foundation's RunLoop on Linux cannot serve sockets).
// It writes --bytes bytes, closes its output (the request is complete), reads the echo until endEncountered,
// and checks every byte; exits non-zero otherwise. Against any TCP echo server, or through CFSocketServerPort.
//
//     swift run sockbench serve tcp://127.0.0.1:9000 --backend uv &
//     swift run StreamDelegatePort tcp://127.0.0.1:9000 --bytes 100000
import Glibc
import SocketStyles

final class RequestClient: SocketStreamDelegate {
    let input: SocketInputStream
    let output: SocketOutputStream
    let request: [UInt8]
    var written = 0
    var reply: [UInt8] = []
    var outcome: String?

    init(_ endpoint: Endpoint, bytes: Int, on runLoop: SocketRunLoop) {
        request = (0..<bytes).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }
        (input, output) = getStreamsToHost(endpoint)
        for stream in [input, output] as [SocketStream] {
            stream.delegate = self  // held weakly, as on Darwin
            stream.schedule(in: runLoop)
            stream.open()
        }
    }

    func stream(_ stream: SocketStream, handle event: StreamEvent) {
        switch event {
        case .openCompleted:
            print("\(stream === input ? "input" : "output") openCompleted")
        case .hasSpaceAvailable where stream === output && written < request.count:
            // Writes may be partial; the event comes again once the socket has room.
            let count = request[written...].withUnsafeBytes { output.write($0) }
            if count > 0 { written += count }
            if written == request.count {
                output.close()  // half-close: the server sees the end of the request
                print("request written (\(written) bytes), output closed")
            }
        case .hasBytesAvailable:
            // The seeds' loop: read while the property says so. endEncountered follows once all is read.
            var buffer = [UInt8](repeating: 0, count: 4096)
            while input.hasBytesAvailable {
                let count = buffer.withUnsafeMutableBytes { input.read(into: $0) }
                if count > 0 { reply += buffer[..<count] }
            }
        case .endEncountered:
            finish(reply == request ? nil : "the echo differs (\(reply.count) of \(request.count) bytes)")
        case .errorOccurred:
            finish("\(stream.streamError.map { "\($0)" } ?? "error")")
        default:
            break
        }
    }

    func finish(_ failure: String?) {
        input.close()
        output.close()
        outcome = failure ?? "ok: \(reply.count) bytes echoed, then endEncountered"
        SocketRunLoop.current.stop()
    }
}

let arguments = Array(CommandLine.arguments.dropFirst())
let url = arguments.first { !$0.hasPrefix("--") } ?? "tcp://127.0.0.1:9000"
let bytes = arguments.firstIndex(of: "--bytes").flatMap { Int(arguments[min($0 + 1, arguments.count - 1)]) } ?? 65_536
do {
    let runLoop = SocketRunLoop.current
    let client = RequestClient(try Endpoint(url: url), bytes: bytes, on: runLoop)
    runLoop.run(for: .seconds(30))
    let outcome = client.outcome ?? "no endEncountered within 30 s (\(client.reply.count) bytes read)"
    print(outcome)
    exit(outcome.hasPrefix("ok") ? 0 : 1)
} catch {
    print("stream-delegate: \(error)")
    exit(1)
}
