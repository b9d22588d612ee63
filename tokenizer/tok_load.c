/* SPDX-License-Identifier: Apache-2.0 */
/* tok_load.c - tokenizer.json read into a struct xtok (see xpyd_tokenizer.h for what is supported). Every
 * component is checked against what the encoder implements; anything else fails here, naming it. */
#include "tok_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int load_normalizer(struct xtok *t, const cJSON *n, char *err, size_t errlen)
{
    if (!n || cJSON_IsNull(n))
        return 0;
    const char *type = tok_str_of(n, "type");
    if (type && !strcmp(type, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(n, "normalizers"))
            if (load_normalizer(t, it, err, errlen))
                return -1;
        return 0;
    }
    if (t->nnorm == (int)(sizeof t->norm / sizeof t->norm[0]))
        return tok_fail(err, errlen, "normalizer: more than %zu steps", sizeof t->norm / sizeof t->norm[0]);
    struct tok_norm_step *st = &t->norm[t->nnorm];
    static const char *const names[] = {NULL, "NFC", "NFKC", "NFD", "NFKD"};
    for (int k = 1; k <= 4; k++)
        if (type && !strcmp(type, names[k])) {
            st->type = (enum tok_norm)k;
            t->nnorm++;
            return 0;
        }
    if (type && !strcmp(type, "Prepend") && tok_str_of(n, "prepend")) {
        st->type = TOK_PREPEND;
        st->a = strdup(tok_str_of(n, "prepend"));
        st->alen = st->a ? strlen(st->a) : 0;
        t->nnorm++;
        return st->a ? 0 : tok_fail(err, errlen, "out of memory");
    }
    if (type && !strcmp(type, "Replace")) {
        const char *pat = tok_str_of(cJSON_GetObjectItemCaseSensitive(n, "pattern"), "String");
        const char *content = tok_str_of(n, "content");
        if (!pat || !pat[0] || !content)
            return tok_fail(err, errlen, "normalizer Replace is supported with a non-empty String pattern only");
        st->type = TOK_REPLACE;
        st->a = strdup(pat);
        st->b = strdup(content);
        st->alen = st->a ? strlen(st->a) : 0;
        st->blen = st->b ? strlen(st->b) : 0;
        t->nnorm++;
        return st->a && st->b ? 0 : tok_fail(err, errlen, "out of memory");
    }
    return tok_fail(err, errlen, "normalizer %s is not supported", type ? type : "(without a type)");
}

