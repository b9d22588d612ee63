/* SPDX-License-Identifier: Apache-2.0 */
/* config.c - xpyd_router's settings: the one table of them (name, type, field, range, default, text), what reads
 * it (--help, the reference, setting by name, the defaults, which handoff modes read which), and printing,
 * comparing and freeing a configuration. Loading is config_load.c, the file config_file.c, the pools
 * config_topology.c. */
#include "config.h"
#include "config_internal.h"

#include "handoff_traits.h"
#include "xb.h"
#include "xpyd_settings.h"
#include "xpyd_util.h"
#include "xpyd_version.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const first_tokens[] = {"decode", "prefill", NULL};
static const char *const dp_modes[] = {"external", "internal", NULL};
static const char *const log_levels[] = {"none", "error", "warn", "info", "debug", NULL};
static const char *const access_logs[] = {"off", "logfmt", "json", NULL};
static const char *const on_off[] = {"off", "on", NULL};
static const char *const learn_modes[] = {"auto", "on", "off", NULL};
static const char *const metadata_backends[] = {"memory", "etcd", NULL};
static const char *const tls_versions[] = {"1.2", "1.3", NULL};

#define OFF(f) XPYD_FIELD(struct rt_config, f)
/* The one table of scalar settings (common/xpyd_settings.h): flag name (JSON key: the same with '_'), type,
 * field, range, default, choices, text. */
