/* SPDX-License-Identifier: Apache-2.0 */
/* tok_cfg.c - reading tokenizer.json's parts (tok_load.c, tok_model.c): a member's string or flag, and an error
 * that quotes the file's text in part. */
#include "tok_internal.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>

int tok_fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen)
        vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* how much of a file's string an error quotes: at most 60 bytes, cut where a character starts */
int tok_clip(const char *s, size_t len)
{
    size_t n = len;
    if (n > 60)
        for (n = 60; n && ((unsigned char)s[n] & 0xC0) == 0x80; n--)
            ;
    return (int)n;
}

const char *tok_str_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

int tok_bool_of(const cJSON *o, const char *key)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key));
}

int tok_is_set(const cJSON *o, const char *key) /* present and neither null nor empty */
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && !v->valuestring[0]);
}
