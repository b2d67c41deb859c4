public import ConnectionCore
public import SocketStyles
import Synchronization

/// A TCP relay (the seeds' proxy server) written in one backend's own style: no `Connection`, no `Listener`.
/// Each client gets its own upstream connection; bytes go both ways, a FIN one way is carried as a FIN (the other
/// way stays open), and a reader that stops at either end stops the relay reading from the other end, so memory
/// per client pair stays bounded. Faults are not injected here: that is ``Relay``'s job (through `Connection`).
public protocol NativeRelay: AnyObject, Sendable {
    /// Where clients connect (the real port when 0 was asked).
    var localEndpoint: Endpoint { get }
    /// How many clients were accepted so far.
    var clients: Int { get }
    /// Stops listening, closes every pair, and waits until its threads or loop are gone.
    func stop() async
}

extension Backend {
    /// How this backend's own relay is written, in a line.
    public var nativeRelayStyle: String {
        switch self {
        case .bsd: "two threads per client, each a blocking recv -> send loop; shutdown(SHUT_WR) carries a FIN"
        case .uv: "read callbacks write to the other handle; uv_read_stop while its write queue is long; uv_shutdown"
        case .runloop:
            "stream delegates: hasBytesAvailable reads and writes on, hasSpaceAvailable flushes what was left"
        case .async: "AsyncSocket: a task per direction, receive -> send, then closeOutput"
        case .nio: "a glue handler per channel: channelRead writes to the partner, read() only while it is writable"
        }
    }

    /// A TCP relay from `listen` to `upstream` written in this backend's own style.
    public func nativeRelay(listen: Endpoint, upstream: Endpoint) async throws(ConnectionError) -> any NativeRelay {
        guard listen.transport == .tcp, upstream.transport == .tcp else {
            throw ConnectionError(
                .unsupported,
                "the native relays are tcp -> tcp; other transports relay through Connection (sockbench proxy without --native)"
            )
        }
        switch self {
        case .bsd: return try await BSDNativeRelay.start(listen: listen, upstream: upstream)
        case .uv: return try await UVNativeRelay.start(listen: listen, upstream: upstream)
        case .runloop: return try await RunLoopNativeRelay.start(listen: listen, upstream: upstream)
        case .async: return try AsyncNativeRelay(listen: listen, upstream: upstream)
        case .nio: return try await NIONativeRelay.start(listen: listen, upstream: upstream)
        }
    }
}

/// The bytes a relay holds for one direction before it stops reading the other end (its memory bound per
/// direction, beside what the kernel buffers).
let nativeRelayWindow = 256 * 1024

/// A counter of accepted clients, shared by the relays.
final class ClientCounter: Sendable {
    private let count = Atomic<Int>(0)
    func increment() { count.add(1, ordering: .relaxed) }
    var value: Int { count.load(ordering: .relaxed) }
}
