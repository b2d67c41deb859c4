import ConnectionCore
import POSIXSupport
import Testing

@testable import RunLoopBackend

/// The run-loop stream pair's state machine with no socket: the socket is a number it carries and hands back, and
/// each test takes it through events and checks what it decides (as ConnectionLifecycleTests does for the
/// connection lifecycle).
@Suite("stream pair state", .timeLimit(.minutes(1)))
struct StreamPairStateTests {
    typealias State = StreamPairState<Int>

    static let endpoint = Endpoint(transport: .tcp, host: .ipv4("127.0.0.1"), port: 9)
    static let addresses = [SocketAddress.loopbackIPv4(port: 9), SocketAddress.loopbackIPv4(port: 10)]

    /// A pair that connected on socket 7, both streams open, its interest worked out once.
    static func opened() -> State {
        var state = State()
        #expect(state.beginConnecting() == true)
        state.resolved(ConnectAttempts(addresses, endpoint: endpoint, timeout: .seconds(10)))
        let address = try! #require(try state.nextAddress())
        state.attempting(7, to: address)
        _ = state.updateInterest(inputOpen: false, outputOpen: false)
        state.connected()
        _ = state.updateInterest(inputOpen: true, outputOpen: true)
        _ = state.takeDue()
        return state
    }

    @Test("Connecting: one start, each attempt's socket watched for writable and let go of when it fails, then open")
    func connecting() throws {
        var state = State()
        #expect(state.beginConnecting() == true)
        #expect(state.beginConnecting() == false, "the second stream to open does not start another connect")
        #expect(state.isConnecting && state.socket == nil)
        state.resolved(ConnectAttempts(Self.addresses, endpoint: Self.endpoint, timeout: .seconds(10)))
        let first = try #require(try state.nextAddress())
        state.attempting(5, to: first)
        #expect(state.socket == 5 && state.attemptAddress == first)
        #expect(state.updateInterest(inputOpen: false, outputOpen: false).change == .register(.write))
        let (release, end) = state.attemptFailed(ConnectionError(.refused, "refused"))
        #expect(release?.socket == 5 && release?.watched == true && end == nil)
        #expect(state.socket == nil)
        let second = try #require(try state.nextAddress())
        #expect(second != first)
        state.attempting(6, to: second)
        _ = state.updateInterest(inputOpen: false, outputOpen: false)
        state.connected()
        #expect(state.isOpen && state.socket == 6)
        // Open: the write interest of the connect gives way to the read interest; the output's first
        // hasSpaceAvailable is due on the next turn, without epoll.
        let (change, newlyDue) = state.updateInterest(inputOpen: true, outputOpen: true)
        #expect(change == .modify(.read) && newlyDue)
        #expect(try state.nextAddress() == nil, "no address is tried once open")
    }

