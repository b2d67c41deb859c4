internal import CURing
@_spi(Loop) public import ConnectionCore
internal import Glibc
@_spi(Loop) package import POSIXSupport
import Synchronization

/// One operation for the ring: the fields of a submission queue entry the backend uses. Buffers and addresses are
/// carried as addresses (`UInt`), so a request can be handed to the loop thread from any thread; whoever makes
/// one keeps what they point at alive until ``UringLoop/run(_:timeout:guardedBy:)`` returns.
enum UringOperation: Sendable {
    /// recv(2) into `length` bytes at `buffer`.
    case receive(fd: Int32, buffer: UInt, length: Int, flags: Int32)
    /// send(2) of `length` bytes at `buffer`.
    case send(fd: Int32, buffer: UInt, length: Int, flags: Int32)
    /// send(2) with zero copy (IORING_OP_SEND_ZC): completes once the kernel is done with the buffer.
    case sendZeroCopy(fd: Int32, buffer: UInt, length: Int, flags: Int32)
    /// accept4(2); the peer's address is written at `address` (a `sockaddr_storage`), its length at `length`.
    case accept(fd: Int32, address: UInt, length: UInt)
    /// connect(2) to the `length`-byte address at `address`.
    case connect(fd: Int32, address: UInt, length: UInt32)
    /// recvmsg(2) with the `csur_message` at `message`.
    case receiveMessage(fd: Int32, message: UInt, flags: UInt32)
    /// sendmsg(2) with the `csur_message` at `message`.
    case sendMessage(fd: Int32, message: UInt, flags: UInt32)
    /// One sendmsg of datagrams the kernel cuts apart (UDP GSO), with the `csur_segmented` at `segments`.
    case sendSegmented(fd: Int32, segments: UInt)
    /// Completes after `after` (with -ETIME).
    case sleep

    var descriptor: Int32? {
        switch self {
        case .receive(let fd, _, _, _), .send(let fd, _, _, _), .sendZeroCopy(let fd, _, _, _), .accept(let fd, _, _),
            .connect(let fd, _, _),
            .receiveMessage(let fd, _, _), .sendMessage(let fd, _, _), .sendSegmented(let fd, _):
            return fd
        case .sleep: return nil
        }
    }
}

/// What a descriptor's owner closes: once ``close()`` has run, the loop submits no more operations on it (one
/// already queued for submission completes with `-ECANCELED`), so the owner can cancel what is in flight and know
/// nothing follows.
final class UringDescriptorGuard: Sendable {
    private let closed = Atomic<Bool>(false)

    var isClosed: Bool { closed.load(ordering: .acquiring) }

    func close() { closed.store(true, ordering: .releasing) }
}

/// What became of a UDP socket's datagrams sent without waiting (``UringLoop/sendDatagram(_:to:fd:failures:gate:)``):
/// the last failure, thrown by the next send to the same address (a UDP send reports what it knows then, as a
/// send into the kernel's buffer does), and whether one waits for room in the socket buffer (sends then wait too).
package final class UringSendFailures: Sendable {
    private struct State {
        /// `nil` address: a connected socket's peer.
        var failure: (address: SocketAddress?, code: Int32)?
        var waitingForRoom = 0
    }
    private let state = Guarded(State())

    package init() {}

    package var isWaitingForRoom: Bool { state.withLock { $0.waitingForRoom > 0 } }

    /// The failure of an earlier send to `address` (`nil`: a connected socket's), once.
    package func take(for address: SocketAddress?) -> ConnectionError? {
        state.withLock { state -> ConnectionError? in
            guard let failure = state.failure, failure.address == address else { return nil }
            state.failure = nil
            return .errno(-failure.code, address.map { "sendmsg to \($0)" } ?? "send")
        }
    }

    package func record(_ code: Int32, to address: SocketAddress?) {
        state.withLock { $0.failure = (address, code) }
    }

    package func waitForRoom() { state.withLock { $0.waitingForRoom += 1 } }

    package func roomCame(_ failure: (code: Int32, address: SocketAddress?)?) {
        state.withLock { state in
            state.waitingForRoom -= 1
            if let failure { state.failure = (failure.address, failure.code) }
        }
    }
}

