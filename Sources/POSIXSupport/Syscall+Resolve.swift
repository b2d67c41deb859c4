internal import CSocketShims
public import ConnectionCore
internal import Glibc
import Synchronization

// Name resolution: getaddrinfo(3), on the caller's thread or on a thread of its own.
extension Syscall {
    /// getaddrinfo(3) for an endpoint: numeric hosts are parsed without any lookup; names go through the
    /// system resolver (/etc/hosts, then DNS). Names under `.invalid` fail at once without a query, as RFC 6761
    /// asks of resolver APIs.
    /// - Parameter passive: for listening (AI_PASSIVE).
    package static func resolve(_ endpoint: Endpoint, passive: Bool = false) throws(ConnectionError) -> [SocketAddress]
    {
        let hostText = endpoint.host.literal
        if case .name(let name) = endpoint.host {
            let trimmed = name.hasSuffix(".") ? String(name.dropLast()) : name
            if trimmed == "invalid" || trimmed.hasSuffix(".invalid") {
                throw ConnectionError(
                    .hostNotFound, "'\(name)' does not resolve (the .invalid domain never does, RFC 6761)",
                    systemCode: .init(domain: "gai", code: EAI_NONAME, name: "EAI_NONAME"))
            }
            if let pinned = HostPins.addresses(for: trimmed) {
                return try pinned.map { (host) throws(ConnectionError) in
                    try resolve(
                        Endpoint(transport: endpoint.transport, host: host, port: endpoint.port), passive: passive)[0]
                }
            }
        }
        var hints = addrinfo()
        hints.ai_socktype = endpoint.transport == .udp ? Int32(SOCK_DGRAM.rawValue) : Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_ADDRCONFIG | (passive ? AI_PASSIVE : 0)
        switch endpoint.host {
        case .ipv4: hints.ai_family = AF_INET; hints.ai_flags = AI_NUMERICHOST | (passive ? AI_PASSIVE : 0)
        case .ipv6: hints.ai_family = AF_INET6; hints.ai_flags = AI_NUMERICHOST | (passive ? AI_PASSIVE : 0)
        case .name: hints.ai_family = AF_UNSPEC
        }
        var list: UnsafeMutablePointer<addrinfo>?
        var status = getaddrinfo(hostText, String(endpoint.port), &hints, &list)
        if status == EAI_SYSTEM && Glibc.errno == EINTR {
            status = getaddrinfo(hostText, String(endpoint.port), &hints, &list)
        }
        guard status == 0 else {
            let kind: ConnectionError.Kind
            switch status {
            case EAI_NONAME, EAI_AGAIN, EAI_FAIL, csock_EAI_NODATA, csock_EAI_ADDRFAMILY: kind = .hostNotFound
            case EAI_MEMORY: kind = .resourceExhausted
            default: kind = .invalidEndpoint
            }
            let name = gaiName(status)
            if case .name = endpoint.host {
                throw ConnectionError(
                    kind, "cannot resolve '\(hostText)': \(String(cString: gai_strerror(status)))",
                    systemCode: .init(domain: "gai", code: status, name: name))
            }
            throw ConnectionError(
                .invalidEndpoint, "'\(hostText)' is not a valid address: \(String(cString: gai_strerror(status)))",
                systemCode: .init(domain: "gai", code: status, name: name))
        }
        defer { freeaddrinfo(list) }
        var addresses: [SocketAddress] = []
        var cursor = list
        while let entry = cursor {
            if let address = entry.pointee.ai_addr.flatMap({ SocketAddress($0, length: Int(entry.pointee.ai_addrlen)) }
            ),
                !addresses.contains(address)
            {
                addresses.append(address)
            }
            cursor = entry.pointee.ai_next
        }
        guard !addresses.isEmpty else {
            throw ConnectionError(.hostNotFound, "'\(hostText)' has no IPv4 or IPv6 address")
        }
        return addresses
    }

    private static func gaiName(_ status: Int32) -> String {
        switch status {
        case EAI_NONAME: "EAI_NONAME"
        case EAI_AGAIN: "EAI_AGAIN"
        case EAI_FAIL: "EAI_FAIL"
        case csock_EAI_NODATA: "EAI_NODATA"
        case EAI_FAMILY: "EAI_FAMILY"
        case csock_EAI_ADDRFAMILY: "EAI_ADDRFAMILY"
        case EAI_SERVICE: "EAI_SERVICE"
        case EAI_MEMORY: "EAI_MEMORY"
        case EAI_SYSTEM: "EAI_SYSTEM"
        default: "EAI \(status)"
        }
    }

    /// ``resolve(_:passive:)`` without blocking the caller: numeric addresses are parsed at once; host names are
    /// looked up on a thread of their own (getaddrinfo may wait for DNS), never on Swift's cooperative pool.
    package static func resolveAsync(
        _ endpoint: Endpoint, passive: Bool = false
    ) async throws(ConnectionError)
        -> [SocketAddress]
    {
        if case .name(let name) = endpoint.host, HostPins.addresses(for: name) == nil {
            let result: Result<[SocketAddress], ConnectionError> = await PosixThread.spawnAndAwait(name: "resolve") {
                deliver in
                deliver(Result { () throws(ConnectionError) in try resolve(endpoint, passive: passive) })
            }
            return try result.get()
        }
        return try resolve(endpoint, passive: passive)
    }
}

/// Names this process resolves itself, before the system resolver is asked: what curl's `--resolve` does for one
/// command, for the whole process. A pinned name resolves to its addresses in the order given, on every backend
/// (all of them resolve through ``Syscall/resolve(_:passive:)``). For tests and for trying a server under its
/// production name before DNS points there.
///
/// ```swift
/// try HostPins.pin("api.example.test", to: ["127.0.0.2", "127.0.0.1"])   // tried in this order
/// defer { HostPins.unpin("api.example.test") }
/// ```
public enum HostPins {
    private static let table = Guarded<[String: [Endpoint.Host]]>([:])

    /// Makes `name` resolve to `addresses` (IPv4 or IPv6 literals), in this order. Throws `.invalidEndpoint` for
    /// an address that is not a literal.
    public static func pin(_ name: String, to addresses: [String]) throws(ConnectionError) {
        var hosts: [Endpoint.Host] = []
        for address in addresses {
            let bracketed = address.contains(":") ? "[\(address)]" : address
            let endpoint = try Endpoint(url: "tcp://\(bracketed):1")
            guard case .name = endpoint.host else {
                hosts.append(endpoint.host)
                continue
            }
            throw ConnectionError(.invalidEndpoint, "pin \(name): '\(address)' is not an IP address")
        }
        guard !hosts.isEmpty else { throw ConnectionError(.invalidEndpoint, "pin \(name): no address given") }
        table.withLock { $0[key(name)] = hosts }
    }

    /// Lets the system resolve `name` again.
    public static func unpin(_ name: String) {
        _ = table.withLock { $0.removeValue(forKey: key(name)) }
    }

    /// The pinned addresses of `name`, `nil` when it is not pinned.
    package static func addresses(for name: String) -> [Endpoint.Host]? {
        table.withLock { $0[key(name)] }
    }

    private static func key(_ name: String) -> String {
        (name.hasSuffix(".") ? String(name.dropLast()) : name).lowercased()
    }
}
