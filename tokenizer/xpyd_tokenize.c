/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_tokenize - a model directory's tokenizer, checked before it is deployed, and for scripts.
 *   xpyd_tokenize --tokenizer DIR [--add-special-tokens]      text on stdin -> its ids as one JSON array
 *   xpyd_tokenize --tokenizer DIR --jsonl [--add-special-tokens]  one JSON string per line -> one array per line
 *   xpyd_tokenize --tokenizer DIR --bench FILE [--seconds S]  MB/s and tokens/s encoding FILE line by line (and the
 *       milliseconds the model took to load)
 *   xpyd_tokenize --tokenizer DIR --chat [--ids] [--jsonl] [--chat-template FILE] [--trust-request-chat-template]
 *       an OpenAI chat request body on stdin -> the prompt its chat template renders, byte for byte (--ids: its
 *       token ids) */
#include "xpyd_tokenizer.h"
#include "xpyd_version.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f)
{
    fputs("usage: xpyd_tokenize --tokenizer DIR [--add-special-tokens] [--jsonl] [--truncate K]\n"
          "       xpyd_tokenize --tokenizer DIR --bench FILE [--seconds S]\n"
          "       xpyd_tokenize --tokenizer DIR --chat [--ids] [--jsonl] [--chat-template FILE]\n"
          "                     [--trust-request-chat-template]\n"
          "Reads text on stdin and prints its token ids as one JSON array (no special tokens unless\n"
          "--add-special-tokens: those the post-processor adds, as Hugging Face's add_special_tokens).\n"
          "--jsonl: each input line is a JSON string, each output line its ids. --truncate K: the ids cut to\n"
          "their last K, the special tokens kept (Hugging Face's left truncation: vLLM's truncate_prompt_tokens).\n"
          "--bench: encodes FILE's lines\n"
          "for S seconds (default 3) and prints MB/s and tokens/s (and load_ms: the model's load).\n"
          "--chat: stdin is an OpenAI chat request body (messages, tools, add_generation_prompt (default true),\n"
          "continue_final_message, chat_template_kwargs); prints the prompt DIR's chat template renders, exactly,\n"
          "with no newline added (--chat-template FILE: that template instead). --ids: its token ids (special\n"
          "tokens added only with --add-special-tokens or the body's add_special_tokens: true, as vLLM). With\n"
          "--jsonl, one body per line and one JSON string (or ids) per line; a body that fails gives\n"
          "{\"error\": \"...\"} on its line. A body's own chat_template (or chat_template_kwargs'), as vLLM:\n"
          "refused unless --trust-request-chat-template, then rendered instead (or, where the model's templates\n"
          "are named, the one it names).\n"
          "Exit status: 0, 1 (a model that does not load, input that is not UTF-8), 2 (a wrong argument).\n"
          "  --help, --version\n",
          f);
}

static char *read_all(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    for (size_t got; b && (got = fread(b + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb)
                free(b);
            b = nb;
        }
    }
    *len = n;
    return b;
}

static long truncate_to = -1; /* --truncate K: ids cut to their last K (the special tokens kept), -1: not cut */

static int print_ids(const struct xtok *t, const char *text, size_t len, int special)
{
    uint32_t *ids;
    size_t n;
    int rc = xtok_encode(t, text, len, special, &ids, &n);
    if (rc) {
        fprintf(stderr, "xpyd_tokenize: %s\n", rc == XTOK_EINVAL ? "the input is not valid UTF-8" : "out of memory");
        return 1;
    }
    if (truncate_to >= 0)
        n = xtok_truncate_left(t, ids, n, (size_t)truncate_to, special);
    putchar('[');
    for (size_t i = 0; i < n; i++)
        printf(i ? ",%u" : "%u", ids[i]);
    putchar(']');
    free(ids);
    return 0;
}

/* Whether a JSON line holds the escape \u0000 (an odd run of backslashes before "u0000"). */
static int has_escaped_nul(const char *s, size_t n)
{
    for (size_t i = 0; i + 5 < n; i++) {
        if (s[i] != '\\' || memcmp(s + i + 1, "u0000", 5))
            continue;
        size_t k = i;
        while (k > 0 && s[k - 1] == '\\')
            k--;
        if ((i - k) % 2 == 0)
            return 1;
    }
    return 0;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int bench(const struct xtok *t, const char *path, double seconds, double load_s)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    size_t len;
    char *text = read_all(f, &len);
    fclose(f);
    if (!text)
        return 1;
    if (!len) { /* nothing to measure: not a rate of zero */
        fprintf(stderr, "xpyd_tokenize: %s is empty\n", path);
        free(text);
        return 1;
    }
    double t0 = now(), t1;
    size_t bytes = 0, tokens = 0, rounds = 0;
    do {
        for (char *p = text, *end = text + len; p < end;) {
            char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t l = nl ? (size_t)(nl - p + 1) : (size_t)(end - p);
            uint32_t *ids;
            size_t n;
            if (xtok_encode(t, p, l, 0, &ids, &n)) {
                fprintf(stderr, "xpyd_tokenize: %s: a line is not valid UTF-8\n", path);
                free(text);
                return 1;
            }
            free(ids);
            tokens += n;
            bytes += l;
            p += l;
        }
        rounds++;
        t1 = now();
    } while (t1 - t0 < seconds);
    printf("{\"bytes\":%zu,\"tokens\":%zu,\"rounds\":%zu,\"seconds\":%.3f,\"mb_per_s\":%.2f,\"tokens_per_s\":%.0f,"
           "\"load_ms\":%.1f}\n",
           bytes, tokens, rounds, t1 - t0, bytes / (t1 - t0) / 1e6, tokens / (t1 - t0), load_s * 1e3);
    free(text);
    return 0;
}