/// The completion loop of the `uring` style: one thread that owns an io_uring instance, submits what its
/// connections ask for in batches (one `io_uring_enter` per turn of the loop, however many operations the turn
/// queued) and resumes each waiting task with its operation's result.
///
/// It is a `TaskExecutor`: a task that prefers it runs on the ring's thread, where its operations go straight into
/// the submission queue and its completions resume it with no hop to another thread. Work from other threads comes
/// through a `LoopWorkQueue` and wakes the ring by writing to an eventfd that a read on the ring waits for.
public final class UringLoop: TaskExecutor, Sendable {
    /// The process-wide ring, started at first use; `nil` with the reason when io_uring is unavailable here.
    private static let sharedLoop: Result<UringLoop, ConnectionError> = {
        do throws(ConnectionError) {
            return .success(try UringLoop(name: "uring-loop"))
        } catch {
            return .failure(error)
        }
    }()

    /// The shared ring, or the one-line reason io_uring cannot be used on this machine.
    public static func shared() throws(ConnectionError) -> UringLoop {
        try sharedLoop.get()
    }

    /// A name for the thread.
    public let name: String
    /// The set-up flags the kernel accepted (`IORING_SETUP_*`), for the report.
    public var setupFlags: UInt32 { flags.load(ordering: .relaxed) }
    private let flags = Atomic<UInt32>(0)
    private let wakeFD: Int32
    private let work: LoopWorkQueue
    private let confined: LoopConfined<Confined>

    private static let wakeToken: UInt64 = .max
    private static let ignoredToken: UInt64 = .max - 1

    private enum Slot {
        case free(next: Int)
        /// In flight; the task's continuation is attached right after submission, before any completion is read.
        /// `owned` is freed when the operation completes (a timer's timespec).
        case waiting(UnsafeContinuation<Int32, Never>?, owned: UnsafeMutableRawPointer?)
        /// One operation of a batch (``run(batch:guardedBy:)``).
        case member(UringBatch, position: Int)
        /// An operation of the ring's own style (``UringRing``): its completion handler.
        case callback((Int32) -> Void)
        /// A multishot operation: its handler gets every completion, the slot lives while IORING_CQE_F_MORE says
        /// more follow.
        case multishot((_ result: Int32, _ flags: UInt32) -> Void)
        /// A zero-copy send whose count came and whose notification (the buffer is free again) has not.
        case zeroCopySent(UnsafeContinuation<Int32, Never>?, result: Int32)
    }

    /// What only the ring's thread touches.
    private struct Confined {
        /// Made on the ring's thread: with IORING_SETUP_SINGLE_ISSUER only the thread that made a ring may enter it.
        var ring: OpaquePointer?
        let wakeBuffer: UnsafeMutablePointer<UInt64>
        var slots: [Slot] = []
        var generations: [UInt32] = []
        var firstFree = -1
        var jobExecutor: UnownedTaskExecutor?
        var nextBufferGroup: UInt16 = 0
        /// Whether an entry may post nothing when it succeeds (IOSQE_CQE_SKIP_SUCCESS, Linux 5.17).
        var skipsSuccess = false
        /// Whether a receive linked behind a send waits for data before its first try (IORING_RECVSEND_POLL_FIRST).
        var pollsFirst = false
    }

    /// Sets a ring up and starts its thread. Throws (one line, with the kernel's reason) when io_uring is
    /// unavailable: an old kernel, `kernel.io_uring_disabled`, or a seccomp filter that forbids it.
    public init(name: String, entries: UInt32 = 1024) throws(ConnectionError) {
        self.name = name
        let wakeFD = try Syscall.eventFD()
        self.wakeFD = wakeFD
        work = LoopWorkQueue(signal: { Syscall.eventFDSignal(wakeFD) })
        confined = LoopConfined(
            Confined(ring: nil, wakeBuffer: .allocate(capacity: 1)), on: work.thread,
            release: { $0.wakeBuffer.deallocate() })
        let failure = Atomic<Int32>(0)
        PosixThread.spawnAndWait(
            name: name,
            started: { [self] in
                work.bindToCurrentThread()
                var setup: UInt32 = 0
                var code: Int32 = 0
                let features = UringFeatures.current
                let ring = csur_create(
                    entries, features.submissionPollingIdle, features.submissionPollingCPU ?? -1, &setup, &code)
                confined.withValue {
                    $0.ring = ring
                    $0.skipsSuccess =
                        features.skipSuccess == .on && ring.map { csur_supports($0, "cqe_skip") != 0 } ?? false
                    $0.pollsFirst = features.pollFirst == .on
                }
                flags.store(setup, ordering: .relaxed)
                if ring == nil { failure.store(code, ordering: .relaxed) }
            }
        ) { [self] in
            if confined.withValue({ $0.ring }) != nil { runLoop() }
        }
        let code = failure.load(ordering: .relaxed)
        if code != 0 {
            Syscall.close(wakeFD)
            let error = ConnectionError.errno(code, "io_uring_setup")
            let hint =
                switch code {
                case EPERM: " (kernel.io_uring_disabled, or a seccomp filter, forbids it)"
                case ENOSYS: " (a kernel without io_uring)"
                default: ""
                }
            throw ConnectionError(error.kind, error.detail + hint, systemCode: error.systemCode)
        }
    }

