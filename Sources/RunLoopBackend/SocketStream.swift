public import ConnectionCore
import POSIXSupport

/// The events a stream delegate receives, as Foundation's `Stream.Event` names them.
public enum StreamEvent: Sendable, Hashable, CustomStringConvertible {
    case openCompleted
    case hasBytesAvailable
    case hasSpaceAvailable
    case endEncountered
    case errorOccurred

    public var description: String {
        switch self {
        case .openCompleted: "openCompleted"
        case .hasBytesAvailable: "hasBytesAvailable"
        case .hasSpaceAvailable: "hasSpaceAvailable"
        case .endEncountered: "endEncountered"
        case .errorOccurred: "errorOccurred"
        }
    }
}

/// A stream's status, as Foundation's `Stream.Status` names them.
public enum StreamStatus: Sendable, Hashable {
    case notOpen, opening, open, atEnd, closed, error
}

/// Receives a stream's events on the run loop the stream is scheduled in (`StreamDelegate` on Darwin).
public protocol SocketStreamDelegate: AnyObject {
    func stream(_ stream: SocketStream, handle event: StreamEvent)
}

/// The common part of ``SocketInputStream`` and ``SocketOutputStream``. Use a stream only on the thread of the
/// run loop it is scheduled in.
public class SocketStream: @unchecked Sendable {
    /// Receives this stream's events (held weakly, as on Darwin).
    public weak var delegate: (any SocketStreamDelegate)?
    /// The status.
    public internal(set) var streamStatus: StreamStatus = .notOpen
    /// The error, once ``streamStatus`` is `.error`.
    public internal(set) var streamError: ConnectionError?
    let core: StreamPairCore
    var runLoop: SocketRunLoop?
    var isInput: Bool { false }

    init(core: StreamPairCore) {
        self.core = core
    }

    /// Schedules the stream in a run loop: its events are delivered there. Call before ``open()``.
    public func schedule(in runLoop: SocketRunLoop) {
        self.runLoop = runLoop
        core.schedule(in: runLoop)
    }

    /// Opens the stream (on its run loop's thread). Opening the first stream of a pair starts connecting;
    /// `openCompleted` follows once the connection is made.
    public func open() {
        guard streamStatus == .notOpen else { return }
        guard runLoop != nil else {
            streamStatus = .error
            streamError = ConnectionError(.unsupported, "schedule the stream in a SocketRunLoop before opening it")
            return
        }
        streamStatus = .opening
        core.open(self)
    }

    /// Closes the stream. Closing the output stream sends FIN (half-close); the socket is closed once both
    /// streams are closed.
    public func close() {
        guard streamStatus != .closed else { return }
        streamStatus = .closed
        core.closed(self)
    }

    func deliver(_ event: StreamEvent) {
        delegate?.stream(self, handle: event)
    }
}

/// The input half: `hasBytesAvailable` events, `read`.
public final class SocketInputStream: SocketStream, @unchecked Sendable {
    override var isInput: Bool { true }

    /// `true` when a ``read(into:)`` would return bytes now (bytes read ahead, or FIONREAD).
    public var hasBytesAvailable: Bool {
        streamStatus == .open && core.bytesAvailable > 0
    }

    /// Reads what is available, up to the buffer's size, without blocking. Returns the count; 0 when nothing
    /// is available now or at the end (then `streamStatus` is `.atEnd` and `endEncountered` is delivered);
    /// -1 on error (`streamError` says which). Reading re-arms `hasBytesAvailable`.
    public func read(into buffer: UnsafeMutableRawBufferPointer) -> Int {
        guard streamStatus == .open else { return streamStatus == .atEnd ? 0 : -1 }
        return core.read(into: buffer, from: self)
    }

    /// Reads up to `maxLength` bytes into a new array (empty when nothing is available or at the end).
    public func read(maxLength: Int) -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: maxLength) { buffer, count in
            count = max(0, read(into: UnsafeMutableRawBufferPointer(buffer)))
        }
    }
}

