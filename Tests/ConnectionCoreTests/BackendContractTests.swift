import ConnectionCore
import Testing

/// What every `ConnectionBackend` shares through the protocol's extension.
@Suite("Backend contract")
struct BackendContractTests {
    /// A backend of tcp and udp that connects nowhere: only its name and transports matter here.
    struct Plain: ConnectionBackend {
        let name = "plain"
        let transports: Set<Transport> = [.udp, .tcp]

        func connect(
            to endpoint: Endpoint, options: ConnectionOptions
        ) async throws(ConnectionError)
            -> any Connection
        {
            try requireTransport(of: endpoint)
            throw ConnectionError(.refused, "nowhere")
        }

        func listen(on endpoint: Endpoint, options: ConnectionOptions) async throws(ConnectionError) -> any Listener {
            try requireTransport(of: endpoint)
            throw ConnectionError(.refused, "nowhere")
        }
    }

    @Test("A transport the backend does not provide itself is refused, with what it does provide")
    func requireTransport() throws {
        let backend = Plain()
        #expect(throws: Never.self) { try backend.requireTransport(of: try Endpoint(url: "tcp://127.0.0.1:1")) }
        #expect(throws: Never.self) { try backend.requireTransport(of: try Endpoint(url: "udp://127.0.0.1:1")) }
        for url in ["ws://127.0.0.1:1/", "wss://127.0.0.1:1/", "tls://127.0.0.1:1"] {
            let endpoint = try Endpoint(url: url)
            #expect {
                try backend.requireTransport(of: endpoint)
            } throws: { error in
                let error = error as? ConnectionError
                return error?.kind == .unsupported
                    && error?.detail
                        == "the plain backend provides tcp and udp; \(endpoint.transport) is layered on top"
            }
        }
    }
}
