/* Loading GPT-2's tokenizer files: encoder.json (token string -> id) and
 * vocab.bpe (the merges, by rank), into the tables of data_text_internal.h.
 *
 * The pair map is tiktoken's view of the merges: a token's rank is the line
 * of the merge that makes it, and every split of a ranked token into two
 * ranked tokens (not only the split its merge line names) is a pair that
 * merges into it at that rank.
 *
 * Both files write tokens in GPT-2's byte alphabet: every byte is one
 * printable character (bytes_to_unicode in OpenAI's encoder.py): the
 * printable Latin-1 bytes ! to ~, ¡ to ¬ and ® to ÿ stand for themselves,
 * the other 68 bytes, in order, for U+0100 to U+0143. The tables hold the
 * bytes themselves. A character outside the alphabet (none in GPT-2's
 * files) stays as its UTF-8.
 *
 * The JSON reader accepts one flat object of string keys and non-negative
 * integer values, which is all encoder.json is. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/data_text_internal.h"

#define VOCAB_MAX (1 << 24)
#define TOKEN_MAX_BYTES 4096

/* ---- the byte alphabet ---- */

static int byte_is_printable(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* The byte a code point of the alphabet stands for, or -1. */
static int alphabet_byte(uint32_t cp) {
  if (cp < 256)
    return byte_is_printable((int)cp) ? (int)cp : -1;
  if (cp >= 256 + 68)
    return -1;
  int n = (int)cp - 256;
  for (int b = 0; b < 256; b++)
    if (!byte_is_printable(b) && n-- == 0)
      return b;
  return -1;
}

static void put_utf8(dt_bytes *b, uint32_t cp, dt_status *st) {
  uint8_t u[4];
  int n;
  if (cp < 0x80) {
    u[0] = (uint8_t)cp;
    n = 1;
  } else if (cp < 0x800) {
    u[0] = (uint8_t)(0xC0 | (cp >> 6));
    u[1] = (uint8_t)(0x80 | (cp & 0x3F));
    n = 2;
  } else if (cp < 0x10000) {
    u[0] = (uint8_t)(0xE0 | (cp >> 12));
    u[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    u[2] = (uint8_t)(0x80 | (cp & 0x3F));
    n = 3;
  } else {
    u[0] = (uint8_t)(0xF0 | (cp >> 18));
    u[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    u[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    u[3] = (uint8_t)(0x80 | (cp & 0x3F));
    n = 4;
  }
  if (*st == DT_OK)
    *st = dt_bytes_append(b, u, n);
}

/* A character of the alphabet (or any other) as token bytes. */
static void put_token_char(dt_bytes *b, uint32_t cp, dt_status *st) {
  int byte = alphabet_byte(cp);
  if (byte < 0) {
    put_utf8(b, cp, st);
    return;
  }
  uint8_t c = (uint8_t)byte;
  if (*st == DT_OK)
    *st = dt_bytes_append(b, &c, 1);
}

/* One UTF-8 character at s[*i] (strict); -1 when invalid. */
static int64_t utf8_char(const uint8_t *s, size_t n, size_t *i) {
  uint32_t b0 = s[*i];
  int len = b0 < 0x80 ? 1 : b0 < 0xC2 ? 0 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : b0 < 0xF5 ? 4 : 0;
  if (len == 0 || *i + (size_t)len > n)
    return -1;
  uint32_t cp = len == 1 ? b0 : b0 & (0x7F >> len);
  for (int k = 1; k < len; k++) {
    if ((s[*i + k] & 0xC0) != 0x80)
      return -1;
    cp = (cp << 6) | (s[*i + k] & 0x3F);
  }
  if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
      (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
    return -1;
  *i += (size_t)len;
  return cp;
}

/* ---- encoder.json ---- */

typedef struct json_reader {
  const char *path;
  const uint8_t *s;
  size_t n, i;
} json_reader;

static dt_status json_error(const json_reader *r, const char *what) {
  return DT_ERROR(DT_ERR_FORMAT,
                  "%s: byte offset %zu: %s (expected one flat JSON object of "
                  "token strings to ids, as GPT-2's encoder.json)",
                  r->path, r->i, what);
}

static void json_skip_ws(json_reader *r) {
  while (r->i < r->n &&
         (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r'))
    r->i++;
}

static int hex4(const uint8_t *p, uint32_t *v) {
  *v = 0;
  for (int k = 0; k < 4; k++) {
    int c = p[k], d = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : -1;
    if (d < 0)
      return 0;
    *v = *v * 16 + (uint32_t)d;
  }
  return 1;
}

/* A JSON string at r->i, as token bytes (the alphabet decoded). */
static dt_status json_token_string(json_reader *r, dt_bytes *tok) {
  if (r->i >= r->n || r->s[r->i] != '"')
    return json_error(r, "expected a string");
  r->i++;
  dt_status st = DT_OK;
  tok->len = 0;
  while (st == DT_OK) {
    if (r->i >= r->n)
      return json_error(r, "unterminated string");
    uint8_t c = r->s[r->i];
    if (c == '"') {
      r->i++;
      break;
    }
    if (c < 0x20)
      return json_error(r, "control character in a string");
    uint32_t cp;
    if (c != '\\') {
      int64_t u = utf8_char(r->s, r->n, &r->i);
      if (u < 0)
        return json_error(r, "invalid UTF-8 in a string");
      put_token_char(tok, (uint32_t)u, &st);
      continue;
    }
    if (r->i + 1 >= r->n)
      return json_error(r, "unterminated escape");
    uint8_t e = r->s[r->i + 1];
    const char *simple = strchr("\"\\/bfnrt", e);
    if (e != 'u') {
      if (!simple || e == 0)
        return json_error(r, "unknown escape");
      static const char map[] = "\"\\/\b\f\n\r\t";
      cp = (uint8_t)map[simple - "\"\\/bfnrt"];
      r->i += 2;
    } else {
      if (r->i + 6 > r->n || !hex4(r->s + r->i + 2, &cp))
        return json_error(r, "bad \\u escape");
      r->i += 6;
      if (cp >= 0xDC00 && cp <= 0xDFFF)
        return json_error(r, "lone low surrogate in \\u escape");
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        uint32_t lo;
        if (r->i + 6 > r->n || r->s[r->i] != '\\' || r->s[r->i + 1] != 'u' ||
            !hex4(r->s + r->i + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
          return json_error(r, "high surrogate without its low half");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        r->i += 6;
      }
    }
    put_token_char(tok, cp, &st);
  }
  if (st == DT_OK && tok->len == 0)
    return json_error(r, "empty token string");
  if (st == DT_OK && tok->len > TOKEN_MAX_BYTES)
    return json_error(r, "token longer than 4096 bytes");
  return st;
}

static dt_status json_id(json_reader *r, int64_t *id) {
  size_t start = r->i;
  int64_t v = 0;
  while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9' && v < VOCAB_MAX)
    v = v * 10 + (r->s[r->i++] - '0');
  if (r->i == start)
    return json_error(r, "expected a non-negative integer id");
  if (v >= VOCAB_MAX)
    return json_error(r, "id too large (vocabularies hold at most 2^24 tokens)");
  if (r->i < r->n && (r->s[r->i] == '.' || r->s[r->i] == 'e' || r->s[r->i] == 'E'))
    return json_error(r, "expected an integer id");
  *id = v;
  return DT_OK;
}

/* ---- tables ---- */

static uint64_t round_pow2(uint64_t v) {
  uint64_t p = 1;
  while (p < v)
    p <<= 1;
  return p;
}

uint64_t dt_bpe_hash_bytes(const uint8_t *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull ^ n;
  for (size_t i = 0; i < n; i++)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return h ^ (h >> 29);
}

int32_t dt_bpe_vocab_find(const dt_bpe *bpe, const uint8_t *p, size_t n) {
  uint64_t h = dt_bpe_hash_bytes(p, n);
  for (uint64_t k = h & bpe->vocab_mask;; k = (k + 1) & bpe->vocab_mask) {
    const dt_bpe_vocab_slot *s = &bpe->vocab[k];
    if (s->id < 0)
      return -1;
    int64_t off = bpe->tok_off[s->id], len = bpe->tok_off[s->id + 1] - off;
    if (s->hash == h && (size_t)len == n && memcmp(bpe->tok_bytes + off, p, n) == 0)
      return s->id;
  }
}

static uint64_t pair_key(int32_t a, int32_t b) {
  return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

static uint64_t pair_slot(uint64_t key) { return (key * 0x9E3779B97F4A7C15ull) >> 17; }

const dt_bpe_pair *dt_bpe_pair_find(const dt_bpe *bpe, int32_t a, int32_t b) {
  uint64_t key = pair_key(a, b);
  for (uint64_t k = pair_slot(key) & bpe->pair_mask;; k = (k + 1) & bpe->pair_mask) {
    const dt_bpe_pair *p = &bpe->pairs[k];
    if (p->key == key)
      return p;
    if (p->key == UINT64_MAX)
      return NULL;
  }
}

/* Inserts or finds the pair's slot; *fresh says whether it was new. */
static dt_bpe_pair *pair_insert(dt_bpe *bpe, int32_t a, int32_t b, int *fresh) {
  uint64_t key = pair_key(a, b);
  for (uint64_t k = pair_slot(key) & bpe->pair_mask;; k = (k + 1) & bpe->pair_mask) {
    dt_bpe_pair *p = &bpe->pairs[k];
    *fresh = p->key == UINT64_MAX;
    if (*fresh)
      p->key = key;
    if (p->key == key)
      return p;
  }
}

/* ---- loading ---- */

/* One "token": id entry of encoder.json, in file order. */
typedef struct json_entry {
  int64_t id;
  int64_t start; /* of its bytes in the parsed token arena */
  size_t offset; /* of its key in the file */
} json_entry;

typedef struct json_entries {
  json_entry *v;
  int64_t len, cap;
  dt_bytes bytes; /* every key's token bytes, back to back */
} json_entries;

static dt_status parse_encoder_json(const char *path, const dt_bytes *file, json_entries *out) {
  json_reader r = {path, file->data, (size_t)file->len, 0};
  dt_bytes tok = {0};
  dt_status st = DT_OK;
  json_skip_ws(&r);
  if (r.i >= r.n || r.s[r.i] != '{')
    return json_error(&r, "expected '{'");
  r.i++;
  json_skip_ws(&r);
  if (r.i < r.n && r.s[r.i] == '}')
    r.i++;
  else
    for (;;) {
      json_skip_ws(&r);
      size_t at = r.i;
      int64_t id = 0;
      DT_CHECK_GOTO(json_token_string(&r, &tok), st, done);
      json_skip_ws(&r);
      if (r.i >= r.n || r.s[r.i] != ':') {
        st = json_error(&r, "expected ':'");
        goto done;
      }
      r.i++;
      json_skip_ws(&r);
      DT_CHECK_GOTO(json_id(&r, &id), st, done);
      if (out->len == out->cap) {
        int64_t cap = out->cap ? 2 * out->cap : 1024;
        json_entry *v = cap <= VOCAB_MAX ? realloc(out->v, (size_t)cap * sizeof *v) : NULL;
        if (!v) {
          st = cap <= VOCAB_MAX
                   ? DT_ERROR(DT_ERR_OOM, "cannot grow the vocabulary to %lld", (long long)cap)
                   : json_error(&r, "more than 2^24 tokens");
          goto done;
        }
        out->v = v;
        out->cap = cap;
      }
      out->v[out->len++] = (json_entry){id, out->bytes.len, at};
      DT_CHECK_GOTO(dt_bytes_append(&out->bytes, tok.data, tok.len), st, done);
      json_skip_ws(&r);
      if (r.i < r.n && (r.s[r.i] == ',' || r.s[r.i] == '}')) {
        if (r.s[r.i++] == '}')
          break;
        continue;
      }
      st = json_error(&r, "expected ',' or '}'");
      goto done;
    }
  json_skip_ws(&r);
  if (r.i != r.n)
    st = json_error(&r, "data after the object");
done:
  dt_bytes_free(&tok);
  return st;
}

/* The parsed entries -> tok_bytes and tok_off (by id: ids must be 0..n-1,
 * each once), the vocab map, the byte tokens, eot. */
static dt_status build_vocab(dt_bpe *bpe, const char *path, const json_entries *e) {
  int64_t count = e->len;
  if (count < 256)
    return DT_ERROR(DT_ERR_FORMAT, "%s: %lld tokens: a byte-level vocabulary has at least 256",
                    path, (long long)count);
  bpe->vocab_size = (int32_t)count;
  bpe->tok_off = malloc((size_t)(count + 1) * sizeof *bpe->tok_off);
  bpe->tok_bytes = malloc((size_t)(e->bytes.len ? e->bytes.len : 1));
  bpe->vocab_mask = round_pow2((uint64_t)count * 2) - 1;
  bpe->vocab = malloc((bpe->vocab_mask + 1) * sizeof *bpe->vocab);
  int64_t *entry_of = malloc((size_t)count * sizeof *entry_of); /* id -> entry */
  dt_status st = DT_OK;
  if (!bpe->tok_off || !bpe->tok_bytes || !bpe->vocab || !entry_of) {
    st = DT_ERROR(DT_ERR_OOM, "cannot allocate a vocabulary of %lld tokens", (long long)count);
    goto done;
  }
  for (int64_t id = 0; id < count; id++)
    entry_of[id] = -1;
  for (int64_t k = 0; k < count; k++) {
    int64_t id = e->v[k].id;
    if (id >= count || entry_of[id] >= 0) {
      st =
          DT_ERROR(DT_ERR_FORMAT,
                   "%s: byte offset %zu: id %lld %s: the ids of %lld tokens must be 0..%lld, "
                   "each once",
                   path, e->v[k].offset, (long long)id, id >= count ? "out of range" : "used twice",
                   (long long)count, (long long)count - 1);
      goto done;
    }
    entry_of[id] = k;
  }
  int64_t off = 0;
  for (int64_t id = 0; id < count; id++) {
    int64_t k = entry_of[id];
    int64_t len = (k + 1 < count ? e->v[k + 1].start : e->bytes.len) - e->v[k].start;
    memcpy(bpe->tok_bytes + off, e->bytes.data + e->v[k].start, (size_t)len);
    bpe->tok_off[id] = off;
    off += len;
  }
  bpe->tok_off[count] = off;
  for (uint64_t k = 0; k <= bpe->vocab_mask; k++)
    bpe->vocab[k].id = -1;
  for (int32_t id = 0; id < (int32_t)count; id++) {
    const uint8_t *p = bpe->tok_bytes + bpe->tok_off[id];
    size_t len = (size_t)(bpe->tok_off[id + 1] - bpe->tok_off[id]);
    if (dt_bpe_vocab_find(bpe, p, len) >= 0) {
      st = DT_ERROR(DT_ERR_FORMAT, "%s: byte offset %zu: token %d repeats an earlier token", path,
                    e->v[entry_of[id]].offset, id);
      goto done;
    }
    uint64_t h = dt_bpe_hash_bytes(p, len), slot = h & bpe->vocab_mask;
    while (bpe->vocab[slot].id >= 0)
      slot = (slot + 1) & bpe->vocab_mask;
    bpe->vocab[slot] = (dt_bpe_vocab_slot){h, id};
  }
  for (int b = 0; b < 256; b++) {
    uint8_t c = (uint8_t)b;
    bpe->byte_token[b] = dt_bpe_vocab_find(bpe, &c, 1);
    if (bpe->byte_token[b] < 0) {
      st = DT_ERROR(DT_ERR_FORMAT, "%s: no token for byte 0x%02x: not a byte-level vocabulary",
                    path, b);
      goto done;
    }
  }
  bpe->eot = dt_bpe_vocab_find(bpe, (const uint8_t *)"<|endoftext|>", 13);
done:
  free(entry_of);
  return st;
}

static dt_status load_vocab(dt_bpe *bpe, const char *path) {
  dt_bytes file = {0};
  json_entries entries = {0};
  dt_status st;
  DT_CHECK_GOTO(dt_text_read_file(path, DT_TEXT_PIPE_LIMIT_MB, &file), st, done);
  DT_CHECK_GOTO(parse_encoder_json(path, &file, &entries), st, done);
  st = build_vocab(bpe, path, &entries);
done:
  dt_bytes_free(&file);
  dt_bytes_free(&entries.bytes);
  free(entries.v);
  return st;
}

/* One merge line's half (UTF-8 of alphabet characters) as token bytes. */
static dt_status merge_half(const uint8_t *s, size_t n, dt_bytes *tok) {
  dt_status st = DT_OK;
  tok->len = 0;
  for (size_t i = 0; i < n && st == DT_OK;) {
    int64_t cp = utf8_char(s, n, &i);
    if (cp < 0)
      return DT_ERR_FORMAT;
    put_token_char(tok, (uint32_t)cp, &st);
  }
  return st;
}

static int is_space(uint8_t c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* Whether token t has a rank: a byte, or made by a merge. */
static int has_rank(const dt_bpe *bpe, int32_t t) {
  return bpe->tok_rank[t] >= 0 || bpe->tok_off[t + 1] - bpe->tok_off[t] == 1;
}

/* Every split of every ranked token into two ranked tokens -> the pair map
 * (the listed merges are among them). */
static dt_status add_split_pairs(dt_bpe *bpe) {
  int64_t splits = 0;
  for (int32_t t = 0; t < bpe->vocab_size; t++)
    if (bpe->tok_rank[t] >= 0)
      splits += bpe->tok_off[t + 1] - bpe->tok_off[t] - 1;
  bpe->pair_mask = round_pow2((uint64_t)(splits + 16) * 2) - 1;
  bpe->pairs = malloc((bpe->pair_mask + 1) * sizeof *bpe->pairs);
  if (!bpe->pairs)
    return DT_ERROR(DT_ERR_OOM, "cannot allocate %lld token pairs", (long long)splits);
  for (uint64_t k = 0; k <= bpe->pair_mask; k++)
    bpe->pairs[k].key = UINT64_MAX;
  for (int32_t t = 0; t < bpe->vocab_size; t++) {
    if (bpe->tok_rank[t] < 0)
      continue;
    const uint8_t *p = bpe->tok_bytes + bpe->tok_off[t];
    size_t len = (size_t)(bpe->tok_off[t + 1] - bpe->tok_off[t]);
    for (size_t k = 1; k < len; k++) {
      int32_t a = dt_bpe_vocab_find(bpe, p, k), b = dt_bpe_vocab_find(bpe, p + k, len - k);
      if (a < 0 || b < 0 || !has_rank(bpe, a) || !has_rank(bpe, b))
        continue;
      int fresh;
      dt_bpe_pair *pair = pair_insert(bpe, a, b, &fresh);
      pair->rank = bpe->tok_rank[t];
      pair->merged = t;
    }
  }
  return DT_OK;
}

/* vocab.bpe -> the tokens' ranks and the pair map. Line 0 (the version)
 * and everything after the last newline are skipped, as encoder.py and
 * tiktoken do. */
static dt_status load_merges(dt_bpe *bpe, const char *path) {
  dt_bytes file = {0}, ta = {0}, tb = {0};
  dt_status st;
  DT_CHECK_GOTO(dt_text_read_file(path, DT_TEXT_PIPE_LIMIT_MB, &file), st, done);
  const uint8_t *s = file.data;
  size_t n = (size_t)file.len;
  int64_t lines = 0;
  for (size_t i = 0; i < n; i++)
    lines += s[i] == '\n';
  int64_t max_merges = lines > 0 ? lines - 1 : 0;
  /* First the listed merges alone, to check them. */
  bpe->pair_mask = round_pow2((uint64_t)(max_merges + 16) * 2) - 1;
  bpe->pairs = malloc((bpe->pair_mask + 1) * sizeof *bpe->pairs);
  bpe->tok_rank = malloc((size_t)bpe->vocab_size * sizeof *bpe->tok_rank);
  if (!bpe->pairs || !bpe->tok_rank) {
    st = DT_ERROR(DT_ERR_OOM, "cannot allocate %lld merges", (long long)max_merges);
    goto done;
  }
  for (uint64_t k = 0; k <= bpe->pair_mask; k++)
    bpe->pairs[k].key = UINT64_MAX;

  const uint8_t *nl = memchr(s, '\n', n);
  size_t i = nl ? (size_t)(nl - s) + 1 : n;
  int32_t rank = 0;
  for (int64_t line = 2; i < n; line++) {
    const uint8_t *end = memchr(s + i, '\n', n - i);
    if (!end)
      break; /* no newline after it: not a merge */
    size_t line_start = i, line_end = (size_t)(end - s);
    size_t part[2][2];
    int parts = 0;
    for (size_t j = line_start; j < line_end;) {
      while (j < line_end && is_space(s[j]))
        j++;
      if (j == line_end)
        break;
      size_t b = j;
      while (j < line_end && !is_space(s[j]))
        j++;
      if (parts < 2) {
        part[parts][0] = b;
        part[parts][1] = j;
      }
      parts++;
    }
    if (parts != 2) {
      st = DT_ERROR(DT_ERR_FORMAT,
                    "%s: line %lld (byte offset %zu): %d tokens, expected a merge \"a b\"", path,
                    (long long)line, line_start, parts);
      goto done;
    }
    if (merge_half(s + part[0][0], part[0][1] - part[0][0], &ta) != DT_OK ||
        merge_half(s + part[1][0], part[1][1] - part[1][0], &tb) != DT_OK) {
      st = DT_ERROR(DT_ERR_FORMAT, "%s: line %lld (byte offset %zu): invalid UTF-8", path,
                    (long long)line, line_start);
      goto done;
    }
    int32_t a = dt_bpe_vocab_find(bpe, ta.data, (size_t)ta.len);
    int32_t b = dt_bpe_vocab_find(bpe, tb.data, (size_t)tb.len);
    int32_t m = -1;
    if (a >= 0 && b >= 0) {
      DT_CHECK_GOTO(dt_bytes_append(&ta, tb.data, tb.len), st, done);
      m = dt_bpe_vocab_find(bpe, ta.data, (size_t)ta.len);
    }
    if (m < 0) {
      int k = a < 0 ? 0 : 1;
      st = DT_ERROR(DT_ERR_FORMAT,
                    "%s: line %lld (byte offset %zu): %s '%.*s' is not in the "
                    "vocabulary (encoder.json)",
                    path, (long long)line, a < 0 || b < 0 ? part[k][0] : line_start,
                    a < 0 || b < 0 ? "token" : "the merge of",
                    (int)(a < 0 || b < 0 ? part[k][1] - part[k][0] : line_end - line_start),
                    (const char *)s + (a < 0 || b < 0 ? part[k][0] : line_start));
      goto done;
    }
    int fresh;
    dt_bpe_pair *p = pair_insert(bpe, a, b, &fresh);
    if (!fresh) {
      st = DT_ERROR(DT_ERR_FORMAT, "%s: line %lld (byte offset %zu): the merge repeats line %d",
                    path, (long long)line, line_start, p->rank + 2);
      goto done;
    }
    p->rank = rank;
    p->merged = m;
    rank++;
    i = line_end + 1;
  }
  bpe->num_merges = rank;

  /* A token's rank: the first merge that makes it. Every merge must come
   * after those that make its tokens (a file property; the encoder itself
   * would take any order). */
  int32_t *made_at = bpe->tok_rank;
  for (int32_t t = 0; t < bpe->vocab_size; t++)
    made_at[t] = -1;
  for (uint64_t k = 0; k <= bpe->pair_mask; k++) {
    dt_bpe_pair *p = &bpe->pairs[k];
    if (p->key != UINT64_MAX && (made_at[p->merged] < 0 || p->rank < made_at[p->merged]))
      made_at[p->merged] = p->rank;
  }
  for (uint64_t k = 0; k <= bpe->pair_mask; k++) {
    dt_bpe_pair *p = &bpe->pairs[k];
    if (p->key == UINT64_MAX)
      continue;
    int32_t a = (int32_t)(p->key >> 32), b = (int32_t)(p->key & 0xFFFFFFFFu);
    if (made_at[a] >= p->rank || made_at[b] >= p->rank) {
      st = DT_ERROR(DT_ERR_FORMAT,
                    "%s: the merge on line %d uses a token made by the merge on line %d: merges "
                    "must come after those that make their tokens",
                    path, p->rank + 2, (made_at[a] >= p->rank ? made_at[a] : made_at[b]) + 2);
      goto done;
    }
  }
  free(bpe->pairs);
  bpe->pairs = NULL;
  st = add_split_pairs(bpe);
done:
  dt_bytes_free(&file);
  dt_bytes_free(&ta);
  dt_bytes_free(&tb);
  return st;
}

dt_status dt_bpe_load(const char *encoder_json, const char *vocab_bpe, const dt_bpe_config *cfg,
                      dt_bpe **out) {
  DT_CHECK_OUT(out);
  if (!encoder_json || !vocab_bpe)
    return DT_ERROR(DT_ERR_INVALID_ARG, "the encoder.json and vocab.bpe paths must not be NULL");
  dt_bpe_config c = cfg ? *cfg : DT_BPE_CONFIG_DEFAULT;
  if (c.cache_entries < 0 || c.cache_entries > (1 << 26))
    return DT_ERROR(DT_ERR_INVALID_ARG, "cache_entries %d: must be in [0, 2^26]", c.cache_entries);
  dt_bpe *bpe = calloc(1, sizeof *bpe);
  if (!bpe)
    return DT_ERROR(DT_ERR_OOM, "cannot allocate a tokenizer");
  bpe->cfg = c;
  dt_status st;
  DT_CHECK_GOTO(load_vocab(bpe, encoder_json), st, fail);
  DT_CHECK_GOTO(load_merges(bpe, vocab_bpe), st, fail);
  if (c.cache_entries > 0) {
    bpe->cache_mask = round_pow2((uint64_t)c.cache_entries * 2) - 1;
    bpe->cache = calloc(bpe->cache_mask + 1, sizeof *bpe->cache);
    if (!bpe->cache) {
      st = DT_ERROR(DT_ERR_OOM, "cannot allocate a piece cache of %d entries", c.cache_entries);
      goto fail;
    }
  }
  *out = bpe;
  return DT_OK;
fail:
  dt_bpe_destroy(bpe);
  return st;
}

dt_status dt_bpe_load_dir(const char *dir, const dt_bpe_config *cfg, dt_bpe **out) {
  if (!dir)
    return DT_ERROR(DT_ERR_INVALID_ARG, "dir is NULL");
  char enc[4096], merges[4096];
  if (snprintf(enc, sizeof enc, "%s/encoder.json", dir) >= (int)sizeof enc ||
      snprintf(merges, sizeof merges, "%s/vocab.bpe", dir) >= (int)sizeof merges)
    return DT_ERROR(DT_ERR_INVALID_ARG, "path too long: %s", dir);
  dt_status st = dt_bpe_load(enc, merges, cfg, out);
  if (st == DT_ERR_IO)
    return dt_error_wrap(st,
                         "GPT-2 tokenizer files missing in %s (tools/setup.sh fetches them "
                         "into data/gpt2)",
                         dir);
  return st;
}

void dt_bpe_destroy(dt_bpe *bpe) {
  if (!bpe)
    return;
  void *owned[] = {bpe->tok_bytes, bpe->tok_off, bpe->vocab, bpe->pairs,
                   bpe->tok_rank,  bpe->cache,   bpe->heap /* and the symbols after it */};
  for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++)
    free(owned[i]);
  dt_bytes_free(&bpe->cache_keys);
  dt_tokens_free(&bpe->cache_ids);
  free(bpe);
}

int32_t dt_bpe_vocab_size(const dt_bpe *bpe) { return bpe ? bpe->vocab_size : 0; }
int32_t dt_bpe_eot(const dt_bpe *bpe) { return bpe ? bpe->eot : -1; }

dt_status dt_bpe_token_bytes(const dt_bpe *bpe, int32_t id, const uint8_t **bytes, size_t *n) {
  if (!bpe || !bytes || !n)
    return DT_ERROR(DT_ERR_INVALID_ARG, "bpe, bytes and n must not be NULL");
  if (id < 0 || id >= bpe->vocab_size)
    return DT_ERROR(DT_ERR_INVALID_ARG, "token id %d: outside the vocabulary [0, %d)", id,
                    bpe->vocab_size);
  *bytes = bpe->tok_bytes + bpe->tok_off[id];
  *n = (size_t)(bpe->tok_off[id + 1] - bpe->tok_off[id]);
  return DT_OK;
}
