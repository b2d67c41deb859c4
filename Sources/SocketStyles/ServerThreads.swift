@_spi(Loop) import ConnectionCore
import Synchronization

/// A server on several threads: a backend's listener on each of N loops, all bound to one address with
/// SO_REUSEPORT, so that the kernel spreads new connections (and UDP peers, by their address) over the loops, and
/// each connection lives on the loop that accepted it. `sockbench serve --threads N` runs this way.
///
/// ```swift
/// let listener = try await Backend.uv.listen(on: try Endpoint(url: "tcp://127.0.0.1:0"), threads: 2)
/// let connection = try await listener.accept()  // from whichever of the two loops the kernel gave it to
/// ```
///
/// Why a listening socket per loop rather than one acceptor handing connections over (``ServerSpread/handOff``,
/// async only): with a hand-off the acceptor's loop does all the accepting (58% of two reactors' CPU in a churn of
/// short connections, against half each), and throughput was no better either way beyond run-to-run spread
/// (docs/benchmarks.md, "Servers on more threads"); with SO_REUSEPORT each loop accepts its own with no thread in
/// between. The kernel chooses by a hash of the peer's address and port, so a few connections may land unevenly;
/// many spread evenly.
/// How a server on several loops spreads its connections over them.
public enum ServerSpread: String, Sendable, CaseIterable {
    /// A listening socket per loop on one address (SO_REUSEPORT): the kernel picks by a hash of the peer.
    case reusePort = "reuseport"
    /// One listening socket on the first loop, each accepted connection handed to the loops in turn (backends
    /// that offer it: `HandOffListening`).
    case handOff = "handoff"
}

extension Backend {
    /// The loops made for servers on several threads, by backend name, kept for the life of the process (as each
    /// backend's shared loop is): a connection may outlive the listener that accepted it.
    private static let extraLoops = Guarded<[String: [any ConnectionBackend]]>([:])

    /// This backend on `count` loops: its shared one (`implementation`), then loops of its own made on first use
    /// (`newLoop`). Fails for a backend with one loop per process.
    public func loops(_ count: Int) throws(ConnectionError) -> [any ConnectionBackend] {
        guard count > 1 else { return [implementation] }
        guard let newLoop else {
            throw ConnectionError(
                .unsupported, "the \(name) backend runs one loop per process; it cannot serve on \(count) threads")
        }
        let name = name
        let extra = try Self.extraLoops.withLock { (all) throws(ConnectionError) -> [any ConnectionBackend] in
            var made = all[name] ?? []
            while made.count < count - 1 { made.append(try newLoop()) }
            all[name] = made
            return Array(made.prefix(count - 1))
        }
        return [implementation] + extra
    }

    /// ``TransportStack`` over `threads` loops of this backend: its listeners listen on each loop (tls, ws and wss
    /// layered over them as over one); its connects go from the shared loop.
    public func stack(threads: Int, spread: ServerSpread = .reusePort) throws(ConnectionError) -> TransportStack {
        if spread == .handOff, !(implementation is any HandOffListening) {
            throw ConnectionError(.unsupported, "the \(name) backend does not hand accepted connections over")
        }
        return threads <= 1 ? stack : TransportStack(over: LoopGroupBackend(loops: try loops(threads), spread: spread))
    }

    /// Listens on `threads` loops of this backend (``stack(threads:spread:)``), one address for them all.
    public func listen(
        on endpoint: Endpoint, options: ConnectionOptions = ConnectionOptions(),
        webSocket: WebSocketOptions = WebSocketOptions(), tls: TLSConfiguration? = nil, threads: Int,
        spread: ServerSpread = .reusePort
    ) async throws(ConnectionError) -> any Listener {
        try await stack(threads: threads, spread: spread).listen(
            on: endpoint, options: options, webSocket: webSocket, tls: tls)
    }
}

/// A backend over several loops of one style: a listener on each, bound to the same address (SO_REUSEPORT).
struct LoopGroupBackend: ConnectionBackend {
    let loops: [any ConnectionBackend]
    var spread = ServerSpread.reusePort

    var name: String { loops[0].name }
    var transports: Set<Transport> { loops[0].transports }

    func connect(to endpoint: Endpoint, options: ConnectionOptions) async throws(ConnectionError) -> any Connection {
        try await loops[0].connect(to: endpoint, options: options)
    }

    /// The first loop binds (port 0 becomes a real port); the others bind the address it got.
    func listen(on endpoint: Endpoint, options: ConnectionOptions) async throws(ConnectionError) -> any Listener {
        if spread == .handOff, let first = loops[0] as? any HandOffListening {
            return try await first.listen(on: endpoint, options: options, handingOffTo: loops)
        }
        var shared = options
        shared.reusePort = true
        var listeners = [try await loops[0].listen(on: endpoint, options: shared)]
        do throws(ConnectionError) {
            for loop in loops.dropFirst() {
                listeners.append(try await loop.listen(on: listeners[0].localEndpoint, options: shared))
            }
        } catch {
            for listener in listeners { await listener.close() }
            throw error
        }
        return SpreadListener(listeners)
    }
}

/// Several listeners as one: a task per listener takes what it accepts into one queue, in arrival order. UDP:
/// each listener keeps its own peers (and its own `maximumUDPPeers`).
final class SpreadListener: Listener, Sendable {
    let transport: Transport
    let localEndpoint: Endpoint
    private let listeners: [any Listener]
    private let accepted = AcceptedConnections()
    private let takers: [Task<Void, Never>]

    init(_ listeners: [any Listener]) {
        self.listeners = listeners
        transport = listeners[0].transport
        localEndpoint = listeners[0].localEndpoint
        let accepted = accepted
        takers = listeners.map { listener in
            Task {
                while true {
                    do throws(ConnectionError) {
                        accepted.offer(try await listener.accept())
                    } catch {
                        // Closed: the listener is done. Anything else (out of descriptors, say) is the next
                        // accept's to report; the listener goes on.
                        if error.kind == .closed { return }
                        accepted.fail(error)
                    }
                }
            }
        }
    }

    func accept() async throws(ConnectionError) -> any Connection { try await accepted.accept() }

    func close() async {
        let listeners = listeners
        let takers = takers
        await accepted.close {
            for listener in listeners { await listener.close() }
            for taker in takers { await taker.value }
        }
    }
}
