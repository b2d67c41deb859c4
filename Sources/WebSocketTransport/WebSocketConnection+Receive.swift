public import ConnectionCore
import Synchronization
import WebSocketCodec

/// Receiving: one frame at a time from the link, through the session (which answers pings, reassembles
/// fragments and runs the close handshake's rules), and the session's actions carried out here.
extension WebSocketConnection {
    public func receive(maximumLength: Int) async throws(ConnectionError) -> Message? {
        switch try await receive(duringClose: false) {
        case .message(let message): return message
        case .placed, nil: return nil  // nothing is placed without a buffer
        }
    }

    /// Receives one message into the caller's buffer. A message that comes in one frame (uncompressed) is
    /// unmasked straight from the read buffer into it: no array of its own and no second copy, which is most of
    /// what a WebSocket server's bulk receive costs over TCP's. Other messages (fragmented, compressed, or read
    /// meanwhile by a ping) are received as ``receive(maximumLength:)`` receives them and copied in. A message
    /// larger than the buffer is lost with `.messageTooLarge`, as the contract says.
    public func receive(into buffer: UnsafeMutableRawBufferPointer) async throws(ConnectionError) -> Received? {
        try Received.requireRoom(buffer)
        switch try await receive(duringClose: false, placingInto: buffer) {
        case .message(let message): return try Received.copy(message, into: buffer)
        case .placed(let received): return received
        case nil: return nil
        }
    }

    /// A message received: in an array of its own, or already in the receive's buffer.
    enum Delivery {
        case message(Message)
        case placed(Received)
    }

    func receive(
        duringClose: Bool, placingInto destination: UnsafeMutableRawBufferPointer? = nil
    ) async throws(ConnectionError) -> Delivery? {
        await receiveLock.enter()
        defer { receiveLock.leave() }
        while true {
            if let kept = state.withLock({ $0.takeKept() }) { return .message(kept) }
            switch try await readOne(duringClose: duringClose, placingInto: destination) {
            case .delivered(let delivery): return delivery
            case .nothing: continue
            case .end: return nil
            }
        }
    }

    enum ReadOutcome {
        case delivered(Delivery)
        /// A frame that completed no message (a control frame, a fragment), or the end just seen.
        case nothing
        /// The end of the stream, reported (once; after it, receives throw).
        case end
    }

    /// Reads and handles one frame (holding the receive lock); with a `destination`, a message in one frame is
    /// placed there.
    func readOne(
        duringClose: Bool, placingInto destination: UnsafeMutableRawBufferPointer?
    ) async throws(ConnectionError) -> ReadOutcome {
        if let failure = state.withLock({ $0.failure }) { throw failure }
        if state.withLock({ $0.tcpClosed }) {
            try state.withLock { (session) throws(ConnectionError) in try session.reportEnd(duringClose: duringClose) }
            return .end
        }
        let received: WebSocketLinkInput?
        do throws(ConnectionError) {
            received = try await link.receive(placingInto: destination)
        } catch {
            // The connection may have been failed meanwhile (a keep-alive timeout closes TCP): say why.
            throw state.withLock { $0.failure } ?? error
        }
        switch received {
        case .frame(let frame):
            return try await handle(state.withLock { $0.receive(frame) }).map { .delivered(.message($0)) } ?? .nothing
        case .placed(let text, let count):
            guard let destination else { preconditionFailure("a frame was placed without a buffer") }
            let payload = UnsafeRawBufferPointer(rebasing: destination[..<count])
            switch state.withLock({ $0.receivePlaced(text: text, payload: payload) }) {
            case .deliver: return .delivered(.placed(Received(count: count, kind: text ? .text : .binary)))
            case .actions(let actions):
                try await handle(actions)
                return .nothing
            }
        case .invalid(let error):
            try await handle(state.withLock { $0.refuse(error) })
            return .nothing
        case nil:
            await tcpEnded()
            return .nothing
        }
    }

    /// TCP ended: cleanly after a close handshake, abnormally otherwise (1006, never sent). Out of `readOne`, which
    /// is on every message's way: its frame stays on a waiting task's stack.
    @inline(never)
    private func tcpEnded() async {
        let handshakeDone = state.withLock { $0.tcpEnded() }
        await tcp.close()
        if !handshakeDone {
            fail(
                ConnectionError(
                    .reset, "the peer closed TCP without a close frame (1006)",
                    systemCode: .init(domain: "websocket", code: 1006, name: "abnormal closure")))
        }
        settlePings(.closed("the connection ended before the pong"))
        emitClosed(code: peerCloseCode, reason: peerCloseReason ?? "")
    }

    /// Carries out the state machine's actions; returns a delivered message, if any. Only the sends and the
    /// closing are async; everything else is done by ``react(to:delivering:)``, outside this frame: a task keeps its
    /// deepest stack's frames for as long as it lives, and this one is on every message's way (it held 800 bytes
    /// with the rest inlined, a third task-allocator slab for every idle WebSocket connection; docs/benchmarks.md).
    @discardableResult
    private func handle(_ actions: [WebSocketStateMachine.Action]) async throws(ConnectionError) -> Message? {
        var delivered: Message?
        var next = 0
        while next < actions.count {
            let index = next
            next += 1
            switch react(to: actions, at: index, delivering: &delivered) {
            case .nothing: break
            case .send: await sendReply(Self.frame(of: actions[index]))
            case .closeConnection: await closeConnection()
            }
        }
        return delivered
    }

    /// What is left for ``handle(_:)`` to do after an action's synchronous part (by the action's index: the
    /// action itself, a frame in it, would take room in the async frame).
    private enum FollowUp {
        case nothing
        case send
        case closeConnection
    }

    private static func frame(of action: WebSocketStateMachine.Action) -> WebSocketFrame {
        guard case .send(let frame) = action else { preconditionFailure("not a send") }
        return frame
    }

    @inline(never)
    private func react(
        to actions: [WebSocketStateMachine.Action], at index: Int, delivering delivered: inout Message?
    ) -> FollowUp {
        switch actions[index] {
        case .deliver(let text, let payload):
            delivered = Message(kind: text ? .text : .binary, bytes: payload)
        case .send:
            return .send
        case .pingReceived(let payload):
            if webSocketOptions.reportsControlFrames { eventSink.yield(.ping(payload)) }
        case .pongReceived(let payload):
            if webSocketOptions.reportsControlFrames { eventSink.yield(.pong(payload)) }
            if let oldest = state.withLock({ $0.oldestPing }) { resolvePing(oldest, .success(())) }
        case .closeReceived:
            break
        case .failed(let error):
            let kind: ConnectionError.Kind = error.closeCode == .messageTooBig ? .messageTooLarge : .protocolViolation
            fail(
                ConnectionError(
                    kind, error.reason,
                    systemCode: .init(
                        domain: "websocket", code: Int32(error.closeCode.rawValue), name: "\(error.closeCode)")))
        case .closeConnection:
            return .closeConnection
        }
        return .nothing
    }

    /// A reply the state machine asked for (a pong, a close): a failure to send it is the connection's, which the
    /// next receive or send reports.
    @inline(never)
    private func sendReply(_ frame: WebSocketFrame) async {
        try? await sendFrames([frame])
    }

    @inline(never)
    private func closeConnection() async {
        await closeTCP()
        settlePings(.closed("the connection closed before the pong"))
        emitClosed(code: peerCloseCode, reason: peerCloseReason ?? "")
    }
}
