public import ConnectionCore
package import NIOCore
public import NIOPosix
package import POSIXSupport
import Synchronization

/// SwiftNIO as a backend: what a user would pick instead of the four styles here, measured through the same
/// `Connection`. Channels on one `MultiThreadedEventLoopGroup` of one thread (as `uv` and `async` run every
/// connection on one loop thread), with every option set explicitly so that the comparison is fair: SwiftNIO
/// enables TCP_NODELAY by default and reads UDP into 2,048-byte buffers by default; here both follow
/// `ConnectionOptions` like every other backend.
///
/// Names are resolved by the same resolver as the other backends (so `.invalid` names fail without a DNS
/// query); SwiftNIO then connects to the address.
///
/// Over ws:// and wss:// the WebSocket layer every backend shares runs over these channels' bytes (SwiftNIO's
/// own WebSocket is the nio backend's native style over ws, in `NativeStyles`).
public struct NIOBackend: ConnectionBackend {
    public let name = "nio"
    public let transports: Set<Transport> = [.tcp, .udp]
    let group: MultiThreadedEventLoopGroup

    /// The backend's event loop group, made on first use and kept for the life of the process.
    public static let sharedGroup = MultiThreadedEventLoopGroup(numberOfThreads: 1)

    /// A backend on `group` (default: ``sharedGroup``, one loop thread).
    public init(group: MultiThreadedEventLoopGroup = NIOBackend.sharedGroup) {
        self.group = group
    }

    public func connect(
        to endpoint: Endpoint, options: ConnectionOptions
    ) async throws(ConnectionError) -> any Connection {
        try check(endpoint)
        let addresses = try await Syscall.resolveAsync(endpoint)
        let group = group
        return try await Socket.connect(toFirstOf: addresses, endpoint: endpoint, options: options) {
            (resolved, deadline) async throws(ConnectionError) -> any Connection in
            let address = try nioAddress(resolved, doing: "connect to \(endpoint)")
            if endpoint.transport == .udp {
                return try await NIODatagramConnection.connect(
                    to: address, endpoint: endpoint, options: options, group: group)
            }
            // SwiftNIO's connect timeout is per channel: what is left of the whole connect's.
            var attempt = options
            attempt.connectTimeout = Socket.timeLeft(until: deadline)
            return try await NIOStreamConnection.connect(
                to: address, endpoint: endpoint, options: attempt, group: group)
        }
    }

    public func listen(
        on endpoint: Endpoint, options: ConnectionOptions
    ) async throws(ConnectionError) -> any Listener {
        try check(endpoint)
        let resolved = try await Syscall.resolveAsync(endpoint, passive: true)[0]
        // Bound with the recipe every backend shares (so a taken address reads the same, and a failed bind leaves
        // nothing open); SwiftNIO adopts the bound socket.
        let (socket, _) = try Socket.listen(
            on: resolved, transport: endpoint.transport, options: options, describing: endpoint)
        if endpoint.transport == .udp {
            return try await NIODatagramListener.adopt(socket, endpoint: endpoint, options: options, group: group)
        }
        return try await NIOStreamListener.adopt(socket, endpoint: endpoint, options: options, group: group)
    }

    private func check(_ endpoint: Endpoint) throws(ConnectionError) {
        guard transports.contains(endpoint.transport) else {
            throw ConnectionError(
                .unsupported, "the nio backend speaks tcp and udp; \(endpoint.transport) is layered by the umbrella")
        }
    }
}

/// Our resolved address as SwiftNIO's.
package func nioAddress(
    _ address: POSIXSupport.SocketAddress, doing: String
) throws(ConnectionError) -> NIOCore.SocketAddress {
    do {
        return try NIOCore.SocketAddress(ipAddress: address.host, port: Int(address.port))
    } catch {
        throw ConnectionError(.invalidEndpoint, "\(doing): \(error)")
    }
}

/// SwiftNIO's address as an endpoint.
package func endpoint(_ address: NIOCore.SocketAddress?, _ transport: Transport) -> Endpoint {
    guard let address, let ip = address.ipAddress, let port = address.port else {
        return Endpoint(transport: transport, host: .ipv4("0.0.0.0"), port: 0)
    }
    let host: Endpoint.Host =
        switch address {
        case .v6: .ipv6(ip)
        default: .ipv4(ip)
        }
    return Endpoint(transport: transport, host: host, port: UInt16(port))
}

/// Any error SwiftNIO reports, in the shared vocabulary.
package func connectionError(_ error: any Error, _ doing: String) -> ConnectionError {
    switch error {
    case let error as ConnectionError:
        return error
    case let error as IOError:
        return .errno(error.errnoCode, doing)
    case let error as ChannelError:
        switch error {
        case .connectTimeout(let timeout):
            return ConnectionError(.timedOut, "\(doing): no connection within \(timeout)")
        case .ioOnClosedChannel, .alreadyClosed, .eof:
            return .closed()
        case .outputClosed:
            return .closed("the output was closed (half-close)")
        case .writeMessageTooLarge:
            return ConnectionError(.messageTooLarge, "\(doing): the datagram exceeds what UDP can carry")
        default:
            return ConnectionError(
                .system, "\(doing): \(error)", systemCode: .init(domain: "nio", code: 0, name: "ChannelError"))
        }
    case let error as NIOConnectionError:
        if let first = error.connectionErrors.first { return connectionError(first.error, doing) }
        return ConnectionError(.refused, "\(doing): \(error)")
    default:
        if String(describing: error).contains("ECONNREFUSED") { return ConnectionError(.refused, doing) }
        return ConnectionError(
            .system, "\(doing): \(error)", systemCode: .init(domain: "nio", code: 0, name: "\(type(of: error))"))
    }
}

extension Backend {
    /// SwiftNIO channels on one event-loop thread (`NIOBackend`): the reference a user would otherwise pick.
    public static let nio = Backend(
        name: "nio",
        summary: "SwiftNIO 2.101 channels and handlers on one event-loop thread; the reference to beat",
        style: "SwiftNIO channel handlers and futures (or the same Connection)",
        isReference: true,
        tooling: Backend.Tooling(module: "NIOBackend", colour: "#edc948", autobahn: .ws, allocationsPerRoundTrip: 15),
        newLoop: { NIOBackend(group: MultiThreadedEventLoopGroup(numberOfThreads: 1)) },
        make: { NIOBackend() })
}
