/* ZeRO stages 1 and 2 of the DDP reducer (dist/ddp.h): the same buckets
 * and hooks as the all-reduce, but each bucket is reduce-scattered into
 * this rank's piece of it, the optimizer updates only those pieces and
 * the updated pieces are all-gathered.
 *
 * Layout. Buckets are formed from the end of the flat space as in stage 0
 * (bucket 0 holds the last parameters and launches first), but by
 * element count and with every boundary except the flat space's end on a
 * multiple of the world size W: a bucket may split a parameter, and only
 * bucket 0 can have a length L that W does not divide. Bucket b is
 * padded to P = W * s elements (s = ceil(L / W)); rank r owns
 * [offset + r * s, offset + (r + 1) * s). Only bucket 0 reaches past the
 * last parameter, so the arena gets a zeroed tail of P - L < W elements
 * (dt_param_arena_pad) and every collective works on views: no copies
 * in stage 1, and no divisibility requirement on the model (PyTorch
 * FSDP pads its flat parameters the same way; llm.c requires W to divide
 * the parameter count).
 *
 * Stage 1: .grad tensors stay views of the (padded) flat gradient buffer;
 * a bucket's reduce-scatter (average) reads its slice and writes this
 * rank's piece of the shard gradients (shard_numel = sum of s, the same
 * on every rank). Stage 2: the arena's gradient buffer is dropped;
 * autograd allocates each parameter's gradient, the grad-ready hook
 * copies it into its bucket's buffer and frees it, and the buffer is
 * reduce-scattered. A bucket's buffer is allocated when its first
 * gradient arrives and freed once its reduce-scatter is done: polled when
 * the next buffer is needed, and waited for (oldest first) while the
 * buffers would exceed two of the largest buckets; the rest at the end of
 * backward. Besides the shard only the buckets in flight hold gradients
 * (more while one parameter's gradient spans more buckets: it arrives
 * whole).
 *
 * The update: dt_ddp_shard_optimizer gives the optimizer one segment per
 * bucket (this rank's piece, without the padding) and hooks: after each
 * segment's update an event on the compute stream and the all-gather of
 * that piece (in place: the piece is this rank's part of the bucket), so
 * gathers overlap the rest of the update; at the end the compute stream
 * waits for every gather (the host, for host communicators). Clipping's
 * partial sums of squares are all-gathered as raw doubles and added in
 * rank order, so every rank gets the same norm in double precision.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/ddp_internal.h"

/* Elements of a bucket cap in bytes, at least one. */
static int64_t cap_elements(size_t bytes) {
  int64_t n = (int64_t)(bytes / sizeof(float));
  return n > 0 ? n : 1;
}

/* Bucket lower bounds, from the top of the flat space down, multiples of
 * w; returns how many (lo NULL: only counts). */
static int64_t plan_buckets(int64_t numel, int64_t w, int64_t first_cap, int64_t cap, int64_t *lo) {
  int64_t n = 0, top = numel;
  while (top > 0 || n == 0) {
    int64_t c = n == 0 ? first_cap : cap;
    int64_t b = top - c > 0 ? (top - c) / w * w : 0;
    if (lo)
      lo[n] = b;
    n++;
    top = b;
  }
  return n;
}

static dt_status view(dt_tensor *t, int64_t offset, int64_t numel, dt_tensor **out) {
  return dt_tensor_view_flat(t, offset, &numel, 1, out);
}

/* The buckets parameter i overlaps, *first to *last (bucket b holds
 * [lo[b], lo[b - 1]), bucket 0 up to the end; none: *first > *last). An
 * empty parameter counts towards the bucket holding its offset. */
static void param_span(const dt_param_arena *arena, int i, int n_buckets, const int64_t *lo,
                       int *first, int *last) {
  int64_t numel = dt_param_arena_numel(arena), a = dt_param_arena_offset(arena, i);
  int64_t len = dt_tensor_numel(dt_param_arena_param(arena, i, NULL));
  int64_t e0 = a < numel ? a : numel - 1, e1 = len > 0 ? a + len - 1 : e0;
  *first = n_buckets;
  *last = -1;
  for (int b = 0; b < n_buckets; b++) {
    int64_t top = b == 0 ? numel : lo[b - 1];
    if (e1 < lo[b] || e0 >= top)
      continue;
    *first = b < *first ? b : *first;
    *last = b;
  }
}

void dt_zero_layout_free(dt_zero_layout *l) {
  free(l->padded);
  free(l->first);
  free(l->last);
  memset(l, 0, sizeof *l);
}

