// One piece, over 400 lines: one type whose producer and consumer sides share one lock and one state; its
// byte-stream constructors and direct read are in ReceiveQueue+Bytes.swift, its waiting line and framing in
// ReceiveQueue+Parts.swift.

#if SOCKETSTYLES_TSAN
import Synchronization  // Mutex is SanitizerMutex then; nothing public needs the module
#else
public import Synchronization
#endif

/// The bounded hand-off between a backend's producer (a reader thread, an I/O callback, an event loop) and the
/// async tasks that call ``Connection/receive(maximumLength:)`` or ``Listener/accept()``. For backend authors.
///
/// It implements the parts of the ``Connection`` contract every backend shares, once:
/// - waiting receivers are served in call order; a cancelled one returns `.cancelled` at once and loses nothing;
/// - a clean end is reported exactly once (`nil`), then `.closed`;
/// - after `close()`, every waiting and later receive throws `.closed`;
/// - the producer learns when the queue is full (``push(_:)`` says `hasSpace == false`) and is told through
///   `onSpaceAvailable` when the consumer has made room again, so nothing is buffered without limit.
///
/// Its methods are `@inlinable`, so each backend's module compiles a copy specialised for its element type: a
/// generic class called across modules otherwise looks its generic metadata up on every call (measured: about a
/// fifth of a `bsd` echo round trip's CPU before this was done).
public final class ReceiveQueue<Element: Sendable>: Sendable {
    /// How the stream of elements ended.
    public enum End: Sendable {
        /// The peer finished cleanly: the next receive returns `nil`, later ones throw `.closed`.
        case finished
        /// The connection failed: every receive from now on throws this error.
        case failed(ConnectionError)
    }

    @usableFromInline
    enum Item: Sendable {
        case element(Element)
        case failure(ConnectionError)
    }

    @usableFromInline
    typealias Continuation = UnsafeContinuation<Result<Element?, ConnectionError>, Never>

    @usableFromInline
    struct Waiter: Sendable {
        @usableFromInline var id: UInt64
        @usableFromInline var maximumLength: Int
        @usableFromInline var continuation: Continuation

        @inlinable
        init(id: UInt64, maximumLength: Int, continuation: Continuation) {
            self.id = id
            self.maximumLength = maximumLength
            self.continuation = continuation
        }
    }

    @usableFromInline
    struct State: Sendable {
        @usableFromInline var items: [Item] = []
        @usableFromInline var head = 0
        @usableFromInline var weight = 0
        @usableFromInline var end: End? {
            didSet { ended = end != nil }
        }
        /// `end != nil`, kept as a flag: the checks on every push and receive read it without copying the
        /// `End` (and the error in it) out of the state.
        @usableFromInline var ended = false
        @usableFromInline var endReported = false
        @usableFromInline var waiters = WaiterLine()
        @usableFromInline var nextID: UInt64 = 0
        @usableFromInline var cancelled: Set<UInt64> = []
        @usableFromInline var producerWaiting = false
        /// Set at creation or once after it (``setOnSpaceAvailable(_:)``); read only when the producer is to be told.
        @usableFromInline var onSpaceAvailable: (@Sendable () -> Void)?

        @inlinable init() {}

        @inlinable var isEmpty: Bool { head == items.count }
    }

    @usableFromInline let state: Guarded<State>
    @usableFromInline let capacity: Int
    @usableFromInline let framing: Framing
    @inlinable var weigh: @Sendable (Element) -> Int { framing.weigh }
    @inlinable var split: (@Sendable (inout Element, Int) -> Element?)? { framing.split }
    @inlinable var join: (@Sendable (inout Element, Element) -> Void)? { framing.join }

    /// The producer's last read emptied its source (see ``push(_:sourceDrained:)``). Producer's thread only:
    /// ``next(maximumLength:readingNow:)`` and ``next(into:readingNow:)`` read and set it there, and a backend
    /// that waits for its source in place (on that thread) clears it when the source became readable.
    /// (An atomic with relaxed order: one thread uses it, but the queue is shared, and a relaxed load or store is a
    /// plain one on the machines we run on.)
    public var sourceDrained: Bool {
        get { drained.load(ordering: .relaxed) }
        set { drained.store(newValue, ordering: .relaxed) }
    }
    private let drained = Atomic<Bool>(false)

