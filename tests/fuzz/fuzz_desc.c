/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_desc.c - libFuzzer harness: a peer's descriptor as the transfer engine reads it (xt_desc_parse in
 * transfer/xt_desc.c; the JSON a peer sends in its handshake, so a hostile peer controls it). Checks: it
 * never reads outside the input (ASan), the result is self-consistent (buffers counted, rkeys within
 * XT_MAX_NICS), and it frees what it made (LeakSanitizer). */
#include "xt_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *json = malloc(size + 1);
    memcpy(json, data, size);
    json[size] = '\0';
    struct xt_desc d;
    if (xt_desc_parse(json, &d) == 0) {
        if (d.nnics < 0 || (d.nbufs && !d.bufs))
            abort();
        for (size_t i = 0; i < d.nbufs; i++)
            if (d.bufs[i].nrkeys < 0)
                abort();
        xt_desc_free(&d);
    }
    free(json);
    return 0;
}
