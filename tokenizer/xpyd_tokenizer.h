/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_tokenizer.h - libxpyd_tokenizer: a Hugging Face model directory's tokenizer (tokenizer.json) loaded and
 * run as Hugging Face `tokenizers` runs it, token for token. No router dependencies.
 *
 * Supported (anything else is an error at load naming the component, never a silent wrong answer):
 *   normalizer     none, NFC, NFKC, NFD, NFKD, Sequence of those
 *   pre_tokenizer  Split (Regex or String pattern, behaviour Isolated, not inverted), ByteLevel (with or
 *                  without its GPT-2 regex, add_prefix_space), Sequence of those
 *   model          BPE over byte-level symbols (merges as "a b" strings or [a, b] pairs, ignore_merges; no
 *                  dropout, no continuing_subword_prefix / end_of_word_suffix)
 *   post_processor none, ByteLevel, TemplateProcessing (single), Sequence of those
 *   added_tokens   matched before the model, longest first, special or not; lstrip/rstrip honoured; tokens
 *                  with normalized=true are matched in the normalized text
 * Input is UTF-8; invalid UTF-8 is refused (XTOK_EINVAL), as Hugging Face's API takes only valid strings.
 * A loaded tokenizer is immutable: any number of threads may encode with it at once. */
#ifndef XPYD_TOKENIZER_H
#define XPYD_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct xtok;

#define XTOK_EINVAL (-1) /* the input is not valid UTF-8 */
#define XTOK_ENOMEM (-2)

/* Loads DIR/tokenizer.json. NULL on failure, with the reason (file, component, key) in err. */
struct xtok *xtok_load(const char *dir, char *err, size_t errlen);
/* The same from tokenizer.json's text. */
struct xtok *xtok_load_json(const char *json, size_t len, char *err, size_t errlen);
void xtok_free(struct xtok *t);

/* Encodes text[0..len) into *ids (malloc'ed, the caller frees it; *n ids). add_special: the post-processor's
 * special tokens (e.g. Llama 3's <|begin_of_text|>), as Hugging Face's add_special_tokens. 0 or XTOK_E*. */
int xtok_encode(const struct xtok *t, const char *text, size_t len, int add_special, uint32_t **ids, size_t *n);

/* The vocabulary's size (the model's tokens and the added ones: the largest id + 1). */
size_t xtok_vocab_size(const struct xtok *t);
/* The id of a token as written in tokenizer.json (an added token's content, or a vocabulary entry), -1 if none. */
long xtok_token_id(const struct xtok *t, const char *token);

#ifdef __cplusplus
}
#endif
#endif
