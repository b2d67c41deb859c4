internal import CURing
@_spi(Loop) public import ConnectionCore
internal import Glibc
@_spi(Loop) import POSIXSupport
import Synchronization

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
    /// Whether the ring has its stream receive buffers (``receiveSelected(fd:length:guardedBy:)``).
    let selectsStreamBuffers = Atomic<Bool>(false)
    /// Stream receives the kernel found no free buffer for (`-ENOBUFS`), read at once another way: how often the
    /// ring's buffers were not enough.
    let receivesTurnedAway = Atomic<Int>(0)
    package var turnedAwayReceives: Int { receivesTurnedAway.load(ordering: .relaxed) }
    let wake: WakeEvent
    let work: LoopWorkQueue
    let confined: LoopConfined<Confined>

    static let wakeToken: UInt64 = .max
    static let ignoredToken: UInt64 = .max - 1

    enum Slot {
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
        /// A stream receive into a buffer the kernel picked (``receiveSelected(fd:length:guardedBy:)``): its bytes
        /// are copied out and the buffer recycled when it completes, before the task resumes.
        case selecting(UnsafeContinuation<SelectedReceive, Never>?)
    }

    /// What only the ring's thread touches.
    struct Confined {
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
        /// The buffers every stream receive of the ring picks from (nil on a kernel without buffer rings).
        var streamBuffers: OpaquePointer?
    }

    /// Sets a ring up and starts its thread. Throws (one line, with the kernel's reason) when io_uring is
    /// unavailable: an old kernel, `kernel.io_uring_disabled`, or a seccomp filter that forbids it.
    public init(name: String, entries: UInt32 = 1024) throws(ConnectionError) {
        self.name = name
        let wake = try WakeEvent()
        self.wake = wake
        work = LoopWorkQueue(signal: { wake.signal() })
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
                    if let ring {
                        $0.nextBufferGroup &+= 1
                        $0.streamBuffers = csur_buffers_create(
                            ring, $0.nextBufferGroup, Self.streamBufferCount, Self.streamBufferSize, &code)
                        code = 0
                    }
                }
                selectsStreamBuffers.store(confined.withValue { $0.streamBuffers != nil }, ordering: .relaxed)
                flags.store(setup, ordering: .relaxed)
                if ring == nil { failure.store(code, ordering: .relaxed) }
            }
        ) { [self] in
            if confined.withValue({ $0.ring }) != nil { runLoop() }
        }
        let code = failure.load(ordering: .relaxed)
        if code != 0 {
            wake.close()
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
        await awaitCompletion(of: OperationRequest(operation: operation, timeout: timeout, gate: gate))
    }

    /// One operation as ``run(_:timeout:guardedBy:)`` submits it.
    private struct OperationRequest: UringRequest {
        let operation: UringOperation
        let timeout: Duration?
        let gate: UringDescriptorGuard?
        var refused: Int32 { -ECANCELED }
        func submit(on loop: UringLoop) -> UInt64? { loop.submit(operation, timeout: timeout, gate: gate) }
        func attach(_ continuation: UnsafeContinuation<Int32, Never>, to id: UInt64, on loop: UringLoop) {
            loop.attach(continuation, to: id)
        }
    }

    /// One operation's life as a task sees it: submitted on the ring's thread (not submitted: the call returns the
    /// request's `refused`), the task's continuation attached to its slot in the same turn, before any completion
    /// is read, and cancellation of the task handed to the ring as a cancellation of the operation (which still
    /// completes, so what it uses is never written after this returns). The request is a value, not closures: the
    /// hand-over to the ring's thread captures it in one context, as a round trip's allocation count expects.
    func awaitCompletion<Request: UringRequest>(of request: Request) async -> Request.Value {
        if inLoop {
            guard let id = request.submit(on: self) else { return request.refused }
            return await withTaskCancellationHandler {
                await withUnsafeContinuation { continuation in request.attach(continuation, to: id, on: self) }
            } onCancel: {
                perform { [self] in cancel(id) }
            }
        }
        let token = CancelToken()
        return await withTaskCancellationHandler {
            await withUnsafeContinuation { continuation in
                perform { [self] in
                    guard let id = request.submit(on: self) else {
                        continuation.resume(returning: request.refused)
                        return
                    }
                    request.attach(continuation, to: id, on: self)
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
    func submit(
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

    /// Cancels every operation in flight on `descriptor` (loop thread or not): each completes with `-ECANCELED`.
    /// The descriptor is borrowed on the ring's thread, when the cancellation is prepared: a number read here and
    /// carried to the ring would, once the owner has closed it meanwhile (nothing was in flight, so its close did
    /// not wait), cancel the operations of whichever socket was given the number next.
    func cancelAll(on descriptor: SocketDescriptor) {
        let block: @Sendable () -> Void = { [self] in
            descriptor.ifOpen { fd in
                confined.withValue { confined in
                    _ = csur_prep_cancel_fd(confined.ring!, Self.ignoredToken, fd.number)
                }
            }
        }
        perform(block)
    }

    /// Loop thread: the SQE(s) of `operation`, with a slot for its completion. `nil` when the gate has closed or
    /// the ring refused an entry.
    func submit(_ operation: UringOperation, timeout: Duration?, gate: UringDescriptorGuard?) -> UInt64? {
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

    static func allocate(_ confined: inout Confined, owned: UnsafeMutableRawPointer?) -> UInt64 {
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
    static func release(_ confined: inout Confined, _ id: UInt64) -> Slot? {
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

    func attach(_ continuation: UnsafeContinuation<Int32, Never>, to id: UInt64) {
        confined.withValue { confined in
            let index = Int(truncatingIfNeeded: id & 0xffff_ffff)
            guard case .waiting(_, let owned) = confined.slots[index] else { preconditionFailure("no such operation") }
            confined.slots[index] = .waiting(continuation, owned: owned)
        }
    }

    /// Loop thread: asks the kernel to cancel operation `id`, awaited or multishot (nothing when it completed
    /// already).
    func cancel(_ id: UInt64) {
        confined.withValue { confined in
            let index = Int(truncatingIfNeeded: id & 0xffff_ffff)
            guard index < confined.slots.count, confined.generations[index] == UInt32(truncatingIfNeeded: id >> 32)
            else { return }
            switch confined.slots[index] {
            case .waiting, .multishot, .selecting: _ = csur_prep_cancel(confined.ring!, Self.ignoredToken, id)
            default: return
            }
        }
    }

    // MARK: The loop

    func armWake(_ confined: inout Confined) {
        // The ring's read holds the eventfd from its submission on; the number is ours until the loop closes it.
        _ = wake.ifOpen { csur_prep_read(confined.ring!, Self.wakeToken, $0.number, confined.wakeBuffer, 8) }
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
    func complete(_ id: UInt64, _ result: Int32, _ flags: UInt32) {
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
        case .selecting(let continuation):
            continuation?.resume(returning: selected(result, flags))
        case .free, nil:
            return
        }
    }
}

/// One kind of ring operation as a task awaits it (``UringLoop/awaitCompletion(of:)``).
protocol UringRequest: Sendable {
    associatedtype Value: Sendable
    /// What the task gets when the operation was not submitted.
    var refused: Value { get }
    /// Loop thread: the operation into the submission queue; its id, or `nil` when it was not submitted.
    func submit(on loop: UringLoop) -> UInt64?
    /// Loop thread, in the turn that submitted it: the task's continuation into the operation's slot.
    func attach(_ continuation: UnsafeContinuation<Value, Never>, to id: UInt64, on loop: UringLoop)
}
