@_spi(Loop) import ConnectionCore
import POSIXSupport
import Synchronization

/// The send half of the adapter. A send first tries a non-blocking `send(2)` on the caller's thread (it never
/// waits there); whatever the kernel does not take at once goes to a writer thread of this connection, started
/// on first need, which blocks in `send(2)` until the peer makes room. Order is kept: while the writer thread
/// has work, every later send queues behind it. TCP sends made back to back on the connection's reader thread (a task
/// that prefers it) gather into one system call (``SendGathering``), written before the reader next waits.
final class BSDWriter: Sendable {
    private struct Job {
        var bytes: [UInt8]
        var offset: Int
        var address: SocketAddress?
        /// Instead of data: shutdown(SHUT_WR) once everything before it was sent.
        var shutdownWrite = false
        /// `nil` for the rest of gathered sends, which returned already.
        var completion: CheckedContinuation<Result<Void, ConnectionError>, Never>?
    }

    private let socket: BSDSocket
    private let lease: DescriptorLease
    private let name: String
    private struct State {
        var jobs: [Job] = []
        /// The writer thread is sending a job it took.
        var busy = false
        var threadStarted = false
        var stopped = false
        var outputClosed = false

        /// Nothing queued or being sent: a send may go straight to the kernel.
        var isIdle: Bool { jobs.isEmpty && !busy }
    }
    private let lock = ConditionLock(State())
    /// The connection's reader thread, where TCP sends gather (`nil`: a UDP listener's writer, nothing gathers).
    private let executor: ReaderExecutor?
    /// Touched under `lock` only, which stands for the write gate.
    private let gathering = SendGathering()

    init(socket: BSDSocket, lease: DescriptorLease, name: String, executor: ReaderExecutor? = nil) {
        self.socket = socket
        self.lease = lease
        self.name = name
        self.executor = socket.transport == .tcp ? executor : nil
    }

    /// Sends all of `bytes` (to `address` on an unconnected UDP socket).
    func send(_ bytes: [UInt8], to address: SocketAddress? = nil) async throws(ConnectionError) {
        guard let offset = try bytes.withBytes({ (raw) throws(ConnectionError) in try sendNow(raw, to: address) })
        else { return }
        try await enqueue { Job(bytes: bytes, offset: offset, address: address, completion: $0) }
    }

    /// Sends bytes the caller keeps until this returns: only what the kernel does not take at once is copied.
    func send(contentsOf bytes: UnsafeRawBufferPointer) async throws(ConnectionError) {
        guard let offset = try sendNow(bytes, to: nil) else { return }
        try await enqueue { Job(bytes: Array(bytes), offset: offset, address: nil, completion: $0) }
    }

    /// Sends datagrams (a connected UDP socket) on the caller's thread, as few system calls as the kernel
    /// allows (`Syscall.sendDatagrams`: sendmmsg, UDP GSO), never blocking; what the kernel does not take at
    /// once goes the way of every send (copied, to the writer thread).
    func send(batch datagrams: [UnsafeRawBufferPointer]) async throws(ConnectionError) {
        let sent = try lock.withLock { (state: inout State) throws(ConnectionError) -> Int in
            if state.stopped { throw .closed() }
            guard state.isIdle else { return 0 }
            let result = try socket.withDescriptor { (fd) throws(ConnectionError) in
                try Syscall.sendDatagrams(fd, datagrams, dontWait: true)
            }
            switch result {
            case .processed(let count): return count
            case .wouldBlock: return 0
            }
        }
        for bytes in datagrams[sent...] { try await send(contentsOf: bytes) }
    }

    /// The fast path, on the caller's thread, never blocking (MSG_DONTWAIT): `nil` when everything went, else
    /// the offset from which the writer thread must go on (0 when something is queued before it).
    private func sendNow(_ bytes: UnsafeRawBufferPointer, to address: SocketAddress?) throws(ConnectionError) -> Int? {
        let datagram = socket.transport == .udp
        return try lock.withLock { (state: inout State) throws(ConnectionError) -> Int? in
            if state.stopped { throw .closed() }
            if state.outputClosed { throw .closed("the output was closed (half-close)") }
            if let executor {
                if executor.isCurrent, state.isIdle {
                    let turn = executor.turn
                    var offer = gathering.offer(bytes, turn: turn)
                    if case .full = offer {
                        try writeGathered(&state)
                        offer = state.isIdle ? gathering.offer(bytes, turn: turn) : .direct
                    }
                    if case .gathered(let askFlush) = offer {
                        if askFlush {
                            executor.beforeSleep { [self] in lock.withLock { writeGatheredBeforeSleep(&$0) } }
                        }
                        return nil
                    }
                } else {
                    try writeGathered(&state)
                }
            }
            guard state.isIdle else { return 0 }
            let result = try socket.withDescriptor { (fd) throws(ConnectionError) in
                if let address {
                    try Syscall.sendTo(fd, bytes, to: address, dontWait: true)
                } else {
                    try Syscall.send(fd, bytes, dontWait: true)
                }
            }
            switch result {
            case .processed(let count) where count == bytes.count || datagram: return nil
            case .processed(let count): return count
            case .wouldBlock: return 0
            }
        }
    }

