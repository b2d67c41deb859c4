// One piece, over 400 lines: the pair's phases and each stream side's arming change together at nearly every
// event, so the value that holds them and the transitions between them stay in one file.

import ConnectionCore
import POSIXSupport

/// The life of a stream pair's socket and the Darwin event contract, as a value with no I/O: ``StreamPairCore``
/// asks it what to do at each event, does the system calls and delivers the events. Generic over the socket it
/// carries (a `SocketDescriptor` in the core, any value in tests), which it holds and hands back to be closed but
/// never touches.
///
/// The phases: `idle` (made by `getStreamsToHost`, nothing opened) -> `resolving` (the name lookup, off the run
/// loop) -> `connecting` (the resolved addresses tried in turn, one socket at a time) -> `open` -> `failed` (the
/// error reported to the streams) or `closed` (both streams closed). An accepted socket starts `open`. The socket
/// is released (to be closed) exactly once, when a connect attempt fails or the pair leaves `open`.
///
/// In `open`, each stream's side has its own state. The input: `armed` (a readable event is delivered as
/// `hasBytesAvailable`), `delivered` (not again until the delegate reads; still watched, since epoll is
/// level-triggered and most delegates read at once), `deliveredUnwatched` (a readable event came while delivered:
/// the read interest is taken off, or epoll would report it on every turn), `ended` (`endEncountered` delivered).
/// The output: `armedWithRoom` (the last write took everything, so `hasSpaceAvailable` is delivered on the run
/// loop's next turn without asking epoll), `armedWaitingForRoom` (watched for writable), `delivered` (not again
/// until the delegate writes). The socket is watched by epoll, not yet, or `broken`: it reported an error or a
/// hang-up while it still held bytes for the input; epoll would report that on every turn whatever the interest,
/// so it leaves epoll, and each armed stream gets its event on the next turn instead (its reads return the bytes,
/// then the end or the error). The deliveries due on the next turn are a set (`Due`), so that a turn is asked for
/// once, however many changes make one due.
struct StreamPairState<Socket> {
    enum Phase {
        case idle
        case resolving
        // Boxed: the connect's state (the addresses, the attempt under way) would otherwise size every open pair.
        indirect case connecting(Connecting)
        case open(Open)
        case failed(ConnectionError)
        case closed
    }

    /// The resolved addresses, and the attempt under way (none between two).
    struct Connecting {
        var attempts: ConnectAttempts
        var attempt: Attempt?
    }

    /// The attempt under way (its socket is ``socket``).
    struct Attempt {
        var address: SocketAddress
        var watch: Watch = .unwatched
    }

    /// The open phase's arming (its socket is ``socket``). Plain values only, so that changing it in place at every
    /// event retains and releases nothing.
    struct Open {
        var watch: Watch = .unwatched
        var input = Input.armed
        var output = Output.armedWithRoom
        var due: Due = []
    }

    enum Watch: Equatable {
        case unwatched
        case watched(SocketInterest)
        case broken
    }

    enum Input: Equatable {
        case armed, delivered, deliveredUnwatched, ended
    }

    enum Output: Equatable {
        case armedWithRoom, armedWaitingForRoom, delivered
    }

    /// Deliveries due on the run loop's next turn.
    struct Due: OptionSet, Equatable {
        let rawValue: UInt8
        static var input: Due { Due(rawValue: 1 << 0) }
        static var output: Due { Due(rawValue: 1 << 1) }
    }

    /// A socket let go of, to be closed (and first taken out of epoll when `watched`).
    struct Release {
        var socket: Socket
        var watched: Bool
    }

    /// What to change in epoll.
    enum WatchChange: Equatable {
        case register(SocketInterest)
        case modify(SocketInterest)
        case unregister
    }

    private(set) var phase: Phase
    /// The socket, while connecting (the attempt's) or open; `nil` in every other phase. Kept beside the phase rather
    /// than in it: the phase's data changes at every event, and a reference in it would be retained and released
    /// each time.
    private(set) var socket: Socket?
    /// An error the read straight after the read-ahead's bytes met: reported by the next read, not lost (while open).
    private var deferredReadError: ConnectionError?

