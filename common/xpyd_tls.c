/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_tls.c - see xpyd_tls.h. The server's certificate is not the context's own: every handshake takes the
 * current pair from the context's ex_data (the certificate callback installs it on the connection), so a
 * reload swaps a pointer under a mutex and never touches a context other threads are handshaking with. */
#include "xpyd_tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The certificate in use and the files it came from. */
struct cert_pair {
    X509 *cert;
    STACK_OF(X509) *chain;
    EVP_PKEY *key;
};

struct server_state {
    pthread_mutex_t mu;
    struct cert_pair cur;
    char cert_path[4096], key_path[4096];
};

/* A client context verifying against the system store: the store is read at its first connection, not when
 * the context is made (its ~140 certificates take 56 ms of CPU, at every start of a router that may never meet
 * an https engine). */
struct system_store {
    pthread_mutex_t mu;
    atomic_int state; /* 0: not read yet, 1: read, -1: reading it failed */
};

static int state_idx = -1, slot_idx = -1, store_idx = -1;
static pthread_once_t idx_once = PTHREAD_ONCE_INIT;

static void state_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl, void *argp);
static void store_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl, void *argp);

static void make_indexes(void)
{
    state_idx = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, state_free);
    store_idx = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, store_free);
    slot_idx = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
}

const char *xpyd_tls_errors(char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    unsigned long e;
    while ((e = ERR_get_error()) != 0) {
        char one[256];
        ERR_error_string_n(e, one, sizeof one);
        /* the reason is the last ':'-separated field of OpenSSL's "error:CODE:lib:func:reason" */
        const char *r = strrchr(one, ':');
        int w = snprintf(buf + n, cap - n, "%s%s", n ? "; " : "", r ? r + 1 : one);
        if (w < 0 || (size_t)w >= cap - n)
            break;
        n += (size_t)w;
    }
    if (!buf[0])
        snprintf(buf, cap, "%s", "unknown TLS error");
    return buf;
}

int xpyd_tls_is_plain_http(unsigned long err)
{
    return ERR_GET_LIB(err) == ERR_LIB_SSL &&
           (ERR_GET_REASON(err) == SSL_R_HTTP_REQUEST || ERR_GET_REASON(err) == SSL_R_HTTPS_PROXY_REQUEST);
}

int xpyd_tls_version(const char *s)
{
    if (!strcmp(s, "1.2"))
        return TLS1_2_VERSION;
    if (!strcmp(s, "1.3"))
        return TLS1_3_VERSION;
    return -1;
}

static void pair_free(struct cert_pair *p)
{
    X509_free(p->cert);
    sk_X509_pop_free(p->chain, X509_free);
    EVP_PKEY_free(p->key);
    memset(p, 0, sizeof *p);
}

/* Reads a PEM certificate (then its chain) and key, and checks they belong together. */
static int pair_load(const char *cert, const char *key, struct cert_pair *out, char *err, size_t errcap)
{
    char why[512];
    memset(out, 0, sizeof *out);
    FILE *f = fopen(cert, "r");
    if (!f) {
        snprintf(err, errcap, "cannot open the certificate %s: %s", cert, strerror(errno));
        return -1;
    }
    ERR_clear_error();
    out->cert = PEM_read_X509(f, NULL, NULL, NULL);
    out->chain = sk_X509_new_null();
    X509 *x;
    while (out->cert && out->chain && (x = PEM_read_X509(f, NULL, NULL, NULL)) != NULL)
        sk_X509_push(out->chain, x);
    /* The file's end reads as "no start line"; any other error is a chain certificate that is not whole (a
     * half-written file during a renewal): refused, as OpenSSL's own chain loader refuses it, so the pair in
     * use stays rather than a leaf served without its chain. */
    unsigned long last = ERR_peek_last_error();
    int chain_ok = !last || (ERR_GET_LIB(last) == ERR_LIB_PEM && ERR_GET_REASON(last) == PEM_R_NO_START_LINE);
    if (out->cert && !chain_ok) {
        snprintf(err, errcap, "a certificate of the chain in %s cannot be read (%s): the file is not whole", cert,
                 xpyd_tls_errors(why, sizeof why));
        fclose(f);
        pair_free(out);
        return -1;
    }
    ERR_clear_error();
    fclose(f);
    if (!out->cert) {
        snprintf(err, errcap, "no PEM certificate in %s", cert);
        pair_free(out);
        return -1;
    }
    f = fopen(key, "r");
    if (!f) {
        snprintf(err, errcap, "cannot open the key %s: %s", key, strerror(errno));
        pair_free(out);
        return -1;
    }
    out->key = PEM_read_PrivateKey(f, NULL, NULL, NULL);
    fclose(f);
    if (!out->key) {
        snprintf(err, errcap, "no PEM private key in %s: %s", key, xpyd_tls_errors(why, sizeof why));
        pair_free(out);
        return -1;
    }
    if (X509_check_private_key(out->cert, out->key) != 1) {
        snprintf(err, errcap, "the key %s does not match the certificate %s", key, cert);
        ERR_clear_error();
        pair_free(out);
        return -1;
    }
    return 0;
}

