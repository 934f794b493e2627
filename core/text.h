/* Text data: GPT-2's byte-level BPE tokenizer, the Brown corpus as plain
 * text, token shards in llm.c's format, and the loader of token windows.
 *
 *   dt_bpe *bpe;                        // data/gpt2/{encoder.json,vocab.bpe}
 *   dt_bpe_load_dir("data/gpt2", NULL, &bpe);
 *   dt_tokens ids = {0};
 *   dt_bpe_encode(bpe, text, len, &ids); // appends; any bytes
 *   dt_shard_write("train.bin", ids.data, ids.len);
 *
 *   dt_shard shard;                     // validated against the vocabulary
 *   dt_shard_read("train.bin", dt_bpe_vocab_size(bpe), &shard);
 *   dt_token_loader_config lc = DT_TOKEN_LOADER_CONFIG_DEFAULT;  // B, T, seed, rank...
 *   dt_token_loader *l;
 *   dt_token_loader_create(&shard, &lc, &l);
 *   dt_token_loader_start_epoch(l, epoch);
 *   dt_token_loader_next(l, &x, &y);    // (B,T) i32 inputs and targets on the device
 *
 * Errors from files (a corrupt encoder.json, vocab.bpe or shard) are
 * DT_ERR_FORMAT with a message naming the file and the byte offset.
 */
#ifndef DT_CORE_TEXT_H
#define DT_CORE_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "core/data.h"
#include "core/status.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- growable buffers (zero-initialise; free with *_free) ---- */
typedef struct dt_tokens {
  int32_t *data;
  int64_t len;
  int64_t cap;
} dt_tokens;
dt_status dt_tokens_append(dt_tokens *t, const int32_t *ids, int64_t n);
void dt_tokens_free(dt_tokens *t); /* frees and zeroes; NULL is a no-op */

typedef struct dt_bytes {
  uint8_t *data; /* not NUL-terminated */
  int64_t len;
  int64_t cap;
} dt_bytes;
dt_status dt_bytes_append(dt_bytes *b, const void *data, int64_t n);
void dt_bytes_free(dt_bytes *b);

/* ---- GPT-2 byte-level BPE ----
 * Encoding is tiktoken's gpt2 encoding (OpenAI's tokenizer, which llm.c's
 * data scripts use; the tests check it token for token against the npm
 * package tiktoken@1.0.22), with encode_ordinary's rules:
 *  - pre-tokenisation: the regex 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
 *    ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ with tiktoken's \s (Unicode
 *    White_Space) and Unicode classes (core/data_unicode_tables.c, probed
 *    from tiktoken). Bytes that are not valid UTF-8 (stray continuation
 *    bytes, overlong forms, surrogates) count one by one as "other"
 *    characters, as U+FFFD would, so any byte string encodes and
 *    decode(encode(x)) == x;
 *  - a piece that is a token is that token; otherwise its bytes start as
 *    single-byte tokens and the adjacent pair that joins into the
 *    lowest-ranked token merges (leftmost first), until none does. A
 *    token's rank is the vocab.bpe line that makes it;
 *  - no special tokens in the text: "<|endoftext|>" in the input is
 *    ordinary text (like encode_ordinary); use dt_bpe_eot for the id. */
typedef struct dt_bpe dt_bpe;

typedef struct dt_bpe_config {
  /* Pieces of up to 64 bytes are cached (piece -> ids); the cache is
   * emptied when it holds this many entries. 0 = no cache. */
  int cache_entries;
} dt_bpe_config;
#define DT_BPE_CONFIG_DEFAULT ((dt_bpe_config){1 << 17})

/* Loads the vocabulary (encoder.json: one flat JSON object, token string ->
 * id, ids dense in [0, n)) and the merges (vocab.bpe: a version line, then
 * one "a b" pair per line, rank = line order). Every byte must have its
 * token; both halves of every merge and their concatenation must be in the
 * vocabulary. Errors: DT_ERR_IO, DT_ERR_FORMAT (file and byte offset),
 * DT_ERR_OOM. cfg NULL = defaults. */
dt_status dt_bpe_load(const char *encoder_json, const char *vocab_bpe, const dt_bpe_config *cfg,
                      dt_bpe **out);