    /// A pair to connect.
    init() { phase = .idle }

    /// A pair over an accepted, connected socket.
    init(accepted socket: Socket) {
        phase = .open(Open())
        self.socket = socket
    }

    var isOpen: Bool {
        if case .open = phase { return true }
        return false
    }

    var isConnecting: Bool {
        switch phase {
        case .resolving, .connecting: true
        default: false
        }
    }

    /// The error reported, once the pair has failed.
    var failure: ConnectionError? {
        if case .failed(let error) = phase { return error }
        return nil
    }

    /// The open phase's data, changed in place (nothing when not open).
    private mutating func withOpen<R>(_ body: (inout Open) -> R?) -> R? {
        guard case .open(var open) = phase else { return nil }
        defer { phase = .open(open) }
        return body(&open)
    }

    var open: Open? {
        if case .open(let open) = phase { return open }
        return nil
    }

    // MARK: Connecting

    /// The first stream to open starts connecting; `false` when that has happened already (or the pair is past it).
    mutating func beginConnecting() -> Bool {
        guard case .idle = phase else { return false }
        phase = .resolving
        return true
    }

    /// The name is resolved: the addresses to try in turn.
    mutating func resolved(_ attempts: ConnectAttempts) {
        guard case .resolving = phase else { return }
        phase = .connecting(Connecting(attempts: attempts))
    }

    /// The next address to try, `nil` when none is left (or the pair is not connecting). Throws `.timedOut` when the
    /// connect took too long.
    mutating func nextAddress() throws(ConnectionError) -> SocketAddress? {
        guard case .connecting(var connecting) = phase else { return nil }
        let address = try connecting.attempts.next()
        phase = .connecting(connecting)
        return address
    }

    /// The error to report when no address is left.
    var lastConnectError: ConnectionError {
        if case .connecting(let connecting) = phase { return connecting.attempts.lastError }
        return ConnectionError(.closed, "not connecting")
    }

    /// The address being tried, for an error message.
    var attemptAddress: SocketAddress? {
        if case .connecting(let connecting) = phase { return connecting.attempt?.address }
        return nil
    }

    /// A non-blocking connect started on `socket` to `address`.
    mutating func attempting(_ socket: Socket, to address: SocketAddress) {
        guard case .connecting(var connecting) = phase else { return }
        connecting.attempt = Attempt(address: address)
        phase = .connecting(connecting)
        self.socket = socket
    }

    /// The attempt failed with `error`: its socket is let go of, and the error recorded. `end` is the error that ends
    /// the search (cancelled, timed out): the pair then fails with it.
    mutating func attemptFailed(_ error: ConnectionError) -> (release: Release?, end: ConnectionError?) {
        guard case .connecting(var connecting) = phase else { return (nil, nil) }
        let release = releasing(watched: connecting.attempt.map { $0.watch != .unwatched })
        connecting.attempt = nil
        var end: ConnectionError?
        do throws(ConnectionError) {
            try connecting.attempts.failed(error)
        } catch {
            end = error
        }
        phase = .connecting(connecting)
        return (release, end)
    }

    /// The attempt's connect completed: the pair is open, its socket watched as the attempt's was.
    mutating func connected() {
        guard case .connecting(let connecting) = phase, let attempt = connecting.attempt else { return }
        phase = .open(Open(watch: attempt.watch))
    }

    // MARK: Interest

