import ConnectionCore
import NIOBackend
import NIOCore
import NIOSSL
import TLSTransport

/// swift-nio-ssl (BoringSSL inside SwiftNIO's pipeline) for the nio backend's own style over tls:// and wss://:
/// what a SwiftNIO user would put in front of the handlers, rather than our OpenSSL layer (TLSTransport), which
/// the unified `nio` backend uses like every other backend. Our ``TLSTransport/TLSConfiguration`` is mapped onto
/// swift-nio-ssl's, so `compare` and `sockbench serve --native` configure both the same way.
enum NIOSSLNative {
    /// A client handler for `endpoint`: trust roots, verification and the name to check as `tls` says. An IP
    /// address is checked against the certificate's IP subjectAltNames and never sent as SNI (RFC 6066).
    static func clientHandler(
        for endpoint: Endpoint, tls: TLSTransport.TLSConfiguration
    ) throws(ConnectionError) -> NIOSSLClientHandler {
        var configuration = NIOSSL.TLSConfiguration.makeClientConfiguration()
        configuration.minimumTLSVersion = minimumVersion(tls)
        switch tls.trustRoots {
        case .system: configuration.trustRoots = .default
        case .file(let path): configuration.trustRoots = .file(path)
        }
        switch tls.verification {
        case .full: configuration.certificateVerification = .fullVerification
        case .skipHostnameCheck: configuration.certificateVerification = .noHostnameVerification
        case .insecureNoVerification: configuration.certificateVerification = .none
        }
        let sniName: String?
        if let name = tls.serverName {
            sniName = name
        } else if case .name(let name) = endpoint.host {
            sniName = name
        } else {
            sniName = nil
        }
        do {
            let context = try NIOSSLContext(configuration: configuration)
            return try NIOSSLClientHandler(context: context, serverHostname: sniName)
        } catch {
            throw ConnectionError(.tls, "swift-nio-ssl client for \(endpoint): \(error)")
        }
    }

    /// A server context presenting the chain and key that `tls` names (PEM files).
    static func serverContext(_ tls: TLSTransport.TLSConfiguration) throws(ConnectionError) -> NIOSSLContext {
        guard let chain = tls.certificateChainFile, let key = tls.privateKeyFile else {
            throw ConnectionError(.tls, "a TLS server needs a certificate chain and a private key")
        }
        do {
            let certificates = try NIOSSLCertificate.fromPEMFile(chain).map { NIOSSLCertificateSource.certificate($0) }
            var configuration = NIOSSL.TLSConfiguration.makeServerConfiguration(
                certificateChain: certificates, privateKey: .privateKey(try NIOSSLPrivateKey(file: key, format: .pem)))
            configuration.minimumTLSVersion = minimumVersion(tls)
            return try NIOSSLContext(configuration: configuration)
        } catch {
            throw ConnectionError(.tls, "swift-nio-ssl server with \(chain) and \(key): \(error)")
        }
    }

    /// Our lowest accepted version as swift-nio-ssl's.
    private static func minimumVersion(_ tls: TLSTransport.TLSConfiguration) -> TLSVersion {
        tls.minimumVersion == .tls13 ? .tlsv13 : .tlsv12
    }

    /// A pipeline error as a ``ConnectionError``: swift-nio-ssl's as `.certificateRejected` (the peer's
    /// certificate failed verification) or `.tls`, anything else as the nio backend maps it.
    static func error(_ error: any Error, _ doing: String) -> ConnectionError {
        switch error {
        case is NIOSSLError, is BoringSSLError, is NIOSSLExtraError:
            let text = String(describing: error)
            let kind: ConnectionError.Kind = text.contains("CERTIFICATE_VERIFY_FAILED") ? .certificateRejected : .tls
            return ConnectionError(kind, "\(doing): swift-nio-ssl: \(text)")
        default:
            return connectionError(error, doing)
        }
    }
}
