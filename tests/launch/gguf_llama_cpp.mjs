// For gguf_export_llama_cpp_test: a real llama.cpp (node-llama-cpp's CPU
// build) reads dtrain's GGUF export and is compared with dtrain.
//   node gguf_llama_cpp.mjs prep TRAIN_BIN CTX TOKENS
//     the prompts' tokens from `dtrain tokenize` (train.bin: a 256-int32
//     header, then uint16 tokens, each prompt after <|endoftext|>), padded
//     with 50256 to CTX each, as raw i32 for lm_logits_tool
//   node gguf_llama_cpp.mjs check PACKAGE_DIR MODEL.gguf TRAIN_BIN CTX LOGITS PADDED TOL PROMPT...
//     llama.cpp's tokens of each PROMPT equal dtrain's; its log-probabilities
//     (teacher-forced, every position, the full vocabulary) are within TOL of
//     the log-softmax of dtrain's logits (LOGITS: f32, prompts x CTX x
//     PADDED, of which the 50257 real tokens count); prints one line per
//     check, "ok" or "not ok", and exits 1 on a failure.
//   node gguf_llama_cpp.mjs greedy PACKAGE_DIR MODEL.gguf CTX N SAMPLES PROMPT...
//     llama.cpp's greedy continuation of each PROMPT by N tokens (the token
//     of largest probability, teacher-forced) is the one `dtrain sample
//     --temperature 0 --sample-len N` printed (SAMPLES/sampleI: the prompt,
//     then the continuation), up to the first step whose top two
//     log-probabilities are within 2e-3 (a near-tie either may break).
//   node gguf_llama_cpp.mjs slice SHARD WINDOWS CTX OUT
//     the first WINDOWS x CTX + 1 tokens of SHARD (llm.c's format) as the
//     shard OUT: the windows `dtrain eval` takes from it are SHARD's first
//   node gguf_llama_cpp.mjs ppl PACKAGE_DIR MODEL.gguf SHARD CTX
//     llama.cpp's loss on SHARD as `dtrain eval` computes it: the windows
//     tokens [k*CTX, k*CTX + CTX) each from an empty context (non-
//     overlapping), every position scored on the next token, the mean of
//     -log p; prints "llama.cpp loss=X.XXXXXX ppl=Y over N windows".
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const EOT = 50256, VOCAB = 50257;
const [mode, ...args] = process.argv.slice(2);

function promptsOf(trainBin) {
  const buf = fs.readFileSync(trainBin);
  const toks = new Uint16Array(buf.buffer, buf.byteOffset + 1024, (buf.length - 1024) / 2);
  const prompts = [];
  for (const t of toks) {
    if (t === EOT) prompts.push([]);
    else prompts[prompts.length - 1].push(t);
  }
  return prompts;
}

if (mode === "prep") {
  const [trainBin, ctx, out] = args;
  const T = Number(ctx), prompts = promptsOf(trainBin);
  const a = new Int32Array(prompts.length * T).fill(EOT);
  prompts.forEach((p, i) => {
    if (p.length > T) throw new Error(`prompt ${i} has ${p.length} tokens, more than ${T}`);
    a.set(p, i * T);
  });
  fs.writeFileSync(out, Buffer.from(a.buffer));
  process.exit(0);
}

function shardTokens(file) {
  const buf = fs.readFileSync(file);
  const n = buf.readInt32LE(8);
  return { header: buf.subarray(0, 1024), tokens: new Uint16Array(buf.buffer, buf.byteOffset + 1024, n) };
}

if (mode === "slice") {
  const [shard, windows, ctx, out] = args;
  const { header, tokens } = shardTokens(shard);
  const n = Number(windows) * Number(ctx) + 1;
  if (n > tokens.length) throw new Error(`${shard} holds ${tokens.length} tokens, not ${n}`);
  const h = Buffer.from(header);
  h.writeInt32LE(n, 8);
  fs.writeFileSync(out, Buffer.concat([h, Buffer.from(tokens.slice(0, n).buffer)]));
  process.exit(0);
}
const greedy = mode === "greedy";
const [pkg, model, ...rest] = args;
const [trainBin, ctx, logitsFile, padded, tol, ...texts] = greedy ? [null, rest[0], null, 0, 0,
  ...rest.slice(3)] : mode === "ppl" ? [rest[0], rest[1]] : rest;