static const struct xpyd_setting settings[] = {
    {"host", XS_STR, OFF(listen_host), 0, 0, "127.0.0.1", NULL,
     "listen address (IPv6 as `::1`)"},
    {"port", XS_LONG, OFF(listen_port), 0, 65535, "8000", NULL,
     "listen port; 0 = any free port (see `--port-file`)"},
    {"threads", XS_LONG, OFF(threads), 1, 256, "2", NULL,
     "event-loop threads serving clients (each owns its upstream connection pools)"},
    {"handoff", XS_ENUM, OFF(handoff), 0, 0, "kv-params", rt_handoff_names,
     "`kv-params` (vLLM NixlConnector, vllm-ascend MooncakeConnectorV1), `mooncake` (upstream vLLM "
     "MooncakeConnector: both legs at once meeting on `transfer_id`; prefill DP ranks and engine ids from "
     "`GET /query` on each prefill's bootstrap port), `store` (MooncakeStoreConnector, also the vLLM v0 "
     "MooncakeConnector's kv_buffer flow), "
     "`bootstrap` (SGLang), `none` (no prefill leg: the decode pool serves whole requests, an aggregated "
     "deployment; `-p` optional), `xpyd` (the kv-params flow with the KV moved by libxpyd_transfer: the "
     "prefill's `kv_transfer_params` carry `xpyd_segment`/`xpyd_addr`/`xpyd_len`/`xpyd_key`, the decode "
     "reads through its engine and asks the prefill to release; when no decode took the KV the router "
     "sends the release itself through its own engine from a helper thread; per handoff the decode's "
     "`X-KV-Transfer: bytes=N; us=T` feeds `xpyd_kv_handoff_seconds` and `xpyd_kv_bytes_total`)"},
    {"migration-limit", XS_LONG, OFF(migration_limit), 0, 16, "1", NULL,
     "streams: times a request whose decode fails after tokens were sent (connection lost, stream idle "
     "timeout, truncated stream, engine preemption `stop_reason: recomputed`) goes on at another decode as a "
     "continuation (prompt + the text sent so far, max/min tokens reduced; the decode computes it); the client's "
     "stream continues with no second role chunk, the same id, and usage as one engine would count it "
     "(`xpyd_migrations_total`); 0 = off (the client gets an error event). Completions with a token-id prompt "
     "cannot be continued"},
    {"migration-prefill-min-tokens", XS_LONG, OFF(migration_prefill_min_tokens), 0, 1L << 30, "4096", NULL,
     "decode migration's cost model: a continuation whose prompt (the client's + what it received) has at least "
     "this many tokens goes through a prefill leg first (kv-params, xpyd, store modes); a shorter one is "
     "computed by the decode itself (0: always the decode)"},
    {"allow-engine-in-both-pools", XS_ENUM, OFF(allow_both_pools), 0, 0, "off", on_off,
     "an engine (host:port) listed in both the prefill and the decode pool is refused at start, as a copy-paste "
     "mistake would route both legs of a request to one engine; `on` allows it (an engine that serves both "
     "roles, e.g. vLLM with `kv_role: kv_both`) and logs a warning"},
    {"prefill-fallback", XS_ENUM, OFF(prefill_fallback), 0, 0, "on", on_off,
     "`on`: when no prefill can serve a request (every attempt failed with a retryable error, or none is "
     "usable), a decode retry is refused because an earlier decode attempt took the prefill's KV, or a decode "
     "attempt failed while the prefill holding the request's KV is out of service (down, ejected or removed "
     "since it answered: no decode can pull that KV) or failing (its last attempt failed, or two decodes "
     "answered 5xx with its KV since its last success: a crash shows first so) or after another had failed with that KV (kv-params, "
     "xpyd), the decode computes the prompt itself "
     "instead of the client getting 502/503 (or that 4xx) "
     "(`xpyd_prefill_fallbacks_total`); only the modes whose decode can run alone (kv-params, xpyd, store)"},
    {"first-token", XS_ENUM, OFF(first_token), 0, 0, "decode", first_tokens,
     "`decode`, or `prefill`: a streaming client gets the prefill's token as soon as prefill answers"},
    {"dp-mode", XS_ENUM, OFF(dp_internal), 0, 0, "external", dp_modes,
     "external: host `H:P` with DP N is N backends `H:P..H:P+N-1`, interleaved across hosts port-major "
     "(`D0:8200 D1:8200 D0:8201 …`, as the Gaudi scripts); no rank header is sent. internal: one endpoint "
     "per host, each request pinned to a rank with `X-data-parallel-rank: r`"},
    {"repeat-d-times", XS_LONG, OFF(repeat_d_times), 0, 1024, "0", NULL,
     "benchmark repeat mode: N extra decode-only clones of each request, whose answers are discarded "
     "(`store` handoff only; streamed and non-streamed requests; docs/PROTOCOLS.md explains the warm-up rule)"},
    {"max-body-bytes", XS_LONG, OFF(max_body_bytes), 1024, 1L << 30, "16777216", NULL,
     "largest request body; larger gets 413 (read and discarded, never buffered)"},
    {"max-body-keys", XS_LONG, OFF(max_body_keys), 1, 1000000, "1024", NULL,
     "top-level members of a request body (OpenAI's and vLLM's parameters are well under a hundred); more gets "
     "400. Bodies are read in place, never as a tree: a body costs its own bytes, whatever its shape"},
    {"max-body-memory-bytes", XS_LONG, OFF(max_body_memory_bytes), 1024, 1L << 40, "1073741824", NULL,
     "request-body bytes the router holds at once, all clients together (bodies being read, and the one copy of "
     "each request in progress, kept for its legs): a body that would go over it is read and discarded and "
     "gets 503 + `Retry-After: 1` (`xpyd_request_body_bytes`; reason `body_memory_full`). The process's memory "
     "for them peaks near 2.2 times this count (the request's one contiguous copy, read in place, each leg's "
     "own copy while it is sent, the allocator's slack: `bench/growth.sh`), so size it to a third of what the "
     "router may use for bodies"},
    {"max-response-bytes", XS_LONG, OFF(max_response_bytes), 1024, 1L << 30, "67108864", NULL,
     "largest non-streamed engine answer the router buffers; larger fails with 502"},
    {"connect-timeout-ms", XS_LONG, OFF(connect_timeout_ms), 1, 3600000, "5000", NULL,
     "upstream TCP connect"},
    {"first-token-timeout-ms", XS_LONG, OFF(first_token_timeout_ms), 1, 86400000, "600000", NULL,
     "per leg: request sent → first response byte (504 when it fires)"},
    {"stream-idle-timeout-ms", XS_LONG, OFF(stream_idle_timeout_ms), 1, 86400000, "120000", NULL,
     "per leg: silence between response bytes once the answer started"},
    {"max-retries", XS_LONG, OFF(max_retries), 0, 10, "2", NULL,
     "extra attempts on another instance, only while nothing reached the client"},
    {"retry-backoff-ms", XS_LONG, OFF(retry_backoff_ms), 0, 10000, "10", NULL,
     "wait before a retry: this × 2^(attempt−1), capped at 1 s, × a random 0.5–1.5 (jitter); 0 = at once"},
    {"retry-budget-percent", XS_LONG, OFF(retry_budget_percent), 0, 100, "20", NULL,
     "requests that may be retrying at once, as a share of the requests in progress (but always at least "
     "`--retry-budget-min`); beyond it the real error goes to the client (`xpyd_retries_denied_total`). "
     "Not counted: a prefill fallback, including a decode computing the prompt because the prefill holding its "
     "KV is out of service (a prefill's crash fails every request whose KV it held at once)"},
    {"retry-budget-min", XS_LONG, OFF(retry_budget_min), 0, 100000, "3", NULL,
     "retrying requests always allowed at once, whatever the share"},
    {"max-connections", XS_LONG, OFF(max_connections), 1, 1000000, "10000", NULL,
     "client connections open at once; a request on a connection over the limit gets 503 + `Retry-After: "
     "1` + `Connection: close` (`xpyd_client_connections_rejected_total`, "
     "`xpyd_client_rejected_total{reason=\"over_capacity\"}`); more than a quarter + 16 over it, a "
     "connection is closed at accept unanswered (answering costs buffers too)"},
    {"listen-backlog", XS_LONG, OFF(listen_backlog), 1, 65535, "4096", NULL,
     "connections the kernel holds for the router before they are accepted (the listen queue; the system caps "
     "it at `net.core.somaxconn`). Every `--threads` worker accepts for itself, up to 16 connections a loop "
     "turn, so a burst of clients waits there while the workers are busy rather than being refused. Out of "
     "file descriptors (`accept` fails with EMFILE/ENFILE), a worker stops accepting for 100 ms, with one "
     "warning a second (`xpyd_client_accept_errors_total` counts each), and the connections wait here too"},
    {"header-timeout-ms", XS_LONG, OFF(header_timeout_ms), 1, 3600000, "10000", NULL,
     "a request head (request line + headers) must be complete this long after its first byte, else 408 + "
     "close; a new connection owes its first head this long after accept (sending nothing: closed "
     "quietly). A client dripping bytes does not extend it (slowloris)"},
    {"body-idle-timeout-ms", XS_LONG, OFF(body_idle_timeout_ms), 1, 3600000, "30000", NULL,
     "longest pause while a request body arrives, else 408 + close"},
    {"keepalive-timeout-ms", XS_LONG, OFF(keepalive_timeout_ms), 1, 86400000, "75000", NULL,
     "a client connection idle between requests is closed quietly after this long"},
    {"linger-ms", XS_LONG, OFF(linger_ms), 0, 60000, "1000", NULL,
     "after a refusal by the connection guard (400, 408, 417, 431, 501, 505) the router half-closes and "
     "reads (discarding) this long, so the client reads the answer instead of a reset"},
    {"max-header-bytes", XS_LONG, OFF(max_header_bytes), 256, 1L << 20, "32768", NULL,
     "request line + headers; more gets 431 (the head is held back from the parser until complete, so it "
     "is never buffered beyond this)"},
    {"max-headers", XS_LONG, OFF(max_headers), 1, 10000, "100", NULL,
     "header fields per request; more gets 431"},
    {"max-header-line-bytes", XS_LONG, OFF(max_header_line_bytes), 64, 8000, "8000", NULL,
     "one request or header line; longer gets 431. At most 8000: libevhtp's parser cannot take a token "
     "over 8 KiB"},
    {"admission-queue", XS_LONG, OFF(admission_queue), 0, 1000000, "1024", NULL,
     "when every eligible rank of a pool is at its `max_inflight`, a request waits in a FIFO (per router "
     "thread) for a free slot; this many may wait per pool, the next gets 429 + `Retry-After: 1`. 0 = no "
     "queue (soft cap). Gauge `xpyd_admission_queue_depth{role}`"},
    {"queue-timeout-ms", XS_LONG, OFF(queue_timeout_ms), 1, 3600000, "30000", NULL,
     "longest wait in the admission queue, then 503 naming the pool"},
    {"upstream-idle-max", XS_LONG, OFF(upstream_idle_max), 0, 100000, "64", NULL,
     "idle keep-alive connections kept per engine (host:port) per thread; a finished connection beyond "
     "this is closed. Per engine, so that P->D requests (a connection to each of two engines) at up to this "
     "many streams per thread never close and reopen one"},
    {"client-buffer-bytes", XS_LONG, OFF(client_buffer_bytes), 4096, 1L << 30, "262144", NULL,
     "unsent bytes to a slow client before the decode leg is paused (backpressure; resumed below half)"},
    {"bytes-per-token", XS_DOUBLE, OFF(bytes_per_token), 0.5, 64, "4.0", NULL,
     "prompt-size estimate for text prompts (token-id arrays are counted exactly)"},
    {"tokenizer", XS_STR, OFF(tokenizer), 0, 0, "", NULL,
     "a Hugging Face model directory (its `tokenizer.json`, read by libxpyd_tokenizer): prompts are tokenized "
     "by the router, on `--tokenizer-threads` threads (never on the event loop), before any engine is picked: "
     "completion prompts that are text, and chat requests rendered with the model's chat template as vLLM "
     "renders them (the body read where it lies, never parsed whole into a tree: a member given twice is its "
     "last, as vLLM's `json.loads` reads it). The charge is their exact token count (with the special tokens vLLM adds: BOS for "
     "completions unless `add_special_tokens: false`, none for chat unless `true`), a prompt + max tokens (unset: "
     "16 for a completion, 1 for a chat, as vLLM checks) over every rank's `max_model_len` gets 400 before any "
     "engine is touched (as a token-id prompt does without the flag), and prefix blocks are blocks of "
     "`--prefix-block-tokens` token ids (the engine's own blocks when that is the engine's block size). The "
     "prefill's `usage.prompt_tokens` is still read and a difference counted "
     "(`xpyd_tokenizer_mismatch_total`, 0 on a correct setup). What cannot be counted keeps the byte estimate "
     "(`xpyd_tokenizer_fallbacks_total{reason}`). One model for every pool. A directory whose tokenizer does "
     "not load stops the router at start, naming the component. Empty: off (the byte estimate, as before)"},
    {"chat-template", XS_STR, OFF(chat_template), 0, 0, "", NULL,
     "with `--tokenizer`: this Jinja file is the chat template (as vLLM's `--chat-template`) instead of the model "
     "directory's `chat_template.jinja` or `tokenizer_config.json`'s; one that does not compile stops the router "
     "(the model directory's own only makes chat requests keep the estimate, logged with its line)"},
    {"trust-request-chat-template", XS_ENUM, OFF(trust_request_chat_template), 0, 0, "off", on_off,
     "with `--tokenizer`, as the engines' vLLM flag of that name: a chat request's own `chat_template` (or "
     "`chat_template_kwargs`' `chat_template`, which wins, as vLLM takes them) is compiled and rendered to count "
     "it, within the render's bounds (a name among the model's named templates picks that one, as transformers "
     "does); one that does not compile keeps the estimate (reason `render`). Off: such a request keeps the byte "
     "estimate (`xpyd_tokenizer_fallbacks_total{reason=\"request_template\"}`): vLLM refuses it without its flag, "
     "and the router never renders a template a client sent unless told the engines do"},
    {"request-chat-template-cache-bytes", XS_LONG, OFF(request_chat_template_cache_bytes), 0, 1L << 30, "4194304",
     NULL,
     "with `--trust-request-chat-template`: request templates kept compiled for the requests that bring the same "
     "one (transformers caches its compiled templates too), in at most this much memory (each its source and "
     "compiled tree, 64 KiB at least), least recently used out (`xpyd_tokenizer_request_template_cache_bytes`, "
     "`xpyd_tokenizer_request_templates_kept_total`, `..._compiled_total`); a larger one, or one that does not "
     "compile, is compiled for its request alone; 0 = every request compiles its own"},
    {"tokenizer-cache-bytes", XS_LONG, OFF(tokenizer_cache_bytes), 0, 1L << 40, "67108864", NULL,
     "with `--tokenizer`: memory of the tokenization cache, the text and ids of pieces between special tokens "
     "(a conversation's earlier turns), least recently used out first (`xpyd_tokenizer_cache_bytes`, "
     "`xpyd_tokenizer_cache_hit_bytes_total`); every piece is kept, a template's role names too; 0 = off"},
    {"tokenizer-cache-alike-max", XS_LONG, OFF(tokenizer_cache_alike_max), 1, 1000000, "4", NULL,
     "with `--tokenizer`: pieces of one length with the same first and last 32 bytes (what the cache's key reads) "
     "kept at once, so a lookup compares at most this many texts; the next is refused "
     "(`xpyd_tokenizer_cache_alike_refused_total`) and encoded as a miss is"},
    {"tokenizer-threads", XS_LONG, OFF(tokenizer_threads), 1, 256, "2", NULL,
     "threads that tokenize prompts for `--tokenizer` (each one encodes a prompt at a time)"},
    {"tokenizer-queue", XS_LONG, OFF(tokenizer_queue), 1, 1000000, "4096", NULL,
     "prompts waiting for or being tokenized at once; a prompt beyond it is not tokenized and keeps the byte "
     "estimate (`xpyd_tokenizer_fallbacks_total{reason=\"busy\"}`), so a burst never waits on the tokenizer "
     "longer than this bound"},
    {"tokenizer-max-batch-prompts", XS_LONG, OFF(tokenizer_max_batch_prompts), 1, 1048576, "1024", NULL,
     "texts of one batch prompt (a completion whose `prompt` is a list of strings) the tokenizer counts; a batch of "
     "more keeps the byte estimate (`xpyd_tokenizer_fallbacks_total{reason=\"shape\"}`). Each text costs the job 8 "
     "bytes of lengths beyond the text itself, which a body of `--max-body-bytes` bounds anyway"},
    {"tokenizer-render-max-steps", XS_LONG, OFF(tokenizer_render_max_steps), 1000, 1000000000, "10000000", NULL,
     "template nodes one chat render may evaluate (its output is bounded by 4 × `--max-body-bytes` + 1 MiB and its "
     "memory by 8 × + 64 MiB); a render that needs more fails and the request keeps the byte estimate "
     "(`xpyd_tokenizer_fallbacks_total{reason=\"render\"}`). A chat of 40 messages takes 1,000–2,000 steps with "
     "Llama 3.1's template and 2,000–5,000 with Qwen 3's (measured)"},
    {"tokenizer-wait-ms", XS_LONG, OFF(tokenizer_wait_ms), 1, 3600000, "250", NULL,
     "with `--tokenizer`: a prompt no tokenizer thread has taken within this time (all busy: a burst, or prompts "
     "that take long to encode, such as megabytes without a space) goes on with the byte estimate "
     "(`xpyd_tokenizer_fallbacks_total{reason=\"busy\"}`) and is never encoded, so no prompt makes the others "
     "wait longer than this; one a thread has taken is waited for. While every thread has been on one prompt "
     "for longer than this, a new prompt is not queued at all (it would only wait it out): the estimate at once "
     "(`reason=\"stalled\"`)"},
    {"prefill-kv-events-port", XS_LONG, OFF(kv_events_port[0]), 0, 65535, "0", NULL,
     "precise cache-aware placement: every prefill publishes vLLM's KV events (ZeroMQ PUB, its KV-events config's "
     "endpoint `tcp://*:PORT`) on this port of its host, DP rank r on PORT + r; the router subscribes, keeps what "
     "each rank reports holding (docs/CONFIGURATION.md \"Precise prefix-cache routing\") and `cache` placement "
     "uses it for that rank (a host's own `kv_events` in the topology wins); 0 = none"},
    {"decode-kv-events-port", XS_LONG, OFF(kv_events_port[1]), 0, 65535, "0", NULL,
     "the same for decodes (their caches count where a decode computes a prompt: `--local-prefill-max-tokens`)"},
    {"kv-events-bind", XS_STR, OFF(kv_events_bind), 0, 0, "", NULL,
     "precise cache-aware placement where engines connect to the router instead (vLLM's KV-events `endpoint` "
     "`tcp://ROUTER:PORT`, without `*`, connects): the router binds `tcp://ADDR:PORT` (and the next ports, "
     "`--kv-events-bind-ranks`), and each message's topic names its engine as the router lists it (vLLM's "
     "`topic`: `HOST:PORT` of the engine's HTTP address; a DP rank is the bound port's offset where ranks share "
     "an address). Anyone who can reach it can publish: bind a private address; empty = off"},
    {"kv-events-bind-ranks", XS_LONG, OFF(kv_events_bind_ranks), 1, 256, "1", NULL,
     "ports bound from `--kv-events-bind`'s: DP rank r of an engine publishes to PORT + r (vLLM offsets a "
     "connecting endpoint too), so the largest data-parallel size of the engines that connect"},
    {"kv-events-bind-replay-port", XS_LONG, OFF(kv_events_bind_replay_port), 0, 65535, "0", NULL,
     "with `--kv-events-bind`: engines' replay endpoints (vLLM's `replay_endpoint`, which the engine binds) are on "
     "their own host (the topic's) at this port + the DP rank (the bound port's offset it connected to); a gap "
     "asks it for the missed batches as in connect mode; 0 = none (a gap forgets the rank's blocks)"},
    {"kv-events-replay-offset", XS_LONG, OFF(kv_events_replay_offset), 0, 65535, "0", NULL,
     "vLLM's `replay_endpoint`: a rank's replay port is its event port + N (both offset by the DP rank, as vLLM "
     "does); a gap in a rank's sequence numbers (or a first message after the start) asks it for the missed "
     "batches; 0 = none (a gap then forgets that rank's blocks, which may be stale)"},
    {"kv-events-stale-ms", XS_LONG, OFF(kv_events_stale_ms), 1, 1L << 30, "5000", NULL,
     "a rank sent a prompt of at least one block and published nothing within this time: its events are not "
     "trusted (placement goes approximate for it, `xpyd_kv_events_sources{state=\"stale\"}`) until it publishes "
     "again"},
    {"kv-events-pending-ms", XS_LONG, OFF(kv_events_pending_ms), 0, 1L << 30, "2000", NULL,
     "a prompt sent to a rank that publishes events counts as held there while its request is in flight (queued "
     "or computing, not yet in its events), at most this long (16 ms at least): its next requests follow it instead "
     "of computing it again elsewhere; not where another rank reports more of it or the rank's blocks were "
     "forgotten since; 0 = off"},
    {"kv-events-max-bytes", XS_LONG, OFF(kv_events_max_bytes), 1024, 1L << 30, "1048576", NULL,
     "largest KV-event message accepted (ZeroMQ drops the connection of a publisher sending more); with "
     "`--kv-events-hwm` it bounds what one source may queue"},
    {"kv-events-hwm", XS_LONG, OFF(kv_events_hwm), 1, 1000000, "64", NULL,
     "KV-event messages ZeroMQ queues per source before dropping (a gap the sequence numbers then show); in "
     "bind mode also the messages kept per rank during its replay"},
    {"kv-events-replay-timeout-ms", XS_LONG, OFF(kv_events_replay_timeout_ms), 1, 600000, "1000", NULL,
     "how long a replay may take before the rank's blocks are forgotten instead"},
    {"kv-events-recheck-ms", XS_LONG, OFF(kv_events_recheck_ms), 0, 600000, "100", NULL,
     "a rank's KV-event connection (connect mode) as a hint for the health checks: when it drops (an engine "
     "stopping or crashing drops it at once), the engine is checked at once and, failing, taken down without "
     "waiting for `--health-fall` (two signals); when it connects again, the engine is checked at once and then "
     "every N ms until it passes (for `--health-interval-ms` at most; those failures not counted), and passing "
     "after it had failed brings it up at once and ends its ranks' passive ejections (`event=unejected`: the "
     "engine started again). 0 = off; nothing without health checks (`--health-interval-ms 0`)"},
    {"kv-index-max-blocks", XS_LONG, OFF(kv_index_max_blocks), 1, 1L << 30, "1048576", NULL,
     "(rank, block) pairs the KV-event index of a pool keeps, in blocks of `--prefix-block-tokens` (an engine "
     "block of 64 tokens is 4 of them; up to 130 bytes each: 1 M pairs measured 134 MB), and engine blocks "
     "smaller than one kept as its pieces (SGLang's pages of one token: 160,000 measured 161 bytes each); "
     "stored blocks beyond it are not kept (`xpyd_kv_events_skipped_total{cause=\"full\"}`)"},
    {"kv-index-max-adapters", XS_LONG, OFF(kv_index_max_adapters), 1, 1L << 20, "1024", NULL,
     "LoRA adapter names the KV-event index of a pool remembers (8 bytes each; a name is remembered when a rank "
     "stores blocks under it or an engine's `GET /v1/models` lists it as an adapter, and a request whose `model` "
     "names a remembered adapter is matched in that adapter's key space, any other as the base model). Blocks "
     "under a further adapter are not kept "
     "(`xpyd_kv_events_skipped_total{cause=\"adapters\"}`), and from then on a request naming a model that is not "
     "remembered may be such an adapter: it gets no cache credit from the events rather than the base model's, "
     "whose blocks an adapter's request never hits"},
    {"prefix-block-tokens", XS_LONG, OFF(prefix_block_tokens), 1, 4096, "16", NULL,
     "cache-aware placement: tokens per prefix block (vLLM's default block size); text prompts are cut every "
     "block × `--bytes-per-token` bytes (with `--tokenizer`: every block of token ids), chat requests over a canonical serialization of their messages (role, "
     "name, content, tool calls, in order), token-id prompts by ids; each block hashed with xxHash3 chained "
     "on the previous block's hash"},
    {"prefix-cache-blocks", XS_LONG, OFF(prefix_cache_blocks), 1, 1L << 30, "8192", NULL,
     "blocks the prefix index remembers per rank (LRU), i.e. the engine's prefix-cache size; an engine's own "
     "`num_gpu_blocks` from `vllm:cache_config_info` replaces it when engines are scraped "
     "(`--scrape-interval-ms` above 0)"},
    {"prefix-index-max-bytes", XS_LONG, OFF(prefix_index_max_bytes), 4096, 1L << 40, "67108864", NULL,
     "memory bound of each pool's prefix index (about 48 bytes per block); when full the rank holding the "
     "most blocks gives up its least recently used one (`xpyd_prefix_index_bytes`)"},
    {"prefix-ttl-ms", XS_LONG, OFF(prefix_ttl_ms), 0, 1L << 40, "0", NULL,
     "blocks not used for this long count as evicted by the engine (0 = no age limit: LRU only)"},
    {"cache-max-imbalance", XS_DOUBLE, OFF(cache_max_imbalance), 1.0, 1000, "2.0", NULL,
     "load guard of the `cache` policy: a rank whose outstanding tokens per capacity exceed this × the larger "
     "of the pool's mean and the request's own tokens, or that is at its max_inflight, gets no credit for "
     "its cached prefix (it can still win on load alone)"},
    {"cache-uncached-weight", XS_DOUBLE, OFF(cache_uncached_weight), 1.0, 1000, "2.0", NULL,
     "the `cache` policy's cost is outstanding tokens + this × the request's uncached tokens: 1 is plain least "
     "outstanding tokens counting only what a rank would compute; above 1 a rank without the prefix must be "
     "that much less loaded to take it (computing a prefix somewhere new also spends cache room). Default 2: "
     "on bench/cache.sh's prefix-repetition workload it raised the engine-reported hit rate from 0.68 (1.0) to "
     "0.79 at the same TTFT; 4 gave 0.79 too. Without shared prefixes every weight places exactly as `lot`"},
    {"local-prefill-max-tokens", XS_LONG, OFF(local_prefill_max_tokens), 0, 1L << 30, "0", NULL,
     "conditional disaggregation (kv-params, xpyd, store): the decode rank is chosen first, and when the "
     "request's tokens that rank does not hold cached are fewer than this, the decode computes the prompt "
     "itself, with no prefill leg (`xpyd_pd_decisions_total`, access log `pd=local`); 0 = always remote"},
    {"local-prefill-when-busy-tokens", XS_LONG, OFF(local_prefill_when_busy_tokens), 0, 1L << 30, "0", NULL,
     "also compute at the decode when every prefill rank is at its max_inflight and the uncached part is "
     "below this (0 = off)"},
    {"session-key", XS_STR, OFF(session_key), 0, 0, "", NULL,
     "session affinity: `header:NAME` (e.g. `header:X-Session-Id`) or `body:FIELD` (a top-level string, e.g. "
     "`body:user`); requests of one session go to the same rank of each pool by consistent hashing with "
     "bounded loads (see `--session-epsilon`); requests without the key are placed by the policy"},
    {"session-epsilon", XS_DOUBLE, OFF(session_epsilon), 0, 100, "0.25", NULL,
     "bounded loads: a session's rank keeps it while its load with the request stays within (1 + this) × "
     "the pool's mean, else the next rank on the ring takes it"},
    {"log-level", XS_ENUM, OFF(log_level), 0, 0, "info", log_levels,
     "none, error, warn, info, debug; request failures (`event=request_failed`), health transitions, "
     "ejections and drain events are printed at every level but none"},
    {"access-log", XS_ENUM, OFF(access_log), 0, 0, "off", access_logs,
     "one line per request to stderr: `off`, `logfmt`, `json`"},
    {"metrics", XS_ENUM, OFF(metrics), 0, 0, "on", on_off,
     "`on`: latency histograms recorded; `off` only to measure their cost (counters stay)"},
    {"health-interval-ms", XS_LONG, OFF(health_interval_ms), 0, 3600000, "2000", NULL,
     "active health check period: `GET /health` on every endpoint; 0 turns checks off"},
    {"health-timeout-ms", XS_LONG, OFF(health_timeout_ms), 1, 600000, "1000", NULL,
     "one check's deadline (connect and answer)"},
    {"learn-max-model-len", XS_ENUM, OFF(learn_max_model_len), 0, 0, "auto", learn_modes,
     "ranks without a configured `max_model_len` take their engine's: after a passing health check, once each "
     "time the engine is seen up (at start, and again after a check failed: a restarted engine may have another "
     "length), `GET /v1/models` (the largest `max_model_len` of its model cards, vLLM's and SGLang's field; an "
     "answer of 1 MiB or more teaches nothing; within `--health-timeout-ms`; with `--api-key` sent as a bearer "
     "key, with this router in `X-Xpyd-Via`; not answered: asked after the next passing check), shown in "
     "`/status` as `learned_max_model_len`, logged as `event=max_model_len_learned`. A configured `max_model_len` "
     "wins. A prompt counted exactly (the tokenizer's, token ids) is held to it as to a configured one (over "
     "every rank's: 400 before any engine); one only estimated (what the tokenizer could not count: an image, a "
     "busy tokenizer) is held to configured lengths alone, the engines judge it. `auto`: on with `--tokenizer` "
     "(where prompts are counted exactly), else off (engines judge, as before); `on`, `off`. Needs health "
     "checks (`--health-interval-ms`)"},
    {"query-interval-ms", XS_LONG, OFF(query_interval_ms), 100, 3600000, "2000", NULL,
     "`--handoff mooncake`: period of `GET /query` on every prefill's bootstrap server (its DP ranks and "
     "their engine ids). A prefill is not eligible until it answers; a failed query makes it ineligible "
     "until the next good one; a restarted prefill's new engine ids are used from the next answer on"},
    {"query-timeout-ms", XS_LONG, OFF(query_timeout_ms), 1, 600000, "1000", NULL,
     "one `GET /query`'s deadline (connect and answer)"},
    {"health-rise", XS_LONG, OFF(health_rise), 1, 100, "2", NULL,
     "passed checks in a row that bring a down endpoint back"},
    {"health-fall", XS_LONG, OFF(health_fall), 1, 100, "3", NULL,
     "failed checks in a row that take an endpoint down"},
    {"eject-after-failures", XS_LONG, OFF(eject_after), 0, 1000, "3", NULL,
     "passive ejection: consecutive failed attempts on a rank (connect error, timeout, 5xx, unusable "
     "answer; never a 4xx, nor a decode's 5xx while the prefill holding its KV is out of service or failing: the "
     "prefill's failure, not the decode's; a decode's 5xx in a row for want of the same prefill's KV count once "
     "unless another decode used that prefill's KV in between) that take it out of rotation; 0 = off"},
    {"eject-base-ms", XS_LONG, OFF(eject_base_ms), 1, 3600000, "1000", NULL,
     "first ejection's length, doubling per repeat (reset by a success) up to `--eject-max-ms`; at most "
     "half of a pool is ejected at once"},
    {"eject-max-ms", XS_LONG, OFF(eject_max_ms), 1, 3600000, "30000", NULL,
     "longest ejection"},
    {"drain-timeout-ms", XS_LONG, OFF(drain_timeout_ms), 0, 3600000, "30000", NULL,
     "on SIGTERM/SIGINT: `/health` answers 503, the listener closes, generate requests on open connections "
     "get 503 + `Connection: close`, in-flight requests get this long to finish, then exit 0 (a second "
     "signal exits at once)"},
    {"scrape-interval-ms", XS_LONG, OFF(scrape_interval_ms), 0, 3600000, "0", NULL,
     "engine feedback: read each endpoint's `/metrics` this often and blend it into the load; 0 = off"},
    {"feedback-waiting-tokens", XS_LONG, OFF(feedback_waiting_tokens), 0, 1L << 30, "512", NULL,
     "load one request waiting in the engine (`vllm:num_requests_waiting`) adds, in tokens"},
    {"feedback-running-tokens", XS_LONG, OFF(feedback_running_tokens), 0, 1L << 30, "0", NULL,
     "load one request running in the engine (`vllm:num_requests_running`) adds; 0 because the router's "
     "own requests are already in its outstanding tokens — set it when other clients share the engines"},
    {"feedback-kv-tokens", XS_LONG, OFF(feedback_kv_tokens), 0, 1L << 30, "8192", NULL,
     "load a full engine KV cache (`vllm:kv_cache_usage_perc`, else `vllm:gpu_cache_usage_perc`, = 1.0) "
     "adds"},
    {"api-key", XS_STR, OFF(api_key), 0, 0, "", NULL,
     "every endpoint but `/health` and `/metrics` needs `Authorization: Bearer KEY` (401, constant-time "
     "compare); env `XPYD_API_KEY` when the flag is absent; the key is never logged and is forwarded to "
     "engines as the client sent it"},
    {"discovery", XS_STR, OFF(discovery), 0, 0, "", NULL,
     "`etcd://HOST:PORT[,HOST:PORT...]/PREFIX` (`etcds://` for https, with the `--upstream-*` certificates): "
     "instances registered under PREFIX/instances/ join and leave the pools as etcd says (a range, then a "
     "watch); this router registers itself under PREFIX/routers/ and shares its load (`--load-sync-ms`). "
     "While etcd is unreachable the last membership stays and is read again when it is back. Statically "
     "configured endpoints win over etcd entries for the same host:port (docs/PROTOCOLS.md#etcd)"},
    {"router-id", XS_STR, OFF(router_id), 0, 0, "", NULL,
     "this router's name in etcd (PREFIX/routers/ID, PREFIX/load/ID); default HOSTNAME:PORT"},
    {"load-sync-ms", XS_LONG, OFF(load_sync_ms), 0, 60000, "100", NULL,
     "`--discovery`: publish this router's per-rank load this often (only when it changed) and add the other "
     "routers' published load to its own when placing; 0 = off (each router sees only its own load)"},
    {"discovery-ttl-s", XS_LONG, OFF(discovery_ttl_s), 2, 3600, "5", NULL,
     "`--discovery`: TTL of this router's etcd lease (kept alive every third of it); a router that dies "
     "disappears, with its published load, this long after"},
    {"discovery-timeout-ms", XS_LONG, OFF(discovery_timeout_ms), 1, 600000, "2000", NULL,
     "`--discovery`: one etcd call's deadline (connect and answer); on failure the next endpoint is tried"},
    {"discovery-retry-max-ms", XS_LONG, OFF(discovery_retry_max_ms), 10, 600000, "5000", NULL,
     "`--discovery`: while etcd is unreachable, reads are retried after 100 ms doubling up to this (with "
     "jitter)"},
    {"admin-key", XS_STR, OFF(admin_key), 0, 0, "", NULL,
     "turns the admin API on for `Authorization: Bearer KEY` (env `XPYD_ADMIN_KEY` when the flag is "
     "absent)"},
    {"metadata-write-key", XS_STR, OFF(metadata_write_key), 0, 0, "", NULL,
     "`PUT`/`POST`/`DELETE /metadata` need `Authorization: Bearer KEY` (or the admin key): the store holds "
     "transfer-engine segment descriptors, which steer where KV bytes are written. With neither key set, "
     "writes get 403; env `XPYD_METADATA_WRITE_KEY`"},
    {"metadata-max-keys", XS_LONG, OFF(metadata_max_keys), 0, 10000000, "65536", NULL,
     "keys the Mooncake-compatible metadata store (`GET|PUT|DELETE /metadata?key=K`, value = body) holds; "
     "reads are guarded by `--api-key` like client endpoints, writes need the `--metadata-write-key` or "
     "the `--admin-key`; a new key beyond this gets 507 (gauge `xpyd_metadata_keys`)"},
    {"metadata-max-value-bytes", XS_LONG, OFF(metadata_max_value_bytes), 1, 1L << 26, "1048576", NULL,
     "largest `/metadata` value; larger gets 413"},
    {"metadata-backend", XS_ENUM, OFF(metadata_backend), 0, 0, "memory", metadata_backends,
     "where `/metadata` keeps its keys: `memory` (this router, bounded by `--metadata-max-keys`), or `etcd`: the "
     "`--discovery` cluster, under the keys exactly as given (e.g. `mooncake/ram/<segment>`, what Mooncake "
     "transfer engines write when pointed at the same etcd), so engines on etcd and clients of this HTTP "
     "store see the same segments and every router replica serves the same store; etcd unreachable: 503"},
    {"max-instances", XS_LONG, OFF(max_instances), 1, 4096, "1024", NULL,
     "rank slots per pool, including ranks added at runtime; a removed rank keeps its slot while requests on it "
     "finish (and for its own return); once a pool has no never-used slot, the next engine to join takes a removed "
     "rank's idle slot, so engines coming and going under new addresses never fill it (`xpyd_rank_slots`, "
     "`xpyd_rank_slot_reuses_total`). Endpoints (host:port): twice as many, reused the same way"},
    {"max-hops", XS_LONG, OFF(max_hops), 1, 64, "8", NULL,
     "loop guard: every request the router sends an engine carries `X-Xpyd-Via` with the hop ids of the routers "
     "it passed through; a request that already passed through this router, or through this many, gets 508 "
     "(`xpyd_loops_refused_total`). An engine address that is one of the router's own listeners is refused "
     "outright (start-up, reload, admin API 400, etcd `discovery_invalid`)"},
    {"port-file", XS_STR, OFF(port_file), 0, 0, "", NULL,
     "write the bound port there once listening (the plain listener's, with `--plain-port`, on a second line)"},
    {"tls-cert", XS_STR, OFF(tls_cert), 0, 0, "", NULL,
     "HTTPS for clients: the certificate (PEM, followed by its chain); needs `--tls-key`. Reloaded with the key "
     "on SIGHUP: new handshakes use the new pair, open connections keep theirs (a bad pair is refused and the "
     "old one stays). A TLS handshake must complete within `--header-timeout-ms`, as a request head must"},
    {"tls-key", XS_STR, OFF(tls_key), 0, 0, "", NULL, "the private key of `--tls-cert` (PEM)"},
    {"tls-client-ca", XS_STR, OFF(tls_client_ca), 0, 0, "", NULL,
     "mutual TLS: clients must present a certificate this CA bundle (PEM) signed, else the handshake fails"},
    {"tls-min-version", XS_ENUM, OFF(tls_min_version), 0, 0, "1.2", tls_versions,
     "oldest TLS version accepted from clients and offered to https engines: 1.2 or 1.3. ALPN is http/1.1; "
     "sessions resume (server cache and tickets)"},
    {"plain-port", XS_LONG, OFF(plain_port), -1, 65535, "-1", NULL,
     "a second listener speaking plain HTTP, with every endpoint (e.g. for /metrics on an internal address "
     "while `--port` serves HTTPS); on `--plain-host`, one thread; -1 = none, 0 = any free port"},
    {"plain-host", XS_STR, OFF(plain_host), 0, 0, "127.0.0.1", NULL, "address of the `--plain-port` listener"},
    {"upstream-ca", XS_STR, OFF(upstream_ca), 0, 0, "", NULL,
     "CA bundle (PEM) that https engines (`https://HOST:PORT`, or `\"tls\": true` per host) are verified against; "
     "empty: the system store (OpenSSL's default file and directory, `SSL_CERT_FILE`/`SSL_CERT_DIR`), read at "
     "the first TLS connection, not at start. Certificates are checked against the host as written (name or IP); "
     "SNI is sent for names; sessions resume on new connections to the same engine"},
    {"upstream-cert", XS_STR, OFF(upstream_cert), 0, 0, "", NULL,
     "client certificate (PEM) the router presents to https engines that ask (mutual TLS)"},
    {"upstream-key", XS_STR, OFF(upstream_key), 0, 0, "", NULL, "the private key of `--upstream-cert` (PEM)"},
};
#define NSETTINGS (sizeof settings / sizeof settings[0])