dt_status dt_zero_layout_get(const dt_param_arena *arena, int world, size_t first_bucket_bytes,
                             size_t bucket_bytes, dt_zero_layout *out) {
  memset(out, 0, sizeof *out);
  int64_t numel = dt_param_arena_numel(arena), w = world > 0 ? world : 1;
  int64_t first_cap = cap_elements(first_bucket_bytes), cap = cap_elements(bucket_bytes);
  int64_t n = plan_buckets(numel, w, first_cap, cap, NULL);
  if (n > INT_MAX / 2)
    return DT_ERROR(DT_ERR_INVALID_ARG, "ZeRO: %lld buckets of %zu bytes", (long long)n,
                    bucket_bytes);
  int np = dt_param_arena_count(arena);
  int64_t *lo = calloc((size_t)n, sizeof *lo);
  out->padded = calloc((size_t)n, sizeof *out->padded);
  out->first = calloc((size_t)np + 1, sizeof *out->first); /* + 1: never calloc(0) */
  out->last = calloc((size_t)np + 1, sizeof *out->last);
  if (lo == NULL || out->padded == NULL || out->first == NULL || out->last == NULL) {
    free(lo);
    dt_zero_layout_free(out);
    return DT_ERROR(DT_ERR_OOM, "ZeRO: out of host memory for a layout of %lld buckets",
                    (long long)n);
  }
  out->n_buckets = (int)plan_buckets(numel, w, first_cap, cap, lo);
  out->n_params = np;
  for (int b = 0; b < out->n_buckets; b++) {
    int64_t len = (b == 0 ? numel : lo[b - 1]) - lo[b];
    out->padded[b] = (len + w - 1) / w * w;
  }
  for (int i = 0; i < np; i++)
    param_span(arena, i, out->n_buckets, lo, &out->first[i], &out->last[i]);
  free(lo);
  return DT_OK;
}

/* Which buckets each parameter overlaps, and each bucket's parameters
 * (lo: the buckets' lower bounds). */
static void assign_params(dt_ddp *d, const int64_t *lo) {
  for (int b = 0; b < d->n_buckets; b++) {
    d->buckets[b].first = d->n_params;
    d->buckets[b].last = -1;
  }
  for (int i = 0; i < d->n_params; i++) {
    ddp_param *pa = &d->params[i];
    param_span(d->arena, i, d->n_buckets, lo, &pa->bucket, &pa->bucket_end);
    for (int b = pa->bucket; b <= pa->bucket_end; b++) {
      ddp_bucket *bk = &d->buckets[b];
      bk->n_params++;
      if (i < bk->first)
        bk->first = i;
      if (i > bk->last)
        bk->last = i;
    }
  }
}

/* This rank's segment of bucket b, without the padding. */
static dt_optim_segment bucket_segment(const dt_ddp *d, const ddp_bucket *bk) {
  int64_t lo = bk->offset + (int64_t)d->rank * bk->shard;
  int64_t hi = lo + bk->shard, end = bk->offset + bk->numel;
  if (hi > end)
    hi = end;
  if (lo > end)
    lo = end;
  return (dt_optim_segment){lo, hi - lo, bk->local_offset};
}

static dt_status bucket_views(dt_ddp *d, ddp_bucket *bk) {
  dt_tensor *data = dt_param_arena_padded_data(d->arena);
  DT_CHECK(view(d->shard_grads, bk->local_offset, bk->shard, &bk->rs_out));
  DT_CHECK(view(data, bk->offset + (int64_t)d->rank * bk->shard, bk->shard, &bk->ag_in));
  DT_CHECK(view(data, bk->offset, bk->padded, &bk->ag_out));
  if (d->cfg.zero_stage == 1)
    DT_CHECK(view(dt_param_arena_padded_grads(d->arena), bk->offset, bk->padded, &bk->rs_in));
  DT_CHECK(d->ops->event_create(d->dev, &bk->ready_ev));
  return d->ops->event_create(d->dev, &bk->gather_ev);
}

