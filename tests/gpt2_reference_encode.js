// The reference for the tokenizer tests: gpt-3-encoder@1.1.4's own
// Encoder.js (data/gpt2/, fetched by tools/setup.sh) encodes each input file.
//
//   node gpt2_reference_encode.js GPT2_DIR OUT [--pieces] FILE...
//
// Each file is read as UTF-8 (invalid bytes become U+FFFD, a BOM is kept)
// and encoded whole, as one call of encode(). OUT receives, per file, a
// little-endian uint32 count followed by that many uint32 token ids; with
// --pieces, the count of the pre-tokenisation regex's matches instead (the
// regex is Encoder.js's, copied: the module does not export it).
'use strict';
const fs = require('fs');
const path = require('path');

const [dir, out, ...rest] = process.argv.slice(2);
const pieces = rest[0] === '--pieces';
const files = pieces ? rest.slice(1) : rest;
const { encode } = require(path.resolve(dir, 'Encoder.js'));
const pat = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;
const decoder = new TextDecoder('utf-8', { ignoreBOM: true });

const chunks = [];
for (const f of files) {
  const text = decoder.decode(fs.readFileSync(f));
  const values = pieces ? [] : encode(text);
  const count = pieces ? Array.from(text.matchAll(pat)).length : values.length;
  const buf = Buffer.alloc(4 + 4 * values.length);
  buf.writeUInt32LE(count, 0);
  values.forEach((v, i) => {
    if (!Number.isInteger(v)) throw new Error(`${f}: token ${i} is ${v}`);
    buf.writeUInt32LE(v, 4 + 4 * i);
  });
  chunks.push(buf);
}
fs.writeFileSync(out, Buffer.concat(chunks));