/* The balancer's policies, "a|b|c", from its own table (balancer/xb.c). */
const char *rt_policy_choices(void)
{
    static char buf[128];
    if (!buf[0])
        for (int i = 0; strcmp(xb_policy_name(i), "?") != 0; i++)
            snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", i ? "|" : "", xb_policy_name(i));
    return buf;
}

void rt_config_usage(FILE *f)
{
    fprintf(f, "usage: xpyd_router -p HOST:PORT [HOST:PORT ...] -d HOST:PORT [HOST:PORT ...] [options]\n"
          "Router for disaggregated (prefill/decode) LLM serving, OpenAI-compatible.\n\n"
          "Pools (lists: space-separated after the flag, comma-separated, or repeated flags; [v6]:port works):\n"
          "  -p, --prefill LIST           prefill instances\n"
          "  -d, --decode LIST            decode instances\n"
          "  --prefill-dp N, --decode-dp N   data-parallel ranks per host (default 1)\n"
          "  --prefill-tp N, --decode-tp N   tensor-parallel size per rank (capacity weight, default 1)\n"
          "  --prefill-policy P, --decode-policy P   one of %s (default lot)\n"
          "  --prefill-bootstrap-port N   bootstrap server port of every prefill without its own (--handoff\n"
          "                               bootstrap and mooncake; default 8998, SGLang's and vLLM's)\n"
          "  --prefill-max-inflight N, --decode-max-inflight N   requests a rank runs at once (vLLM max_num_seqs);\n"
          "                               full ranks are passed over while another has room (default 0: unknown)\n"
          "  --config FILE                JSON configuration (see conf/); the command line wins\n"
          "  --dry-run                    print the expanded topology and exit\n"
          "Compatibility aliases (the Python proxies):\n"
          "  --prefiller-hosts H.. --prefiller-ports P..  --decoder-hosts H.. --decoder-ports P..\n"
          "  --repeat_d_times N (= --repeat-d-times)  --generator_on_p_node (= --first-token prefill)\n"
          "Settings (default in brackets):\n",
          rt_policy_choices());
    xpyd_settings_usage(f, settings, NSETTINGS);
    fputs("  -h, --help                   this text\n  --version                    version and git revision\n"
          "  --config-reference           the settings as the Markdown table of docs/CONFIGURATION.md\n",
          f);
}


