import Synchronization

/// The life of one connection, the same on every backend: which operation may run in which state, and what the
/// backend must do when something happens. A value with no I/O: it takes an event and returns the action, so
/// every transition is tested without a socket (`ConnectionLifecycleTests`), and a backend keeps no loose flags.
///
/// ```
///            send / receive: proceed
///   open ──────────────────────────────── closeOutput ──> open, output closed (send: refused)
///     │  peer's end: reportEnd (once)     failed(e): reportFailure (once; later sends refused with e)
///     │
///   close ──> closing (beginClose; a second close waits) ──closeFinished──> closed (waiters released)
/// ```
///
/// SwiftNIO's `SocketChannelLifecycleManager` is the model: a small value that owns the state and answers each
/// request with what to do, in place of a Boolean per question.
public struct ConnectionLifecycle: Sendable, Equatable {
    /// Where the connection is.
    public enum Phase: Sendable, Equatable {
        /// Usable (perhaps half-closed either way).
        case open
        /// `close()` has started; operations are refused; other closes wait for it.
        case closing
        /// Closed: its resources are released.
        case closed
    }

    /// Something asked of the connection, or something that happened to it.
    public enum Event: Sendable, Equatable {
        /// A send wants to start.
        case send
        /// A receive wants to start.
        case receive
        /// `closeOutput()` was called (half-close: send FIN).
        case closeOutput
        /// `close()` was called (or the owner went away).
        case close
        /// The backend finished what `.beginClose` asked (descriptor closed, handle's close callback ran).
        case closeFinished
        /// The peer's end of stream was read.
        case peerEnded
        /// An I/O error ended the connection.
        case failed(ConnectionError)
    }

    /// What the backend must do.
    public enum Action: Sendable, Equatable {
        /// Go on with the operation.
        case proceed
        /// Refuse the operation with this error.
        case refuse(ConnectionError)
        /// Nothing: it was done before (a second half-close, a close of a closed connection, an end or an error
        /// after the first).
        case none
        /// Send FIN now (shutdown SHUT_WR).
        case shutdownOutput
        /// The first close: release everything, then report `.closeFinished`.
        case beginClose
        /// Another close is under way: wait for its `.closeFinished`.
        case waitForClose
        /// The close is complete: release those waiting for it.
        case closeComplete
        /// Report the end of the stream to the receiver (once).
        case reportEnd
        /// Report this failure (once).
        case reportFailure(ConnectionError)
    }

    public private(set) var phase: Phase = .open
    /// Our side sent FIN.
    public private(set) var outputClosed = false
    /// The peer's end was read.
    public private(set) var inputEnded = false
    /// The error that ended the connection, if one did.
    public private(set) var failure: ConnectionError?

    /// An open connection.
    public init() {}

    /// `true` while open (half-closed counts as open).
    public var isOpen: Bool { phase == .open }

    /// Takes `event`, moves to the next state, and returns what the backend must do.
    public mutating func handle(_ event: Event) -> Action {
        switch (event, phase) {
        case (.send, .open):
            if let failure { return .refuse(failure) }
            if outputClosed { return .refuse(.closed("the output was closed (half-close)")) }
            return .proceed
        case (.receive, .open):
            return .proceed
        case (.send, _), (.receive, _):
            return .refuse(.closed())
        case (.closeOutput, .open):
            if outputClosed { return .none }
            if let failure { return .refuse(failure) }
            outputClosed = true
            return .shutdownOutput
        case (.closeOutput, _):
            return .refuse(.closed())
        case (.close, .open):
            phase = .closing
            return .beginClose
        case (.close, .closing):
            return .waitForClose
        case (.close, .closed):
            return .none
        case (.closeFinished, .closing):
            phase = .closed
            return .closeComplete
        case (.closeFinished, _):
            return .none
        case (.peerEnded, .open):
            if inputEnded || failure != nil { return .none }
            inputEnded = true
            return .reportEnd
        case (.peerEnded, _):
            return .none
        case (.failed(let error), .open):
            if failure != nil { return .none }
            failure = error
            return .reportFailure(error)
        case (.failed, _):
            return .none
        }
    }
}

/// A ``ConnectionLifecycle`` shared by the threads and tasks of one connection, with the waiting that closing
/// needs: every `close()` returns once the one close has finished.
public final class SharedLifecycle: Sendable {
    private struct State {
        var lifecycle = ConnectionLifecycle()
        var closeWaiters: [CheckedContinuation<Void, Never>] = []
    }
    private let state = Guarded(State())

    /// An open connection's.
    public init() {}

    /// Takes `event` (any but `.close` and `.closeFinished`, which ``close(_:)`` and ``closeFinished()`` take).
    @inline(__always)
    public func handle(_ event: ConnectionLifecycle.Event) -> ConnectionLifecycle.Action {
        state.withLock { $0.lifecycle.handle(event) }
    }

    /// A copy of the state, to look at.
    public var current: ConnectionLifecycle { state.withLock { $0.lifecycle } }

    /// `true` while open.
    public var isOpen: Bool { state.withLock { $0.lifecycle.isOpen } }

    /// Closes waiting for the close under way (for tests and diagnostics).
    public var closesWaiting: Int { state.withLock { $0.closeWaiters.count } }

    /// Closes once: the first caller runs `begin`, which releases what the connection holds and calls `finished`
    /// when that is done (at once, or from a close callback on a loop); every caller returns after that.
    public func close(_ begin: (_ finished: @escaping @Sendable () -> Void) -> Void) async {
        switch state.withLock({ $0.lifecycle.handle(.close) }) {
        case .beginClose:
            await withCheckedContinuation { continuation in
                state.withLock { $0.closeWaiters.append(continuation) }
                begin { [self] in closeFinished() }
            }
        case .waitForClose:
            await waitForClose()
        default:
            return
        }
    }

    /// Closes once, the close being async code: the first caller runs `body`; every caller returns after it.
    public func close(running body: () async -> Void) async {
        switch state.withLock({ $0.lifecycle.handle(.close) }) {
        case .beginClose:
            await body()
            closeFinished()
        case .waitForClose:
            await waitForClose()
        default:
            return
        }
    }

    private func waitForClose() async {
        await withCheckedContinuation { continuation in
            let closed = state.withLock { state in
                if state.lifecycle.phase == .closed { return true }
                state.closeWaiters.append(continuation)
                return false
            }
            if closed { continuation.resume() }
        }
    }

    /// Starts closing without waiting (from `deinit`): `true` for the first close, which must then release what
    /// the connection holds.
    public func beginCloseWithoutWaiting() -> Bool {
        state.withLock { $0.lifecycle.handle(.close) } == .beginClose
    }

    /// The close begun by ``close(_:)`` has finished: releases every close waiting.
    public func closeFinished() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            guard state.lifecycle.handle(.closeFinished) == .closeComplete else { return [] }
            defer { state.closeWaiters = [] }
            return state.closeWaiters
        }
        for waiter in waiters { waiter.resume() }
    }
}
