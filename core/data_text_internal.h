/* Private to core/'s text files: the tokenizer's tables (built by
 * data_bpe_load.c, used by data_bpe.c) and the Unicode classes of the
 * pre-tokeniser (data_unicode_tables.c, generated). */
#ifndef DT_CORE_DATA_TEXT_INTERNAL_H
#define DT_CORE_DATA_TEXT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/text.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Unicode classes of the pre-tokenisation regex ---- */
enum { DT_UC_OTHER = 0, DT_UC_LETTER = 1, DT_UC_NUMBER = 2, DT_UC_SPACE = 3 };

typedef struct dt_unicode_range {
  uint32_t lo, hi; /* inclusive */
  uint8_t cls;
} dt_unicode_range;

extern const uint8_t dt_unicode_ascii_class[128];
extern const dt_unicode_range dt_unicode_ranges[]; /* code points >= 0x80, sorted */
extern const int dt_unicode_num_ranges;

/* ---- the tokenizer's tables ---- */

/* Open-addressing map from a pair of token ids to the token they make
 * (their bytes joined) and its rank. */
typedef struct dt_bpe_pair {
  uint64_t key; /* (a << 32) | b, UINT64_MAX = empty */
  int32_t rank;
  int32_t merged;
} dt_bpe_pair;

/* Open-addressing map from a token's bytes to its id. */
typedef struct dt_bpe_vocab_slot {
  uint64_t hash;
  int32_t id; /* -1 = empty */
} dt_bpe_vocab_slot;

/* The piece cache: piece bytes -> ids, in two arenas. */
typedef struct dt_bpe_cache_slot {
  uint64_t hash;
  uint32_t key_off, ids_off;
  uint16_t key_len, num_ids; /* key_len 0 = empty */
} dt_bpe_cache_slot;

struct dt_bpe {
  dt_bpe_config cfg;
  int32_t vocab_size;
  int32_t eot;
  uint8_t *tok_bytes;       /* every token's bytes, back to back */
  int64_t *tok_off;         /* (vocab_size + 1) offsets into tok_bytes */
  int32_t byte_token[256];  /* the token of each single byte */
  dt_bpe_vocab_slot *vocab; /* vocab_mask + 1 slots */
  uint64_t vocab_mask;
  int32_t *tok_rank;  /* the first merge line that makes each token; -1 none */
  dt_bpe_pair *pairs; /* pair_mask + 1 slots */
  uint64_t pair_mask;
  int32_t num_merges;

  dt_bpe_cache_slot *cache; /* cache_mask + 1 slots */
  uint64_t cache_mask;
  int64_t cache_used;
  dt_bytes cache_keys;
  dt_tokens cache_ids;

  /* scratch of one piece's merge: symbols as a linked list, a heap; one
   * block (heap), sym, next and prev point into it */
  int64_t scratch_cap;
  int32_t *sym, *next, *prev;
  struct dt_bpe_heap_entry *heap;
};

/* Appends a whole file (DT_ERR_IO naming it on failure): a regular file,
 * or a pipe (this process's /dev/stdin or /dev/fd/N, also a named FIFO the
 * shell opened for it with < FIFO), read to its end but refused past
 * pipe_limit_mb MiB. Anything else is refused at once, naming the file and
 * what it is: a named FIFO given by its name (opening it would wait for a
 * writer that may never come), a device (/dev/zero never ends, a terminal
 * waits), a socket, a folder. */
dt_status dt_text_read_file(const char *path, int pipe_limit_mb, dt_bytes *out);
/* dt_text_read_file's refusals alone, before any reading. */
dt_status dt_text_check_input(const char *path);
/* The limit for files that are not documents (the tokenizer's). */
#define DT_TEXT_PIPE_LIMIT_MB 1024

uint64_t dt_bpe_hash_bytes(const uint8_t *p, size_t n);
/* The id of a token by its bytes, or -1. */
int32_t dt_bpe_vocab_find(const dt_bpe *bpe, const uint8_t *p, size_t n);
/* The merge of the pair (a, b), or NULL. */
const dt_bpe_pair *dt_bpe_pair_find(const dt_bpe *bpe, int32_t a, int32_t b);

#ifdef __cplusplus
}
#endif
#endif
