/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_tls.c - libFuzzer harness for the TLS server side (common/xpyd_tls.c): client bytes (a ClientHello and
 * whatever follows) into a server connection made from xpyd_tls_server_new's context, through memory BIOs,
 * so our callbacks (certificate installation, ALPN selection) run on hostile input. Once in a while the
 * certificate is reloaded, as SIGHUP does. Asserts: no crash, no leak, no sanitizer report; a plain-HTTP
 * verdict only for input that starts like an HTTP request. */
#include "xpyd_tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static SSL_CTX *ctx;
static char cert[64], key[64];

static void remove_pair(void)
{
    unlink(cert);
    unlink(key);
}

/* A self-signed certificate and its key, written to files once (the API takes paths). */
static void make_pair(const char *cert_path, const char *key_path)
{
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), 0);
    X509_gmtime_adj(X509_getm_notAfter(x), 86400);
    X509_set_pubkey(x, key);
    X509_NAME *n = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)"localhost", -1, -1, 0);
    X509_set_issuer_name(x, n);
    X509_sign(x, key, EVP_sha256());
    FILE *f = fopen(cert_path, "w");
    PEM_write_X509(f, x);
    fclose(f);
    f = fopen(key_path, "w");
    PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL);
    fclose(f);
    X509_free(x);
    EVP_PKEY_free(key);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char err[512];
    snprintf(cert, sizeof cert, "/tmp/xpyd-fuzz-tls-%d.pem", (int)getpid());
    snprintf(key, sizeof key, "/tmp/xpyd-fuzz-tls-%d.key", (int)getpid());
    make_pair(cert, key);
    atexit(remove_pair);
    struct xpyd_tls_server_opts o = {cert, key, NULL, TLS1_2_VERSION};
    ctx = xpyd_tls_server_new(&o, err, sizeof err);
    if (!ctx) {
        fprintf(stderr, "fuzz_tls: %s\n", err);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static unsigned long runs;
    if (++runs % 4096 == 0) {
        char err[512];
        if (xpyd_tls_server_reload(ctx, err, sizeof err) != 0)
            abort(); /* the same good pair loads again */
    }
    SSL *ssl = SSL_new(ctx);
    BIO *in = BIO_new(BIO_s_mem()), *out = BIO_new(BIO_s_mem());
    BIO_write(in, data, (int)size);
    BIO_set_mem_eof_return(in, -1); /* no more bytes: "want read", as a socket would be */
    SSL_set_bio(ssl, in, out);
    SSL_set_accept_state(ssl);
    int rc = SSL_do_handshake(ssl);
    if (rc == 1) {
        char buf[256];
        SSL_read(ssl, buf, sizeof buf); /* application data after a (fuzzed) complete handshake */
    }
    unsigned long e = ERR_peek_error();
    if (e && xpyd_tls_is_plain_http(e) && (size < 4 || data[0] < 'A' || data[0] > 'Z'))
        abort(); /* the plain-HTTP verdict for something that does not start like a request */
    char why[512];
    xpyd_tls_errors(why, sizeof why); /* and the error text always formats */
    SSL_free(ssl);
    return 0;
}