const T = Number(ctx), V = Number(padded), TOL = Number(tol);
const { getLlama } = await import(
  pathToFileURL(path.join(pkg, "node_modules/node-llama-cpp/dist/index.js")).href);
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const lm = await llama.loadModel({ modelPath: model, gpuLayers: 0 });
const context = await lm.createContext({
  contextSize: T, sequences: 1, threads: 2, flashAttention: false,
  experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
});
const sequence = context.getSequence();
if (mode === "ppl") {
  const tokens = shardTokens(trainBin).tokens, windows = Math.floor((tokens.length - 1) / T);
  let nll = 0;
  for (let k = 0; k < windows; k++) {
    const x = Array.from(tokens.subarray(k * T, k * T + T));
    await sequence.clearHistory();
    const out = await sequence.controlledEvaluate(
      x.map((t) => [t, { generateNext: { probabilities: true } }]));
    for (let pos = 0; pos < T; pos++)
      nll -= Math.log(out[pos].next.probabilities.get(tokens[k * T + pos + 1]));
  }
  const loss = nll / (windows * T);
  console.log(`llama.cpp loss=${loss.toFixed(6)} ppl=${Math.exp(loss).toFixed(4)} over ${windows} windows`);
  process.exit(0);
}
if (greedy) {
  const n = Number(rest[1]), samples = rest[2];
  let failures = 0, compared = 0;
  for (let i = 0; i < texts.length; i++) {
    const tokens = Array.from(lm.tokenize(texts[i], false)), start = tokens.length;
    let tie = "";
    while (tokens.length < start + n) {
      await sequence.clearHistory();
      const out = await sequence.controlledEvaluate(tokens.map((t, k) =>
        k === tokens.length - 1 ? [t, { generateNext: { probabilities: true } }] : t));
      const [[top, p1], [, p2]] = out[tokens.length - 1].next.probabilities.entries();
      if (Math.log(p1) - Math.log(p2) <= 2e-3) {
        tie = ` (then a near-tie)`;
        break;
      }
      tokens.push(top);
    }
    const theirs = texts[i] + lm.detokenize(tokens.slice(start));
    const ours = fs.readFileSync(path.join(samples, `sample${i}`), "utf8");
    const ok = ours.startsWith(theirs);
    compared += tokens.length - start;
    if (!ok) failures++;
    console.log(`${ok ? "ok" : "not ok"} - prompt ${i}: llama.cpp's greedy ` +
      `${JSON.stringify(theirs)}${tie} begins dtrain's ${JSON.stringify(ours)}`);
  }
  console.log(`${failures} failed; ${compared} greedy tokens compared`);
  process.exit(failures ? 1 : 0);
}
const prompts = promptsOf(trainBin);
const lbuf = fs.readFileSync(logitsFile);
const logits = new Float32Array(lbuf.buffer, lbuf.byteOffset, lbuf.length / 4);
let failures = 0, overall = 0;
const report = (ok, what) => {
  console.log(`${ok ? "ok" : "not ok"} - ${path.basename(model)}: ${what}`);
  if (!ok) failures++;
};
report(prompts.length === texts.length, `${texts.length} prompts tokenized by dtrain`);
for (let i = 0; i < texts.length; i++) {
  const theirs = Array.from(lm.tokenize(texts[i], false)), ours = prompts[i] ?? [];
  report(JSON.stringify(theirs) === JSON.stringify(ours),
    `prompt ${i}: llama.cpp's tokens ${JSON.stringify(theirs)} equal dtrain's ${JSON.stringify(ours)}`);
  await sequence.clearHistory();
  const out = await sequence.controlledEvaluate(
    ours.map((t) => [t, { generateNext: { probabilities: true } }]));
  let worst = 0, at = "";
  for (let pos = 0; pos < ours.length; pos++) {
    const row = logits.subarray((i * T + pos) * V, (i * T + pos) * V + VOCAB);
    let max = -Infinity;
    for (const x of row) max = Math.max(max, x);
    let sum = 0;
    for (const x of row) sum += Math.exp(x - max);
    const lse = max + Math.log(sum);
    const probs = out[pos]?.next?.probabilities;
    if (!probs || probs.size !== VOCAB) {
      worst = Infinity;
      at = `position ${pos}: ${probs ? probs.size : "no"} probabilities`;
      break;
    }
    for (let t = 0; t < VOCAB; t++) {
      const ours_lp = row[t] - lse;
      if (ours_lp < -40) continue; // below f32 probabilities' reach
      const d = Math.abs(Math.log(probs.get(t) ?? 0) - ours_lp);
      if (!(d <= worst)) { worst = d; at = `position ${pos}, token ${t}`; }
    }
  }
  overall = Math.max(overall, worst);
  report(worst <= TOL,
    `prompt ${i}: log-probabilities at ${ours.length} positions within ${TOL} of dtrain's ` +
    `(largest difference ${worst.toExponential(2)} at ${at})`);
}
sequence.dispose();
console.log(`${failures} failed; largest log-probability difference ${overall.toExponential(2)}`);
await context.dispose();
await lm.dispose();
process.exit(failures ? 1 : 0);
