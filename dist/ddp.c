/* The DDP reducer: buckets over the flat gradient buffer, launched from
 * grad-ready hooks in bucket order, averaged by the communicator (ZeRO:
 * reduce-scattered, zero.c). */
#include "dist/ddp.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/trace.h"
#include "dist/ddp_internal.h"

const char *dt_ddp_grad_compress_name(dt_dtype t) {
  return t == DT_DTYPE_F32    ? "none"
         : t == DT_DTYPE_BF16 ? "bf16"
         : t == DT_DTYPE_F16  ? "fp16"
                              : NULL;
}

dt_status dt_ddp_grad_compress_parse(const char *s, dt_dtype *out) {
  for (int t = 0; s != NULL && t < DT_DTYPE_COUNT; t++) {
    const char *name = dt_ddp_grad_compress_name((dt_dtype)t);
    if (name != NULL && strcmp(s, name) == 0) {
      *out = (dt_dtype)t;
      return DT_OK;
    }
  }
  return DT_ERROR(DT_ERR_INVALID_ARG,
                  "gradient compression '%s': expected none, bf16 (all-reduce the gradients in "
                  "bfloat16) or fp16 (in float16)",
                  s ? s : "(null)");
}

void dt_ddp_record_error(dt_ddp *d, dt_status st) {
  if (d->error == DT_OK) {
    d->error = st;
    snprintf(d->error_msg, sizeof d->error_msg, "%s", dt_last_error());
  }
}

static void release_compressed(ddp_bucket *bk) {
  dt_tensor_release(bk->comp_in);
  dt_tensor_release(bk->comp_out);
  bk->comp_in = bk->comp_out = NULL;
}

/* --grad-compress: a 16-bit copy of `src` (cast on the compute stream). */
static dt_status compressed_copy(dt_ddp *d, dt_tensor *src, dt_tensor **out) {
  int64_t n = dt_tensor_numel(src);
  DT_CHECK(dt_tensor_empty(&n, 1, d->cfg.grad_compress, d->dev, out));
  return dt_tensor_copy_(*out, src);
}

/* Bucket b's collective: all-reduce (average) of its gradients, or ZeRO's
 * reduce-scatter into the shard; in 16 bits with compression. */
static dt_status submit_bucket(dt_ddp *d, int b, const dt_coll_opts *opts) {
  ddp_bucket *bk = &d->buckets[b];
  dt_tensor *in = bk->view, *out = bk->view;
  if (d->cfg.zero_stage > 0)
    DT_CHECK(dt_zero_bucket_io(d, b, &in, &out));
  if (d->cfg.grad_compress != DT_DTYPE_F32) {
    DT_CHECK(compressed_copy(d, in, &bk->comp_in));
    in = out = bk->comp_in;
    if (d->cfg.zero_stage > 0) {
      int64_t n = dt_tensor_numel(bk->rs_out);
      DT_CHECK(dt_tensor_empty(&n, 1, d->cfg.grad_compress, d->dev, &bk->comp_out));
      out = bk->comp_out;
    }
  }
  /* The gradients (or their 16-bit copy) are complete once the compute
   * stream reaches this point: the communicator's stream waits on the
   * event (nccl, host staging); the CPU backend computes synchronously
   * and its events are no-ops. */
  DT_CHECK(d->ops->event_record(bk->ready_ev, d->compute));
  if (d->cfg.zero_stage > 0)
    return dt_comm_reduce_scatter(d->comm, in, out, DT_REDUCE_AVG, opts, &bk->work);
  return dt_comm_allreduce(d->comm, in, DT_REDUCE_AVG, opts, &bk->work);
}

static void launch_bucket(dt_ddp *d, int b) {
  ddp_bucket *bk = &d->buckets[b];
  dt_coll_opts opts = DT_COLL_OPTS_DEFAULT;
  opts.bucket = b;
  opts.ready = bk->ready_ev;
  d->timings[b].launch_s = dt_comm_now();
  dt_work_release(bk->last_work);
  bk->last_work = NULL;
  dt_status st = submit_bucket(d, b, &opts);
  if (st != DT_OK && bk->work == NULL)
    release_compressed(bk); /* nothing in flight uses the 16-bit copies */
  if (st != DT_OK)
    dt_ddp_record_error(d,
                        dt_error_wrap(st, "launching the %s of DDP bucket %d",
                                      d->cfg.zero_stage > 0 ? "reduce-scatter" : "all-reduce", b));
}

/* After an error nothing more launches: a bucket this rank skipped would
 * pair the peers' all-reduce with our next bucket (wrong sums, or a hang). */