/* dir/encoder.json and dir/vocab.bpe (data/gpt2 after tools/setup.sh). */
dt_status dt_bpe_load_dir(const char *dir, const dt_bpe_config *cfg, dt_bpe **out);
void dt_bpe_destroy(dt_bpe *bpe);
int32_t dt_bpe_vocab_size(const dt_bpe *bpe); /* 50257 for GPT-2 */
int32_t dt_bpe_eot(const dt_bpe *bpe);        /* id of "<|endoftext|>", -1 if none */

/* Appends the ids of `n` bytes of text (any bytes) to *out. Not
 * thread-safe: the piece cache and scratch live in bpe; use one dt_bpe per
 * thread. Errors: DT_ERR_OOM. */
dt_status dt_bpe_encode(dt_bpe *bpe, const void *text, size_t n, dt_tokens *out);
/* Appends the bytes of `n` ids to *out. An id outside [0, vocab):
 * DT_ERR_INVALID_ARG naming its position. Thread-safe. */
dt_status dt_bpe_decode(const dt_bpe *bpe, const int32_t *ids, int64_t n, dt_bytes *out);
/* The bytes of one token (borrowed, valid while bpe lives). */
dt_status dt_bpe_token_bytes(const dt_bpe *bpe, int32_t id, const uint8_t **bytes, size_t *n);
/* The pre-tokeniser alone: the end (exclusive) of the piece that starts at
 * `pos` < n. Pieces cover the text without gaps. */
size_t dt_bpe_piece_end(const void *text, size_t n, size_t pos);

/* ---- the Brown corpus as text ----
 * dt_brown_detag turns one tagged file (`word/tag` tokens, one sentence a
 * line, paragraphs separated by blank lines) into readable text:
 *  - a token's word is what precedes its last '/' (so 1/2/cd is "1/2");
 *  - `` and '' become '"' (opening and closing quotes);
 *  - no space before , . ; : ? ! ) ] and closing quotes; none after ( [ and
 *    opening quotes; a lone ' alternates opening, closing, ... within a
 *    paragraph; every other word is preceded by one space;
 *  - the sentences of a paragraph are joined by a space, paragraphs by a
 *    blank line; a headline line (at least half of its tags end in -hl) is
 *    a paragraph of its own; the text ends with a newline;
 *  - bytes >= 0x80 are read as Latin-1 and written as UTF-8 (the package's
 *    files are ASCII).
 * Appends to *out. */
dt_status dt_brown_detag(const void *tagged, size_t n, dt_bytes *out);
/* True for Brown's tagged file names: c, a genre letter a-r, two digits. */
int dt_brown_is_file_name(const char *name);

/* ---- corpora to token streams ----
 * Inputs are files and directories (a directory stands for its regular
 * files, by name; hidden files skipped), or a pipe this process holds
 * (/dev/stdin in `cmd | dtrain tokenize --in /dev/stdin`, /dev/fd/N), read
 * to its end up to pipe_limit_mb; anything else (a named FIFO by its name,
 * a device such as /dev/zero, a socket) is refused with DT_ERR_IO naming it
 * and what it is. Each file is one document: its
 * tokens are preceded by the end-of-text token, as llm.c's scripts do.
 * A directory that holds Brown's tagged files (ca01...) or any input under
 * `brown` is read as the Brown corpus: only the tagged files, detagged.
 * Split by file, deterministically: over the files in the order given (a
 * folder's by name), file i (0-based) goes to validation when
 * floor((i+1)*f) > floor(i*f), f the validation fraction: every 10th file
 * for 0.1 (ca10, ca20, ...). A single input file with f > 0 is split by
 * tokens instead: its last ceil(f*n) tokens are the validation part. */
typedef struct dt_corpus_config {
  double val_fraction; /* in [0, 1) */
  int brown;           /* 1: every input is Brown's tagged text */
  int pipe_limit_mb;   /* the most MiB one document may take from a pipe */
} dt_corpus_config;
#define DT_CORPUS_CONFIG_DEFAULT ((dt_corpus_config){0.1, 0, 1024})

typedef struct dt_corpus_stats {
  int64_t train_files, val_files;
  int64_t text_bytes; /* text tokenized (after detagging) */
} dt_corpus_stats;

/* Appends the training and validation tokens to *train and *val (val may be
 * NULL when val_fraction is 0). stats may be NULL. */
dt_status dt_corpus_tokenize(dt_bpe *bpe, const char *const *inputs, int num_inputs,
                             const dt_corpus_config *cfg, dt_tokens *train, dt_tokens *val,
                             dt_corpus_stats *stats);