/// The output half: `hasSpaceAvailable` events, `write`.
public final class SocketOutputStream: SocketStream, @unchecked Sendable {
    /// `true` when a `write(_:)` would take bytes now.
    public var hasSpaceAvailable: Bool {
        streamStatus == .open && core.spaceAvailable
    }

    /// Writes what the kernel takes now (possibly part of `bytes`), without blocking. Returns the count (0 when
    /// the send buffer is full: wait for `hasSpaceAvailable`), or -1 on error. Writing re-arms
    /// `hasSpaceAvailable`.
    public func write(_ bytes: UnsafeRawBufferPointer) -> Int {
        guard streamStatus == .open else { return -1 }
        return core.write(bytes, from: self)
    }

    /// ``write(_:)-(UnsafeRawBufferPointer)`` for an array.
    public func write(_ bytes: [UInt8]) -> Int {
        bytes.withUnsafeBytes { write($0) }
    }

    /// From a thread other than the run loop's, while the stream is open: writes what the kernel takes now on the
    /// calling thread (0 when full or closed) and throws the socket's error. It leaves the stream's events as
    /// they were: the caller lets one write through at a time and hands the rest to the run loop, whose
    /// ``write(_:)-(UnsafeRawBufferPointer)`` then re-arms `hasSpaceAvailable` as usual. Closing waits for such a
    /// write to finish.
    func writeFromAnyThread(_ bytes: UnsafeRawBufferPointer) throws(ConnectionError) -> Int {
        try core.writeFromAnyThread(bytes)
    }
}

/// Creates a pair of streams to a TCP endpoint, like `Stream.getStreamsToHost(withName:port:...)`. Nothing
/// happens until they are scheduled and opened.
public func getStreamsToHost(
    _ endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions()
)
    -> (SocketInputStream, SocketOutputStream)
{
    let core = StreamPairCore(endpoint: endpoint, options: options)
    return core.makeStreams()
}

/// The socket shared by an input and an output stream, and the event logic (on the run loop thread only).
///
/// The Darwin contract: `hasBytesAvailable` is delivered, then not again until the client reads;
/// `hasSpaceAvailable` likewise until it writes ("re-armed only after the delegate has read/written").
///
/// Epoll interest is level-triggered and changed only when it must be, so a message costs no `epoll_ctl`:
/// input interest stays on while the input is open, and is taken off only when a readable event finds the
/// delegate has not read since the last `hasBytesAvailable` (otherwise epoll would report it every turn);
/// output interest is on only while a write found the socket full; a due `hasSpaceAvailable` on a socket with
/// room is delivered on the next turn without epoll. A readable event costs a FIONREAD (bytes: delivered as
/// `hasBytesAvailable`) and, when there are none, a peek (the end, the error, or nothing after all).
final class StreamPairCore: EpollHandler, @unchecked Sendable {
    let endpoint: Endpoint
    let options: ConnectionOptions
    private(set) var fd: Int32 = -1
    /// Writes from other threads while the output is open (``writeFromAnyThread(_:)``).
    private let direct = DirectSend()
    private var runLoop: SocketRunLoop?
    private weak var input: SocketInputStream?
    private weak var output: SocketOutputStream?
    // Strong while open, so the pair lives as long as a stream is open even if the user drops one.
    private var keepInput: SocketInputStream?
    private var keepOutput: SocketOutputStream?
    private var connecting = false
    private var connected = false
    /// While connecting: the addresses left to try, and the one being tried.
    private var attempts: ConnectAttempts?
    private var connectingTo: SocketAddress?
    private var inputArmed = true
    private var outputArmed = true
    /// Input interest taken off epoll: a readable event came while `hasBytesAvailable` was not re-armed (the
    /// delegate did not read), so level-triggered epoll would report it again on every turn.
    private var inputSuppressed = false
    /// The last write took everything: the socket has room, so a due `hasSpaceAvailable` is delivered on the
    /// next turn without asking epoll (no `EPOLLOUT` interest, no `epoll_ctl` per write).
    private var outputHasSpace = true
    private var spaceDeliveryScheduled = false
    private var registered = false
    private var failed = false
    private var endDelivered = false
    private var interest: UInt32 = 0
    /// The socket reported an error or a hang-up while it still held bytes for the input (a reset right behind
    /// data, or arriving while the delegate was not reading). Epoll reports that condition on every turn whatever
    /// the interest, so the socket leaves epoll, and each re-armed stream gets its event on the next turn of the
    /// run loop instead: the socket stays ready for good, and its reads return the bytes, then the end or the
    /// error (read from the socket only then: SO_ERROR read earlier would clear it, and the reads would end clean).
    private var broken = false
    private var inputDeliveryScheduled = false
    /// The delegate reads until a read returns less than it asked for and takes a read of nothing as "nothing
    /// yet", not as the end (the end comes as `endEncountered`): `RunLoopTCPConnection`, not a user's delegate.
    /// For it a readable event is `hasBytesAvailable` at once, without the FIONREAD (and peek) that makes the
    /// event exact for Darwin's `while stream.hasBytesAvailable { read }` loops: one system call less per read.
    var delegateToleratesEmptyReads = false
    /// Bytes read from the socket to decide a readable event (for a delegate that does not tolerate empty
    /// reads), served by the next ``read(into:from:)`` before the socket is read again: the read that proves
    /// there are bytes is the read the delegate then makes, where a FIONREAD cost a system call of its own.
    /// Made on the first such event; `readAheadStart..<readAheadEnd` is what is left of it.
    private var readAhead: UnsafeMutableRawBufferPointer?
    private var readAheadStart = 0
    private var readAheadEnd = 0
    /// An error the read straight after the read-ahead's bytes met: reported by the next read, not lost.
    private var deferredReadError: ConnectionError?
    static let readAheadSize = 4096

