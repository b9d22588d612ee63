/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_tokenizer.h - libxpyd_tokenizer: a Hugging Face model directory's tokenizer (tokenizer.json) loaded and
 * run as Hugging Face `tokenizers` runs it, token for token. No router dependencies.
 *
 * Supported (anything else is an error at load naming the component, never a silent wrong answer):
 *   normalizer     none, NFC, NFKC, NFD, NFKD, Prepend, Replace (a string pattern), Sequence of those
 *   pre_tokenizer  Split (Regex or String pattern, any behaviour, inverted or not), Digits, Metaspace (first),
 *                  ByteLevel (last; with or without its GPT-2 regex, add_prefix_space), Sequence of those
 *   model          BPE over byte-level symbols or SentencePiece-style (byte_fallback, unk_token, fuse_unk);
 *                  merges as "a b" strings or [a, b] pairs, ignore_merges; no dropout, no
 *                  continuing_subword_prefix / end_of_word_suffix
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

/* A tokenization cache shared by threads (tok_cache.c): the ids of text pieces between added tokens (a chat
 * template's special tokens delimit messages), so a conversation's earlier turns are not encoded again. Pieces
 * shorter than min_piece bytes are not kept; past max_bytes (entries: their text and ids) the least recently used
 * go. Its hash table (8 bytes per 512 of max_bytes, rounded up to a power of two, at most 128 MiB) is allocated
 * and written here, once. A cache serves one tokenizer: the same piece has other ids under another. */
struct xtok_cache;
struct xtok_cache_stats {
    size_t bytes, entries;
    uint64_t hits, misses, hit_bytes, miss_bytes;
    uint64_t alike_refused; /* pieces not kept: as many alike (length and ends) were (tok_cache.c) */
};
struct xtok_cache *xtok_cache_new(size_t max_bytes, size_t min_piece);
void xtok_cache_free(struct xtok_cache *c);
/* At most n pieces (4 unless set; at least 1) of one length with the same first and last 32 bytes, which the key
 * reads, are kept at once: a lookup compares at most n texts, whatever a prompt holds. */
void xtok_cache_set_alike_max(struct xtok_cache *c, size_t n);
void xtok_cache_stats(struct xtok_cache *c, struct xtok_cache_stats *st);
/* xtok_encode through a cache (NULL: none): the same ids. */
int xtok_encode_cached(const struct xtok *t, struct xtok_cache *c, const char *text, size_t len, int add_special,
                       uint32_t **ids, size_t *n);
/* Left truncation, as Hugging Face's with truncation_side "left" and max_length (vLLM's truncate_prompt_tokens):
 * the ids of one encode (add_special as it was encoded) cut to at most max_len, their last tokens kept and the
 * post-processor's special tokens kept around them. Returns the new count (ids moved in place). */
size_t xtok_truncate_left(const struct xtok *t, uint32_t *ids, size_t n, size_t max_len, int add_special);

/* The vocabulary's size (the model's tokens and the added ones: the largest id + 1). */
size_t xtok_vocab_size(const struct xtok *t);
/* The id of a token as written in tokenizer.json (an added token's content, or a vocabulary entry), -1 if none. */
long xtok_token_id(const struct xtok *t, const char *token);

/* ---- chat templates (tok_chat.c, tpl_*.c) ----
 * A Jinja2 subset rendered as transformers renders chat templates (jinja2's ImmutableSandboxedEnvironment with
 * trim_blocks, lstrip_blocks and loop controls; tojson as json.dumps with ensure_ascii=False; raise_exception,
 * strftime_now), with Python's value semantics. A construct outside the subset fails at compile time with its
 * line; a render is bounded in output, memory and steps. Compiled templates are immutable: any number of
 * threads may render one at once. */
