// One piece, over 400 lines: each method carries out one of StreamPairState's decisions on the same socket, epoll
// registration and pair of streams.

import ConnectionCore
import POSIXSupport

/// The socket shared by an input and an output stream (on the run loop's thread only): does what its
/// ``StreamPairState`` decides at each event (the system calls, epoll, the deliveries to the delegates).
///
/// The Darwin contract: `hasBytesAvailable` is delivered, then not again until the client reads;
/// `hasSpaceAvailable` likewise until it writes ("re-armed only after the delegate has read/written").
///
/// Epoll interest is level-triggered and changed only when it must be, so a message costs no `epoll_ctl`:
/// input interest stays on while the input is open, and is taken off only when a readable event finds the
/// delegate has not read since the last `hasBytesAvailable` (otherwise epoll would report it every turn);
/// output interest is on only while a write found the socket full; a due `hasSpaceAvailable` on a socket with
/// room is delivered on the next turn without epoll. A readable event costs a read ahead of the delegate's (bytes:
/// delivered as `hasBytesAvailable` and served by the delegate's next read; nothing: no event; 0: the end).
final class StreamPairCore: EpollHandler, @unchecked Sendable {
    let endpoint: Endpoint
    let options: ConnectionOptions
    /// On the run loop's thread only, and with its exclusivity unchecked at run time: each access of a class's
    /// stored property is otherwise checked by `swift_beginAccess` against a thread-local set of open accesses,
    /// several times an event. No two accesses can overlap: ``StreamPairState``'s methods call nothing of this
    /// object but ``unreadBytes(_:)``, which reads ``readAhead``, not the state.
    @exclusivity(unchecked) private var state: StreamPairState<SocketDescriptor>
    /// Writes from other threads while the output is open (``writeFromAnyThread(_:)``).
    private let direct = DirectSend()
    private var runLoop: SocketRunLoop?
    /// Each stream from its `open()` until its `close()`: the streams the pair delivers events to, which live as
    /// long as they are open even if the user drops them. (No weak reference to a stream: one would give the
    /// stream a side table, and every retain of it the slow path.)
    private var input: SocketInputStream?
    private var output: SocketOutputStream?
    /// Both streams' statuses (``SocketStream/streamStatus`` reads and sets these), read at every event.
    private var inputStatus = StreamStatus.notOpen
    private var outputStatus = StreamStatus.notOpen
    /// The delegate reads until a read returns less than it asked for and takes a read of nothing as "nothing
    /// yet", not as the end (the end comes as `endEncountered`): `RunLoopTCPConnection`, not a user's delegate.
    /// For it a readable event is `hasBytesAvailable` at once, without the read ahead that makes the event exact for
    /// Darwin's `while stream.hasBytesAvailable { read }` loops: one system call less per read. (A property of the
    /// delegate, set once; not part of the pair's state.)
    var delegateToleratesEmptyReads = false
    /// Bytes read from the socket to decide a readable event (for a delegate that does not tolerate empty reads),
    /// served by the next ``read(into:from:)`` before the socket is read again: the read that proves there are
    /// bytes is the read the delegate then makes.
    private var readAhead = ReadAhead()
    static let readAheadSize = 4096

    private struct ReadAhead {
        /// Made on the first such event (``readAheadSize`` bytes), kept for the pair's life. A pointer and two 32-bit
        /// offsets: 16 bytes of every pair, most of which never read ahead (a delegate that tolerates empty reads).
        var base: UnsafeMutableRawPointer?
        var start: Int32 = 0
        var end: Int32 = 0
        var count: Int { Int(end &- start) }
        var buffer: UnsafeMutableRawBufferPointer? {
            base.map { UnsafeMutableRawBufferPointer(start: $0, count: StreamPairCore.readAheadSize) }
        }
    }

    init(endpoint: Endpoint, options: ConnectionOptions) {
        self.endpoint = endpoint
        self.options = options
        state = StreamPairState()
    }

    /// A pair over an accepted, connected socket.
    init(accepted socket: SocketDescriptor, endpoint: Endpoint, options: ConnectionOptions) {
        self.endpoint = endpoint
        self.options = options
        state = StreamPairState(accepted: socket)
    }