    init(endpoint: Endpoint, options: ConnectionOptions) {
        self.endpoint = endpoint
        self.options = options
    }

    /// A pair over an accepted, connected socket.
    init(acceptedFD: Int32, endpoint: Endpoint, options: ConnectionOptions) {
        self.endpoint = endpoint
        self.options = options
        self.fd = acceptedFD
        self.connected = true
    }

    deinit {
        if fd >= 0 {
            if registered { runLoop?.loop.unregister(fd) }
            Syscall.close(fd)
        }
        readAhead?.deallocate()
    }

    func makeStreams() -> (SocketInputStream, SocketOutputStream) {
        let input = SocketInputStream(core: self)
        let output = SocketOutputStream(core: self)
        self.input = input
        self.output = output
        return (input, output)
    }

    func schedule(in runLoop: SocketRunLoop) {
        self.runLoop = runLoop
    }

    var bytesAvailable: Int {
        guard fd >= 0 else { return 0 }
        return readAheadEnd > readAheadStart ? readAheadEnd - readAheadStart : Syscall.bytesReadable(fd)
    }

    var spaceAvailable: Bool {
        guard fd >= 0 else { return false }
        return ((try? Syscall.poll(fd, events: Syscall.pollOut, timeoutMilliseconds: 0)) ?? 0) & Syscall.pollOut != 0
    }

    // MARK: Opening

    func open(_ stream: SocketStream) {
        if stream.isInput { keepInput = input } else { keepOutput = output }
        if connected {
            // An accepted socket: already connected; openCompleted on the next turn, as Darwin does.
            runLoop?.perform { [self] in
                guard stream.streamStatus == .opening else { return }
                stream.streamStatus = .open
                if !stream.isInput { direct.open(fd) }
                stream.deliver(.openCompleted)
                do throws(ConnectionError) {
                    try updateInterest()
                } catch {
                    fail(error)
                }
            }
            return
        }
        guard !connecting else { return }
        connecting = true
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
        do throws(ConnectionError) {
            attempts = ConnectAttempts(try addresses.get(), endpoint: endpoint, timeout: options.connectTimeout)
        } catch {
            return fail(error)
        }
        connectToNextAddress()
    }