    /// TaskExecutor: a job of a task that prefers the ring runs on its thread.
    public func enqueue(_ job: consuming ExecutorJob) {
        work.add(.job(UnownedJob(job)))
    }

    /// Runs `block` on the ring's thread (at once in order when called there).
    func perform(_ block: @escaping @Sendable () -> Void) {
        work.add(.block(block))
    }

    /// `true` on the ring's thread.
    var inLoop: Bool { work.isLoopThread }

    /// The ring's thread, for state only its completion handlers touch (`LoopConfined`).
    package var thread: LoopThread { work.thread }

    // MARK: Operations

    /// Runs one operation and returns its result: what the system call would return, or `-errno`. With `timeout`,
    /// the kernel cancels the operation when it has not completed by then (a linked timeout; the result is then
    /// `-ECANCELED`). Cancelling the calling task asks the ring to cancel the operation; the call still returns only
    /// once the operation has completed (with `-ECANCELED`, or its result when it finished first), so the memory
    /// it uses is never written after this returns. With `gate`, an operation not submitted before the gate closed
    /// is not submitted at all (`-ECANCELED`).
    func run(
        _ operation: UringOperation, timeout: Duration? = nil, guardedBy gate: UringDescriptorGuard? = nil
    ) async -> Int32 {
        if inLoop {
            guard let id = submit(operation, timeout: timeout, gate: gate) else { return -ECANCELED }
            return await withTaskCancellationHandler {
                await withUnsafeContinuation { continuation in attach(continuation, to: id) }
            } onCancel: {
                perform { [self] in cancel(id) }
            }
        }
        let token = CancelToken()
        return await withTaskCancellationHandler {
            await withUnsafeContinuation { continuation in
                perform { [self] in
                    guard let id = submit(operation, timeout: timeout, gate: gate) else {
                        continuation.resume(returning: -ECANCELED)
                        return
                    }
                    attach(continuation, to: id)
                    if !token.publish(id) { cancel(id) }
                }
            }
        } onCancel: {
            if let id = token.cancel() { perform { [self] in cancel(id) } }
        }
    }

    /// Runs operations submitted together (one `io_uring_enter` for all of them) and returns their results in
    /// order, once every one has completed. Meant for operations that complete at once (UDP sends): cancelling the
    /// task does not cancel them; closing their descriptor does.
    func run(batch operations: [UringOperation], guardedBy gate: UringDescriptorGuard? = nil) async -> [Int32] {
        if operations.isEmpty { return [] }
        return await withUnsafeContinuation { continuation in
            let submitAll: @Sendable () -> Void = { [self] in
                let batch = UringBatch(count: operations.count, continuation: continuation)
                for (position, operation) in operations.enumerated() {
                    if !submit(member: operation, of: batch, at: position, gate: gate) {
                        batch.complete(position, -ECANCELED)
                    }
                }
            }
            if inLoop { submitAll() } else { perform(submitAll) }
        }
    }

    /// Loop thread: one member of a batch into the submission queue. `false` when not submitted.
    private func submit(
        member operation: UringOperation, of batch: UringBatch, at position: Int, gate: UringDescriptorGuard?
    )
        -> Bool
    {
        if let gate, gate.isClosed { return false }
        return confined.withValue { confined -> Bool in
            let id = Self.allocate(&confined, owned: nil)
            confined.slots[Int(truncatingIfNeeded: id & 0xffff_ffff)] = .member(batch, position: position)
            let prepared: Int32
            switch operation {
            case .send(let fd, let buffer, let length, let flags):
                prepared = csur_prep_send(confined.ring!, id, fd, UnsafeRawPointer(bitPattern: buffer), length, flags)
            case .sendSegmented(let fd, let segments):
                prepared = csur_prep_send_segmented(confined.ring!, id, fd, OpaquePointer(bitPattern: segments))
            default:
                prepared = -EINVAL
            }
            if prepared != 0 {
                Self.release(&confined, id)
                return false
            }
            return true
        }
    }

    /// Cancels every operation in flight on `fd` (loop thread or not): each completes with `-ECANCELED`.
    func cancelAll(on fd: Int32) {
        let block: @Sendable () -> Void = { [self] in
            confined.withValue { confined in _ = csur_prep_cancel_fd(confined.ring!, Self.ignoredToken, fd) }
        }
        perform(block)
    }

