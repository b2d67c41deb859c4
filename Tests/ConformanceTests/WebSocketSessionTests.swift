import ConnectionTestKit
import SocketStyles
import Testing
import WebSocketCodec
import WebSocketTransport

/// `WebSocketSession`, the state of a WebSocket connection above its frames, driven by hand: no connection, no
/// task, no clock. A ping's waiter is a plain number here (a continuation in `WebSocketConnection`).
@Suite("WebSocket session (no I/O)", .timeLimit(.minutes(1)))
struct WebSocketSessionTests {
    typealias Session = WebSocketSession<Int>

    static func session(_ role: WebSocketRole = .client, maximumMessageSize: Int = 1 << 20) -> Session {
        Session(role: role, maximumMessageSize: maximumMessageSize, deflate: nil)
    }

    @Test("A pong settles the oldest ping; a waiter registered after its settling gets the kept result")
    func pings() throws {
        var session = Self.session()
        let first = try session.startPing()
        let second = try session.startPing()
        let early = session.wait(forPing: first, waiter: 1)
        #expect(early == nil)
        let actions = session.receive(WebSocketFrame(opcode: .pong, payload: [1]))
        #expect(actions == [.pongReceived([1])])
        #expect(session.oldestPing == first)
        let waiter = session.settle(ping: first, .success(()))
        #expect(waiter == 1)  // resume waiter 1
        let again = session.settle(ping: first, .failure(.closed()))
        #expect(again == nil)  // once only
        // The second is settled (a deadline) before its sender waits: the result is kept for it.
        let nobody = session.settle(ping: second, .failure(ConnectionError(.timedOut, "no pong")))
        #expect(nobody == nil)
        let kept = session.wait(forPing: second, waiter: 2)
        #expect(throws: ConnectionError.self) { try kept?.get() }
        #expect(session.pingsInFlight.isEmpty)
    }

    @Test("A failure stays the first one, is thrown by every later send and ping, and names the pings to fail")
    func failure() throws {
        var session = Self.session()
        let ping = try session.startPing()
        let toFail = session.fail(ConnectionError(.reset, "first"))
        #expect(toFail == [ping])
        _ = session.fail(ConnectionError(.timedOut, "second"))
        #expect(session.failure?.kind == .reset)
        #expect(throws: ConnectionError.self) { try session.admitSend(bytes: 1, onWire: 1) }
        #expect(throws: ConnectionError.self) { _ = try session.startPing() }
        #expect(!session.awaitsPong(ping))
    }

    @Test("Sends are counted while open and refused once the close handshake began")
    func sendsAndClose() throws {
        var session = Self.session()
        try session.admitSend(bytes: 10, onWire: 10)
        try session.admitSend(bytes: 100, onWire: 0)
        session.countCompressedPayload(40)
        #expect(session.sent.messages == 2 && session.sent.messageBytes == 110 && session.sent.payloadBytes == 50)
        let frames = session.beginClose(.normalClosure, reason: "bye")
        #expect(frames.count == 1 && frames.first?.opcode == .close)
        let second = session.beginClose(.normalClosure, reason: "again")
        #expect(second.isEmpty)  // one close frame
        do {
            try session.admitSend(bytes: 1, onWire: 1)
            Issue.record("a send after close was admitted")
        } catch {
            #expect(error.kind == .closed)
        }
        // The peer's close frame ends the handshake: TCP may close, and that end is clean.
        let actions = session.receive(WebSocketFrame(opcode: .close, payload: [0x03, 0xE8]))
        #expect(actions.contains(.closeConnection))
        let clean = session.tcpEnded()
        #expect(clean)
    }

    @Test("TCP ending without a close frame is not clean; the end is reported once, .closed after a local close")
    func ends() throws {
        var peerVanished = Self.session(.server)
        let clean = peerVanished.tcpEnded()
        #expect(!clean)
        try peerVanished.reportEnd(duringClose: false)
        #expect(throws: ConnectionError.self) { try peerVanished.reportEnd(duringClose: false) }

        var closedHere = Self.session()
        closedHere.markLocallyClosed()
        closedHere.closeTCP()
        #expect(throws: ConnectionError.self) { try closedHere.reportEnd(duringClose: false) }
        try closedHere.reportEnd(duringClose: true)  // the close handshake's own read sees the end
    }

    @Test("Messages a ping read wait in order for the next receives, their bytes counted")
    func keptMessages() {
        var session = Self.session()
        session.keep(Message([1, 2, 3]))
        session.keep(.text("four"))
        #expect(session.pendingBytes == 7)
        let first = session.takeKept()
        let second = session.takeKept()
        let none = session.takeKept()
        #expect(first == Message([1, 2, 3]))
        #expect(second == .text("four"))
        #expect(none == nil && session.pendingBytes == 0)
    }

    @Test("A message over the limit and a frame the parser refused fail the connection with their codes")
    func violations() {
        var session = Self.session(.server, maximumMessageSize: 4)
        let tooBig = session.receive(WebSocketFrame(opcode: .binary, payload: [0, 1, 2, 3, 4]))
        #expect(
            tooBig.contains { if case .failed(let error) = $0 { error.closeCode == .messageTooBig } else { false } })
        var other = Self.session(.server)
        let refused = other.refuse(WebSocketProtocolError(.protocolError, "a bad frame"))
        #expect(
            refused.contains { if case .failed(let error) = $0 { error.closeCode == .protocolError } else { false } })
        #expect(!other.isOpen)
    }

    @Test("Received data counts messages and frame payloads; a ping is answered, not counted")
    func receivedCounts() {
        var session = Self.session(.server)
        let actions = session.receive(WebSocketFrame(opcode: .ping, payload: [9]))
        #expect(actions.contains(.pingReceived([9])))
        #expect(actions.contains { if case .send(let frame) = $0 { frame.opcode == .pong } else { false } })
        _ = session.receive(WebSocketFrame(opcode: .text, payload: Array("hi".utf8)))
        #expect(session.received.messages == 1 && session.received.messageBytes == 2)
        #expect(session.received.payloadBytes == 2)
    }
}