dt_status dt_zero_build_buckets(dt_ddp *d) {
  int64_t numel = dt_param_arena_numel(d->arena), w = d->world;
  int64_t first_cap = cap_elements(d->cfg.first_bucket_bytes);
  int64_t cap = cap_elements(d->cfg.bucket_bytes);
  int64_t n = plan_buckets(numel, w, first_cap, cap, NULL);
  if (n > INT_MAX / 2)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "ZeRO: %lld buckets of %zu bytes: raise the bucket size (--bucket-cap-mb)",
                    (long long)n, d->cfg.bucket_bytes);
  int64_t *lo = calloc((size_t)n, sizeof *lo);
  d->buckets = calloc((size_t)n, sizeof *d->buckets);
  d->timings = calloc((size_t)n, sizeof *d->timings);
  d->segments = calloc((size_t)n, sizeof *d->segments);
  if (lo == NULL || d->buckets == NULL || d->timings == NULL || d->segments == NULL) {
    free(lo);
    return DT_ERROR(DT_ERR_OOM, "ZeRO: out of host memory for %lld buckets", (long long)n);
  }
  d->n_buckets = (int)plan_buckets(numel, w, first_cap, cap, lo);
  int64_t top = numel, local = 0;
  for (int b = 0; b < d->n_buckets; b++) {
    ddp_bucket *bk = &d->buckets[b];
    bk->offset = lo[b];
    bk->numel = top - lo[b];
    bk->shard = (bk->numel + w - 1) / w;
    bk->padded = bk->shard * w;
    bk->local_offset = local;
    local += bk->shard;
    top = lo[b];
    d->timings[b].bytes = (size_t)bk->padded * sizeof(float);
  }
  assign_params(d, lo);
  free(lo);
  d->shard_numel = local;
  d->dev = dt_param_arena_device(d->arena);
  DT_CHECK(dt_backend_get(d->dev, &d->ops));
  d->compute = d->ops->stream(d->dev, DT_STREAM_COMPUTE);
  /* Only bucket 0 (ending at the last parameter) reaches past it. */
  DT_CHECK(dt_param_arena_pad(d->arena, d->buckets[0].padded - d->buckets[0].numel));
  if (d->cfg.zero_stage == 2 && dt_param_arena_grads(d->arena) != NULL)
    DT_CHECK(dt_param_arena_drop_grads(d->arena));
  int64_t shape[1] = {d->shard_numel};
  DT_CHECK(dt_tensor_zeros(shape, 1, DT_DTYPE_F32, d->dev, &d->shard_grads));
  for (int b = 0; b < d->n_buckets; b++) {
    DT_CHECK(bucket_views(d, &d->buckets[b]));
    d->segments[b] = bucket_segment(d, &d->buckets[b]);
  }
  return DT_OK;
}

/* ---- stage 2: bucket buffers ---- */

/* Frees bucket b's buffer once its reduce-scatter is done (the compute
 * stream waits for it on devices, the host on cpu). */
static void free_bucket_buffer(dt_ddp *d, int b) {
  size_t bytes = (size_t)d->buckets[b].padded * sizeof(float);
  dt_status st = dt_ddp_finish_bucket(d, b, 0);
  d->buffer_bytes -= bytes;
  if (st != DT_OK)
    dt_ddp_record_error(d, st);
}

/* Makes room for `need` more bytes of bucket buffers: frees those whose
 * reduce-scatter has completed (polled), then, while the buckets in flight
 * would exceed two of the largest buckets, waits for the oldest launched. */
static void make_room(dt_ddp *d, size_t need) {
  for (int b = 0; b < d->n_buckets; b++)
    if (d->buckets[b].work != NULL && dt_work_test(d->buckets[b].work))
      free_bucket_buffer(d, b);
  int64_t largest = 0;
  for (int b = 0; b < d->n_buckets; b++)
    largest = d->buckets[b].padded > largest ? d->buckets[b].padded : largest;
  size_t cap = DT_ZERO_BUFFERS_IN_FLIGHT * (size_t)largest * sizeof(float);
  for (int b = 0; b < d->n_buckets && d->buffer_bytes + need > cap; b++)
    if (d->buckets[b].work != NULL)
      free_bucket_buffer(d, b);
}

/* Bucket b's buffer this pass, zeroed (padding and unused parameters
 * reduce zeros). */
static dt_status bucket_buffer(dt_ddp *d, int b) {
  ddp_bucket *bk = &d->buckets[b];
  if (bk->rs_in != NULL)
    return DT_OK;
  size_t bytes = (size_t)bk->padded * sizeof(float);
  make_room(d, bytes);
  int64_t shape[1] = {bk->padded};
  DT_CHECK(dt_tensor_zeros(shape, 1, DT_DTYPE_F32, d->dev, &bk->rs_in));
  d->buffer_bytes += bytes;
  if (d->buffer_bytes > d->buffer_peak)
    d->buffer_peak = d->buffer_bytes;
  return DT_OK;
}