    /// Creates a queue.
    /// - Parameters:
    ///   - capacity: the total weight above which ``push(_:)`` reports the queue full.
    ///   - weigh: the weight of one element (bytes for data, 1 for connections).
    ///   - split: for byte streams: takes at most `n` weight off the front of an element, leaving the rest in
    ///     place; `nil` when elements are never split (datagrams, messages, connections).
    ///   - join: for byte streams: appends an element to another, so that a receive returns everything queued up
    ///     to its maximum length, as recv(2) returns everything the kernel holds; `nil`: one element per receive.
    ///   - onSpaceAvailable: called (outside any lock) when a consumer takes an element from a queue that had
    ///     been reported full.
    public init(
        capacity: Int,
        weigh: @escaping @Sendable (Element) -> Int = { _ in 1 },
        split: (@Sendable (inout Element, Int) -> Element?)? = nil,
        join: (@Sendable (inout Element, Element) -> Void)? = nil,
        onSpaceAvailable: (@Sendable () -> Void)? = nil
    ) {
        var initial = State()
        initial.onSpaceAvailable = onSpaceAvailable
        self.state = Guarded(initial)
        self.capacity = max(1, capacity)
        self.framing = Framing(weigh: weigh, split: split, join: join)
    }

    /// A queue whose elements weigh, split and join as `framing` says (a framing shared by many queues).
    public init(capacity: Int, framing: Framing, onSpaceAvailable: (@Sendable () -> Void)? = nil) {
        var initial = State()
        initial.onSpaceAvailable = onSpaceAvailable
        self.state = Guarded(initial)
        self.capacity = max(1, capacity)
        self.framing = framing
    }

    // MARK: Producer

    /// What ``push(_:)`` did with an element.
    public struct PushResult: Sendable, Hashable {
        /// `false` when the queue had already ended or been closed: the element was NOT taken, and the caller
        /// still owns it (and must release it, if it holds resources).
        public var accepted: Bool
        /// `true` while there is room for more; `false` when the producer should stop until
        /// `onSpaceAvailable` is called.
        public var hasSpace: Bool

        @inlinable
        init(accepted: Bool, hasSpace: Bool) {
            self.accepted = accepted
            self.hasSpace = hasSpace
        }
    }

    /// Adds an element, handing it straight to a waiting receiver when there is one.
    @inlinable
    @discardableResult
    public func push(_ element: Element) -> PushResult {
        let (resume, result): ((Continuation, Element)?, PushResult) = state.withLock { state in
            if state.ended { return (nil, PushResult(accepted: false, hasSpace: false)) }
            if state.isEmpty, !state.waiters.isEmpty {
                var element = element
                let first = state.waiters.first!
                if let split, weigh(element) > first.maximumLength, let prefix = split(&element, first.maximumLength) {
                    state.waiters.removeFirst()
                    append(.element(element), to: &state)
                    let full = state.weight >= capacity
                    if full { state.producerWaiting = true }
                    return ((first.continuation, prefix), PushResult(accepted: true, hasSpace: !full))
                }
                state.waiters.removeFirst()
                return ((first.continuation, element), PushResult(accepted: true, hasSpace: true))
            }
            append(.element(element), to: &state)
            let full = state.weight >= capacity
            if full { state.producerWaiting = true }
            return (nil, PushResult(accepted: true, hasSpace: !full))
        }
        if let (continuation, element) = resume { continuation.resume(returning: .success(element)) }
        return result
    }

    /// ``push(_:)`` for a producer that read `element` from a source (a socket) and knows whether that read
    /// emptied it (a short read): then a receive on the producer's thread that finds the queue idle does not try
    /// a read of its own that would find nothing (see ``next(maximumLength:readingNow:)``). Producer's thread
    /// only.
    @inlinable
    @discardableResult
    public func push(_ element: Element, sourceDrained: Bool) -> PushResult {
        self.sourceDrained = sourceDrained
        return push(element)
    }

    /// Reports an error that does not end the connection (for example an ICMP "port unreachable" on UDP): the
    /// next receive throws it, later ones go on.
    @inlinable
    public func pushFailure(_ error: ConnectionError) {
        let waiter: Continuation? = state.withLock { state in
            if state.ended { return nil }
            if state.isEmpty, !state.waiters.isEmpty { return state.waiters.removeFirst().continuation }
            append(.failure(error), to: &state)
            return nil
        }
        waiter?.resume(returning: .failure(error))
    }

    /// Ends the stream. Elements already queued are still delivered first.
    @inlinable
    public func finish(_ end: End) {
        let resumes: [(Continuation, Result<Element?, ConnectionError>)] = state.withLock { state in
            guard !state.ended else { return [] }
            state.end = end
            guard state.isEmpty else { return [] }
            let waiters = state.waiters.removeAll()
            return waiters.map { ($0.continuation, Self.takeEnd(&state)) }
        }
        for (continuation, result) in resumes { continuation.resume(returning: result) }
    }