static void launch_ready_buckets(dt_ddp *d) {
  while (d->error == DT_OK && d->next_launch < d->n_buckets && d->buckets[d->next_launch].ready)
    launch_bucket(d, d->next_launch++);
}

static void count_down_bucket(dt_ddp *d, int b, double now) {
  if (--d->buckets[b].pending == 0) {
    d->buckets[b].ready = 1;
    d->timings[b].ready_s = now;
  }
}

/* Stage 0: a unit is ready, its bucket has one less to wait for. */
static void unit_ready(dt_ddp *d, ddp_unit *u, double now) {
  if (u->ready)
    return;
  u->ready = true;
  count_down_bucket(d, u->bucket, now);
}

/* Parameter pa is ready: its buckets have one parameter (stage 0: its
 * units not reported yet) less to wait for. */
static void count_down_buckets(dt_ddp *d, const ddp_param *pa, double now) {
  if (d->units != NULL) {
    for (int u = pa->unit0; u < pa->unit0 + pa->n_units; u++)
      unit_ready(d, &d->units[u], now);
    return;
  }
  for (int b = pa->bucket; b <= pa->bucket_end; b++)
    count_down_bucket(d, b, now);
}

/* A gradient of this synchronised pass arrived (hook time `now`). */
static void note_pass(dt_ddp *d, double now) {
  if (!d->in_pass) {
    d->in_pass = 1;
    d->first_grad_s = now;
  }
  d->last_grad_s = now;
}

/* Stage 0: rows [row0, row0 + nrows) of the parameter's gradient are final
 * (dt_tensor_set_grad_rows_hook): the units they cover are ready. */
static void on_grad_rows(dt_tensor *leaf, int64_t row0, int64_t nrows, void *user) {
  (void)leaf;
  ddp_param *pa = user;
  dt_ddp *d = pa->d;
  if (d->no_sync || pa->ready_this_pass) /* a second pass is the grad-ready hook's error */
    return;
  double now = dt_comm_now();
  note_pass(d, now);
  for (int i = pa->unit0; i < pa->unit0 + pa->n_units; i++) {
    ddp_unit *u = &d->units[i];
    if (u->row0 >= row0 && u->row0 + u->rows <= row0 + nrows)
      unit_ready(d, u, now);
  }
  launch_ready_buckets(d);
}

static void on_grad_ready(dt_tensor *leaf, void *user) {
  (void)leaf;
  ddp_param *pa = user;
  dt_ddp *d = pa->d;
  double now = dt_comm_now();
  pa->used_since_sync = true;
  if (d->no_sync)
    return;
  note_pass(d, now);
  if (pa->ready_this_pass) {
    const char *name = NULL;
    dt_param_arena_param(d->arena, pa->index, &name);
    dt_ddp_record_error(d,
                        DT_ERROR(DT_ERR_STATE,
                                 "parameter \"%s\" received its gradient twice in one synchronised "
                                 "pass: call dt_ddp_finish_backward after every dt_backward",
                                 name));
    return;
  }
  pa->ready_this_pass = true;
  if (d->cfg.zero_stage == 2) {
    dt_status st = dt_zero_take_gradient(d, pa);
    if (st != DT_OK)
      dt_ddp_record_error(d, st);
  }
  count_down_buckets(d, pa, now);
  launch_ready_buckets(d);
}

static dt_status pre_forward(dt_module *m, dt_tensor *input, dt_tensor **replacement, void *user) {
  (void)input;
  (void)replacement;
  dt_ddp *d = user;
  if (d->in_pass)
    return DT_ERROR(DT_ERR_STATE,
                    "DDP: a forward started before the last synchronised backward was finished: "
                    "call dt_ddp_finish_backward after dt_backward (before the optimizer step)");
  if (d->cfg.broadcast_buffers && dt_module_is_training(m))
    return dt_ddp_broadcast_buffers(d);
  return DT_OK;
}

dt_status dt_ddp_broadcast_buffers(dt_ddp *d) {
  int n = dt_module_num_buffers(d->model);
  if (n == 0 || dt_comm_size(d->comm) == 1)
    return DT_OK;
  dt_work **works = calloc((size_t)n, sizeof *works);
  if (works == NULL)
    return DT_ERROR(DT_ERR_OOM, "broadcasting %d buffers: out of host memory", n);
  dt_status st = DT_OK;
  int launched = 0;
  for (; launched < n && st == DT_OK; launched++)
    st = dt_comm_broadcast(d->comm, dt_module_buffer_at(d->model, launched, NULL), 0, NULL,
                           &works[launched]);
  for (int i = 0; i < launched; i++) {
    if (works[i] == NULL)
      continue;
    dt_status wst = dt_work_wait(works[i], 0);
    if (st == DT_OK)
      st = wst;
    dt_work_release(works[i]);
  }
  free(works);
  return st == DT_OK ? DT_OK : dt_error_wrap(st, "DDP: broadcasting buffers from rank 0");
}

