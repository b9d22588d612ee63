/* SPDX-License-Identifier: Apache-2.0 */
/* sim_main.c - xpyd_sim command line: its settings table (the router's machinery, common/xpyd_settings.c)
 * fills a sim_config, then the simulator runs. */
#include "sim.h"
#include "sim_tokens.h"
#include "xpyd_tokenizer.h"
#include "sim_chat.h"

#include "xpyd_settings.h"
#include "xpyd_util.h"
#include "xpyd_version.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const roles[] = {"both", "prefill", "decode", NULL};
static const char *const dp_modes[] = {"external", "internal", NULL};
static const char *const log_levels[] = {"none", "error", "warn", "info", "debug", NULL};
static const char *const on_off[] = {"off", "on", NULL};
static const char *const prefill_computes[] = {"parallel", "serial", NULL};
static const char *const kv_formats[] = {"map", "array", "sglang", NULL};
static const char *const tls_versions[] = {"1.2", "1.3", NULL};

#define F(m) XPYD_FIELD(struct sim_config, m)
/* xpyd_sim's settings, one row each (common/xpyd_settings.h, the same machinery as the router's table). */
static const struct xpyd_setting settings[] = {
    {"role", XS_ENUM, F(role), 0, 0, "both", roles, "engine role in PD disaggregation"},
    {"host", XS_STR, F(host), 0, 0, "127.0.0.1", NULL, "listen address (IPv6 like `::1` works)"},
    {"port", XS_LONG, F(port), 0, 65535, "8000", NULL,
     "listen port; 0 = any free port (with `--dp-size 1` or `--dp-mode internal`)"},
    {"port-file", XS_STR, F(port_file), 0, 0, "", NULL,
     "write the bound port here once listening (readiness for scripts); a bootstrap listener's port follows on a "
     "second line"},
    {"model", XS_STR, F(model), 0, 0, "sim-model", NULL, "served model name"},
    {"lora-modules", XS_STR, F(lora_modules), 0, 0, "", NULL,
     "LoRA adapters served besides the model, `NAME[=PATH]` separated by commas (vLLM's flag, simplified): "
     "requests may name them and `GET /v1/models` lists them with the model as their parent, as vLLM does"},
    {"max-model-len", XS_LONG, F(max_model_len), 1, 1L << 30, "8192", NULL, "context length: prompt + max_tokens limit"},
    {"seed", XS_LONG, F(seed), 0, 9.2e18, "0", NULL, "seed of the generated tokens; prefill and decode must share it"},
    {"dp-size", XS_LONG, F(dp_size), 1, 1024, "1", NULL, "data-parallel ranks"},
    {"dp-mode", XS_ENUM, F(dp_internal), 0, 0, "external", dp_modes,
     "external: rank r listens on port+r; internal: one port, rank pinned by `X-data-parallel-rank`, else least busy"},
    {"prefill-us-per-token", XS_LONG, F(prefill_us_per_token), 0, 10000000, "20", NULL,
     "prefill compute time per prompt token, µs (0 = instant)"},
    {"decode-us-per-token", XS_LONG, F(decode_us_per_token), 0, 10000000, "2000", NULL,
     "inter-token latency, µs (0 = as fast as possible)"},
    {"max-batch", XS_LONG, F(max_batch), 1, 1000000, "256", NULL, "running requests per rank; the rest wait"},
    {"kv-capacity-tokens", XS_LONG, F(kv_capacity_tokens), 0, 1099511627776.0, "0", NULL,
     "KV tokens a rank holds; a request waits until its prompt fits (0: no limit)"},
    {"decode-ns-per-kv-token", XS_LONG, F(decode_ns_per_kv_token), 0, 1000000, "0", NULL,
     "each decode step takes this much longer per KV token the rank holds"},
    {"prefix-caching", XS_ENUM, F(prefix_caching), 0, 0, "off", on_off,
     "automatic prefix caching per rank, a model of vLLM's block pool: `--num-gpu-blocks` blocks of "
     "`--block-size` tokens named by chained hashes of the prompt's token ids, the least recently used free block "
     "evicted first (docs/SIMULATOR.md); a prefill computes only the uncached tokens (at most all "
     "but one block's worth are reused), usage reports `prompt_tokens_details.cached_tokens`, KV a decode "
     "receives becomes cached there; `vllm:prefix_cache_queries_total` / `_hits_total` count tokens"},
    {"prefill-compute", XS_ENUM, F(prefill_serial), 0, 0, "parallel", prefill_computes,
     "`parallel`: every prompt computes at --prefill-us-per-token at once (no contention); `serial`: a rank "
     "computes one prompt at a time, in arrival order (a compute-bound GPU: prefill throughput is "
     "1 / --prefill-us-per-token tokens per second per rank, and queued prompts wait)"},
    {"block-size", XS_LONG, F(block_size), 1, 4096, "16", NULL, "tokens per KV block (prefix caching)"},
    {"num-gpu-blocks", XS_LONG, F(num_gpu_blocks), 1, 1L << 30, "4096", NULL,
     "KV blocks per rank the prefix cache may hold (shown in `vllm:cache_config_info`)"},
    {"kv-events", XS_STR, F(kv_events), 0, 0, "", NULL,
     "with `--prefix-caching on`: publish KV events as vLLM's ZMQ KV-event publisher does (ZeroMQ PUB, "
     "e.g. `tcp://*:5557`; an endpoint with `*` binds, any other connects; DP rank r on its port + r): three "
     "frames per batch (topic, 8-byte big-endian sequence number from 0, msgpack KVEventBatch), BlockStored "
     "with token ids and 32-byte SHA-256 block hashes chained on the parent's (a stand-in for vLLM's "
     "sha256_cbor), BlockRemoved on eviction, AllBlocksCleared on `POST /reset_prefix_cache`; \"\" = off"},
    {"kv-events-format", XS_ENUM, F(kv_events_format), 0, 0, "map", kv_formats,
     "`map`: events as maps with a \"type\" key (current vLLM and SGLang); `array`: positional arrays led by the "
     "class name, trailing defaults omitted (vLLM before mid-2026); `sglang`: as SGLang's radix cache publishes "
     "them, arrays with a BlockStored and a BlockRemoved per block (its pages; `--block-size 1` is SGLang's "
     "default `--page-size`), hashes as signed 64-bit integers, a salted request's `{\"cache_salt\": S}` after "
     "the medium"},
    {"kv-events-replay", XS_STR, F(kv_events_replay), 0, 0, "", NULL,
     "vLLM's `replay_endpoint` (a ROUTER socket, rank r on its port + r): an 8-byte start sequence number is "
     "answered with the buffered (seq, payload) pairs from it, then seq -1 and an empty payload"},
    {"kv-events-topic", XS_STR, F(kv_events_topic), 0, 0, "", NULL, "the topic frame of every message"},
    {"kv-events-buffer", XS_LONG, F(kv_events_buffer), 1, 1000000, "10000", NULL,
     "batches each rank keeps for replays (vLLM's `buffer_steps`)"},
    {"handoff", XS_ENUM, F(handoff), 0, 0, "kv-params", sim_handoff_names,
     "PD handoff this engine speaks (xpyd: kv-params with the KV moved by libxpyd_transfer; mooncake: vLLM's "
     "MooncakeConnector, `/query` served on the bootstrap port)"},
    {"store-dir", XS_STR, F(store_dir), 0, 0, "/tmp/xpyd-sim-store", NULL, "KV store shared by sims in store mode"},
    {"store-wait-ms", XS_LONG, F(store_wait_ms), 0, 3600000, "10000", NULL,
     "decode polls the store this long, then recomputes"},
    {"handoff-timeout-ms", XS_LONG, F(handoff_timeout_ms), 1, 3600000, "10000", NULL,
     "decode gives up a KV pull / bootstrap rendezvous after this"},
    {"kv-lease-ms", XS_LONG, F(lease_ms), 1, 3600000, "30000", NULL,
     "a prefill holds unpulled KV this long, then it is stranded"},
    {"kv-bytes-per-token", XS_LONG, F(kv_bytes_per_token), 1, 1 << 20, "64", NULL, "simulated KV size per prompt token"},
    {"bootstrap-port", XS_LONG, F(bootstrap_port), -1, 65535, "-1", NULL,
     "the bootstrap server: a listener serving only KV pulls and `/query`. -1: a prefill (or `both`) in "
     "`bootstrap` and `mooncake` modes gets one on a free port (the port file's second line), others none; "
     "0: none, the HTTP port serves them"},
    {"fail-rate", XS_DOUBLE, F(fail_rate), 0, 1, "0", NULL, "answer 500 to this fraction of generate requests"},
    {"status-code", XS_LONG, F(status_code), 0, 599, "0", NULL,
     "answer every generate request with this status (100-599; 0: off)"},
    {"stream-buffer-bytes", XS_LONG, F(stream_buffer_bytes), 4096, 1L << 30, "262144", NULL,
     "a stream whose reader is not taking its bytes stops generating once this many wait in the engine, and "
     "goes on when they drain below it (a server's send waits for its socket likewise): a paused reader "
     "costs the engine this much per stream, not the whole answer"},
    {"fail-after-tokens", XS_LONG, F(fail_after_tokens), -1, 1L << 30, "-1", NULL,
     "close the connection after N generated tokens (-1: off)"},
    {"recompute-after-tokens", XS_LONG, F(recompute_after_tokens), -1, 1L << 30, "-1", NULL,
     "decode/both: give each request up after N tokens as a preempted engine does: the last chunk has "
     "`finish_reason: abort, stop_reason: recomputed` (-1: off)"},
    {"stall-ms", XS_LONG, F(stall_ms), 0, 3600000, "0", NULL, "hold each generate request N ms before doing anything"},
    {"startup-delay-ms", XS_LONG, F(startup_delay_ms), 0, 600000, "0", NULL, "wait N ms before listening for HTTP (the KV-event publisher, like vLLM's engine core, is up before it)"},
    {"eos-prob", XS_DOUBLE, F(eos_prob), 0, 1, "0", NULL, "chance per token of an early EOS unless `ignore_eos` (0: never)"},
    {"max-body-bytes", XS_LONG, F(max_body_bytes), 1024, 1L << 30, "16777216", NULL, "largest request body accepted"},
    {"log-level", XS_ENUM, F(log_level), 0, 0, "info", log_levels, "none, error, warn, info, debug"},
    {"tls-cert", XS_STR, F(tls_cert), 0, 0, "", NULL,
     "serve HTTPS on every listener with this certificate (PEM, then its chain); needs --tls-key"},
    {"tls-key", XS_STR, F(tls_key), 0, 0, "", NULL, "the private key of --tls-cert (PEM)"},
    {"tls-client-ca", XS_STR, F(tls_client_ca), 0, 0, "", NULL,
     "mutual TLS: clients must present a certificate this CA bundle signed"},
    {"tls-min-version", XS_ENUM, F(tls_min_version), 0, 0, "1.2", tls_versions, "oldest TLS version: 1.2 or 1.3"},
    {"upstream-ca", XS_STR, F(upstream_ca), 0, 0, "", NULL,
     "set: this engine's own requests to peers (KV pulls, releases) use TLS, verified against this CA bundle"},
    {"upstream-cert", XS_STR, F(upstream_cert), 0, 0, "", NULL, "client certificate for those requests (mutual TLS)"},
    {"upstream-key", XS_STR, F(upstream_key), 0, 0, "", NULL, "the private key of --upstream-cert"},
    {"register", XS_STR, F(register_url), 0, 0, "", NULL,
     "`etcd://HOST:PORT[,...]/PREFIX`: register this engine for routers started with `--discovery` while its "
     "own `/health` passes (xpyd_register's code: a lease kept alive, revoked on SIGTERM, expiring if killed); "
     "the value carries dp, max_model_len, max_inflight (= --max-batch), bootstrap_port and tls; role `both` "
     "registers in both pools; with --tls-cert the check needs --upstream-ca"},
    {"register-host", XS_STR, F(register_host), 0, 0, "", NULL,
     "the host routers should connect to (default: --host)"},
    {"register-ttl-s", XS_LONG, F(register_ttl_s), 2, 3600, "5", NULL,
     "lease TTL of the registration: a killed simulator disappears from routers this long after"},
    {"tokenizer", XS_STR, F(tokenizer), 0, 0, "", NULL,
     "a Hugging Face model directory: prompts are token ids of its tokenizer.json (libxpyd_tokenizer), as a "
     "real engine counts them, instead of one id per word: usage, --max-model-len, /tokenize and the prefix "
     "cache see them. A completion's prompt gets the special tokens (BOS) as vLLM adds them (unless "
     "add_special_tokens is false); a chat request is rendered with the model's chat template as vLLM renders "
     "it (sim_chat.c: messages and tools as vLLM passes them), without special tokens unless add_special_tokens "
     "is true (a model without a template: a role token and the text per message); text that is not UTF-8 or "
     "a template that refuses the conversation gets 400"},
    {"trust-request-chat-template", XS_ENUM, F(trust_request_chat_template), 0, 0, "off", on_off,
     "with `--tokenizer`, as vLLM's `--trust-request-chat-template`: a chat request's own `chat_template` (or "
     "`chat_template_kwargs`' `chat_template`, which wins) is rendered instead of the model's (a name among the "
     "model's named templates picks that one); off: such a request gets vLLM's 400"},
    {"request-chat-template-cache-bytes", XS_LONG, F(request_chat_template_cache_bytes), 0, 1L << 30, "4194304",
     NULL,
     "with `--trust-request-chat-template on`: request templates kept compiled for the next requests that bring "
     "them, as transformers' cache of compiled templates keeps them for vLLM, in at most this much memory (each "
     "its source and tree, 64 KiB at least), least recently used out; 0 = each request compiles its own"},
};
#define NSETTINGS (sizeof settings / sizeof settings[0])