    /// What epoll must watch now, given which streams are open, and the deliveries that became due (`true`: ask the
    /// run loop for a turn). A broken socket is watched for nothing: its armed streams' events become due instead.
    mutating func updateInterest(inputOpen: Bool, outputOpen: Bool) -> (change: WatchChange?, newlyDue: Bool) {
        switch phase {
        case .connecting(var connecting):
            guard var attempt = connecting.attempt else { return (nil, false) }
            let change = Self.change(from: attempt.watch, to: .write)
            attempt.watch = .watched(.write)
            connecting.attempt = attempt
            phase = .connecting(connecting)
            return (change, false)
        case .open:
            return withOpen { open in
                let dueBefore = open.due
                if open.watch == .broken {
                    if inputOpen && open.input == .armed { open.due.insert(.input) }
                    if outputOpen && open.output != .delivered { open.due.insert(.output) }
                    return (nil, dueBefore.isEmpty && !open.due.isEmpty)
                }
                var wanted: SocketInterest = []
                if inputOpen && (open.input == .armed || open.input == .delivered) { wanted.insert(.read) }
                if outputOpen {
                    switch open.output {
                    case .armedWithRoom: open.due.insert(.output)
                    case .armedWaitingForRoom: wanted.insert(.write)
                    case .delivered: break
                    }
                }
                let change = Self.change(from: open.watch, to: wanted)
                open.watch = .watched(wanted)
                return (change, dueBefore.isEmpty && !open.due.isEmpty)
            } ?? (nil, false)
        default:
            return (nil, false)
        }
    }

    private static func change(from watch: Watch, to wanted: SocketInterest) -> WatchChange? {
        switch watch {
        case .unwatched: .register(wanted)
        case .watched(let current): current == wanted ? nil : .modify(wanted)
        case .broken: nil
        }
    }

    // MARK: Readiness (open)

    /// An error or a hang-up while the input still holds bytes: the socket must go ``Watch/broken``.
    func mustBreakAway(_ events: SocketEvents, inputOpen: Bool, unreadBytes: () -> Bool) -> Bool {
        guard let open, !events.isDisjoint(with: [.error, .hangUp]), inputOpen, open.input != .ended else {
            return false
        }
        return unreadBytes()
    }

    /// Takes the socket out of epoll for good (``Watch/broken``): returns the change to make, if it was watched. The
    /// output's next write finds out the socket's state at once, so it counts as having room.
    mutating func breakAway() -> WatchChange? {
        withOpen { open in
            let change: WatchChange? = if case .watched = open.watch { .unregister } else { nil }
            open.watch = .broken
            if open.output == .armedWaitingForRoom { open.output = .armedWithRoom }
            return change
        } ?? nil
    }

    /// A broken socket whose input found nothing to read, no end and no error after all: back under epoll's watch
    /// (registered anew).
    mutating func rejoin() {
        _ = withOpen { open in
            if open.watch == .broken { open.watch = .unwatched }
        }
    }

    /// What a readable (or hang-up) event does to the input.
    enum InputStep: Equatable {
        /// Nothing for the input.
        case nothing
        /// Deliver `hasBytesAvailable` at once (a delegate that tolerates empty reads); the input is now delivered.
        case deliverBytes
        /// Read ahead to find out what a read would return, and deliver that.
        case readAhead
        /// Not re-armed, but every byte was read and the peer has ended: deliver the end if a read would find it.
        case checkEnd
    }

    /// The input's step for `events`.
    mutating func inputStep(
        _ events: SocketEvents, inputOpen: Bool, toleratesEmptyReads: Bool, unreadBytes: () -> Bool
    ) -> InputStep {
        guard inputOpen, !events.isDisjoint(with: [.readable, .hangUp, .readHangUp]) else { return .nothing }
        return withOpen { open in
            switch open.input {
            case .armed:
                guard toleratesEmptyReads else { return .readAhead }
                open.input = .delivered
                return .deliverBytes
            case .ended:
                return .nothing
            case .delivered, .deliveredUnwatched:
                // A hang-up is reported whatever the interest, so waiting for a read would spin.
                if !events.isDisjoint(with: [.hangUp, .readHangUp]) && !unreadBytes() { return .checkEnd }
                open.input = .deliveredUnwatched
                return .nothing
            }
        } ?? .nothing
    }

    /// `hasBytesAvailable` is being delivered: not again until the delegate reads.
    mutating func inputDelivered() {
        _ = withOpen { open in
            if open.input != .ended { open.input = .delivered }
        }
    }

    /// The end is being delivered; `false` when it was already.
    mutating func inputEnded() -> Bool {
        withOpen { open in
            guard open.input != .ended else { return false }
            open.input = .ended
            return true
        } ?? false
    }