static void state_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl, void *argp)
{
    struct server_state *st = ptr;
    if (!st)
        return;
    pair_free(&st->cur);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

static void store_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl, void *argp)
{
    struct system_store *st = ptr;
    if (!st)
        return;
    pthread_mutex_destroy(&st->mu);
    free(st);
}

/* The system store into ctx, once, before its first connection (every client connection is made by
 * xpyd_tls_client_ssl, so none verifies against a store half read). 0, or -1 (it cannot be read). */
static int system_store_read(SSL_CTX *ctx)
{
    struct system_store *st = SSL_CTX_get_ex_data(ctx, store_idx);
    if (!st) /* a CA file of its own: read when the context was made */
        return 0;
    int v = atomic_load(&st->state);
    if (!v) {
        pthread_mutex_lock(&st->mu);
        v = atomic_load(&st->state);
        if (!v) {
            v = SSL_CTX_set_default_verify_paths(ctx) == 1 ? 1 : -1;
            atomic_store(&st->state, v);
        }
        pthread_mutex_unlock(&st->mu);
    }
    return v > 0 ? 0 : -1;
}

/* Every handshake: the current pair onto the connection (the SSL holds its own references). */
static int cert_cb(SSL *ssl, void *arg)
{
    struct server_state *st = arg;
    pthread_mutex_lock(&st->mu);
    int ok = SSL_use_cert_and_key(ssl, st->cur.cert, st->cur.key, st->cur.chain, 1);
    pthread_mutex_unlock(&st->mu);
    return ok == 1 ? 1 : 0;
}

/* ALPN: http/1.1 when the client offers it; a client offering only other protocols gets no ALPN answer (and
 * may go on with HTTP/1.1 or give up, its choice). */
static int alpn_cb(SSL *ssl, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
                   unsigned int inlen, void *arg)
{
    for (unsigned int i = 0; i < inlen;) {
        unsigned int n = in[i];
        if (i + 1 + n > inlen)
            break;
        if (n == 8 && memcmp(in + i + 1, "http/1.1", 8) == 0) {
            *out = in + i + 1;
            *outlen = 8;
            return SSL_TLSEXT_ERR_OK;
        }
        i += 1 + n;
    }
    return SSL_TLSEXT_ERR_NOACK;
}

SSL_CTX *xpyd_tls_server_new(const struct xpyd_tls_server_opts *o, char *err, size_t errcap)
{
    char why[512];
    pthread_once(&idx_once, make_indexes);
    struct server_state *st = calloc(1, sizeof *st);
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!st || !ctx) {
        snprintf(err, errcap, "out of memory");
        free(st);
        SSL_CTX_free(ctx);
        return NULL;
    }
    pthread_mutex_init(&st->mu, NULL);
    snprintf(st->cert_path, sizeof st->cert_path, "%s", o->cert);
    snprintf(st->key_path, sizeof st->key_path, "%s", o->key);
    SSL_CTX_set_ex_data(ctx, state_idx, st); /* freed with the context */
    if (pair_load(o->cert, o->key, &st->cur, err, errcap) != 0) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, o->min_version ? o->min_version : TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS); /* idle keep-alive connections give their buffers back */
    SSL_CTX_set_cert_cb(ctx, cert_cb, st);
    SSL_CTX_set_alpn_select_cb(ctx, alpn_cb, NULL);
    /* resumption: a session cache (ids) and tickets (TLS 1.2 and 1.3); the id context ties sessions to us */
    SSL_CTX_set_session_id_context(ctx, (const unsigned char *)"xpyd", 4);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_SERVER);
    SSL_CTX_sess_set_cache_size(ctx, 20480);
    if (o->client_ca && o->client_ca[0]) {
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(o->client_ca);
        if (!names || SSL_CTX_load_verify_locations(ctx, o->client_ca, NULL) != 1) {
            snprintf(err, errcap, "cannot load the client CA %s: %s", o->client_ca, xpyd_tls_errors(why, sizeof why));
            sk_X509_NAME_pop_free(names, X509_NAME_free);
            SSL_CTX_free(ctx);
            return NULL;
        }
        SSL_CTX_set_client_CA_list(ctx, names);
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    }
    return ctx;
}