    /// Under the lock, TCP: what gathered, written now (what the socket does not take goes to the writer thread,
    /// ahead of anything queued after this).
    private func writeGathered(_ state: inout State) throws(ConnectionError) {
        if state.stopped { return }
        let offset = state.isIdle ? 0 : -1  // something queued already: all of it goes behind
        guard
            let rest = try gathering.take(
                writeNow: { (bytes) throws(ConnectionError) in
                    offset < 0 ? 0 : try socket.sendAvailable(bytes)
                }, keepBuffer: true)
        else { return }
        if let error = appendLocked(&state, Job(bytes: rest, offset: 0, address: nil, completion: nil)) { throw error }
    }

    /// Under the lock, on the reader thread about to wait: as ``writeGathered(_:)``, the buffer let go. A failure
    /// drops the bytes: the socket has failed, and the connection's next call meets its error.
    private func writeGatheredBeforeSleep(_ state: inout State) {
        if state.stopped { return }
        let idle = state.isIdle
        let rest = try? gathering.takeBeforeSleep { [socket] (bytes) throws(ConnectionError) in
            idle ? try socket.sendAvailable(bytes) : 0
        }
        if let rest { _ = appendLocked(&state, Job(bytes: rest, offset: 0, address: nil, completion: nil)) }
    }

    /// A receive was called: the next send answers it and goes at once (``SendGathering/noteReceive()``).
    func noteReceive() { gathering.noteReceive() }

    /// An abort: what gathered is dropped with the rest of what is unsent.
    func discardGathered() { gathering.discard() }

    /// Half-close, in order: shutdown(SHUT_WR) after every send before it; later sends throw `.closed`.
    func shutdownOutput() async throws(ConnectionError) {
        let immediate: Bool = try lock.withLock { (state: inout State) throws(ConnectionError) -> Bool in
            if state.stopped { throw .closed() }
            if state.outputClosed { return false }
            try writeGathered(&state)
            state.outputClosed = true
            if state.isIdle {
                try socket.shutdown(.write)
                return false
            }
            return true
        }
        guard immediate else { return }
        try await enqueue { Job(bytes: [], offset: 0, address: nil, shutdownWrite: true, completion: $0) }
    }

    private func enqueue(
        _ makeJob: (CheckedContinuation<Result<Void, ConnectionError>, Never>) -> Job
    )
        async throws(ConnectionError)
    {
        let result = await withCheckedContinuation { continuation in
            let rejected: ConnectionError? = lock.withLock { state in
                if state.stopped { return .closed() }
                return appendLocked(&state, makeJob(continuation))
            }
            if let rejected { continuation.resume(returning: .failure(rejected)) }
        }
        try result.get()
    }

    /// Under the lock, not stopped: queues `job` for the writer thread, starting it on first need.
    private func appendLocked(_ state: inout State, _ job: Job) -> ConnectionError? {
        state.jobs.append(job)
        if !state.threadStarted {
            guard lease.retain() else {
                state.jobs.removeLast()
                return .closed()
            }
            // No thread left (a thread per connection at the system's limit): this send fails with that error, and
            // since part of it may be on the wire already, the socket is shut down both ways, so neither end reads a
            // stream with a hole in it (the reader sees the end; the peer too).
            if let error = PosixThread.trySpawn(name: name, { self.run() }) {
                state.jobs.removeLast()
                state.stopped = true
                try? socket.shutdown(.both)
                lease.release()
                return error
            }
            state.threadStarted = true
        } else {
            lock.signal()
        }
        return nil
    }

    /// Fails queued sends with `.closed` and lets the writer thread end. A send blocked in the kernel is woken
    /// by the owner's `shutdown(2)`.
    func stop() {
        let failed: [Job] = lock.withLock { state in
            // Sends that returned and gathered go first (what the socket takes now), as before the reader's next
            // wait; a rest is dropped with the queued sends.
            if state.isIdle {
                _ = try? gathering.take(
                    writeNow: { [socket] (bytes) throws(ConnectionError) in try socket.sendAvailable(bytes) },
                    keepBuffer: false)
            }
            state.stopped = true
            let failed = state.jobs
            state.jobs.removeAll()
            lock.broadcast()
            return failed
        }
        for job in failed { job.completion?.resume(returning: .failure(.closed())) }
    }

    private func run() {
        defer { lease.release() }
        while true {
            let next: Job? = lock.withLock(waitingUntil: { !$0.jobs.isEmpty || $0.stopped }) { state in
                if state.stopped { return nil }
                state.busy = true
                return state.jobs.removeFirst()
            }
            guard var job = next else { return }
            let outcome: Result<Void, ConnectionError>
            do throws(ConnectionError) {
                if job.shutdownWrite {
                    try socket.shutdown(.write)
                    lock.withLock { $0.busy = false }
                    job.completion?.resume(returning: .success(()))
                    continue
                }
                try job.bytes.withBytes { (buffer) throws(ConnectionError) in
                    repeat {
                        let rest = UnsafeRawBufferPointer(rebasing: buffer[job.offset...])
                        let result = try socket.withDescriptor { [address = job.address] (fd) throws(ConnectionError) in
                            if let address {
                                try Syscall.sendTo(fd, rest, to: address)
                            } else {
                                try Syscall.send(fd, rest)
                            }
                        }
                        guard case .processed(let count) = result else { continue }
                        if socket.transport == .udp { job.offset = buffer.count + 1; break }
                        job.offset += count
                    } while job.offset < buffer.count
                }
                outcome = .success(())
            } catch {
                outcome = .failure(lock.withLock { $0.stopped } ? .closed() : error)
            }
            lock.withLock { $0.busy = false }
            job.completion?.resume(returning: outcome)
        }
    }
}
