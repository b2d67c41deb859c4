@_spi(Loop) public import ConnectionCore
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
    /// How this backend's own relay is written, in a line (empty when it has no native style).
    public var nativeRelayStyle: String { NativeStyleEntry.entries[self]?.relayLine ?? "" }

    /// A TCP relay from `listen` to `upstream` written in this backend's own style.
    public func nativeRelay(listen: Endpoint, upstream: Endpoint) async throws(ConnectionError) -> any NativeRelay {
        guard listen.transport == .tcp, upstream.transport == .tcp else {
            throw ConnectionError(
                .unsupported,
                "the native relays are tcp -> tcp; other transports relay through Connection (sockbench proxy without --native)"
            )
        }
        guard let entry = NativeStyleEntry.entries[self] else { throw nativeUnsupported(.tcp) }
        return try await entry.relay(listen, upstream)
    }
}

/// The bytes a relay holds for one direction before it stops reading the other end (its memory bound per
/// direction, beside what the kernel buffers).
let nativeRelayWindow = 256 * 1024

/// One direction of the relays written as a task per client (async's and uring's): what `source` receives into the
/// relay's own 64 KiB goes to `sink` from there (no copy, one receive and one send in flight), and `source`'s FIN
/// becomes `sink`'s FIN. An error closes both.
func relayOneWay<Socket: StyleSocket>(from source: Socket, to sink: Socket) async {
    let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
    defer { buffer.deallocate() }
    do throws(ConnectionError) {
        while let count = try await source.receive(into: buffer) {
            try await sink.send(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[..<count]))
        }
        try await sink.closeOutput()
    } catch {
        await source.close()
        await sink.close()
    }
}

/// A counter of accepted clients, shared by the relays.
final class ClientCounter: Sendable {
    private let count = Atomic<Int>(0)
    func increment() { count.add(1, ordering: .relaxed) }
    var value: Int { count.load(ordering: .relaxed) }
}

/// The accept loop of the native servers written as a task per client (async's and uring's echo servers and
/// relays): one task on the style's executor accepts until the listener closes and serves each client in a child
/// task; the sockets open now are kept for `stop`, which closes them and then waits for every task.
final class TaskPerClient<Socket: AnyObject & Sendable>: Sendable {
    private let acceptor = Guarded<Task<Void, Never>?>(nil)
    private let open = Guarded<[ObjectIdentifier: Socket]>([:])
    private let accepted = ClientCounter()

    /// How many clients were accepted so far.
    var acceptedCount: Int { accepted.value }

    /// Starts accepting: each client `accept` returns is kept as open and handed to `serve` in a task of its own;
    /// `accept` returning `nil` (the listener closed) ends the loop.
    func start(
        on executor: any TaskExecutor, accept: @escaping @Sendable () async -> Socket?,
        serve: @escaping @Sendable (Socket) async -> Void
    ) {
        let task = Task(executorPreference: executor) { [self] in
            await withDiscardingTaskGroup { group in
                while let client = await accept() {
                    accepted.increment()
                    opened(client)
                    group.addTask { await serve(client) }
                }
            }
        }
        acceptor.withLock { $0 = task }
    }

    /// Keeps `socket` (an upstream a relay opened) for `stop`.
    func opened(_ socket: Socket) { open.withLock { $0[ObjectIdentifier(socket)] = socket } }

    /// Forgets `socket` (its server closes it).
    func closed(_ socket: Socket) { open.withLock { $0[ObjectIdentifier(socket)] = nil } }

    /// After the listener closed: `close` for every socket still open, then waits for the accept loop and every
    /// client's task.
    func stop(closing close: (Socket) async -> Void) async {
        for socket in open.withLock({ Array($0.values) }) { await close(socket) }
        await acceptor.withLock { $0 }?.value
    }
}
