/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_config.c - libFuzzer harness: the router's JSON configuration file loader and topology expansion. */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/xpyd-fuzz-config-%d.json", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    char *argv[] = {"xpyd_router", "--config", path, "--dry-run", NULL};
    struct rt_config c;
    if (rt_config_load(&c, 4, argv) == 0) {
        FILE *null = fopen("/dev/null", "w");
        if (null) {
            rt_config_print(&c, null);
            fclose(null);
        }
    }
    rt_config_free(&c);
    unlink(path); /* not left in /tmp after the run */
    return 0;
}