/* Where parameter pa's gradient starts in its bucket's buffer (elements;
 * pa within one bucket). */
static int64_t offset_in_bucket(const dt_ddp *d, const ddp_param *pa) {
  return dt_param_arena_offset(d->arena, pa->index) - d->buckets[pa->bucket].offset;
}

dt_status dt_zero_grad_dest(dt_tensor *leaf, void *user, dt_tensor **grad) {
  ddp_param *pa = user; /* within one bucket: the hook is set on those only */
  dt_ddp *d = pa->d;
  *grad = NULL;
  /* accumulating micro-batches keep .grad until the synchronised pass */
  if (d->no_sync || pa->ready_this_pass)
    return DT_OK;
  DT_CHECK(bucket_buffer(d, pa->bucket));
  int64_t shape[DT_MAX_DIMS];
  int nd = dt_tensor_ndim(leaf);
  for (int k = 0; k < nd; k++)
    shape[k] = dt_tensor_dim(leaf, k);
  return dt_tensor_view_flat(d->buckets[pa->bucket].rs_in, offset_in_bucket(d, pa), shape, nd,
                             grad);
}

dt_status dt_zero_take_gradient(dt_ddp *d, const ddp_param *pa) {
  dt_tensor *p = dt_param_arena_param(d->arena, pa->index, NULL);
  dt_tensor *g = dt_tensor_grad(p);
  int64_t lo = dt_param_arena_offset(d->arena, pa->index), n = dt_tensor_numel(p);
  dt_status st = DT_OK;
  /* written in place (dt_zero_grad_dest): nothing to copy */
  const dt_tensor *rs_in = d->buckets[pa->bucket].rs_in;
  bool in_place = g != NULL && pa->bucket == pa->bucket_end && rs_in != NULL &&
                  (float *)dt_tensor_data(rs_in) + offset_in_bucket(d, pa) == dt_tensor_data(g);
  for (int b = pa->bucket; b <= pa->bucket_end && st == DT_OK && !in_place; b++) {
    const ddp_bucket *bk = &d->buckets[b];
    st = bucket_buffer(d, b);
    int64_t from = lo > bk->offset ? lo : bk->offset;
    int64_t to = lo + n < bk->offset + bk->numel ? lo + n : bk->offset + bk->numel;
    if (st != DT_OK || g == NULL || to <= from)
      continue;
    dt_tensor *src = NULL, *dst = NULL;
    st = view(g, from - lo, to - from, &src);
    if (st == DT_OK)
      st = view(bk->rs_in, from - bk->offset, to - from, &dst);
    if (st == DT_OK)
      st = dt_tensor_copy_(dst, src);
    dt_tensor_release(dst);
    dt_tensor_release(src);
  }
  if (st == DT_OK)
    st = dt_tensor_set_grad(p, NULL); /* its memory goes back to the allocator */
  return st == DT_OK ? DT_OK : dt_error_wrap(st, "ZeRO stage 2: taking a parameter's gradient");
}

void dt_zero_end_pass(dt_ddp *d) {
  for (int b = 0; b < d->n_buckets && d->cfg.zero_stage == 2; b++) {
    dt_tensor_release(d->buckets[b].rs_in);
    d->buckets[b].rs_in = NULL;
  }
  d->buffer_bytes = 0;
}

dt_status dt_zero_bucket_io(dt_ddp *d, int b, dt_tensor **in, dt_tensor **out) {
  ddp_bucket *bk = &d->buckets[b];
  if (d->cfg.zero_stage == 2)
    DT_CHECK(bucket_buffer(d, b)); /* a bucket of unused parameters reduces zeros */
  *in = bk->rs_in;
  *out = bk->rs_out;
  return DT_OK;
}

/* ---- the sharded update ---- */

static dt_status launch_gather(dt_ddp *d, int b) {
  ddp_bucket *bk = &d->buckets[b];
  dt_coll_opts opts = DT_COLL_OPTS_DEFAULT;
  opts.bucket = b;
  opts.ready = bk->gather_ev;
  DT_CHECK(d->ops->event_record(bk->gather_ev, d->compute));
  return dt_comm_allgather(d->comm, bk->ag_in, bk->ag_out, &opts, &bk->gather);
}

static dt_status segment_updated(void *ctx, int segment) {
  dt_ddp *d = ctx;
  if (segment != d->next_gather)
    return DT_ERROR(DT_ERR_INTERNAL, "ZeRO: segment %d updated, expected %d", segment,
                    d->next_gather);
  d->next_gather++;
  dt_status st = launch_gather(d, segment);
  return st == DT_OK ? DT_OK
                     : dt_error_wrap(st, "ZeRO: launching the all-gather of bucket %d", segment);
}

