/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_sse.c - libFuzzer harness: the SSE splitter, fed the input in pieces whose sizes the input chooses. */
#include "xpyd_sse.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int check(void *arg, const char *data, size_t len, const char *raw, size_t rawlen)
{
    if (data[len] != '\0' || rawlen < 2 || raw[rawlen - 1] != '\n')
        abort(); /* the contract of xpyd_sse_event_cb */
    (*(size_t *)arg)++;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    struct xpyd_sse_parser p = {.max_event = 4096};
    size_t events = 0, pos = 1, step = (size_t)(data[0] % 17) + 1;
    while (pos < size) {
        size_t n = size - pos < step ? size - pos : step;
        if (xpyd_sse_feed(&p, (const char *)data + pos, n, check, &events) < 0)
            break;
        pos += n;
    }
    xpyd_sse_reset(&p);
    return 0;
}
