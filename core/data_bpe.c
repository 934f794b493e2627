/* GPT-2's byte-level BPE: the pre-tokeniser, the merges, encode and decode,
 * as tiktoken's gpt2 encoding does them (OpenAI's Rust tiktoken; the tests
 * compare with npm tiktoken@1.0.22, token for token).
 *
 * Pre-tokenisation implements the behaviour of GPT-2's regex
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * as tiktoken's engine (fancy_regex over Rust's regex) runs it, with its
 * classes: \s is Unicode White_Space (U+0085 and U+2028 are spaces, U+FEFF
 * and U+180E are not), letters and numbers as its Unicode tables have them
 * (core/data_unicode_tables.c, probed from tiktoken). At each position the
 * first alternative that matches:
 *   1. an ASCII apostrophe followed by s, t, m, d, re, ve or ll;
 *   2. an optional ASCII space, then a maximal run of letters, of digits, or
 *      of "others" (neither \s nor letter nor number: one class each);
 *   3. a whitespace run: all of it at the end of the text, else all but its
 *      last character when it has two or more (that one then starts the next
 *      piece, e.g. " word"), else the single character.
 * Every character is in exactly one class, so pieces cover the text.
 *
 * Merging, tiktoken's rules: a piece that is itself a ranked token is that
 * token. Otherwise its bytes start as single-byte tokens in a linked list,
 * and the adjacent pair whose joined bytes are the lowest-ranked token
 * merges, the leftmost on a tie, one at a time, until no pair joins into a
 * token (the pair map holds every such split, data_bpe_load.c). Candidate
 * pairs sit in a heap ordered by (rank, position); stale entries are
 * skipped when popped.
 */
#include <stdlib.h>
#include <string.h>

#include "core/data_text_internal.h"

#define CACHED_PIECE_MAX 64
#define INVALID_CP 0xFFFFFFFFu

/* ---- pre-tokeniser ---- */

/* The character at s[i]: its length, and its code point (INVALID_CP for a
 * byte that does not start valid UTF-8: such bytes count one by one). */
static inline size_t utf8_at(const uint8_t *s, size_t n, size_t i, uint32_t *cp) {
  uint32_t b0 = s[i];
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t len = b0 < 0xC2 ? 0 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : b0 < 0xF5 ? 4 : 0;
  *cp = INVALID_CP;
  if (len == 0 || i + len > n)
    return 1;
  uint32_t c = b0 & (0x7F >> len);
  for (size_t k = 1; k < len; k++) {
    if ((s[i + k] & 0xC0) != 0x80)
      return 1;
    c = (c << 6) | (s[i + k] & 0x3F);
  }
  if ((len == 3 && (c < 0x800 || (c >= 0xD800 && c <= 0xDFFF))) ||
      (len == 4 && (c < 0x10000 || c > 0x10FFFF)))
    return 1;
  *cp = c;
  return len;
}

static inline int class_of(uint32_t cp) {
  if (cp < 0x80)
    return dt_unicode_ascii_class[cp];
  if (cp == INVALID_CP)
    return DT_UC_OTHER;
  int lo = 0, hi = dt_unicode_num_ranges - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (cp < dt_unicode_ranges[mid].lo)
      hi = mid - 1;
    else if (cp > dt_unicode_ranges[mid].hi)
      lo = mid + 1;
    else
      return dt_unicode_ranges[mid].cls;
  }
  return DT_UC_OTHER;
}

static inline size_t char_at(const uint8_t *s, size_t n, size_t i, int *cls) {
  if (s[i] < 0x80) {
    *cls = dt_unicode_ascii_class[s[i]];
    return 1;
  }
  uint32_t cp;
  size_t len = utf8_at(s, n, i, &cp);
  *cls = class_of(cp);
  return len;
}

/* The end of the run of class `cls` that continues at i. */
static size_t run_end(const uint8_t *s, size_t n, size_t i, int cls) {
  while (i < n) {
    int c;
    size_t len = char_at(s, n, i, &c);
    if (c != cls)
      break;
    i += len;
  }
  return i;
}

size_t dt_bpe_piece_end(const void *text, size_t n, size_t pos) {
  const uint8_t *s = text;
  if (!s || pos >= n)
    return n;
  if (s[pos] == '\'' && pos + 1 < n) {
    uint8_t c1 = s[pos + 1], c2 = pos + 2 < n ? s[pos + 2] : 0;
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
      return pos + 2;
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
      return pos + 3;
  }
  int cls;
  size_t len = char_at(s, n, pos, &cls);
  if (s[pos] == ' ' && pos + 1 < n) {
    int next;
    size_t nlen = char_at(s, n, pos + 1, &next);
    if (next != DT_UC_SPACE)
      return run_end(s, n, pos + 1 + nlen, next);
  }
  if (cls != DT_UC_SPACE)
    return run_end(s, n, pos + len, cls);
  size_t last = pos, i = pos + len;
  while (i < n) {
    int c;
    size_t l = char_at(s, n, i, &c);
    if (c != DT_UC_SPACE)
      break;
    last = i;
    i += l;
  }
  if (i == n)
    return n;
  return last > pos ? last : i;
}

