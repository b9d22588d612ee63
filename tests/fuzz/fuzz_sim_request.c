/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_sim_request.c - libFuzzer harness: xpyd_sim's request validation (completions, chat, tokenize). */
#include "sim_request.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct sim_limits lim = {.model = "sim-model", .loras = "ad1,ad2=/loras/ad2", .max_model_len = 4096};
    for (int chat = 0; chat < 2; chat++) {
        struct sim_params p;
        char *err = NULL;
        if (sim_params_parse((const char *)data, size, chat, &lim, &p, &err) == 0)
            sim_params_free(&p);
        free(err);
    }
    struct sim_prompt pr;
    char *err = NULL;
    if (sim_tokenize_parse((const char *)data, size, &pr, &err) == 0)
        sim_prompt_free(&pr);
    free(err);
    return 0;
}