static void reset_pass(dt_ddp *d) {
  for (int b = 0; b < d->n_buckets; b++) {
    d->buckets[b].pending = d->buckets[b].n_params;
    d->buckets[b].ready = 0;
  }
  for (int i = 0; i < d->n_params; i++)
    d->params[i].ready_this_pass = false;
  for (int u = 0; u < d->n_units; u++)
    d->units[u].ready = false;
  d->next_launch = 0;
  d->in_pass = 0;
  d->error = DT_OK;
}

static size_t param_bytes(const dt_ddp *d, int i) {
  return (size_t)dt_tensor_numel(dt_param_arena_param(d->arena, i, NULL)) * sizeof(float);
}

static size_t bucket_cap(const dt_ddp *d, int b) {
  return b == 0 ? d->cfg.first_bucket_bytes : d->cfg.bucket_bytes;
}

/* The last parameter (in registration order) of the last bucket when no
 * parameter is split: that bucket's gradients, 0 .. this one, are the
 * ones backward completes last, whose all-reduce would only start when it
 * ends. */
static int last_bucket_last_param(const dt_ddp *d) {
  int i = d->n_params - 1, last = i;
  for (int b = 0; i >= 0; b++) {
    size_t bytes = 0;
    last = i;
    while (i >= 0 && (bytes == 0 || bytes < bucket_cap(d, b)))
      bytes += param_bytes(d, i--);
  }
  return last;
}

/* Rows per part of a parameter of the last bucket (cfg.split_bytes), 0 =
 * not split: about split_bytes of whole rows, at most 8 parts, a multiple
 * of 16 rows (as the CPU GEMM's shares of a product: the same blocking of
 * every element). */
static int64_t split_part_rows(const dt_ddp *d, dt_tensor *p) {
  size_t bytes = (size_t)dt_tensor_numel(p) * sizeof(float);
  if (d->cfg.split_bytes == 0 || bytes <= d->cfg.split_bytes || dt_tensor_ndim(p) < 1)
    return 0;
  int64_t rows = dt_tensor_dim(p, 0), row_bytes = (int64_t)(bytes / (size_t)rows);
  int64_t r = ((int64_t)d->cfg.split_bytes + row_bytes - 1) / row_bytes;
  r = r > (rows + 7) / 8 ? r : (rows + 7) / 8;
  r = (r + 15) / 16 * 16;
  return r < rows ? r : 0;
}

/* Stage 0's buckets: units (whole parameters, or the parts of a split
 * one from its last rows to its first) in reverse registration order; a
 * bucket closes once it holds its cap, or after a part. */