/* ---- merging one piece ---- */

typedef struct dt_bpe_heap_entry {
  int32_t rank, pos; /* pair (pos, next[pos]) */
  int32_t a, b;      /* its tokens when pushed (stale once they change) */
} heap_entry;

static int heap_less(const heap_entry *x, const heap_entry *y) {
  return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

typedef struct merge_state {
  dt_bpe *bpe;
  int32_t *sym, *next, *prev; /* sym -1: merged into its left neighbour */
  heap_entry *heap;
  int64_t heap_len;
} merge_state;

/* The heap holds at most the n - 1 first pairs and two per merge (n - 1 at
 * most): < 3n entries. */
static void heap_push(merge_state *m, heap_entry e) {
  int64_t i = m->heap_len++;
  while (i > 0) {
    int64_t parent = (i - 1) / 2;
    if (!heap_less(&e, &m->heap[parent]))
      break;
    m->heap[i] = m->heap[parent];
    i = parent;
  }
  m->heap[i] = e;
}

static heap_entry heap_pop(merge_state *m) {
  heap_entry top = m->heap[0], last = m->heap[--m->heap_len];
  int64_t i = 0, n = m->heap_len;
  for (;;) {
    int64_t c = 2 * i + 1;
    if (c >= n)
      break;
    if (c + 1 < n && heap_less(&m->heap[c + 1], &m->heap[c]))
      c++;
    if (!heap_less(&m->heap[c], &last))
      break;
    m->heap[i] = m->heap[c];
    i = c;
  }
  if (n > 0)
    m->heap[i] = last;
  return top;
}

static void push_pair(merge_state *m, int32_t i) {
  if (i < 0 || m->next[i] < 0)
    return;
  int32_t j = m->next[i];
  const dt_bpe_pair *p = dt_bpe_pair_find(m->bpe, m->sym[i], m->sym[j]);
  if (p)
    heap_push(m, (heap_entry){p->rank, i, m->sym[i], m->sym[j]});
}

static int entry_current(const merge_state *m, const heap_entry *e) {
  int32_t j = m->next[e->pos];
  return m->sym[e->pos] == e->a && j >= 0 && m->sym[j] == e->b;
}

/* Merges the pair at (i, next[i]) into `merged` and queues the new pairs. */
static void merge_at(merge_state *m, int32_t i, int32_t merged) {
  int32_t j = m->next[i];
  m->sym[i] = merged;
  m->sym[j] = -1;
  m->next[i] = m->next[j];
  if (m->next[j] >= 0)
    m->prev[m->next[j]] = i;
  push_pair(m, m->prev[i]);
  push_pair(m, i);
}

static dt_status reserve_scratch(dt_bpe *bpe, int64_t n) {
  if (n <= bpe->scratch_cap)
    return DT_OK;
  int64_t cap = bpe->scratch_cap ? bpe->scratch_cap : 256;
  while (cap < n)
    cap *= 2;
  /* One block: the heap (3 entries a symbol), then sym, next and prev. */
  heap_entry *heap = realloc(bpe->heap, (size_t)cap * (3 * sizeof *heap + 3 * sizeof(int32_t)));
  if (!heap)
    return DT_ERROR(DT_ERR_OOM, "cannot allocate merge scratch for a piece of %lld bytes",
                    (long long)n);
  bpe->heap = heap;
  bpe->sym = (int32_t *)(heap + 3 * cap);
  bpe->next = bpe->sym + cap;
  bpe->prev = bpe->next + cap;
  bpe->scratch_cap = cap;
  return DT_OK;
}

/* Appends the tokens of one piece of n >= 1 bytes. */
static dt_status merge_piece(dt_bpe *bpe, const uint8_t *s, int64_t n, dt_tokens *out) {
  if (n == 1)
    return dt_tokens_append(out, &bpe->byte_token[s[0]], 1);
  int32_t whole = dt_bpe_vocab_find(bpe, s, (size_t)n);
  if (whole >= 0 && bpe->tok_rank[whole] >= 0)
    return dt_tokens_append(out, &whole, 1);
  if (n > INT32_MAX / 3)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "one piece of %lld bytes (a run without spaces): at "
                    "most %d bytes",
                    (long long)n, INT32_MAX / 3);
  DT_CHECK(reserve_scratch(bpe, n));
  merge_state m = {bpe, bpe->sym, bpe->next, bpe->prev, bpe->heap, 0};
  for (int32_t i = 0; i < (int32_t)n; i++) {
    m.sym[i] = bpe->byte_token[s[i]];
    m.prev[i] = i - 1;
    m.next[i] = i + 1 < n ? i + 1 : -1;
  }
  for (int32_t i = 0; i + 1 < (int32_t)n; i++)
    push_pair(&m, i);
  while (m.heap_len > 0) {
    heap_entry e = heap_pop(&m);
    if (!entry_current(&m, &e))
      continue;
    merge_at(&m, e.pos, dt_bpe_pair_find(bpe, e.a, e.b)->merged);
  }
  int64_t count = 0;
  for (int32_t i = 0; i >= 0; i = m.next[i])
    m.sym[count++] = m.sym[i]; /* compacts in place: count <= i */
  return dt_tokens_append(out, m.sym, count);
}

