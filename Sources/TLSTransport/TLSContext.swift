internal import COpenSSL
import ConnectionCore
internal import Glibc
import Synchronization

/// The TLS library in use, for reports ("OpenSSL 3.0.19 27 Jan 2026").
public enum TLSLibrary {
    /// OpenSSL's version string.
    public static var version: String { String(cString: OpenSSL_version(0)) }
}

/// Which side of the handshake.
public enum TLSRole: Sendable, Hashable {
    case client
    case server
}

/// One OpenSSL `SSL_CTX`: trust store, certificate and key, versions and options, shared by every connection
/// made with the same configuration (loading the system trust store takes milliseconds; doing it per
/// connection would dominate the handshake). `SSL_CTX` is safe to share between threads once set up.
final class TLSContext: @unchecked Sendable {
    let context: OpaquePointer
    let role: TLSRole
    let configuration: TLSConfiguration

    private struct Key: Hashable {
        var role: TLSRole
        var configuration: TLSConfiguration
    }
    private static let cache = Guarded<[Key: TLSContext]>([:])

    /// The context for `configuration` in `role`, made once.
    static func shared(_ role: TLSRole, _ configuration: TLSConfiguration) throws(ConnectionError) -> TLSContext {
        let key = Key(role: role, configuration: configuration)
        if let context = cache.withLock({ $0[key] }) { return context }
        let context = try TLSContext(role: role, configuration: configuration)
        return cache.withLock { cache in
            if let existing = cache[key] { return existing }
            cache[key] = context
            return context
        }
    }

    private init(role: TLSRole, configuration: TLSConfiguration) throws(ConnectionError) {
        ERR_clear_error()
        guard let context = SSL_CTX_new(role == .client ? TLS_client_method() : TLS_server_method()) else {
            throw TLSErrors.failure("SSL_CTX_new")
        }
        self.context = context
        self.role = role
        self.configuration = configuration
        guard cssl_ctx_set_min_version(context, configuration.minimumVersion == .tls13 ? 1 : 0) == 1 else {
            throw TLSErrors.failure("setting the minimum TLS version")
        }
        cssl_ctx_set_options(context, configuration.allowsTruncation ? 1 : 0)
        if role == .client {
            if configuration.verification != .insecureNoVerification {
                SSL_CTX_set_verify(context, SSL_VERIFY_PEER, nil)
                switch configuration.trustRoots {
                case .system:
                    guard SSL_CTX_set_default_verify_paths(context) == 1 else {
                        throw TLSErrors.failure("loading the system trust store")
                    }
                case .file(let path):
                    try TLSErrors.checkReadable(path, "the CA file")
                    guard SSL_CTX_load_verify_locations(context, path, nil) == 1 else {
                        throw TLSErrors.failure("loading trusted certificates from \(path)")
                    }
                }
            } else {
                SSL_CTX_set_verify(context, SSL_VERIFY_NONE, nil)
            }
        }
        switch (configuration.certificateChainFile, configuration.privateKeyFile) {
        case (let chain?, let key?):
            try TLSErrors.checkReadable(chain, "the certificate chain")
            try TLSErrors.checkReadable(key, "the private key")
            guard SSL_CTX_use_certificate_chain_file(context, chain) == 1 else {
                throw TLSErrors.failure("loading the certificate chain from \(chain)")
            }
            guard SSL_CTX_use_PrivateKey_file(context, key, SSL_FILETYPE_PEM) == 1 else {
                throw TLSErrors.failure("loading the private key from \(key)")
            }
            guard SSL_CTX_check_private_key(context) == 1 else {
                throw TLSErrors.failure("the private key in \(key) does not match the certificate in \(chain)")
            }
        case (nil, nil):
            if role == .server {
                throw ConnectionError(
                    .tls, "a TLS server needs a certificate chain and a private key (PEM files; --cert and --key)")
            }
        default:
            throw ConnectionError(.tls, "a certificate chain and a private key go together; only one was given")
        }
    }

    deinit { SSL_CTX_free(context) }
}

/// OpenSSL's thread-local error queue, read into ``ConnectionError``s.
enum TLSErrors {
    /// A file OpenSSL is about to read must be readable: otherwise OpenSSL's own report is a bare system-library
    /// code ("error 2147483650; system lib"), where the user needs the path and the reason.
    static func checkReadable(_ path: String, _ what: String) throws(ConnectionError) {
        guard access(path, R_OK) == 0 else {
            let reason = String(cString: strerror(errno))
            throw ConnectionError(.tls, "cannot read \(what) \(path): \(reason)")
        }
    }

    /// The oldest error in the queue (the cause), with every message joined; the queue is emptied.
    static func drain() -> (code: UInt, reasons: [String]) {
        var first: UInt = 0
        var reasons: [String] = []
        while true {
            let code = ERR_get_error()
            if code == 0 { break }
            if first == 0 { first = code }
            if let reason = ERR_reason_error_string(code) {
                reasons.append(String(cString: reason))
            } else {
                reasons.append("error \(code)")
            }
        }
        return (first, reasons)
    }

    /// A `.tls` error for a failed call, with OpenSSL's reasons.
    static func failure(_ doing: String) -> ConnectionError {
        let (code, reasons) = drain()
        let reason = reasons.first ?? "unknown OpenSSL error"
        return ConnectionError(
            .tls, "\(doing): \(reasons.joined(separator: "; "))",
            systemCode: code == 0 ? nil : .init(domain: "ssl", code: Int32(truncatingIfNeeded: code), name: reason))
    }

    /// The name of an X509_V_ERR_* code, for the ones a user meets.
    static func verifyName(_ code: Int) -> String {
        switch code {
        case 2: "X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT"
        case 9: "X509_V_ERR_CERT_NOT_YET_VALID"
        case 10: "X509_V_ERR_CERT_HAS_EXPIRED"
        case 18: "X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT"
        case 19: "X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN"
        case 20: "X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY"
        case 21: "X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE"
        case 23: "X509_V_ERR_CERT_REVOKED"
        case 62: "X509_V_ERR_HOSTNAME_MISMATCH"
        case 64: "X509_V_ERR_IP_ADDRESS_MISMATCH"
        default: "X509_V_ERR_\(code)"
        }
    }
}