/* Settings that only some handoff modes read: given (not at their default) with a mode that does not read
 * them, the configuration is refused, since the operator expects an effect there will not be. */
static const struct {
    const char *name;
    size_t trait; /* offsetof(struct handoff_traits, ...): the modes that read it */
    const char *why;
} mode_settings[] = {
    {"local-prefill-max-tokens", offsetof(struct handoff_traits, local_prefill),
     "its decode cannot compute a prompt alone (kv-params, xpyd and store can)"},
    {"local-prefill-when-busy-tokens", offsetof(struct handoff_traits, local_prefill),
     "its decode cannot compute a prompt alone (kv-params, xpyd and store can)"},
    {"migration-prefill-min-tokens", offsetof(struct handoff_traits, local_prefill),
     "its decode cannot compute a prompt alone (kv-params, xpyd and store can)"},
    {"query-interval-ms", offsetof(struct handoff_traits, query_prefill), "only mooncake queries its prefills"},
    {"query-timeout-ms", offsetof(struct handoff_traits, query_prefill), "only mooncake queries its prefills"},
};

int rt_config_check_modes(const struct rt_config *c)
{
    const struct handoff_traits *t = &rt_handoff_traits[c->handoff];
    struct rt_config def;
    memset(&def, 0, sizeof def);
    if (xpyd_settings_defaults(&def, settings, NSETTINGS, "xpyd_router") != 0)
        return -1;
    for (size_t i = 0; i < sizeof mode_settings / sizeof mode_settings[0]; i++) {
        const struct xpyd_setting *s = xpyd_setting_find(settings, NSETTINGS, mode_settings[i].name);
        if (!s || xpyd_setting_equal(c, &def, s) || *(const int *)((const char *)t + mode_settings[i].trait))
            continue;
        fprintf(stderr, "xpyd_router: --%s does nothing with --handoff %s (%s): remove it\n", s->name, t->name,
                mode_settings[i].why);
        return -1;
    }
    int host_boot = 0;
    for (size_t h = 0; h < c->pools[RT_PREFILL].n; h++)
        host_boot |= c->pools[RT_PREFILL].hosts[h].bootstrap_port > 0;
    if ((c->prefill_bootstrap_port > 0 || host_boot) && !t->bootstrap_server) {
        fprintf(stderr, "xpyd_router: %s does nothing with --handoff %s (only bootstrap and mooncake meet at a "
                        "prefill's bootstrap server): remove it\n",
                c->prefill_bootstrap_port > 0 ? "--prefill-bootstrap-port" : "a host's \"bootstrap_port\"", t->name);
        return -1;
    }
    return 0;
}