/* ---- the piece cache ---- */

static void cache_clear(dt_bpe *bpe) {
  memset(bpe->cache, 0, (bpe->cache_mask + 1) * sizeof *bpe->cache);
  bpe->cache_used = 0;
  bpe->cache_keys.len = 0;
  bpe->cache_ids.len = 0;
}

static dt_status encode_piece(dt_bpe *bpe, const uint8_t *s, int64_t n, dt_tokens *out) {
  if (!bpe->cache || n > CACHED_PIECE_MAX)
    return merge_piece(bpe, s, n, out);
  uint64_t h = dt_bpe_hash_bytes(s, (size_t)n), k = h & bpe->cache_mask;
  for (;; k = (k + 1) & bpe->cache_mask) {
    dt_bpe_cache_slot *c = &bpe->cache[k];
    if (c->key_len == 0)
      break;
    if (c->hash == h && c->key_len == n && memcmp(bpe->cache_keys.data + c->key_off, s, n) == 0)
      return dt_tokens_append(out, bpe->cache_ids.data + c->ids_off, c->num_ids);
  }
  int64_t first = out->len;
  DT_CHECK(merge_piece(bpe, s, n, out));
  if (bpe->cache_used >= bpe->cfg.cache_entries || bpe->cache_keys.len > (1 << 30) ||
      bpe->cache_ids.len > (1 << 30)) {
    cache_clear(bpe);
    for (k = h & bpe->cache_mask; bpe->cache[k].key_len != 0; k = (k + 1) & bpe->cache_mask) {
    }
  }
  dt_bpe_cache_slot slot = {h, (uint32_t)bpe->cache_keys.len, (uint32_t)bpe->cache_ids.len,
                            (uint16_t)n, (uint16_t)(out->len - first)};
  DT_CHECK(dt_bytes_append(&bpe->cache_keys, s, n));
  DT_CHECK(dt_tokens_append(&bpe->cache_ids, out->data + first, out->len - first));
  bpe->cache[k] = slot;
  bpe->cache_used++;
  return DT_OK;
}

/* ---- encode, decode ---- */

dt_status dt_bpe_encode(dt_bpe *bpe, const void *text, size_t n, dt_tokens *out) {
  if (!bpe || !out || (n > 0 && !text))
    return DT_ERROR(DT_ERR_INVALID_ARG, "bpe, out and text must not be NULL");
  const uint8_t *s = text;
  for (size_t pos = 0; pos < n;) {
    size_t end = dt_bpe_piece_end(s, n, pos);
    DT_CHECK(encode_piece(bpe, s + pos, (int64_t)(end - pos), out));
    pos = end;
  }
  return DT_OK;
}

dt_status dt_bpe_decode(const dt_bpe *bpe, const int32_t *ids, int64_t n, dt_bytes *out) {
  if (!bpe || !out || n < 0 || (n > 0 && !ids))
    return DT_ERROR(DT_ERR_INVALID_ARG, "bpe, ids and out must not be NULL, n >= 0");
  for (int64_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    if (id < 0 || id >= bpe->vocab_size)
      return DT_ERROR(DT_ERR_INVALID_ARG, "token %lld is %d: outside the vocabulary [0, %d)",
                      (long long)i, id, bpe->vocab_size);
    DT_CHECK(dt_bytes_append(out, bpe->tok_bytes + bpe->tok_off[id],
                             bpe->tok_off[id + 1] - bpe->tok_off[id]));
  }
  return DT_OK;
}
