/* SPDX-License-Identifier: Apache-2.0 */
/* tok_json.c - a request's numbers as Python's json.loads reads them (xtok_json_literals, xpyd_tokenizer.h). cJSON
 * keeps a double for every number, so "1.0" and "1" are the same node and an integer past 2^53 is rounded; vLLM's
 * template gets a float for the first (printed "1.0", by tojson too) and an exact int for the others. The text is
 * walked beside the tree cJSON made of it, value for value (cJSON keeps every member, repeated keys too, in order),
 * and a number written as a float, or an integer too long for a double, keeps its literal in its node's
 * valuestring (which cJSON frees and copies with the node, and prints nothing from); the template's values read
 * it (tpl_value.c). */
#include "xpyd_tokenizer.h"

#include <cjson/cJSON.h>
#include <string.h>

struct walk {
    const char *p, *e;
};

static void ws(struct walk *s)
{
    while (s->p < s->e && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static int at(struct walk *s, char c)
{
    ws(s);
    if (s->p >= s->e || *s->p != c)
        return 0;
    s->p++;
    return 1;
}

/* a string: its closing quote found by memchr (a conversation is mostly strings), escaped when an odd run of
 * backslashes is before it */
static int string(struct walk *s)
{
    if (!at(s, '"'))
        return -1;
    for (;;) {
        const char *q = memchr(s->p, '"', (size_t)(s->e - s->p));
        if (!q)
            return -1;
        size_t bs = 0;
        while (q - bs > s->p && q[-1 - (long)bs] == '\\')
            bs++;
        s->p = q + 1;
        if (!(bs & 1))
            return 0;
    }
}

static int word(struct walk *s, const char *w)
{
    size_t n = strlen(w);
    ws(s);
    if ((size_t)(s->e - s->p) < n || memcmp(s->p, w, n))
        return -1;
    s->p += n;
    return 0;
}

static int number(struct walk *s, cJSON *node)
{
    ws(s);
    const char *b = s->p;
    int fl = 0;
    for (; s->p < s->e && *s->p && strchr("+-0123456789.eE", *s->p); s->p++)
        fl |= *s->p == '.' || *s->p == 'e' || *s->p == 'E';
    size_t n = (size_t)(s->p - b), digits = n - (n && *b == '-');
    if (!digits)
        return -1;
    if (fl || digits > 15) { /* (15 digits are exact in a double) */
        char *l = cJSON_malloc(n + 1); /* (cJSON's allocator: cJSON_Delete frees it) */
        if (!l)
            return -1;
        memcpy(l, b, n);
        l[n] = '\0';
        cJSON_free(node->valuestring);
        node->valuestring = l;
    }
    return 0;
}

static int value(struct walk *s, cJSON *node, int depth)
{
    if (!node || depth > 10000)
        return -1;
    switch (node->type & 0xFF) {
    case cJSON_Object:
    case cJSON_Array: {
        int obj = (node->type & 0xFF) == cJSON_Object;
        if (!at(s, obj ? '{' : '['))
            return -1;
        for (cJSON *it = node->child; it; it = it->next) {
            if (it != node->child && !at(s, ','))
                return -1;
            if (obj && (string(s) || !at(s, ':')))
                return -1;
            if (value(s, it, depth + 1))
                return -1;
        }
        return at(s, obj ? '}' : ']') ? 0 : -1;
    }
    case cJSON_String:
        return string(s);
    case cJSON_Number:
        return number(s, node);
    case cJSON_True:
        return word(s, "true");
    case cJSON_False:
        return word(s, "false");
    case cJSON_NULL:
        return word(s, "null");
    default:
        return -1;
    }
}

void xtok_json_literals(cJSON *tree, const char *src, size_t len)
{
    struct walk s = {src, src + len};
    if (tree && src)
        value(&s, tree, 0);
}