    /// Local close: drops what is queued, fails every waiting receiver with `.closed`, and makes every later
    /// receive throw `.closed`.
    /// - Returns: the elements that were queued, for the owner to release (for example accepted connections).
    @inlinable
    @discardableResult
    public func close(_ error: ConnectionError = .closed()) -> [Element] {
        let (waiters, dropped): ([Continuation], [Element]) = state.withLock { state in
            let dropped: [Element] = state.items[state.head...].compactMap {
                if case .element(let element) = $0 { return element } else { return nil }
            }
            state.items.removeAll()
            state.head = 0
            state.weight = 0
            state.end = .failed(error)
            state.endReported = true
            let waiters = state.waiters.removeAll().map(\.continuation)
            return (waiters, dropped)
        }
        for waiter in waiters { waiter.resume(returning: .failure(error)) }
        return dropped
    }

    /// `true` while the total queued weight is below the capacity.
    @inlinable
    public var hasSpace: Bool { state.withLock { $0.weight < capacity } }

    /// Nothing queued, nobody waiting, not ended: a read on the producer's own thread may go straight to the
    /// caller (see ``next(maximumLength:readingNow:)``).
    @inlinable
    public var isIdle: Bool { state.withLock { $0.isEmpty && $0.waiters.isEmpty && !$0.ended } }

    /// How many receivers are waiting now (for tests and diagnostics).
    @inlinable
    public var waitingReceivers: Int { state.withLock { $0.waiters.count } }

    /// `true` once ``finish(_:)`` or ``close(_:)`` was called.
    @inlinable
    public var isEnded: Bool { state.withLock { $0.ended } }

    // MARK: Consumer

