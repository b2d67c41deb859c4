import ConnectionCore
import POSIXSupport
import SocketStyles
import Synchronization

/// A connection whose sends and receives a ``LessonTrace`` records; everything else is the wrapped one's.
final class TracedConnection: Connection {
    let base: any Connection
    let trace: LessonTrace
    let side: LessonEvent.Side
    let phase: Int
    let number: (@Sendable ([UInt8]) -> Int?)?
    let every: Int
    let kernel: LessonTrace.KernelSampling
    private let retransmitted = Atomic<UInt32>(0)
    /// Reads this end's TCP state for the picture's TCP graphs while the connection is open (TCP only).
    private let sampler: TCPSampler?

    init(
        _ base: any Connection, trace: LessonTrace, side: LessonEvent.Side, phase: Int,
        number: (@Sendable ([UInt8]) -> Int?)?, every: Int = 1, kernel: LessonTrace.KernelSampling = .never
    ) {
        self.base = base
        self.trace = trace
        self.side = side
        self.phase = phase
        self.number = number
        self.every = max(1, every)
        self.kernel = base.transport == .udp ? .never : kernel
        sampler = trace.startTCPSampling(base, phase: phase, side: side)
    }

    deinit {
        if let sampler { trace.closedTCPSampling(sampler) }
    }

    /// Records the kernel's view of this connection when ``kernel`` asks for it after a send (or a receive).
    private func sampleKernel(afterSend: Bool) {
        if case .never = kernel { return }
        if case .afterSends = kernel, !afterSend { return }
        guard let view = Syscall.tcpView(local: base.localEndpoint, remote: base.remoteEndpoint) else { return }
        switch kernel {
        case .never: return
        case .afterSends:
            trace.kernel(phase, side, LessonTrace.describe(view))
        case .onRetransmissions:
            let before = retransmitted.exchange(view.totalRetransmits, ordering: .relaxed)
            guard view.totalRetransmits > before else { return }
            trace.kernel(
                phase, side,
                "retransmitted \(view.totalRetransmits - before) (\(view.totalRetransmits) in all)"
                    + (view.backoff > 0 ? ", RTO backoff \(view.backoff)" : ""))
        }
    }

    /// Records a send, or counts it when it is not among those drawn.
    private func recordSend(_ bytes: [UInt8]) {
        let number = number?(bytes)
        if every > 1, let number, number % every != 0 {
            trace.skipped(phase)
            return
        }
        trace.sent(phase, side, bytes, number: number)
    }

    private func recordReceive(_ bytes: [UInt8]) {
        let number = number?(bytes)
        if every > 1, let number, number % every != 0 {
            trace.skipped(phase)
            return
        }
        trace.received(phase, side, bytes, transport: transport, number: number)
    }

    var transport: Transport { base.transport }
    var localEndpoint: Endpoint { base.localEndpoint }
    var remoteEndpoint: Endpoint { base.remoteEndpoint }
    var options: ConnectionOptions { base.options }
    var preferredExecutor: (any TaskExecutor)? { base.preferredExecutor }
    var sendsFromAnyThread: Bool { base.sendsFromAnyThread }

    func send(_ message: Message) async throws(ConnectionError) {
        // Recorded before the send: a send that waits for room (flow control) shows when it was asked for.
        recordSend(message.bytes)
        try await base.send(message)
        sampleKernel(afterSend: true)
    }

    func send(contentsOf bytes: UnsafeRawBufferPointer) async throws(ConnectionError) {
        try await send(Message(Array(bytes)))
    }

    func send(batch: [UnsafeRawBufferPointer]) async throws(ConnectionError) {
        for bytes in batch { recordSend(Array(bytes)) }
        try await base.send(batch: batch)
        sampleKernel(afterSend: true)
    }

    func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        guard let message = try await base.receive(maximumLength: maximumLength) else {
            trace.mark(phase, side, "end of stream")
            return nil
        }
        recordReceive(message.bytes)
        sampleKernel(afterSend: false)
        return message
    }

    func receive(into buffer: UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Received? {
        guard let received = try await base.receive(into: buffer) else {
            trace.mark(phase, side, "end of stream")
            return nil
        }
        recordReceive(Array(UnsafeRawBufferPointer(rebasing: buffer[..<received.count])))
        sampleKernel(afterSend: false)
        return received
    }

    func closeOutput() async throws(ConnectionError) {
        trace.mark(phase, side, "FIN (closeOutput)")
        try await base.closeOutput()
    }

    func close() async {
        sampler?.readNow()
        await base.close()
        if let sampler { trace.closedTCPSampling(sampler) }
    }

    func abort() async {
        await base.abort()
        if let sampler { trace.closedTCPSampling(sampler) }
    }
}

/// A listener whose accepted connections a ``LessonTrace`` records as the server's.
final class TracedListener: Listener {
    let base: any Listener
    let trace: LessonTrace
    let phase: Int
    let number: (@Sendable ([UInt8]) -> Int?)?

    init(_ base: any Listener, trace: LessonTrace, phase: Int, number: (@Sendable ([UInt8]) -> Int?)?) {
        self.base = base
        self.trace = trace
        self.phase = phase
        self.number = number
    }

    var transport: Transport { base.transport }
    var localEndpoint: Endpoint { base.localEndpoint }

    func accept() async throws(ConnectionError) -> any Connection {
        let connection = try await base.accept()
        trace.mark(phase, .server, "accepted")
        return trace.trace(connection, side: .server, phase: phase, number: number)
    }

    func close() async { await base.close() }
}