    /// Loop thread: the SQE(s) of `operation`, with a slot for its completion. `nil` when the gate has closed or
    /// the ring refused an entry.
    private func submit(_ operation: UringOperation, timeout: Duration?, gate: UringDescriptorGuard?) -> UInt64? {
        if let gate, gate.isClosed { return nil }
        return confined.withValue { confined -> UInt64? in
            let ring = confined.ring!
            let needsTime = timeout != nil
            let time = needsTime ? UnsafeMutableRawPointer.allocate(byteCount: 16, alignment: 8) : nil
            let id = Self.allocate(&confined, owned: time)
            let nanoseconds: Int64 = timeout.map { Int64(clamping: $0.wholeNanoseconds) } ?? -1
            let prepared: Int32
            switch operation {
            case .receive(let fd, let buffer, let length, let flags):
                prepared = csur_prep_recv(ring, id, fd, UnsafeMutableRawPointer(bitPattern: buffer), length, flags)
            case .send(let fd, let buffer, let length, let flags):
                prepared = csur_prep_send(ring, id, fd, UnsafeRawPointer(bitPattern: buffer), length, flags)
            case .sendZeroCopy(let fd, let buffer, let length, let flags):
                prepared = csur_prep_send_zc(ring, id, fd, UnsafeRawPointer(bitPattern: buffer), length, flags)
            case .accept(let fd, let address, let length):
                prepared = csur_prep_accept(
                    ring, id, fd, UnsafeMutableRawPointer(bitPattern: address), UnsafeMutablePointer(bitPattern: length)
                )
            case .connect(let fd, let address, let length):
                prepared = csur_prep_connect(
                    ring, id, fd, UnsafeRawPointer(bitPattern: address), length, Int64(clamping: nanoseconds), time,
                    Self.ignoredToken)
            case .receiveMessage(let fd, let message, _):
                prepared = csur_prep_recvmsg(ring, id, fd, OpaquePointer(bitPattern: message))
            case .sendMessage(let fd, let message, let flags):
                prepared = csur_prep_sendmsg(ring, id, fd, OpaquePointer(bitPattern: message), Int32(bitPattern: flags))
            case .sendSegmented(let fd, let segments):
                prepared = csur_prep_send_segmented(ring, id, fd, OpaquePointer(bitPattern: segments))
            case .sleep:
                prepared = csur_prep_sleep(ring, id, Int64(clamping: max(0, nanoseconds)), time)
            }
            if prepared != 0 {
                Self.release(&confined, id)
                return nil
            }
            return id
        }
    }

    private static func allocate(_ confined: inout Confined, owned: UnsafeMutableRawPointer?) -> UInt64 {
        let index: Int
        if confined.firstFree >= 0 {
            index = confined.firstFree
            guard case .free(let next) = confined.slots[index] else { preconditionFailure("slot list corrupt") }
            confined.firstFree = next
            confined.slots[index] = .waiting(nil, owned: owned)
        } else {
            index = confined.slots.count
            confined.slots.append(.waiting(nil, owned: owned))
            confined.generations.append(0)
        }
        return UInt64(confined.generations[index]) << 32 | UInt64(index)
    }

    /// Frees slot `id` (and what it owns) and returns what it held.
    @discardableResult
    private static func release(_ confined: inout Confined, _ id: UInt64) -> Slot? {
        let index = Int(truncatingIfNeeded: id & 0xffff_ffff)
        guard index < confined.slots.count, confined.generations[index] == UInt32(truncatingIfNeeded: id >> 32)
        else { return nil }
        let slot = confined.slots[index]
        if case .free = slot { return nil }
        if case .waiting(_, let owned) = slot { owned?.deallocate() }
        confined.generations[index] &+= 1
        confined.slots[index] = .free(next: confined.firstFree)
        confined.firstFree = index
        return slot
    }

    private func attach(_ continuation: UnsafeContinuation<Int32, Never>, to id: UInt64) {
        confined.withValue { confined in
            let index = Int(truncatingIfNeeded: id & 0xffff_ffff)
            guard case .waiting(_, let owned) = confined.slots[index] else { preconditionFailure("no such operation") }
            confined.slots[index] = .waiting(continuation, owned: owned)
        }
    }

    /// Loop thread: asks the kernel to cancel operation `id`, awaited or multishot (nothing when it completed
    /// already).
    private func cancel(_ id: UInt64) {
        confined.withValue { confined in
            let index = Int(truncatingIfNeeded: id & 0xffff_ffff)
            guard index < confined.slots.count, confined.generations[index] == UInt32(truncatingIfNeeded: id >> 32)
            else { return }
            switch confined.slots[index] {
            case .waiting, .multishot: _ = csur_prep_cancel(confined.ring!, Self.ignoredToken, id)
            default: return
            }
        }
    }

