public import ConnectionCore

/// How a TLS connection or listener is set up. The defaults are the secure ones: a client verifies the server's
/// certificate chain against the system trust store and checks that it names the host it dialled, sends SNI, and
/// speaks TLS 1.2 or 1.3 only.
///
/// ```swift
/// // client, trusting a private CA as well as nothing else
/// var tls = TLSConfiguration()
/// tls.trustRoots = .file("ca.pem")
/// // server
/// let server = TLSConfiguration.server(certificateChainFile: "cert.pem", privateKeyFile: "key.pem")
/// ```
public struct TLSConfiguration: Sendable, Hashable {
    /// The lowest protocol version accepted.
    public enum Version: String, Sendable, Hashable, CaseIterable {
        /// TLS 1.2 (RFC 5246) and 1.3.
        case tls12 = "TLSv1.2"
        /// TLS 1.3 (RFC 8446) only.
        case tls13 = "TLSv1.3"
    }

    /// How much of the peer's certificate a client checks.
    public enum CertificateVerification: String, Sendable, Hashable {
        /// The chain leads to a trusted root, is within its dates, and names the host (DNS name or IP address
        /// in subjectAltName). The default.
        case full
        /// The chain is checked; the name is not. For servers reached by an address their certificate does not
        /// carry.
        case skipHostnameCheck
        /// **Nothing is checked**: any certificate, from anyone, is accepted. Encrypts against passive
        /// listeners only. For tests and measurements, never for real traffic (`sockbench --insecure`).
        case insecureNoVerification
    }

    /// Where trusted root certificates come from.
    public enum TrustRoots: Sendable, Hashable {
        /// The system store (Debian: /etc/ssl/certs, from the ca-certificates package).
        case system
        /// Only the certificates in this PEM file (a private CA, a self-signed test certificate).
        case file(String)
    }

    /// Certificate verification for clients. Default ``CertificateVerification/full``.
    public var verification: CertificateVerification = .full
    /// The roots a client trusts. Default ``TrustRoots/system``.
    public var trustRoots: TrustRoots = .system
    /// The name sent in SNI and checked against the certificate; `nil` (the default) uses the URL's host.
    /// SNI is not sent for IP addresses (RFC 6066), whose certificates must carry them as IP subjectAltNames.
    public var serverName: String? = nil
    /// The lowest version accepted. Default TLS 1.2.
    public var minimumVersion: Version = .tls12
    /// PEM file with the certificate chain (leaf first). Required for servers.
    public var certificateChainFile: String? = nil
    /// PEM file with the private key of the leaf certificate. Required for servers.
    public var privateKeyFile: String? = nil
    /// Reads a TCP end that comes without the peer's TLS close_notify as a clean end. Default `false`: such an
    /// end is reported as a `.tls` error, since an attacker who can reset TCP could otherwise cut the data short
    /// unnoticed (a truncation attack).
    public var allowsTruncation: Bool = false
    /// How long the TLS handshake may take (after TCP connected) before failing with `.timedOut`.
    public var handshakeTimeout: Duration = .seconds(10)
    /// The clock ``handshakeTimeout`` runs on: the system's by default; a test gives a clock it advances by hand
    /// (ConnectionTestKit's `ManualClock`) to reach the deadline without waiting for it.
    public var clock: DeadlineClock = .continuous

    /// The secure client defaults.
    public init() {}

    /// A server presenting the chain in `certificateChainFile` with the key in `privateKeyFile`.
    public static func server(certificateChainFile: String, privateKeyFile: String) -> TLSConfiguration {
        var configuration = TLSConfiguration()
        configuration.certificateChainFile = certificateChainFile
        configuration.privateKeyFile = privateKeyFile
        return configuration
    }
}