int rt_config_defaults(struct rt_config *c)
{
    memset(c, 0, sizeof *c);
    if (xpyd_settings_defaults(c, settings, NSETTINGS, "xpyd_router") != 0) /* and the table checks itself */
        return -1;
    snprintf(c->id_prefix, sizeof c->id_prefix, "xpyd");
    for (int r = 0; r < 2; r++) {
        c->pools[r].dp = 1;
        c->pools[r].tp = 1;
    }
    return 0;
}

void rt_config_reference(FILE *f)
{
    xpyd_settings_reference(f, settings, NSETTINGS);
}

int rt_config_has_setting(const char *name)
{
    return xpyd_setting_find(settings, NSETTINGS, name) != NULL;
}

int rt_config_set_named(struct rt_config *c, const char *name, const char *val)
{
    const struct xpyd_setting *s = xpyd_setting_find(settings, NSETTINGS, name);
    return s && xpyd_setting_set(c, s, val, "xpyd_router") == 0 ? 0 : -1;
}

size_t rt_config_changed(const struct rt_config *a, const struct rt_config *b, char *out, size_t cap)
{
    size_t n = 0, len = 0;
    out[0] = 0;
    for (size_t i = 0; i < NSETTINGS; i++) {
        if (xpyd_setting_equal(a, b, &settings[i]))
            continue;
        int k = snprintf(out + len, cap - len, "%s%s", n ? "," : "", settings[i].name);
        if (k > 0 && (size_t)k < cap - len)
            len += (size_t)k;
        n++;
    }
    return n; /* --prefill-bootstrap-port is not a row: it reaches the ranks, which a reload updates */
}

