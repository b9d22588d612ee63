/* SPDX-License-Identifier: Apache-2.0 */
/* metrics_table.h - every counter, gauge and histogram of the router's /metrics, one row each:
 *   X(field, name, type, labels, help)
 * `field` is its storage in struct rt_counters (router.h), generated from this table with the shape its
 * labels need; metrics.c writes /metrics from the same rows. Adding a metric is one row here plus the line
 * that updates it (g_rt->ctr.<field>). Labels:
 *   NONE    one series
 *   ROLE    role="prefill" | "decode" (field[2])
 *   REASON  reason=<rt_fail_table name> (field[RF_COUNT], "none" not shown)
 *   GUARD   reason=<rt_client_reject_names> (field[RT_CR_COUNT])
 *   STATUS  endpoint=..., status=<exact HTTP status> (field[RT_EP_COUNT][600]; 200 always shown)
 *   PD      decision="remote_prefill" | "local_prefill" (field[2])
 *   SIDE    side="client" | "upstream" (field[2])
 *   HIST    a latency histogram, buckets 1 ms .. 240 s (struct rt_hist field)
 *   MSEC    one series, kept in milliseconds, shown in seconds
 *   OUTCOME endpoint=..., outcome=<rt_outcome_names> (field[RT_EP_COUNT][RT_OUT_COUNT])
 *   TOKFB   reason=<rt_tok_fallback_names> (field[RT_TF_COUNT], tokenize.h)
 * Per-rank series (xpyd_instance_*) come from the balancer's numbers: metrics.c's instance table. */
#ifndef XPYD_METRICS_TABLE_H
#define XPYD_METRICS_TABLE_H

