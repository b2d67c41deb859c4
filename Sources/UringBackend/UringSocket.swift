// One piece, over 450 lines: connecting, receiving, the three ways a send goes (gathered in the send queue, from the
// caller's bytes, zero-copy) and closing all submit for one descriptor under one submission guard and lifecycle, and
// a close must wait for each of them; the send queue, the datagram send failures and the listener are files apart.
internal import CURing
@_spi(Loop) public import ConnectionCore
internal import Glibc
public import POSIXSupport
import Synchronization

/// The completion style: a connected socket whose every operation is submitted to the ring of a ``UringLoop`` and
/// awaited until the kernel reports it complete. There is no readiness and no retry: a receive is a recv(2) that
/// the kernel finishes when data comes, into the buffer the caller gave, and the task is resumed with how much.
///
/// ```swift
/// let socket = try await UringSocket.connect(to: try Endpoint(url: "tcp://127.0.0.1:9000"))
/// try await socket.send(Array("hello".utf8))          // one IORING_OP_SEND, completed
/// let reply = try await socket.receive()               // one IORING_OP_RECV, completed
/// await socket.close()                                 // in-flight operations cancelled, then close(2)
/// ```
///
/// Buffers: a buffer given to ``receive(into:)`` or ``send(contentsOf:)`` belongs to the kernel until the call
/// returns, and the call returns only once its operation has completed, also when the task is cancelled (the ring
/// is asked to cancel it, and the call waits for that to complete).
///
/// Cancellation: a cancelled receive that had read nothing throws `.cancelled` and the data goes to the next
/// receive; one whose recv completed first returns its data. A cancelled send that had sent part of its bytes
/// closes the output (TCP FIN), as on every backend.
public final class UringSocket: Sendable {
    /// `tcp` or `udp`.
    public let transport: Transport
    /// Options applied when connecting or accepting.
    public let options: ConnectionOptions
    /// The ring this socket's operations go to. It is a `TaskExecutor`: a task that prefers it submits with no
    /// hand-over and is resumed on the ring's thread.
    public let loop: UringLoop
    /// This end's address.
    public let localEndpoint: Endpoint
    /// The peer's address.
    public let remoteEndpoint: Endpoint

    /// Closes itself once its last owner is gone: this socket, or its send queue while a batch is still on its
    /// way (so no number reused meanwhile gets that batch).
    private let descriptor: SocketDescriptor
    private let submissions = UringDescriptorGuard()
    private let lifecycle = SharedLifecycle()
    private let reads: ReceiveGate
    /// TCP: the last receive filled a whole read chunk, so more is likely waiting. A receive that filled a smaller
    /// length the caller asked for (`receive(exactly: 64)` in a round trip) says nothing of the next bytes: counted
    /// as full, every ping-pong round trip through `Connection` made a recv(2) that found nothing. Read and written
    /// inside the read gate only; atomic (relaxed) so that the compiler checks it rather than a comment.
    private let lastReceiveFull = Atomic<Bool>(false)
    private let writeGate = AsyncGate()
    /// UDP: what became of the datagrams sent without waiting.
    private let datagramFailures = UringSendFailures()
    /// TCP: where sends of up to ``sendQueueLimit`` bytes gather for the ring (nil on UDP: a datagram is sent
    /// on its own).
    private let sendQueue: UringSendQueue?
    /// TCP: a receive was called since the last send, so the next send is written at once even on the ring's
    /// thread: one send(2) now instead of a ring operation whose completion ends the next `io_uring_enter` early,
    /// before the reply it waits for (two enters a round trip). Sends back to back with no receive between them
    /// still gather in the send queue, one ring operation for the lot.
    private let receivedSinceSend = ReceiveMark()

