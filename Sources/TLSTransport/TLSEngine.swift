internal import COpenSSL
import ConnectionCore
import Synchronization

/// One TLS session over memory BIOs, with no I/O of its own: ciphertext from the network is fed in, plaintext
/// comes out of ``read(maximumLength:)``; plaintext goes into ``encrypt(_:)`` and ciphertext comes out. This is
/// what lets the same TLS code run over a blocking socket, a libuv stream, a run-loop stream or an async socket.
///
/// An `SSL` object is not thread-safe; every call runs under one lock, and OpenSSL's thread-local error queue is
/// read on the same thread, inside the same lock, as the call that failed.
final class TLSEngine: Sendable {
    private struct Session: ~Copyable {
        let ssl: OpaquePointer
        /// Ciphertext from the peer, waiting for OpenSSL (owned by `ssl`).
        let input: OpaquePointer
        /// Ciphertext OpenSSL produced, waiting to be sent (owned by `ssl`).
        let output: OpaquePointer
        /// The TCP connection ended; the input BIO now reports end of file when empty.
        var inputEnded = false
        deinit { SSL_free(ssl) }
    }

    private let session: Guarded<Session>
    let role: TLSRole

    /// A session of `context`; a client names the host it expects (checked and sent as SNI per the
    /// configuration).
    init(context: TLSContext, host: String?) throws(ConnectionError) {
        role = context.role
        ERR_clear_error()
        guard let ssl = SSL_new(context.context) else { throw TLSErrors.failure("SSL_new") }
        guard let input = BIO_new(BIO_s_mem()), let output = BIO_new(BIO_s_mem()) else {
            SSL_free(ssl)
            throw TLSErrors.failure("BIO_new")
        }
        cssl_bio_set_mem_eof_return(input, -1)
        cssl_bio_set_mem_eof_return(output, -1)
        SSL_set_bio(ssl, input, output)
        let configuration = context.configuration
        if context.role == .client {
            SSL_set_connect_state(ssl)
            if let name = configuration.serverName ?? host, !name.isEmpty {
                // An IP literal is checked against IP subjectAltNames and never sent as SNI (RFC 6066 3).
                let isAddress = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name) == 1
                ERR_clear_error()
                if !isAddress {
                    guard cssl_set_sni(ssl, name) == 1 else {
                        SSL_free(ssl)
                        throw TLSErrors.failure("setting SNI to \(name)")
                    }
                }
                if configuration.verification == .full {
                    if isAddress {
                        // Set above.
                    } else {
                        SSL_set_hostflags(ssl, UInt32(X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS))
                        guard SSL_set1_host(ssl, name) == 1 else {
                            SSL_free(ssl)
                            throw TLSErrors.failure("setting the expected host name \(name)")
                        }
                    }
                } else if isAddress {
                    // Not checking names: undo the IP expectation.
                    X509_VERIFY_PARAM_set1_ip(SSL_get0_param(ssl), nil, 0)
                }
            }
        } else {
            SSL_set_accept_state(ssl)
        }
        session = Guarded(Session(ssl: ssl, input: input, output: output))
    }

    /// What a handshake step needs next.
    enum HandshakeStep {
        case done
        case needsInput
        case failed(ConnectionError)
    }

    /// Advances the handshake; the ciphertext to send (possibly empty) comes with the result.
    func handshake() -> (HandshakeStep, [UInt8]) {
        session.withLock { session in
            ERR_clear_error()
            let result = SSL_do_handshake(session.ssl)
            let step: HandshakeStep
            if result == 1 {
                step = .done
            } else {
                let code = SSL_get_error(session.ssl, result)
                if code == SSL_ERROR_WANT_READ && !session.inputEnded {
                    step = .needsInput
                } else {
                    step = .failed(Self.handshakeFailure(session, code: code))
                }
            }
            return (step, Self.drainOutput(session))
        }
    }

    private static func handshakeFailure(_ session: borrowing Session, code: Int32) -> ConnectionError {
        let verify = Int(SSL_get_verify_result(session.ssl))
        if verify != 0 /* X509_V_OK */ {
            _ = TLSErrors.drain()
            let reason = String(cString: X509_verify_cert_error_string(verify))
            return ConnectionError(
                .certificateRejected, "verifying the server's certificate: \(reason)",
                systemCode: .init(domain: "x509", code: Int32(verify), name: TLSErrors.verifyName(verify)))
        }
        if session.inputEnded || code == SSL_ERROR_WANT_READ {
            _ = TLSErrors.drain()
            return ConnectionError(
                .tls, "the peer closed the connection during the TLS handshake (does it speak TLS?)")
        }
        let error = TLSErrors.failure("TLS handshake failed")
        if error.systemCode == nil, code == SSL_ERROR_SYSCALL {
            return ConnectionError(.tls, "TLS handshake failed: the peer closed the connection")
        }
        return error
    }

    /// Ciphertext from the peer.
    func feed(_ bytes: [UInt8]) {
        guard !bytes.isEmpty else { return }
        session.withLock { session in
            bytes.withUnsafeBytes { buffer in
                var offset = 0
                while offset < buffer.count {
                    var written = 0
                    guard
                        BIO_write_ex(
                            session.input, buffer.baseAddress! + offset, buffer.count - offset, &written) == 1
                    else { break }
                    offset += written
                }
            }
        }
    }

    /// The TCP connection ended: once the buffered input is used up, OpenSSL sees end of file.
    func feedEnd() {
        session.withLock { session in
            session.inputEnded = true
            cssl_bio_set_mem_eof_return(session.input, 0)
        }
    }

    /// What a read gives.
    enum ReadResult {
        /// Plaintext (never empty).
        case data([UInt8])
        /// Nothing decrypted yet: feed more ciphertext.
        case needsInput
        /// The peer sent close_notify (or, when truncation is allowed, TCP ended): a clean end.
        case end
        case failed(ConnectionError)
    }

    /// The most plaintext one TLS record carries.
    private static let largestRecord = 16 * 1024

    /// Decrypts up to `maximumLength` bytes. `hasOutput` is `true` when OpenSSL queued ciphertext to send in
    /// reply (a TLS 1.3 KeyUpdate answer, for example).
    ///
    /// The array is made at the size of what can come out, not of `maximumLength` (a server's receive asks for
    /// 64 KiB and an echo brings 64 bytes): the plaintext OpenSSL holds, or else the ciphertext waiting in the
    /// input (plaintext is never longer), at most one record (16 KiB; a read returns one record at most).
    func read(maximumLength: Int) -> (result: ReadResult, hasOutput: Bool) {
        session.withLock { session in
            ERR_clear_error()
            var count = 0
            var status: Int32 = 0
            let held = Int(SSL_pending(session.ssl))
            let available = held > 0 ? held : min(cssl_bio_pending(session.input), Self.largestRecord)
            let bytes = [UInt8](unsafeUninitializedCapacity: max(min(maximumLength, available), 1)) {
                buffer, initialized in
                status = SSL_read_ex(session.ssl, buffer.baseAddress, buffer.count, &count)
                initialized = status == 1 ? count : 0
            }
            let hasOutput = cssl_bio_pending(session.output) > 0
            if status == 1 { return (.data(bytes), hasOutput) }
            let code = SSL_get_error(session.ssl, status)
            switch code {
            case SSL_ERROR_WANT_READ where !session.inputEnded:
                return (.needsInput, hasOutput)
            case SSL_ERROR_ZERO_RETURN:
                return (.end, hasOutput)
            default:
                if session.inputEnded {
                    _ = TLSErrors.drain()
                    return (
                        .failed(
                            ConnectionError(
                                .tls,
                                "the peer closed TCP without TLS close_notify: the data may be cut short "
                                    + "(TLSConfiguration.allowsTruncation accepts such an end)",
                                systemCode: .init(domain: "ssl", code: 0, name: "unexpected eof while reading"))),
                        hasOutput
                    )
                }
                return (.failed(TLSErrors.failure("TLS read failed")), hasOutput)
            }
        }
    }

    /// Encrypts `bytes` (at most a few records' worth at a time is best) and returns the ciphertext to send.
    func encrypt(_ bytes: ArraySlice<UInt8>) throws(ConnectionError) -> [UInt8] {
        let result: Result<[UInt8], ConnectionError> = bytes.withUnsafeBytes { buffer in
            Result { () throws(ConnectionError) in try encrypt(buffer) }
        }
        return try result.get()
    }

    /// Encrypts bytes the caller keeps; returns the records to send.
    func encrypt(_ bytes: UnsafeRawBufferPointer) throws(ConnectionError) -> [UInt8] {
        // Passed into the lock as an address: only read, and only while this call runs (the caller keeps the
        // bytes valid until it returns).
        let address = UInt(bitPattern: bytes.baseAddress)
        let count = bytes.count
        let result: Result<[UInt8], ConnectionError> = session.withLock { session in
            ERR_clear_error()
            var offset = 0
            while offset < count, let base = UnsafeRawPointer(bitPattern: address) {
                var written = 0
                let status = SSL_write_ex(session.ssl, base + offset, count - offset, &written)
                guard status == 1 else { return .failure(TLSErrors.failure("TLS write failed")) }
                offset += written
            }
            return .success(Self.drainOutput(session))
        }
        return try result.get()
    }

    /// Queues close_notify and returns the ciphertext to send.
    func shutdown() -> [UInt8] {
        session.withLock { session in
            ERR_clear_error()
            if SSL_is_init_finished(session.ssl) == 1 { _ = SSL_shutdown(session.ssl) }
            ERR_clear_error()
            return Self.drainOutput(session)
        }
    }

    /// Ciphertext waiting to be sent.
    func takeOutput() -> [UInt8] { session.withLock { Self.drainOutput($0) } }

    private static func drainOutput(_ session: borrowing Session) -> [UInt8] {
        let pending = cssl_bio_pending(session.output)
        guard pending > 0 else { return [] }
        return [UInt8](unsafeUninitializedCapacity: pending) { buffer, initialized in
            var read = 0
            initialized = BIO_read_ex(session.output, buffer.baseAddress, pending, &read) == 1 ? read : 0
        }
    }

    /// The negotiated protocol version, e.g. `TLSv1.3`.
    var version: String { session.withLock { String(cString: SSL_get_version($0.ssl)) } }
    /// The negotiated cipher suite, e.g. `TLS_AES_256_GCM_SHA384`.
    var cipher: String {
        session.withLock { session in
            guard let cipher = SSL_get_current_cipher(session.ssl) else { return "" }
            return String(cString: SSL_CIPHER_get_name(cipher))
        }
    }
}