#define RT_METRICS(X)                                                                                            \
    X(requests, "xpyd_requests_total", counter, STATUS,                                                          \
      "Client requests by endpoint and HTTP status (499: the client went away first). A stream that fails after " \
      "its 200 head counts as 200 here: alert on xpyd_request_outcomes_total.")                                  \
    X(outcomes, "xpyd_request_outcomes_total", counter, OUTCOME,                                                 \
      "Client requests by endpoint and outcome: ok, error (the router or an engine failed it, a stream cut after " \
      "its 200 head included), client_error (the request was refused as it was), client_abort (the client went " \
      "away first), overloaded (queue full or timed out, draining, body memory full).")                          \
    X(kv_handoff_failures, "xpyd_kv_handoff_failures_total", counter, NONE,                                      \
      "Decode attempts that failed before their answer's head while a prefill's KV waited for them (any "        \
      "--handoff: the decode could not pull it, refused it, or was unreachable).")                               \
    X(ttft, "xpyd_ttft_seconds", histogram, HIST, "Time to first token the client saw (streams).")              \
    X(itl, "xpyd_itl_seconds", histogram, HIST, "Gaps between streamed tokens relayed to clients.")             \
    X(e2e, "xpyd_e2e_seconds", histogram, HIST, "Whole request, accept to last byte (successful requests).")    \
    X(prefill_time, "xpyd_prefill_seconds", histogram, HIST, "Prefill leg: sent to answered.")                 \
    X(decode_time, "xpyd_decode_seconds", histogram, HIST, "Decode leg: sent to finished.")                    \
    X(kv_handoff_time, "xpyd_kv_handoff_seconds", histogram, HIST,                                              \
      "xpyd handoff: KV transfer time the decode reported (X-KV-Transfer).")                                    \
    X(errors, "xpyd_request_errors_total", counter, REASON, "Failed requests by reason (the router's failure table).") \
    X(retries, "xpyd_retries_total", counter, ROLE, "Attempts retried on another instance.")                   \
    X(repeat_clones, "xpyd_repeat_clones_total", counter, NONE, "Decode-only clones fired by --repeat-d-times.") \
    X(kv_release_dispatches, "xpyd_kv_release_dispatches_total", counter, NONE,                                 \
      "Requests dispatched to a decode and cancelled to free a prefill's KV after every decode attempt failed.") \
    X(metadata_keys, "xpyd_metadata_keys", gauge, NONE, "Keys in the /metadata store.")                        \
    X(kv_bytes, "xpyd_kv_bytes_total", counter, NONE, "xpyd handoff: KV bytes the decodes reported moving.")    \
    X(kv_releases, "xpyd_kv_releases_total", counter, NONE,                                                     \
      "xpyd handoff: release notifications sent to prefill engines.")                                           \
    X(kv_release_failures, "xpyd_kv_release_failures_total", counter, NONE,                                     \
      "xpyd handoff: release notifications that could not be sent.")                                            \
    X(first_token_mismatch, "xpyd_first_token_mismatch_total", counter, NONE,                                   \
      "Prefill and decode first tokens that differed.")                                                          \
    X(client_disconnects, "xpyd_client_disconnects_total", counter, NONE,                                       \
      "Clients that went away before their answer ended.")                                                       \
    X(active_streams, "xpyd_active_streams", gauge, NONE, "Streams being relayed now.")                        \
    X(active_requests, "xpyd_active_requests", gauge, NONE, "Generate requests in progress now.")              \
    X(prompt_tokens, "xpyd_prompt_tokens_total", counter, NONE, "Prompt tokens of finished requests.")         \
    X(generation_tokens, "xpyd_generation_tokens_total", counter, NONE, "Tokens relayed to clients.")          \
    X(retries_denied, "xpyd_retries_denied_total", counter, NONE, "Retries refused by the retry budget.")      \
    X(retries_active, "xpyd_retries_active", gauge, NONE,                                                       \
      "Requests retrying now: the retry budget's use (a prefill fallback is outside it).")                       \
    X(migrations, "xpyd_migrations_total", counter, REASON,                                                      \
      "Streams whose failed decode leg went on at another decode (--migration-limit), by what failed.")          \
    X(prefill_fallbacks, "xpyd_prefill_fallbacks_total", counter, NONE,                                         \
      "Requests whose decode computed the prompt itself because no prefill could (--prefill-fallback).")         \
    X(prefix_predicted, "xpyd_prefix_predicted_tokens_total", counter, ROLE,                                     \
      "Prompt tokens the prefix index predicted cached on the chosen rank (pools with the index on).")           \
    X(prefix_cached, "xpyd_prefix_cached_tokens_total", counter, ROLE,                                          \
      "Prompt tokens the engine reported cached (usage.prompt_tokens_details.cached_tokens) for the same "      \
      "requests: the prediction's truth.")                                                                       \
    X(prefix_index_bytes, "xpyd_prefix_index_bytes", gauge, ROLE, "Memory the pool's prefix index uses.")      \
    X(session_picks, "xpyd_session_affinity_total", counter, ROLE,                                              \
      "Picks made by session affinity (--session-key): the session's rank on the ring took the request.")       \
    X(pd_decisions, "xpyd_pd_decisions_total", counter, PD,                                                     \
      "Conditional disaggregation: requests sent through a prefill leg, or computed by their decode alone.")    \
    X(tls_handshake_failures, "xpyd_tls_handshake_failures_total", counter, SIDE,                              \
      "TLS handshakes that failed: clients of the HTTPS listener, or connections to https engines.")             \
    X(tls_reloads, "xpyd_tls_certificate_reloads_total", counter, NONE,                                         \
      "Certificate and key pairs loaded by SIGHUP (a rejected pair is not counted; the old one stays).")          \
    X(connections, "xpyd_client_connections", gauge, NONE, "Client connections open.")                         \
    X(connections_accepted, "xpyd_client_connections_accepted_total", counter, NONE, "Client connections accepted.") \
    X(connections_rejected, "xpyd_client_connections_rejected_total", counter, NONE,                            \
      "Client connections over --max-connections (answered 503, or closed far over it).")                      \
    X(accept_errors, "xpyd_client_accept_errors_total", counter, NONE,                                        \
      "accept() failures other than none pending (out of descriptors or memory): each pauses that worker's "    \
      "accepting for 100 ms, the connections waiting in the listen queue.")                                     \
    X(health_transitions, "xpyd_health_transitions_total", counter, NONE,                                       \
      "Endpoints that went up or down (active health checks).")                                                 \
    X(queued, "xpyd_admission_queue_depth", gauge, ROLE, "Requests waiting for a rank under max_inflight.")    \
    X(queue_admitted, "xpyd_admission_queue_admitted_total", counter, ROLE,                                     \
      "Requests that waited in the queue, then ran.")                                                            \
    X(client_rejected, "xpyd_client_rejected_total", counter, GUARD,                                            \
      "Client connections the guard answered (408/431/503) or closed idle, by reason.")                         \
    X(discovery_up, "xpyd_discovery_up", gauge, NONE,                                                           \
      "--discovery: 1 while the router is in sync with etcd (its range answered, its watch open) and etcd "     \
      "answered within a lease TTL (--discovery-ttl-s).")                                                        \
    X(discovery_events, "xpyd_discovery_events_total", counter, NONE,                                          \
      "--discovery: instance and load changes read from etcd and applied.")                                      \
    X(discovery_invalid, "xpyd_discovery_invalid_total", counter, NONE,                                        \
      "--discovery: values in etcd ignored as malformed (logged with event=discovery_invalid).")                 \
    X(discovery_resyncs, "xpyd_discovery_resyncs_total", counter, NONE,                                        \
      "--discovery: full reads (range, then a new watch): at start, after etcd was unreachable, after compaction.") \
    X(discovery_sync_age_ms, "xpyd_discovery_last_sync_age_seconds", gauge, MSEC,                         \
      "--discovery: time since etcd last answered the router (range, watch message or lease keep-alive).")       \
    X(discovery_routers, "xpyd_discovery_routers", gauge, NONE,                                                \
      "--discovery: router replicas registered in etcd, this one included.")                                     \
    X(etcd_writes, "xpyd_etcd_writes_total", counter, NONE,                                                     \
      "--discovery: puts and deletes this router sent to etcd (its registration and its published load).")       \
    X(rank_reuses, "xpyd_rank_slot_reuses_total", counter, ROLE,                                                 \
      "Slots of removed ranks given to engines that joined later (once nothing was in flight on them).")      \
    X(endpoint_reuses, "xpyd_endpoint_slot_reuses_total", counter, NONE,                                        \
      "Endpoint slots no rank referred to any more, given to new addresses.")                                   \
    X(body_bytes, "xpyd_request_body_bytes", gauge, NONE,                                                       \
      "Request-body bytes the router holds now (bodies being read, and the source of every request in "        \
      "progress), against --max-body-memory-bytes.")                                                            \
    X(loops_refused, "xpyd_loops_refused_total", counter, NONE,                                                 \
      "Requests refused with 508 because they had already passed through this router (or --max-hops routers): " \
      "an engine address leads back to it.")                                                                     \
    X(tokenizer_prompts, "xpyd_tokenizer_prompts_total", counter, NONE,                                         \
      "--tokenizer: requests whose prompt the router tokenized (their prompt tokens are exact).")               \
    X(tokenizer_fallbacks, "xpyd_tokenizer_fallbacks_total", counter, TOKFB,                                    \
      "--tokenizer: requests that kept the byte estimate, by reason: template (a chat request, and the model "  \
      "has no chat template the router can render: see the start-up log), busy (--tokenizer-queue full), "      \
      "invalid_text (not valid UTF-8, e.g. a lone surrogate escape), shape (a prompt or message of another "   \
      "shape than the API's), media (image, audio or video parts: the model's own placeholders), render (the "  \
      "template failed on the request, e.g. raise_exception: the engine will judge it; or the request's own "   \
      "template did not compile), request_template (a request bringing its own chat_template without "        \
      "--trust-request-chat-template: vLLM refuses it then).")                                                \
    X(tokenizer_mismatch, "xpyd_tokenizer_mismatch_total", counter, NONE,                                       \
      "--tokenizer: prefill answers whose usage.prompt_tokens differed from the router's count (0 when the "    \
      "tokenizer is the engines' model's).")                                                                     \
    X(tokenizer_pending, "xpyd_tokenizer_queue_depth", gauge, NONE,                                             \
      "--tokenizer: prompts waiting for or being tokenized now (at most --tokenizer-queue).")                   \
    X(tokenizer_time, "xpyd_tokenizer_seconds", histogram, HIST,                                                \
      "--tokenizer: CPU time spent tokenizing one request's prompt (a chat request's template included).")     \
    X(tokenizer_cache_bytes, "xpyd_tokenizer_cache_bytes", gauge, NONE,                                         \
      "--tokenizer: memory the tokenization cache holds (ids of text pieces between special tokens: earlier "   \
      "turns of conversations), within --tokenizer-cache-bytes.")                                               \
    X(tokenizer_cache_hits, "xpyd_tokenizer_cache_hit_bytes_total", counter, NONE,                              \
      "--tokenizer: prompt bytes whose ids came from the tokenization cache.")                                  \
    X(tokenizer_cache_misses, "xpyd_tokenizer_cache_miss_bytes_total", counter, NONE,                           \
      "--tokenizer: prompt bytes the tokenization cache did not hold: hit rate = hits / (hits + misses).")      \
    X(tokenizer_cache_entries, "xpyd_tokenizer_cache_entries", gauge, NONE,                                     \
      "--tokenizer: pieces the tokenization cache holds.")                                                      \
    X(tokenizer_cache_alike, "xpyd_tokenizer_cache_alike_refused_total", counter, NONE,                         \
      "--tokenizer: pieces not kept because --tokenizer-cache-alike-max of the same length and ends were (a "   \
      "lookup compares at most those): a prompt built to make each piece compare with every other one cannot.") \
    X(tokenizer_tpl_bytes, "xpyd_tokenizer_request_template_cache_bytes", gauge, NONE,                          \
      "--trust-request-chat-template: memory of the request templates kept compiled (sources and trees), "     \
      "within --request-chat-template-cache-bytes.")                                                             \
    X(tokenizer_tpl_kept, "xpyd_tokenizer_request_templates_kept_total", counter, NONE,                         \
      "--trust-request-chat-template: requests whose own template was found compiled for an earlier one.")      \
    X(tokenizer_tpl_compiled, "xpyd_tokenizer_request_templates_compiled_total", counter, NONE,                 \
      "--trust-request-chat-template: requests whose own template was compiled (new, evicted, or not compiling).")

#endif
