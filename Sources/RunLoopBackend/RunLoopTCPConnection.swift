@_spi(Loop) import ConnectionCore
import POSIXSupport
import Synchronization

/// A TCP connection as a pair of delegate-driven streams. It is their delegate: `hasBytesAvailable` drains the
/// input into a bounded queue (and stops reading, so events stop, while the queue is full);
/// `hasSpaceAvailable` writes queued sends; `endEncountered` and `errorOccurred` end the queue.
final class RunLoopTCPConnection: Connection, SocketStreamDelegate, Sendable {
    let transport = Transport.tcp
    let options: ConnectionOptions
    let runLoop: SocketRunLoop
    private let inbox: ReceiveQueue<[UInt8]>
    /// Open, half-closed, closing, closed: ConnectionCore's one lifecycle.
    private let life = SharedLifecycle()
    private let endpoints = Guarded(Endpoints.unknown)
    /// Where the endpoints are, by reference: an accepted connection's local endpoint is its listener's (one object
    /// for all of them) and its remote one its stream pair's; a connected one's are found once it is open. Two
    /// endpoints by value would be 96 bytes of every idle connection (docs/benchmarks.md, memory per connection).
    private enum Endpoints: Sendable {
        case unknown
        case accepted(local: SharedValues<Endpoint>, pair: StreamPairCore)
        case connected(local: SharedValues<Endpoint>, remote: SharedValues<Endpoint>)
    }
    private typealias Completion = CheckedContinuation<Result<Void, ConnectionError>, Never>
    /// What only the run loop's thread touches.
    private struct LoopState {
        var input: SocketInputStream?
        var output: SocketOutputStream?
        var writes: [(bytes: [UInt8], offset: Int, done: Completion)] = []
        /// A half-close waiting for the writes before it.
        var shutdownAfterWrites: Completion?
        var opened: Completion?
        var openCount = 0
        var timer: RunLoopTimer?
    }
    private let state: LoopConfined<LoopState>
    /// One send at a time, each until the socket has taken all of it: a send from off the run loop writes on its
    /// own thread, and what the socket does not take then must be queued on the run loop before a later send's
    /// bytes.
    private let writes = WriteThrough()
    /// The output stream, for writes from other threads (it refuses them once closed).
    private let outputForAnyThread = Guarded<SocketOutputStream?>(nil)

    init(runLoop: SocketRunLoop, options: ConnectionOptions) {
        self.runLoop = runLoop
        self.options = options
        state = LoopConfined(LoopState(), on: runLoop.loop.thread)
        inbox = .byteStream(capacity: options.receiveQueueLimit)
        inbox.setOnSpaceAvailable { [weak self] in
            guard let self else { return }
            runLoop.perform { self.drainInput() }
        }
    }

    /// Wraps an accepted pair (on the run loop thread) and opens it.
    convenience init(
        accepted input: SocketInputStream, _ output: SocketOutputStream, runLoop: SocketRunLoop,
        options: ConnectionOptions, local: SharedValues<Endpoint>
    ) {
        self.init(runLoop: runLoop, options: options)
        endpoints.withLock { $0 = .accepted(local: local, pair: input.core) }
        attach(input, output)
    }

    var localEndpoint: Endpoint {
        switch endpoints.withLock({ $0 }) {
        case .unknown: Endpoint(transport: .tcp, host: .ipv4("0.0.0.0"), port: 0)
        case .accepted(let local, _), .connected(let local, _): local.values
        }
    }
    var remoteEndpoint: Endpoint {
        switch endpoints.withLock({ $0 }) {
        case .unknown: Endpoint(transport: .tcp, host: .ipv4("0.0.0.0"), port: 0)
        case .accepted(_, let pair): pair.endpoint
        case .connected(_, let remote): remote.values
        }
    }
    var preferredExecutor: (any TaskExecutor)? { runLoop.loop }

    /// A send from off the run loop writes on its own thread when the socket has room (`writeFromAnyThread`).
    var sendsFromAnyThread: Bool { true }

    private func attach(_ input: SocketInputStream, _ output: SocketOutputStream) {
        state.withValue { state in
            state.input = input
            state.output = output
        }
        outputForAnyThread.withLock { $0 = output }
        input.delegate = self
        output.delegate = self
        input.core.delegateToleratesEmptyReads = true  // drainInput stops at a short or empty read
        input.schedule(in: runLoop)
        output.schedule(in: runLoop)
        input.open()
        output.open()
    }