    /// Connects to the next resolved address, after a failed one (the rule every backend follows:
    /// ``ConnectAttempts``). Gives up with the last error when none is left.
    private func connectToNextAddress() {
        while connecting, var attempts {
            do throws(ConnectionError) {
                guard let address = try attempts.next() else { return fail(attempts.lastError) }
                self.attempts = attempts
                connectingTo = address
                let (socket, connected) = try Socket.startConnect(to: address, transport: .tcp, options: options)
                fd = socket.release() ?? -1
                if connected { return didConnect() }
                return try updateInterest()
            } catch {
                dropAttempt()
                do throws(ConnectionError) {
                    try attempts.failed(error)
                    self.attempts = attempts
                } catch {
                    return fail(error)
                }
            }
        }
    }

    /// Closes the socket (and takes it off epoll): a connect attempt that failed, or the pair's end.
    private func dropAttempt() {
        direct.close()
        guard fd >= 0 else { return }
        if registered { runLoop?.loop.unregister(fd) }
        registered = false
        interest = 0
        Syscall.close(fd)
        fd = -1
    }

    private func didConnect() {
        connecting = false
        connected = true
        attempts = nil
        // Darwin's order: the input stream's openCompleted, then the output stream's.
        for stream in [input as SocketStream?, output as SocketStream?].compactMap({ $0 })
        where stream.streamStatus == .opening {
            stream.streamStatus = .open
            if !stream.isInput { direct.open(fd) }
            stream.deliver(.openCompleted)
        }
        do throws(ConnectionError) {
            try updateInterest()
        } catch {
            fail(error)
        }
    }

    // MARK: Interest

    private func updateInterest() throws(ConnectionError) {
        guard fd >= 0, let runLoop, !failed else { return }
        if broken {
            if let input, input.streamStatus == .open, inputArmed, !endDelivered { scheduleInputDelivery() }
            if let output, output.streamStatus == .open, outputArmed { scheduleSpaceDelivery() }
            return
        }
        var wanted: UInt32 = 0
        if connecting {
            wanted = Syscall.epollOut
        } else {
            if let input, input.streamStatus == .open, !inputSuppressed, !endDelivered {
                wanted |= Syscall.epollIn | Syscall.epollReadHangUp
            }
            if let output, output.streamStatus == .open, outputArmed {
                if outputHasSpace { scheduleSpaceDelivery() } else { wanted |= Syscall.epollOut }
            }
        }
        if !registered {
            try runLoop.loop.register(fd, events: wanted, handler: self)
            registered = true
        } else if wanted != interest {
            try runLoop.loop.modify(fd, events: wanted)
        }
        interest = wanted
    }

    func epollReady(_ events: UInt32) {
        if connecting {
            let code = (try? Syscall.pendingError(fd)) ?? 0
            if code != 0 {
                let address = connectingTo.map { " (\($0))" } ?? ""
                dropAttempt()
                do throws(ConnectionError) {
                    try attempts?.failed(.errno(code, "connect to \(endpoint)\(address)"))
                } catch {
                    return fail(error)
                }
                return connectToNextAddress()
            }
            if events & Syscall.epollOut != 0 { didConnect() }
            return
        }
        if events & (Syscall.epollError | Syscall.epollHangUp) != 0, let input, input.streamStatus == .open,
            !endDelivered, bytesAvailable > 0
        {
            return breakAway()
        }
        if events & Syscall.epollError != 0 {
            let code = (try? Syscall.pendingError(fd)) ?? 0
            if code != 0 { return fail(.errno(code, "socket error")) }
        }
        if events & (Syscall.epollIn | Syscall.epollHangUp | Syscall.epollReadHangUp) != 0, let input,
            input.streamStatus == .open
        {
            if inputArmed {
                // Readable is not "bytes": epoll may report a FIN that is half processed (the sequence number
                // advanced, the hang-up not yet set) as readable with nothing to read. What a read would find
                // decides what is delivered.
                if delegateToleratesEmptyReads {
                    inputArmed = false
                    input.deliver(.hasBytesAvailable)
                } else {
                    _ = deliverReadable(input)
                }
                if failed { return }
            } else if events & (Syscall.epollHangUp | Syscall.epollReadHangUp) != 0, bytesAvailable == 0 {
                // Not re-armed, but every byte was read: the end is due (and a hang-up is reported whatever the
                // interest, so waiting for a read would spin).
                deliverEndIfThere(input)
                if failed { return }
            } else {
                inputSuppressed = true
            }
        }
        if events & Syscall.epollOut != 0, let output, output.streamStatus == .open, outputArmed {
            outputArmed = false
            outputHasSpace = true
            output.deliver(.hasSpaceAvailable)
        }
        do throws(ConnectionError) {
            try updateInterest()
        } catch {
            fail(error)
        }
    }

