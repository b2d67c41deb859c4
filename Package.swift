// swift-tools-version: 6.1
import PackageDescription

/// Settings shared by every Swift target: Swift 6 language mode (strict concurrency) and the upcoming features
/// the architecture guide asks for. NonisolatedNonsendingByDefault: a nonisolated async function runs on its
/// caller's executor instead of switching to the generic one at entry and back at return; on the hot path of
/// `Connection` that removed about two thirds of the runtime's executor switches (and their task-status
/// locks) per round trip: 26.7 -> 8.6 per end for bsd over ws, 9.5 -> 4.8 over tcp (docs/benchmarks.md).
let strictSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
    .enableUpcomingFeature("InternalImportsByDefault"),
    .enableUpcomingFeature("NonisolatedNonsendingByDefault"),
]

let package = Package(
    name: "SocketStyles",
    products: [
        // Everything: every backend, WebSocket and TLS, the backends' registrations (`Backend.allCases`),
        // TransportStack.
        .library(name: "SocketStyles", targets: ["SocketStyles"]),
        // A la carte: the contract, one backend, the layers. Depending on SocketStylesBSD alone builds neither
        // SwiftNIO nor links libuv or OpenSSL (Examples/BSDOnly shows it, and CI checks it).
        .library(name: "SocketStylesCore", targets: ["ConnectionCore"]),
        .library(name: "SocketStylesBSD", targets: ["BSDSocketBackend"]),
        .library(name: "SocketStylesUV", targets: ["LibUVBackend"]),
        .library(name: "SocketStylesRunLoop", targets: ["RunLoopBackend"]),
        .library(name: "SocketStylesAsync", targets: ["AsyncBackend"]),
        .library(name: "SocketStylesNIO", targets: ["NIOBackend"]),
        .library(name: "SocketStylesUring", targets: ["UringBackend"]),
        .library(name: "SocketStylesWebSocket", targets: ["WebSocketTransport", "WebSocketCodec"]),
        .library(name: "SocketStylesTLS", targets: ["TLSTransport"]),
        // Routes the library's diagnostics (server bounds: connection limit, idle timeouts...) to swift-log.
        .library(name: "SocketStylesLogging", targets: ["SocketStylesLogging"]),
        .library(name: "SocketStylesCombine", targets: ["SocketStylesCombine"]),
        .library(name: "SocketStylesFoundation", targets: ["SocketStylesFoundation"]),
        .library(name: "ConnectionTestKit", targets: ["ConnectionTestKit"]),
        .executable(name: "sockbench", targets: ["sockbench"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift", from: "0.2.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
        .package(url: "https://github.com/OpenCombine/OpenCombine", from: "0.14.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        // `swift package generate-documentation`: the DocC catalog in Sources/SocketStyles/SocketStyles.docc.
        .package(url: "https://github.com/swiftlang/swift-docc-plugin", from: "1.5.0"),
    ],
    targets: [
        // The contract: protocols, endpoints, errors, options. No I/O, no C.
        .target(name: "ConnectionCore", swiftSettings: strictSettings),
        // What Glibc does not import (accept4, epoll, eventfd, timerfd). Symbols prefixed csock_.
        .target(name: "CSocketShims"),
        // The socket layer: system calls by concern, socket addresses, name resolution, owned descriptors, the listen
        // and connect recipes, threads, the clock, EpollLoop and the loops' work queue.
        .target(name: "POSIXSupport", dependencies: ["ConnectionCore", "CSocketShims"], swiftSettings: strictSettings),
        // Style 1: blocking BSD sockets on threads of our own.
        .target(
            name: "BSDSocketBackend", dependencies: ["ConnectionCore", "POSIXSupport"], swiftSettings: strictSettings),
        // libuv from the system (Debian's libuv1-dev), found with pkg-config.
        .systemLibrary(name: "CLibUV", pkgConfig: "libuv", providers: [.apt(["libuv1-dev"])]),
        // Style 2: libuv's loop and callbacks.
        .target(
            name: "LibUVBackend",
            dependencies: ["ConnectionCore", "POSIXSupport", "CLibUV"],
            swiftSettings: strictSettings
        ),
        // Style 4: async/await over non-blocking sockets and an epoll reactor.
        .target(
            name: "AsyncBackend",
            dependencies: ["ConnectionCore", "POSIXSupport"],
            swiftSettings: strictSettings
        ),
        // liburing from the system (Debian's liburing-dev), behind a C file of its own: liburing.h defines
        // _GNU_SOURCE, which Swift's Glibc module must not see.
        .target(name: "CURing", linkerSettings: [.linkedLibrary("uring")]),
        // Style 5: completion-based I/O, io_uring's submission and completion rings.
        .target(
            name: "UringBackend",
            dependencies: ["ConnectionCore", "POSIXSupport", "CURing"],
            swiftSettings: strictSettings
        ),
        // Style 3: delegate-driven input/output streams on a run loop of our own (as Stream/CFStream).
        .target(
            name: "RunLoopBackend",
            dependencies: ["ConnectionCore", "POSIXSupport"],
            swiftSettings: strictSettings
        ),
        // The reference a user would otherwise pick: SwiftNIO (NIOPosix channels), behind Connection.
        .target(
            name: "NIOBackend",
            dependencies: [
                "ConnectionCore", "POSIXSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: strictSettings
        ),
        // zlib from the system (Debian's zlib1g-dev), for permessage-deflate.
        .systemLibrary(name: "CZlib", pkgConfig: "zlib", providers: [.apt(["zlib1g-dev"])]),
        // RFC 6455 frames, parser, encoder, masking, handshake, UTF-8 validation, state machine, and RFC 7692
        // permessage-deflate (zlib). No I/O.
        .target(name: "WebSocketCodec", dependencies: ["CZlib"], swiftSettings: strictSettings),
        // WebSocket over any backend's TCP connection.
        .target(
            name: "WebSocketTransport",
            dependencies: ["ConnectionCore", "WebSocketCodec"],
            swiftSettings: strictSettings
        ),
        // OpenSSL 3 from the system (Debian's libssl-dev), found with pkg-config, plus a header of one-line
        // wrappers for the calls that are macros.
        .systemLibrary(name: "COpenSSL", pkgConfig: "openssl", providers: [.apt(["libssl-dev"])]),
        // TLS over any backend's TCP connection (memory BIOs): tls://, and wss:// with WebSocketTransport.
        .target(
            name: "TLSTransport",
            dependencies: ["ConnectionCore", "COpenSSL"],
            swiftSettings: strictSettings
        ),
        // Umbrella: re-exports, the six socket backends' registrations, and TransportStack (tls, ws, wss per URL).
        .target(
            name: "SocketStyles",
            dependencies: [
                "ConnectionCore", "POSIXSupport", "BSDSocketBackend", "LibUVBackend", "RunLoopBackend", "AsyncBackend",
                "NIOBackend", "UringBackend", "WebSocketCodec", "WebSocketTransport", "TLSTransport",
            ],
            swiftSettings: strictSettings
        ),
        // Each backend written in its own style, without Connection (sockbench compare's native-SIZE): the price of
        // the unified API. nio's own style over tls and wss uses swift-nio-ssl, as a SwiftNIO user would.
        .target(
            name: "NativeStyles",
            dependencies: [
                "SocketStyles", "BenchmarkDriver", "POSIXSupport", "NIOBackend", "TLSTransport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            swiftSettings: strictSettings
        ),
        // Shipped test support: descriptor counting, time limits, echo servers, the in-memory backend, test
        // certificates.
        .target(
            name: "ConnectionTestKit", dependencies: ["SocketStyles", "POSIXSupport", "BenchmarkDriver"],
            swiftSettings: strictSettings),
        // Live lessons on TCP and UDP behaviour (sockbench lesson NAME).
        .target(
            name: "Lessons",
            dependencies: [
                "SocketStyles", "BenchmarkDriver", "POSIXSupport", "ConnectionTestKit",
                .product(name: "Histogram", package: "hdrhistogram-swift"),
            ],
            swiftSettings: strictSettings
        ),
        // The C floor: blocking C ping-pong and echo server, the reference every backend is compared with.
        .target(name: "CFloor"),
        // Measurement: HdrHistogram summaries, the runners (ping-pong, open loop, pump, fan-in, workload, loaded,
        // broadcast) and their verdicts. A library so tests can drive it.
        .target(
            name: "BenchmarkDriver",
            dependencies: [
                "ConnectionCore", "POSIXSupport",
                .product(name: "Histogram", package: "hdrhistogram-swift"),
            ],
            swiftSettings: strictSettings
        ),
        .executableTarget(
            name: "sockbench",
            dependencies: [
                "SocketStyles",
                "POSIXSupport",
                "ConnectionTestKit",
                "BenchmarkDriver",
                "CFloor",
                "Lessons",
                "NativeStyles",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Histogram", package: "hdrhistogram-swift"),
            ],
            swiftSettings: strictSettings
        ),
        // swift-log for the library's diagnostics (BoundsLog's lines), for servers that log with swift-log.
        .target(
            name: "SocketStylesLogging",
            dependencies: ["ConnectionCore", .product(name: "Logging", package: "swift-log")],
            swiftSettings: strictSettings),
        // OpenCombine publishers (messages, states, events, send results) for code ported from Combine.
        .target(
            name: "SocketStylesCombine",
            dependencies: ["SocketStyles", .product(name: "OpenCombine", package: "OpenCombine")],
            swiftSettings: strictSettings),
        // Opt-in Foundation conveniences (Data, URL) for code ported from Apple platforms.
        .target(
            name: "SocketStylesFoundation", dependencies: ["SocketStyles"], swiftSettings: strictSettings),
        .testTarget(
            name: "SocketStylesFoundationTests",
            dependencies: ["SocketStylesFoundation", "SocketStyles", "ConnectionTestKit"],
            swiftSettings: strictSettings),
        // Examples a user can copy: built with the package, run by scripts/examples (and CI).
        .executableTarget(
            name: "ChatClient", dependencies: ["SocketStyles"], path: "Examples/ChatClient",
            swiftSettings: strictSettings),
        .executableTarget(
            name: "RoutingServer", dependencies: ["SocketStyles"], path: "Examples/RoutingServer",
            swiftSettings: strictSettings),
        // The Apple APIs of the seeds, ported (docs/porting-from-apple.md), run by scripts/examples on every backend.
        .executableTarget(
            name: "WebSocketTaskPort", dependencies: ["SocketStyles"], path: "Examples/WebSocketTaskPort",
            swiftSettings: strictSettings),
        .executableTarget(
            name: "NWConnectionPort", dependencies: ["SocketStyles"], path: "Examples/NWConnectionPort",
            swiftSettings: strictSettings),
        .executableTarget(
            name: "CombinePort", dependencies: ["SocketStyles", "SocketStylesCombine"], path: "Examples/CombinePort",
            swiftSettings: strictSettings),
        .executableTarget(
            name: "StreamDelegatePort", dependencies: ["SocketStyles"], path: "Examples/StreamDelegatePort",
            swiftSettings: strictSettings),
        .executableTarget(
            name: "CFSocketServerPort", dependencies: ["SocketStyles"], path: "Examples/CFSocketServerPort",
            swiftSettings: strictSettings),
        .testTarget(
            name: "SocketStylesCombineTests",
            dependencies: [
                "SocketStylesCombine", "SocketStyles", "ConnectionTestKit",
                .product(name: "OpenCombine", package: "OpenCombine"),
            ],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "SocketStylesLoggingTests",
            dependencies: ["SocketStylesLogging", "ConnectionCore", .product(name: "Logging", package: "swift-log")],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "ConnectionCoreTests",
            dependencies: ["ConnectionCore"],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "BSDSocketBackendTests",
            dependencies: ["BSDSocketBackend", "POSIXSupport", "CSocketShims", "ConnectionTestKit"],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "LibUVBackendTests",
            dependencies: ["LibUVBackend", "POSIXSupport", "ConnectionTestKit"],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "AsyncBackendTests",
            dependencies: ["AsyncBackend", "POSIXSupport", "ConnectionTestKit"],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "UringBackendTests",
            dependencies: ["UringBackend", "POSIXSupport", "ConnectionTestKit"],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "RunLoopBackendTests",
            dependencies: ["RunLoopBackend", "BSDSocketBackend", "POSIXSupport", "ConnectionTestKit"],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "LessonTests",
            dependencies: ["Lessons", "SocketStyles", "POSIXSupport", "ConnectionTestKit", "BenchmarkDriver"],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "WebSocketCodecTests",
            dependencies: ["WebSocketCodec", "CZlib", "ConnectionCore"],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "DocSnippetTests",
            dependencies: [
                "SocketStyles", "SocketStylesCombine", "SocketStylesLogging", "ConnectionTestKit", "POSIXSupport",
                .product(name: "OpenCombine", package: "OpenCombine"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: strictSettings
        ),
        // sockbench's own parts (its scenarios' names and registration), through `@testable import`.
        .testTarget(
            name: "SockbenchTests", dependencies: ["sockbench", "BenchmarkDriver"], swiftSettings: strictSettings),
        .testTarget(
            name: "ConformanceTests",
            dependencies: ["SocketStyles", "POSIXSupport", "ConnectionTestKit", "BenchmarkDriver", "NativeStyles"],
            swiftSettings: strictSettings
        ),
    ],
    swiftLanguageModes: [.v6]
)

// `SOCKETSTYLES_TEST_TARGETS=A,B swift test ...` builds the test targets named and only what they depend on, so a
// run of a few suites in a build of its own (scripts/sanitize --tests, which CI uses for both sanitizers) does not
// compile every other target: SwiftPM builds every test target of a package before it runs any.
if let names = Context.environment["SOCKETSTYLES_TEST_TARGETS"] {
    var needed = Set(names.split(separator: ",").map(String.init))
    let unknown = needed.subtracting(package.targets.filter { $0.type == .test }.map(\.name))
    precondition(unknown.isEmpty, "SOCKETSTYLES_TEST_TARGETS names no test target: \(unknown.sorted())")
    var packages = Set<String>()
    var queue = Array(needed)
    while let name = queue.popLast() {
        for dependency in package.targets.first(where: { $0.name == name })?.dependencies ?? [] {
            switch dependency {
            case .targetItem(let target, _), .byNameItem(let target, _):
                if needed.insert(target).inserted { queue.append(target) }
            case .productItem(_, let owner, _, _):
                if let owner { packages.insert(owner) }
            @unknown default:
                break
            }
        }
    }
    package.targets.removeAll { !needed.contains($0.name) }
    package.products.removeAll { product in
        let targets = (product as? Product.Library)?.targets ?? (product as? Product.Executable)?.targets ?? []
        return !targets.allSatisfy(needed.contains)
    }
    package.dependencies.removeAll { dependency in
        guard case .sourceControl(_, let location, _) = dependency.kind else { return false }
        return !packages.contains(String(location.split(separator: "/").last ?? ""))
    }
}