    // MARK: The ring's own style

    /// Runs `body` on the ring's thread with the ring, for code written in the ring's own idiom (``UringRing``):
    /// operations queued with what to do when each completes, no task suspended in between.
    public func execute(_ body: @escaping @Sendable (UringRing) -> Void) {
        perform { [self] in body(UringRing(loop: self)) }
    }

    /// Loop thread: queues `operation` with a completion handler. With `linked`, the next entry queued starts only
    /// once this one completed in full (IOSQE_IO_LINK); when this one fails or falls short, the next completes with
    /// `-ECANCELED`. Returns `false` when the ring had no room (the handler is not called).
    func submit(_ operation: UringOperation, linked: Bool, then handler: @escaping (Int32) -> Void) -> Bool {
        precondition(inLoop, "UringRing is used on its loop's thread only (UringLoop.execute)")
        return confined.withValue { confined -> Bool in
            let ring = confined.ring!
            let id = Self.allocate(&confined, owned: nil)
            confined.slots[Int(truncatingIfNeeded: id & 0xffff_ffff)] = .callback(handler)
            let prepared: Int32
            switch operation {
            case .receive(let fd, let buffer, let length, let flags):
                prepared = csur_prep_recv(ring, id, fd, UnsafeMutableRawPointer(bitPattern: buffer), length, flags)
            case .send(let fd, let buffer, let length, let flags):
                prepared = csur_prep_send(ring, id, fd, UnsafeRawPointer(bitPattern: buffer), length, flags)
            default:
                prepared = -EINVAL
            }
            if prepared == 0, linked { csur_link_last(ring) }
            if prepared != 0 { Self.release(&confined, id) }
            return prepared == 0
        }
    }

    /// Loop thread: sends all of `bytes` (MSG_WAITALL: the kernel sends a stream socket's rest itself) and, linked
    /// behind it, receives into `buffer`; `handler` gets the receive's result, or the send's error when it failed.
    /// The send posts no completion when it succeeds (IOSQE_CQE_SKIP_SUCCESS), so the pair wakes the ring's thread
    /// once. When it fails, the kernel posts its completion and skips the cancelled receive's (a link head that
    /// skips success skips its failed links' too: seen here, the receive's never came), so the send carries the
    /// receive's id and the one completion is the send's error. Where the kernel cannot skip, the send's
    /// completion is dropped and a failed send shows as the receive's `-ECANCELED`.
    func submitSendThenReceive(
        fd: Int32, send bytes: UnsafeRawBufferPointer, into buffer: UnsafeMutableRawBufferPointer,
        then handler: @escaping (Int32) -> Void
    ) -> Bool {
        precondition(inLoop, "UringRing is used on its loop's thread only (UringLoop.execute)")
        return confined.withValue { confined -> Bool in
            let ring = confined.ring!
            let flags = Int32(MSG_NOSIGNAL | MSG_WAITALL)
            guard csur_reserve(ring, 2) == 0 else { return false }
            let id = Self.allocate(&confined, owned: nil)
            confined.slots[Int(truncatingIfNeeded: id & 0xffff_ffff)] = .callback(handler)
            let sendID = confined.skipsSuccess ? id : Self.ignoredToken
            guard csur_prep_send(ring, sendID, fd, bytes.baseAddress, bytes.count, flags) == 0 else {
                _ = Self.release(&confined, id)
                return false
            }
            csur_link_last(ring)
            if confined.skipsSuccess { csur_skip_success_last(ring) }
            // Room for both was made: the receive's entry is there.
            let prepared = csur_prep_recv(ring, id, fd, buffer.baseAddress, buffer.count, 0)
            precondition(prepared == 0, "the ring had room for the pair")
            // The reply to what this sends cannot be there before the send has gone: a first try would find
            // nothing and then arm the poll anyway (native-64: 1.19x the C floor with it, 1.21-1.22x without).
            if confined.pollsFirst { csur_poll_first_last(ring) }
            return true
        }
    }

    // MARK: Datagrams sent without waiting

