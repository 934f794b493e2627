// The reference for the tokenizer tests: OpenAI's tiktoken (the npm package
// tiktoken@1.0.22 in data/tiktoken, fetched by tools/setup.sh), its "gpt2"
// encoding, encodes each input file with encode_ordinary (special tokens are
// text), as llm.c's data scripts do.
//
//   node gpt2_reference_encode.js TIKTOKEN_DIR OUT [--vocab DIR] [--pieces] FILE...
//
// Each file is read as UTF-8 (invalid bytes become U+FFFD, a BOM is kept)
// and encoded whole. OUT receives, per file, a little-endian uint32 count
// followed by that many uint32 token ids. --vocab DIR: a tiktoken encoding
// made from DIR/encoder.json and DIR/vocab.bpe the way tiktoken's own
// data_gym_to_mergeable_bpe_ranks makes one (ranks: the 256 bytes, then the
// merges in order), with gpt2's pattern. --pieces: instead of ids, the
// count of the pre-tokenisation pattern's matches, from JavaScript's regex
// engine running gpt2's pattern over tiktoken's own character classes
// (tools/gen_unicode_classes.js probes them).
'use strict';
const fs = require('fs');
const path = require('path');

const args = process.argv.slice(2);
const [dir, out] = args;
let vocab = null;
let pieces = false;
let rest = args.slice(2);
for (;;) {
  if (rest[0] === '--vocab') {
    vocab = rest[1];
    rest = rest.slice(2);
  } else if (rest[0] === '--pieces') {
    pieces = true;
    rest = rest.slice(1);
  } else {
    break;
  }
}
const files = rest;
const tiktoken = require(path.resolve(dir, 'tiktoken.cjs'));
const gpt2 = require(path.resolve(dir, 'encoders', 'gpt2.json'));

// tiktoken's load.py, data_gym_to_mergeable_bpe_ranks, as a .tiktoken text.
function dataGymRanks(vocabDir) {
  const printable = (b) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
  const rankToByte = [];
  const byteOf = new Map();
  for (let b = 0; b < 256; b++) {
    if (printable(b)) {
      rankToByte.push(b);
      byteOf.set(String.fromCodePoint(b), b);
    }
  }
  for (let b = 0, n = 0; b < 256; b++) {
    if (!printable(b)) {
      rankToByte.push(b);
      byteOf.set(String.fromCodePoint(256 + n++), b);
    }
  }
  const ranks = new Map();
  rankToByte.forEach((b, i) => ranks.set(Buffer.from([b]).toString('base64'), i));
  const decode = (s) => Buffer.from(Array.from(s, (c) => byteOf.get(c)));
  const lines = fs.readFileSync(path.join(vocabDir, 'vocab.bpe'), 'utf8').split('\n').slice(1, -1);
  let n = 256;
  for (const line of lines) {
    const [first, second] = line.split(/\s+/).filter((x) => x);
    ranks.set(Buffer.concat([decode(first), decode(second)]).toString('base64'), n++);
  }
  // tiktoken checks that encoder.json agrees (special tokens aside).
  const encoder = JSON.parse(fs.readFileSync(path.join(vocabDir, 'encoder.json'), 'utf8'));
  for (const [token, id] of Object.entries(encoder)) {
    const key = decode(token).toString('base64');
    if (ranks.has(key) && ranks.get(key) !== id)
      throw new Error(`${vocabDir}: token ${JSON.stringify(token)} is ${id}, its rank ${ranks.get(key)}`);
  }
  return Array.from(ranks, ([k, v]) => `${k} ${v}`).join('\n') + '\n';
}

// gpt2's pattern over tiktoken's classes, for JavaScript's engine.
function piecesRegex() {
  const cls = require(path.resolve(__dirname, '..', 'tools', 'gen_unicode_classes.js')).classes(dir);
  const set = (c) => {
    let s = '';
    for (let lo = 0; lo < 0x110000; lo++) {
      if (cls[lo] !== c || (lo >= 0xd800 && lo <= 0xdfff)) continue;
      let hi = lo;
      while (hi + 1 < 0x110000 && cls[hi + 1] === c && !(hi + 1 >= 0xd800 && hi + 1 <= 0xdfff)) hi++;
      s += `\\u{${lo.toString(16)}}-\\u{${hi.toString(16)}}`;
      lo = hi;
    }
    return `[${s}]`;
  };
  const [O, L, N, S] = [0, 1, 2, 3].map(set);
  const notS = S.replace('[', '[^');
  return new RegExp(
    `'s|'t|'re|'ve|'m|'ll|'d| ?${L}+| ?${N}+| ?${O}+|${S}+(?!${notS})|${S}+`,
    'gu'
  );
}

const enc = vocab
  ? new tiktoken.Tiktoken(dataGymRanks(vocab), {}, gpt2.pat_str)
  : tiktoken.get_encoding('gpt2');
const pat = pieces ? piecesRegex() : null;
const decoder = new TextDecoder('utf-8', { ignoreBOM: true });

const chunks = [];
for (const f of files) {
  const text = decoder.decode(fs.readFileSync(f));
  const values = pieces ? [] : Array.from(enc.encode_ordinary(text));
  const count = pieces ? Array.from(text.matchAll(pat)).length : values.length;
  const buf = Buffer.alloc(4 + 4 * values.length);
  buf.writeUInt32LE(count, 0);
  values.forEach((v, i) => {
    if (!Number.isInteger(v)) throw new Error(`${f}: token ${i} is ${v}`);
    buf.writeUInt32LE(v, 4 + 4 * i);
  });
  chunks.push(buf);
}
enc.free();
fs.writeFileSync(out, Buffer.concat(chunks));
