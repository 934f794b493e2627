/* The DDP reducer: buckets over the flat gradient buffer, launched from
 * grad-ready hooks in bucket order, averaged by the communicator (ZeRO:
 * reduce-scattered, zero.c). */
#include "dist/ddp.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Parameter pa is ready: its buckets have one parameter less to wait for. */
static void count_down_buckets(dt_ddp *d, const ddp_param *pa, double now) {
  for (int b = pa->bucket; b <= pa->bucket_end; b++) {
    if (--d->buckets[b].pending == 0) {
      d->buckets[b].ready = 1;
      d->timings[b].ready_s = now;
    }
  }
}

static void on_grad_ready(dt_tensor *leaf, void *user) {
  (void)leaf;
  ddp_param *pa = user;
  dt_ddp *d = pa->d;
  double now = dt_comm_now();
  pa->used_since_sync = true;
  if (d->no_sync)
    return;
  if (!d->in_pass) {
    d->in_pass = 1;
    d->first_grad_s = now;
  }
  d->last_grad_s = now;
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
  d->next_launch = 0;
  d->in_pass = 0;
  d->error = DT_OK;
}

static dt_status build_buckets(dt_ddp *d) {
  int n = d->n_params;
  d->buckets = calloc((size_t)n, sizeof *d->buckets); /* at most one per parameter */
  d->timings = calloc((size_t)n, sizeof *d->timings);
  if (d->buckets == NULL || d->timings == NULL)
    return DT_ERROR(DT_ERR_OOM, "DDP: out of host memory for %d buckets", n);
  dt_tensor *grads = dt_param_arena_grads(d->arena);
  d->dev = dt_tensor_device(grads);
  DT_CHECK(dt_backend_get(d->dev, &d->ops));
  d->compute = d->ops->stream(d->dev, DT_STREAM_COMPUTE);
  int i = n - 1;
  while (i >= 0) {
    int b = d->n_buckets;
    size_t cap = b == 0 ? d->cfg.first_bucket_bytes : d->cfg.bucket_bytes;
    ddp_bucket *bk = &d->buckets[b];
    bk->last = i;
    size_t bytes = 0;
    while (i >= 0 && (bytes == 0 || bytes < cap)) {
      bytes += (size_t)dt_tensor_numel(dt_param_arena_param(d->arena, i, NULL)) * sizeof(float);
      d->params[i].bucket = d->params[i].bucket_end = b;
      i--;
    }
    bk->first = i + 1;
    bk->n_params = bk->last - bk->first + 1;
    bk->offset = dt_param_arena_offset(d->arena, bk->first);
    bk->numel = dt_param_arena_offset(d->arena, bk->last) +
                dt_tensor_numel(dt_param_arena_param(d->arena, bk->last, NULL)) - bk->offset;
    d->timings[b].bytes = (size_t)bk->numel * sizeof(float);
    d->n_buckets++;
    DT_CHECK(dt_tensor_view_flat(grads, bk->offset, &bk->numel, 1, &bk->view));
    DT_CHECK(d->ops->event_create(d->dev, &bk->ready_ev));
  }
  return DT_OK;
}

static dt_status install_hooks(dt_ddp *d) {
  for (int i = 0; i < d->n_params; i++)
    DT_CHECK(dt_tensor_add_grad_ready_hook(dt_param_arena_param(d->arena, i, NULL), on_grad_ready,
                                           &d->params[i], &d->params[i].hook));
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
                    "DDP: bucket caps must be > 0 bytes (got first %zu, then %zu; defaults 1 MiB "
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

static dt_status wait_buckets(dt_ddp *d, int on_host) {
  dt_status st = DT_OK;
  char msg[1024] = "";
  for (int b = 0; b < d->n_buckets; b++) {
    if (d->buckets[b].work == NULL)
      continue;
    dt_status wst = dt_ddp_finish_bucket(d, b, on_host);
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
    wait_buckets(d, 1);
  if (d->pre_hook)
    dt_module_remove_hook(d->model, d->pre_hook);
  for (int i = 0; d->params && i < d->n_params; i++)
    if (d->params[i].hook)
      dt_tensor_remove_grad_ready_hook(dt_param_arena_param(d->arena, i, NULL), d->params[i].hook);
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

dt_status dt_ddp_finish_backward(dt_ddp *d) {
  d->backward_end_s = dt_comm_now();
  if (d->no_sync)
    return DT_OK;
  if (!d->in_pass)
    d->first_grad_s = d->last_grad_s = d->backward_end_s;
  char names[768];
  dt_status fill = DT_OK;
  int missing = settle_unused(d, names, sizeof names, &fill);
  launch_ready_buckets(d);
  dt_status st = wait_buckets(d, 0);
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
  return DT_OK;
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

dt_grad_sync dt_ddp_grad_sync(dt_ddp *d) {
  if (d == NULL)
    return DT_GRAD_SYNC_NONE;
  return (dt_grad_sync){d, sync_no_sync_begin, sync_no_sync_end, sync_finish_backward,
                        dt_ddp_sum_over_ranks};
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
  t.exposed_s = tl->finish_end_s - tl->backward_end_s;
  return t;
}