static pcre2_code *compile(const char *pattern, size_t len, int literal, char *err, size_t errlen)
{
    int code;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len,
                                   literal ? PCRE2_LITERAL | PCRE2_UTF : PCRE2_UTF | PCRE2_UCP, &code, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        tok_fail(err, errlen, "pre_tokenizer Split: pattern %s at offset %zu: %s", pattern, (size_t)at, (char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT (an error here) it is interpreted */
    return re;
}

/* GPT-2's pre-tokenization regex, what ByteLevel applies when use_regex is true. */
static const char GPT2_RE[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int load_pre(struct xtok *t, const cJSON *p, char *err, size_t errlen)
{
    if (!p || cJSON_IsNull(p))
        return 0;
    const char *type = tok_str_of(p, "type");
    if (type && !strcmp(type, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(p, "pretokenizers"))
            if (load_pre(t, it, err, errlen))
                return -1;
        return 0;
    }
    if (t->npre == (int)(sizeof t->pre / sizeof t->pre[0]))
        return tok_fail(err, errlen, "pre_tokenizer: more than %zu steps", sizeof t->pre / sizeof t->pre[0]);
    /* Hugging Face's ByteLevel rewrites each piece into its byte alphabet (a space is then "Ġ"), which a step
     * after it would see; here the bytes are mapped by the model, so ByteLevel must come last */
    if (t->npre && t->pre[t->npre - 1].type == TOK_PRE_BYTELEVEL)
        return tok_fail(err, errlen, "pre_tokenizer %.*s after ByteLevel is not supported", type ? tok_clip(type, strlen(type)) : 15,
                    type ? type : "(without a type)");
    struct tok_pre_step *s = &t->pre[t->npre];
    if (type && !strcmp(type, "Split")) {
        /* Hugging Face's SplitDelimiterBehavior, each of its five (a file without one is refused there too) */
        static const char *const behaviors[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext",
                                                "Contiguous"};
        const char *beh = tok_str_of(p, "behavior");
        int k = 0;
        while (beh && k < 5 && strcmp(beh, behaviors[k]))
            k++;
        if (!beh || k == 5)
            return tok_fail(err, errlen, "pre_tokenizer Split: behavior %.*s is not one of Isolated, Removed, "
                        "MergedWithPrevious, MergedWithNext, Contiguous", beh ? tok_clip(beh, strlen(beh)) : 6, beh ? beh : "(none)");
        s->behavior = (enum tok_split)k;
        s->invert = tok_bool_of(p, "invert");
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const char *rx = tok_str_of(pat, "Regex"), *lit = tok_str_of(pat, "String");
        if (!rx && !lit)
            return tok_fail(err, errlen, "pre_tokenizer Split without a Regex or String pattern");
        s->type = TOK_PRE_SPLIT;
        s->re = compile(rx ? rx : lit, strlen(rx ? rx : lit), !rx, err, errlen);
        if (!s->re)
            return -1;
        t->npre++;
        return 0;
    }
    if (type && !strcmp(type, "Digits")) {
        /* Hugging Face's digits.rs: a split on char::is_numeric (Unicode's N: Nd, Nl, No), each numeric
         * character its own piece (individual_digits: behaviour Isolated) or each run of them (Contiguous) -
         * which is a Split, Isolated, on \p{N} or \p{N}+ (Command R, Aya) */
        const cJSON *ind = cJSON_GetObjectItemCaseSensitive(p, "individual_digits");
        if (!cJSON_IsBool(ind)) /* a required field: Hugging Face refuses the file without it */
            return tok_fail(err, errlen, "pre_tokenizer Digits without individual_digits (true or false)");
        const char *rx = cJSON_IsTrue(ind) ? "\\p{N}" : "\\p{N}+";
        s->type = TOK_PRE_SPLIT;
        s->re = compile(rx, strlen(rx), 0, err, errlen);
        if (!s->re)
            return -1;
        t->npre++;
        return 0;
    }
    if (type && !strcmp(type, "Metaspace")) { /* Hugging Face's pre_tokenizers/metaspace.rs */
        const char *r = tok_str_of(p, "replacement"), *scheme = tok_str_of(p, "prepend_scheme");
        const cJSON *aps = cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space"), *split;
        size_t rl = r ? strlen(r) : 0;
        unsigned char b0 = rl ? (unsigned char)r[0] : 0;
        size_t cl = b0 < 0x80 ? 1 : (b0 & 0xE0) == 0xC0 ? 2 : (b0 & 0xF0) == 0xE0 ? 3 : (b0 & 0xF8) == 0xF0 ? 4 : 0;
        if (!rl || cl != rl)
            return tok_fail(err, errlen, "pre_tokenizer Metaspace: replacement must be one character");
        if (t->npre)
            return tok_fail(err, errlen, "pre_tokenizer Metaspace after another pre_tokenizer is not supported");
        s->type = TOK_PRE_METASPACE;
        memcpy(s->rep, r, rl);
        s->replen = rl;
        s->prepend = !scheme || !strcmp(scheme, "always") ? TOK_PREPEND_ALWAYS
                     : !strcmp(scheme, "first")            ? TOK_PREPEND_FIRST
                     : !strcmp(scheme, "never")            ? TOK_PREPEND_NEVER
                                                           : (enum tok_prepend)-1;
        if ((int)s->prepend < 0)
            return tok_fail(err, errlen, "pre_tokenizer Metaspace: prepend_scheme %s is not one of first, never, always",
                        scheme);
        if (cJSON_IsFalse(aps)) { /* the old form: false must say never (Hugging Face refuses the file otherwise) */
            if (s->prepend != TOK_PREPEND_NEVER)
                return tok_fail(err, errlen, "pre_tokenizer Metaspace: add_prefix_space does not match prepend_scheme");
        }
        split = cJSON_GetObjectItemCaseSensitive(p, "split");
        s->split = !split || cJSON_IsNull(split) || cJSON_IsTrue(split);
        t->npre++;
        return 0;
    }
    if (type && !strcmp(type, "ByteLevel")) {
        s->type = TOK_PRE_BYTELEVEL;
        s->add_prefix_space = tok_bool_of(p, "add_prefix_space");
        const cJSON *ur = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
        if (!ur || cJSON_IsTrue(ur)) { /* Hugging Face's default is true */
            s->re = compile(GPT2_RE, sizeof GPT2_RE - 1, 0, err, errlen);
            if (!s->re)
                return -1;
        }
        t->npre++;
        return 0;
    }
    return tok_fail(err, errlen, "pre_tokenizer %s is not supported", type ? type : "(without a type)");
}

static int has_bytelevel(const struct xtok *t)
{
    for (int i = 0; i < t->npre; i++)
        if (t->pre[i].type == TOK_PRE_BYTELEVEL)
            return 1;
    return 0;
}

static int load_post(struct xtok *t, const cJSON *p, char *err, size_t errlen)
{
    if (!p || cJSON_IsNull(p))
        return 0;
    const char *type = tok_str_of(p, "type");
    if (type && !strcmp(type, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(p, "processors"))
            if (load_post(t, it, err, errlen))
                return -1;
        return 0;
    }
    if (type && !strcmp(type, "ByteLevel"))
        return 0; /* offsets only: the ids are unchanged */
    if (!type || strcmp(type, "TemplateProcessing"))
        return tok_fail(err, errlen, "post_processor %s is not supported", type ? type : "(without a type)");
    if (t->prefix || t->suffix)
        return tok_fail(err, errlen, "post_processor: two TemplateProcessing steps");
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
    size_t cap = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, single) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        if (sp)
            cap += (size_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(specials, tok_str_of(sp, "id") ? tok_str_of(sp, "id") : ""), "ids"));
    }
    t->prefix = calloc(cap + 1, sizeof *t->prefix);
    t->suffix = calloc(cap + 1, sizeof *t->suffix);
    if (!t->prefix || !t->suffix)
        return tok_fail(err, errlen, "out of memory");
    int seen_a = 0;
    cJSON_ArrayForEach(it, single) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        const cJSON *sq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
        if (sq) {
            if (seen_a || !tok_str_of(sq, "id") || strcmp(tok_str_of(sq, "id"), "A"))
                return tok_fail(err, errlen, "post_processor TemplateProcessing: single must hold sequence A once");
            seen_a = 1;
        } else if (sp && tok_str_of(sp, "id")) {
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(specials, tok_str_of(sp, "id")), "ids");
            if (!cJSON_IsArray(ids))
                return tok_fail(err, errlen, "post_processor TemplateProcessing: special token %s has no ids",
                            tok_str_of(sp, "id"));
            const cJSON *id;
            cJSON_ArrayForEach(id, ids) {
                if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 4e9)
                    return tok_fail(err, errlen, "post_processor TemplateProcessing: bad id");
                if (seen_a)
                    t->suffix[t->nsuffix++] = (uint32_t)id->valuedouble;
                else
                    t->prefix[t->nprefix++] = (uint32_t)id->valuedouble;
            }
        } else {
            return tok_fail(err, errlen, "post_processor TemplateProcessing: an item of single is neither a "
                                     "SpecialToken nor a Sequence");
        }
    }
    if (!seen_a)
        return tok_fail(err, errlen, "post_processor TemplateProcessing: single without sequence A");
    return 0;
}

