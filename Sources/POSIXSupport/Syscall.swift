internal import CSocketShims
public import ConnectionCore
internal import Glibc

/// The result of a call on a non-blocking descriptor: done, or "would block" (EAGAIN) as a value, not an error.
public enum IOResult<Value: Sendable>: Sendable {
    case processed(Value)
    case wouldBlock
}

extension DirectReadCount {
    /// One non-blocking stream read as `ReceiveQueue.next(into:readingNow:)` takes it: bytes, nothing yet
    /// (EAGAIN), or the end (0 bytes: the peer finished; an error: the stream failed).
    public init(reading read: () throws(ConnectionError) -> IOResult<Int>) {
        do {
            switch try read() {
            case .wouldBlock: self = .nothing
            case .processed(0): self = .end(.finished)
            case .processed(let count): self = .count(count)
            }
        } catch {
            self = .end(.failed(error))
        }
    }
}

/// Shutdown directions for ``Syscall/shutdown(_:_:)``.
public enum ShutdownHow: Sendable {
    case read, write, both
    var raw: Int32 {
        switch self {
        case .read: Int32(SHUT_RD)
        case .write: Int32(SHUT_WR)
        case .both: Int32(SHUT_RDWR)
        }
    }
}

/// Every system call the project makes on sockets, in one place (as SwiftNIO's System.swift does):
/// - errno is read at once after the failing call and turned into a ``ConnectionError`` with its name kept;
/// - EINTR is retried (except for close(2), which must not be retried on Linux);
/// - EAGAIN/EWOULDBLOCK comes back as ``IOResult/wouldBlock``, not as an error;
/// - sends always pass MSG_NOSIGNAL, so a closed peer gives EPIPE instead of killing the process;
/// - every descriptor is created close-on-exec.
package enum Syscall {
    @inline(__always)
    static func retrying(
        _ operation: @autoclosure () -> String, _ body: () -> Int
    ) throws(ConnectionError)
        -> Int
    {
        while true {
            let result = body()
            if result >= 0 { return result }
            let code = Glibc.errno
            if code == EINTR { continue }
            throw .errno(code, operation())
        }
    }

    @inline(__always)
    static func retryingIO(
        _ operation: @autoclosure () -> String, _ body: () -> Int
    )
        throws(ConnectionError) -> IOResult<Int>
    {
        while true {
            let result = body()
            if result >= 0 { return .processed(result) }
            let code = Glibc.errno
            if code == EINTR { continue }
            if code == EAGAIN || code == EWOULDBLOCK { return .wouldBlock }
            throw .errno(code, operation())
        }
    }
}
