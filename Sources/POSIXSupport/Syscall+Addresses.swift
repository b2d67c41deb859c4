internal import CSocketShims
package import ConnectionCore
internal import Glibc

// bind, listen, and the addresses of a socket (getsockname, getpeername).
extension Syscall {
    /// bind(2).
    package static func bind(
        _ descriptor: borrowing BorrowedDescriptor, to address: SocketAddress
    ) throws(ConnectionError) {
        let fd = descriptor.number
        _ = try retrying("bind to \(address)", { address.withSockAddr { Int(Glibc.bind(fd, $0, $1)) } })
    }

    /// listen(2).
    package static func listen(_ descriptor: borrowing BorrowedDescriptor, backlog: Int32) throws(ConnectionError) {
        let fd = descriptor.number
        _ = try retrying("listen", { Int(Glibc.listen(fd, backlog)) })
    }

    /// getsockname(2).
    package static func localAddress(
        _ descriptor: borrowing BorrowedDescriptor
    ) throws(ConnectionError) -> SocketAddress {
        try address(of: descriptor, "getsockname", getsockname)
    }

    /// getpeername(2).
    package static func peerAddress(_ descriptor: borrowing BorrowedDescriptor) throws(ConnectionError) -> SocketAddress
    {
        try address(of: descriptor, "getpeername", getpeername)
    }

    private static func address(
        of descriptor: borrowing BorrowedDescriptor, _ name: String,
        _ call: (Int32, UnsafeMutablePointer<sockaddr>, UnsafeMutablePointer<socklen_t>) -> Int32
    ) throws(ConnectionError) -> SocketAddress {
        let fd = descriptor.number
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = try retrying(
            name,
            {
                withUnsafeMutablePointer(to: &storage) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Int(call(fd, $0, &length)) }
                }
            })
        guard let address = withUnsafeBytes(of: &storage, { SocketAddress($0.baseAddress!, length: Int(length)) })
        else { throw ConnectionError(.unsupported, "\(name): not an IP socket") }
        return address
    }
}