/* One chat request body: its rendered prompt (or ids) printed; with jsonl a failure is an {"error"} line. */
static int chat_one(const struct xtok_chat *chat, const struct xtok *t, const char *body, size_t len, int ids,
                    int special, int jsonl, int trust)
{
    char err[1024];
    char *text = NULL;
    size_t n = 0;
    int nul = has_escaped_nul(body, len); /* cJSON would cut the string there */
    cJSON *req = nul ? NULL : cJSON_ParseWithLength(body, len);
    xtok_json_literals(req, body, len); /* its numbers as vLLM's json.loads reads them */
    int rc = 0, why;
    struct xtok_chat *mine = NULL;
    const struct xtok_chat *use;
    if (!cJSON_IsObject(req)) {
        snprintf(err, sizeof err, nul ? "a string with \\u0000 is not supported" : "the request body is not a JSON object");
        rc = -1;
    } else if (!(use = xtok_chat_for_request(chat, req, trust, &mine, &why, err, sizeof err))) {
        rc = -1;
    } else {
        rc = xtok_chat_render(use, req, NULL, &text, &n, err, sizeof err);
    }
    xtok_chat_free(mine);
    if (rc == 0 && ids) {
        const cJSON *as = cJSON_GetObjectItemCaseSensitive(req, "add_special_tokens");
        rc = print_ids(t, text, n, special || cJSON_IsTrue(as));
    } else if (rc == 0 && jsonl) {
        cJSON *s = cJSON_CreateString(text);
        char *j = s ? cJSON_PrintUnformatted(s) : NULL;
        if (j && strlen(text) == n)
            fputs(j, stdout);
        else
            printf("{\"error\":\"the rendered prompt holds a NUL byte\"}");
        free(j);
        cJSON_Delete(s);
    } else if (rc == 0) {
        fwrite(text, 1, n, stdout);
    } else if (jsonl) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "error", err);
        char *j = cJSON_PrintUnformatted(e);
        fputs(j, stdout);
        free(j);
        cJSON_Delete(e);
        rc = 0;
    } else {
        fprintf(stderr, "xpyd_tokenize: %s\n", err);
        rc = 1;
    }
    free(text);
    cJSON_Delete(req);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *bench_file = NULL, *chat_template = NULL;
    int special = 0, jsonl = 0, chat = 0, ids = 0, trust = 0;
    double seconds = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--add-special-tokens"))
            special = 1;
        else if (!strcmp(argv[i], "--truncate") && i + 1 < argc && atol(argv[i + 1]) >= 0 &&
                 strspn(argv[i + 1], "0123456789") == strlen(argv[i + 1]))
            truncate_to = atol(argv[++i]);
        else if (!strcmp(argv[i], "--jsonl"))
            jsonl = 1;
        else if (!strcmp(argv[i], "--chat"))
            chat = 1;
        else if (!strcmp(argv[i], "--ids"))
            ids = 1;
        else if (!strcmp(argv[i], "--trust-request-chat-template"))
            trust = 1;
        else if (!strcmp(argv[i], "--chat-template") && i + 1 < argc)
            chat_template = argv[++i];
        else if (!strcmp(argv[i], "--bench") && i + 1 < argc)
            bench_file = argv[++i];
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc && atof(argv[i + 1]) > 0)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--version")) {
            xpyd_print_version("xpyd_tokenize");
            return 0;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "xpyd_tokenize: unknown or incomplete argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!dir || ((ids || chat_template || trust) && !chat)) {
        usage(stderr);
        return 2;
    }
    char err[1024];
    struct xtok *t = NULL;
    double load_s = now(); /* (--bench reports it) */
    if ((!chat || ids) && !(t = xtok_load(dir, err, sizeof err))) {
        fprintf(stderr, "xpyd_tokenize: %s\n", err);
        return 1;
    }
    load_s = now() - load_s;
    int rc = 0;
    if (chat) {
        struct xtok_chat *c = xtok_chat_load(dir, chat_template, err, sizeof err);
        if (!c) {
            fprintf(stderr, "xpyd_tokenize: %s\n", err);
            xtok_free(t);
            return 1;
        }
        if (jsonl) {
            char *line = NULL;
            size_t cap = 0;
            ssize_t n;
            while (!rc && (n = getline(&line, &cap, stdin)) > 0) {
                rc = chat_one(c, t, line, (size_t)n, ids, special, 1, trust);
                putchar('\n');
            }
            free(line);
        } else {
            size_t len;
            char *body = read_all(stdin, &len);
            rc = body ? chat_one(c, t, body, len, ids, special, 0, trust) : 1;
            free(body);
        }
        xtok_chat_free(c);
    } else if (bench_file) {
        rc = bench(t, bench_file, seconds, load_s);
    } else if (jsonl) {
        char *line = NULL;
        size_t cap = 0;
        ssize_t n;
        while (!rc && (n = getline(&line, &cap, stdin)) > 0) {
            cJSON *s = cJSON_ParseWithLength(line, (size_t)n);
            if (!cJSON_IsString(s)) {
                fprintf(stderr, "xpyd_tokenize: --jsonl: a line is not a JSON string\n");
                rc = 1;
            } else if (has_escaped_nul(line, (size_t)n)) { /* the JSON reader would cut the string there */
                fprintf(stderr, "xpyd_tokenize: --jsonl: a string with \\u0000 is not supported\n");
                rc = 1;
            } else {
                rc = print_ids(t, s->valuestring, strlen(s->valuestring), special);
                putchar('\n');
            }
            cJSON_Delete(s);
        }
        free(line);
    } else {
        size_t len;
        char *text = read_all(stdin, &len);
        rc = text ? print_ids(t, text, len, special) : 1;
        free(text);
    }
    xtok_free(t);
    return rc;
}
