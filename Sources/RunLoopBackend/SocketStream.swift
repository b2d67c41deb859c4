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
    /// The status. (The pair keeps both streams' statuses, which it reads at every event: from two stored values
    /// rather than through each stream.)
    public internal(set) var streamStatus: StreamStatus {
        get { core.status(input: isInput) }
        set { core.setStatus(newValue, input: isInput) }
    }
    /// The error, once ``streamStatus`` is `.error`.
    public internal(set) var streamError: ConnectionError?
    let core: StreamPairCore
    var runLoop: SocketRunLoop?
    let isInput: Bool

    init(core: StreamPairCore, isInput: Bool) {
        self.core = core
        self.isInput = isInput
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
    init(core: StreamPairCore) { super.init(core: core, isInput: true) }

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
    init(core: StreamPairCore) { super.init(core: core, isInput: false) }

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