static int load_added(struct xtok *t, const cJSON *added, char *err, size_t errlen)
{
    size_t n = (size_t)cJSON_GetArraySize(added);
    t->added = calloc(n + 1, sizeof *t->added);
    if (!t->added)
        return tok_fail(err, errlen, "out of memory");
    const cJSON *it;
    /* ids as Hugging Face gives them at load (AddedVocabulary::add_tokens; the file's own only draw a warning there):
     * the id of the same content added before, else its id in the model's vocabulary, else the next one after the
     * vocabulary, in the file's order */
    uint32_t next = (uint32_t)t->model_entries;
    struct tok_map seen; /* content -> id of the added tokens so far */
    if (tok_map_init(&seen, n))
        return tok_fail(err, errlen, "out of memory");
    int rc = 0;
    cJSON_ArrayForEach(it, added) {
        const char *content = tok_str_of(it, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!content || !content[0] || !cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 2147483647.0) {
            rc = tok_fail(err, errlen, "added_tokens: an entry without content or id");
            break;
        }
        if (tok_bool_of(it, "single_word")) {
            rc = tok_fail(err, errlen, "added_tokens: %s is single_word, which is not supported yet", content);
            break;
        }
        struct tok_added *a = &t->added[t->nadded++];
        a->content = strdup(content);
        if (!a->content) {
            rc = tok_fail(err, errlen, "out of memory");
            break;
        }
        a->len = strlen(content);
        int32_t id_of = tok_map_get(&seen, content, a->len);
        if (id_of < 0)
            id_of = tok_map_get(&t->vocab_str, content, a->len);
        a->id = id_of >= 0 ? (uint32_t)id_of : next++;
        if (tok_map_put(&seen, content, a->len, (int32_t)a->id) < 0) {
            rc = tok_fail(err, errlen, "out of memory");
            break;
        }
        a->special = tok_bool_of(it, "special");
        a->normalized = tok_bool_of(it, "normalized");
        a->lstrip = tok_bool_of(it, "lstrip");
        a->rstrip = tok_bool_of(it, "rstrip");
        a->pattern = a->content;
        a->plen = a->len;
        char *normed = NULL;
        if (a->normalized && tok_normalize(t, a->content, a->len, &normed, &a->plen)) {
            rc = tok_fail(err, errlen, "added_tokens: %s cannot be normalized", content);
            break;
        }
        if (normed)
            a->pattern = normed;
        if (a->plen)
            t->added_first[a->normalized][(unsigned char)a->pattern[0]] = 1;
        tok_note_id(t, (long)a->id);
    }
    tok_map_free(&seen);
    if (rc)
        return rc;
    size_t bytes = 1;
    for (size_t i = 0; i < t->nadded; i++)
        bytes += t->added[i].plen;
    for (int k = 0; k < 2; k++) {
        t->trie[k] = calloc(bytes, sizeof *t->trie[k]);
        if (!t->trie[k])
            return tok_fail(err, errlen, "out of memory");
        t->trie[k][0].added = -1;
        t->ntrie[k] = 1;
    }
    for (size_t i = 0; i < t->nadded; i++) { /* the first of equal contents wins, as the scan it replaces did */
        struct tok_added *a = &t->added[i];
        int k = a->normalized;
        struct tok_tnode *nd = t->trie[k];
        uint32_t cur = 0;
        if (!a->plen) { /* normalized to nothing: matches nowhere */
            a->maximal = 0;
            continue;
        }
        for (size_t j = 0; j < a->plen; j++) {
            unsigned char b = (unsigned char)a->pattern[j];
            uint32_t c = nd[cur].child;
            while (c && nd[c].byte != b)
                c = nd[c].sibling;
            if (!c) {
                c = (uint32_t)t->ntrie[k]++;
                nd[c] = (struct tok_tnode){.sibling = nd[cur].child, .added = -1, .byte = b};
                nd[cur].child = c;
            }
            cur = c;
        }
        if (nd[cur].added < 0)
            nd[cur].added = (int32_t)i;
        a->maximal = (int)cur; /* its node, for the pass below */
    }
    for (size_t i = 0; i < t->nadded; i++) { /* a node with children: a longer token goes on from it */
        struct tok_added *a = &t->added[i];
        a->maximal = t->trie[a->normalized][a->maximal].child == 0;
    }
    for (int k = 0; k < 2; k++) { /* one first byte for all (e.g. '<'): encode finds candidates with memchr */
        int distinct = 0;
        t->added_only[k] = -1;
        for (int b = 0; b < 256; b++)
            if (t->added_first[k][b]) {
                distinct++;
                t->added_only[k] = b;
            }
        if (distinct > 1)
            t->added_only[k] = -1;
        else if (!distinct)
            t->added_only[k] = -2; /* none of this kind */
    }
    return 0;
}

