/* Token shards in llm.c's format (its dev/data scripts write them, its
 * dataloader.h reads them):
 *
 *   offset 0     int32 magic 20240520
 *   offset 4     int32 version 1
 *   offset 8     int32 token count n
 *   offset 12    253 more int32, zero
 *   offset 1024  n uint16 tokens
 *
 * all little-endian. Reading checks everything the header claims before
 * trusting it, and every token against the vocabulary. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/text.h"

static void put_le32(uint8_t *p, uint32_t v) {
  for (int k = 0; k < 4; k++)
    p[k] = (uint8_t)(v >> (8 * k));
}

static int32_t get_le32(const uint8_t *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                   (uint32_t)p[3] << 24);
}

dt_status dt_shard_write(const char *path, const int32_t *tokens, int64_t n) {
  if (!path || n < 0 || (n > 0 && !tokens))
    return DT_ERROR(DT_ERR_INVALID_ARG, "path and tokens must not be NULL, n >= 0");
  if (n > INT32_MAX)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%lld tokens: a shard holds at most 2^31 - 1 (its count is an int32); "
                    "split the data into several shards",
                    (long long)n);
  for (int64_t i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] > 65535)
      return DT_ERROR(DT_ERR_INVALID_ARG,
                      "token %lld is %d: shards store uint16 ids (vocabularies up to 65536)",
                      (long long)i, tokens[i]);
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
    return DT_ERROR(DT_ERR_INVALID_ARG, "path too long: %s", path);
  FILE *f = fopen(tmp, "wb");
  if (!f)
    return DT_ERROR(DT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
  uint8_t header[DT_SHARD_HEADER_BYTES] = {0};
  put_le32(header, DT_SHARD_MAGIC);
  put_le32(header + 4, DT_SHARD_VERSION);
  put_le32(header + 8, (uint32_t)n);
  int ok = fwrite(header, 1, sizeof header, f) == sizeof header;
  uint8_t buf[1 << 16];
  for (int64_t i = 0; ok && i < n;) {
    int64_t k = 0;
    for (; k < (int64_t)sizeof buf / 2 && i < n; k++, i++) {
      buf[2 * k] = (uint8_t)tokens[i];
      buf[2 * k + 1] = (uint8_t)(tokens[i] >> 8);
    }
    ok = fwrite(buf, 2, (size_t)k, f) == (size_t)k;
  }
  ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
  int err = errno;
  if (fclose(f) != 0 && ok) {
    ok = 0;
    err = errno;
  }
  if (!ok || rename(tmp, path) != 0) {
    if (ok)
      err = errno;
    remove(tmp);
    return DT_ERROR(DT_ERR_IO, "cannot write %s: %s", path, strerror(err));
  }
  return DT_OK;
}

void dt_shard_free(dt_shard *s) {
  if (!s)
    return;
  free(s->tokens);
  memset(s, 0, sizeof *s);
}

static dt_status shard_format_error(const char *path, long long offset, const char *what) {
  return DT_ERROR(DT_ERR_FORMAT,
                  "%s: byte offset %lld: %s (not a token shard in llm.c's format, "
                  "or a damaged one: write it again with dtrain tokenize)",
                  path, offset, what);
}

dt_status dt_shard_read(const char *path, int32_t vocab_size, dt_shard *out) {
  if (!out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "out is NULL");
  memset(out, 0, sizeof *out);
  if (!path)
    return DT_ERROR(DT_ERR_INVALID_ARG, "path is NULL");
  FILE *f = fopen(path, "rb");
  if (!f)
    return DT_ERROR(DT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  dt_status st = DT_OK;
  char what[256];
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
    st = DT_ERROR(DT_ERR_IO, "%s: not a regular file", path);
    goto done;
  }
  long long size = (long long)sb.st_size;
  uint8_t header[DT_SHARD_HEADER_BYTES];
  if (size < DT_SHARD_HEADER_BYTES) {
    snprintf(what, sizeof what, "the file has %lld bytes, fewer than the %d-byte header", size,
             DT_SHARD_HEADER_BYTES);
    st = shard_format_error(path, size, what);
    goto done;
  }
  if (fread(header, 1, sizeof header, f) != sizeof header) {
    st = DT_ERROR(DT_ERR_IO, "cannot read the header of %s: %s", path, strerror(errno));
    goto done;
  }
  int32_t magic = get_le32(header), version = get_le32(header + 4), count = get_le32(header + 8);
  if (magic != DT_SHARD_MAGIC) {
    snprintf(what, sizeof what, "magic %d, expected %d", magic, DT_SHARD_MAGIC);
    st = shard_format_error(path, 0, what);
  } else if (version != DT_SHARD_VERSION) {
    snprintf(what, sizeof what, "version %d, expected %d (uint16 tokens)", version,
             DT_SHARD_VERSION);
    st = shard_format_error(path, 4, what);
  } else if (count < 0) {
    snprintf(what, sizeof what, "token count %d is negative", count);
    st = shard_format_error(path, 8, what);
  } else if (size != DT_SHARD_HEADER_BYTES + 2 * (long long)count) {
    snprintf(what, sizeof what,
             "the header's count %d needs a file of %lld bytes, this one has %lld (%s)", count,
             DT_SHARD_HEADER_BYTES + 2 * (long long)count, size,
             size < DT_SHARD_HEADER_BYTES + 2 * (long long)count ? "truncated" : "trailing data");
    st = shard_format_error(path, 8, what);
  }
  if (st != DT_OK)
    goto done;
  out->tokens = malloc((size_t)(count > 0 ? count : 1) * sizeof *out->tokens);
  if (!out->tokens) {
    st = DT_ERROR(DT_ERR_OOM, "cannot allocate %d tokens for %s", count, path);
    goto done;
  }
  uint8_t buf[1 << 16];
  for (int64_t i = 0; i < count;) {
    size_t want = (size_t)(count - i) * 2 < sizeof buf ? (size_t)(count - i) * 2 : sizeof buf;
    if (fread(buf, 1, want, f) != want) {
      st = DT_ERROR(DT_ERR_IO, "cannot read %s at byte offset %lld: %s", path,
                    DT_SHARD_HEADER_BYTES + 2 * (long long)i,
                    ferror(f) ? strerror(errno) : "the file shrank while being read");
      goto done;
    }
    for (size_t k = 0; k < want / 2; k++, i++) {
      uint16_t t = (uint16_t)(buf[2 * k] | buf[2 * k + 1] << 8);
      if (vocab_size > 0 && t >= vocab_size) {
        snprintf(what, sizeof what, "token %lld is %u, outside the vocabulary of %d", (long long)i,
                 t, vocab_size);
        st = shard_format_error(path, DT_SHARD_HEADER_BYTES + 2 * (long long)i, what);
        goto done;
      }
      out->tokens[i] = t;
    }
  }
  out->num_tokens = count;
done:
  fclose(f);
  if (st != DT_OK)
    dt_shard_free(out);
  return st;
}

dt_status dt_unigram_cross_entropy(const dt_shard *train, const dt_shard *eval, int32_t vocab_size,
                                   double *nats) {
  if (!train || !eval || !nats || vocab_size < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG, "train, eval and nats must be given, vocab_size >= 1");
  if (eval->num_tokens < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG, "the evaluation set is empty");
  int64_t *counts = calloc((size_t)vocab_size, sizeof *counts);
  if (!counts)
    return DT_ERROR(DT_ERR_OOM, "cannot allocate %d counts", vocab_size);
  dt_status st = DT_OK;
  for (int64_t i = 0; i < train->num_tokens && st == DT_OK; i++)
    if (train->tokens[i] >= vocab_size)
      st = DT_ERROR(DT_ERR_INVALID_ARG, "training token %lld is %u: >= vocab_size %d", (long long)i,
                    train->tokens[i], vocab_size);
    else
      counts[train->tokens[i]]++;
  /* p(t) = (count(t) + 1) / (n + V): every id keeps some probability. */
  double sum = 0, log_total = log((double)train->num_tokens + vocab_size);
  for (int64_t i = 0; i < eval->num_tokens && st == DT_OK; i++)
    if (eval->tokens[i] >= vocab_size)
      st = DT_ERROR(DT_ERR_INVALID_ARG, "evaluation token %lld is %u: >= vocab_size %d",
                    (long long)i, eval->tokens[i], vocab_size);
    else
      sum += log_total - log((double)counts[eval->tokens[i]] + 1);
  if (st == DT_OK)
    *nats = sum / (double)eval->num_tokens;
  free(counts);
  return st;
}
