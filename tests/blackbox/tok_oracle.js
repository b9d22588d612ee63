// SPDX-License-Identifier: Apache-2.0
// The oracle for test_tokenizer.py: Hugging Face's own tokenizers (the Rust library, npm `tokenizers`,
// prebuilt). node tok_oracle.js TOKENIZER_JSON [--add-special-tokens [--config TOKENIZER_CONFIG_JSON]] [--truncate K]
// < one JSON string per line -> one JSON array of ids per line.
// --config: what transformers' fast Llama/CodeLlama/Gemma tokenizers do at load (update_post_processor in
// tokenization_llama_fast.py): the post-processor becomes a TemplateProcessing of bos_token/eos_token per
// add_bos_token (default true) and add_eos_token (default false), built here with Hugging Face's own
// templateProcessing - the processor vLLM's tokenizer then runs.
const { Tokenizer, templateProcessing } = require("tokenizers");
const fs = require("fs");
const readline = require("readline");

function transformersPostProcessor(tok, cfg) {
  const defaults = { LlamaTokenizer: ["<s>", "</s>"], CodeLlamaTokenizer: ["<s>", "</s>"],
                     GemmaTokenizer: ["<bos>", "<eos>"] }[(cfg.tokenizer_class || "").replace(/Fast$/, "")];
  if (!defaults) return;
  const name = (v, d) => (v === undefined ? d : v && typeof v === "object" ? v.content : v);
  const bos = name(cfg.bos_token, defaults[0]), eos = name(cfg.eos_token, defaults[1]);
  const addBos = typeof cfg.add_bos_token === "boolean" ? cfg.add_bos_token : true;
  const addEos = typeof cfg.add_eos_token === "boolean" ? cfg.add_eos_token : false;
  const single = (addBos ? bos + ":0 " : "") + "$A:0" + (addEos ? " " + eos + ":0" : "");
  const special = [];
  if (addBos) special.push([bos, tok.tokenToId(bos)]);
  if (addEos) special.push([eos, tok.tokenToId(eos)]);
  tok.setPostProcessor(templateProcessing(single, null, special));
}

(async () => {
  const tok = Tokenizer.fromFile(process.argv[2]);
  const special = process.argv.includes("--add-special-tokens");
  const ti = process.argv.indexOf("--truncate"); // Hugging Face's left truncation (vLLM's truncation_side)
  if (ti > 0) tok.setTruncation(parseInt(process.argv[ti + 1], 10), { direction: "left" });
  const ci = process.argv.indexOf("--config");
  if (special && ci > 0 && fs.existsSync(process.argv[ci + 1]))
    transformersPostProcessor(tok, JSON.parse(fs.readFileSync(process.argv[ci + 1], "utf8")));
  const out = [];
  const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of rl) {
    if (!line) continue;
    const enc = await tok.encode(JSON.parse(line), null, { addSpecialTokens: special });
    out.push(JSON.stringify(enc.getIds()));
  }
  process.stdout.write(out.join("\n") + (out.length ? "\n" : ""));
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