    /// Loop thread: sends one datagram to `address` on the unconnected socket `fd` (`nil`: on the connected socket
    /// `fd`, to its peer) and returns at once: sendto(2) with MSG_DONTWAIT on this thread, as the echo's task runs.
    /// An entry for the ring instead (IORING_OP_SENDMSG, taken when the turn enters the kernel to wait) was slower
    /// on a paced echo: the datagram left only after the rest of the turn, and the kernel's sendmsg path, the
    /// msghdr and the copy cost more than the system call (server round trip 15.6-16.2 us against 14.1-14.3 with
    /// this, docs/backends/uring.md). A send the socket buffer had no room for (EAGAIN) goes to the ring, waiting
    /// for room, and later sends wait behind it; any other failure is kept in `failures` for the next send to that
    /// address or the next receive. `false` (nothing sent) off the ring's thread, while a send waits for room,
    /// when the gate closed, or when the ring had no room (or no memory) for a send that must wait: the caller then
    /// sends and waits.
    func sendDatagram(
        _ bytes: [UInt8], to address: SocketAddress?, fd: Int32, failures: UringSendFailures,
        gate: UringDescriptorGuard
    ) -> Bool {
        // The descriptor stays open through the call: a connection's send holds its write gate, which close()
        // waits for, and a listener closes its descriptor only after its receive, run on this thread, has ended.
        guard inLoop, !gate.isClosed, !failures.isWaitingForRoom else { return false }
        do throws(ConnectionError) {
            let sent = try bytes.withBytes { (raw) throws(ConnectionError) -> IOResult<Int> in
                if let address { return try Syscall.sendTo(fd, raw, to: address, dontWait: true) }
                return try Syscall.send(fd, raw, dontWait: true)
            }
            if case .processed = sent { return true }
        } catch {
            failures.record(-(error.systemCode?.code ?? EIO), to: address)
            return true
        }
        guard let datagram = UringDatagram(copying: bytes, to: address) else { return false }
        failures.waitForRoom()
        let queued = confined.withValue { confined -> Bool in
            let id = Self.allocate(&confined, owned: nil)
            confined.slots[Int(truncatingIfNeeded: id & 0xffff_ffff)] = .callback { result in
                datagram.free()
                failures.roomCame(result < 0 && result != -ECANCELED ? (result, address) : nil)
            }
            let flags = Int32(MSG_NOSIGNAL)
            let prepared =
                if let message = datagram.message {
                    csur_prep_sendmsg(confined.ring!, id, fd, message, flags)
                } else {
                    csur_prep_send(confined.ring!, id, fd, datagram.payload, datagram.length, flags)
                }
            if prepared != 0 { Self.release(&confined, id) }
            return prepared == 0
        }
        if !queued {
            // The ring had no room for the entry: the caller sends and waits.
            datagram.free()
            failures.roomCame(nil)
        }
        return queued
    }

    // MARK: Multishot receives with provided buffers

    /// Loop thread: a provided buffer ring of `count` buffers of `size` bytes, or `nil` when the kernel has none.
    func makeBuffers(count: UInt32, size: Int) -> OpaquePointer? {
        precondition(inLoop, "buffer rings are made on the ring's thread")
        return confined.withValue { confined -> OpaquePointer? in
            confined.nextBufferGroup &+= 1
            var code: Int32 = 0
            return csur_buffers_create(confined.ring!, confined.nextBufferGroup, count, size, &code)
        }
    }

    /// Loop thread: unregisters and frees a buffer ring once no operation uses it.
    func destroyBuffers(_ buffers: OpaquePointer) {
        precondition(inLoop, "buffer rings are released on the ring's thread")
        confined.withValue { csur_buffers_destroy($0.ring!, buffers) }
    }

    /// Loop thread: arms a multishot recvmsg on `fd` with `buffers`; `handler` gets each completion (result and
    /// flags: the buffer id, and whether more follow). `false` when the gate has closed or the ring had no room.
    func receiveMessages(
        on fd: Int32, buffers: OpaquePointer, guardedBy gate: UringDescriptorGuard,
        then handler: @escaping (_ result: Int32, _ flags: UInt32) -> Void
    ) -> Bool {
        precondition(inLoop, "multishot operations are armed on the ring's thread")
        if gate.isClosed { return false }
        return confined.withValue { confined -> Bool in
            let id = Self.allocate(&confined, owned: nil)
            confined.slots[Int(truncatingIfNeeded: id & 0xffff_ffff)] = .multishot(handler)
            if csur_prep_recvmsg_multishot(confined.ring!, id, fd, buffers) != 0 {
                Self.release(&confined, id)
                return false
            }
            return true
        }
    }