static dt_status build_buckets(dt_ddp *d) {
  int n = d->n_params, split_to = last_bucket_last_param(d);
  for (int i = 0; i < n; i++) {
    dt_tensor *p = dt_param_arena_param(d->arena, i, NULL);
    ddp_param *pa = &d->params[i];
    pa->part_rows = i <= split_to ? split_part_rows(d, p) : 0;
    pa->n_units =
        pa->part_rows > 0 ? (int)((dt_tensor_dim(p, 0) + pa->part_rows - 1) / pa->part_rows) : 1;
    d->n_units += pa->n_units;
  }
  d->units = calloc((size_t)d->n_units, sizeof *d->units);
  d->buckets = calloc((size_t)d->n_units, sizeof *d->buckets); /* at most one per unit */
  d->timings = calloc((size_t)d->n_units, sizeof *d->timings);
  if (d->units == NULL || d->buckets == NULL || d->timings == NULL)
    return DT_ERROR(DT_ERR_OOM, "DDP: out of host memory for %d buckets", d->n_units);
  dt_tensor *grads = dt_param_arena_grads(d->arena);
  d->dev = dt_tensor_device(grads);
  DT_CHECK(dt_backend_get(d->dev, &d->ops));
  d->compute = d->ops->stream(d->dev, DT_STREAM_COMPUTE);
  int u = d->n_units, b = -1;
  size_t bytes = 0;
  int64_t hi = 0; /* the open bucket's end in the flat space */
  for (int i = n - 1; i >= 0; i--) {
    dt_tensor *p = dt_param_arena_param(d->arena, i, NULL);
    ddp_param *pa = &d->params[i];
    int64_t rows = dt_tensor_ndim(p) >= 1 ? dt_tensor_dim(p, 0) : 1;
    int64_t row_numel = rows > 0 ? dt_tensor_numel(p) / rows : 0;
    int64_t step = pa->part_rows > 0 ? pa->part_rows : (rows > 0 ? rows : 1);
    pa->unit0 = u - pa->n_units;
    int k = pa->unit0;
    for (int64_t r0 = rows > 0 ? (rows - 1) / step * step : 0; r0 >= 0; r0 -= step, k++) {
      ddp_unit *un = &d->units[k];
      un->row0 = r0;
      un->rows = rows - r0 < step ? rows - r0 : step;
      int64_t off = dt_param_arena_offset(d->arena, i) + r0 * row_numel;
      if (b < 0 || d->buckets[b].numel >= 0) { /* open the next bucket */
        b = d->n_buckets++;
        d->buckets[b].last = i;
        d->buckets[b].numel = -1;
        bytes = 0;
        hi = off + un->rows * row_numel;
      }
      ddp_bucket *bk = &d->buckets[b];
      un->bucket = b;
      bk->first = i;
      bk->offset = off;
      bk->n_params++;
      if (k == pa->unit0)
        pa->bucket = b;
      pa->bucket_end = b;
      bytes += (size_t)(un->rows * row_numel) * sizeof(float);
      if (bytes >= bucket_cap(d, b) || pa->part_rows > 0 || (i == 0 && r0 == 0))
        bk->numel = hi - bk->offset; /* closed */
    }
    u = pa->unit0;
  }
  for (b = 0; b < d->n_buckets; b++) {
    ddp_bucket *bk = &d->buckets[b];
    d->timings[b].bytes = (size_t)bk->numel * sizeof(float);
    DT_CHECK(dt_tensor_view_flat(grads, bk->offset, &bk->numel, 1, &bk->view));
    DT_CHECK(d->ops->event_create(d->dev, &bk->ready_ev));
  }
  return DT_OK;
}

/* cfg.shared_grads: the gradient arena moved into memory the ranks share,
 * when the communicator has some (the same decision on every rank: the
 * configuration, the device and the communicator are). */
static dt_status share_gradients(dt_ddp *d) {
  dt_tensor *grads = dt_param_arena_padded_grads(d->arena);
  if (!d->cfg.shared_grads || d->cfg.zero_stage != 0 || d->cfg.grad_compress != DT_DTYPE_F32 ||
      d->world == 1 || grads == NULL || dt_tensor_device(grads).type != DT_DEVICE_CPU)
    return DT_OK;
  dt_tensor *shared = NULL;
  DT_CHECK(dt_comm_shared_buffer(d->comm, dt_tensor_numel(grads), DT_DTYPE_F32, &shared));
  if (shared == NULL)
    return DT_OK;
  dt_status st = dt_param_arena_move_grads(d->arena, shared);
  dt_tensor_release(shared);
  d->grads_shared = st == DT_OK;
  return st;
}

int dt_ddp_grads_shared(const dt_ddp *d) { return d != NULL && d->grads_shared; }

static dt_status install_hooks(dt_ddp *d) {
  for (int i = 0; i < d->n_params; i++) {
    ddp_param *pa = &d->params[i];
    dt_tensor *p = dt_param_arena_param(d->arena, i, NULL);
    DT_CHECK(dt_tensor_add_grad_ready_hook(p, on_grad_ready, pa, &pa->hook));
    /* Stage 0: every parameter may be reported early, a split one by parts */
    if (d->units != NULL && dt_tensor_ndim(p) >= 1) {
      DT_CHECK(dt_tensor_set_grad_rows_hook(
          p, pa->part_rows > 0 ? pa->part_rows : dt_tensor_dim(p, 0), on_grad_rows, pa));
      pa->rows_hook = true;
    }
    if (d->cfg.zero_stage == 2 && pa->bucket == pa->bucket_end) {
      DT_CHECK(dt_tensor_set_grad_dest_hook(p, dt_zero_grad_dest, pa));
      pa->dest_hook = true;
    }
  }
  return dt_module_register_forward_pre_hook(d->model, pre_forward, d, &d->pre_hook);
}

