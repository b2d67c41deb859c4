// System OpenSSL 3 (Debian's libssl-dev), plus the few calls that are macros in its headers and so cannot be
// imported into Swift. Every helper is a one-line static inline wrapper; symbols are prefixed cssl_.
#ifndef SOCKETSTYLES_COPENSSL_SHIM_H
#define SOCKETSTYLES_COPENSSL_SHIM_H

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

/// SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) or TLS1_3_VERSION.
static inline int cssl_ctx_set_min_version(SSL_CTX *ctx, int tls13) {
    return (int)SSL_CTX_set_min_proto_version(ctx, tls13 ? TLS1_3_VERSION : TLS1_2_VERSION);
}

/// Options every context gets: no renegotiation, no compression; and, when asked, a TCP end without
/// close_notify read as a clean end instead of an error.
static inline void cssl_ctx_set_options(SSL_CTX *ctx, int ignore_unexpected_eof) {
    uint64_t options = SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION;
    if (ignore_unexpected_eof) options |= SSL_OP_IGNORE_UNEXPECTED_EOF;
    SSL_CTX_set_options(ctx, options);
}

/// SNI: SSL_set_tlsext_host_name.
static inline int cssl_set_sni(SSL *ssl, const char *name) { return (int)SSL_set_tlsext_host_name(ssl, name); }

/// BIO_pending on a memory BIO: bytes waiting to be read from it.
static inline size_t cssl_bio_pending(BIO *bio) { return BIO_ctrl_pending(bio); }

/// BIO_set_mem_eof_return: -1 makes an empty memory BIO mean "retry later"; 0 makes it mean end of file (the
/// TCP connection under it ended).
static inline void cssl_bio_set_mem_eof_return(BIO *bio, int value) { (void)BIO_set_mem_eof_return(bio, value); }

/// TLS1_2_VERSION and TLS1_3_VERSION, for reporting the negotiated version.
static inline int cssl_tls12_version(void) { return TLS1_2_VERSION; }
static inline int cssl_tls13_version(void) { return TLS1_3_VERSION; }

#endif
