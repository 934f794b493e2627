/* ZeRO stage 2's forward + backward peak for the plan (train/plan.h).
 *
 * Stage 2 writes each gradient into a bucket buffer that exists only
 * while the bucket fills and is reduced (dist/zero.c), so its peak is not
 * the activations' plus a fixed amount: it depends on which activations
 * are still alive when the buffers are. A model with most of its
 * parameters at its end (ResNet's last stage) fills its big buckets at the
 * start of the backward, beside nearly all the activations; one with them
 * at its start (GPT-2's embedding) fills them at the end, when the
 * activations are gone.
 *
 * So the probe traces one step at each of its two micro-batches on the
 * plain replica: every parameter's first gradient write (a grad-
 * destination hook that hands out the arena's own slice, so nothing else
 * changes) and its grad-ready hook, with the allocator's peak between
 * consecutive events. Replaying the trace through stage 2's buffer policy
 * (dt_zero_layout: a buffer from its bucket's first write, a cut
 * parameter's gradient whole from its first write to its hook, the oldest
 * launched buffer freed while they would exceed DT_ZERO_BUFFERS_IN_FLIGHT
 * of the largest, none freed earlier: the bound, as when reduce-scatters
 * finish late) gives, for every interval, the activations then alive and
 * the gradient memory beside them. Each interval is a line in the units of
 * the micro-batch (from the two sizes); the plan takes the highest at its
 * micro-batch, among the few kept (those highest at micro-batch 1, 2, 4,
 * ...). With accumulation the passes before the synchronised one keep
 * every gradient whole, and that pass copies each into its buckets at its
 * hook: a second set of lines from the same trace. The layout is that of
 * 2 ranks: more ranks move bucket boundaries by fewer elements than there
 * are ranks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/autograd.h"
#include "core/memory.h"
#include "dist/ddp.h"
#include "train/plan_internal.h"

typedef struct z2_event {
  int param;
  bool ready;  /* the grad-ready hook; else the first write */
  double peak; /* allocated: the peak of the interval this event ends */
  double now;  /* and at the event */
} z2_event;

typedef struct z2_trace {
  dt_param_arena *arena;
  z2_event *ev;
  int n, cap;
  dt_status err;
} z2_trace;

typedef struct z2_param {
  z2_trace *t;
  int index;
} z2_param;

static void record(z2_trace *t, int param, bool ready) {
  dt_memory_stats ms;
  if (t->err != DT_OK || t->n == t->cap)
    return;
  t->err = dt_memory_stats_get(DT_CPU, &ms);
  if (t->err == DT_OK)
    t->err = dt_memory_reset_peak(DT_CPU);
  t->ev[t->n++] = (z2_event){param, ready, (double)ms.peak_allocated, (double)ms.allocated};
}

/* The gradient goes where it went without the hook: the arena's slice. */
static dt_status first_write(dt_tensor *leaf, void *user, dt_tensor **grad) {
  z2_param *zp = user;
  record(zp->t, zp->index, false);
  int64_t shape[DT_MAX_DIMS];
  int nd = dt_tensor_ndim(leaf);
  for (int k = 0; k < nd; k++)
    shape[k] = dt_tensor_dim(leaf, k);
  DT_CHECK(dt_tensor_view_flat(dt_param_arena_grads(zp->t->arena),
                               dt_param_arena_offset(zp->t->arena, zp->index), shape, nd, grad));
  return dt_tensor_fill_(*grad, 0.0f);
}

static void ready(dt_tensor *leaf, void *user) {
  (void)leaf;
  z2_param *zp = user;
  record(zp->t, zp->index, true);
}

/* One traced step at `batch`; *backward_peak: the peak of its last
 * interval (the phase hook's, at the backward's end). */