    /// The delegate read (bytes, or nothing yet): `hasBytesAvailable` is armed again and the input watched again.
    mutating func delegateRead() {
        _ = withOpen { open in
            if open.input != .ended { open.input = .armed }
        }
    }

    /// A writable event: `true` when `hasSpaceAvailable` is to be delivered (it then is not again until a write).
    mutating func writable(_ events: SocketEvents, outputOpen: Bool) -> Bool {
        guard events.contains(.writable), outputOpen else { return false }
        return withOpen { open in
            guard open.output != .delivered else { return false }
            open.output = .delivered
            return true
        } ?? false
    }

    /// The delegate wrote; `all`: the socket took every byte (it has room). Returns whether the interest must be
    /// worked out again: not when the write left things as they were (armed, room left, its delivery already due).
    mutating func delegateWrote(all: Bool) -> Bool {
        withOpen { open in
            let unchanged = open.output == .armedWithRoom && open.due.contains(.output)
            open.output = all ? .armedWithRoom : .armedWaitingForRoom
            return !(unchanged && all)
        } ?? false
    }

    // MARK: Deliveries on the next turn

    /// The deliveries due, taken (the run loop's turn has come).
    mutating func takeDue() -> Due {
        withOpen { open in
            defer { open.due = [] }
            return open.due
        } ?? []
    }

    /// A due `hasBytesAvailable` (of a broken socket) is still to be delivered.
    func inputStillDue(inputOpen: Bool) -> Bool {
        inputOpen && open?.input == .armed
    }

    /// A due `hasSpaceAvailable` is still to be delivered: `true` when it is (it then is not again until a write).
    /// Only while the socket has room, or is broken (whose next write finds out its state at once).
    mutating func spaceStillDue(outputOpen: Bool) -> Bool {
        guard outputOpen else { return false }
        return withOpen { open in
            guard open.output == .armedWithRoom || (open.watch == .broken && open.output != .delivered) else {
                return false
            }
            open.output = .delivered
            return true
        } ?? false
    }

    /// Notes an error to report on the next read, or takes the one noted.
    mutating func deferReadError(_ error: ConnectionError) {
        if isOpen { deferredReadError = error }
    }

    mutating func takeDeferredReadError() -> ConnectionError? {
        guard deferredReadError != nil else { return nil }
        defer { deferredReadError = nil }
        return isOpen ? deferredReadError : nil
    }

    // MARK: Ending

    /// An error to report: the pair has failed, and its socket (if any) is let go of. `first` is `false` when it had
    /// failed already (the error is not reported again).
    mutating func fail(_ error: ConnectionError) -> (first: Bool, release: Release?) {
        let release: Release?
        switch phase {
        case .failed: return (false, nil)
        case .connecting(let connecting):
            release = releasing(watched: connecting.attempt.map { $0.watch != .unwatched })
        case .open(let open):
            release = releasing(watched: Self.isWatched(open.watch))
        case .idle, .resolving, .closed:
            release = nil
        }
        phase = .failed(error)
        return (true, release)
    }

    /// Both streams are closed: the socket (if any) is let go of.
    mutating func close() -> Release? {
        let release: Release?
        switch phase {
        case .connecting(let connecting):
            release = releasing(watched: connecting.attempt.map { $0.watch != .unwatched })
        case .open(let open):
            release = releasing(watched: Self.isWatched(open.watch))
        case .failed:
            return nil
        case .idle, .resolving, .closed:
            release = nil
        }
        phase = .closed
        return release
    }

    /// Lets the socket go (`watched`: whether it is in epoll; `nil`: there is no attempt, so no socket).
    private mutating func releasing(watched: Bool?) -> Release? {
        defer {
            socket = nil
            deferredReadError = nil
        }
        guard let watched, let socket else { return nil }
        return Release(socket: socket, watched: watched)
    }

    private static func isWatched(_ watch: Watch) -> Bool {
        if case .watched = watch { return true }
        return false
    }
}