    /// The socket goes ``broken``: out of epoll, its streams served from the run loop.
    private func breakAway() {
        broken = true
        outputHasSpace = true  // a write finds out the socket's state at once
        if registered {
            runLoop?.loop.unregister(fd)
            registered = false
        }
        do throws(ConnectionError) {
            try updateInterest()
        } catch {
            fail(error)
        }
    }

    /// A due `hasBytesAvailable` on a ``broken`` socket: on the next turn of the run loop.
    private func scheduleInputDelivery() {
        guard !inputDeliveryScheduled, let runLoop else { return }
        inputDeliveryScheduled = true
        runLoop.perform { [self] in
            inputDeliveryScheduled = false
            guard !failed, let input, input.streamStatus == .open, inputArmed, !endDelivered else { return }
            if !deliverReadable(input) {
                // Nothing to read and no end or error after all: back under epoll's watch.
                broken = false
                do throws(ConnectionError) {
                    try updateInterest()
                } catch {
                    fail(error)
                }
            }
        }
    }

    /// Delivers what a read would find now: `hasBytesAvailable` while bytes wait (so the property is true when
    /// the delegate looks: Darwin's `while stream.hasBytesAvailable { read }` must find them), the end once every
    /// byte is read and the peer has ended (whether or not the delegate ever reads 0), or the error. Returns
    /// `false` when a read would find nothing yet. It finds out by reading ahead: the bytes wait in
    /// ``readAhead`` for the delegate's read.
    private func deliverReadable(_ input: SocketInputStream) -> Bool {
        if readAheadEnd == readAheadStart {
            let buffer =
                readAhead
                ?? {
                    let made = UnsafeMutableRawBufferPointer.allocate(byteCount: Self.readAheadSize, alignment: 16)
                    readAhead = made
                    return made
                }()
            do throws(ConnectionError) {
                switch try Syscall.recv(fd, buffer, dontWait: true) {
                case .processed(0):
                    deliverEnd(input)
                    return true
                case .processed(let count):
                    readAheadStart = 0
                    readAheadEnd = count
                case .wouldBlock: return false
                }
            } catch {
                fail(error)
                return true
            }
        }
        inputArmed = false
        input.deliver(.hasBytesAvailable)
        return true
    }

    /// A due `hasSpaceAvailable` while the socket has room: on the next turn of the run loop, as epoll would
    /// report it, but without an `epoll_ctl` and a wake-up.
    private func scheduleSpaceDelivery() {
        guard !spaceDeliveryScheduled, let runLoop else { return }
        spaceDeliveryScheduled = true
        runLoop.perform { [self] in
            spaceDeliveryScheduled = false
            guard !failed, let output, output.streamStatus == .open, outputArmed, outputHasSpace else { return }
            outputArmed = false
            output.deliver(.hasSpaceAvailable)
        }
    }

    /// Delivers the end when a read would return it now (or the error when it would fail).
    private func deliverEndIfThere(_ input: SocketInputStream) {
        do throws(ConnectionError) {
            if case .processed(0) = try Syscall.peekByte(fd) { deliverEnd(input) }
        } catch {
            fail(error)
        }
    }

