/// The clock a protocol layer's deadlines and intervals run on: the system's continuous clock unless a test
/// gives another. The TLS handshake deadline and WebSocket's handshake deadline, ping deadline, keep-alive
/// interval and close timeout wait on the clock in their options (`TLSConfiguration.clock`,
/// `WebSocketOptions.clock`), so a test can drive them with a clock it advances by hand (ConnectionTestKit's
/// `ManualClock`) and provoke a deadline without waiting for it, as SwiftNIO's `EmbeddedEventLoop.advanceTime(by:)`
/// does for scheduled tasks.
///
/// Two values are equal when they are the same clock (options stay `Hashable`).
public struct DeadlineClock: Sendable, Hashable {
    private let sleeper: @Sendable (Duration) async throws -> Void
    private let identity: ObjectIdentifier?

    /// The system's continuous clock, on the process's deadline timer: a wait that is cancelled ends at once and
    /// holds nothing until its deadline (`Task.sleep` holds its task's memory until then: see `DeadlineTimer`).
    public static let continuous = DeadlineClock()

    private init() {
        sleeper = { try await DeadlineTimer.sleep(for: $0) }
        identity = nil
    }

    /// A clock whose waits are `sleep`, which must end when `duration` has passed on that clock and throw
    /// `CancellationError` when its task is cancelled. `owner` identifies the clock (equality).
    public init(
        owner: any AnyObject & Sendable, sleep: @escaping @Sendable (_ duration: Duration) async throws -> Void
    ) {
        sleeper = sleep
        identity = ObjectIdentifier(owner)
    }

    /// Waits `duration` on this clock; throws `CancellationError` when the task is cancelled first.
    public func sleep(for duration: Duration) async throws {
        try await sleeper(duration)
    }

    public static func == (lhs: DeadlineClock, rhs: DeadlineClock) -> Bool { lhs.identity == rhs.identity }

    public func hash(into hasher: inout Hasher) { hasher.combine(identity) }
}