    @Test("Connecting: no address left gives the last error; a timeout ends the search at once")
    func connectErrors() throws {
        var state = State()
        _ = state.beginConnecting()
        state.resolved(ConnectAttempts([Self.addresses[0]], endpoint: Self.endpoint, timeout: .seconds(10)))
        state.attempting(5, to: try #require(try state.nextAddress()))
        #expect(state.attemptFailed(ConnectionError(.refused, "refused")).end == nil)
        #expect(try state.nextAddress() == nil)
        #expect(state.lastConnectError.kind == .refused)
        let (release, end) = state.attemptFailed(ConnectionError(.timedOut, "too long"))
        #expect(release == nil && end?.kind == .timedOut)
    }

    @Test("The socket is let go of exactly once: by a failed attempt, a failure or the close, never twice")
    func releasedOnce() {
        var state = Self.opened()
        let failed = state.fail(ConnectionError(.reset, "reset"))
        #expect(failed.first && failed.release?.socket == 7 && failed.release?.watched == true)
        #expect(state.failure?.kind == .reset && state.socket == nil)
        let again = state.fail(ConnectionError(.reset, "again"))
        #expect(!again.first && again.release == nil, "a second failure is not reported")
        #expect(state.close() == nil, "closing after a failure releases nothing more")

        var closing = Self.opened()
        #expect(closing.close()?.socket == 7)
        #expect(closing.close() == nil)
        #expect(closing.fail(ConnectionError(.reset, "late")).release == nil)

        var idle = State()
        #expect(idle.close() == nil, "a pair never opened has no socket")
        var accepted = State(accepted: 3)
        #expect(accepted.isOpen && accepted.socket == 3)
        #expect(accepted.updateInterest(inputOpen: true, outputOpen: false).change == .register(.read))
        #expect(accepted.close().map { ($0.socket, $0.watched) } ?? (0, false) == (3, true))
    }

    @Test(
        "Input: hasBytesAvailable once, not again until the delegate reads; the read interest off only if epoll insists"
    )
    func inputArming() {
        var state = Self.opened()
        let readable: SocketEvents = [.readable]
        #expect(
            state.inputStep(readable, inputOpen: true, toleratesEmptyReads: true, unreadBytes: { true })
                == .deliverBytes)
        #expect(state.open?.input == .delivered)
        // Still watched: most delegates read at once, and a read re-arms with no epoll_ctl.
        #expect(state.updateInterest(inputOpen: true, outputOpen: true).change == nil)
        // epoll reports it again before a read: the interest comes off.
        #expect(
            state.inputStep(readable, inputOpen: true, toleratesEmptyReads: true, unreadBytes: { true }) == .nothing)
        #expect(state.open?.input == .deliveredUnwatched)
        #expect(state.updateInterest(inputOpen: true, outputOpen: true).change == .modify([]))
        state.delegateRead()
        #expect(state.open?.input == .armed)
        #expect(state.updateInterest(inputOpen: true, outputOpen: true).change == .modify(.read))
        // A delegate that needs exact events reads ahead first.
        #expect(
            state.inputStep(readable, inputOpen: true, toleratesEmptyReads: false, unreadBytes: { true }) == .readAhead)
        #expect(state.open?.input == .armed, "not delivered until the read ahead finds bytes")
        state.inputDelivered()
        #expect(state.open?.input == .delivered)
        // A closed input takes no events.
        #expect(
            state.inputStep(readable, inputOpen: false, toleratesEmptyReads: true, unreadBytes: { true }) == .nothing)
    }

    @Test("Input: a hang-up while not re-armed delivers the end only once every byte is read, and the end only once")
    func inputEnd() {
        var state = Self.opened()
        _ = state.inputStep([.readable], inputOpen: true, toleratesEmptyReads: true, unreadBytes: { true })
        #expect(
            state.inputStep([.readHangUp], inputOpen: true, toleratesEmptyReads: true, unreadBytes: { true })
                == .nothing)
        #expect(
            state.inputStep(
                [.readable, .readHangUp], inputOpen: true, toleratesEmptyReads: true, unreadBytes: { false })
                == .checkEnd)
        #expect(state.inputEnded() == true)
        #expect(state.inputEnded() == false)
        state.delegateRead()
        #expect(state.open?.input == .ended, "a read after the end does not re-arm")
        #expect(state.updateInterest(inputOpen: true, outputOpen: true).change == .modify([]))
        #expect(
            state.inputStep([.hangUp], inputOpen: true, toleratesEmptyReads: true, unreadBytes: { false }) == .nothing)
    }

    @Test("Output: hasSpaceAvailable on the next turn while there is room, from epoll once a write found it full")
    func outputArming() {
        var state = State(accepted: 9)
        var interest = state.updateInterest(inputOpen: true, outputOpen: true)
        #expect(interest.change == .register(.read) && interest.newlyDue)
        #expect(!state.updateInterest(inputOpen: true, outputOpen: true).newlyDue, "one turn asked for, not two")
        #expect(state.takeDue() == .output)
        #expect(state.spaceStillDue(outputOpen: true) == true)
        #expect(state.spaceStillDue(outputOpen: true) == false, "not again until a write")
        // A write that takes everything re-arms with room: due on the next turn again, no epoll.
        #expect(state.delegateWrote(all: true) == true)
        interest = state.updateInterest(inputOpen: true, outputOpen: true)
        #expect(interest.change == nil && interest.newlyDue)
        // Another such write changes nothing: no interest to work out.
        #expect(state.delegateWrote(all: true) == false)
        _ = state.takeDue()
        #expect(state.spaceStillDue(outputOpen: true) == true)
        // A write the socket did not take whole: watched for writable, delivered by epoll.
        #expect(state.delegateWrote(all: false) == true)
        #expect(state.updateInterest(inputOpen: true, outputOpen: true).change == .modify([.read, .write]))
        #expect(state.writable([.readable], outputOpen: true) == false)
        #expect(state.writable([.writable], outputOpen: true) == true)
        #expect(state.writable([.writable], outputOpen: true) == false, "not again until a write")
        #expect(state.updateInterest(inputOpen: true, outputOpen: true).change == .modify(.read))
        #expect(state.writable([.writable], outputOpen: false) == false)
    }

    @Test("Broken: an error or hang-up with bytes still to read takes the socket out of epoll; events come by turns")
    func broken() {
        var state = Self.opened()
        #expect(!state.mustBreakAway([.readable], inputOpen: true, unreadBytes: { true }))
        #expect(!state.mustBreakAway([.hangUp], inputOpen: true, unreadBytes: { false }), "nothing left to read")
        #expect(!state.mustBreakAway([.error], inputOpen: false, unreadBytes: { true }))
        #expect(state.mustBreakAway([.error, .readable], inputOpen: true, unreadBytes: { true }))
        _ = state.delegateWrote(all: false)
        #expect(state.breakAway() == .unregister)
        #expect(state.open?.watch == .broken && state.open?.output == .armedWithRoom, "a write finds out at once")
        let (change, newlyDue) = state.updateInterest(inputOpen: true, outputOpen: true)
        #expect(change == nil && newlyDue)
        #expect(state.takeDue() == [.input, .output])
        #expect(state.inputStillDue(inputOpen: true))
        #expect(state.spaceStillDue(outputOpen: true) == true)
        // The read ahead found nothing after all: back under epoll, registered anew.
        state.rejoin()
        #expect(state.updateInterest(inputOpen: true, outputOpen: true).change == .register(.read))
        var ended = Self.opened()
        _ = ended.inputEnded()
        #expect(!ended.mustBreakAway([.hangUp], inputOpen: true, unreadBytes: { true }), "the end was delivered")
    }

    @Test("A read's error after the read-ahead's bytes waits for the next read, once")
    func deferredReadError() {
        var state = Self.opened()
        #expect(state.takeDeferredReadError() == nil)
        state.deferReadError(ConnectionError(.reset, "reset"))
        #expect(state.takeDeferredReadError()?.kind == .reset)
        #expect(state.takeDeferredReadError() == nil)
    }
}
