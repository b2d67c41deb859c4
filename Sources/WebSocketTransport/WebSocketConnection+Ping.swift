public import ConnectionCore
import Synchronization
import WebSocketCodec

/// Pings and keep-alive: a ping waits for its pong (the session settles the oldest one a pong answers), a
/// deadline, a cancellation or the end, whichever comes first, and reads the connection itself when no receive
/// runs.
extension WebSocketConnection {
    /// Pings every `interval`; a ping without a pong within `deadline` fails the connection (close 1001). The ping
    /// reads the connection itself when no receive is running, so a vanished peer is seen without one.
    func startKeepAlive(every interval: Duration, deadline: Duration) {
        let clock = webSocketOptions.clock  // read here: the loop holds the connection only while it pings
        let task = Task { [weak self] in
            while !Task.isCancelled {
                try? await clock.sleep(for: interval)
                guard let self, !Task.isCancelled, state.withLock({ $0.isOpen }) else { return }
                let outcome: ConnectionError?
                do throws(ConnectionError) {
                    try await self.sendPing(timeout: deadline)
                    outcome = nil
                } catch {
                    outcome = error
                }
                if let outcome, outcome.kind != .timedOut {
                    // The connection ended or failed: the receive path reports it. When the ping could not even
                    // be sent (the peer had reset), nothing read the end yet; with no receive running, read it
                    // here, so the end is reported without one.
                    if receiveLock.tryEnter() {
                        defer { receiveLock.leave() }
                        await pump { $0.isOpen }
                    }
                    return
                }
                if outcome != nil {
                    // No pong before the deadline.
                    fail(
                        ConnectionError(
                            .timedOut, "no pong within \(deadline) of a keep-alive ping",
                            systemCode: .init(domain: "websocket", code: 1001, name: "keep-alive")))
                    try? await sendFrames([WebSocketStateMachine.closeFrame(.goingAway, "keep-alive timeout")])
                    state.withLock { $0.closeTCP() }
                    await tcp.close()
                    emitClosed(code: nil, reason: "keep-alive timeout")
                    return
                }
            }
        }
        keepAlive.withLock { $0 = task }
    }

    /// Sends a ping and waits for its pong, at most `timeout` (default ``WebSocketOptions/pongDeadline``), then
    /// fails with `.timedOut`; cancelling the task ends the wait with `.cancelled`. Works whether or not a receive
    /// is running: with none, the ping reads the connection itself until its pong arrives, answering the peer's
    /// pings and keeping data messages for the next receive (at most `ConnectionOptions.receiveQueueLimit`
    /// bytes of them; beyond that it stops reading, and the peer waits, until the user receives).
    public func sendPing(_ payload: [UInt8] = [], timeout: Duration? = nil) async throws(ConnectionError) {
        guard payload.count <= 125 else { throw ConnectionError(.messageTooLarge, "a ping carries at most 125 bytes") }
        let limit = timeout ?? webSocketOptions.pongDeadline
        let id = try state.withLock { (session) throws(ConnectionError) in try session.startPing() }
        do throws(ConnectionError) {
            try await sendFrames([WebSocketFrame(opcode: .ping, payload: payload)])
        } catch {
            resolvePing(id, .failure(error))
        }
        let result: Result<Void, ConnectionError> = await withTaskCancellationHandler {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { [self] in
                    // Cut short by cancellation: the cancellation handler settles the ping, not this timer.
                    guard (try? await webSocketOptions.clock.sleep(for: limit)) != nil else { return }
                    resolvePing(id, .failure(ConnectionError(.timedOut, "no pong within \(limit)")))
                }
                if receiveLock.tryEnter() {
                    group.addTask { [self] in
                        defer { receiveLock.leave() }
                        await pump(untilPing: id)
                    }
                }
                let result = await waitForPing(id)
                group.cancelAll()
                return result
            }
        } onCancel: {
            resolvePing(id, .failure(.cancelled()))
        }
        try result.get()
    }

    /// Settles ping `id` once (a pong, a deadline, a cancellation or a failure, whichever comes first).
    func resolvePing(_ id: UInt64, _ result: Result<Void, ConnectionError>) {
        state.withLock { $0.settle(ping: id, result) }?.resume(returning: result)
    }

    private func waitForPing(_ id: UInt64) async -> Result<Void, ConnectionError> {
        await withCheckedContinuation { continuation in
            if let settled = state.withLock({ $0.wait(forPing: id, waiter: continuation) }) {
                continuation.resume(returning: settled)
            }
        }
    }

    /// With the receive lock held and no receive running: reads frames until ping `id` is settled, the buffered
    /// data reaches the receive limit, or the connection ends.
    private func pump(untilPing id: UInt64) async {
        await pump { $0.awaitsPong(id) }
    }

    /// With the receive lock held and no receive running: reads frames while `condition` holds, until the
    /// buffered data reaches the receive limit or the connection ends (data messages are kept for the next
    /// receive).
    private func pump(while condition: (borrowing WebSocketSession<PingWaiter>) -> Bool) async {
        while state.withLock({ condition($0) }) {
            if state.withLock({ $0.pendingBytes }) >= tcp.options.receiveQueueLimit { return }
            do throws(ConnectionError) {
                switch try await readOne(duringClose: false, placingInto: nil) {
                case .delivered(.message(let message)): state.withLock { $0.keep(message) }
                case .delivered(.placed), .nothing: continue
                case .end: return
                }
            } catch {
                return
            }
        }
    }
}
