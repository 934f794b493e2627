/* The growable token and byte buffers of core/text.h, and whole files. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/data_text_internal.h"

/* Grows *data (elements of `size` bytes) to hold `need`; doubles. */
static dt_status grow(void **data, int64_t *cap, int64_t need, size_t size, const char *what) {
  if (need <= *cap)
    return DT_OK;
  if (need > (INT64_C(1) << 40) / (int64_t)size)
    return DT_ERROR(DT_ERR_OOM, "%s buffer of %lld elements: too large", what, (long long)need);
  int64_t c = *cap ? *cap : 256;
  while (c < need)
    c *= 2;
  void *p = realloc(*data, (size_t)c * size);
  if (!p)
    return DT_ERROR(DT_ERR_OOM, "cannot grow a %s buffer to %lld elements", what, (long long)c);
  *data = p;
  *cap = c;
  return DT_OK;
}

/* Appends n elements of `size` bytes from src to the buffer (*data, *len,
 * *cap) of dt_tokens or dt_bytes. */
static dt_status append(void **data, int64_t *len, int64_t *cap, const void *src, int64_t n,
                        size_t size, const char *what) {
  DT_CHECK(grow(data, cap, *len + n, size, what));
  if (n > 0)
    memcpy((char *)*data + (size_t)*len * size, src, (size_t)n * size);
  *len += n;
  return DT_OK;
}

dt_status dt_tokens_append(dt_tokens *t, const int32_t *ids, int64_t n) {
  if (!t || n < 0 || (n > 0 && !ids))
    return DT_ERROR(DT_ERR_INVALID_ARG, "tokens NULL, or ids NULL with n %lld", (long long)n);
  return append((void **)&t->data, &t->len, &t->cap, ids, n, sizeof *t->data, "token");
}

void dt_tokens_free(dt_tokens *t) {
  if (!t)
    return;
  free(t->data);
  memset(t, 0, sizeof *t);
}

dt_status dt_bytes_append(dt_bytes *b, const void *data, int64_t n) {
  if (!b || n < 0 || (n > 0 && !data))
    return DT_ERROR(DT_ERR_INVALID_ARG, "bytes NULL, or data NULL with n %lld", (long long)n);
  return append((void **)&b->data, &b->len, &b->cap, data, n, 1, "byte");
}

void dt_bytes_free(dt_bytes *b) {
  if (!b)
    return;
  free(b->data);
  memset(b, 0, sizeof *b);
}

dt_status dt_text_read_file(const char *path, dt_bytes *out) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return DT_ERROR(DT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  dt_status st = DT_OK;
  uint8_t buf[1 << 16];
  size_t got;
  while (st == DT_OK && (got = fread(buf, 1, sizeof buf, f)) > 0)
    st = dt_bytes_append(out, buf, (int64_t)got);
  if (st == DT_OK && ferror(f))
    st = DT_ERROR(DT_ERR_IO, "cannot read %s: %s", path, strerror(errno));
  fclose(f);
  return st;
}