struct xtok *xtok_load_json(const char *json, size_t len, char *err, size_t errlen)
{
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        tok_fail(err, errlen, "tokenizer.json is not JSON");
        return NULL;
    }
    struct xtok *t = calloc(1, sizeof *t);
    if (t)
        t->added_only[0] = t->added_only[1] = -2; /* no added tokens until load_added finds some */
    if (!t) {
        cJSON_Delete(root);
        tok_fail(err, errlen, "out of memory");
        return NULL;
    }
    int rc = load_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), err, errlen);
    rc = rc ? rc : load_pre(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), err, errlen);
    t->bytelevel = has_bytelevel(t);
    rc = rc ? rc : tok_load_model(t, cJSON_GetObjectItemCaseSensitive(root, "model"), err, errlen);
    rc = rc ? rc : load_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), err, errlen);
    rc = rc ? rc : load_post(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), err, errlen);
    cJSON_Delete(root);
    if (rc) {
        xtok_free(t);
        return NULL;
    }
    return t;
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0;
    *len = 0;
    for (;;) {
        if (*len == cap) {
            cap = cap ? cap * 2 : 1 << 20;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                errno = ENOMEM;
                return NULL;
            }
            buf = nb;
        }
        size_t got = fread(buf + *len, 1, cap - *len, f);
        if (!got)
            break;
        *len += got;
    }
    fclose(f);
    return buf;
}

static const char *special_of(const cJSON *cfg, const char *key, const char *dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v)) /* an AddedToken written out: {"content": ..., ...} */
        v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (cJSON_IsNull(v))
        return NULL;
    return cJSON_IsString(v) ? v->valuestring : dflt;
}

/* transformers' Llama, CodeLlama and Gemma fast tokenizers replace tokenizer.json's post-processor when they load:
 * BOS before the text if add_bos_token (default true), EOS after it if add_eos_token (default false), with the
 * config's bos_token/eos_token (update_post_processor). vLLM loads them so; DeepSeek V3 names LlamaTokenizerFast
 * with a ByteLevel post-processor, so its completions get a BOS that tokenizer.json alone does not add. */