    deinit {
        if let release = state.close() { self.release(release) }
        readAhead.buffer?.deallocate()
    }

    func makeStreams() -> (SocketInputStream, SocketOutputStream) {
        (SocketInputStream(core: self), SocketOutputStream(core: self))
    }

    func status(input isInput: Bool) -> StreamStatus { isInput ? inputStatus : outputStatus }

    func setStatus(_ status: StreamStatus, input isInput: Bool) {
        if isInput { inputStatus = status } else { outputStatus = status }
    }

    func schedule(in runLoop: SocketRunLoop) {
        self.runLoop = runLoop
    }

    /// The socket's local and remote addresses, while it is connected.
    var addresses: (local: SocketAddress, remote: SocketAddress)? {
        guard state.isOpen, let socket = state.socket else { return nil }
        return socket.ifOpen { fd -> (local: SocketAddress, remote: SocketAddress)? in
            guard let local = try? Syscall.localAddress(fd), let remote = try? Syscall.peerAddress(fd) else {
                return nil
            }
            return (local, remote)
        } ?? nil
    }

    var bytesAvailable: Int {
        guard let socket = state.socket else { return 0 }
        return socket.ifOpen { unreadBytes($0) } ?? 0
    }

    /// Bytes a read would return now: the read-ahead's, else FIONREAD's. (Reads no state: called while the state
    /// is being changed.)
    private func unreadBytes(_ fd: borrowing BorrowedDescriptor) -> Int {
        readAhead.count > 0 ? readAhead.count : Syscall.bytesReadable(fd)
    }

    var spaceAvailable: Bool {
        guard let socket = state.socket else { return false }
        let ready = socket.ifOpen { (try? Syscall.poll($0, events: Syscall.pollOut, timeoutMilliseconds: 0)) ?? 0 } ?? 0
        return ready & Syscall.pollOut != 0
    }

    private var inputOpen: Bool { inputStatus == .open }
    private var outputOpen: Bool { outputStatus == .open }

    // MARK: Opening

    func open(_ stream: SocketStream) {
        if stream.isInput { input = stream as? SocketInputStream } else { output = stream as? SocketOutputStream }
        if state.isOpen || state.failure != nil {
            // An accepted socket (or one that connected, or failed, before this stream opened): openCompleted, or the
            // error, on the next turn, as Darwin does.
            runLoop?.perform { [self] in
                guard stream.streamStatus == .opening else { return }
                if let error = state.failure {
                    stream.streamStatus = .error
                    stream.streamError = error
                    return stream.deliver(.errorOccurred)
                }
                stream.streamStatus = .open
                if !stream.isInput, let socket = state.socket { socket.ifOpen { direct.open($0.number) } }
                stream.deliver(.openCompleted)
                updateInterest()
            }
            return
        }
        guard state.beginConnecting() else { return }
        let endpoint = endpoint
        if case .name = endpoint.host {
            // Name lookup may block: off the run loop, then back.
            let runLoop = runLoop!
            PosixThread.spawn(name: "resolve") { [self] in
                let result = Result { () throws(ConnectionError) in try Syscall.resolve(endpoint) }
                runLoop.perform { self.startConnect(result) }
            }
        } else {
            startConnect(Result { () throws(ConnectionError) in try Syscall.resolve(endpoint) })
        }
    }

    private func startConnect(_ addresses: Result<[SocketAddress], ConnectionError>) {
        guard state.isConnecting else { return }  // closed while the name was looked up
        do throws(ConnectionError) {
            state.resolved(ConnectAttempts(try addresses.get(), endpoint: endpoint, timeout: options.connectTimeout))
        } catch {
            return fail(error)
        }
        connectToNextAddress()
    }

    /// Connects to the next resolved address, after a failed one (the rule every backend follows:
    /// ``ConnectAttempts``). Gives up with the last error when none is left.
    private func connectToNextAddress() {
        while state.isConnecting {
            do throws(ConnectionError) {
                guard let address = try state.nextAddress() else { return fail(state.lastConnectError) }
                let (socket, connected) = try Socket.startConnect(to: address, transport: .tcp, options: options)
                state.attempting(socket, to: address)
                if connected { return didConnect() }
                updateInterest()
                return
            } catch {
                if !attemptFailed(error) { return }
            }
        }
    }

