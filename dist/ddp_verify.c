/* Cross-rank check that every rank built the same model. Cheap in the
 * common case (one allgather of a 64-bit hash); on a mismatch, rank 0's and
 * the first differing rank's descriptions are broadcast so that every rank
 * reports the same first difference. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/ddp_internal.h"

typedef struct text {
  char *s;
  size_t len, cap;
} text;

static dt_status text_append(text *t, const char *line) {
  size_t n = strlen(line);
  if (t->len + n + 1 > t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 4096;
    while (cap < t->len + n + 1)
      cap *= 2;
    char *s = realloc(t->s, cap);
    if (s == NULL)
      return DT_ERROR(DT_ERR_OOM, "describing the model's parameters: out of host memory");
    t->s = s;
    t->cap = cap;
  }
  memcpy(t->s + t->len, line, n + 1);
  t->len += n;
  return DT_OK;
}

static void describe_tensor_line(const char *kind, int i, const char *name, const dt_tensor *t,
                                 char *buf, size_t cap) {
  int n = snprintf(buf, cap, "%s %d \"%s\" %s[", kind, i, name, dt_dtype_name(dt_tensor_dtype(t)));
  for (int d = 0; d < dt_tensor_ndim(t) && n > 0 && (size_t)n < cap; d++)
    n +=
        snprintf(buf + n, cap - (size_t)n, "%s%lld", d ? ", " : "", (long long)dt_tensor_dim(t, d));
  if (n > 0 && (size_t)n < cap)
    snprintf(buf + n, cap - (size_t)n, "]\n");
}

static dt_status describe_model(dt_module *model, dt_param_arena *arena, text *out) {
  char line[512];
  for (int i = 0; i < dt_param_arena_count(arena); i++) {
    const char *name = NULL;
    dt_tensor *p = dt_param_arena_param(arena, i, &name);
    describe_tensor_line("parameter", i, name, p, line, sizeof line);
    DT_CHECK(text_append(out, line));
  }
  for (int i = 0; i < dt_module_num_buffers(model); i++) {
    const char *name = NULL;
    dt_tensor *b = dt_module_buffer_at(model, i, &name);
    describe_tensor_line("buffer", i, name, b, line, sizeof line);
    DT_CHECK(text_append(out, line));
  }
  return text_append(out, "end\n");
}

static uint64_t fnv1a(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)s[i];
    h *= 1099511628211ull;
  }
  return h;
}

/* Broadcasts root's text (length, then bytes) into *out (malloc'd, NUL
 * terminated). */
static dt_status broadcast_text(dt_comm *comm, dt_device dev, const text *mine, int root,
                                char **out) {
  *out = NULL;
  int64_t one = 1, len = (int64_t)mine->len;
  dt_tensor *tlen = NULL, *tbytes = NULL;
  DT_CHECK(dt_tensor_from_host(&len, &one, 1, DT_DTYPE_I64, dev, &tlen));
  dt_status st = dt_comm_broadcast_sync(comm, tlen, root);
  if (st == DT_OK)
    st = dt_tensor_to_host(tlen, &len, sizeof len);
  dt_tensor_release(tlen);
  if (st != DT_OK)
    return st;
  char *buf = calloc((size_t)len + 1, 1);
  if (buf == NULL)
    return DT_ERROR(DT_ERR_OOM, "receiving a model description of %lld bytes", (long long)len);
  if (dt_comm_rank(comm) == root)
    memcpy(buf, mine->s, (size_t)len);
  int64_t shape = len;
  st = dt_tensor_from_host(buf, &shape, 1, DT_DTYPE_U8, dev, &tbytes);
  if (st == DT_OK)
    st = dt_comm_broadcast_sync(comm, tbytes, root);
  if (st == DT_OK)
    st = dt_tensor_to_host(tbytes, buf, (size_t)len);
  dt_tensor_release(tbytes);
  if (st != DT_OK) {
    free(buf);
    return st;
  }
  *out = buf;
  return DT_OK;
}

/* Copies line `k` (0-based) of s into buf without its newline; "" past the end. */
static void nth_line(const char *s, int k, char *buf, size_t cap) {
  for (int i = 0; i < k && s != NULL; i++) {
    s = strchr(s, '\n');
    if (s)
      s++;
  }
  buf[0] = '\0';
  if (s == NULL || *s == '\0')
    return;
  size_t n = strcspn(s, "\n");
  if (n >= cap)
    n = cap - 1;
  memcpy(buf, s, n);
  buf[n] = '\0';
}

static dt_status report_first_difference(const char *a, const char *b, int rank_b) {
  char la[512], lb[512];
  for (int k = 0;; k++) {
    nth_line(a, k, la, sizeof la);
    nth_line(b, k, lb, sizeof lb);
    if (strcmp(la, lb) != 0)
      return DT_ERROR(DT_ERR_DIST_MISMATCH,
                      "ranks registered different models: rank 0 has %s, rank %d has %s: build "
                      "the same model (same --model and sizes) on every rank",
                      la[0] ? la : "nothing more", rank_b, lb[0] ? lb : "nothing more");
    if (la[0] == '\0')
      return DT_ERROR(DT_ERR_DIST_MISMATCH,
                      "ranks registered different models (hashes differ) but rank 0 and rank %d "
                      "describe them identically",
                      rank_b);
  }
}

dt_status dt_ddp_verify_parameters(dt_comm *comm, dt_module *model, dt_param_arena *arena) {
  int world = dt_comm_size(comm);
  if (world == 1)
    return DT_OK;
  dt_device dev = dt_param_arena_device(arena);
  text mine = {0};
  dt_status st = describe_model(model, arena, &mine);
  if (st != DT_OK) {
    free(mine.s);
    return st;
  }
  int64_t h = (int64_t)fnv1a(mine.s, mine.len), one = 1, w = world;
  int64_t *all = calloc((size_t)world, sizeof *all);
  dt_tensor *th = NULL, *tall = NULL;
  char *desc0 = NULL, *descr = NULL;
  if (all == NULL) {
    st = DT_ERROR(DT_ERR_OOM, "verifying parameters: out of host memory");
    goto free_text;
  }
  DT_CHECK_GOTO(dt_tensor_from_host(&h, &one, 1, DT_DTYPE_I64, dev, &th), st, free_text);
  DT_CHECK_GOTO(dt_tensor_zeros(&w, 1, DT_DTYPE_I64, dev, &tall), st, free_text);
  DT_CHECK_GOTO(dt_comm_allgather_sync(comm, th, tall), st, free_text);
  DT_CHECK_GOTO(dt_tensor_to_host(tall, all, (size_t)world * sizeof *all), st, free_text);
  int differing = -1;
  for (int r = 1; r < world && differing < 0; r++)
    if (all[r] != all[0])
      differing = r;
  if (differing < 0)
    goto free_text;
  /* Every rank takes part in both broadcasts, so every rank can report. */
  DT_CHECK_GOTO(broadcast_text(comm, dev, &mine, 0, &desc0), st, free_text);
  DT_CHECK_GOTO(broadcast_text(comm, dev, &mine, differing, &descr), st, free_text);
  st = report_first_difference(desc0, descr, differing);

free_text:
  free(desc0);
  free(descr);
  dt_tensor_release(th);
  dt_tensor_release(tall);
  free(all);
  free(mine.s);
  return st;
}