void sim_config_defaults(struct sim_config *c)
{
    memset(c, 0, sizeof *c);
    if (xpyd_settings_defaults(c, settings, NSETTINGS, "xpyd_sim") != 0)
        abort(); /* a row that does not fit its field: a bug, caught by every test */
}

static void usage(FILE *f)
{
    fputs("usage: xpyd_sim [options]\n"
          "A simulated vLLM engine (OpenAI API, PD handoff, DP ranks, faults) for testing xpyd without GPUs.\n\n",
          f);
    xpyd_settings_usage(f, settings, NSETTINGS);
    fputs("  -h, --help                   this text\n  --version                    version and git revision\n", f);
}

/* --name VALUE or --name=VALUE for every row of the table; -h/--help and --version. */
static int parse_args(int argc, char **argv, struct sim_config *c)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--version")) {
            xpyd_print_version("xpyd_sim");
            exit(0);
        }
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "xpyd_sim: unexpected argument '%s'\n", a);
            return -1;
        }
        char name[64];
        const char *eq = strchr(a + 2, '='), *v;
        size_t nl = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        snprintf(name, sizeof name, "%.*s", (int)(nl < sizeof name ? nl : sizeof name - 1), a + 2);
        const struct xpyd_setting *s = nl < sizeof name ? xpyd_setting_find(settings, NSETTINGS, name) : NULL;
        if (!s || (!eq && i + 1 >= argc)) {
            fprintf(stderr, "xpyd_sim: unknown or incomplete option '%s' (see --help)\n", a);
            return -1;
        }
        v = eq ? eq + 1 : argv[++i];
        if (xpyd_setting_set(c, s, v, "xpyd_sim") != 0)
            return -1;
    }
    if (c->status_code != 0 && c->status_code < 100) {
        fprintf(stderr, "xpyd_sim: --status-code needs 100-599 (or 0: off), got %d\n", c->status_code);
        return -1;
    }
    if (c->port == 0 && !c->dp_internal && c->dp_size > 1) {
        fprintf(stderr, "xpyd_sim: --port 0 needs --dp-size 1 or --dp-mode internal\n");
        return -1;
    }
    if (!c->dp_internal && c->port + c->dp_size - 1 > 65535) {
        fprintf(stderr, "xpyd_sim: port + dp-size - 1 exceeds 65535\n");
        return -1;
    }
    return 0;
}