    /// Resolves `endpoint` and connects to its addresses in order (IORING_OP_CONNECT, bounded by
    /// `options.connectTimeout` with a linked timeout).
    public static func connect(
        to endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(), loop given: UringLoop? = nil
    ) async throws(ConnectionError) -> UringSocket {
        let loop: UringLoop
        if let given { loop = given } else { loop = try UringLoop.shared() }
        let transport = endpoint.transport
        guard transport == .tcp || transport == .udp else {
            throw ConnectionError(
                .unsupported, "the uring backend provides tcp and udp; \(transport) is layered on top")
        }
        let addresses = try await Syscall.resolveAsync(endpoint)
        return try await Socket.connect(toFirstOf: addresses, endpoint: endpoint, options: options) {
            (address, deadline) async throws(ConnectionError) -> UringSocket in
            let socket = try Socket.connectingSocket(for: address, transport: transport, options: options)
            do throws(ConnectionError) {
                // Blocking, as the ring expects: it waits in the kernel, never returns EAGAIN.
                try socket.withDescriptor { (fd) throws(ConnectionError) in try Syscall.setNonBlocking(fd, false) }
                if transport == .udp {
                    _ = try socket.withDescriptor { (fd) throws(ConnectionError) in try Syscall.connect(fd, to: address)
                    }
                } else {
                    let storage = UnsafeMutableRawPointer.allocate(
                        byteCount: MemoryLayout<sockaddr_storage>.size, alignment: 8)
                    defer { storage.deallocate() }
                    let length = address.withSockAddr { pointer, length in
                        storage.copyMemory(from: pointer, byteCount: Int(length))
                        return UInt32(length)
                    }
                    let result = try await socket.withDescriptorAsync { (fd) async throws(ConnectionError) in
                        await loop.run(
                            .connect(fd: fd.number, address: UInt(bitPattern: storage), length: length),
                            timeout: Socket.timeLeft(until: deadline))
                    }
                    if result == -ECANCELED {
                        throw Task.isCancelled
                            ? .cancelled("connect to \(endpoint) was cancelled")
                            : ConnectionError(
                                .timedOut, "connect to \(endpoint) (\(address)) took longer than the timeout")
                    }
                    if result < 0 { throw .errno(-result, "connect to \(endpoint) (\(address))") }
                }
                let (local, remote) = try socket.withDescriptor { (fd) throws(ConnectionError) in
                    (try Syscall.localAddress(fd).endpoint(transport), try Syscall.peerAddress(fd).endpoint(transport))
                }
                return UringSocket(
                    adopting: socket, transport: transport, local: local, remote: remote, options: options, loop: loop)
            } catch {
                socket.close()
                throw error
            }
        }
    }

    /// A socket around a connected, blocking descriptor (accepted connections). It owns `descriptor` from here.
    init(
        adopting descriptor: SocketDescriptor, transport: Transport, local: Endpoint, remote: Endpoint,
        options: ConnectionOptions, loop: UringLoop
    ) {
        self.descriptor = descriptor
        self.transport = transport
        self.localEndpoint = local
        self.remoteEndpoint = remote
        self.options = options
        self.loop = loop
        sendQueue = transport == .tcp ? UringSendQueue(loop: loop, descriptor: descriptor) : nil
        reads = ReceiveGate(transport: transport, options: options)
    }

    /// TCP: the most bytes that gather in the send queue before a send waits; a larger send goes from the caller's
    /// bytes once the queue is empty.
    public static var sendQueueLimit: Int { UringSendQueue.limit }

    /// TCP: bytes that sends handed over and the kernel has not taken yet (as a browser WebSocket's
    /// `bufferedAmount`); 0 once they all went, on UDP, and after the queue failed.
    public var bufferedAmount: Int { sendQueue?.buffered ?? 0 }

    /// Runs `body` with the descriptor, which stays this socket's until `body` returns (for a socket option or a
    /// look with `poll` of your own); `.closed` after ``close()``.
    public func withDescriptor<R>(
        _ body: (borrowing BorrowedDescriptor) throws(ConnectionError) -> R
    ) throws(ConnectionError) -> R {
        try descriptor.withDescriptor(body)
    }

    /// As ``withDescriptor(_:)``, for a body that awaits (ring operations of your own on the number: the native
    /// style's); ``close()`` waits for it to return.
    public func withDescriptorAsync<R>(
        _ body: (borrowing BorrowedDescriptor) async throws(ConnectionError) -> R
    ) async throws(ConnectionError) -> R {
        try await descriptor.withDescriptorAsync(body)
    }

