@_spi(Loop) public import ConnectionCore
import POSIXSupport

/// Backend `uring`: completion-based I/O with io_uring. Every operation (connect, accept, recv, send, recvmsg,
/// sendmsg) is an entry submitted to the ring of one ``UringLoop`` thread, which submits a turn's entries with one
/// system call and resumes each waiting task when its completion arrives. The native style is ``UringSocket``
/// and ``UringListener``.
///
/// Where io_uring is unavailable (an old kernel, `kernel.io_uring_disabled`, a seccomp filter), connecting and
/// listening throw `.unsupported`-like errors that say so in one line, and ``UringBackend/unavailableReason``
/// gives that line up front.
public struct UringBackend: ConnectionBackend {
    public let name = "uring"
    public let transports: Set<Transport> = [.tcp, .udp]

    /// The ring this backend's sockets use; `nil`: the shared one.
    private let loop: UringLoop?

    /// Starts the shared ring (when io_uring is available here; otherwise connect and listen say why).
    public init() {
        Syscall.ignoreSIGPIPE()
        _ = try? UringLoop.shared()
        loop = nil
    }

    /// A backend whose sockets use `loop` (a ring and its thread of their own).
    public init(loop: UringLoop) {
        Syscall.ignoreSIGPIPE()
        self.loop = loop
    }

    private func ring() throws(ConnectionError) -> UringLoop {
        if let loop { return loop }
        return try UringLoop.shared()
    }

    /// `nil` when io_uring works here; otherwise why not, in one line.
    public static var unavailableReason: String? {
        do throws(ConnectionError) {
            _ = try UringLoop.shared()
            return nil
        } catch {
            return error.detail
        }
    }

    public func connect(
        to endpoint: Endpoint, options: ConnectionOptions
    ) async throws(ConnectionError) -> any Connection {
        try requireTransport(of: endpoint)
        return UringConnection(socket: try await UringSocket.connect(to: endpoint, options: options, loop: ring()))
    }

    public func listen(
        on endpoint: Endpoint, options: ConnectionOptions
    ) async throws(ConnectionError) -> any Listener {
        try requireTransport(of: endpoint)
        let loop = try ring()
        if endpoint.transport == .udp {
            return try await UringUDPListener.start(on: endpoint, options: options, loop: loop)
        }
        let listener = try await UringListener.listen(on: endpoint, options: options, loop: loop)
        return SocketBackedListener(listener, accepting: UringConnection.self)
    }

}

/// ``UringSocket`` as a ``Connection``: every call goes straight to the socket (`SocketBackedConnection`).
final class UringConnection: SocketBackedConnection, Sendable {
    let socket: UringSocket

    init(socket: UringSocket) { self.socket = socket }

    var localEndpoint: Endpoint { socket.localEndpoint }
    var remoteEndpoint: Endpoint { socket.remoteEndpoint }
}

@_spi(Loop) extension UringSocket: StyleSocket {
    public var resumingExecutor: any TaskExecutor { loop }
}

@_spi(Loop) extension UringListener: StyleListener {}

extension Backend {
    /// Completion-based I/O with io_uring (`UringBackend`).
    public static let uring = Backend(
        name: "uring",
        summary: "io_uring: operations submitted to a ring in batches, one completion-loop thread resumes tasks",
        style: "submit an operation, await its completion: the kernel does the I/O, no readiness, no retry",
        tooling: Backend.Tooling(module: "UringBackend", colour: "#b07aa1", autobahn: .ws, allocationsPerRoundTrip: 8),
        availability: { UringBackend.unavailableReason },
        newLoop: { () throws(ConnectionError) in UringBackend(loop: try UringLoop(name: "uring-loop")) },
        make: { UringBackend() })
}