static dt_status trace_step(const dt_task *task, dt_replica *rep, int batch, int64_t ctx,
                            const double *backward_peak, z2_trace *t, double *resident) {
  dt_param_arena *arena = dt_replica_arena(rep);
  int np = dt_param_arena_count(arena);
  z2_param *zp = calloc((size_t)np, sizeof *zp);
  dt_hook_handle *h = calloc((size_t)np, sizeof *h);
  dt_status st = zp && h ? DT_OK : DT_ERROR(DT_ERR_OOM, "plan: no host memory for the trace");
  int hooked = 0;
  for (; st == DT_OK && hooked < np; hooked++) {
    dt_tensor *p = dt_param_arena_param(arena, hooked, NULL);
    zp[hooked] = (z2_param){t, hooked};
    st = dt_tensor_set_grad(p, NULL);
    if (st == DT_OK)
      st = dt_tensor_set_grad_dest_hook(p, first_write, &zp[hooked]);
    if (st == DT_OK && (st = dt_tensor_add_grad_ready_hook(p, ready, &zp[hooked], &h[hooked])))
      dt_tensor_clear_grad_dest_hook(p);
    if (st != DT_OK)
      break;
  }
  t->n = 0;
  t->err = DT_OK;
  dt_memory_stats ms;
  if (st == DT_OK && (st = dt_memory_stats_get(DT_CPU, &ms)) == DT_OK)
    *resident = (double)ms.allocated;
  if (st == DT_OK)
    st = dt_memory_reset_peak(DT_CPU);
  if (st == DT_OK)
    st = dt_plan_step(task, rep, batch, ctx);
  if (st == DT_OK)
    st = t->err;
  if (st == DT_OK && t->n < t->cap) /* the last interval: to the backward's end */
    t->ev[t->n++] = (z2_event){-1, false, *backward_peak, 0.0};
  for (int i = 0; i < hooked; i++) {
    dt_tensor *p = dt_param_arena_param(arena, i, NULL);
    dt_tensor_clear_grad_dest_hook(p);
    dt_tensor_remove_grad_ready_hook(p, h[i]);
  }
  free(h);
  free(zp);
  return st;
}

typedef struct z2_sim {
  const dt_zero_layout *L;
  char *live, *launched;
  int *pending; /* parameters of a bucket not yet ready */
  double buffers, split, cap;
} z2_sim;

static void alloc_bucket(z2_sim *s, int b) {
  if (s->live[b])
    return;
  double need = 4.0 * (double)s->L->padded[b];
  for (int o = 0; o < s->L->n_buckets && s->buffers + need > s->cap; o++)
    if (s->live[o] && s->launched[o]) {
      s->live[o] = 0;
      s->buffers -= 4.0 * (double)s->L->padded[o];
    }
  s->live[b] = 1;
  s->buffers += need;
}

/* Replays t: comm[k] the gradient memory beside interval k (k < t->n),
 * act[k] its peak above `resident`. An instant (a cut gradient copied
 * into its buckets) counts as an interval of its own: *n_out.
 * `accumulating`: the synchronised pass after others (no_sync), whose
 * gradients are all whole from the start, each copied into its buckets
 * and freed at its hook; and the intervals of the passes before it, with
 * every gradient whole and no buffers. */
static void simulate(const dt_zero_layout *L, const dt_param_arena *arena, const z2_trace *t,
                     double resident, bool accumulating, z2_sim *s, double *act, double *comm,
                     int *n_out) {
  memset(s->live, 0, (size_t)L->n_buckets);
  memset(s->launched, 0, (size_t)L->n_buckets);
  memset(s->pending, 0, (size_t)L->n_buckets * sizeof *s->pending);
  double all = 0.0;
  for (int i = 0; i < L->n_params; i++) {
    all += 4.0 * (double)dt_tensor_numel(dt_param_arena_param(arena, i, NULL));
    for (int b = L->first[i]; b <= L->last[i]; b++)
      s->pending[b]++;
  }
  s->buffers = 0.0;
  s->split = accumulating ? all : 0.0;
  int n = 0;
  for (int k = 0; k < t->n; k++) {
    const z2_event *e = &t->ev[k];
    act[n] = e->peak - resident, comm[n++] = s->buffers + s->split;
    if (accumulating)
      act[n] = e->peak - resident, comm[n++] = all;
    if (e->param < 0)
      continue;
    int i = e->param;
    double bytes = 4.0 * (double)dt_tensor_numel(dt_param_arena_param(arena, i, NULL));
    bool whole = accumulating || L->first[i] < L->last[i];
    if (!e->ready && whole && !accumulating)
      s->split += bytes;
    else if (!e->ready && !whole && L->first[i] <= L->last[i])
      alloc_bucket(s, L->first[i]);
    if (!e->ready)
      continue;
    for (int b = L->first[i]; b <= L->last[i]; b++)
      alloc_bucket(s, b);
    if (whole) { /* copied into its buckets, then freed */
      act[n] = e->now - resident, comm[n++] = s->buffers + s->split;
      s->split -= bytes;
    }
    for (int b = L->first[i]; b <= L->last[i]; b++)
      s->launched[b] = --s->pending[b] == 0;
  }
  *n_out = n;
}

