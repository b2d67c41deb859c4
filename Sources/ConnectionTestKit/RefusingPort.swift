import Glibc
public import SocketStyles
import Synchronization

/// A loopback TCP port that refuses every connection for as long as this value is open.
///
/// A TCP socket bound to the port and not listening answers a SYN with RST (`ECONNREFUSED`), and it holds the port:
/// no listener of another test process can bind it meanwhile, and no connect can be given it as its own ephemeral
/// source port (which on loopback connects a socket to itself: TCP's simultaneous open). A port that is bound and
/// let go before the connect is exposed to both; CI caught it twice (2026-12: a connect "to nowhere" succeeded in
/// the address-order and the relay tests, while the lessons' and churn's processes bound ports beside them).
///
/// Close it when done (`defer { refusing.close() }`): the tests count descriptors.
public final class RefusingPort: Sendable {
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// The port, the same on every host given.
    public let port: UInt16
    private let held: Mutex<[Int32]>

    /// Binds one TCP socket to one port on each of `hosts` (IPv4 literals; the first picks the port). A few ports
    /// are tried, in case another socket holds the first one on a later host.
    public init(hosts: [String] = ["127.0.0.1"]) throws {
        for _ in 0..<20 {
            var port: UInt16 = 0
            var held: [Int32] = []
            for host in hosts {
                let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
                guard fd >= 0 else {
                    for open in held { Glibc.close(open) }
                    throw Failure(description: "socket: errno \(errno)")
                }
                var address = sockaddr_in()
                address.sin_family = sa_family_t(AF_INET)
                address.sin_port = port.bigEndian
                guard inet_pton(AF_INET, host, &address.sin_addr) == 1 else {
                    Glibc.close(fd)
                    for open in held { Glibc.close(open) }
                    throw Failure(description: "\(host) is not an IPv4 address")
                }
                let bound = withUnsafePointer(to: &address) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                    }
                }
                guard bound == 0 else {
                    Glibc.close(fd)
                    break
                }
                held.append(fd)
                if port == 0 {
                    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
                    _ = withUnsafeMutablePointer(to: &address) {
                        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
                    }
                    port = UInt16(bigEndian: address.sin_port)
                }
            }
            if held.count == hosts.count {
                self.port = port
                self.held = Mutex(held)
                return
            }
            for open in held { Glibc.close(open) }
        }
        throw Failure(description: "no port free on all of \(hosts)")
    }

    /// This port on `host` for `transport` (tcp, tls, ws, wss: all refused by the TCP socket under them).
    public func endpoint(_ transport: Transport, host: String = "127.0.0.1") throws(ConnectionError) -> Endpoint {
        try Endpoint(url: "\(transport)://\(host):\(port)")
    }

    /// Lets the port go. Once closed it refuses nothing for certain.
    public func close() {
        let descriptors = held.withLock { held in
            defer { held = [] }
            return held
        }
        for fd in descriptors { Glibc.close(fd) }
    }

    deinit { close() }
}
