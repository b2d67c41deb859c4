import ArgumentParser
import SocketStyles

/// `--cert` and `--key` for servers of tls:// and wss://.
struct TLSServerOptions: ParsableArguments {
    @Option(help: "tls:// and wss:// servers: the certificate chain, PEM, leaf first.")
    var cert: String?

    @Option(help: "tls:// and wss:// servers: the private key of the certificate, PEM.")
    var key: String?

    /// The server configuration, `nil` for plain transports; a clear error when a secure one lacks files.
    func configuration(for transport: Transport) throws -> TLSConfiguration? {
        guard transport.isSecure else {
            if cert != nil || key != nil { throw fail("--cert and --key apply to tls:// and wss:// only") }
            return nil
        }
        guard let cert, let key else {
            throw fail(
                "\(transport):// needs --cert FILE and --key FILE (PEM); docs/tls.md shows how to make test ones")
        }
        return .server(certificateChainFile: cert, privateKeyFile: key)
    }
}

/// `--ca`, `--insecure` and `--server-name` for clients of tls:// and wss://.
struct TLSClientOptions: ParsableArguments {
    @Option(
        help: "tls:// and wss:// clients: trust only the CA certificates in this PEM file (default: the system store).")
    var ca: String?

    @Flag(help: "tls:// and wss:// clients: do NOT verify the server's certificate (tests and measurements only).")
    var insecure = false

    @Option(
        help:
            "tls:// and wss:// clients: the name to send as SNI and check in the certificate (default: the URL's host)."
    )
    var serverName: String?

    /// The client configuration: secure defaults changed by the flags.
    var configuration: TLSConfiguration {
        var tls = TLSConfiguration()
        if let ca { tls.trustRoots = .file(ca) }
        if insecure { tls.verification = .insecureNoVerification }
        tls.serverName = serverName
        return tls
    }
}