    /// Inside a gate, the socket open: `body` with the descriptor borrowed until it returns. A ring operation that
    /// names the number holds it until the operation completed; ``close()`` cancels those before it closes.
    private func withOpenDescriptor<R>(
        _ body: (borrowing BorrowedDescriptor) async throws(ConnectionError) -> R
    ) async throws(ConnectionError) -> R {
        guard lifecycle.isOpen else { throw .closed() }
        return try await descriptor.withDescriptorAsync(body)
    }

    // MARK: Receiving

    /// Receives what is available (TCP: at most `maximumLength` bytes; UDP: one datagram). `nil` once, when the
    /// peer finished sending (TCP).
    ///
    /// TCP, where the kernel has buffer rings (5.19): into a buffer the kernel picks from the ring's own set once
    /// data is there, copied out at the length that arrived (`UringLoop.receiveSelected`), so a socket waiting for
    /// data holds no read buffer.
    public func receive(maximumLength: Int = .max) async throws(ConnectionError) -> [UInt8]? {
        receivedSinceSend.note()
        guard transport == .tcp, loop.selectsStreamBuffers.load(ordering: .relaxed) else {
            return try await reads.receive(maximumLength: maximumLength, read: read(into:))
        }
        if !reads.gate.tryEnter() { await reads.gate.enter() }
        defer { reads.gate.leave() }
        try beginRead()
        return try await withOpenDescriptor { (fd) async throws(ConnectionError) in
            let length = min(max(1, maximumLength), options.readChunkSize)
            if lastReceiveFull.load(ordering: .relaxed), let bytes = try readWaiting(fd, length: length) {
                return bytes
            }
            switch await loop.receiveSelected(fd: fd, length: length, guardedBy: submissions) {
            case .bytes(let bytes):
                lastReceiveFull.store(bytes.count == options.readChunkSize, ordering: .relaxed)
                return bytes
            case .result(let result):
                guard try endRead(result, capacity: length) == nil else {
                    throw ConnectionError(.system, "a receive completed with bytes but no buffer")
                }
                return nil
            }
        }
    }

