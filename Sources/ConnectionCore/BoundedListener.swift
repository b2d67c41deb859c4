import Synchronization

/// Where the toolkit says that a resource bound acted (a client refused at ``ConnectionOptions/maximumConnections``,
/// an idle connection closed, a listener out of descriptors, a UDP peer evicted): one line each, at most one line
/// per kind of event every ten seconds, with the count of those left unsaid. Lines go to ``handler``: the umbrella
/// module's `Backend.listen` sets it to write to standard error unless the application has set one.
public enum BoundsLog {
    /// The kinds of event, each rate-limited on its own.
    public enum Event: String, Sendable, CaseIterable {
        case connectionLimit = "connection limit"
        case idleTimeout = "idle timeout"
        case descriptorLimit = "descriptor limit"
        /// A server with a thread per connection (bsd) could not start one: that connection is closed, and
        /// accepting pauses as for ``descriptorLimit``.
        case threadLimit = "thread limit"
        case udpPeerLimit = "udp peer limit"
    }

    private struct State {
        var handler: (@Sendable (Event, String) -> Void)?
        var lastLine: [Event: UInt64] = [:]
        var unsaid: [Event: Int] = [:]
    }

    private static let state = Guarded(State())
    private static let interval: UInt64 = 10_000_000_000
    private static let processStart = ContinuousClock.now

    /// Receives every line that is not rate-limited away; `nil` drops them.
    public static var handler: (@Sendable (Event, String) -> Void)? {
        get { state.withLock { $0.handler } }
        set { state.withLock { $0.handler = newValue } }
    }

    /// Sets ``handler`` unless one is set already.
    public static func setHandlerIfUnset(_ handler: @escaping @Sendable (Event, String) -> Void) {
        state.withLock { if $0.handler == nil { $0.handler = handler } }
    }

    /// Reports one event; says it unless a line of the same kind was said less than ten seconds ago.
    public static func note(_ event: Event, _ text: @autoclosure () -> String) {
        let now = (ContinuousClock.now - processStart).wholeNanoseconds
        let (say, unsaid, handler): (Bool, Int, (@Sendable (Event, String) -> Void)?) = state.withLock { state in
            if let last = state.lastLine[event], now &- last < interval {
                state.unsaid[event, default: 0] += 1
                return (false, 0, nil)
            }
            state.lastLine[event] = now
            let unsaid = state.unsaid.removeValue(forKey: event) ?? 0
            return (true, unsaid, state.handler)
        }
        guard say else { return }
        let line = "\(event.rawValue): \(text())" + (unsaid > 0 ? " (and \(unsaid) more since the last line)" : "")
        handler?(event, line)
    }
}

/// A stream listener with the server-side bounds of ``ConnectionOptions``: at most
/// ``ConnectionOptions/maximumConnections`` open at once (a client beyond it is accepted and closed at once, so it
/// hears a clean end instead of waiting in the backlog, and the others are not disturbed), and connections that
/// neither send nor receive for ``ConnectionOptions/idleTimeout`` closed (their pending receive fails with
/// `.timedOut`). Every stream listener made through `Backend.listen` is one, below TLS and WebSocket, so a refused
/// client costs no handshake.
public final class BoundedListener: Listener, Sendable {
    public var transport: Transport { inner.transport }
    public var localEndpoint: Endpoint { inner.localEndpoint }
    private let inner: any Listener
    private let options: ConnectionOptions
    let registry: Registry
    private let sweeper = Guarded<Task<Void, Never>?>(nil)

    /// Connections handed out and not yet closed.
    public var openConnections: Int { registry.open.withLock { $0.count } }
    /// Clients refused because ``ConnectionOptions/maximumConnections`` were open.
    public var refusedConnections: Int { registry.refused.load(ordering: .relaxed) }
    /// Connections closed by ``ConnectionOptions/idleTimeout``.
    public var idleClosed: Int { registry.idleClosed.load(ordering: .relaxed) }

    final class Registry: Sendable {
        let open = Guarded<[ObjectIdentifier: Weak]>([:])
        let refused = Atomic<Int>(0)
        let idleClosed = Atomic<Int>(0)

        struct Weak: Sendable {
            weak let connection: BoundedConnection?
        }

        func remove(_ id: ObjectIdentifier) {
            _ = open.withLock { $0.removeValue(forKey: id) }
        }
    }

    /// Bounds `inner` with the limits in `options`.
    public init(_ inner: any Listener, options: ConnectionOptions) {
        self.inner = inner
        self.options = options
        self.registry = Registry()
        if let idle = options.idleTimeout {
            let registry = registry
            let task = Task {
                let period = max(idle / 4, .milliseconds(10))
                while !Task.isCancelled {
                    try? await Task.sleep(for: period)
                    let now = ContinuousClock.now
                    let idleOnes = registry.open.withLock { open in
                        open.values.compactMap(\.connection).filter { $0.quietFor(at: now) >= idle }
                    }
                    for connection in idleOnes {
                        registry.idleClosed.add(1, ordering: .relaxed)
                        BoundsLog.note(
                            .idleTimeout, "closed \(connection.remoteEndpoint), idle for \(idle)")
                        await connection.closeForIdleness(idle)
                    }
                }
            }
            sweeper.withLock { $0 = task }
        }
    }