static int encode(void *arg, const char *text, size_t len, int add_special, uint32_t **ids, size_t *n)
{
    return xtok_encode(arg, text, len, add_special, ids, n);
}

static size_t truncate_left(void *arg, uint32_t *ids, size_t n, size_t k, int special)
{
    return xtok_truncate_left(arg, ids, n, k, special);
}

static struct xtok *tok;
static struct xtok_chat *chat;
static int trust_request_templates;

/* A chat request's prompt: rendered as vLLM renders it (sim_chat.c; the request's own template as vLLM takes it),
 * encoded (special tokens only on request) */
static int chat_ids(void *arg, const cJSON *root, uint32_t **ids, size_t *n, char *err, size_t cap)
{
    char *text;
    size_t len;
    int why;
    struct xtok_chat *mine;
    const struct xtok_chat *use = xtok_chat_for_request(chat, root, trust_request_templates, &mine, &why, err, cap);
    int r = use ? sim_chat_render(use, root, &text, &len, err, cap) : -1;
    xtok_chat_free(mine);
    if (r != 0)
        return -1;
    int rc = xtok_encode(tok, text, len, cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "add_special_tokens")),
                         ids, n);
    free(text);
    if (rc)
        snprintf(err, cap, "the prompt is not valid UTF-8");
    return rc ? -1 : 0;
}