int xpyd_tls_server_reload(SSL_CTX *ctx, char *err, size_t errcap)
{
    struct server_state *st = SSL_CTX_get_ex_data(ctx, state_idx);
    struct cert_pair next, old;
    if (!st || pair_load(st->cert_path, st->key_path, &next, err, errcap) != 0)
        return -1;
    pthread_mutex_lock(&st->mu);
    old = st->cur;
    st->cur = next;
    pthread_mutex_unlock(&st->mu);
    pair_free(&old); /* connections that took it hold their own references */
    return 0;
}

void xpyd_tls_server_free(SSL_CTX *ctx)
{
    SSL_CTX_free(ctx);
}

static int new_session_cb(SSL *ssl, SSL_SESSION *sess)
{
    SSL_SESSION **slot = SSL_get_ex_data(ssl, slot_idx);
    if (!slot)
        return 0; /* not kept: OpenSSL frees it */
    SSL_SESSION_free(*slot);
    *slot = sess;
    return 1; /* the slot owns the reference */
}

SSL_CTX *xpyd_tls_client_new(const struct xpyd_tls_client_opts *o, char *err, size_t errcap)
{
    char why[512];
    pthread_once(&idx_once, make_indexes);
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        snprintf(err, errcap, "out of memory");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, o->min_version ? o->min_version : TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (o->ca && o->ca[0]) {
        if (SSL_CTX_load_verify_locations(ctx, o->ca, NULL) != 1) {
            snprintf(err, errcap, "cannot load the CA %s: %s", o->ca, xpyd_tls_errors(why, sizeof why));
            SSL_CTX_free(ctx);
            return NULL;
        }
    } else { /* the system store: read at the first connection (system_store_read) */
        struct system_store *st = calloc(1, sizeof *st);
        if (!st || SSL_CTX_set_ex_data(ctx, store_idx, st) != 1) {
            free(st);
            snprintf(err, errcap, "out of memory");
            SSL_CTX_free(ctx);
            return NULL;
        }
        pthread_mutex_init(&st->mu, NULL);
    }
    if (o->cert && o->cert[0]) {
        if (SSL_CTX_use_certificate_chain_file(ctx, o->cert) != 1 ||
            SSL_CTX_use_PrivateKey_file(ctx, o->key && o->key[0] ? o->key : o->cert, SSL_FILETYPE_PEM) != 1 ||
            SSL_CTX_check_private_key(ctx) != 1) {
            snprintf(err, errcap, "cannot use the client certificate %s: %s", o->cert, xpyd_tls_errors(why, sizeof why));
            SSL_CTX_free(ctx);
            return NULL;
        }
    }
    static const unsigned char alpn[] = "\x08http/1.1";
    SSL_CTX_set_alpn_protos(ctx, alpn, sizeof alpn - 1);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(ctx, new_session_cb);
    return ctx;
}

SSL *xpyd_tls_client_ssl(SSL_CTX *ctx, const char *host, SSL_SESSION *resume)
{
    if (!host || !*host) /* an empty name would turn the certificate's name check off */
        return NULL;
    if (system_store_read(ctx) != 0)
        return NULL;
    SSL *ssl = SSL_new(ctx);
    if (!ssl)
        return NULL;
    unsigned char bin[16];
    int is_ip = inet_pton(AF_INET, host, bin) == 1 || inet_pton(AF_INET6, host, bin) == 1;
    int checked = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host)
                        : SSL_set_tlsext_host_name(ssl, host) && SSL_set1_host(ssl, host); /* SNI only for names */
    if (checked != 1) { /* no connection without the peer's name checked */
        SSL_free(ssl);
        return NULL;
    }
    if (resume)
        SSL_set_session(ssl, resume);
    return ssl;
}

