import ConnectionTestKit
import POSIXSupport
import RunLoopBackend
import SocketStyles
import Synchronization
import Testing

/// The Stream-delegate read loop as Darwin code writes it (the seeds' `case .hasBytesAvailable: while
/// stream.hasBytesAvailable { read }`, then wait for `.endEncountered`), run against every backend's server with
/// the peer's FIN right behind its reply. A `.hasBytesAvailable` the property does not back would leave that loop
/// reading nothing, and the end would never come.
@Suite("Stream delegates: the Darwin read loop", .timeLimit(.minutes(20)))
struct StreamReadLoopTests {
    /// A request/response client in the Darwin style: writes its request when there is space, closes its output
    /// at once (the request is whole), reads while bytes are available, and is done at `.endEncountered`.
    /// Run-loop thread only.
    final class DarwinClient: SocketStreamDelegate, @unchecked Sendable {
        let request: [UInt8]
        let input: SocketInputStream
        let output: SocketOutputStream
        private var received: [UInt8] = []
        private var sent = false
        private var finished = false
        private var deliveredWithNothing = 0
        /// What happened, for the message of a run that hangs.
        private var log: [String] = []
        private let done: CheckedContinuation<Outcome, Never>

        enum Outcome: Sendable, Equatable {
            /// The reply, and how many `.hasBytesAvailable` events came while the property was false.
            case ended([UInt8], emptyEvents: Int)
            case failed(String)
            case noEnd([UInt8], events: [String])
        }

        init(
            to endpoint: Endpoint, request: [UInt8], runLoop: SocketRunLoop, done: CheckedContinuation<Outcome, Never>
        ) {
            self.request = request
            self.done = done
            (input, output) = getStreamsToHost(endpoint)
            input.delegate = self
            output.delegate = self
            input.schedule(in: runLoop)
            output.schedule(in: runLoop)
            input.open()
            output.open()
        }

        func stream(_ stream: SocketStream, handle event: StreamEvent) {
            log.append("\(stream === input ? "in" : "out").\(event)")
            switch event {
            case .openCompleted:
                break
            case .hasSpaceAvailable:
                guard stream === output, !sent else { return }
                sent = true
                let written = output.write(request)
                output.close()
                if written != request.count { finish(.failed("wrote \(written) of \(request.count) bytes")) }
            case .hasBytesAvailable:
                if !input.hasBytesAvailable { deliveredWithNothing += 1 }
                var buffer = [UInt8](repeating: 0, count: 4096)
                while input.hasBytesAvailable {
                    let count = buffer.withUnsafeMutableBytes { input.read(into: $0) }
                    if count <= 0 { break }
                    received += buffer[..<count]
                    log.append("read \(count)")
                }
            case .endEncountered:
                finish(.ended(received, emptyEvents: deliveredWithNothing))
            case .errorOccurred:
                finish(.failed(stream.streamError?.description ?? "error"))
            }
        }

        /// Ends the run (once) and closes both streams.
        func finish(_ outcome: Outcome) {
            guard !finished else { return }
            finished = true
            input.close()
            output.close()
            done.resume(returning: outcome)
        }

        /// Ends a run whose end never came.
        func giveUp() {
            log.append("hasBytesAvailable \(input.hasBytesAvailable), status \(input.streamStatus)")
            finish(.noEnd(received, events: log))
        }
    }

    /// Replies to each request, once the request has ended (the client's FIN), and closes right after the reply.
    static func serve(_ listener: any Listener, count: Int) async throws {
        for _ in 0..<count {
            let connection = try await listener.accept()
            var request: [UInt8] = []
            while let message = try await connection.receive(maximumLength: 65536) { request += message.bytes }
            try await connection.send(Message(Array("reply to ".utf8) + request))
            await connection.close()
        }
    }

    @Test("An early FIN: every run gets its whole reply and then .endEncountered", arguments: Backend.allCases)
    func earlyFINEndsTheLoop(_ server: Backend) async throws {
        try await SocketTest.run {
            let runs = 200
            let listener = try await server.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"))
            let serving = Task { try await Self.serve(listener, count: runs) }
            let runLoop = RunLoopBackend.shared.runLoop
            var outcomes: [DarwinClient.Outcome] = []
            for run in 0..<runs {
                let request = Array("request \(run)".utf8)
                let outcome = await withCheckedContinuation {
                    (done: CheckedContinuation<DarwinClient.Outcome, Never>) in
                    runLoop.perform { [endpoint = listener.localEndpoint] in
                        let client = DarwinClient(to: endpoint, request: request, runLoop: runLoop, done: done)
                        // A bound on the wait, not a sleep: a run whose end does not come in 2 s is counted as hung.
                        _ = runLoop.schedule(after: .seconds(2)) { client.giveUp() }
                    }
                }
                outcomes.append(outcome)
            }
            try await serving.value
            await listener.close()
            let hung = outcomes.filter { if case .noEnd = $0 { true } else { false } }.count
            #expect(hung == 0, "\(hung) of \(runs) runs never saw .endEncountered (server \(server))")
            for (run, outcome) in outcomes.enumerated() {
                #expect(outcome == .ended(Array("reply to request \(run)".utf8), emptyEvents: 0), "run \(run)")
            }
        }
    }
}