int main(int argc, char **argv)
{
    struct sim_config c;
    sim_config_defaults(&c);
    if (parse_args(argc, argv, &c) != 0)
        return 2;
    if (c.tokenizer[0]) {
        char err[1024];
        tok = xtok_load(c.tokenizer, err, sizeof err);
        if (!tok) {
            fprintf(stderr, "xpyd_sim: --tokenizer: %s\n", err);
            return 2;
        }
        sim_tokens_set_encoder(encode, tok);
        sim_tokens_set_truncate(truncate_left, tok);
        trust_request_templates = c.trust_request_chat_template;
        if ((chat = xtok_chat_load(c.tokenizer, NULL, err, sizeof err))) {
            /* trusted request templates kept compiled, as transformers' lru_cache keeps vLLM's */
            if (trust_request_templates &&
                xtok_chat_keep_request_templates(chat, (size_t)c.request_chat_template_cache_bytes) != 0) {
                fprintf(stderr, "xpyd_sim: out of memory\n");
                return 1;
            }
            sim_tokens_set_chat(chat_ids, NULL);
            sim_tokens_set_literals(xtok_json_literals);
        }
        else /* chat requests: role tokens and text, as without a template */
            fprintf(stderr, "xpyd_sim: --tokenizer: no chat template (%s)\n", err);
    }
    int rc = sim_run(&c);
    xtok_chat_free(chat);
    xtok_free(tok);
    return rc;
}