    /// Lets the attempt's socket go and records `error`; `false` when that ended the connect (the pair failed).
    private func attemptFailed(_ error: ConnectionError) -> Bool {
        let (release, end) = state.attemptFailed(error)
        if let release { self.release(release) }
        if let end {
            fail(end)
            return false
        }
        return true
    }

    private func didConnect() {
        state.connected()
        guard let socket = state.socket else { return }
        // Darwin's order: the input stream's openCompleted, then the output stream's.
        for stream in [input as SocketStream?, output as SocketStream?].compactMap({ $0 })
        where stream.streamStatus == .opening {
            stream.streamStatus = .open
            if !stream.isInput { socket.ifOpen { direct.open($0.number) } }
            stream.deliver(.openCompleted)
        }
        updateInterest()
    }

    // MARK: Interest

    /// Makes epoll watch what the state says, and asks for a turn when deliveries became due. `false` when that
    /// failed (and so did the pair).
    @discardableResult
    private func updateInterest() -> Bool {
        guard let runLoop, let socket = state.socket else { return true }
        let (change, newlyDue) = state.updateInterest(inputOpen: inputOpen, outputOpen: outputOpen)
        if newlyDue { scheduleDueDeliveries() }
        guard let change else { return true }
        do throws(ConnectionError) {
            // A socket closed already has nothing left to watch (its close took it out of epoll).
            try socket.ifOpen { (fd) throws(ConnectionError) in
                switch change {
                case .register(let interest):
                    try runLoop.loop.register(fd, events: Self.epollEvents(interest), handler: self)
                case .modify(let interest):
                    try runLoop.loop.modify(fd, events: Self.epollEvents(interest))
                case .unregister:
                    runLoop.loop.unregister(fd)
                }
            }
            return true
        } catch {
            fail(error)
            return false
        }
    }

    private static func epollEvents(_ interest: SocketInterest) -> UInt32 {
        var events: UInt32 = 0
        if interest.contains(.read) { events |= Syscall.epollIn | Syscall.epollReadHangUp }
        if interest.contains(.write) { events |= Syscall.epollOut }
        return events
    }

    private static func socketEvents(_ events: UInt32) -> SocketEvents {
        var decoded: SocketEvents = []
        if events & Syscall.epollIn != 0 { decoded.insert(.readable) }
        if events & Syscall.epollOut != 0 { decoded.insert(.writable) }
        if events & Syscall.epollError != 0 { decoded.insert(.error) }
        if events & Syscall.epollHangUp != 0 { decoded.insert(.hangUp) }
        if events & Syscall.epollReadHangUp != 0 { decoded.insert(.readHangUp) }
        return decoded
    }

    /// An epoll event. The socket's number is borrowed for each system call only, never across a delivery: a
    /// delegate that closes the streams (or a failure) closes the socket before the delivery returns.
    func epollReady(_ epollEvents: UInt32) {
        guard let socket = state.socket, !socket.isClosed else { return }
        let events = Self.socketEvents(epollEvents)
        if !state.isOpen { return connectReady(events, socket) }
        func unread() -> Bool { socket.ifOpen { unreadBytes($0) > 0 } ?? false }
        if state.mustBreakAway(events, inputOpen: inputOpen, unreadBytes: unread) {
            return breakAway()
        }
        if events.contains(.error) {
            let code = Self.pendingError(socket)
            if code != 0 { return fail(.errno(code, "socket error")) }
        }
        if let input {
            let step = state.inputStep(
                events, inputOpen: inputOpen, toleratesEmptyReads: delegateToleratesEmptyReads, unreadBytes: unread)
            switch step {
            case .deliverBytes: input.deliver(.hasBytesAvailable)
            case .readAhead: _ = deliverReadable(input)
            case .checkEnd: deliverEndIfThere(input)
            case .nothing: break
            }
            if state.failure != nil { return }
        }
        if let output, state.writable(events, outputOpen: outputOpen) {
            output.deliver(.hasSpaceAvailable)
        }
        updateInterest()
    }