/* The Brown shards: when data_dir/brown/train.bin or val.bin is missing,
 * tokenizes data_dir/brown/raw/ (validation every 10th file) with
 * data_dir/gpt2's tokenizer and writes both (validation first, so a reader
 * that sees train.bin sees both; concurrent callers, e.g. ranks, each write
 * their own temporary files and rename). Existing shards are left alone.
 * `dtrain tokenize --brown` uses it; `dtrain train --data brown` is meant
 * to. */
dt_status dt_brown_shards_ensure(const char *data_dir);

/* ---- token shards (llm.c's format) ----
 * A header of 256 little-endian int32: [0] magic 20240520, [1] version 1,
 * [2] token count; then the tokens as uint16. */
#define DT_SHARD_MAGIC 20240520
#define DT_SHARD_VERSION 1
#define DT_SHARD_HEADER_BYTES (256 * 4)

typedef struct dt_shard {
  uint16_t *tokens; /* owned */
  int64_t num_tokens;
} dt_shard;

/* Writes a shard (to path.tmp.<pid>, flushed, then renamed). Every id must be in
 * [0, 65535] (DT_ERR_INVALID_ARG naming the position). */
dt_status dt_shard_write(const char *path, const int32_t *tokens, int64_t n);
/* Reads a whole shard. Checks the magic, the version, a count >= 0, the
 * file size against 1024 + 2 * count, and every token < vocab_size
 * (vocab_size <= 0: no token check). Failures: DT_ERR_IO, or DT_ERR_FORMAT
 * naming the file and byte offset. On failure *out is zeroed. */
dt_status dt_shard_read(const char *path, int32_t vocab_size, dt_shard *out);
void dt_shard_free(dt_shard *s);

/* Cross-entropy in nats per token of `eval` under the unigram distribution
 * of `train` over vocab_size ids, with add-one smoothing: the loss of a
 * model that knows only word frequencies (GPT-2 on Brown: about 7.4).
 * Tokens must be < vocab_size. */
dt_status dt_unigram_cross_entropy(const dt_shard *train, const dt_shard *eval, int32_t vocab_size,
                                   double *nats);

/* ---- token windows ----
 * Window k of a shard of n tokens is tokens[k*T, k*T + T + 1), for
 * k < (n - 1) / T: inputs are its first T tokens, targets its last T.
 * As a dt_dataset: samples are (T) i32 inputs and (T) i32 targets,
 * num_classes = vocab_size; the shard is borrowed and must outlive it. */
dt_status dt_dataset_token_windows(const dt_shard *shard, int seq_len, int32_t vocab_size,
                                   dt_dataset **out);

/* Batches of windows under data parallelism: each epoch orders all windows
 * (shuffled with seed + epoch, identically on every rank); global batch g
 * is positions [g*B*R, (g+1)*B*R) of that order and rank r takes the
 * positions p of it with p % R == r. Ranks are disjoint, together cover
 * the global batch, and all see the same number of batches, floor(W / (B*R))
 * for W windows (the tail is dropped). Same prefetch thread, pinned
 * buffers and asynchronous copy as dt_loader (it is one). */
typedef struct dt_token_loader_config {
  int batch;   /* B: sequences per rank */
  int seq_len; /* T */
  int shuffle; /* 0: windows in order (validation) */
  uint64_t seed;
  int num_replicas; /* R: world size */
  int rank;
  int prefetch;
  dt_device device;
} dt_token_loader_config;
#define DT_TOKEN_LOADER_CONFIG_DEFAULT \
  ((dt_token_loader_config){8, 64, 1, 0, 1, 0, 2, {DT_DEVICE_CPU, 0}})

typedef struct dt_token_loader dt_token_loader;
/* The shard is borrowed (must outlive the loader). vocab_size checks
 * nothing here (dt_shard_read did) and becomes the dataset's class count. */
dt_status dt_token_loader_create(const dt_shard *shard, int32_t vocab_size,
                                 const dt_token_loader_config *cfg, dt_token_loader **out);
void dt_token_loader_destroy(dt_token_loader *l);
dt_status dt_token_loader_start_epoch(dt_token_loader *l, int64_t epoch);
int64_t dt_token_loader_num_batches(const dt_token_loader *l);
/* inputs and targets: (B, T) i32 on the device, new references; *inputs is
 * NULL at the end of the epoch. As dt_loader_next. */
dt_status dt_token_loader_next(dt_token_loader *l, dt_tensor **inputs, dt_tensor **targets);

#ifdef __cplusplus
}
#endif
#endif