dt_status dt_ddp_create(dt_module *model, dt_param_arena *arena, dt_comm *comm,
                        const dt_ddp_config *cfg, dt_ddp **out) {
  if (model == NULL || arena == NULL || comm == NULL || out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "DDP: model, arena, comm and out must not be NULL");
  *out = NULL;
  dt_ddp_config c = cfg ? *cfg : DT_DDP_CONFIG_DEFAULT;
  if (c.zero_stage < 0 || c.zero_stage > 2)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "DDP: zero_stage %d: expected 0 (all-reduce), 1 (shard the optimizer state) "
                    "or 2 (also the gradients)",
                    c.zero_stage);
  if (c.grad_compress != DT_DTYPE_F32 && c.grad_compress != DT_DTYPE_F16 &&
      c.grad_compress != DT_DTYPE_BF16)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "DDP: grad_compress %s: expected f32 (none), f16 or bf16 "
                    "(--grad-compress " DT_DDP_GRAD_COMPRESS_CHOICES ")",
                    dt_dtype_name(c.grad_compress));
  if (c.first_bucket_bytes == 0 || c.bucket_bytes == 0)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "DDP: bucket caps must be > 0 bytes (got first %zu, then %zu; defaults 128 KiB "
                    "and 25 MiB)",
                    c.first_bucket_bytes, c.bucket_bytes);
  if (dt_param_arena_count(arena) != dt_module_num_parameters(model))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "DDP: the arena holds %d parameters but the model has %d: create the arena "
                    "from this model",
                    dt_param_arena_count(arena), dt_module_num_parameters(model));
  dt_ddp *d = calloc(1, sizeof *d);
  if (d == NULL)
    return DT_ERROR(DT_ERR_OOM, "DDP: out of host memory");
  d->model = model;
  d->arena = arena;
  d->comm = comm;
  d->cfg = c;
  d->rank = dt_comm_rank(comm);
  d->world = dt_comm_size(comm);
  d->n_params = dt_param_arena_count(arena);
  int n = d->n_params;
  d->params = calloc((size_t)n, sizeof *d->params);
  dt_status st = DT_OK;
  if (!d->params) {
    st = DT_ERROR(DT_ERR_OOM, "DDP: out of host memory for %d parameters", n);
    goto destroy_ddp;
  }
  for (int i = 0; i < n; i++) {
    d->params[i].d = d;
    d->params[i].index = i;
  }
  if (c.check_parameters)
    DT_CHECK_GOTO(dt_ddp_verify_parameters(comm, model, arena), st, destroy_ddp);
  if (dt_comm_size(comm) > 1) {
    DT_CHECK_GOTO(dt_comm_broadcast_sync(comm, dt_param_arena_data(arena), 0), st, destroy_ddp);
    DT_CHECK_GOTO(dt_ddp_broadcast_buffers(d), st, destroy_ddp);
  }
  DT_CHECK_GOTO(share_gradients(d), st, destroy_ddp);
  DT_CHECK_GOTO(d->cfg.zero_stage > 0 ? dt_zero_build_buckets(d) : build_buckets(d), st,
                destroy_ddp);
  DT_CHECK_GOTO(install_hooks(d), st, destroy_ddp);
  for (int b = 0; b < d->n_buckets; b++) /* what goes on the wire */
    d->timings[b].bytes = d->timings[b].bytes / sizeof(float) * dt_dtype_size(c.grad_compress);
  reset_pass(d);
  *out = d;
  return DT_OK;

destroy_ddp:
  st = dt_error_wrap(st, "creating the DDP reducer on rank %d of %d", dt_comm_rank(comm),
                     dt_comm_size(comm));
  dt_ddp_destroy(d);
  return st;
}

/* Makes the compute stream wait for every launched bucket (on_host: the
 * host waits instead, for destruction). Device communicators return at
 * once: the optimizer's kernels queue behind the all-reduces. */
dt_status dt_ddp_finish_bucket(dt_ddp *d, int b, int on_host) {
  ddp_bucket *bk = &d->buckets[b];
  dt_status st = on_host ? dt_work_wait(bk->work, 0) : dt_work_wait_stream(bk->work, d->compute);
  /* Compressed: the 16-bit result back into the f32 gradients, on the
   * compute stream behind the wait. */
  if (st == DT_OK && bk->comp_in != NULL)
    st = d->cfg.zero_stage > 0 ? dt_tensor_copy_(bk->rs_out, bk->comp_out)
                               : dt_tensor_copy_(bk->view, bk->comp_in);
  release_compressed(bk);
  dt_work_times(bk->work, NULL, &d->timings[b].start_s, &d->timings[b].end_s);
  d->timings[b].dev_start_ms = d->timings[b].dev_end_ms = -1;
  /* Stage 2's work holds the bucket's buffer: freed now, so no device times. */
  if (d->cfg.zero_stage == 2) {
    dt_work_release(bk->work);
    dt_tensor_release(bk->rs_in);
    bk->rs_in = NULL;
  } else {
    bk->last_work = bk->work;
  }
  bk->work = NULL;
  return st;
}