    /// Loop thread: arms a multishot accept on the listening socket `fd`; `handler` gets each completion (a new
    /// descriptor or `-errno`, and whether more follow). Returns the operation's id (for ``cancelMultishot(_:)``),
    /// `nil` when the gate has closed or the ring had no room.
    func acceptClients(
        on fd: Int32, guardedBy gate: UringDescriptorGuard,
        then handler: @escaping (_ result: Int32, _ flags: UInt32) -> Void
    ) -> UInt64? {
        precondition(inLoop, "multishot operations are armed on the ring's thread")
        if gate.isClosed { return nil }
        return confined.withValue { confined -> UInt64? in
            let id = Self.allocate(&confined, owned: nil)
            confined.slots[Int(truncatingIfNeeded: id & 0xffff_ffff)] = .multishot(handler)
            if csur_prep_accept_multishot(confined.ring!, id, fd) != 0 {
                Self.release(&confined, id)
                return nil
            }
            return id
        }
    }

    /// Loop thread: asks the kernel to end the multishot operation `id` (its handler then gets a last completion,
    /// `-ECANCELED`, with no more to follow). Nothing when it has ended already.
    func cancelMultishot(_ id: UInt64) {
        precondition(inLoop, "multishot operations are cancelled on the ring's thread")
        cancel(id)
    }

    // MARK: The loop

    private func armWake(_ confined: inout Confined) {
        _ = csur_prep_read(confined.ring!, Self.wakeToken, wakeFD, confined.wakeBuffer, 8)
    }

    private func runLoop() {
        let executor = asUnownedTaskExecutor()
        confined.withValue { armWake(&$0) }
        let capacity = 64
        let data = UnsafeMutablePointer<UInt64>.allocate(capacity: capacity)
        let results = UnsafeMutablePointer<Int32>.allocate(capacity: capacity)
        let flags = UnsafeMutablePointer<UInt32>.allocate(capacity: capacity)
        guard let ring = confined.withValue({ $0.ring }) else { return }
        while true {
            work.runAll(jobsAs: executor)
            // Announce sleep, then submit the turn's entries and wait for a completion (or, when work came in
            // meanwhile, only submit and collect what is there).
            let sleeps = work.prepareToSleep()
            let entered = csur_enter(ring, sleeps ? 1 : 0)
            if sleeps { work.awoke() }
            if entered < 0 && entered != -EINTR && entered != -EAGAIN && entered != -EBUSY && entered != -ETIME {
                fatalError("io_uring_enter failed: \(String(cString: strerror(-entered)))")
            }
            while true {
                let count = Int(csur_reap(ring, data, results, flags, UInt32(capacity)))
                if count == 0 { break }
                for index in 0..<count { complete(data[index], results[index], flags[index]) }
            }
        }
    }

    /// Loop thread: one completion.
    private func complete(_ id: UInt64, _ result: Int32, _ flags: UInt32) {
        if id == Self.ignoredToken { return }
        if id == Self.wakeToken {
            confined.withValue { armWake(&$0) }
            return
        }
        let slot = confined.withValue { confined -> Slot? in
            let index = Int(truncatingIfNeeded: id & 0xffff_ffff)
            if csur_more(flags) != 0, index < confined.slots.count,
                confined.generations[index] == UInt32(truncatingIfNeeded: id >> 32)
            {
                switch confined.slots[index] {
                case .multishot: return confined.slots[index]
                case .waiting(let continuation, let owned) where owned == nil:
                    // A zero-copy send's count: its caller waits on for the notification.
                    confined.slots[index] = .zeroCopySent(continuation, result: result)
                    return nil
                default: break
                }
            }
            return Self.release(&confined, id)
        }
        switch slot {
        case .multishot(let handler):
            handler(result, flags)
        case .waiting(let continuation, _):
            continuation?.resume(returning: result)
        case .member(let batch, let position):
            batch.complete(position, result)
        case .callback(let handler):
            handler(result)
        case .zeroCopySent(let continuation, let sent):
            // The notification (IORING_CQE_F_NOTIF): the kernel has let go of the buffer.
            continuation?.resume(returning: sent)
        case .free, nil:
            return
        }
    }
}

/// The ring as code on its own thread uses it (``UringLoop/execute(_:)``): each operation is queued with what to do
/// when it completes, and every entry queued in one turn of the loop goes to the kernel with one `io_uring_enter`.
/// A handler runs on the ring's thread; the buffers an operation names must stay valid until its handler ran.
///
/// ```swift
/// loop.execute { ring in
///     // send, then (only once the send completed in full) receive into the same buffer: one system call for both
///     ring.send(fd, request, linked: true) { sent in }
///     ring.receive(fd, into: buffer) { count in print("received", count) }
/// }
/// ```
public struct UringRing {
    let loop: UringLoop

