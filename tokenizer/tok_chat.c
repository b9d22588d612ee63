/* SPDX-License-Identifier: Apache-2.0 */
/* tok_chat.c - chat templates (xpyd_tokenizer.h): compiling and rendering one (the tpl_*.c engine), and a model
 * directory's template with its special tokens, rendered from an OpenAI chat request as vLLM renders it through
 * transformers' apply_chat_template (continue_final_message cut as transformers cuts it). */
#include "tok_lru.h"
#include "tpl_internal.h"
#include "xpyd_tokenizer.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>

struct xtpl {
    struct tpl *t;
};

struct xtpl *xtpl_compile(const char *src, size_t len, char *err, size_t errlen)
{
    struct tpl *t = tpl_parse(src, len, err, errlen);
    if (!t)
        return NULL;
    struct xtpl *x = calloc(1, sizeof *x);
    if (!x) {
        tarena_free(&t->arena);
        free(t);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    x->t = t;
    return x;
}

void xtpl_free(struct xtpl *x)
{
    if (!x)
        return;
    tarena_free(&x->t->arena);
    free(x->t);
    free(x);
}

static void set_global(struct tctx *c, struct tscope *s, const char *name, int fn)
{
    struct tv v = {.t = TV_FUNC};
    v.u.fn = fn;
    td_set(c, &s->vars, tv_strref(name, strlen(name)), v);
}

int xtpl_render(const struct xtpl *x, const cJSON *vars, const struct xtpl_limits *lim, char **out, size_t *n,
                char *err, size_t errlen)
{
    struct tctx c = {.err = err, .errlen = errlen, .maxdepth = 64};
    c.arena.limit = lim && lim->max_memory ? lim->max_memory : 256u << 20;
    c.outmax = lim && lim->max_output ? lim->max_output : 16u << 20;
    c.maxsteps = lim && lim->max_steps ? lim->max_steps : 10000000;
    *out = NULL;
    *n = 0;
    if (setjmp(c.jb)) {
        tpl_uncapture(&c, NULL); /* an error inside a macro or set block: the outputs set aside too */
        free(c.out);
        tarena_free(&c.arena);
        return -1;
    }
    struct tscope *globals = tpl_alloc(&c, sizeof *globals), *root = tpl_alloc(&c, sizeof *root);
    set_global(&c, globals, "range", G_RANGE);
    set_global(&c, globals, "namespace", G_NAMESPACE);
    set_global(&c, globals, "raise_exception", G_RAISE);
    set_global(&c, globals, "strftime_now", G_STRFTIME);
    set_global(&c, globals, "dict", G_DICT);
    root->parent = globals;
    c.root = root;
    for (const cJSON *it = vars ? vars->child : NULL; it; it = it->next)
        if (it->string)
            td_set(&c, &root->vars, tv_str(&c, it->string, strlen(it->string)), tv_from_json(&c, it));
    tpl_exec(&c, root, x->t->body, x->t->nbody);
    tpl_emit(&c, "", 0);
    char *o = c.out ? c.out : malloc(1);
    if (!o) {
        tarena_free(&c.arena);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    o[c.outn] = '\0';
    *out = o;
    *n = c.outn;
    tarena_free(&c.arena);
    return 0;
}

/* ---------------- a model directory's template ---------------- */

#define NSPECIAL 7
static const char *const SPECIAL[NSPECIAL] = {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                                              "cls_token", "mask_token"};

struct named {
    char *name;
    struct xtpl *t;
    char *src; /* its source where the templates are named (a request may name one: with_template); else NULL */
    size_t len;
};

struct xtok_chat {
    struct named *tpl;
    size_t ntpl;
    cJSON *special; /* {"bos_token": "...", ..., "additional_special_tokens": [...]} */
    int borrowed;   /* special is the model's chat's (a request's template): not freed with this one */
    int openai_content; /* a template loops over a message's content parts (vLLM's "openai" content format) */
    int named;          /* the templates came named (tokenizer_config.json's list): a request may pick one */
    atomic_int refs;    /* its holders: the caller, and the kept request templates (xtok_chat_free drops one) */
    struct kept *kept;  /* request templates compiled for requests, kept (xtok_chat_keep_request_templates) */
};

/* A request's template compiled, kept for the requests that bring the same source after it. */
struct kept_one {
    char *src;
    size_t len, cost; /* cost: the source and the compiled tree's memory, charged to the budget */
    struct xtok_chat *chat;      /* one reference is the cache's */
    struct tok_lnode lru;
};

struct kept {
    pthread_mutex_t mu;
    size_t max_bytes, bytes, entries;
    uint64_t hits, compiled;
    struct tok_lru lru; /* most recently used first */
};

static size_t skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n'))
        i++;
    return i;
}

static size_t ident(const char *s, size_t i, size_t n)
{
    while (i < n && (s[i] == '_' || (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
                     (s[i] >= '0' && s[i] <= '9')))
        i++;
    return i;
}

/* vLLM's content-format detection, read off the source: `for X in Y.content` or `for X in Y['content']` */
static int iterates_content(const char *s, size_t n)
{
    for (size_t i = 0; i + 4 < n; i++) {
        if (memcmp(s + i, "for", 3) || (i && ident(s, i - 1, n) != i - 1) || ident(s, i, n) != i + 3)
            continue; /* the word "for", not part of another */
        size_t k = skip_ws(s, i + 3, n), e = ident(s, k, n);
        if (e == k)
            continue;
        k = skip_ws(s, e, n);
        if (n - k < 3 || memcmp(s + k, "in", 2) || ident(s, k, n) != k + 2)
            continue;
        k = skip_ws(s, k + 2, n);
        e = ident(s, k, n);
        if (e == k)
            continue;
        if (n - e >= 8 && !memcmp(s + e, ".content", 8) && ident(s, e + 1, n) == e + 8)
            return 1;
        if (e < n && s[e] == '[') {
            size_t q = skip_ws(s, e + 1, n);
            if (n - q >= 9 && (s[q] == '\'' || s[q] == '"') && !memcmp(s + q + 1, "content", 7) && s[q + 8] == s[q])
                return 1;
        }
    }
    return 0;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    for (size_t r; b && (r = fread(b + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) {
            char *nb = cap < (64u << 20) ? realloc(b, cap * 2 + 1) : NULL;
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (b) {
        b[n] = '\0';
        *len = n;
    }
    return b;
}

static const char *token_text(const cJSON *v)
{
    if (cJSON_IsString(v))
        return v->valuestring;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

static void add_specials(cJSON *special, const cJSON *from)
{
    for (int i = 0; i < NSPECIAL; i++) {
        const char *t = token_text(cJSON_GetObjectItemCaseSensitive(from, SPECIAL[i]));
        if (t && !cJSON_GetObjectItemCaseSensitive(special, SPECIAL[i]))
            cJSON_AddStringToObject(special, SPECIAL[i], t);
    }
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(from, "additional_special_tokens"), *it;
    if (cJSON_IsArray(add) && !cJSON_GetObjectItemCaseSensitive(special, "additional_special_tokens")) {
        cJSON *l = cJSON_AddArrayToObject(special, "additional_special_tokens");
        cJSON_ArrayForEach(it, add)
        {
            const char *t = token_text(it);
            if (t)
                cJSON_AddItemToArray(l, cJSON_CreateString(t));
        }
    }
}

static int add_template(struct xtok_chat *c, const char *name, const char *src, size_t len, const char *where,
                        char *err, size_t errlen)
{
    char e[400];
    struct xtpl *t = xtpl_compile(src, len, e, sizeof e);
    if (!t) {
        snprintf(err, errlen, "%s: %s", where, e);
        return -1;
    }
    struct named *nt = realloc(c->tpl, (c->ntpl + 1) * sizeof *nt);
    if (!nt) {
        xtpl_free(t);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    c->tpl = nt;
    struct named *at = &c->tpl[c->ntpl];
    at->name = strdup(name);
    at->src = c->named ? malloc(len + 1) : NULL; /* kept where a request may name it */
    at->len = len;
    at->t = t;
    c->ntpl++;
    if (!at->name || (c->named && !at->src)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (at->src) {
        memcpy(at->src, src, len);
        at->src[len] = '\0';
    }
    c->openai_content |= iterates_content(src, len);
    return 0;
}

/* transformers' template files (tokenization_utils_base.py, _from_pretrained): chat_template.jinja is the template
 * "default", each additional_chat_templates/NAME.jinja the template NAME (a "default.jinja" there wins); when there
 * are any they replace tokenizer_config.json's, and "default" alone is the one template, else they are named.
 * text: chat_template.jinja's content (NULL: none). *found: there were some. */
static int template_files(struct xtok_chat *c, const char *dir, const char *text, size_t len, int *found, char *err,
                          size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/additional_chat_templates", dir);
    DIR *d = opendir(path);
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0, has_default = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        struct stat st;
        snprintf(path, sizeof path, "%s/additional_chat_templates/%s", dir, e->d_name);
        if (l <= 6 || strcmp(e->d_name + l - 6, ".jinja") || stat(path, &st) || !S_ISREG(st.st_mode))
            continue;
        if (n == cap) {
            char **nn = realloc(names, (cap = cap ? cap * 2 : 8) * sizeof *nn);
            if (!nn) {
                rc = -1;
                break;
            }
            names = nn;
        }
        if (!(names[n] = strndup(e->d_name, l - 6))) {
            rc = -1;
            break;
        }
        has_default |= !strcmp(names[n++], "default");
    }
    if (d)
        closedir(d);
    if (rc)
        snprintf(err, errlen, "out of memory");
    c->named = n > 0;
    *found = n > 0 || text;
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (!rc && text && !has_default)
        rc = add_template(c, "default", text, len, path, err, errlen);
    for (size_t i = 0; i < n && !rc; i++) {
        size_t tl;
        snprintf(path, sizeof path, "%s/additional_chat_templates/%s.jinja", dir, names[i]);
        char *src = read_file(path, &tl);
        if (!src) {
            snprintf(err, errlen, "%s: cannot read it", path);
            rc = -1;
        } else {
            rc = add_template(c, names[i], src, tl, path, err, errlen);
        }
        free(src);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}

int xtok_chat_openai_content(const struct xtok_chat *c)
{
    return c->openai_content;
}

struct xtok_chat *xtok_chat_load(const char *dir, const char *template_file, char *err, size_t errlen)
{
    struct xtok_chat *c = calloc(1, sizeof *c);
    char path[4096];
    size_t len;
    if (c)
        atomic_init(&c->refs, 1);
    if (!c || !(c->special = cJSON_CreateObject())) {
        free(c);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    char *text = read_file(path, &len);
    cJSON *cfg = text ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    if (text && !cfg) {
        snprintf(err, errlen, "%s: not valid JSON", path);
        xtok_chat_free(c);
        return NULL;
    }
    if (cfg)
        add_specials(c->special, cfg);
    snprintf(path, sizeof path, "%s/special_tokens_map.json", dir);
    text = read_file(path, &len);
    cJSON *map = text ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    if (map)
        add_specials(c->special, map);
    cJSON_Delete(map);
    int rc = 0, found = 0;
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    const char *file = template_file ? template_file : path;
    text = read_file(file, &len);
    if (!text && template_file) {
        snprintf(err, errlen, "%s: cannot read it", template_file);
        rc = -1;
    } else if (template_file) {
        rc = add_template(c, "default", text, len, file, err, errlen);
    } else {
        rc = template_files(c, dir, text, len, &found, err, errlen);
    }
    if (!rc && !found && !template_file) {
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), *it;
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        if (cJSON_IsString(ct)) {
            rc = add_template(c, "default", ct->valuestring, strlen(ct->valuestring), path, err, errlen);
        } else if (cJSON_IsArray(ct)) {
            c->named = 1;
            cJSON_ArrayForEach(it, ct)
            {
                const cJSON *nm = cJSON_GetObjectItemCaseSensitive(it, "name");
                const cJSON *tp = cJSON_GetObjectItemCaseSensitive(it, "template");
                if (cJSON_IsString(nm) && cJSON_IsString(tp) &&
                    (rc = add_template(c, nm->valuestring, tp->valuestring, strlen(tp->valuestring), path, err,
                                       errlen)) != 0)
                    break;
            }
        }
        if (!rc && !c->ntpl) {
            snprintf(err, errlen, "%s has no chat_template (and there is no %s/chat_template.jinja)", path, dir);
            rc = -1;
        }
    }
    free(text);
    cJSON_Delete(cfg);
    if (rc) {
        xtok_chat_free(c);
        return NULL;
    }
    return c;
}

/* The kept compilation of src, one more reference to it for the caller; NULL (counted as compiled) if none. The
 * list is searched in use order: each takes 64 KiB at least, so a budget holds tens of them, not thousands. */
static struct xtok_chat *kept_get(struct kept *k, const char *src, size_t len)
{
    if (!k)
        return NULL;
    struct xtok_chat *c = NULL;
    pthread_mutex_lock(&k->mu);
    for (struct tok_lnode *x = k->lru.head; x; x = x->next) {
        struct kept_one *e = TOK_LRU_OF(x, struct kept_one, lru);
        if (e->len == len && !memcmp(e->src, src, len)) {
            tok_lru_touch(&k->lru, x);
            atomic_fetch_add(&e->chat->refs, 1);
            c = e->chat;
            break;
        }
    }
    *(c ? &k->hits : &k->compiled) += 1;
    pthread_mutex_unlock(&k->mu);
    return c;
}

static void kept_drop(struct kept *k, struct kept_one *e)
{
    tok_lru_unlink(&k->lru, &e->lru);
    k->bytes -= e->cost;
    k->entries--;
    xtok_chat_free(e->chat); /* the cache's reference: a render using it keeps it until it ends */
    free(e->src);
    free(e);
}

/* The memory of a request's compiled template: its source (the copy kept to find it by) and the tree's arena (at
 * least one 64-KB chunk). */
static size_t chat_bytes(const struct xtok_chat *c)
{
    size_t n = sizeof *c + sizeof(struct kept_one);
    for (size_t i = 0; i < c->ntpl; i++)
        n += sizeof(struct named) + c->tpl[i].len + c->tpl[i].t->t->arena.used;
    return n;
}

/* c (compiled from src for a request) kept, with one reference of its own, the least recently used out of the
 * memory budget; one over the whole budget, or one kept meanwhile by another thread, is not. */
static void kept_put(struct kept *k, const char *src, size_t len, struct xtok_chat *c)
{
    size_t cost = k ? chat_bytes(c) : 0;
    if (!k || cost > k->max_bytes)
        return;
    struct kept_one *e = calloc(1, sizeof *e);
    char *copy = e ? malloc(len ? len : 1) : NULL;
    if (!copy) {
        free(e);
        return;
    }
    memcpy(copy, src, len);
    pthread_mutex_lock(&k->mu);
    for (struct tok_lnode *x = k->lru.head; x; x = x->next) {
        const struct kept_one *o = TOK_LRU_OF(x, struct kept_one, lru);
        if (o->len == len && !memcmp(o->src, src, len)) { /* kept by another thread meanwhile */
            pthread_mutex_unlock(&k->mu);
            free(copy);
            free(e);
            return;
        }
    }
    while (k->lru.tail && k->bytes + cost > k->max_bytes)
        kept_drop(k, TOK_LRU_OF(k->lru.tail, struct kept_one, lru));
    e->src = copy;
    e->len = len;
    e->cost = cost;
    e->chat = c;
    atomic_fetch_add(&c->refs, 1);
    tok_lru_front(&k->lru, &e->lru);
    k->bytes += cost;
    k->entries++;
    pthread_mutex_unlock(&k->mu);
}

/* c's special tokens (borrowed: c outlives it) with src compiled as the one template, or the named template src
 * names. */
static struct xtok_chat *with_template(const struct xtok_chat *c, const char *src, size_t len, char *err,
                                       size_t errlen)
{
    struct xtok_chat *o = calloc(1, sizeof *o);
    if (!o) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    atomic_init(&o->refs, 1);
    o->special = c->special;
    o->borrowed = 1;
    for (size_t i = 0; c->named && i < c->ntpl; i++)
        if (strlen(c->tpl[i].name) == len && !memcmp(c->tpl[i].name, src, len)) { /* a name among named ones */
            src = c->tpl[i].src;
            len = c->tpl[i].len;
            break;
        }
    if (add_template(o, "default", src, len, "the request's chat_template", err, errlen) != 0) {
        xtok_chat_free(o);
        return NULL;
    }
    return o;
}

const struct xtok_chat *xtok_chat_for_request(const struct xtok_chat *c, const cJSON *req, int trust,
                                              struct xtok_chat **mine, int *why, char *err, size_t errlen)
{
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(req, "chat_template_kwargs");
    const cJSON *v = cJSON_IsObject(kw) ? cJSON_GetObjectItemCaseSensitive(kw, "chat_template") : NULL;
    if (!v || cJSON_IsNull(v)) /* vLLM: its kwargs update apply_chat_template's chat_template=request's */
        v = cJSON_GetObjectItemCaseSensitive(req, "chat_template");
    *mine = NULL;
    *why = 0;
    if (!v || cJSON_IsNull(v))
        return c;
    if (!cJSON_IsString(v)) {
        *why = XTOK_REQ_NOT_STRING;
        snprintf(err, errlen, "chat_template must be a string");
    } else if (!trust) { /* as vLLM answers it */
        *why = XTOK_REQ_UNTRUSTED;
        snprintf(err, errlen, "Chat template is passed with request, but --trust-request-chat-template is not set. "
                              "Refused request with untrusted chat template.");
    } else {
        size_t len = strlen(v->valuestring);
        if ((*mine = kept_get(c->kept, v->valuestring, len)))
            return *mine; /* compiled for an earlier request */
        if (!(*mine = with_template(c, v->valuestring, len, err, errlen)))
            *why = XTOK_REQ_COMPILE;
        else
            kept_put(c->kept, v->valuestring, len, *mine);
    }
    return *mine;
}

int xtok_chat_keep_request_templates(struct xtok_chat *c, size_t max_bytes)
{
    if (c->kept || !max_bytes)
        return 0;
    if (!(c->kept = calloc(1, sizeof *c->kept)))
        return -1;
    pthread_mutex_init(&c->kept->mu, NULL);
    c->kept->max_bytes = max_bytes;
    return 0;
}

void xtok_chat_kept_stats(const struct xtok_chat *c, struct xtok_chat_kept_stats *st)
{
    struct kept *k = c->kept;
    memset(st, 0, sizeof *st);
    if (!k)
        return;
    pthread_mutex_lock(&k->mu);
    st->bytes = k->bytes;
    st->entries = k->entries;
    st->hits = k->hits;
    st->compiled = k->compiled;
    pthread_mutex_unlock(&k->mu);
}

void xtok_chat_free(struct xtok_chat *c)
{
    if (!c || atomic_fetch_sub(&c->refs, 1) > 1)
        return;
    if (c->kept) {
        while (c->kept->lru.head)
            kept_drop(c->kept, TOK_LRU_OF(c->kept->lru.head, struct kept_one, lru));
        pthread_mutex_destroy(&c->kept->mu);
        free(c->kept);
    }
    for (size_t i = 0; i < c->ntpl; i++) {
        free(c->tpl[i].name);
        free(c->tpl[i].src);
        xtpl_free(c->tpl[i].t);
    }
    free(c->tpl);
    if (!c->borrowed)
        cJSON_Delete(c->special);
    free(c);
}

static const struct xtpl *pick(const struct xtok_chat *c, int tools)
{
    const struct xtpl *def = NULL;
    for (size_t i = 0; i < c->ntpl; i++) {
        if (tools && !strcmp(c->tpl[i].name, "tool_use"))
            return c->tpl[i].t;
        if (!strcmp(c->tpl[i].name, "default"))
            def = c->tpl[i].t;
    }
    return def; /* none: transformers refuses ("multiple chat templates with no default") */
}

static size_t strip_left(const char *p, size_t n)
{
    size_t i = 0, l;
    while (i < n && u8_is_space(p + i, n - i, &l))
        i += l;
    return i;
}

static size_t strip_right(const char *p, size_t n)
{
    while (n > 0) {
        size_t s = n - 1, l;
        while (s > 0 && ((unsigned char)p[s] & 0xC0) == 0x80)
            s--;
        if (!u8_is_space(p + s, n - s, &l) || l != n - s)
            break;
        n = s;
    }
    return n;
}

/* transformers: with continue_final_message the text ends where the final message's text does */
static int cut_at_final(const cJSON *msgs, char *out, size_t *n, char *err, size_t errlen)
{
    const cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(last, "content"), *it;
    const char *fm = cJSON_IsString(content) ? content->valuestring : NULL;
    if (cJSON_IsArray(content))
        for (it = content->child ? content->child : NULL; it; it = it->next) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(it, "text");
            if (cJSON_IsString(t))
                fm = t->valuestring; /* the last text block */
        }
    if (!fm) {
        snprintf(err, errlen, "continue_final_message is set but the final message has no text to continue");
        return -1;
    }
    size_t fl = strlen(fm), a = strip_left(fm, fl), b = strip_right(fm, fl);
    const char *core = fm + a;
    size_t cl = b > a ? b - a : 0, at = (size_t)-1;
    for (size_t i = 0; i + cl <= *n; i++)
        if (!memcmp(out + i, core, cl))
            at = i;
    if (at == (size_t)-1) {
        snprintf(err, errlen, "continue_final_message is set but the final message does not appear in the chat "
                              "after applying the chat template");
        return -1;
    }
    /* the message as it is there (no leading space to drop): keep its trailing spaces too */
    if (a == 0 && at + fl <= *n && !memcmp(out + at, fm, fl))
        *n = at + fl;
    else
        *n = at + cl;
    out[*n] = '\0';
    return 0;
}

int xtok_chat_render(const struct xtok_chat *c, const cJSON *req, const struct xtpl_limits *lim, char **out,
                     size_t *n, char *err, size_t errlen)
{
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(req, "messages");
    if (!cJSON_IsArray(msgs) || !cJSON_GetArraySize(msgs)) {
        snprintf(err, errlen, "'messages' is required and must be a non-empty array");
        return -1;
    }
    const cJSON *agp = cJSON_GetObjectItemCaseSensitive(req, "add_generation_prompt");
    const cJSON *cont = cJSON_GetObjectItemCaseSensitive(req, "continue_final_message");
    int add_gen = agp ? cJSON_IsTrue(agp) : 1, cont_final = cJSON_IsTrue(cont);
    if (cont_final && cJSON_IsTrue(agp)) {
        snprintf(err, errlen, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
        return -1;
    }
    if (cont_final)
        add_gen = 0;
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(req, "tools");
    cJSON *vars = cJSON_Duplicate(c->special, 1);
    if (!vars) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    /* the request's own nodes, referred to (not copied: a long conversation is read once, by the render) */
    cJSON_AddItemReferenceToObject(vars, "messages", (cJSON *)msgs);
    if (tools && !cJSON_IsNull(tools))
        cJSON_AddItemReferenceToObject(vars, "tools", (cJSON *)tools);
    else
        cJSON_AddNullToObject(vars, "tools");
    const cJSON *docs = cJSON_GetObjectItemCaseSensitive(req, "documents");
    if (docs)
        cJSON_AddItemReferenceToObject(vars, "documents", (cJSON *)docs);
    else
        cJSON_AddNullToObject(vars, "documents");
    cJSON_AddBoolToObject(vars, "add_generation_prompt", add_gen);
    cJSON_AddBoolToObject(vars, "continue_final_message", cont_final);
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(req, "chat_template_kwargs"), *it;
    if (!cJSON_IsObject(kw))
        kw = NULL;
    cJSON_ArrayForEach(it, kw) /* vLLM: the request's kwargs win */
    {
        if (!strcmp(it->string, "chat_template"))
            continue; /* apply_chat_template's own argument, not the template's (xtok_chat_for_request) */
        cJSON_DeleteItemFromObjectCaseSensitive(vars, it->string);
        cJSON_AddItemReferenceToObject(vars, it->string, (cJSON *)it);
    }
    /* vLLM passes tools unless the request has none (an empty list is passed), and transformers takes a
     * `tool_use` template whenever tools are passed */
    const struct xtpl *tpl = pick(c, cJSON_IsArray(tools));
    int rc = tpl ? xtpl_render(tpl, vars, lim, out, n, err, errlen)
                 : (snprintf(err, errlen, "the model has several chat templates and none is named default"), -1);
    cJSON_Delete(vars);
    if (rc == 0 && cont_final && cut_at_final(msgs, *out, n, err, errlen) != 0) {
        free(*out);
        *out = NULL;
        rc = -1;
    }
    return rc;
}