/* Bucket b is reduced: `opt` updates its range (the step begun in
 * dt_ddp_finish_backward_update), timed into d->update_s. */
static dt_status update_bucket(dt_ddp *d, int b, dt_optimizer *opt) {
  double t0 = dt_comm_now(), span = dt_trace_begin(DT_TRACE_LANE_STEP, "bucket update");
  dt_status st = dt_optim_step_range(opt, d->buckets[b].offset, d->buckets[b].numel);
  dt_trace_end(DT_TRACE_LANE_STEP, "bucket update", span);
  d->update_s += dt_comm_now() - t0;
  return st;
}

/* Waits for every launched bucket in order; with `opt` (a step begun),
 * updates each as soon as it is reduced, while the later ones are still in
 * flight, and none after a failure. */
static dt_status wait_buckets(dt_ddp *d, int on_host, dt_optimizer *opt) {
  dt_status st = DT_OK;
  char msg[1024] = "";
  for (int b = 0; b < d->n_buckets; b++) {
    if (d->buckets[b].work == NULL)
      continue;
    dt_status wst = dt_ddp_finish_bucket(d, b, on_host);
    if (wst == DT_OK && st == DT_OK && opt != NULL)
      wst = update_bucket(d, b, opt);
    if (wst != DT_OK && st == DT_OK) {
      st = wst;
      snprintf(msg, sizeof msg, "%s", dt_last_error());
    }
  }
  if (st != DT_OK)
    return DT_ERROR(st, "%s", msg);
  return DT_OK;
}

void dt_ddp_destroy(dt_ddp *d) {
  if (d == NULL)
    return;
  if (d->buckets)
    wait_buckets(d, 1, NULL);
  if (d->pre_hook)
    dt_module_remove_hook(d->model, d->pre_hook);
  for (int i = 0; d->params && i < d->n_params; i++) {
    if (d->params[i].hook)
      dt_tensor_remove_grad_ready_hook(dt_param_arena_param(d->arena, i, NULL), d->params[i].hook);
    if (d->params[i].rows_hook)
      dt_tensor_clear_grad_rows_hook(dt_param_arena_param(d->arena, i, NULL));
    if (d->params[i].dest_hook)
      dt_tensor_clear_grad_dest_hook(dt_param_arena_param(d->arena, i, NULL));
  }
  dt_zero_destroy(d);
  for (int b = 0; d->buckets && b < d->n_buckets; b++) {
    dt_work_release(d->buckets[b].last_work);
    if (d->buckets[b].ready_ev)
      d->ops->event_destroy(d->buckets[b].ready_ev);
    dt_tensor_release(d->buckets[b].view);
    release_compressed(&d->buckets[b]);
  }
  free(d->buckets);
  free(d->timings);
  free(d->units);
  free(d->params);
  free(d);
}

/* Handles parameters without a gradient in this pass: zero-fills (when
 * allowed and unused since the last step) or lists them in *names. Either
 * way they count as ready, so every bucket launches and the collectives
 * still match across ranks. Returns how many there were. */
static int settle_unused(dt_ddp *d, char *names, size_t cap, dt_status *st) {
  int missing = 0;
  size_t len = 0;
  names[0] = '\0';
  for (int i = 0; i < d->n_params; i++) {
    ddp_param *pa = &d->params[i];
    if (pa->ready_this_pass)
      continue;
    const char *name = NULL;
    dt_tensor *p = dt_param_arena_param(d->arena, i, &name);
    /* Stage 2 takes what accumulated in no_sync passes (its buffers start
     * at zero); the others zero-fill a gradient unused since the last step. */
    if (d->cfg.zero_stage == 2 && *st == DT_OK)
      *st = dt_zero_take_gradient(d, pa);
    else if (d->cfg.allow_unused && !pa->used_since_sync && *st == DT_OK)
      *st = dt_tensor_fill_(dt_tensor_grad(p), 0.0f);
    if (missing < 12 && len + strlen(name) + 3 < cap)
      len += (size_t)snprintf(names + len, cap - len, "%s%s", missing ? ", " : "", name);
    missing++;
    pa->ready_this_pass = true;
    count_down_buckets(d, pa, dt_comm_now());
  }
  if (missing > 12)
    snprintf(names + len, cap - len, ", ... (%d in all)", missing);
  return missing;
}