    /// send(2) of `bytes` on `fd`; `then` gets the count sent or `-errno`. `linked`: the next operation queued
    /// starts only after this one sent everything.
    public func send(
        _ fd: Int32, _ bytes: UnsafeRawBufferPointer, linked: Bool = false, then: @escaping (Int32) -> Void
    ) {
        let operation = UringOperation.send(
            fd: fd, buffer: UInt(bitPattern: bytes.baseAddress), length: bytes.count, flags: Int32(MSG_NOSIGNAL))
        if !loop.submit(operation, linked: linked, then: then) { then(-EBUSY) }
    }

    /// send(2) of all of `bytes` on a stream socket, then (once every byte went) recv(2) into `buffer`: two
    /// operations, one completion, so a request and its answer cost the ring's thread one wake-up. `then` gets the
    /// count received (0 at the end of the stream) or `-errno`: the send's when it failed (`-ECANCELED` on kernels
    /// before 5.17). `buffer` may be the memory `bytes` points into: the receive starts only after the send
    /// completed.
    public func sendThenReceive(
        _ fd: Int32, _ bytes: UnsafeRawBufferPointer, into buffer: UnsafeMutableRawBufferPointer,
        then: @escaping (Int32) -> Void
    ) {
        if !loop.submitSendThenReceive(fd: fd, send: bytes, into: buffer, then: then) { then(-EBUSY) }
    }

    /// recv(2) into `buffer` on `fd`; `then` gets the count received (0 at the end of a TCP stream) or `-errno`.
    public func receive(
        _ fd: Int32, into buffer: UnsafeMutableRawBufferPointer, linked: Bool = false,
        then: @escaping (Int32) -> Void
    ) {
        let operation = UringOperation.receive(
            fd: fd, buffer: UInt(bitPattern: buffer.baseAddress), length: buffer.count, flags: 0)
        if !loop.submit(operation, linked: linked, then: then) { then(-EBUSY) }
    }
}

/// The operations of one ``UringLoop/run(batch:guardedBy:)`` call (loop thread only).
final class UringBatch {
    private var results: [Int32]
    private var remaining: Int
    private let continuation: UnsafeContinuation<[Int32], Never>

    init(count: Int, continuation: UnsafeContinuation<[Int32], Never>) {
        results = Array(repeating: 0, count: count)
        remaining = count
        self.continuation = continuation
    }

    func complete(_ position: Int, _ result: Int32) {
        results[position] = result
        remaining -= 1
        if remaining == 0 { continuation.resume(returning: results) }
    }
}

/// Hands an operation's id from the loop to a cancellation handler on another thread: whichever comes second acts.
private final class CancelToken: Sendable {
    private static let cancelled: UInt64 = .max
    private let state = Atomic<UInt64>(0)

    /// Loop thread, after submitting: `false` when the task was cancelled already (the caller cancels `id`).
    func publish(_ id: UInt64) -> Bool {
        state.compareExchange(expected: 0, desired: id &+ 1, ordering: .acquiringAndReleasing).exchanged
    }

    /// The cancellation handler: the id to cancel when the operation was submitted, else `nil` (it will be).
    func cancel() -> UInt64? {
        let previous = state.exchange(Self.cancelled, ordering: .acquiringAndReleasing)
        return previous == 0 || previous == Self.cancelled ? nil : previous &- 1
    }
}

/// One datagram to send: a copy of its bytes in memory that stays put while the kernel may still read it and, to
/// an address, the msghdr naming both (a connected socket sends without one). Freed by whoever saw the send end.
struct UringDatagram {
    let payload: UnsafeMutableRawPointer
    let length: Int
    let message: OpaquePointer?

    /// `nil` when out of memory.
    init?(copying bytes: [UInt8], to address: SocketAddress?) {
        let payload = UnsafeMutableRawPointer.allocate(byteCount: max(1, bytes.count), alignment: 16)
        bytes.withUnsafeBytes { bytes in
            if let base = bytes.baseAddress { payload.copyMemory(from: base, byteCount: bytes.count) }
        }
        var message: OpaquePointer?
        if let address {
            guard let made = csur_message_create() else {
                payload.deallocate()
                return nil
            }
            address.withSockAddr { pointer, length in
                csur_message_prepare(made, payload, bytes.count, pointer, length)
            }
            message = made
        }
        self.payload = payload
        self.length = bytes.count
        self.message = message
    }

    /// The address it goes to (`nil` on a connected socket).
    var address: SocketAddress? {
        guard let message else { return nil }
        var length: socklen_t = 0
        return csur_message_address(message, &length).flatMap { SocketAddress($0, length: Int(length)) }
    }

    func free() {
        if let message { csur_message_destroy(message) }
        payload.deallocate()
    }
}
