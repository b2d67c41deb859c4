package import ConnectionCore
package import WebSocketCodec

/// The state of one open WebSocket connection above its frames, with no I/O: what may be sent, the pings waiting
/// for their pongs, the data a ping read while no receive ran, how the connection ended, and the traffic counts.
/// `WebSocketConnection` is its driver: it holds the session under a lock, reads and writes frames, and carries
/// out what the session decides (resume a ping's waiter, close TCP, report the end). Frame-level rules (control
/// frames, fragments, the close handshake's frames) are `WebSocketStateMachine`'s, which the session wraps.
///
/// `PingWaiter` is whatever the driver resumes when a ping is settled (a continuation there, a plain value in
/// tests): the session only keeps it and hands it back.
///
/// ```swift
/// var session = WebSocketSession<Int>(role: .client, maximumMessageSize: 1 << 20, deflate: nil)
/// let ping = try session.startPing()
/// _ = session.wait(forPing: ping, waiter: 7)  // nil: not settled yet, 7 kept
/// _ = session.receive(WebSocketFrame(opcode: .pong, payload: []))  // [.pongReceived([])]
/// let waiter = session.settle(ping: session.oldestPing!, .success(()))  // 7: resume it
/// ```
package struct WebSocketSession<PingWaiter: Sendable>: Sendable {
    package private(set) var machine: WebSocketStateMachine
    /// Pings waiting for their pong. A waiter is registered before its ping is sent, so a pong that comes back at
    /// once always finds it.
    private var pingWaiters: [UInt64: PingWaiter] = [:]
    /// Pings sent and not yet settled, oldest first: a pong settles the oldest.
    package private(set) var pingsInFlight: [UInt64] = []
    /// Pings settled before their sender started waiting.
    private var pingResults: [UInt64: Result<Void, ConnectionError>] = [:]
    private var nextPingID: UInt64 = 0
    /// Data messages read by a ping while no receive was running, for the next receives.
    private var pending: [Message] = []
    /// Their bytes (a ping stops reading at the receive limit).
    package private(set) var pendingBytes = 0
    /// The TCP connection underneath is closed (or closing): nothing more is read.
    package private(set) var tcpClosed = false
    private var endReported = false
    /// Why the connection failed, once it did: every later operation throws it.
    package private(set) var failure: ConnectionError?
    /// close() was called here: a receive that finds the end reports `.closed`, not a clean end.
    private var locallyClosed = false
    private var maskingKeys = MaskingKeys()
    /// Data messages sent so far.
    package private(set) var sent = WebSocketTrafficCounts()
    /// Data messages received so far.
    package private(set) var received = WebSocketTrafficCounts()

    package init(role: WebSocketRole, maximumMessageSize: Int, deflate: WebSocketDeflateAgreement?) {
        machine = WebSocketStateMachine(role: role, maximumMessageSize: maximumMessageSize, deflate: deflate)
    }

    /// Open, with TCP still there: keep-alive pings only then.
    package var isOpen: Bool { machine.state == .open && !tcpClosed }

    // MARK: Sending

    /// Admits a data message of `bytes` bytes (`onWire` of them counted as frame payload now; a compressed one
    /// counts its payload with ``countCompressedPayload(_:)``). Throws the failure, or `.closed` once the close
    /// handshake began.
    package mutating func admitSend(bytes: Int, onWire: Int) throws(ConnectionError) {
        if let failure { throw failure }
        guard machine.state == .open else { throw .closed("the WebSocket is closing or closed") }
        sent.count(bytes, onWire: onWire)
    }

    /// Counts the frame payload of a message that was compressed after ``admitSend(bytes:onWire:)``.
    package mutating func countCompressedPayload(_ bytes: Int) {
        sent.payloadBytes += bytes
    }

    /// The masking key of a client's next frame.
    package mutating func nextMaskingKey() -> UInt32 {
        maskingKeys.next()
    }

    // MARK: Pings

    /// Starts a ping: its id, in flight until a pong, a deadline, a cancellation or the end settles it.
    package mutating func startPing() throws(ConnectionError) -> UInt64 {
        if let failure { throw failure }
        if tcpClosed { throw .closed() }
        nextPingID += 1
        pingResults[nextPingID] = nil
        pingsInFlight.append(nextPingID)
        return nextPingID
    }

    /// The ping a pong settles: the oldest in flight.
    package var oldestPing: UInt64? { pingsInFlight.first }

    /// Settles ping `id` with `result`, once: returns its waiter to resume with it, or `nil` (already settled, or
    /// nobody waits yet: the result is kept for ``wait(forPing:waiter:)``).
    package mutating func settle(ping id: UInt64, _ result: Result<Void, ConnectionError>) -> PingWaiter? {
        guard let index = pingsInFlight.firstIndex(of: id) else { return nil }
        pingsInFlight.remove(at: index)
        if let waiter = pingWaiters.removeValue(forKey: id) { return waiter }
        pingResults[id] = result
        return nil
    }

    /// Waits for ping `id`: its result when it was settled already, otherwise `nil` and `waiter` is kept for
    /// ``settle(ping:_:)``.
    package mutating func wait(forPing id: UInt64, waiter: PingWaiter) -> Result<Void, ConnectionError>? {
        if let result = pingResults.removeValue(forKey: id) { return result }
        pingWaiters[id] = waiter
        return nil
    }

    /// Whether a ping reading the connection for its pong should read on.
    package func awaitsPong(_ id: UInt64) -> Bool {
        pingsInFlight.contains(id) && !tcpClosed && failure == nil
    }

    /// Keeps a data message a ping read while no receive ran.
    package mutating func keep(_ message: Message) {
        pending.append(message)
        pendingBytes += message.bytes.count
    }

    /// The oldest message a ping kept, for a receive.
    package mutating func takeKept() -> Message? {
        guard !pending.isEmpty else { return nil }
        let message = pending.removeFirst()
        pendingBytes -= message.bytes.count
        return message
    }

    // MARK: Receiving

    /// A frame read: the state machine's actions, with the traffic counted.
    package mutating func receive(_ frame: WebSocketFrame) -> [WebSocketStateMachine.Action] {
        let actions = machine.receive(frame)
        if !frame.opcode.isControl { received.payloadBytes += frame.payload.count }
        for case .deliver(_, let payload) in actions { received.count(payload.count, onWire: 0) }
        return actions
    }

    /// A frame the link placed in the receive's buffer (`count` bytes of `payload`).
    package mutating func receivePlaced(
        text: Bool, payload: UnsafeRawBufferPointer
    ) -> WebSocketStateMachine.PlacedOutcome {
        let outcome = machine.receivePlaced(text: text, payload: payload)
        received.payloadBytes += payload.count
        if outcome == .deliver { received.count(payload.count, onWire: 0) }
        return outcome
    }

    /// A frame the parser refused: the connection fails (1002, or 1009 for a frame too large).
    package mutating func refuse(_ error: WebSocketProtocolError) -> [WebSocketStateMachine.Action] {
        machine.failConnection(error)
    }

    /// TCP ended under the session. Returns whether the close handshake had finished (a clean end); otherwise
    /// the driver fails the connection with 1006.
    package mutating func tcpEnded() -> Bool {
        tcpClosed = true
        defer { machine.connectionLost() }
        return machine.peerClose != nil
    }

    /// The driver closed (or is closing) TCP.
    package mutating func closeTCP() {
        tcpClosed = true
    }

    /// A receive that finds TCP closed: throws the failure, `.closed` after a local close (unless the close
    /// handshake itself is reading) or once the end was reported; otherwise reports the end, once.
    package mutating func reportEnd(duringClose: Bool) throws(ConnectionError) {
        if let failure { throw failure }
        if locallyClosed && !duringClose { throw .closed() }
        if endReported { throw .closed("the end of the stream was already reported") }
        endReported = true
    }

    // MARK: Failing and closing

    /// Fails the connection with `error` (the first failure stays). Returns the pings to settle with it.
    package mutating func fail(_ error: ConnectionError) -> [UInt64] {
        if failure == nil { failure = error }
        return pingsInFlight
    }

    /// Begins the close handshake here: the frames to send (none when it began already).
    package mutating func beginClose(_ code: WebSocketCloseCode, reason: String) -> [WebSocketFrame] {
        locallyClosed = true
        return machine.close(code, reason: reason).compactMap {
            if case .send(let frame) = $0 { return frame } else { return nil }
        }
    }

    /// Closed here without a close frame (abort).
    package mutating func markLocallyClosed() {
        locallyClosed = true
    }
}