    /// Waits for the next element (at most `maximumLength` weight of it when elements can be split).
    /// - Returns: the element, or `nil` once when the stream finished cleanly.
    /// - Throws: the failure pushed or ended with; `.closed` after close or after the end was reported;
    ///   `.cancelled` when the calling task is cancelled while waiting.
    @inlinable
    public func next(maximumLength: Int = .max) async throws(ConnectionError) -> Element? {
        let maximumLength = max(1, maximumLength)
        // Fast path: something is queued and nobody is ahead of us.
        let (immediate, id, notify): (Result<Element?, ConnectionError>?, UInt64, Bool) = state.withLock { state in
            if state.waiters.isEmpty, let result = take(&state, maximumLength: maximumLength) {
                return (result, 0, takeNotify(&state))
            }
            state.nextID &+= 1
            return (nil, state.nextID, false)
        }
        if notify { notifyProducer() }
        if let immediate { return try immediate.get() }
        if Task.isCancelled { throw .cancelled() }

        let result = await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: Continuation) in
                let (now, notify): (Result<Element?, ConnectionError>?, Bool) = state.withLock { state in
                    if state.cancelled.remove(id) != nil { return (.failure(.cancelled()), false) }
                    if state.waiters.isEmpty, let result = take(&state, maximumLength: maximumLength) {
                        return (result, takeNotify(&state))
                    }
                    state.waiters.append(Waiter(id: id, maximumLength: maximumLength, continuation: continuation))
                    return (nil, false)
                }
                if notify { notifyProducer() }
                if let now { continuation.resume(returning: now) }
            }
        } onCancel: {
            let waiter: Continuation? = state.withLock { state in
                if let waiter = state.waiters.remove(id: id) { return waiter.continuation }
                state.cancelled.insert(id)
                return nil
            }
            waiter?.resume(returning: .failure(.cancelled()))
        }
        state.withLock { state in
            if !state.cancelled.isEmpty { state.cancelled.remove(id) }
        }
        // Serve a receiver queued behind us if items are waiting (they were left because we were first).
        serveWaiters()
        return try result.get()
    }

    /// What a read on the producer's own thread found (see ``next(maximumLength:readingNow:)``).
    public enum DirectRead: Sendable {
        /// Data, returned to the caller without queueing it (what exceeds the receive's maximum length is queued
        /// for the next); `drained`: the read emptied the source (it returned less than it asked for).
        case element(Element, drained: Bool)
        /// Nothing to read now: the caller waits for the producer as usual.
        case nothing
        /// The stream ended (or failed) under the read: recorded as ``finish(_:)`` would.
        case end(End)
    }

    /// ``next(maximumLength:)`` for a caller that runs on the producer's own thread (a reader thread or an event
    /// loop that is also the connection's executor): when nothing is queued, nobody is waiting and the stream has
    /// not ended, it first calls `read` (for example one non-blocking recv(2)), so bytes that are already in the
    /// kernel are returned without a suspension, a continuation, a cancellation record or a trip through the
    /// producer's wait. Only that thread pushes, so nothing can be queued between the check and the read: order is
    /// kept.
    ///
    /// `read` takes all it can (up to its buffer), not just the receive's maximum length: what exceeds it is
    /// queued for the next receive, and a short read tells that the source is empty. When the last read on
    /// this thread (this one, or a producer's ``push(_:sourceDrained:)``) emptied the source, the read is
    /// skipped and the caller waits for the producer, whose own wait must report a source that still holds bytes
    /// (level-triggered poll or epoll: a stale hint then costs a wait, never data): in a request-response
    /// exchange that saves a read per message that would find nothing (EAGAIN).
    @inlinable
    public func next(
        maximumLength: Int, readingNow read: () -> DirectRead
    ) async throws(ConnectionError) -> Element? {
        let maximumLength = max(1, maximumLength)
        if !sourceDrained, isIdle {
            switch read() {
            case .element(var element, let drained):
                sourceDrained = drained
                if let split, weigh(element) > maximumLength, let prefix = split(&element, maximumLength) {
                    push(element)
                    return prefix
                }
                return element
            case .nothing: sourceDrained = true
            case .end(let end): finish(end)
            }
        }
        return try await next(maximumLength: maximumLength)
    }

    // MARK: Internals

    @inlinable
    func append(_ item: Item, to state: inout State) {
        if case .element(let element) = item { state.weight += weigh(element) }
        state.items.append(item)
    }

    /// Takes the next item or the end, if any; `nil` when the caller must wait.
    @inlinable
    func take(_ state: inout State, maximumLength: Int) -> Result<Element?, ConnectionError>? {
        if !state.isEmpty {
            switch state.items[state.head] {
            case .failure(let error):
                removeHead(&state)
                return .failure(error)
            case .element(var element):
                if let split, weigh(element) > maximumLength, let prefix = split(&element, maximumLength) {
                    state.items[state.head] = .element(element)
                    state.weight -= weigh(prefix)
                    return .success(prefix)
                }
                state.weight -= weigh(element)
                removeHead(&state)
                if join != nil { joinQueued(to: &element, &state, maximumLength: maximumLength) }
                return .success(element)
            }
        }
        if state.ended { return Self.takeEnd(&state) }
        return nil
    }

    /// Appends the elements queued behind `element` (a byte stream's chunks) until `maximumLength`, splitting the
    /// last one if it does not fit; stops at a failure or the end.
    @inlinable
    func joinQueued(to element: inout Element, _ state: inout State, maximumLength: Int) {
        guard let join else { return }
        var total = weigh(element)
        while total < maximumLength, !state.isEmpty, case .element(var next) = state.items[state.head] {
            let room = maximumLength - total
            if weigh(next) > room, let split, let prefix = split(&next, room) {
                state.items[state.head] = .element(next)
                state.weight -= weigh(prefix)
                total += weigh(prefix)
                join(&element, prefix)
            } else {
                state.weight -= weigh(next)
                removeHead(&state)
                total += weigh(next)
                join(&element, next)
            }
        }
    }

    @inlinable
    static func takeEnd(_ state: inout State) -> Result<Element?, ConnectionError> {
        switch state.end {
        case .failed(let error): return .failure(error)
        case .finished where !state.endReported:
            state.endReported = true
            return .success(nil)
        default: return .failure(.closed("the end of the stream was already reported"))
        }
    }

    @inlinable
    func removeHead(_ state: inout State) {
        state.head += 1
        if state.head == state.items.count {
            state.items.removeAll(keepingCapacity: true)
            state.head = 0
        } else if state.head >= 64, state.head * 2 >= state.items.count {
            state.items.removeFirst(state.head)
            state.head = 0
        }
    }

    /// Tells the producer that there is room again (outside the lock: the producer may push from its callback).
    @inlinable
    func notifyProducer() {
        state.withLock { $0.onSpaceAvailable }?()
    }

    /// Sets what is called when a consumer makes room in a queue that had been reported full: for an owner that
    /// can only refer to itself once it is made (`[weak self]`), without a cell of its own for that reference.
    public func setOnSpaceAvailable(_ onSpaceAvailable: @escaping @Sendable () -> Void) {
        state.withLock { $0.onSpaceAvailable = onSpaceAvailable }
    }

    @inlinable
    func takeNotify(_ state: inout State) -> Bool {
        if state.producerWaiting, state.weight < capacity {
            state.producerWaiting = false
            return true
        }
        return false
    }

    @inlinable
    func serveWaiters() {
        while true {
            let (resume, notify): ((Continuation, Result<Element?, ConnectionError>)?, Bool) = state.withLock {
                state in
                guard let first = state.waiters.first, let result = take(&state, maximumLength: first.maximumLength)
                else { return (nil, false) }
                state.waiters.removeFirst()
                return ((first.continuation, result), takeNotify(&state))
            }
            if notify { notifyProducer() }
            guard let (continuation, result) = resume else { return }
            continuation.resume(returning: result)
        }
    }
}
