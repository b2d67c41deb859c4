internal import CSocketShims
package import ConnectionCore
internal import Glibc

// accept, connect, and poll(2) for one descriptor.
extension Syscall {
    /// accept4(2), close-on-exec: the accepted socket, owned, and its peer. `nil` on EAGAIN (non-blocking listeners).
    package static func accept(
        _ descriptor: borrowing BorrowedDescriptor, nonBlocking: Bool = false
    ) throws(ConnectionError)
        -> (socket: SocketDescriptor, peer: SocketAddress)?
    {
        let fd = descriptor.number
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        while true {
            let result = withUnsafeMutablePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    csock_accept4(fd, $0, &length, nonBlocking ? 1 : 0)
                }
            }
            if result >= 0 {
                guard let peer = withUnsafeBytes(of: &storage, { SocketAddress($0.baseAddress!, length: Int(length)) })
                else {
                    _ = Glibc.close(result)
                    throw ConnectionError(.unsupported, "accept: not an IP peer")
                }
                return (SocketDescriptor(adopting: result), peer)
            }
            let code = Glibc.errno
            switch code {
            case EINTR, ECONNABORTED: continue  // a client that gave up before we accepted it: take the next one
            case EAGAIN, EWOULDBLOCK: return nil
            default: throw .errno(code, "accept")
            }
        }
    }

    /// connect(2). Returns `true` when connected, `false` when the connect is in progress (EINPROGRESS on a
    /// non-blocking socket, or EINTR on a blocking one): wait for writability, then read ``pendingError(_:)``.
    package static func connect(
        _ descriptor: borrowing BorrowedDescriptor, to address: SocketAddress
    ) throws(ConnectionError) -> Bool {
        let fd = descriptor.number
        let result = address.withSockAddr { Glibc.connect(fd, $0, $1) }
        if result == 0 { return true }
        let code = Glibc.errno
        if code == EINPROGRESS || code == EINTR || code == EALREADY { return false }
        throw .errno(code, "connect to \(address)")
    }

    /// poll(2) on one descriptor. Returns the revents, 0 on time-out. `timeoutMilliseconds` < 0 waits forever.
    package static func poll(
        _ descriptor: borrowing BorrowedDescriptor, events: Int16, timeoutMilliseconds: Int32
    ) throws(ConnectionError) -> Int16 {
        var watched = pollfd(fd: descriptor.number, events: events, revents: 0)
        let count = try retrying("poll", { Int(Glibc.poll(&watched, 1, timeoutMilliseconds)) })
        return count == 0 ? 0 : watched.revents
    }

    /// Waits until `fd` is readable or the monotonic clock (``MonotonicClock``) reaches `deadline`, with the
    /// nanosecond resolution of ppoll(2) (poll's is a millisecond). Returns `true` when `fd` became readable.
    /// Interrupted by a signal, it returns `false` early; callers look at the clock again.
    package static func waitReadable(
        _ descriptor: borrowing BorrowedDescriptor, untilMonotonic deadline: UInt64
    ) -> Bool {
        waitReadable(number: descriptor.number, untilMonotonic: deadline)
    }

    /// Sleeps until the monotonic clock reaches `deadline` (nanoseconds, as ``waitReadable(_:untilMonotonic:)``),
    /// or a signal comes.
    package static func sleep(untilMonotonic deadline: UInt64) {
        _ = waitReadable(number: -1, untilMonotonic: deadline)
    }

    /// ppoll(2) on `number` (< 0: none, a sleep) until `deadline`.
    private static func waitReadable(number fd: Int32, untilMonotonic deadline: UInt64) -> Bool {
        let now = MonotonicClock.nanoseconds()
        guard deadline > now else { return false }
        let left = deadline - now
        return csock_wait_readable_ns(fd, Int64(left / 1_000_000_000), Int(left % 1_000_000_000)) == 1
    }

    /// POLLIN, POLLOUT, POLLERR and POLLHUP, for ``poll(_:events:timeoutMilliseconds:)``.
    package static let pollIn = Int16(POLLIN)
    package static let pollOut = Int16(POLLOUT)
    package static let pollError = Int16(POLLERR)
    package static let pollHangUp = Int16(POLLHUP)
}
