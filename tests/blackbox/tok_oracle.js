// SPDX-License-Identifier: Apache-2.0
// The oracle for test_tokenizer.py: Hugging Face's own tokenizers (the Rust library, npm `tokenizers`,
// prebuilt). node tok_oracle.js TOKENIZER_JSON [--add-special-tokens] < one JSON string per line
// -> one JSON array of ids per line.
const { Tokenizer } = require("tokenizers");
const readline = require("readline");

(async () => {
  const tok = Tokenizer.fromFile(process.argv[2]);
  const special = process.argv.includes("--add-special-tokens");
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
