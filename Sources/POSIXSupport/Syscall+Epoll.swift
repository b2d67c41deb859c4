internal import CSocketShims
public import ConnectionCore
internal import Glibc

// epoll and eventfd, for the loops of the async and run-loop backends.
extension Syscall {
    /// epoll_create1(EPOLL_CLOEXEC).
    public static func epollCreate() throws(ConnectionError) -> Int32 {
        Int32(try retrying("epoll_create1", { Int(csock_epoll_create()) }))
    }

    /// epoll_ctl(2). `operation`: ``epollAdd``, ``epollModify`` or ``epollDelete``.
    public static func epollControl(
        _ epfd: Int32, _ operation: Int32, _ fd: Int32, events: UInt32, data: UInt64
    )
        throws(ConnectionError)
    {
        _ = try retrying("epoll_ctl", { Int(csock_epoll_ctl(epfd, operation, fd, events, data)) })
    }

    /// epoll_wait(2); EINTR returns 0 events. Fills `events` and `data` pairwise.
    public static func epollWait(
        _ epfd: Int32, events: UnsafeMutablePointer<UInt32>, data: UnsafeMutablePointer<UInt64>, capacity: Int32,
        timeoutMilliseconds: Int32
    ) throws(ConnectionError) -> Int {
        let result = csock_epoll_wait(epfd, events, data, capacity, timeoutMilliseconds)
        if result >= 0 { return Int(result) }
        let code = Glibc.errno
        if code == EINTR { return 0 }
        throw .errno(code, "epoll_wait")
    }

    public static let epollAdd = csock_EPOLL_CTL_ADD
    public static let epollModify = csock_EPOLL_CTL_MOD
    public static let epollDelete = csock_EPOLL_CTL_DEL
    public static let epollIn = csock_EPOLLIN
    public static let epollOut = csock_EPOLLOUT
    public static let epollError = csock_EPOLLERR
    public static let epollHangUp = csock_EPOLLHUP
    public static let epollReadHangUp = csock_EPOLLRDHUP
    public static let epollEdgeTriggered = csock_EPOLLET
    public static let epollOneShot = csock_EPOLLONESHOT

    /// eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK).
    public static func eventFD() throws(ConnectionError) -> Int32 {
        Int32(try retrying("eventfd", { Int(csock_eventfd()) }))
    }

    /// Adds 1 to an eventfd (wakes a waiting epoll).
    public static func eventFDSignal(_ fd: Int32) {
        _ = csock_eventfd_signal(fd)
    }

    /// Reads an eventfd back to 0.
    public static func eventFDDrain(_ fd: Int32) {
        _ = csock_eventfd_drain(fd)
    }
}