    /// Receives into the caller's buffer, which the kernel writes directly (TCP: what is available, at most
    /// `buffer.count` bytes; UDP: one datagram, `.messageTooLarge` when it did not fit). `nil` once at the end.
    public func receive(into buffer: UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Int? {
        receivedSinceSend.note()
        return try await reads.receive(into: buffer, read: read(into:))
    }

    /// Inside the read gate: one IORING_OP_RECV (with MSG_TRUNC on UDP, so a datagram's real length comes back).
    private func read(into buffer: UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Int? {
        try beginRead()
        let result = try await withOpenDescriptor { (fd) async throws(ConnectionError) in
            await loop.run(
                .receive(
                    fd: fd.number, buffer: UInt(bitPattern: buffer.baseAddress), length: buffer.count,
                    flags: transport == .udp ? Int32(MSG_TRUNC) : 0),
                guardedBy: submissions)
        }
        return try endRead(result, capacity: buffer.count)
    }

    /// Inside the read gate, after a receive that filled all it asked for (a bulk flow): what is already waiting,
    /// read at once with a non-blocking recv(2) into the thread's buffer, with no operation on the ring (`nil`:
    /// nothing was there). A tcp pump of 64 KiB writes into a uring sink went from 0.87x to 0.74x the C floor's
    /// throughput when every receive went through the ring's buffer selection.
    private func readWaiting(_ fd: borrowing BorrowedDescriptor, length: Int) throws(ConnectionError) -> [UInt8]?? {
        let buffer = ThreadReadBuffer.take(length)
        switch try Syscall.recv(fd, buffer, dontWait: true) {
        case .wouldBlock:
            lastReceiveFull.store(false, ordering: .relaxed)
            return nil
        case .processed(let count):
            lastReceiveFull.store(count == options.readChunkSize, ordering: .relaxed)
            if count == 0 { return .some(try endRead(0, capacity: length).map { _ in [] }) }
            return .some([UInt8](UnsafeRawBufferPointer(rebasing: buffer[..<count])))
        }
    }

    /// Before a receive, inside the read gate: throws when the socket closed or already reported its end.
    private func beginRead() throws(ConnectionError) {
        try checkUsable()
        if lifecycle.current.inputEnded { throw .closed("the end of the stream was already reported") }
        // A datagram sent without waiting failed (ECONNREFUSED, say, which the kernel reports once): what a
        // receive would have found.
        if transport == .udp, let failure = datagramFailures.take(for: nil) { throw failure }
    }

    /// A receive's result that is not bytes copied out: the count (at most `capacity`), `nil` at the end of the
    /// stream, or the failure.
    private func endRead(_ result: Int32, capacity: Int) throws(ConnectionError) -> Int? {
        if result < 0 { throw failure(result, "recv") }
        let count = Int(result)
        if count == 0 && transport == .tcp {
            // A reset the kernel gave one of the queue's sends, and no longer gives a receive: the stream ended
            // with that reset, not with a FIN.
            if let refusal = sendQueue?.refusal, refusal.kind == .reset { throw refusal }
            _ = lifecycle.handle(.peerEnded)
            return nil
        }
        if count > capacity {
            throw ConnectionError(.messageTooLarge, "a \(count)-byte datagram did not fit in \(capacity) bytes")
        }
        return count
    }

    // MARK: Sending

    /// Sends all of `bytes` (UDP: one datagram). TCP: up to ``sendQueueLimit`` bytes are copied into the
    /// socket's send queue and the call returns; the ring sends what gathered before it next enters the kernel.
    public func send(_ bytes: [UInt8]) async throws(ConnectionError) {
        if transport == .udp, bytes.count <= 65_507, writeGate.tryEnter() {
            // From the ring's thread, with no send ahead of it: sent at once, waiting for no completion
            // (`UringLoop.sendDatagram`); an earlier one's failure is thrown here or by the next receive.
            defer { writeGate.leave() }
            try ready()
            if let failure = datagramFailures.take(for: nil) { throw failure }
            return try await withOpenDescriptor { (fd) async throws(ConnectionError) in
                if loop.sendDatagram(bytes, to: nil, fd: fd, failures: datagramFailures, gate: submissions) { return }
                if try bytes.withBytes({ (raw) throws(ConnectionError) in try sendFromAnyThread(fd, raw) }) { return }
                try await Self.withStableCopy(of: bytes) { copy throws(ConnectionError) in
                    try await sendDirect(fd, copy, zeroCopy: false)
                }
            }
        }
        if let queue = sendQueue, bytes.count <= UringSendQueue.limit {
            if !writeGate.tryEnter() { await writeGate.enter() }
            defer { writeGate.leave() }
            try ready()
            let sent = sendsNow ? bytes.withUnsafeBytes { queue.sendNow($0) } : 0
            if sent == bytes.count { return }
            return try await enqueue(bytes.count - sent, into: queue) {
                bytes.withUnsafeBytes { queue.tryAppend(UnsafeRawBufferPointer(rebasing: $0[sent...])) }
            }
        }
        try await Self.withStableCopy(of: bytes) { copy throws(ConnectionError) in try await send(contentsOf: copy) }
    }

    /// TCP, inside the write gate: whether a send that fits the send queue tries send(2) on the calling thread
    /// first (``UringSendQueue/sendNow(_:)``): always off the ring's thread; on it, when a receive came before
    /// (``receivedSinceSend``).
    private var sendsNow: Bool {
        receivedSinceSend.take() || !loop.inLoop
    }

    /// Runs `body` with a copy of `bytes` that stays put until it returns (an array's storage may move or go once
    /// the caller's reference does, and the kernel reads a send's bytes after the submitting call returned).
    private static func withStableCopy(
        of bytes: [UInt8], _ body: (UnsafeRawBufferPointer) async throws(ConnectionError) -> Void
    ) async throws(ConnectionError) {
        let copy = UnsafeMutableRawBufferPointer.allocate(byteCount: max(1, bytes.count), alignment: 16)
        defer { copy.deallocate() }
        bytes.withUnsafeBytes { copy.copyMemory(from: $0) }
        try await body(UnsafeRawBufferPointer(rebasing: copy[..<bytes.count]))
    }

    /// Sends bytes the caller keeps until this returns. TCP: up to ``sendQueueLimit`` bytes are copied into
    /// the send queue, as ``send(_:)`` does; more go from where they lie (the kernel reads them there) once the
    /// queue has been sent. UDP: one datagram, from where it lies.
    public func send(contentsOf bytes: UnsafeRawBufferPointer) async throws(ConnectionError) {
        if !writeGate.tryEnter() { await writeGate.enter() }
        defer { writeGate.leave() }
        try ready()
        if let queue = sendQueue {
            if bytes.count <= UringSendQueue.limit {
                let sent = sendsNow ? queue.sendNow(bytes) : 0
                if sent == bytes.count { return }
                let rest = UnsafeRawBufferPointer(rebasing: bytes[sent...])
                return try await enqueue(rest.count, into: queue) { queue.tryAppend(rest) }
            }
            // Large: after what is queued, straight from the caller's bytes.
            try await queue.drain()
        }
        try await withOpenDescriptor { (fd) async throws(ConnectionError) in
            if transport == .udp, try sendFromAnyThread(fd, bytes) { return }
            try await sendDirect(fd, bytes, zeroCopy: transport == .tcp && bytes.count >= Self.zeroCopySendsFrom)
        }
    }

    /// TCP: sends all of `bytes` with zero copy (IORING_OP_SEND_ZC, Linux 6.0), after what the send queue holds:
    /// the kernel reads them from where they lie while it transmits and returns once it is done with them (over a
    /// real network, once the peer acknowledged them). Over loopback it paid at 128 and 256 KiB writes and cost at
    /// 1 MiB (docs/backends/uring.md). Throws `.unsupported` on UDP or on a kernel without it.
    public func send(zeroCopy bytes: UnsafeRawBufferPointer) async throws(ConnectionError) {
        guard transport == .tcp else { throw ConnectionError(.unsupported, "zero-copy sends are for tcp") }
        guard UringFeatures.kernelSendsZeroCopy else {
            throw ConnectionError(.unsupported, "this kernel has no IORING_OP_SEND_ZC (Linux 6.0)")
        }
        if !writeGate.tryEnter() { await writeGate.enter() }
        defer { writeGate.leave() }
        try ready()
        try await sendQueue?.drain()
        try await withOpenDescriptor { (fd) async throws(ConnectionError) in
            try await sendDirect(fd, bytes, zeroCopy: true)
        }
    }

    /// Whether a send from off the ring's thread makes its system call on the calling thread: a datagram
    /// (`sendFromAnyThread(_:_:)`), or TCP bytes up to the send queue's 64 KiB while the queue is empty
    /// (`UringSendQueue.sendNow`); what the socket does not take then goes through the ring.
    public var sendsFromAnyThread: Bool { true }

    /// UDP, inside the write gate, off the ring's thread: sends the datagram on the calling thread when the socket
    /// has room and no datagram the ring holds for room is ahead of it (`false`: the ring's way). A submission would
    /// wake the ring's thread and wait for its turn before the datagram left; the write gate keeps ``close()`` from
    /// closing the descriptor meanwhile.
    private func sendFromAnyThread(
        _ fd: borrowing BorrowedDescriptor, _ bytes: UnsafeRawBufferPointer
    ) throws(ConnectionError) -> Bool {
        guard !loop.inLoop, !datagramFailures.isWaitingForRoom else { return false }
        if case .processed = try Syscall.send(fd, bytes, dontWait: true) { return true }
        return false
    }

    /// Inside the write gate, with the send queue empty: all of `bytes` (UDP: one datagram), one send after another.
    private func sendDirect(
        _ fd: borrowing BorrowedDescriptor, _ bytes: UnsafeRawBufferPointer, zeroCopy: Bool
    ) async throws(ConnectionError) {
        let base = UInt(bitPattern: bytes.baseAddress)
        var offset = 0
        repeat {
            let address = base + UInt(offset)
            let length = bytes.count - offset
            let flags = Int32(MSG_NOSIGNAL)
            let result = await loop.run(
                zeroCopy
                    ? .sendZeroCopy(fd: fd.number, buffer: address, length: length, flags: flags)
                    : .send(fd: fd.number, buffer: address, length: length, flags: flags),
                guardedBy: submissions)
            if result < 0 {
                let error = failure(result, "send")
                if error.kind == .cancelled && offset > 0 { endOutputAfterPartialSend(fd) }
                throw error
            }
            if transport == .udp { return }
            offset += Int(result)
            if offset < bytes.count && Task.isCancelled {
                endOutputAfterPartialSend(fd)
                throw .cancelled("a send was cancelled after \(offset) of \(bytes.count) bytes")
            }
        } while offset < bytes.count
    }

    /// Inside the write gate: appends `count` bytes with `append` (the queue copies them), waiting for room while
    /// the queue is full.
    private func enqueue(
        _ count: Int, into queue: UringSendQueue, _ append: () -> UringSendQueue.Appended
    ) async throws(ConnectionError) {
        while true {
            switch append() {
            case .appended: return
            case .failed(let error): throw error
            case .full: await queue.waitForRoom(count)
            }
        }
    }

    /// Inside the write gate: throws unless the socket may still send.
    private func ready() throws(ConnectionError) {
        try checkUsable()
        if case .refuse(let error) = lifecycle.handle(.send) { throw error }
    }

    /// Sends datagrams (UDP) or chunks (TCP) in order: every send of the batch is submitted in the same turn of the
    /// ring, one `io_uring_enter` for all of them.
    public func send(batch: [UnsafeRawBufferPointer]) async throws(ConnectionError) {
        guard transport == .udp else {
            for bytes in batch { try await send(contentsOf: bytes) }
            return
        }
        if !writeGate.tryEnter() { await writeGate.enter() }
        defer { writeGate.leave() }
        try ready()
        try await withOpenDescriptor { (fd) async throws(ConnectionError) in try await send(batch: batch, fd: fd) }
    }

    /// Inside the write gate, the descriptor borrowed: the datagrams of ``send(batch:)``.
    private func send(batch: [UnsafeRawBufferPointer], fd: borrowing BorrowedDescriptor) async throws(ConnectionError) {
        // Runs of equal-sized datagrams (the last may be shorter) go as one segmented sendmsg (UDP GSO), as the
        // other backends' sendmmsg path sends them; the rest one send each. All in one turn of the ring.
        var operations: [UringOperation] = []
        var runs: [(first: Int, count: Int, segments: OpaquePointer?)] = []
        var index = 0
        while index < batch.count {
            let size = batch[index].count
            var run = 1
            if Self.segmentation && size > 0 {
                var total = size
                while index + run < batch.count, run < 64, batch[index + run].count > 0,
                    batch[index + run].count <= size, total + batch[index + run].count <= 65_000
                {
                    total += batch[index + run].count
                    run += 1
                    if batch[index + run - 1].count < size { break }
                }
            }
            if run > 1, let segments = csur_segmented_create() {
                let bases = batch[index..<index + run].map { $0.baseAddress }
                let lengths = batch[index..<index + run].map(\.count)
                csur_segmented_prepare(segments, bases, lengths, UInt32(run), UInt16(size))
                operations.append(.sendSegmented(fd: fd.number, segments: UInt(bitPattern: Int(bitPattern: segments))))
                runs.append((index, run, segments))
            } else {
                run = 1
                operations.append(Self.sendOperation(fd.number, batch[index]))
                runs.append((index, 1, nil))
            }
            index += run
        }
        let results = await loop.run(batch: operations, guardedBy: submissions)
        for run in runs { if let segments = run.segments { csur_segmented_destroy(segments) } }
        for (position, result) in results.enumerated() where result < 0 {
            let run = runs[position]
            guard run.segments != nil, [EIO, EINVAL, ENOPROTOOPT, EOPNOTSUPP].contains(-result) else {
                throw failure(result, "send")
            }
            // This socket's route cannot segment: these datagrams one send each.
            let each = batch[run.first..<run.first + run.count].map { Self.sendOperation(fd.number, $0) }
            if let failed = await loop.run(batch: each, guardedBy: submissions).first(where: { $0 < 0 }) {
                throw failure(failed, "send")
            }
        }
    }

    /// The smallest send that goes with zero copy (`SOCKETSTYLES_URING_SENDZC`; by default none).
    private static let zeroCopySendsFrom = UringFeatures.current.zeroCopySendsFrom ?? .max

    /// Whether this kernel segments UDP sends (UDP_SEGMENT), probed once.
    private static let segmentation = Syscall.udpSegmentationAvailable

    private static func sendOperation(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> UringOperation {
        .send(fd: fd, buffer: UInt(bitPattern: bytes.baseAddress), length: bytes.count, flags: Int32(MSG_NOSIGNAL))
    }

    private func endOutputAfterPartialSend(_ fd: borrowing BorrowedDescriptor) {
        // Part of the message is on the wire: nothing can follow it sensibly.
        if case .shutdownOutput = lifecycle.handle(.closeOutput) { try? Syscall.shutdown(fd, .write) }
    }

    /// Half-close (TCP): FIN after everything sent so far.
    public func closeOutput() async throws(ConnectionError) {
        guard transport == .tcp else { throw ConnectionError(.unsupported, "half-close needs a TCP connection") }
        if !writeGate.tryEnter() { await writeGate.enter() }
        defer { writeGate.leave() }
        try checkUsable()
        // The FIN goes after every byte sent so far: the queue first (and a batch that failed, already or now, says
        // why here).
        if let queue = sendQueue {
            try await queue.drain()
            try checkUsable()
        }
        switch lifecycle.handle(.closeOutput) {
        case .shutdownOutput:
            try descriptor.withDescriptor { (fd) throws(ConnectionError) in try Syscall.shutdown(fd, .write) }
        case .refuse(let error): throw error
        default: return
        }
    }

    /// Throws `.closed` unless the socket is open.
    private func checkUsable() throws(ConnectionError) {
        guard !descriptor.isClosed, lifecycle.isOpen else { throw .closed() }
    }

    /// The error for a failed operation: a cancelled one is `.closed` when the socket was closed under it.
    private func failure(_ result: Int32, _ what: String) -> ConnectionError {
        if !lifecycle.isOpen { return .closed() }
        if result == -ECANCELED { return .cancelled("\(what) was cancelled") }
        return .errno(-result, what)
    }

    // MARK: Closing

    /// Closes with a reset: a TCP peer gets `.reset`, unsent data is discarded. Otherwise as ``close()``.
    public func abort() async {
        if lifecycle.isOpen, transport == .tcp, !descriptor.isClosed {
            sendQueue?.fail(.closed("the connection was reset before its queued bytes were sent"))
            descriptor.ifOpen { Syscall.resetConnection($0) }
        }
        await close()
    }

    /// How long ``close()`` waits for queued bytes (TCP) that the kernel does not take, before dropping them.
    public static let closeLinger: Duration = .seconds(2)

    /// Closes: queued bytes (TCP) are sent first (waiting at most ``closeLinger`` for a peer that does not read),
    /// then no operation is submitted any more, those in flight are cancelled (IORING_ASYNC_CANCEL_FD) and end with
    /// `.closed`, and the descriptor is closed once they have completed. Every caller returns after that.
    public func close() async {
        await lifecycle.close(running: { [self] () async in
            if let queue = sendQueue {
                if !queue.isDrained { await drainBeforeClosing(queue) }
                queue.fail(.closed())
            }
            submissions.close()
            loop.cancelAll(on: descriptor)
            // The queue's batch in flight, if any, has completed (cancelled) after this.
            try? await sendQueue?.drain()
            await reads.gate.enter()
            await writeGate.enter()
            descriptor.close()
            writeGate.leave()
            reads.gate.leave()
        })
    }

    /// Waits until the queue has been sent, or ``closeLinger`` passed (then its batch in flight is cancelled).
    private func drainBeforeClosing(_ queue: UringSendQueue) async {
        await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                try? await queue.drain()
                return true
            }
            group.addTask { [loop] in
                _ = await loop.run(.sleep, timeout: Self.closeLinger)
                return false
            }
            if await group.next() == false {
                queue.fail(.closed("close() dropped bytes the peer did not take within \(Self.closeLinger)"))
                loop.cancelAll(on: descriptor)
            }
            group.cancelAll()
        }
    }
}
