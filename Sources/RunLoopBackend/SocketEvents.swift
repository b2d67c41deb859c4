import ConnectionCore
import POSIXSupport

/// What epoll reported for a stream pair's socket, decoded (``StreamPairCore`` maps the epoll bits).
struct SocketEvents: OptionSet, Sendable {
    let rawValue: UInt8
    static let readable = SocketEvents(rawValue: 1 << 0)
    static let writable = SocketEvents(rawValue: 1 << 1)
    static let error = SocketEvents(rawValue: 1 << 2)
    /// Both directions are shut (EPOLLHUP): reported whatever the interest.
    static let hangUp = SocketEvents(rawValue: 1 << 3)
    /// The peer shut its sending side (EPOLLRDHUP).
    static let readHangUp = SocketEvents(rawValue: 1 << 4)
}

/// What a stream pair's socket is watched for in epoll.
struct SocketInterest: OptionSet, Sendable, Hashable {
    let rawValue: UInt8
    /// Readable or the peer's end (EPOLLIN | EPOLLRDHUP).
    static let read = SocketInterest(rawValue: 1 << 0)
    /// Writable (EPOLLOUT).
    static let write = SocketInterest(rawValue: 1 << 1)
}