    private func deliverEnd(_ input: SocketInputStream) {
        guard !endDelivered else { return }
        endDelivered = true
        input.streamStatus = .atEnd
        input.deliver(.endEncountered)
    }

    // MARK: Reading and writing

    func read(into buffer: UnsafeMutableRawBufferPointer, from input: SocketInputStream) -> Int {
        if let error = deferredReadError {
            deferredReadError = nil
            fail(error)
            return -1
        }
        if readAheadEnd > readAheadStart, let readAhead, buffer.count > 0 {
            let count = min(buffer.count, readAheadEnd - readAheadStart)
            buffer.baseAddress!.copyMemory(from: readAhead.baseAddress! + readAheadStart, byteCount: count)
            readAheadStart += count
            var total = count
            // The read-ahead took all it had room for: more may wait, read straight into what is left (a 0 here
            // is the end, which the next read finds again).
            if readAheadStart == readAheadEnd, readAheadEnd == readAhead.count, count < buffer.count {
                do throws(ConnectionError) {
                    let rest = UnsafeMutableRawBufferPointer(rebasing: buffer[count...])
                    if case .processed(let more) = try Syscall.recv(fd, rest, dontWait: true) { total += more }
                } catch {
                    deferredReadError = error
                }
            }
            inputArmed = true
            inputSuppressed = false
            do throws(ConnectionError) {
                try updateInterest()
            } catch {
                fail(error)
                return -1
            }
            return total
        }
        do throws(ConnectionError) {
            switch try Syscall.recv(fd, buffer, dontWait: true) {
            case .processed(0):
                deliverEnd(input)
                return 0
            case .processed(let count):
                inputArmed = true
                inputSuppressed = false
                try updateInterest()
                return count
            case .wouldBlock:
                inputArmed = true
                inputSuppressed = false
                try updateInterest()
                return 0
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
        do throws(ConnectionError) {
            let result = try Syscall.send(fd, bytes, dontWait: true)
            // A write that leaves things as they were (armed, room left, its hasSpaceAvailable already due) changes
            // no interest: skip the recomputation, which loads both streams through their weak references.
            let unchanged = outputArmed && outputHasSpace && spaceDeliveryScheduled
            outputArmed = true
            var count = 0
            if case .processed(let written) = result { count = written }
            outputHasSpace = count == bytes.count
            if !(unchanged && outputHasSpace) { try updateInterest() }
            return count
        } catch {
            fail(error)
            return -1
        }
    }

    // MARK: Errors and closing

    /// Reports an error once to each open (or opening) stream.
    func fail(_ error: ConnectionError) {
        guard !failed else { return }
        failed = true
        direct.close()
        connecting = false
        if registered, fd >= 0 {
            runLoop?.loop.unregister(fd)
            registered = false
        }
        for stream in [input as SocketStream?, output as SocketStream?].compactMap({ $0 })
        where stream.streamStatus == .open || stream.streamStatus == .opening {
            stream.streamStatus = .error
            stream.streamError = error
            stream.deliver(.errorOccurred)
        }
    }

    /// Resets the connection (see `Syscall.resetConnection`), for an abort: closing the streams afterwards sends
    /// nothing more.
    func resetConnection() {
        if fd >= 0, connected, !failed { Syscall.resetConnection(fd) }
    }

    func closed(_ stream: SocketStream) {
        if stream.isInput {
            keepInput = nil
        } else {
            keepOutput = nil
            direct.close()
            if fd >= 0, connected, !failed { try? Syscall.shutdown(fd, .write) }
        }
        let inputDone = input.map { $0.streamStatus == .closed || $0.streamStatus == .notOpen } ?? true
        let outputDone = output.map { $0.streamStatus == .closed || $0.streamStatus == .notOpen } ?? true
        if inputDone && outputDone {
            releaseSocket()
        } else {
            do throws(ConnectionError) {
                try updateInterest()
            } catch {
                fail(error)
            }
        }
    }

    private func releaseSocket() {
        guard fd >= 0 else { return }
        dropAttempt()
        connecting = false
    }
}
