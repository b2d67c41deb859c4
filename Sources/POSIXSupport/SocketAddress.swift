public import ConnectionCore
public import Glibc

/// An IPv4 or IPv6 socket address (address and port), small, hashable and sendable, convertible to and from
/// `sockaddr_in` / `sockaddr_in6`.
public struct SocketAddress: Sendable, Hashable, CustomStringConvertible {
    /// The address family.
    public enum Family: Sendable, Hashable {
        case ipv4
        case ipv6
    }

    /// IPv4 or IPv6.
    public let family: Family
    /// The port, in host byte order.
    public let port: UInt16
    // The address bytes in network order: IPv4 in the low 4 bytes of `low`; IPv6 in `high` then `low`.
    private let high: UInt64
    private let low: UInt64
    private let scopeID: UInt32

    /// Reads a `sockaddr_in` or `sockaddr_in6`; `nil` for any other family.
    public init?(_ pointer: UnsafeRawPointer, length: Int) {
        let family = pointer.load(fromByteOffset: 0, as: sa_family_t.self)
        if family == sa_family_t(AF_INET), length >= MemoryLayout<sockaddr_in>.size {
            let sin = pointer.load(as: sockaddr_in.self)
            self.family = .ipv4
            self.port = UInt16(bigEndian: sin.sin_port)
            self.high = 0
            self.low = UInt64(sin.sin_addr.s_addr)
            self.scopeID = 0
        } else if family == sa_family_t(AF_INET6), length >= MemoryLayout<sockaddr_in6>.size {
            let sin6 = pointer.load(as: sockaddr_in6.self)
            self.family = .ipv6
            self.port = UInt16(bigEndian: sin6.sin6_port)
            var words: (UInt64, UInt64) = (0, 0)
            withUnsafeBytes(of: sin6.sin6_addr) { bytes in
                words.0 = bytes.loadUnaligned(fromByteOffset: 0, as: UInt64.self)
                words.1 = bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self)
            }
            self.high = words.0
            self.low = words.1
            self.scopeID = sin6.sin6_scope_id
        } else {
            return nil
        }
    }

    /// The IPv4 loopback address 127.0.0.1 with the given port.
    public static func loopbackIPv4(port: UInt16) -> SocketAddress {
        var sin = sockaddr_in()
        sin.sin_family = sa_family_t(AF_INET)
        sin.sin_port = port.bigEndian
        sin.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
        return withUnsafeBytes(of: &sin) { SocketAddress($0.baseAddress!, length: $0.count)! }
    }

    /// The same address with another port.
    public func with(port: UInt16) -> SocketAddress {
        withSockAddr { pointer, length in
            var storage = sockaddr_storage()
            return withUnsafeMutableBytes(of: &storage) { raw in
                raw.copyMemory(from: UnsafeRawBufferPointer(start: pointer, count: Int(length)))
                if family == .ipv4 {
                    raw.storeBytes(of: port.bigEndian, toByteOffset: 2, as: UInt16.self)
                } else {
                    raw.storeBytes(of: port.bigEndian, toByteOffset: 2, as: UInt16.self)
                }
                return SocketAddress(raw.baseAddress!, length: Int(length))!
            }
        }
    }

    /// Calls `body` with a `sockaddr` pointer and its length.
    public func withSockAddr<R>(_ body: (UnsafePointer<sockaddr>, socklen_t) throws -> R) rethrows -> R {
        switch family {
        case .ipv4:
            var sin = sockaddr_in()
            sin.sin_family = sa_family_t(AF_INET)
            sin.sin_port = port.bigEndian
            sin.sin_addr.s_addr = UInt32(truncatingIfNeeded: low)
            return try withUnsafePointer(to: &sin) {
                try $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    try body($0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
        case .ipv6:
            var sin6 = sockaddr_in6()
            sin6.sin6_family = sa_family_t(AF_INET6)
            sin6.sin6_port = port.bigEndian
            sin6.sin6_scope_id = scopeID
            withUnsafeMutableBytes(of: &sin6.sin6_addr) { bytes in
                bytes.storeBytes(of: high, toByteOffset: 0, as: UInt64.self)
                bytes.storeBytes(of: low, toByteOffset: 8, as: UInt64.self)
            }
            return try withUnsafePointer(to: &sin6) {
                try $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    try body($0, socklen_t(MemoryLayout<sockaddr_in6>.size))
                }
            }
        }
    }

    /// The address as text, without the port: `127.0.0.1`, `::1`.
    public var host: String {
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
        switch family {
        case .ipv4:
            var address = in_addr(s_addr: UInt32(truncatingIfNeeded: low))
            _ = inet_ntop(AF_INET, &address, &buffer, socklen_t(buffer.count))
        case .ipv6:
            var address = in6_addr()
            withUnsafeMutableBytes(of: &address) { bytes in
                bytes.storeBytes(of: high, toByteOffset: 0, as: UInt64.self)
                bytes.storeBytes(of: low, toByteOffset: 8, as: UInt64.self)
            }
            _ = inet_ntop(AF_INET6, &address, &buffer, socklen_t(buffer.count))
        }
        return String(decoding: buffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// `true` for 0.0.0.0 and ::.
    public var isUnspecified: Bool { high == 0 && low == 0 }

    /// The AF_ constant.
    public var addressFamily: Int32 { family == .ipv4 ? AF_INET : AF_INET6 }

    /// This address as an endpoint of the given transport.
    public func endpoint(_ transport: Transport, path: String = "/") -> Endpoint {
        Endpoint(transport: transport, host: family == .ipv4 ? .ipv4(host) : .ipv6(host), port: port, path: path)
    }

    /// `127.0.0.1:9000` or `[::1]:9000`.
    public var description: String {
        family == .ipv4 ? "\(host):\(port)" : "[\(host)]:\(port)"
    }
}
