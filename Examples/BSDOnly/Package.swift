// swift-tools-version: 6.1
import PackageDescription

// A program that uses one connection style and nothing else: the bsd backend with WebSocket on top. It depends
// on SocketStylesBSD and SocketStylesWebSocket only, so building it compiles neither SwiftNIO nor libuv's or
// OpenSSL's modules, and the binary links none of them (CI checks both).
let package = Package(
    name: "BSDOnly",
    dependencies: [.package(name: "SocketStyles", path: "../..")],
    targets: [
        .executableTarget(
            name: "BSDOnly",
            dependencies: [
                .product(name: "SocketStylesCore", package: "SocketStyles"),
                .product(name: "SocketStylesBSD", package: "SocketStyles"),
                .product(name: "SocketStylesWebSocket", package: "SocketStyles"),
            ],
            swiftSettings: [.swiftLanguageMode(.v6)]
        )
    ]
)