    public func accept() async throws(ConnectionError) -> any Connection {
        while true {
            let connection = try await inner.accept()
            let admitted: BoundedConnection? = registry.open.withLock { open in
                guard open.count < options.maximumConnections else { return nil }
                let bounded = BoundedConnection(
                    connection, registry: registry, tracksIdleness: options.idleTimeout != nil)
                open[ObjectIdentifier(bounded)] = Registry.Weak(connection: bounded)
                return bounded
            }
            if let admitted { return admitted }
            registry.refused.add(1, ordering: .relaxed)
            BoundsLog.note(
                .connectionLimit,
                "refused \(connection.remoteEndpoint) on \(localEndpoint): \(options.maximumConnections) connections open"
            )
            await connection.close()
        }
    }

    public func close() async {
        sweeper.withLock { $0 }?.cancel()
        await inner.close()
    }
}

/// An accepted connection counted by its ``BoundedListener`` until it is closed; forwards everything else.
final class BoundedConnection: Connection, Sendable {
    private let inner: any Connection
    private let registry: BoundedListener.Registry
    private let tracksIdleness: Bool
    /// Set by every send and receive, cleared by the listener's sweep: one relaxed store per operation (no clock
    /// read; a clock read per message measurably slowed a server's round trip).
    private let active = Atomic<Bool>(true)
    private let released = Atomic<Bool>(false)
    private let idle: Guarded<Idle>

    private struct Idle {
        /// When a sweep first found the connection inactive (sweeper only).
        var quietSince: ContinuousClock.Instant
        /// Set when the idle timeout closed the connection.
        var closedFor: Duration?
    }

    // Kept here: `receive()` reads `options` every time, and a copy is one reference (ConnectionOptions shares its
    // values). The endpoints are the inner connection's: copies of them would be kept as long as the connection is
    // open, and only logs and the caller read them.
    let transport: Transport
    let options: ConnectionOptions
    var localEndpoint: Endpoint { inner.localEndpoint }
    var remoteEndpoint: Endpoint { inner.remoteEndpoint }

    init(_ inner: any Connection, registry: BoundedListener.Registry, tracksIdleness: Bool) {
        self.inner = inner
        self.registry = registry
        self.tracksIdleness = tracksIdleness
        idle = Guarded(Idle(quietSince: .now, closedFor: nil))
        transport = inner.transport
        options = inner.options
    }

    deinit { release() }

    var preferredExecutor: (any TaskExecutor)? { inner.preferredExecutor }
    var sendsFromAnyThread: Bool { inner.sendsFromAnyThread }

    // A send touches before and after: one held up by a slow reader is not idleness.
    func send(_ message: Message) async throws(ConnectionError) {
        touch()
        try await forwarded { () throws(ConnectionError) in try await inner.send(message) }
    }

    func send(contentsOf bytes: UnsafeRawBufferPointer) async throws(ConnectionError) {
        touch()
        try await forwarded { () throws(ConnectionError) in try await inner.send(contentsOf: bytes) }
    }

    func send(batch: [UnsafeRawBufferPointer]) async throws(ConnectionError) {
        touch()
        try await forwarded { () throws(ConnectionError) in try await inner.send(batch: batch) }
    }

    // Written out rather than through `forwarded`: an idle connection's task waits here, and a closure's frame
    // would stay on its task stack for as long as it waits.
    @inline(__always)
    func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        let message: Message?
        do throws(ConnectionError) {
            message = try await inner.receive(maximumLength: maximumLength)
        } catch {
            throw explained(error)
        }
        touch()
        return message
    }

    func receive(into buffer: UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Received? {
        try await forwarded { () throws(ConnectionError) in try await inner.receive(into: buffer) }
    }

    /// Runs an operation of the inner connection: touches once it is done, and says when a `.closed` was the
    /// idle timeout's.
    private func forwarded<Value>(
        _ operation: () async throws(ConnectionError) -> Value
    ) async throws(ConnectionError) -> Value {
        let value: Value
        do throws(ConnectionError) {
            value = try await operation()
        } catch {
            throw explained(error)
        }
        touch()
        return value
    }

    func closeOutput() async throws(ConnectionError) { try await inner.closeOutput() }

    func close() async {
        release()
        await inner.close()
    }

    func abort() async {
        release()
        await inner.abort()
    }

    @inline(__always)
    private func touch() {
        if tracksIdleness { active.store(true, ordering: .relaxed) }
    }

    /// For the sweep: how long no send or receive happened, to within one sweep period.
    func quietFor(at now: ContinuousClock.Instant) -> Duration {
        idle.withLock { idle in
            if active.exchange(false, ordering: .relaxed) { idle.quietSince = now }
            return now - idle.quietSince
        }
    }

    func closeForIdleness(_ limit: Duration) async {
        idle.withLock { $0.closedFor = limit }
        await close()
    }

    /// A `.closed` caused by the idle timeout says so.
    private func explained(_ error: ConnectionError) -> ConnectionError {
        guard error.kind == .closed, let limit = idle.withLock({ $0.closedFor }) else { return error }
        return ConnectionError(.timedOut, "the connection was idle for \(limit) and was closed")
    }

    private func release() {
        if !released.exchange(true, ordering: .relaxed) { registry.remove(ObjectIdentifier(self)) }
    }
}
