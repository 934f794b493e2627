#include "dist/agree.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"

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
static dt_status broadcast_text(dt_comm *comm, dt_device dev, const char *mine, int root,
                                char **out) {
  *out = NULL;
  int64_t one = 1, len = (int64_t)strlen(mine);
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
    return DT_ERROR(DT_ERR_OOM, "receiving a description of %lld bytes", (long long)len);
  if (dt_comm_rank(comm) == root)
    memcpy(buf, mine, (size_t)len);
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

static dt_status report_first_difference(const char *a, const char *b, int rank_b, const char *what,
                                         const char *advice) {
  char la[512], lb[512];
  for (int k = 0;; k++) {
    nth_line(a, k, la, sizeof la);
    nth_line(b, k, lb, sizeof lb);
    if (strcmp(la, lb) != 0)
      return DT_ERROR(DT_ERR_DIST_MISMATCH, "ranks %s: rank 0 has %s, rank %d has %s: %s", what,
                      la[0] ? la : "nothing more", rank_b, lb[0] ? lb : "nothing more", advice);
    if (la[0] == '\0')
      return DT_ERROR(DT_ERR_DIST_MISMATCH,
                      "ranks %s (hashes differ) but rank 0 and rank %d describe it identically",
                      what, rank_b);
  }
}

dt_status dt_dist_agree_text(dt_comm *comm, dt_device dev, const char *text, const char *what,
                             const char *advice) {
  int world = dt_comm_size(comm);
  if (world == 1)
    return DT_OK;
  int64_t h = (int64_t)fnv1a(text, strlen(text)), one = 1, w = world;
  int64_t *all = calloc((size_t)world, sizeof *all);
  dt_tensor *th = NULL, *tall = NULL;
  char *text0 = NULL, *textr = NULL;
  dt_status st = DT_OK;
  if (all == NULL)
    return DT_ERROR(DT_ERR_OOM, "checking that the ranks agree: out of host memory");
  DT_CHECK_GOTO(dt_tensor_from_host(&h, &one, 1, DT_DTYPE_I64, dev, &th), st, done);
  DT_CHECK_GOTO(dt_tensor_zeros(&w, 1, DT_DTYPE_I64, dev, &tall), st, done);
  DT_CHECK_GOTO(dt_comm_allgather_sync(comm, th, tall), st, done);
  DT_CHECK_GOTO(dt_tensor_to_host(tall, all, (size_t)world * sizeof *all), st, done);
  int differing = -1;
  for (int r = 1; r < world && differing < 0; r++)
    if (all[r] != all[0])
      differing = r;
  if (differing < 0)
    goto done;
  /* Every rank takes part in both broadcasts, so every rank can report. */
  DT_CHECK_GOTO(broadcast_text(comm, dev, text, 0, &text0), st, done);
  DT_CHECK_GOTO(broadcast_text(comm, dev, text, differing, &textr), st, done);
  st = report_first_difference(text0, textr, differing, what, advice);

done:
  free(text0);
  free(textr);
  dt_tensor_release(th);
  dt_tensor_release(tall);
  free(all);
  return st;
}
