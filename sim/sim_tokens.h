/* sim_tokens.h - the simulator's token model: how prompts become token ids and what it generates.
 *
 * Rule (documented in the README): a text prompt's tokens are its whitespace-separated words, each word
 * mapped to an id by FNV-1a modulo SIM_VOCAB; a token-id array is taken as is. A chat prompt is, per
 * message, one role token followed by the words of its text content. Generated token i is a pure function
 * of (prompt hash, seed, i), so a prefill's first token equals the decode's first token, as under greedy
 * sampling, and every generated token's text is " " + one lowercase word. */
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

/* Appends the words of text (len bytes) as token ids. 0 or -ENOMEM. */
int sim_prompt_add_text(struct sim_prompt *p, const char *text, size_t len);
/* Appends one token id. 0 or -ENOMEM. */
int sim_prompt_add_id(struct sim_prompt *p, uint32_t id);
/* Computes p->hash. */
void sim_prompt_finish(struct sim_prompt *p);
void sim_prompt_free(struct sim_prompt *p);

/* Id of generated token number pos (0-based). */
uint32_t sim_gen_token(uint64_t prompt_hash, uint64_t seed, size_t pos);
/* Whether the model "emits EOS" after token pos, with probability eos_prob (0 = never). */
int sim_gen_eos(uint64_t prompt_hash, uint64_t seed, size_t pos, double eos_prob);
/* Writes the text of token id (" " + word, NUL-terminated) into out (cap >= 16); returns its length. */
size_t sim_token_text(uint32_t id, char *out, size_t cap);

/* Fills out (p->n * bytes_per_token bytes) with the prompt's deterministic "KV cache". */
void sim_kv_fill(const struct sim_prompt *p, size_t bytes_per_token, unsigned char *out);

#endif
