internal import CSocketShims
package import ConnectionCore
internal import Glibc

// epoll and eventfd, for the loops of the async and run-loop backends.
extension Syscall {
    /// epoll_create1(EPOLL_CLOEXEC).
    package static func epollCreate() throws(ConnectionError) -> Int32 {
        Int32(try retrying("epoll_create1", { Int(csock_epoll_create()) }))
    }

    /// epoll_ctl(2). `operation`: ``epollAdd``, ``epollModify`` or ``epollDelete``.
    package static func epollControl(
        _ epfd: Int32, _ operation: Int32, _ descriptor: borrowing BorrowedDescriptor, events: UInt32, data: UInt64
    )
        throws(ConnectionError)
    {
        let fd = descriptor.number
        _ = try retrying("epoll_ctl", { Int(csock_epoll_ctl(epfd, operation, fd, events, data)) })
    }

    /// epoll_wait(2); EINTR returns 0 events. Fills `events` and `data` pairwise.
    package static func epollWait(
        _ epfd: Int32, events: UnsafeMutablePointer<UInt32>, data: UnsafeMutablePointer<UInt64>, capacity: Int32,
        timeoutMilliseconds: Int32
    ) throws(ConnectionError) -> Int {
        let result = csock_epoll_wait(epfd, events, data, capacity, timeoutMilliseconds)
        if result >= 0 { return Int(result) }
        let code = Glibc.errno
        if code == EINTR { return 0 }
        throw .errno(code, "epoll_wait")
    }

    package static let epollAdd = csock_EPOLL_CTL_ADD
    package static let epollModify = csock_EPOLL_CTL_MOD
    package static let epollDelete = csock_EPOLL_CTL_DEL
    package static let epollIn = csock_EPOLLIN
    package static let epollOut = csock_EPOLLOUT
    package static let epollError = csock_EPOLLERR
    package static let epollHangUp = csock_EPOLLHUP
    package static let epollReadHangUp = csock_EPOLLRDHUP
    package static let epollEdgeTriggered = csock_EPOLLET
    package static let epollOneShot = csock_EPOLLONESHOT

    /// eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK): the new descriptor, owned.
    package static func eventFD() throws(ConnectionError) -> SocketDescriptor {
        SocketDescriptor(adopting: Int32(try retrying("eventfd", { Int(csock_eventfd()) })))
    }

    /// Adds 1 to an eventfd (wakes a waiting epoll).
    package static func eventFDSignal(_ descriptor: borrowing BorrowedDescriptor) {
        let fd = descriptor.number
        _ = csock_eventfd_signal(fd)
    }

    /// Reads an eventfd back to 0.
    package static func eventFDDrain(_ descriptor: borrowing BorrowedDescriptor) {
        let fd = descriptor.number
        _ = csock_eventfd_drain(fd)
    }
}