static int apply_transformers_class(struct xtok *t, const cJSON *cfg, char *err, size_t errlen)
{
    static const char *const classes[][3] = {{"LlamaTokenizer", "<s>", "</s>"}, {"CodeLlamaTokenizer", "<s>", "</s>"},
                                             {"GemmaTokenizer", "<bos>", "<eos>"}};
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(cfg, "tokenizer_class");
    if (!cJSON_IsString(cls))
        return 0;
    int k = -1;
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(classes[i][0]);
        if (!strncmp(cls->valuestring, classes[i][0], n) &&
            (!cls->valuestring[n] || !strcmp(cls->valuestring + n, "Fast")))
            k = i;
    }
    if (k < 0)
        return 0;
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
    const cJSON *ae = cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token");
    int add_bos = cJSON_IsBool(ab) ? cJSON_IsTrue(ab) : 1, add_eos = cJSON_IsBool(ae) ? cJSON_IsTrue(ae) : 0;
    const char *names[2] = {special_of(cfg, "bos_token", classes[k][1]), special_of(cfg, "eos_token", classes[k][2])};
    int want[2] = {add_bos, add_eos};
    long ids[2] = {-1, -1};
    for (int i = 0; i < 2; i++)
        if (want[i] && (!names[i] || (ids[i] = xtok_token_id(t, names[i])) < 0))
            return tok_fail(err, errlen, "tokenizer_config.json: %s with %s but its %s (%s) is not a token",
                        cls->valuestring, i ? "add_eos_token" : "add_bos_token", i ? "eos_token" : "bos_token",
                        names[i] ? names[i] : "none");
    free(t->prefix);
    free(t->suffix);
    t->prefix = malloc(sizeof *t->prefix);
    t->suffix = malloc(sizeof *t->suffix);
    if (!t->prefix || !t->suffix)
        return tok_fail(err, errlen, "out of memory");
    t->nprefix = t->nsuffix = 0;
    if (add_bos)
        t->prefix[t->nprefix++] = (uint32_t)ids[0];
    if (add_eos)
        t->suffix[t->nsuffix++] = (uint32_t)ids[1];
    return 0;
}

struct xtok *xtok_load(const char *dir, char *err, size_t errlen)
{
    char path[4096];
    size_t len;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    char *buf = read_all(path, &len);
    if (!buf) {
        tok_fail(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    char why[512] = "";
    struct xtok *t = xtok_load_json(buf, len, why, sizeof why);
    free(buf);
    if (!t) {
        tok_fail(err, errlen, "%s: %s", path, why);
        return NULL;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    buf = read_all(path, &len); /* none: tokenizer.json alone */
    cJSON *cfg = buf ? cJSON_ParseWithLength(buf, len) : NULL;
    int unparsed = buf && !cfg;
    free(buf);
    if (unparsed) {
        tok_fail(err, errlen, "%s: not valid JSON", path);
        xtok_free(t);
        return NULL;
    }
    int rc = cfg ? apply_transformers_class(t, cfg, why, sizeof why) : 0;
    cJSON_Delete(cfg);
    if (rc) {
        tok_fail(err, errlen, "%s/%s", dir, why);
        xtok_free(t);
        return NULL;
    }
    return t;
}

void xtok_free(struct xtok *t)
{
    if (!t)
        return;
    tok_map_free(&t->vocab);
    tok_map_free(&t->vocab_str);
    tok_merges_free(&t->merges);
    for (int i = 0; i < t->npre; i++)
        pcre2_code_free(t->pre[i].re);
    for (int i = 0; i < t->nnorm; i++) {
        free(t->norm[i].a);
        free(t->norm[i].b);
    }
    for (size_t i = 0; i < t->nadded; i++) {
        if (t->added[i].pattern != t->added[i].content)
            free(t->added[i].pattern);
        free(t->added[i].content);
    }
    free(t->added);
    free(t->trie[0]);
    free(t->trie[1]);
    free(t->prefix);
    free(t->suffix);
    free(t);
}

size_t xtok_vocab_size(const struct xtok *t)
{
    return t->vocab_size;
}

long xtok_token_id(const struct xtok *t, const char *token)
{
    size_t len = strlen(token);
    for (size_t i = 0; i < t->nadded; i++)
        if (t->added[i].len == len && !memcmp(t->added[i].content, token, len))
            return t->added[i].id;
    return tok_map_get(&t->vocab_str, token, len);
}