    /// Readiness while connecting: the attempt failed (the next address is tried) or connected.
    private func connectReady(_ events: SocketEvents, _ socket: SocketDescriptor) {
        let code = Self.pendingError(socket)
        if code != 0 {
            let address = state.attemptAddress.map { " (\($0))" } ?? ""
            if attemptFailed(.errno(code, "connect to \(endpoint)\(address)")) { connectToNextAddress() }
            return
        }
        if events.contains(.writable) { didConnect() }
    }

    /// SO_ERROR, 0 when there is none (or the socket is closed).
    private static func pendingError(_ socket: SocketDescriptor) -> Int32 {
        socket.ifOpen { (try? Syscall.pendingError($0)) ?? 0 } ?? 0
    }

    /// The socket goes broken: out of epoll, its streams served from the run loop.
    private func breakAway() {
        if let change = state.breakAway(), change == .unregister, let socket = state.socket {
            socket.ifOpen { runLoop?.loop.unregister($0) }
        }
        updateInterest()
    }

    /// Asks the run loop for a turn that delivers what is due then (see `StreamPairState.Due`).
    private func scheduleDueDeliveries() {
        runLoop?.perform { [self] in
            let due = state.takeDue()
            if due.contains(.input), let input, state.inputStillDue(inputOpen: inputOpen) {
                if !deliverReadable(input) {
                    // Nothing to read and no end or error after all: back under epoll's watch.
                    state.rejoin()
                    updateInterest()
                }
            }
            if due.contains(.output), let output, state.spaceStillDue(outputOpen: outputOpen) {
                output.deliver(.hasSpaceAvailable)
            }
        }
    }

    /// Delivers what a read would find now: `hasBytesAvailable` while bytes wait (so the property is true when
    /// the delegate looks: Darwin's `while stream.hasBytesAvailable { read }` must find them), the end once every
    /// byte is read and the peer has ended (whether or not the delegate ever reads 0), or the error. Returns
    /// `false` when a read would find nothing yet. It finds out by reading ahead: the bytes wait in
    /// ``readAhead`` for the delegate's read.
    private func deliverReadable(_ input: SocketInputStream) -> Bool {
        guard let socket = state.socket else { return true }
        if readAhead.count == 0 {
            let buffer =
                readAhead.buffer
                ?? {
                    let made = UnsafeMutableRawBufferPointer.allocate(byteCount: Self.readAheadSize, alignment: 16)
                    readAhead.base = made.baseAddress
                    return made
                }()
            do throws(ConnectionError) {
                switch try socket.withDescriptor({ (fd) throws(ConnectionError) in
                    try Syscall.recv(fd, buffer, dontWait: true)
                }) {
                case .processed(0):
                    deliverEnd(input)
                    return true
                case .processed(let count):
                    readAhead.start = 0
                    readAhead.end = Int32(count)
                case .wouldBlock: return false
                }
            } catch {
                fail(error)
                return true
            }
        }
        state.inputDelivered()
        input.deliver(.hasBytesAvailable)
        return true
    }

    /// Delivers the end when a read would return it now (or the error when it would fail).
    private func deliverEndIfThere(_ input: SocketInputStream) {
        guard let socket = state.socket else { return }
        do throws(ConnectionError) {
            let peeked = try socket.withDescriptor { (fd) throws(ConnectionError) in try Syscall.peekByte(fd) }
            if case .processed(0) = peeked { deliverEnd(input) }
        } catch {
            fail(error)
        }
    }

    private func deliverEnd(_ input: SocketInputStream) {
        guard state.inputEnded() else { return }
        input.streamStatus = .atEnd
        input.deliver(.endEncountered)
    }

    // MARK: Reading and writing