void rt_config_print(const struct rt_config *c, FILE *f)
{
    fprintf(f, "listen %s:%d threads=%d handoff=%s first-token=%s dp-mode=%s repeat-d-times=%d\n", c->listen_host,
            c->listen_port, c->threads, rt_handoff_names[c->handoff], first_tokens[c->first_token],
            dp_modes[c->dp_internal], c->repeat_d_times);
    for (int role = 0; role < 2; role++) {
        fprintf(f, "%s pool: %zu ranks, policy %s\n", role ? "decode" : "prefill", c->n_ranks[role],
                xb_policy_name(c->pools[role].policy));
        if (role == RT_PREFILL && rt_handoff_traits[c->handoff].query_prefill)
            fprintf(f, "  (at run time each prefill's ranks are those its GET /query lists; below: the first plan)\n");
        for (size_t i = 0; i < c->n_ranks[role]; i++) {
            const struct rt_rank *r = &c->ranks[role][i];
            const struct rt_endpoint_cfg *e = &c->endpoints[r->endpoint];
            char hp[300];
            fprintf(f, "  %s[%zu] %s dp_rank=%d tp=%d weight=%d max_model_len=%ld max_inflight=%d", role ? "D" : "P", i,
                    xpyd_hostport(e->host, e->port, hp, sizeof hp), r->dp_rank, r->tp, r->weight, r->max_model_len,
                    r->max_inflight);
            if (role == RT_PREFILL && rt_handoff_traits[c->handoff].bootstrap_server)
                fprintf(f, " bootstrap_port=%d", r->bootstrap_port);
            if (r->kv_events[0])
                fprintf(f, " kv_events=%s", r->kv_events);
            fputc('\n', f);
        }
    }
}

void rt_config_free(struct rt_config *c)
{
    for (int r = 0; r < 2; r++) {
        free(c->pools[r].hosts);
        free(c->ranks[r]);
    }
    free(c->endpoints);
    memset(c, 0, sizeof *c);
}