/// A connection style, as users name it (`--backend bsd`): the registration a backend module gives of itself, once.
///
/// Each backend module declares its own (`Backend.bsd` in BSDSocketBackend, `Backend.nio` in NIOBackend, ...):
/// its name, what its style is, and the factory of its ``ConnectionBackend``. The umbrella `SocketStyles` keeps
/// the list (`Backend.allCases`) and layers tls, ws and wss over any of them (`TransportStack`); the CLI, compare,
/// the report and the conformance suite iterate that list. A backend written outside the package is a value of
/// this type too: `Backend(name:summary:style:make:)`, and `Backend.register(_:)` adds it to the list.
///
/// ```swift
/// let mine = Backend(name: "mine", summary: "my style", style: "how my style is written") { MyBackend() }
/// let connection = try await mine.connect(to: try Endpoint(url: "wss://127.0.0.1:8443/chat"))
/// ```
public struct Backend: Sendable, Hashable, CustomStringConvertible {
    /// The name users type: `bsd`, `uv`, `runloop`, `async`, `nio`. Unique in the list.
    public let name: String
    /// One line on the implementation, for `sockbench backends`.
    public let summary: String
    /// One line on how code in this style is written, for the report.
    public let style: String
    /// `true` for the reference the other styles are set against (SwiftNIO): the report's `x nio` columns and
    /// targets. At most one backend in the list is.
    public let isReference: Bool
    /// What the project's own tooling needs of one of its backends (`nil` for a backend written elsewhere).
    public let tooling: Tooling?
    private let make: @Sendable () -> any ConnectionBackend
    private let availability: @Sendable () -> String?
    /// Makes the backend on a loop (and its thread) of its own, for a server on several threads; `nil` for a
    /// backend with one loop per process.
    public let newLoop: (@Sendable () throws(ConnectionError) -> any ConnectionBackend)?

    /// What the project's own tooling reads from a backend's registration, so that adding a backend is its module
    /// and its registration, with no list elsewhere to extend by hand: `sockbench backends --json` prints it for
    /// the scripts (DocC's targets, CI's Autobahn runs, the micro-benchmarks' thresholds), and report.html draws
    /// the backend in its colour.
    public struct Tooling: Sendable, Hashable {
        /// The module the backend lives in: a DocC target of `scripts/docs`.
        public var module: String
        /// Its lines and bars in report.html (`#rrggbb`).
        public var colour: String
        /// The WebSocket scheme (`ws` or `wss`) CI runs Autobahn's cases 1-10 on against it, its server under
        /// wstest's client and its client against wstest's server; `nil`: not in CI (each run costs minutes).
        public var autobahn: Transport?
        /// The sides of it CI runs Autobahn's permessage-deflate cases (12-13) against: its server under wstest's
        /// client, its client against wstest's server. A run costs about 13 minutes of CPU, mostly wstest's, and the
        /// deflate codec and the WebSocket layer over it are every backend's, so CI runs each side once: bsd's server
        /// and async's client.
        public var autobahnDeflate: [AutobahnSide]
        /// A side of a backend that Autobahn's cases run against.
        public enum AutobahnSide: String, Sendable, Hashable {
            case server, client
        }
        /// Allocations per 64-byte tcp echo round trip, both ends, p90: the micro-benchmarks' threshold for it
        /// (`Benchmarks/`, with their tolerance of 2 either way).
        public var allocationsPerRoundTrip: Int

        public init(
            module: String, colour: String, autobahn: Transport? = nil, autobahnDeflate: [AutobahnSide] = [],
            allocationsPerRoundTrip: Int
        ) {
            self.module = module
            self.colour = colour
            self.autobahn = autobahn
            self.autobahnDeflate = autobahnDeflate
            self.allocationsPerRoundTrip = allocationsPerRoundTrip
        }
    }

    /// `availability` says, in one line, why the backend cannot run on this machine (io_uring on a kernel or in a
    /// sandbox that forbids it), or `nil` when it can. `newLoop` makes the backend on a loop of its own (`make`
    /// gives the shared one): a server on N threads listens on N of them.
    public init(
        name: String, summary: String, style: String, isReference: Bool = false, tooling: Tooling? = nil,
        availability: @escaping @Sendable () -> String? = { nil },
        newLoop: (@Sendable () throws(ConnectionError) -> any ConnectionBackend)? = nil,
        make: @escaping @Sendable () -> any ConnectionBackend
    ) {
        self.newLoop = newLoop
        self.name = name
        self.summary = summary
        self.style = style
        self.isReference = isReference
        self.tooling = tooling
        self.availability = availability
        self.make = make
    }

    /// Why this backend cannot run here, in one line; `nil` when it can.
    public var unavailableReason: String? { availability() }

    /// The backend's factory (a shared one for styles with one loop per process).
    public var implementation: any ConnectionBackend { make() }

    /// The name, as before this was an enum: `Backend.bsd.rawValue == "bsd"`.
    public var rawValue: String { name }

    public var description: String { name }

    public static func == (lhs: Backend, rhs: Backend) -> Bool { lhs.name == rhs.name }

    public func hash(into hasher: inout Hasher) { hasher.combine(name) }
}