struct xtpl;
struct cJSON;
struct xtpl_limits {
    size_t max_output;  /* bytes of rendered text (0: 16 MiB) */
    size_t max_memory;  /* bytes a render may allocate (0: 256 MiB) */
    uint64_t max_steps; /* nodes evaluated (0: 10 million) */
};
struct xtpl *xtpl_compile(const char *src, size_t len, char *err, size_t errlen);
void xtpl_free(struct xtpl *t);
/* Renders with vars' members as the template's variables (a JSON object). 0, or -1 with the reason (and line). */
int xtpl_render(const struct xtpl *t, const struct cJSON *vars, const struct xtpl_limits *lim, char **out,
                size_t *n, char *err, size_t errlen);

/* Numbers as Python's json.loads reads them, for a request's JSON parsed by cJSON into tree from src[0..len): a
 * number written as a float ("1.0") stays a float in the template (printed "1.0", as vLLM's template prints it)
 * and an integer past 2^53 exact, where cJSON's double alone would make them 1 and a rounded value. Call it on
 * whatever is parsed for xtok_chat_render (the body, a tool call's arguments string). */
void xtok_json_literals(struct cJSON *tree, const char *src, size_t len);

/* A model directory's chat template: template_file if given, else DIR/chat_template.jinja and
 * DIR/additional_chat_templates/NAME.jinja (named templates, as transformers saves them), else
 * tokenizer_config.json's chat_template (a string, or named templates: "default", "tool_use" when the request
 * has tools); its special tokens (bos_token, eos_token, ...) from tokenizer_config.json and
 * special_tokens_map.json. NULL with the reason when there is none or it does not compile. */
struct xtok_chat;
struct xtok_chat *xtok_chat_load(const char *dir, const char *template_file, char *err, size_t errlen);
void xtok_chat_free(struct xtok_chat *c); /* (one reference: a kept request template lives on while in use) */
/* The template a chat request body is rendered with, as vLLM selects it: c, or the request's own (its
 * chat_template_kwargs' chat_template, else its chat_template; null or absent: none) compiled with c's special
 * tokens into *mine (the caller frees it, before c: it shares c's special tokens), where c has named templates
 * and it is one's name that one, as
 * transformers takes a name. Renders never see the kwarg as a variable (apply_chat_template's own argument).
 * NULL with *why and err when it cannot be: XTOK_REQ_NOT_STRING, XTOK_REQ_UNTRUSTED (trust 0: vLLM refuses it
 * without --trust-request-chat-template; err is vLLM's message), XTOK_REQ_COMPILE ("the request's
 * chat_template: line N: ..."). */
enum { XTOK_REQ_NOT_STRING = 1, XTOK_REQ_UNTRUSTED, XTOK_REQ_COMPILE };
const struct xtok_chat *xtok_chat_for_request(const struct xtok_chat *c, const struct cJSON *req, int trust,
                                              struct xtok_chat **mine, int *why, char *err, size_t errlen);
/* Request templates compiled by xtok_chat_for_request kept for the requests that bring the same source after
 * them (transformers caches its compiled templates too): at most max_bytes of memory (sources and compiled trees,
 * a tree at least 64 KB), least recently used out (a larger one, or one that does not compile, is compiled for its
 * request alone); 0: none kept, as without the call. Call it before rendering starts; then
 * xtok_chat_for_request may be called from any thread. */
int xtok_chat_keep_request_templates(struct xtok_chat *c, size_t max_bytes);
struct xtok_chat_kept_stats {
    size_t bytes, entries; /* memory kept now, and how many */
    uint64_t hits, compiled; /* requests that found theirs kept, or compiled it */
};
void xtok_chat_kept_stats(const struct xtok_chat *c, struct xtok_chat_kept_stats *st);
/* 1 when the template loops over a message's content parts (vLLM then passes content as a list of
 * {"type": "text", "text": ...} parts: its "openai" content format), 0 when it reads content as a string. */
int xtok_chat_openai_content(const struct xtok_chat *c);
/* Renders an OpenAI chat request body (messages, tools, documents, add_generation_prompt (default true, as
 * vLLM), continue_final_message, chat_template_kwargs) into the prompt text, byte for byte. 0 or -1 with err. */
int xtok_chat_render(const struct xtok_chat *c, const struct cJSON *request, const struct xtpl_limits *lim,
                     char **out, size_t *n, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