/* dt_ddp_finish_backward; with `opt`, the update per bucket (below). */
static dt_status finish_backward(dt_ddp *d, dt_optimizer *opt) {
  d->backward_end_s = dt_comm_now();
  d->update_s = 0.0;
  if (d->no_sync)
    return DT_OK;
  if (!d->in_pass)
    d->first_grad_s = d->last_grad_s = d->backward_end_s;
  char names[768];
  dt_status fill = DT_OK;
  int missing = settle_unused(d, names, sizeof names, &fill);
  launch_ready_buckets(d);
  /* Update only a pass that will succeed as far as we know now: no hook
   * error, every gradient there (or zero-filled). */
  dt_status begun = DT_ERR_STATE;
  if (opt != NULL && d->error == DT_OK && fill == DT_OK && (missing == 0 || d->cfg.allow_unused))
    begun = dt_optim_step_begin(opt);
  dt_status st = wait_buckets(d, 0, begun == DT_OK ? opt : NULL);
  if (begun == DT_OK && st != DT_OK)
    dt_optim_step_end(opt, st); /* abandoned: the step count stays */
  dt_zero_end_pass(d);
  d->dev_backward_end_ms = -1;
  dt_status hook_error = d->error;
  char hook_msg[1024];
  snprintf(hook_msg, sizeof hook_msg, "%s", d->error_msg);
  int in_pass = d->in_pass;
  reset_pass(d);
  for (int i = 0; i < d->n_params; i++)
    d->params[i].used_since_sync = false;
  d->sync_count++;
  d->finish_end_s = dt_comm_now();
  if (hook_error != DT_OK)
    return DT_ERROR(hook_error, "%s", hook_msg);
  if (d->cfg.zero_stage > 0 && d->opt == NULL)
    return DT_ERROR(DT_ERR_STATE,
                    "DDP with ZeRO stage %d reduced each rank's shard of the gradients only: "
                    "give the reducer the optimizer (dt_ddp_shard_optimizer) before training",
                    d->cfg.zero_stage);
  if (st != DT_OK)
    return dt_error_wrap(st, "DDP: reducing gradients");
  if (fill != DT_OK)
    return dt_error_wrap(fill, "DDP: zero-filling unused gradients");
  if (missing > 0 && !d->cfg.allow_unused)
    return DT_ERROR(DT_ERR_STATE,
                    "DDP: parameters that received no gradient%s: %s: every rank must reduce "
                    "every parameter; use them in the forward, or set "
                    "dt_ddp_config.allow_unused (zero-fill)",
                    in_pass ? " in this backward" : " (no backward ran since the last step)",
                    names);
  if (opt != NULL && begun != DT_OK)
    return dt_error_wrap(begun, "DDP: the update per bucket");
  return DT_OK;
}

dt_status dt_ddp_finish_backward(dt_ddp *d) { return finish_backward(d, NULL); }

dt_status dt_ddp_finish_backward_update(dt_ddp *d, dt_optimizer *opt) {
  if (opt == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "DDP: the update per bucket needs an optimizer");
  if (d->cfg.zero_stage > 0 || dt_optim_step_begun(opt)) {
    dt_status st = finish_backward(d, NULL); /* the peers wait for this rank's buckets */
    if (st != DT_OK)
      return st;
    return DT_ERROR(DT_ERR_STATE,
                    d->cfg.zero_stage > 0
                        ? "DDP: no update per bucket with ZeRO (stage %d): its optimizer steps "
                          "its shard (dt_optim_step)"
                        : "DDP: a synchronised backward while the last one's update per bucket "
                          "is not ended (stage %d): call dt_optim_step_end (dt_step_update) "
                          "after each",
                    d->cfg.zero_stage);
  }
  return finish_backward(d, opt);
}

dt_status dt_ddp_no_sync_begin(dt_ddp *d) {
  if (d->no_sync)
    return DT_ERROR(DT_ERR_STATE, "DDP: no_sync scopes do not nest");
  if (d->in_pass)
    return DT_ERROR(DT_ERR_STATE,
                    "DDP: no_sync begun during a synchronised backward: call "
                    "dt_ddp_finish_backward first");
  d->no_sync = 1;
  return DT_OK;
}

dt_status dt_ddp_no_sync_end(dt_ddp *d) {
  if (!d->no_sync)
    return DT_ERROR(DT_ERR_STATE, "DDP: no_sync_end without no_sync_begin");
  d->no_sync = 0;
  return DT_OK;
}

