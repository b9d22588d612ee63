/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_kv_events.c - libFuzzer harness for the KV-event decoder (router/kv_events.c): any bytes are a decoded
 * batch within the limits (events, hashes and token ids per event) or a refusal with a cause and a message;
 * never a crash, a leak or a read outside the input. */
#include "kv_events.h"

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

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
    kve_batch_free(&b);
    return 0;
}
