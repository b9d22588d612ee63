/* SPDX-License-Identifier: Apache-2.0 */
/* sim_tokens.h - the simulator's token model: how prompts become token ids and what it generates.
 *
 * Rule (documented in the README): a text prompt's tokens are its whitespace-separated words, each word
 * mapped to an id by FNV-1a modulo SIM_VOCAB; a token-id array is taken as is. A chat prompt is, per
 * message, one role token followed by the words of its text content (a final assistant message continued
 * with `continue_final_message` has no role token). The next generated token is a pure function of (the
 * context so far, seed): the context starts as the prompt's hash and is extended by each generated word as
 * it reads back as prompt text, so a prefill's first token equals the decode's first token (greedy
 * sampling), and a request whose prompt is another's prompt plus the words it generated continues exactly as
 * that one did (a migrated stream). Every generated token's text is " " + one lowercase word. */
#ifndef SIM_TOKENS_H
#define SIM_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#define SIM_VOCAB 32000u

struct sim_prompt {
    uint32_t *ids; /* owned */
    size_t n, cap;
    uint64_t hash; /* FNV-1a over ids, valid after sim_prompt_finish() */
};

/* Appends the words of text (len bytes) as token ids (with an encoder set: its ids, no special tokens).
 * 0, -ENOMEM, or -EINVAL (an encoder refused the text: not UTF-8). */
int sim_prompt_add_text(struct sim_prompt *p, const char *text, size_t len);
/* The same for a completion's whole prompt: an encoder adds its special tokens (BOS) unless special is 0 (the
 * request's add_special_tokens: false), as vLLM does. */
int sim_prompt_add_prompt(struct sim_prompt *p, const char *text, size_t len, int special);
/* A real tokenizer instead of the word model (xpyd_sim --tokenizer): encode(arg, text, len, add_special, &ids,
 * &n) returns 0 with malloc'ed ids, or nonzero for text it refuses. NULL: the word model. */
typedef int (*sim_encoder_fn)(void *arg, const char *text, size_t len, int add_special, uint32_t **ids, size_t *n);
void sim_tokens_set_encoder(sim_encoder_fn encode, void *arg);
/* The model's chat template (xpyd_sim --tokenizer with a template): render(arg, request body, &ids, &n, err, cap)
 * gives a chat request's prompt ids; 0, -EINVAL (the template or the text refused it: err says why). */
struct cJSON;
typedef int (*sim_chat_fn)(void *arg, const struct cJSON *root, uint32_t **ids, size_t *n, char *err, size_t cap);
void sim_tokens_set_chat(sim_chat_fn render, void *arg);
/* How a request body's numbers were written, kept on its parsed tree for the template (xtok_json_literals: 1.0 a
 * float, as vLLM's json.loads reads it); set with the template, called on each body parsed (none set: nothing). */
typedef void (*sim_literals_fn)(struct cJSON *root, const char *body, size_t len);
void sim_tokens_set_literals(sim_literals_fn fn);
void sim_tokens_literals(struct cJSON *root, const char *body, size_t len);
/* A chat request's prompt through the template: 0, -ENOSYS (none set: the caller models chat itself), -EINVAL
 * with err, -ENOMEM. */
int sim_prompt_add_chat(struct sim_prompt *p, const struct cJSON *root, char *err, size_t cap);
/* vLLM's truncate_prompt_tokens: the prompt cut to its last k tokens; special: it was encoded with the
 * tokenizer's special tokens, which stay around them (the tokenizer's own truncation, set with
 * sim_tokens_set_truncate; without one the last k ids are kept). */
typedef size_t (*sim_truncate_fn)(void *arg, uint32_t *ids, size_t n, size_t k, int special);
void sim_tokens_set_truncate(sim_truncate_fn fn, void *arg);
void sim_prompt_truncate(struct sim_prompt *p, size_t k, int special);
/* Appends one token id. 0 or -ENOMEM. */
int sim_prompt_add_id(struct sim_prompt *p, uint32_t id);
/* Computes p->hash. */
void sim_prompt_finish(struct sim_prompt *p);
void sim_prompt_free(struct sim_prompt *p);

/* Id of the next generated token in context ctx (the prompt's hash, extended by sim_ctx_extend). */
uint32_t sim_gen_token(uint64_t ctx, uint64_t seed);
/* The context after generating token id: extended by the id its word has when read back as prompt text. */
uint64_t sim_ctx_extend(uint64_t ctx, uint32_t id);
/* Whether the model "emits EOS" in context ctx, with probability eos_prob (0 = never). */
int sim_gen_eos(uint64_t ctx, uint64_t seed, double eos_prob);
/* Writes the text of token id (" " + word, NUL-terminated) into out (cap >= 16); returns its length. */
size_t sim_token_text(uint32_t id, char *out, size_t cap);

/* Fills out (p->n * bytes_per_token bytes) with the prompt's deterministic "KV cache". */
void sim_kv_fill(const struct sim_prompt *p, size_t bytes_per_token, unsigned char *out);

#endif