int dt_ddp_in_no_sync(const dt_ddp *d) { return d->no_sync; }

static dt_status sync_no_sync_begin(void *d) { return dt_ddp_no_sync_begin(d); }
static dt_status sync_no_sync_end(void *d) { return dt_ddp_no_sync_end(d); }
static dt_status sync_finish_backward(void *d) { return dt_ddp_finish_backward(d); }
static dt_status sync_finish_backward_update(void *d, dt_optimizer *opt) {
  return dt_ddp_finish_backward_update(d, opt);
}

dt_grad_sync dt_ddp_grad_sync(dt_ddp *d) {
  if (d == NULL)
    return DT_GRAD_SYNC_NONE;
  bool per_bucket = d->cfg.update_per_bucket && d->cfg.zero_stage == 0;
  return (dt_grad_sync){d,
                        sync_no_sync_begin,
                        sync_no_sync_end,
                        sync_finish_backward,
                        dt_ddp_sum_over_ranks,
                        per_bucket ? sync_finish_backward_update : NULL};
}
int dt_ddp_num_buckets(const dt_ddp *d) { return d->n_buckets; }

size_t dt_ddp_comm_bytes_per_pass(const dt_ddp *d) {
  size_t bytes = 0;
  for (int b = 0; b < d->n_buckets; b++)
    bytes += d->timings[b].bytes;
  return bytes;
}
long dt_ddp_sync_count(const dt_ddp *d) { return d->sync_count; }

void dt_ddp_bucket_info(const dt_ddp *d, int b, int64_t *offset, int64_t *numel, int *first_param,
                        int *last_param) {
  const ddp_bucket *bk = &d->buckets[b];
  if (offset)
    *offset = bk->offset;
  if (numel)
    *numel = bk->numel;
  if (first_param)
    *first_param = bk->first;
  if (last_param)
    *last_param = bk->last;
}

dt_status dt_ddp_read_device_timeline(dt_ddp *d) {
  d->dev_backward_end_ms = -1;
  if (d->cfg.zero_stage == 2)
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "DDP device timeline: ZeRO stage 2 frees each bucket's collective (and its "
                    "buffer) during the pass, so no device times are kept");
  for (int b = 0; b < d->n_buckets; b++) {
    dt_work *w = d->buckets[b].last_work;
    if (w == NULL)
      return DT_ERROR(DT_ERR_STATE,
                      "DDP device timeline: bucket %d was not reduced in the "
                      "last synchronised pass",
                      b);
    double waited = -1;
    DT_CHECK(
        dt_work_device_times(w, &d->timings[b].dev_start_ms, &d->timings[b].dev_end_ms, &waited));
    if (waited >= 0 && (d->dev_backward_end_ms < 0 || waited < d->dev_backward_end_ms))
      d->dev_backward_end_ms = waited;
  }
  return DT_OK;
}

void dt_ddp_get_timeline(const dt_ddp *d, dt_ddp_timeline *out) {
  out->dev_backward_end_ms = d->dev_backward_end_ms;
  out->first_grad_s = d->first_grad_s;
  out->last_grad_s = d->last_grad_s;
  out->backward_end_s = d->backward_end_s;
  out->finish_end_s = d->finish_end_s;
  out->update_s = d->update_s;
  out->n_buckets = d->n_buckets;
  out->buckets = d->timings;
}

dt_ddp_comm_times dt_ddp_last_comm_times(const dt_ddp *d) {
  dt_ddp_timeline tl;
  dt_ddp_get_timeline(d, &tl);
  return dt_ddp_timeline_comm_times(&tl);
}

dt_ddp_comm_times dt_ddp_timeline_comm_times(const dt_ddp_timeline *tl) {
  dt_ddp_comm_times t = {0.0, 0.0, 0.0};
  for (int b = 0; b < tl->n_buckets; b++) {
    const dt_ddp_bucket_timing *bt = &tl->buckets[b];
    if (bt->end_s <= 0 || bt->start_s <= 0)
      continue;
    t.allreduce_s += bt->end_s - bt->start_s;
    double hidden_end = bt->end_s < tl->backward_end_s ? bt->end_s : tl->backward_end_s;
    if (hidden_end > bt->start_s)
      t.hidden_s += hidden_end - bt->start_s;
  }
  t.update_s = tl->update_s;
  t.exposed_s = tl->finish_end_s - tl->backward_end_s - tl->update_s;
  return t;
}