    func read(into buffer: UnsafeMutableRawBufferPointer, from input: SocketInputStream) -> Int {
        if let error = state.takeDeferredReadError() {
            fail(error)
            return -1
        }
        guard let socket = state.socket else { return -1 }
        if readAhead.count > 0, let ahead = readAhead.buffer, buffer.count > 0 {
            let count = min(buffer.count, readAhead.count)
            buffer.baseAddress!.copyMemory(from: ahead.baseAddress! + Int(readAhead.start), byteCount: count)
            readAhead.start += Int32(count)
            var total = count
            // The read-ahead took all it had room for: more may wait, read straight into what is left (a 0 here
            // is the end, which the next read finds again).
            if readAhead.count == 0, Int(readAhead.end) == ahead.count, count < buffer.count {
                do throws(ConnectionError) {
                    let rest = UnsafeMutableRawBufferPointer(rebasing: buffer[count...])
                    let read = try socket.withDescriptor { (fd) throws(ConnectionError) in
                        try Syscall.recv(fd, rest, dontWait: true)
                    }
                    if case .processed(let more) = read { total += more }
                } catch {
                    state.deferReadError(error)
                }
            }
            state.delegateRead()
            return updateInterest() ? total : -1
        }
        do throws(ConnectionError) {
            switch try socket.withDescriptor({ (fd) throws(ConnectionError) in
                try Syscall.recv(fd, buffer, dontWait: true)
            }) {
            case .processed(0):
                deliverEnd(input)
                return 0
            case .processed(let count):
                state.delegateRead()
                return updateInterest() ? count : -1
            case .wouldBlock:
                state.delegateRead()
                return updateInterest() ? 0 : -1
            }
        } catch {
            fail(error)
            return -1
        }
    }

    /// From any thread, while the output is open: one send(2) on the calling thread (see
    /// `SocketOutputStream.writeFromAnyThread`).
    func writeFromAnyThread(_ bytes: UnsafeRawBufferPointer) throws(ConnectionError) -> Int {
        switch direct.send(bytes) {
        case .sent(let count): return count
        case .handOver: return 0
        case .failed(let code): throw .errno(code, "send")
        }
    }

    func write(_ bytes: UnsafeRawBufferPointer, from output: SocketOutputStream) -> Int {
        guard let socket = state.socket else { return -1 }
        do throws(ConnectionError) {
            var count = 0
            let sent = try socket.withDescriptor { (fd) throws(ConnectionError) in
                try Syscall.send(fd, bytes, dontWait: true)
            }
            if case .processed(let written) = sent { count = written }
            if state.delegateWrote(all: count == bytes.count), !updateInterest() { return -1 }
            return count
        } catch {
            fail(error)
            return -1
        }
    }

    // MARK: Errors and closing

    /// Reports an error once to each open (or opening) stream; the socket is closed.
    func fail(_ error: ConnectionError) {
        let (first, release) = state.fail(error)
        guard first else { return }
        if let release { self.release(release) }
        for stream in [input as SocketStream?, output as SocketStream?].compactMap({ $0 })
        where stream.streamStatus == .open || stream.streamStatus == .opening {
            stream.streamStatus = .error
            stream.streamError = error
            stream.deliver(.errorOccurred)
        }
    }

    /// Closes a socket the state let go of: sends from other threads are over first, and it leaves epoll while its
    /// number is still ours.
    private func release(_ release: StreamPairState<SocketDescriptor>.Release) {
        direct.close()
        let loop = runLoop?.loop
        release.socket.close(beforeClosing: { fd in
            if release.watched { loop?.unregister(fd) }
        })
    }

    /// Resets the connection (see `Syscall.resetConnection`), for an abort: closing the streams afterwards sends
    /// nothing more.
    func resetConnection() {
        if state.isOpen, let socket = state.socket { socket.ifOpen { Syscall.resetConnection($0) } }
    }

    func closed(_ stream: SocketStream) {
        if stream.isInput {
            input = nil
        } else {
            output = nil
            direct.close()
            if state.isOpen, let socket = state.socket { socket.ifOpen { try? Syscall.shutdown($0, .write) } }
        }
        let inputDone = inputStatus == .closed || inputStatus == .notOpen
        let outputDone = outputStatus == .closed || outputStatus == .notOpen
        if inputDone && outputDone {
            if let release = state.close() { self.release(release) }
        } else {
            updateInterest()
        }
    }
}
