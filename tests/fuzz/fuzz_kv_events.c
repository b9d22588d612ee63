/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_kv_events.c - libFuzzer harness for the KV-event decoder (router/kv_events.c) and the index it feeds
 * (router/kv_index.c): any bytes are a decoded batch within the limits (events, hashes and token ids per event)
 * or a refusal with a cause and a message; a decoded batch is applied to one index that lives across inputs (the
 * first byte picks the rank, 8 ranks, blocks of 4 tokens: the events' own block sizes, 1, 2 or multiples of 4,
 * reach the pieces and the parts), which stays within its bound (pairs and pieces) and answers lookups of the
 * batch's own blocks; an adapter an event names is never taken for the base model (16 adapter names remembered,
 * so the bound is reached); never a crash, a leak or a read outside the input. */
#include "kv_events.h"
#include "kv_index.h"
#include "xb_prefix.h"

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    static const struct kve_limits lim = {64, 64, 1024};
    struct kv_batch b;
    char err[200];
    err[0] = '\0';
    int rc = kve_decode(data, size, &lim, &b, err, sizeof err);
    if (rc != KVE_OK) {
        assert(rc > 0 && rc < KVE_ECOUNT && err[0]);
        return 0;
    }
    assert(b.n <= lim.max_events);
    for (size_t i = 0; i < b.n; i++) {
        const struct kv_event *e = &b.ev[i];
        assert(e->type >= KVE_STORED && e->type <= KVE_CLEARED);
        assert(e->nhashes <= lim.max_hashes && e->ntokens <= lim.max_tokens);
        assert(e->type == KVE_STORED || !e->ntokens);
    }
    static struct kvi *x;
    enum { RANKS = 8, MAX = 4096 };
    if (!x) {
        x = kvi_new(RANKS, MAX);
        kvi_set_max_adapters(x, 16);
    }
    int rank = size ? data[0] % RANKS : 0;
    for (size_t i = 0; i < b.n; i++) {
        int rc = kvi_apply(x, rank, &b.ev[i], 4);
        assert(rc >= KVI_OK && rc < KVI_COUNT);
        if (b.ev[i].type == KVE_STORED && b.ev[i].lora_len && b.ev[i].lora_len < sizeof b.ev[i].lora_name &&
            !memchr(b.ev[i].lora_name, 0, b.ev[i].lora_len)) /* (a name as a request gives it) its key space, or past
                                                               * the bound none: never the base model's */
            assert(kvi_space_for(x, b.ev[i].lora_name) != 0);
        if (b.ev[i].type == KVE_STORED && b.ev[i].ntokens >= 4) { /* its first block, looked up as a prompt */
            uint64_t key = xb_hash_block_ids(xb_chain_seed(), b.ev[i].tokens, 4);
            uint32_t out[RANKS];
            kvi_match(x, &key, 1, 0, out);
            for (int r = 0; r < RANKS; r++)
                assert(out[r] <= 1);
        }
    }
    size_t total = kvi_pieces(x); /* pieces of router blocks (engine blocks smaller than 4) count too */
    for (int r = 0; r < RANKS; r++)
        total += kvi_blocks(x, r);
    assert(total <= MAX);
    if (size && data[0] == 0xff) /* now and then a rank forgotten, as a restart does */
        kvi_drop_rank(x, rank);
    kve_batch_free(&b);
    return 0;
}
