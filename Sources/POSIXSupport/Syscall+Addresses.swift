internal import CSocketShims
package import ConnectionCore
internal import Glibc

// bind, listen, and the addresses of a socket (getsockname, getpeername).
extension Syscall {
    /// bind(2).
    package static func bind(_ fd: Int32, to address: SocketAddress) throws(ConnectionError) {
        _ = try retrying("bind to \(address)", { address.withSockAddr { Int(Glibc.bind(fd, $0, $1)) } })
    }

    /// listen(2).
    package static func listen(_ fd: Int32, backlog: Int32) throws(ConnectionError) {
        _ = try retrying("listen", { Int(Glibc.listen(fd, backlog)) })
    }

    /// getsockname(2).
    package static func localAddress(_ fd: Int32) throws(ConnectionError) -> SocketAddress {
        try address(of: fd, "getsockname", getsockname)
    }

    /// getpeername(2).
    package static func peerAddress(_ fd: Int32) throws(ConnectionError) -> SocketAddress {
        try address(of: fd, "getpeername", getpeername)
    }

    private static func address(
        of fd: Int32, _ name: String,
        _ call: (Int32, UnsafeMutablePointer<sockaddr>, UnsafeMutablePointer<socklen_t>) -> Int32
    ) throws(ConnectionError) -> SocketAddress {
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