/* Gathers what is left (every rank must submit every bucket's gather),
 * then makes the compute stream (host communicators: the host) wait for
 * all of them. */
static dt_status step_done(void *ctx, dt_status st) {
  dt_ddp *d = ctx;
  for (; d->next_gather < d->n_buckets; d->next_gather++) {
    dt_status g = launch_gather(d, d->next_gather);
    if (g != DT_OK && st == DT_OK)
      st = dt_error_wrap(g, "ZeRO: launching the all-gather of bucket %d", d->next_gather);
  }
  d->next_gather = 0;
  for (int b = 0; b < d->n_buckets; b++) {
    ddp_bucket *bk = &d->buckets[b];
    if (bk->gather == NULL)
      continue;
    dt_status g = dt_work_wait_stream(bk->gather, d->compute);
    if (g != DT_OK && st == DT_OK)
      st = dt_error_wrap(g, "ZeRO: gathering the parameters of bucket %d", b);
    dt_work_release(bk->gather);
    bk->gather = NULL;
  }
  return st;
}

/* Sums values over the ranks: every rank's doubles are gathered as bytes
 * and added in rank order, identically everywhere. */
dt_status dt_ddp_sum_over_ranks(void *ctx, double *values, int n) {
  dt_ddp *d = ctx;
  int64_t bytes = (int64_t)n * (int64_t)sizeof(double), all = bytes * d->world;
  dt_tensor *mine = NULL, *gathered = NULL;
  double *host = malloc((size_t)all);
  dt_status st = host ? DT_OK : DT_ERROR(DT_ERR_OOM, "ZeRO: out of host memory");
  if (st == DT_OK)
    st = dt_tensor_from_host(values, &bytes, 1, DT_DTYPE_U8, d->dev, &mine);
  if (st == DT_OK)
    st = dt_tensor_empty(&all, 1, DT_DTYPE_U8, d->dev, &gathered);
  if (st == DT_OK)
    st = dt_comm_allgather_sync(d->comm, mine, gathered);
  if (st == DT_OK)
    st = dt_tensor_to_host(gathered, host, (size_t)all);
  for (int i = 0; i < n && st == DT_OK; i++) {
    double sum = 0.0;
    for (int r = 0; r < d->world; r++)
      sum += host[r * n + i];
    values[i] = sum;
  }
  dt_tensor_release(gathered);
  dt_tensor_release(mine);
  free(host);
  return st == DT_OK ? DT_OK : dt_error_wrap(st, "ZeRO: summing partial norms over the ranks");
}

dt_status dt_ddp_shard_optimizer(dt_ddp *d, dt_optimizer *opt) {
  if (d == NULL || opt == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "ZeRO: reducer and optimizer must not be NULL");
  if (d->cfg.zero_stage == 0)
    return DT_OK;
  dt_optim_shard sh = {d->segments, d->n_buckets,          d->shard_numel,  d->shard_grads,
                       d,           dt_ddp_sum_over_ranks, segment_updated, step_done};
  DT_CHECK(dt_optim_set_shard(opt, &sh));
  d->opt = opt;
  return DT_OK;
}

int dt_ddp_zero_stage(const dt_ddp *d) { return d->cfg.zero_stage; }

size_t dt_ddp_gradient_bytes(const dt_ddp *d) {
  size_t f = sizeof(float);
  size_t flat = dt_param_arena_grads(d->arena) == NULL
                    ? 0
                    : (size_t)(dt_param_arena_numel(d->arena) + dt_param_arena_tail(d->arena)) * f;
  return flat + (size_t)d->shard_numel * f;
}

size_t dt_ddp_bucket_buffer_peak(const dt_ddp *d) { return d->buffer_peak; }

void dt_zero_destroy(dt_ddp *d) {
  for (int b = 0; d->buckets && b < d->n_buckets; b++) {
    ddp_bucket *bk = &d->buckets[b];
    if (bk->gather) {
      dt_work_wait(bk->gather, 0);
      dt_work_release(bk->gather);
    }
    if (bk->gather_ev)
      d->ops->event_destroy(bk->gather_ev);
    dt_tensor_release(bk->rs_in);
    dt_tensor_release(bk->rs_out);
    dt_tensor_release(bk->ag_in);
    dt_tensor_release(bk->ag_out);
  }
  free(d->segments);
  dt_tensor_release(d->shard_grads);
}