void xpyd_tls_client_session_slot(SSL *ssl, SSL_SESSION **slot)
{
    SSL_set_ex_data(ssl, slot_idx, slot);
}

/* The socket BIO of xpyd_tls_use_send: OpenSSL's own calls write(2)/read(2), which go through the file layer
 * (vfs_write, the file position lock, sock_write_iter) before reaching the socket; send(2)/recv(2) go to it
 * directly. What is a retry and what an error is decided as OpenSSL's does (BIO_sock_should_retry). */
struct sock_bio {
    int fd;
    int eof;
    int close_on_free;
};

static int sbio_write(BIO *b, const char *buf, size_t n, size_t *done)
{
    struct sock_bio *s = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    ssize_t w = send(s->fd, buf, n, MSG_NOSIGNAL);
    if (w < 0) {
        if (BIO_sock_should_retry(-1))
            BIO_set_retry_write(b);
        *done = 0;
        return 0;
    }
    *done = (size_t)w;
    return 1;
}

static int sbio_read(BIO *b, char *buf, size_t n, size_t *done)
{
    struct sock_bio *s = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    *done = 0;
    if (!buf)
        return 0;
    ssize_t r = recv(s->fd, buf, n, 0);
    if (r < 0) {
        if (BIO_sock_should_retry(-1))
            BIO_set_retry_read(b);
        return 0;
    }
    if (r == 0) {
        s->eof = 1;
        return 0;
    }
    *done = (size_t)r;
    return 1;
}

static long sbio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    struct sock_bio *s = BIO_get_data(b);
    switch (cmd) {
    case BIO_C_SET_FD:
        s->fd = *(int *)ptr;
        s->close_on_free = (int)num;
        s->eof = 0;
        BIO_set_init(b, 1);
        return 1;
    case BIO_C_GET_FD:
        if (!BIO_get_init(b))
            return -1;
        if (ptr)
            *(int *)ptr = s->fd;
        return s->fd;
    case BIO_CTRL_GET_CLOSE:
        return s->close_on_free;
    case BIO_CTRL_SET_CLOSE:
        s->close_on_free = (int)num;
        return 1;
    case BIO_CTRL_EOF:
        return s->eof;
    case BIO_CTRL_DUP:
    case BIO_CTRL_FLUSH:
        return 1;
    default:
        return 0;
    }
}

static int sbio_create(BIO *b)
{
    struct sock_bio *s = calloc(1, sizeof *s);
    if (!s)
        return 0;
    s->fd = -1;
    BIO_set_data(b, s);
    return 1;
}

static int sbio_destroy(BIO *b)
{
    struct sock_bio *s = BIO_get_data(b);
    if (s && s->close_on_free && BIO_get_init(b) && s->fd >= 0)
        close(s->fd);
    free(s);
    BIO_set_data(b, NULL);
    return 1;
}

static BIO_METHOD *sbio_method;
static pthread_once_t sbio_once = PTHREAD_ONCE_INIT;

static void sbio_make(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR, "xpyd socket");
    if (m && BIO_meth_set_write_ex(m, sbio_write) && BIO_meth_set_read_ex(m, sbio_read) &&
        BIO_meth_set_ctrl(m, sbio_ctrl) && BIO_meth_set_create(m, sbio_create) &&
        BIO_meth_set_destroy(m, sbio_destroy))
        sbio_method = m;
    else
        BIO_meth_free(m);
}

int xpyd_tls_use_send(SSL *ssl)
{
    int fd = SSL_get_fd(ssl);
    if (fd < 0)
        return -1;
    pthread_once(&sbio_once, sbio_make);
    BIO *b = sbio_method ? BIO_new(sbio_method) : NULL;
    if (!b)
        return -1;
    BIO_set_fd(b, fd, BIO_NOCLOSE);
    SSL_set_bio(ssl, b, b);
    return 0;
}