/* The lines of act[0] (at `units`), act[1] (at twice that) and comm
 * highest at micro-batch 1, 2, 4, ...: lines[*count]. */
static void pick_lines(double *const act[2], const double *comm, int n, double units,
                       double units_per_sample, dt_plan_z2_line *lines, int *count) {
  *count = 0;
  for (int e = 0; e < DT_PLAN_Z2_LINES; e++) {
    double u = units_per_sample * (double)(1 << e), best = -INFINITY;
    dt_plan_z2_line line = {0};
    for (int k = 0; k < n; k++) {
      double per = fmax(0.0, (act[1][k] - act[0][k]) / units), fixed = act[0][k] - per * units;
      if (fixed + per * u + comm[k] > best) {
        best = fixed + per * u + comm[k];
        line = (dt_plan_z2_line){fixed, per, comm[k]};
      }
    }
    bool seen = false;
    for (int j = 0; j < *count; j++)
      seen = seen || memcmp(&lines[j], &line, sizeof line) == 0;
    if (!seen)
      lines[(*count)++] = line;
  }
}

dt_status dt_plan_probe_zero2(const dt_task *task, dt_replica *rep, int b1, int64_t ctx,
                              double units, const double *backward_peak,
                              dt_plan_probe_result *out) {
  dt_param_arena *arena = dt_replica_arena(rep);
  if (dt_param_arena_grads(arena) == NULL)
    return DT_ERROR(DT_ERR_STATE, "plan: the probe's replica has no gradient arena");
  dt_ddp_config dc = DT_DDP_CONFIG_DEFAULT;
  dt_zero_layout L;
  DT_CHECK(dt_zero_layout_get(arena, 2, dc.first_bucket_bytes, dc.bucket_bytes, &L));
  int np = L.n_params, cap = 2 * np + 1;
  z2_trace t[2] = {{arena, calloc((size_t)cap, sizeof(z2_event)), 0, cap, DT_OK},
                   {arena, calloc((size_t)cap, sizeof(z2_event)), 0, cap, DT_OK}};
  size_t most = 2 * (size_t)cap + (size_t)np; /* simulate's intervals and instants */
  double *act[2] = {calloc(most, sizeof(double)), calloc(most, sizeof(double))};
  double *comm = calloc(most, sizeof(double));
  z2_sim s = {&L,
              calloc((size_t)L.n_buckets, 1),
              calloc((size_t)L.n_buckets, 1),
              calloc((size_t)L.n_buckets, sizeof(int)),
              0.0,
              0.0,
              0.0};
  dt_status st = DT_OK;
  if (!t[0].ev || !t[1].ev || !act[0] || !act[1] || !comm || !s.live || !s.launched || !s.pending) {
    st = DT_ERROR(DT_ERR_OOM, "plan: no host memory for ZeRO 2's trace");
    goto done;
  }
  for (int b = 0; b < L.n_buckets; b++)
    s.cap = 4.0 * (double)L.padded[b] > s.cap ? 4.0 * (double)L.padded[b] : s.cap;
  s.cap *= DT_ZERO_BUFFERS_IN_FLIGHT;
  double resident[2];
  for (int k = 0; k < 2 && st == DT_OK; k++)
    st = trace_step(task, rep, (k + 1) * b1, ctx, backward_peak, &t[k], &resident[k]);
  if (st != DT_OK)
    goto done;
  bool same = t[0].n == t[1].n;
  for (int k = 0; same && k < t[0].n; k++)
    same = t[0].ev[k].param == t[1].ev[k].param && t[0].ev[k].ready == t[1].ev[k].ready;
  if (!same) {
    st = DT_ERROR(DT_ERR_STATE,
                  "plan: the probe's backward ran its parameters in a different "
                  "order at micro-batch %d and %d",
                  b1, 2 * b1);
    goto done;
  }
  for (int mode = 0; mode < 2; mode++) { /* one micro-batch a step, and accumulating */
    int n = 0;
    for (int k = 0; k < 2; k++)
      simulate(&L, arena, &t[k], resident[k], mode == 1, &s, act[k], comm, &n);
    pick_lines(act, comm, n, units, out->units_per_sample, out->z2[mode], &out->z2_lines[mode]);
  }
done:
  free(s.pending);
  free(s.launched);
  free(s.live);
  free(comm);
  free(act[1]);
  free(act[0]);
  free(t[1].ev);
  free(t[0].ev);
  dt_zero_layout_free(&L);
  return st;
}
