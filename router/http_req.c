/* SPDX-License-Identifier: Apache-2.0 */
/* http_req.c - strict HTTP/1.1 request heads and chunked bodies (see http_req.h). Grammar: RFC 9112 §2-§7,
 * RFC 9110 §5 (fields), §7.6.1 (Connection), §10.1.1 (Expect). What is refused, and why, is listed in
 * http_req.h; everything here reads only the bytes it is given. */
#include "http_req.h"

#include <string.h>
#include <strings.h>

static int is_tchar(unsigned char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return 1;
    return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* field-value bytes: HTAB, SP, VCHAR, obs-text; never NUL, CR, LF, other controls or DEL */
static int is_value_char(unsigned char c)
{
    return c == '\t' || (c >= 0x20 && c != 0x7f);
}

static int fail(struct hr_head *h, int status, const char *why)
{
    h->error = why;
    return status;
}

int hr_name_is(const struct hr_field *f, const char *lower)
{
    size_t n = strlen(lower);
    return f->nlen == n && strncasecmp(f->name, lower, n) == 0;
}

/* Next element of a comma-separated list in [*p, end): trimmed, may be empty. 0 at the end. */
static int list_next(const char **p, const char *end, const char **s, size_t *n)
{
    if (*p > end)
        return 0;
    const char *a = *p, *c = memchr(a, ',', (size_t)(end - a));
    const char *b = c ? c : end;
    *p = c ? c + 1 : end + 1;
    while (a < b && (*a == ' ' || *a == '\t'))
        a++;
    while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
        b--;
    *s = a;
    *n = (size_t)(b - a);
    return 1;
}

static int token_is(const char *s, size_t n, const char *lower)
{
    return strlen(lower) == n && strncasecmp(s, lower, n) == 0;
}

static int is_token(const char *s, size_t n)
{
    if (!n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!is_tchar((unsigned char)s[i]))
            return 0;
    return 1;
}

static int content_length(const struct hr_field *f, struct hr_head *h)
{
    const char *p = f->val, *end = f->val + f->vlen, *s;
    size_t n;
    int any = 0;
    while (list_next(&p, end, &s, &n)) {
        if (n == 0 || n > 18)
            return fail(h, 400, n ? "Content-Length is too large" : "invalid Content-Length");
        int64_t v = 0;
        for (size_t i = 0; i < n; i++) {
            if (s[i] < '0' || s[i] > '9')
                return fail(h, 400, "invalid Content-Length");
            v = v * 10 + (s[i] - '0');
        }
        if (h->content_length >= 0 && h->content_length != v)
            return fail(h, 400, "differing Content-Length values");
        h->content_length = v;
        any = 1;
    }
    return any ? 0 : fail(h, 400, "invalid Content-Length");
}

/* te: 1 chunked seen, 2 another coding seen, 4 the last coding so far is chunked */
static int transfer_encoding(const struct hr_field *f, struct hr_head *h, int *te)
{
    const char *p = f->val, *end = f->val + f->vlen, *s;
    size_t n;
    while (list_next(&p, end, &s, &n)) {
        if (n == 0)
            continue;
        const char *semi = memchr(s, ';', n);
        size_t tn = semi ? (size_t)(semi - s) : n;
        while (tn && (s[tn - 1] == ' ' || s[tn - 1] == '\t'))
            tn--;
        if (!is_token(s, tn))
            return fail(h, 400, "invalid Transfer-Encoding");
        if (*te & 1)
            return fail(h, 400, "chunked is not the last transfer coding");
        if (token_is(s, tn, "chunked")) {
            if (semi)
                return fail(h, 400, "invalid Transfer-Encoding");
            *te |= 1 | 4;
        } else {
            *te = (*te | 2) & ~4;
        }
    }
    return 0;
}

/* Request line: method SP request-target SP HTTP-version. */
static int request_line(const char *p, size_t n, struct hr_head *h)
{
    static const char *const known[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", NULL};
    const char *sp1 = memchr(p, ' ', n);
    if (!sp1 || sp1 == p)
        return fail(h, 400, "malformed request line");
    h->method = p;
    h->mlen = (size_t)(sp1 - p);
    for (size_t i = 0; i < h->mlen; i++)
        if (!((p[i] >= 'A' && p[i] <= 'Z') || p[i] == '_' || p[i] == '-'))
            return fail(h, 400, "malformed request method");
    const char *t = sp1 + 1, *end = p + n;
    const char *sp2 = memchr(t, ' ', (size_t)(end - t));
    if (!sp2)
        return fail(h, 400, "request line without an HTTP version");
    h->target = t;
    h->tlen = (size_t)(sp2 - t);
    if (!h->tlen)
        return fail(h, 400, "malformed request line");
    for (size_t i = 0; i < h->tlen; i++)
        if ((unsigned char)t[i] <= 0x20 || (unsigned char)t[i] >= 0x7f || t[i] == '#')
            return fail(h, 400, "invalid bytes in the request target");
    const char *v = sp2 + 1;
    size_t vn = (size_t)(end - v);
    if (vn != 8 || memcmp(v, "HTTP/", 5) != 0 || v[5] < '0' || v[5] > '9' || v[6] != '.' || v[7] < '0' || v[7] > '9')
        return fail(h, 400, "malformed HTTP version");
    if (v[5] != '1' || (v[7] != '0' && v[7] != '1'))
        return fail(h, 505, "only HTTP/1.0 and HTTP/1.1 are supported");
    h->minor = v[7] - '0';
    int k = 0;
    while (known[k] && !token_is(h->method, h->mlen, known[k]))
        k++;
    if (!known[k])
        return fail(h, 501, "request method not implemented");
    if (h->target[0] == '/')
        return 0;
    if (h->tlen == 1 && h->target[0] == '*' && token_is(h->method, h->mlen, "OPTIONS"))
        return 0;
    /* absolute-form (RFC 9112 §3.2.2): the path is what is routed */
    size_t skip = h->tlen > 7 && !strncasecmp(t, "http://", 7) ? 7 : h->tlen > 8 && !strncasecmp(t, "https://", 8) ? 8 : 0;
    if (!skip)
        return fail(h, 400, "malformed request target");
    const char *path = memchr(t + skip, '/', h->tlen - skip);
    if (!path)
        path = "/", h->tlen = 1;
    else
        h->tlen -= (size_t)(path - t);
    h->target = path;
    return 0;
}

int hr_parse_head(const char *p, size_t len, struct hr_field *fields, size_t cap, struct hr_head *h)
{
    memset(h, 0, sizeof *h);
    h->content_length = -1;
    size_t i = 0;
    while (i + 1 < len && p[i] == '\r' && p[i + 1] == '\n') /* empty lines before a request are ignored */
        i += 2;
    int hosts = 0, auths = 0, close = 0, keep = 0, te = 0, line_no = 0;
    while (i < len) {
        size_t s = i;
        while (i < len && p[i] != '\n' && p[i] != '\r')
            i++;
        if (i >= len || p[i] != '\r' || i + 1 >= len || p[i + 1] != '\n')
            return fail(h, 400, i < len && p[i] == '\n' ? "bare LF in the request head" : "bare CR in the request head");
        size_t n = i - s;
        i += 2;
        if (line_no++ == 0) {
            int st = request_line(p + s, n, h);
            if (st)
                return st;
            continue;
        }
        if (n == 0)
            break; /* end of the head */
        const char *l = p + s;
        if (l[0] == ' ' || l[0] == '\t')
            return fail(h, 400, "obsolete line folding in the request head");
        size_t c = 0;
        while (c < n && is_tchar((unsigned char)l[c]))
            c++;
        if (c == 0 || c >= n || l[c] != ':')
            return fail(h, 400, c < n && (l[c] == ' ' || l[c] == '\t') ? "whitespace before a colon in a header field"
                                                                         : "invalid header field name");
        size_t a = c + 1, b = n;
        for (size_t k = a; k < n; k++)
            if (!is_value_char((unsigned char)l[k]))
                return fail(h, 400, "invalid bytes in a header field value");
        while (a < b && (l[a] == ' ' || l[a] == '\t'))
            a++;
        while (b > a && (l[b - 1] == ' ' || l[b - 1] == '\t'))
            b--;
        if (h->nfields >= cap)
            return fail(h, 431, "too many request header fields");
        struct hr_field *f = &fields[h->nfields++];
        *f = (struct hr_field){l, l + a, c, b - a, 0};
        int st = 0;
        if (hr_name_is(f, "content-length")) {
            f->drop = 1;
            st = content_length(f, h);
        } else if (hr_name_is(f, "transfer-encoding")) {
            f->drop = 1;
            te |= 8;
            st = transfer_encoding(f, h, &te);
        } else if (hr_name_is(f, "host")) {
            hosts++;
            h->host = f->val;
            h->hostlen = f->vlen;
        } else if (hr_name_is(f, "authorization")) {
            auths++;
            h->auth = f->val;
            h->authlen = f->vlen;
        } else if (hr_name_is(f, "expect")) {
            f->drop = 1;
            if (!token_is(f->val, f->vlen, "100-continue"))
                return fail(h, 417, "only 'Expect: 100-continue' is supported");
            h->expect_continue = h->minor == 1;
        } else if (hr_name_is(f, "connection")) {
            f->drop = 1;
            const char *q = f->val, *end = f->val + f->vlen, *tok;
            size_t tn;
            while (list_next(&q, end, &tok, &tn)) {
                if (tn && !is_token(tok, tn))
                    return fail(h, 400, "invalid Connection header");
                close |= token_is(tok, tn, "close");
                keep |= token_is(tok, tn, "keep-alive");
            }
        } else if (hr_name_is(f, "keep-alive") || hr_name_is(f, "proxy-connection") || hr_name_is(f, "te") ||
                   hr_name_is(f, "trailer") || hr_name_is(f, "upgrade")) {
            f->drop = 1;
        }
        if (st)
            return st;
    }
    if (line_no == 0 || i != len)
        return fail(h, 400, "malformed request head");
    if (hosts > 1 || (hosts == 0 && h->minor == 1))
        return fail(h, 400, hosts ? "more than one Host header" : "HTTP/1.1 request without a Host header");
    if (auths > 1)
        return fail(h, 400, "more than one Authorization header");
    if (te && h->content_length >= 0)
        return fail(h, 400, "both Content-Length and Transfer-Encoding");
    if (te && h->minor == 0)
        return fail(h, 400, "Transfer-Encoding in an HTTP/1.0 request");
    if (te && !(te & 4))
        return fail(h, 400, (te & 2) ? "the last transfer coding must be chunked" : "empty Transfer-Encoding");
    if (te & 2)
        return fail(h, 501, "transfer codings other than chunked are not implemented");
    h->chunked = (te & 4) != 0;
    h->keep_alive = h->minor == 1 ? !close : (keep && !close);
    /* fields named in Connection are for this hop only (RFC 9110 §7.6.1) */
    for (size_t k = 0; k < h->nfields; k++) {
        if (!hr_name_is(&fields[k], "connection"))
            continue;
        const char *q = fields[k].val, *end = fields[k].val + fields[k].vlen, *tok;
        size_t tn;
        while (list_next(&q, end, &tok, &tn))
            for (size_t m = 0; m < h->nfields; m++)
                if (tn && fields[m].nlen == tn && !strncasecmp(fields[m].name, tok, tn)) {
                    if (hr_name_is(&fields[m], "host"))
                        return fail(h, 400, "Connection names the Host header");
                    fields[m].drop = 1;
                }
    }
    return 0;
}

enum { CK_SIZE = 0, CK_SIZE_LF, CK_DATA, CK_DATA_CR, CK_DATA_LF, CK_TRAILER, CK_TRAILER_LINE, CK_TRAILER_LF, CK_END_LF,
       CK_DONE };

#define CK_MAX_LINE 4096

static ssize_t ck_fail(const char **err, const char *why, int status)
{
    *err = why;
    return -status;
}

static int hexval(unsigned char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

ssize_t hr_chunked_feed(struct hr_chunked *c, const char *in, size_t len, size_t max_trailer_bytes, hr_data_fn data,
                        void *arg, int *done, const char **err)
{
    size_t i = 0;
    *done = 0;
    while (i < len) {
        unsigned char ch = (unsigned char)in[i];
        switch (c->state) {
        case CK_SIZE:
            if (++c->line > CK_MAX_LINE)
                return ck_fail(err, "chunk size line too long", 400);
            if (ch == '\r') {
                if (!c->digits || c->quote)
                    return ck_fail(err, "malformed chunk size line", 400);
                c->state = CK_SIZE_LF;
            } else if (c->quote == 2) {
                if (!is_value_char(ch))
                    return ck_fail(err, "malformed chunk extension", 400);
                c->quote = 1;
            } else if (c->quote == 1) {
                if (ch == '\\')
                    c->quote = 2;
                else if (ch == '"')
                    c->quote = 0;
                else if (!is_value_char(ch))
                    return ck_fail(err, "malformed chunk extension", 400);
            } else if (!c->ext && hexval(ch) >= 0) {
                c->digits++;
                if ((c->left || hexval(ch)) && ++c->significant > 15)
                    return ck_fail(err, "chunk size too large", 400);
                c->left = c->left * 16 + (uint64_t)hexval(ch);
            } else if (c->digits && (ch == ';' || ch == ' ' || ch == '\t')) {
                c->ext = 1;
            } else if (c->ext && (is_tchar(ch) || ch == '=' || ch == ';' || ch == ' ' || ch == '\t' || ch == '"')) {
                if (ch == '"')
                    c->quote = 1;
            } else {
                return ck_fail(err, "malformed chunk size line", 400);
            }
            i++;
            break;
        case CK_SIZE_LF:
            if (ch != '\n')
                return ck_fail(err, "malformed chunk size line", 400);
            i++;
            c->line = 0;
            c->state = c->left ? CK_DATA : CK_TRAILER;
            break;
        case CK_DATA: {
            size_t n = len - i;
            if ((uint64_t)n > c->left)
                n = (size_t)c->left;
            data(arg, in + i, n);
            c->left -= n;
            i += n;
            if (!c->left)
                c->state = CK_DATA_CR;
            break;
        }
        case CK_DATA_CR:
        case CK_DATA_LF:
            if (ch != (c->state == CK_DATA_CR ? '\r' : '\n'))
                return ck_fail(err, "chunk data not followed by CRLF", 400);
            i++;
            if (c->state == CK_DATA_CR) {
                c->state = CK_DATA_LF;
            } else {
                c->state = CK_SIZE;
                c->digits = c->significant = c->ext = c->quote = 0;
                c->line = 0;
            }
            break;
        case CK_TRAILER:
            if (ch == '\r') {
                c->state = CK_END_LF;
            } else if (!is_tchar(ch)) {
                return ck_fail(err, "malformed trailer field", 400);
            } else {
                c->state = CK_TRAILER_LINE;
                c->quote = 0; /* reused: the colon was seen */
            }
            i++;
            if (++c->trailer_bytes > max_trailer_bytes)
                return ck_fail(err, "trailer fields too large", 431);
            break;
        case CK_TRAILER_LINE:
            if (ch == '\r') {
                if (!c->quote)
                    return ck_fail(err, "malformed trailer field", 400);
                c->state = CK_TRAILER_LF;
            } else if (!c->quote && ch == ':') {
                c->quote = 1;
            } else if (c->quote ? !is_value_char(ch) : !is_tchar(ch)) {
                return ck_fail(err, "malformed trailer field", 400);
            }
            i++;
            if (++c->trailer_bytes > max_trailer_bytes)
                return ck_fail(err, "trailer fields too large", 431);
            break;
        case CK_TRAILER_LF:
            if (ch != '\n')
                return ck_fail(err, "malformed trailer field", 400);
            i++;
            c->state = CK_TRAILER;
            break;
        case CK_END_LF:
            if (ch != '\n')
                return ck_fail(err, "malformed end of chunked body", 400);
            c->state = CK_DONE;
            *done = 1;
            return (ssize_t)(i + 1);
        default:
            *done = 1;
            return (ssize_t)i;
        }
    }
    return (ssize_t)i;
}
