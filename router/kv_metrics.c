/* SPDX-License-Identifier: Apache-2.0 */
/* kv_metrics.c - the KV-event consumer's series on /metrics (kv_sub.h: rt_kv_metrics): per pool, and per rank
 * with a source, read from the consumer's counters (kv_sub_internal.h) and the index. */
#include "kv_sub.h"

#include "kv_sub_internal.h"
#include "router.h"
#include "xpyd_util.h"

#include <event2/buffer.h>
#include <inttypes.h>

#define K kv_K
#define roles kv_roles

#define EACH_ROLE for (int role = 0; role < 2; role++) if (K.on[role])
#define U64(x) ((uint64_t)atomic_load(&(x)))

static void header(struct evbuffer *b, const char *name, const char *type, const char *help)
{
    evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One series per subscribed rank, labelled as the instance series are: its events (0) or its blocks (1). */
static void source_series(struct evbuffer *b, const char *name, int blocks)
{
    EACH_ROLE for (size_t i = 0; i < K.cap && i < __atomic_load_n(&g_rt->reg.n_ranks[role], __ATOMIC_ACQUIRE); i++) {
        if (!atomic_load(&K.src[role][i].on))
            continue;
        char hp[300];
        int dp = rt_rank_identity(role, (int)i, hp, sizeof hp);
        evbuffer_add_printf(b, "%s{role=\"%s\",engine=\"%s\",dp_rank=\"%d\"} %" PRIu64 "\n", name, roles[role], hp,
                            dp < 0 ? 0 : dp,
                            blocks ? (uint64_t)kvi_blocks(K.idx[role], (int)i) : U64(K.src[role][i].events));
    }
}

/* Each family in one group (its HELP and TYPE, then its series for both pools), as the text format wants. */
void rt_kv_metrics(struct evbuffer *b)
{
    if (!K.on[0] && !K.on[1])
        return;
    static const char *const types[3] = {"stored", "removed", "cleared"};
    size_t blocks[2] = {0, 0};
    long precise[2] = {0, 0}, stale_n[2] = {0, 0}, down[2] = {0, 0}, unlike[2] = {0, 0};
    uint64_t now = xpyd_now_us();
    EACH_ROLE {
        size_t n = __atomic_load_n(&g_rt->reg.n_ranks[role], __ATOMIC_ACQUIRE);
        for (size_t i = 0; i < n && i < K.cap; i++) {
            const struct kv_src *s = &K.src[role][i];
            blocks[role] += kvi_blocks(K.idx[role], (int)i);
            if (!atomic_load(&s->on))
                continue;
            if (!atomic_load(&s->up))
                down[role]++;
            else if (atomic_load(&s->unlike_bs))
                unlike[role]++;
            else if (!rt_kv_source_trusted(s, now))
                stale_n[role]++;
            else
                precise[role]++;
        }
    }
    header(b, "xpyd_kv_events_batches_total", "counter", "KV-event batches applied, per pool.");
    EACH_ROLE evbuffer_add_printf(b, "xpyd_kv_events_batches_total{role=\"%s\"} %" PRIu64 "\n", roles[role],
                                  U64(K.batches[role]));
    header(b, "xpyd_kv_events_total", "counter", "KV events received, per pool and type.");
    EACH_ROLE for (int t = 0; t < 3; t++)
        evbuffer_add_printf(b, "xpyd_kv_events_total{role=\"%s\",type=\"%s\"} %" PRIu64 "\n", roles[role], types[t],
                            U64(K.events[role][t]));
    header(b, "xpyd_kv_events_gaps_total", "counter",
           "Gaps in a rank's sequence numbers (messages lost: replayed, or the rank's blocks forgotten).");
    EACH_ROLE evbuffer_add_printf(b, "xpyd_kv_events_gaps_total{role=\"%s\"} %" PRIu64 "\n", roles[role],
                                  U64(K.gaps[role]));
    header(b, "xpyd_kv_events_replays_total", "counter", "Replays asked for (a gap, or joining late), by result.");
    EACH_ROLE evbuffer_add_printf(b, "xpyd_kv_events_replays_total{role=\"%s\",result=\"ok\"} %" PRIu64 "\n"
                                     "xpyd_kv_events_replays_total{role=\"%s\",result=\"failed\"} %" PRIu64 "\n",
                                  roles[role], U64(K.replays_ok[role]), roles[role], U64(K.replays_failed[role]));
    header(b, "xpyd_kv_events_waiting", "gauge",
           "Messages kept while their rank's replay is under way (--kv-events-bind: taken after it, in order).");
    EACH_ROLE evbuffer_add_printf(b, "xpyd_kv_events_waiting{role=\"%s\"} %ld\n", roles[role],
                                  atomic_load(&K.waiting[role]));
    header(b, "xpyd_kv_events_resets_total", "counter",
           "Sequence numbers that went back (an engine restarted): the rank's blocks forgotten.");
    EACH_ROLE evbuffer_add_printf(b, "xpyd_kv_events_resets_total{role=\"%s\"} %" PRIu64 "\n", roles[role],
                                  U64(K.resets[role]));
    header(b, "xpyd_kv_events_decode_errors_total", "counter", "KV-event messages refused, by cause.");
    EACH_ROLE for (int e = 1; e < KVE_ECOUNT; e++)
        evbuffer_add_printf(b, "xpyd_kv_events_decode_errors_total{role=\"%s\",cause=\"%s\"} %" PRIu64 "\n",
                            roles[role], kve_error_names[e], U64(K.decode_errors[role][e]));
    header(b, "xpyd_kv_events_skipped_total", "counter",
           "KV events not (wholly) applied to the index, by cause (orphan: parent unknown; block_size: neither "
           "a multiple nor a divisor of --prefix-block-tokens; not_full_attention; shape; full: "
           "--kv-index-max-blocks; adapters: a LoRA adapter's name past --kv-index-max-adapters).");
    EACH_ROLE for (int e = 1; e < KVI_COUNT; e++)
        evbuffer_add_printf(b, "xpyd_kv_events_skipped_total{role=\"%s\",cause=\"%s\"} %" PRIu64 "\n", roles[role],
                            kvi_skip_names[e], U64(K.skipped[role][e]));
    header(b, "xpyd_kv_events_lag_seconds", "gauge", "The last batch: its arrival minus its timestamp.");
    EACH_ROLE evbuffer_add_printf(b, "xpyd_kv_events_lag_seconds{role=\"%s\"} %.6f\n", roles[role],
                                  (double)U64(K.lag_us[role]) / 1e6);
    header(b, "xpyd_kv_index_blocks", "gauge", "(rank, block) pairs the KV-event index holds.");
    EACH_ROLE evbuffer_add_printf(b, "xpyd_kv_index_blocks{role=\"%s\"} %zu\n", roles[role], blocks[role]);
    header(b, "xpyd_kv_index_adapters", "gauge",
           "LoRA adapter names the KV-event index knows (from blocks stored under them, or engines' GET /v1/models).");
    EACH_ROLE evbuffer_add_printf(b, "xpyd_kv_index_adapters{role=\"%s\"} %zu\n", roles[role],
                                  K.idx[role] ? kvi_adapters(K.idx[role]) : 0);
    header(b, "xpyd_kv_index_pieces", "gauge",
           "Engine blocks smaller than --prefix-block-tokens the KV-event index keeps until the block that ends a "
           "router block comes (SGLang's pages of one token): part of --kv-index-max-blocks.");
    EACH_ROLE evbuffer_add_printf(b, "xpyd_kv_index_pieces{role=\"%s\"} %zu\n", roles[role],
                                  K.idx[role] ? kvi_pieces(K.idx[role]) : 0);
    header(b, "xpyd_kv_index_bytes", "gauge", "Memory of the KV-event index.");
    EACH_ROLE evbuffer_add_printf(b, "xpyd_kv_index_bytes{role=\"%s\"} %zu\n", roles[role], kvi_bytes(K.idx[role]));
    header(b, "xpyd_kv_events_sources", "gauge",
           "Ranks with a KV-event source (an endpoint, or an engine heard on --kv-events-bind), by state: precise "
           "(placement uses their events), stale (sent a prompt, published nothing for --kv-events-stale-ms), "
           "block_size (its blocks neither a multiple nor a divisor of --prefix-block-tokens: they cannot match) "
           "or down (not connected to its publisher); placement is approximate for the last three.");
    EACH_ROLE evbuffer_add_printf(b, "xpyd_kv_events_sources{role=\"%s\",state=\"precise\"} %ld\n"
                                     "xpyd_kv_events_sources{role=\"%s\",state=\"stale\"} %ld\n"
                                     "xpyd_kv_events_sources{role=\"%s\",state=\"block_size\"} %ld\n"
                                     "xpyd_kv_events_sources{role=\"%s\",state=\"down\"} %ld\n",
                                  roles[role], precise[role], roles[role], stale_n[role], roles[role], unlike[role],
                                  roles[role], down[role]);
    header(b, "xpyd_kv_events_disconnects_total", "counter",
           "Connections to a rank's publisher lost (its blocks are then forgotten: it may have restarted).");
    EACH_ROLE evbuffer_add_printf(b, "xpyd_kv_events_disconnects_total{role=\"%s\"} %" PRIu64 "\n", roles[role],
                                  U64(K.disconnects[role]));
    if (K.nbound) {
        header(b, "xpyd_kv_events_unmatched_total", "counter",
               "Messages on --kv-events-bind whose topic names no rank (HOST:PORT as the router lists engines).");
        evbuffer_add_printf(b, "xpyd_kv_events_unmatched_total %" PRIu64 "\n", U64(K.unmatched));
    }
    header(b, "xpyd_kv_source_events_total", "counter", "KV events received from each rank with a source.");
    source_series(b, "xpyd_kv_source_events_total", 0);
    header(b, "xpyd_kv_source_blocks", "gauge", "Blocks each rank reports holding (what the index keeps of them).");
    source_series(b, "xpyd_kv_source_blocks", 1);
    header(b, "xpyd_kv_placements_total", "counter",
           "Picks whose chosen rank's cached prefix came from its events (precise) or from the router's own "
           "guess (approximate).");
    EACH_ROLE evbuffer_add_printf(b, "xpyd_kv_placements_total{role=\"%s\",mode=\"precise\"} %" PRIu64 "\n"
                                     "xpyd_kv_placements_total{role=\"%s\",mode=\"approximate\"} %" PRIu64 "\n",
                                  roles[role], U64(K.picks[role][1]), roles[role], U64(K.picks[role][0]));
}