    func connect(to endpoint: Endpoint) async throws(ConnectionError) {
        let options = options
        let result: Result<Void, ConnectionError> = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                runLoop.perform { [self] in
                    let (input, output) = getStreamsToHost(endpoint, options: options)
                    let timer = runLoop.schedule(after: options.connectTimeout) { [weak self] in
                        self?.failOpen(
                            ConnectionError(
                                .timedOut, "connect to \(endpoint) took longer than \(options.connectTimeout)"))
                    }
                    state.withValue { state in
                        state.opened = continuation
                        state.timer = timer
                    }
                    attach(input, output)
                }
            }
        } onCancel: {
            runLoop.perform { [weak self] in self?.failOpen(.cancelled("connect was cancelled")) }
        }
        try result.get()
    }

    private func failOpen(_ error: ConnectionError) {
        let taken = state.withValue { state -> (Completion, RunLoopTimer?, SocketInputStream?, SocketOutputStream?)? in
            guard let opened = state.opened else { return nil }
            state.opened = nil
            return (opened, state.timer, state.input, state.output)
        }
        guard let (opened, timer, input, output) = taken else { return }
        timer?.invalidate()
        input?.close()
        output?.close()
        inbox.close()
        // Never handed out: nothing else will close it.
        if life.beginCloseWithoutWaiting() { life.closeFinished() }
        opened.resume(returning: .failure(error))
    }

    // MARK: Delegate (run loop thread)

    func stream(_ stream: SocketStream, handle event: StreamEvent) {
        switch event {
        case .openCompleted:
            let opened = state.withValue { state -> (Completion, RunLoopTimer?)? in
                state.openCount += 1
                guard state.openCount == 2, let opened = state.opened else { return nil }
                state.opened = nil
                return (opened, state.timer)
            }
            if let (opened, timer) = opened {
                timer?.invalidate()
                if let (local, remote) = stream.core.addresses {
                    let known = Endpoints.connected(
                        local: SharedValues(local.endpoint(.tcp)), remote: SharedValues(remote.endpoint(.tcp)))
                    endpoints.withLock { $0 = known }
                }
                opened.resume(returning: .success(()))
            }
        case .hasBytesAvailable:
            drainInput()
        case .hasSpaceAvailable:
            flushWrites()
        case .endEncountered:
            inbox.finish(.finished)
        case .errorOccurred:
            let error = stream.streamError ?? ConnectionError(.system, "stream error")
            if state.withValue({ $0.opened != nil }) { return failOpen(error) }
            inbox.finish(.failed(error))
            failWrites(error)
        }
    }

    /// Reads while the queue has room and the socket had more than a buffer's worth. A short read means the
    /// socket is drained for now (a read that finds nothing re-arms `hasBytesAvailable` too), so there is no
    /// `hasBytesAvailable` query (FIONREAD) per read. Each read goes into the run loop thread's buffer
    /// (`ThreadReadBuffer`) and is copied out at once: an idle connection keeps no read buffer.
    private func drainInput() {
        guard let input = state.withValue({ $0.input }) else { return }
        let readBuffer = ThreadReadBuffer.take(options.readChunkSize)
        while inbox.hasSpace {
            let count = input.read(into: readBuffer)
            guard count > 0 else { break }
            inbox.push(
                [UInt8](UnsafeRawBufferPointer(rebasing: readBuffer[..<count])), sourceDrained: count < readBuffer.count
            )
            if count < readBuffer.count { break }
        }
    }

    /// Writes the queued sends in order; a write the stream does not take whole waits for `hasSpaceAvailable`.
    /// The stream is called outside the state's access: a failed write reports `errorOccurred` to this delegate
    /// at once.
    private func flushWrites() {
        guard let output = state.withValue({ $0.output }) else { return }
        while let (bytes, offset) = state.withValue({ $0.writes.first.map { ($0.bytes, $0.offset) } }) {
            let written = bytes.withUnsafeBytes { raw in output.write(UnsafeRawBufferPointer(rebasing: raw[offset...]))
            }
            if written < 0 {
                return failWrites(output.streamError ?? ConnectionError(.reset, "write failed"))
            }
            let done = state.withValue { state -> Completion? in
                guard !state.writes.isEmpty else { return nil }
                state.writes[0].offset += written
                guard state.writes[0].offset == state.writes[0].bytes.count else { return nil }
                return state.writes.removeFirst().done
            }
            guard let done else { return }  // wait for hasSpaceAvailable
            done.resume(returning: .success(()))
        }
        if let shutdown = state.withValue({ state in
            defer { state.shutdownAfterWrites = nil }
            return state.shutdownAfterWrites
        }) {
            output.close()  // FIN
            shutdown.resume(returning: .success(()))
        }
    }

    private func failWrites(_ error: ConnectionError) {
        let (pending, shutdown) = state.withValue { state in
            defer {
                state.writes.removeAll()
                state.shutdownAfterWrites = nil
            }
            return (state.writes, state.shutdownAfterWrites)
        }
        for write in pending { write.done.resume(returning: .failure(error)) }
        shutdown?.resume(returning: .failure(error))
    }

    /// On the run loop with nothing queued: the output to write to at once, if any.
    private func idleOutput() -> SocketOutputStream? {
        state.withValue { $0.writes.isEmpty && $0.shutdownAfterWrites == nil ? $0.output : nil }
    }

    // MARK: Connection

    func send(_ message: Message) async throws(ConnectionError) {
        if case .refuse(let error) = life.handle(.send) { throw error }
        let loop = runLoop.loop
        try await writes.send(
            message.bytes, turn: loop.inLoop ? loop.turn : nil, askFlush: askFlush, writeNow: writeNow, queue: write)
    }

    func send(contentsOf bytes: UnsafeRawBufferPointer) async throws(ConnectionError) {
        if case .refuse(let error) = life.handle(.send) { throw error }
        let loop = runLoop.loop
        try await writes.send(
            contentsOf: bytes, turn: loop.inLoop ? loop.turn : nil, askFlush: askFlush, writeNow: writeNow, queue: write
        )
    }

    /// Sends gathered in this turn of the run loop (`WriteThrough`): written before the loop next waits. What the
    /// socket does not take then waits for room as any send's rest does, the write gate held until it is written.
    private func askFlush() {
        runLoop.loop.beforeSleep { [self] in
            guard let rest = writes.writeGatheredNow(writeNow: writeNow) else { return }
            Task { [self] in
                try? await write(rest)
                writes.gate.leave()
            }
        }
    }

    /// Inside the write gate: what the socket takes at once, written on the calling thread. On the run loop's
    /// thread with nothing queued, the stream takes what it can; only the rest is copied and queued by
    /// `write(_:)`, with no suspension in between, so order is kept. A send that the socket takes whole makes no
    /// async call below the gate: `compare --scenarios pump-1400 --transports tcp` measured runloop at 0.66x the C
    /// floor's throughput when every send from the run loop's thread went through `write(_:)`, 0.71x without.
    private func writeNow(_ bytes: UnsafeRawBufferPointer) throws(ConnectionError) -> Int {
        guard runLoop.loop.inLoop, !bytes.isEmpty, let output = idleOutput() else {
            return try writeFromAnyThread(bytes)
        }
        let written = output.write(bytes)
        if written < 0 { throw output.streamError ?? ConnectionError(.reset, "write failed") }
        return written
    }

    /// Inside the write gate, off the run loop's thread: writes what the socket takes now on this thread
    /// (`SocketOutputStream.writeFromAnyThread`), so the bytes need no hand-over to the run loop. Returns the count
    /// (0 on the run loop's thread, or when the socket is full or closed). A failure is also the streams' error,
    /// as a failed write on the run loop makes it.
    private func writeFromAnyThread(_ bytes: UnsafeRawBufferPointer) throws(ConnectionError) -> Int {
        guard !runLoop.loop.inLoop, !bytes.isEmpty, let output = outputForAnyThread.withLock({ $0 }) else { return 0 }
        do throws(ConnectionError) {
            return try output.writeFromAnyThread(bytes)
        } catch {
            runLoop.perform { output.core.fail(error) }
            throw error
        }
    }

    /// Inside the write gate, with what ``writeNow(_:)`` did not take (`WriteThrough` calls it only then): returns
    /// once the socket has taken them all. On the run loop's thread (a task that prefers it) with nothing queued,
    /// they are queued at once, before this task suspends, for the `hasSpaceAvailable` that the stream's short write
    /// just asked for: writing again here would most often find the socket still full, one system call for nothing.
    /// Elsewhere they are queued on the run loop.
    private func write(_ bytes: [UInt8]) async throws(ConnectionError) {
        if runLoop.loop.inLoop, !bytes.isEmpty, idleOutput() != nil {
            let result: Result<Void, ConnectionError> = await withCheckedContinuation { continuation in
                state.withValue { $0.writes.append((bytes, 0, continuation)) }
            }
            return try result.get()
        }
        let result: Result<Void, ConnectionError> = await withCheckedContinuation { continuation in
            runLoop.perform { [self] in
                // Checked again on the loop: a close or a half-close may have come first.
                if case .refuse(let error) = life.handle(.send) {
                    return continuation.resume(returning: .failure(error))
                }
                let queued = state.withValue { state -> Int? in
                    guard state.output != nil else { return nil }
                    if bytes.isEmpty { return 0 }
                    state.writes.append((bytes, 0, continuation))
                    return state.writes.count
                }
                switch queued {
                case nil: continuation.resume(returning: .failure(.closed()))
                case 0?: continuation.resume(returning: .success(()))
                case 1?: flushWrites()
                default: break
                }
            }
        }
        try result.get()
    }

    func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        writes.gathering.noteReceive()
        guard runLoop.isCurrent else { return try await inbox.next(maximumLength: maximumLength).map(Message.init) }
        // On the run loop (a task that prefers it): read the stream here, as a delegate would, instead of waiting
        // for the loop's next hasBytesAvailable. An end or error found by the read reaches the queue through the
        // delegate before this returns.
        return try await inbox.next(maximumLength: maximumLength) { [self] in
            guard let input = state.withValue({ $0.input }) else { return .nothing }
            let readBuffer = ThreadReadBuffer.take(options.readChunkSize)
            let count = input.read(into: readBuffer)
            guard count > 0 else { return .nothing }
            return .element(
                [UInt8](UnsafeRawBufferPointer(rebasing: readBuffer[..<count])), drained: count < readBuffer.count)
        }.map(Message.init)
    }

    func receive(into buffer: UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Received? {
        writes.gathering.noteReceive()
        guard runLoop.isCurrent else { return try await inbox.next(into: buffer).map { Received(count: $0) } }
        // As above, straight into the caller's buffer.
        return try await inbox.next(into: buffer) { [self] buffer in
            guard let input = state.withValue({ $0.input }) else { return .nothing }
            let count = input.read(into: buffer)
            return count > 0 ? .count(count) : .nothing
        }.map { Received(count: $0) }
    }

    func closeOutput() async throws(ConnectionError) {
        switch life.handle(.closeOutput) {
        case .refuse(let error): throw error
        case .shutdownOutput: break
        default: return  // already half-closed (or under way)
        }
        // After the send in progress, if any (one from another thread writes on its own thread).
        if !writes.gate.tryEnter() { await writes.gate.enter() }
        defer { writes.gate.leave() }
        try await writes.writeGathered(writeNow: writeNow, queue: write)
        let result: Result<Void, ConnectionError> = await withCheckedContinuation { continuation in
            runLoop.perform { [self] in
                // Checked again here, on the loop: a close() that started after the check above may have run
                // first and taken the output away, and then nothing would ever resume this half-close.
                let flushNow = state.withValue { state -> Bool? in
                    guard life.isOpen, state.output != nil else { return nil }
                    state.shutdownAfterWrites = continuation
                    return state.writes.isEmpty
                }
                switch flushNow {
                case nil: continuation.resume(returning: .failure(.closed()))
                case true?: flushWrites()
                case false?: break
                }
            }
        }
        try result.get()
    }

    func close() async {
        await life.close { [self] finished in
            runLoop.perform { [self] in
                // Sends that returned and gathered go first (what the socket takes now), as they would have before
                // the loop's next wait.
                if writes.writeGatheredNow(writeNow: writeNow) != nil { writes.gate.leave() }
                inbox.close()
                failWrites(.closed())
                let (input, output) = state.withValue { state in
                    defer {
                        state.input = nil
                        state.output = nil
                    }
                    return (state.input, state.output)
                }
                outputForAnyThread.withLock { $0 = nil }
                input?.close()
                output?.close()
                finished()
            }
        }
    }

    func abort() async {
        writes.gathering.discard()  // dropped with the rest of what is unsent
        if life.isOpen {
            await withCheckedContinuation { continuation in
                runLoop.perform { [self] in
                    state.withValue { $0.output }?.core.resetConnection()
                    continuation.resume()
                }
            }
        }
        await close()
    }
}
