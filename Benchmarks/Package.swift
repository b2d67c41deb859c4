// swift-tools-version: 6.1
import PackageDescription

// Micro-benchmarks of SocketStyles with ordo-one/benchmark: a package of its own, so that the library's users
// and its CI test run never build the benchmark tooling. Run from this directory:
//
//     swift package benchmark                     # every benchmark, every metric it declares
//     swift package benchmark thresholds check    # against the committed Thresholds/
//
// docs/benchmarks.md ("Micro-benchmarks") says what each one measures and how the thresholds were made.
let package = Package(
    name: "SocketStylesBenchmarks",
    platforms: [.macOS(.v13)],
    dependencies: [
        .package(name: "SocketStyles", path: ".."),
        // Only the malloc interposer (allocation counts); the runtime interposer is left out.
        .package(url: "https://github.com/ordo-one/benchmark", exact: "1.38.1", traits: ["MallocInterposer"]),
    ],
    targets: [
        // RFC 6455 frame encoding and parsing, masking, UTF-8 validation: pure code, no I/O.
        .executableTarget(
            name: "CodecBenchmarks",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "SocketStyles", package: "SocketStyles"),
            ],
            path: "Benchmarks/CodecBenchmarks",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
        // One 64-byte echo round trip through Connection per backend: allocations, context switches, time.
        .executableTarget(
            name: "EchoBenchmarks",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "SocketStyles", package: "SocketStyles"),
                .product(name: "ConnectionTestKit", package: "SocketStyles"),
            ],
            path: "Benchmarks/EchoBenchmarks",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
    ]
)
