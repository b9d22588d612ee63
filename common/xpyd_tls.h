/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_tls.h - TLS for the router and the simulator, on OpenSSL: a server context whose certificate and key
 * can be replaced while connections run (SIGHUP), optional client certificates (mutual TLS), ALPN http/1.1,
 * session resumption; and a client context for https:// upstreams (verification, SNI, client certificates).
 * The libevent side (bufferevent_openssl) is the callers'; this file only builds contexts and connections. */
#ifndef XPYD_TLS_H
#define XPYD_TLS_H

#include <openssl/ssl.h>
#include <stddef.h>

struct xpyd_tls_server_opts {
    const char *cert;      /* PEM: the certificate, then its chain */
    const char *key;       /* PEM private key */
    const char *client_ca; /* PEM CA bundle: clients must present a certificate it signed; NULL or "": none asked */
    int min_version;       /* TLS1_2_VERSION or TLS1_3_VERSION */
};

/* A server context: certificate and key loaded (and checked to match), the minimum version, ALPN http/1.1,
 * a session cache and tickets, and with client_ca mutual TLS (a client without a valid certificate is refused
 * in the handshake). NULL with err set. */
SSL_CTX *xpyd_tls_server_new(const struct xpyd_tls_server_opts *o, char *err, size_t errcap);
/* Loads the certificate and key files again (their paths as given at creation): handshakes from now on use
 * the new pair, connections already open keep theirs. 0, or -1 with err set (the old pair stays in use). */
int xpyd_tls_server_reload(SSL_CTX *ctx, char *err, size_t errcap);
void xpyd_tls_server_free(SSL_CTX *ctx);

struct xpyd_tls_client_opts {
    const char *ca;        /* PEM CA bundle the servers are verified against; NULL or "": the system store */
    const char *cert, *key; /* client certificate for mutual TLS; NULL or "": none */
    int min_version;
};

/* A client context (peer verification on). NULL with err set. Without a CA of its own, the system store is read
 * at its first connection (xpyd_tls_client_ssl), not here: a process that never connects over TLS never reads it. */
SSL_CTX *xpyd_tls_client_new(const struct xpyd_tls_client_opts *o, char *err, size_t errcap);
/* A connection to host: SNI when host is a name, the certificate verified against host (name or IP), and
 * `resume` (may be NULL) offered for resumption. NULL on OOM, or when the system store cannot be read. */
SSL *xpyd_tls_client_ssl(SSL_CTX *ctx, const char *host, SSL_SESSION *resume);
/* Where a client context stores the sessions it gets: slot (an SSL_SESSION * the caller owns, freed with
 * SSL_SESSION_free) receives each new session of ssl, replacing the previous one. */
void xpyd_tls_client_session_slot(SSL *ssl, SSL_SESSION **slot);

/* Replaces ssl's socket BIO (OpenSSL's, on read(2)/write(2)) by one on recv(2)/send(2) with the same
 * descriptor. 0, or -1 (ssl has no descriptor, or OOM): ssl unchanged. */
int xpyd_tls_use_send(SSL *ssl);
/* "1.2" / "1.3" -> TLS1_2_VERSION / TLS1_3_VERSION; -1 otherwise. */
int xpyd_tls_version(const char *s);
/* The OpenSSL error queue of this thread, oldest error first, as one line; the queue is cleared. */
const char *xpyd_tls_errors(char *buf, size_t cap);
/* 1 when an OpenSSL error code says the peer spoke plain HTTP to a TLS port. */
int xpyd_tls_is_plain_http(unsigned long err);

#endif
