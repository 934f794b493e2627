/* The memory and speed plan (train/plan.h; the assumptions: docs/plan.md). */
#include "train/plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/cpu.h"
#include "core/memory.h"
#include "core/rng.h"
#include "dist/replica.h"
#include "train/plan_internal.h"

dt_status dt_train_synthetic_batch(const dt_task *task, int batch, int64_t ctx, uint64_t seed,
                                   dt_device dev, dt_tensor **x, dt_tensor **y) {
  dt_status st = DT_OK;
  int64_t xshape[DT_TASK_MAX_DIMS + 1] = {batch};
  size_t n = (size_t)batch;
  for (int i = 0; i < task->input_ndim; i++) {
    xshape[i + 1] = i == 0 && ctx > 0 && task->sequence_targets ? ctx : task->input_shape[i];
    n *= (size_t)xshape[i + 1];
  }
  const int64_t yshape[2] = {batch, task->sequence_targets ? xshape[1] : 1};
  int yndim = task->sequence_targets ? 2 : 1;
  size_t ny = (size_t)yshape[0] * (size_t)yshape[1];
  bool ints = task->input_dtype == DT_DTYPE_I32 || task->input_dtype == DT_DTYPE_I64;
  if (task->input_dtype != DT_DTYPE_F32 && !(ints && task->input_range > 0))
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "bench: model %s takes %s inputs: synthetic batches are f32, or i32/i64 ids "
                    "with an input_range",
                    task->name, dt_dtype_name(task->input_dtype));
  void *xs = malloc(n * (task->input_dtype == DT_DTYPE_I64 ? sizeof(int64_t) : sizeof(float)));
  int32_t *ys = malloc(ny * sizeof *ys);
  if (!xs || !ys) {
    st = DT_ERROR(DT_ERR_OOM, "no host memory for a synthetic batch of %d", batch);
    goto done;
  }
  dt_generator gen;
  dt_generator_init(&gen, seed ^ 0x5eedULL);
  for (size_t i = 0; i < n; i++) {
    if (task->input_dtype == DT_DTYPE_F32)
      ((float *)xs)[i] = dt_generator_normal(&gen);
    else if (task->input_dtype == DT_DTYPE_I32)
      ((int32_t *)xs)[i] = (int32_t)dt_generator_below(&gen, (uint64_t)task->input_range);
    else
      ((int64_t *)xs)[i] = (int64_t)dt_generator_below(&gen, (uint64_t)task->input_range);
  }
  for (size_t i = 0; i < ny; i++)
    ys[i] = (int32_t)dt_generator_below(&gen, (uint64_t)task->num_classes);
  DT_CHECK_GOTO(dt_tensor_from_host(xs, xshape, task->input_ndim + 1, task->input_dtype, dev, x),
                st, done);
  DT_CHECK_GOTO(dt_tensor_from_host(ys, yshape, yndim, DT_DTYPE_I32, dev, y), st, done);
done:
  free(ys);
  free(xs);
  return st;
}

dt_optimizer_spec dt_train_bench_optimizer(const dt_task *task, bool adamw) {
  dt_adamw_config d = DT_ADAMW_CONFIG_DEFAULT;
  const dt_task_defaults *td = task->defaults;
  if (adamw && td && td->optimizer == DT_TASK_OPTIMIZER_ADAMW)
    return (dt_optimizer_spec){
        DT_TRAIN_ADAMW, td->lr, 0.0f, td->weight_decay, false, td->beta2, td->decay_matrices_only};
  if (adamw)
    return (dt_optimizer_spec){DT_TRAIN_ADAMW, d.lr, 0.0f, d.weight_decay, false, d.beta2, false};
  return (dt_optimizer_spec){DT_TRAIN_SGD, 0.01f, 0.9f, 0.0f, false, d.beta2, false};
}

/* ---- devices ---- */

#define TFLOPS 1e12
#define GBPS 1e9

/* Data-sheet figures (docs/plan.md cites them): SXM parts, memory as
 * cudaMemGetInfo reports it, NVLink's bandwidth per direction, one
 * InfiniBand NIC per GPU (A100: HDR 200 Gb/s, H100/H200: NDR 400 Gb/s). */
static const dt_plan_device gpu_devices[] = {
    {"a100", false, 81920.0 * DT_MIB, 19.5 * TFLOPS, 156.0 * TFLOPS, 312.0 * TFLOPS, 2039.0 * GBPS,
     300.0 * GBPS, 25.0 * GBPS, 8e-6, 0.7, 0.8, 32.0 * DT_MIB, 0.05, "A100 SXM4 80GB data sheet"},
    {"h100", false, 81559.0 * DT_MIB, 66.9 * TFLOPS, 494.7 * TFLOPS, 989.4 * TFLOPS, 3350.0 * GBPS,
     450.0 * GBPS, 50.0 * GBPS, 8e-6, 0.7, 0.8, 32.0 * DT_MIB, 0.05, "H100 SXM5 80GB data sheet"},
    {"h200", false, 143771.0 * DT_MIB, 66.9 * TFLOPS, 494.7 * TFLOPS, 989.4 * TFLOPS, 4800.0 * GBPS,
     450.0 * GBPS, 50.0 * GBPS, 8e-6, 0.7, 0.8, 32.0 * DT_MIB, 0.05, "H200 SXM 141GB data sheet"},
};
#define NUM_GPU_DEVICES ((int)(sizeof gpu_devices / sizeof gpu_devices[0]))

static double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Bytes/s (read + write) of memcpy between two buffers of `n` bytes, the
 * best of a few passes of at least 64 MiB each: a small n stays in the
 * caches and measures them. */
static dt_status measure_copy_bandwidth(size_t n, double *out) {
  n = n < 4096 ? 4096 : n;
  char *a = malloc(n), *b = malloc(n);
  if (!a || !b) {
    free(a);
    free(b);
    return DT_ERROR(DT_ERR_OOM, "no host memory for the bandwidth probe (2 x %zu bytes)", n);
  }
  memset(a, 1, n);
  memset(b, 2, n);
  size_t reps = (64 * DT_MIB + n - 1) / n;
  double best = 0.0;
  for (int r = 0; r < 5; r++) {
    double t0 = seconds_now();
    for (size_t i = 0; i < reps; i++)
      memcpy(i % 2 ? a : b, i % 2 ? b : a, n);
    double t = seconds_now() - t0;
    if (t > 0 && 2.0 * (double)(n * reps) / t > best)
      best = 2.0 * (double)(n * reps) / t;
  }
  free(a);
  free(b);
  *out = best > 0 ? best : 1e9;
  return DT_OK;
}

dt_status dt_plan_device_get(dt_plan_device_kind kind, dt_mfu_cache *roof, dt_plan_device *out) {
  memset(out, 0, sizeof *out);
  if (kind > DT_PLAN_DEVICE_CPU && kind <= NUM_GPU_DEVICES) {
    *out = gpu_devices[kind - 1];
    return DT_OK;
  }
  if (kind != DT_PLAN_DEVICE_CPU)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`device` %d: expected cpu, a100, h100 or h200", (int)kind);
  snprintf(out->name, sizeof out->name, "cpu");
  out->cpu = true;
  dt_memory_stats ms;
  DT_CHECK(dt_memory_stats_get(DT_CPU, &ms));
  out->memory = (double)(ms.limit ? ms.limit : ms.capacity);
  dt_peak_flops peak;
  DT_CHECK(dt_mfu_peak(DT_CPU, DT_PRECISION_FP32, roof, &peak));
  out->f32_flops = out->tf32_flops = out->bf16_flops = peak.flops;
  snprintf(out->peak_source, sizeof out->peak_source, "%s", peak.source);
  DT_CHECK(measure_copy_bandwidth(64 * DT_MIB, &out->mem_bw));
  /* ranks of one machine reduce through shared memory */
  out->nvlink_bw = out->net_bw = out->mem_bw / 2;
  out->latency = 20e-6;
  out->matmul_eff = 1.0; /* the roof is what this CPU's sgemm reached */
  out->memory_eff = 1.0;
  out->source = "this machine: the CPU allocator's cap, the measured sgemm roof and memcpy";
  return DT_OK;
}

dt_status dt_plan_cpu_shapes(dt_plan_config *cfg, const dt_plan_probe_result *p,
                             const dt_plan_result *r, dt_mfu_cache *roof) {
  dt_plan_device *d = &cfg->device;
  if (!d->cpu || r->micro_batch < 1)
    return DT_OK;
  double units = p->units_per_sample * r->micro_batch;
  bool half = cfg->precision == DT_PRECISION_BF16 || cfg->precision == DT_PRECISION_FP16;
  /* 16-bit: always (no 16-bit FMA); f32: a language model's GEMMs, whose
   * rows are the micro-batch's tokens (64 for GPT-2 at batch 1 x 64). */
  if (half || cfg->task->sequence_targets) {
    dt_peak_flops lin;
    DT_CHECK(dt_mfu_cpu_linear_roof(cfg->precision, units > 1024 ? 1024 : (int)units, roof, &lin));
    if (half)
      d->bf16_flops = lin.flops;
    else
      d->f32_flops = d->tf32_flops = lin.flops;
    snprintf(d->peak_source, sizeof d->peak_source, "%s", lin.source);
  }
  double bytes = p->traffic_per_unit * units;
  if (bytes > 0)
    DT_CHECK(measure_copy_bandwidth(bytes < 64 * DT_MIB ? (size_t)bytes : 64 * DT_MIB, &d->act_bw));
  return DT_OK;
}

/* ---- the probe ---- */

typedef struct probe_peaks {
  dt_device dev;
  double fb, update; /* absolute peaks of the phases */
  double fb_end;     /* when the last backward ended (seconds_now) */
  double update_end; /* and the last update */
} probe_peaks;

static dt_status probe_phase_ended(void *user, dt_step_phase ended) {
  probe_peaks *p = user;
  if (ended == DT_STEP_PHASE_FORWARD)
    return DT_OK;
  dt_memory_stats ms;
  DT_CHECK(dt_memory_stats_get(p->dev, &ms));
  if (ended == DT_STEP_PHASE_BACKWARD) {
    p->fb = (double)ms.peak_allocated;
    p->fb_end = seconds_now();
  } else {
    p->update = (double)ms.peak_allocated;
    p->update_end = seconds_now();
  }
  return dt_memory_reset_peak(p->dev);
}

dt_status dt_plan_replica_create(const dt_task *task, dt_device dev, dt_precision precision,
                                 bool recompute, const dt_optimizer_spec *spec,
                                 dt_step_phase_fn on_phase, void *on_phase_user,
                                 dt_grad_scaler *scaler, dt_replica **out) {
  dt_step_config sc = DT_STEP_CONFIG_DEFAULT;
  sc.loss = task->loss;
  sc.clip = task->defaults ? task->defaults->clip : 0.0f;
  sc.on_phase = on_phase;
  sc.on_phase_user = on_phase_user;
  DT_CHECK(dt_train_precision_setup(precision, -1, 0, dev, 0, &sc, scaler));
  dt_module *model = NULL;
  DT_CHECK(dt_train_build_model(task, 1, recompute, NULL, &model));
  return dt_replica_create(model, dev, 0, dt_train_optimizer_create, (void *)spec, &sc, out);
}

/* One step on a synthetic batch; *t0 (may be NULL): when the forward
 * began (seconds_now; drawing the batch is not the model's work). */
static dt_status plan_step(const dt_task *task, const dt_replica *rep, int batch, int64_t ctx,
                           double *t0) {
  dt_tensor *x = NULL, *y = NULL;
  dt_status st =
      dt_train_synthetic_batch(task, batch, ctx, (uint64_t)batch, dt_replica_device(rep), &x, &y);
  if (st == DT_OK && t0)
    *t0 = seconds_now();
  if (st == DT_OK)
    st = dt_step_forward_backward(dt_replica_step(rep), x, y, 1.0f, true, NULL);
  if (st == DT_OK)
    st = dt_step_update(dt_replica_step(rep));
  dt_tensor_release(y);
  dt_tensor_release(x);
  return st;
}

dt_status dt_plan_step(const dt_task *task, const dt_replica *rep, int batch, int64_t ctx) {
  return plan_step(task, rep, batch, ctx, NULL);
}

/* Training FLOPs per sample of `t`, 0 where the task has no count. */
static double task_flops(const dt_task *t) {
  return t->flops_per_sample        ? t->flops_per_sample(t)
         : t->plan_flops_per_sample ? t->plan_flops_per_sample(t)
                                    : 0.0;
}

/* The median of v[0..n) (sorted in place). */
static double median(double *v, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
      double x = v[j];
      v[j] = v[j - 1], v[j - 1] = x;
    }
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* task_flops at the probe's context `ctx` (0: the task's own shape). */
static double probe_flops(const dt_task *task, int64_t ctx) {
  dt_task t = *task;
  if (ctx > 0 && dt_task_with_context(task, ctx, &t) != DT_OK) {
    dt_clear_error();
    return 0.0;
  }
  return task_flops(&t);
}

/* The probe's precision: the GPU's default and TF32 run as fp32 (the same
 * storage as on the GPU). */
static dt_precision probe_precision(dt_precision p) {
  return p == DT_PRECISION_DEVICE_DEFAULT || p == DT_PRECISION_TF32 ? DT_PRECISION_FP32 : p;
}

/* The probe's first micro-batch, and *ctx its context (0: not a sequence
 * task): language models at micro-batch 1 and 2 (per token: their context
 * is cut to DT_PLAN_PROBE_CTX); others at DT_PLAN_PROBE_BATCH and twice
 * that, where their kernels take the paths of real batches. */
static int probe_sizes(const dt_task *task, int64_t *ctx) {
  int64_t T = task->input_shape[0];
  *ctx = !task->sequence_targets ? 0 : T < DT_PLAN_PROBE_CTX ? T : DT_PLAN_PROBE_CTX;
  return task->sequence_targets ? 1 : DT_PLAN_PROBE_BATCH;
}

/* One step at `batch` x `ctx`; *resident: allocated before it (the peaks
 * of its phases in *peaks, through the step's phase hook). */
static dt_status probe_step(const dt_task *task, const dt_replica *rep, const probe_peaks *peaks,
                            int batch, int64_t ctx, double *resident, double *fb_seconds,
                            double *update_seconds) {
  dt_memory_stats ms;
  DT_CHECK(dt_memory_stats_get(DT_CPU, &ms));
  if (resident)
    *resident = (double)ms.allocated;
  DT_CHECK(dt_memory_reset_peak(DT_CPU));
  double t0 = 0.0;
  DT_CHECK(plan_step(task, rep, batch, ctx, &t0));
  if (fb_seconds) { /* to the backward's end, then the update (the phase hook's) */
    *fb_seconds = peaks->fb_end - t0;
    *update_seconds = peaks->update_end - peaks->fb_end;
  }
  return DT_OK;
}

dt_status dt_plan_probe(const dt_task *task, dt_precision precision, bool recompute,
                        const dt_optimizer_spec *spec, dt_plan_probe_result *out) {
  memset(out, 0, sizeof *out);
  double traffic = 0.0; /* recompute: the activations the blocks write, kept or not */
  if (recompute) {
    DT_CHECK(dt_plan_probe(task, precision, false, spec, out));
    traffic = out->act_per_unit;
  }
  precision = probe_precision(precision);
  probe_peaks peaks = {DT_CPU, 0.0, 0.0};
  dt_grad_scaler scaler;
  dt_replica *rep = NULL;
  DT_CHECK(dt_plan_replica_create(task, DT_CPU, precision, recompute, spec, probe_phase_ended,
                                  &peaks, &scaler, &rep));
  dt_status st = DT_OK;
  int64_t ctx;
  int b1 = probe_sizes(task, &ctx);
  out->units_per_sample = task->sequence_targets ? (double)task->input_shape[0] : 1.0;
  double units = task->sequence_targets ? (double)ctx * b1 : (double)b1;
  /* A first step allocates what stays from then on (the optimizer's state,
   * the working copy); then the two measured ones. */
  double resident = 0.0, t[4], u[4];
  DT_CHECK_GOTO(probe_step(task, rep, &peaks, b1, ctx, NULL, NULL, NULL), st, done);
  DT_CHECK_GOTO(probe_step(task, rep, &peaks, b1, ctx, &resident, &t[0], &u[0]), st, done);
  double fb1 = peaks.fb, up1 = peaks.update;
  DT_CHECK_GOTO(probe_step(task, rep, &peaks, 2 * b1, ctx, NULL, &t[1], &u[1]), st, done);
  double fb2 = peaks.fb;
  /* each size again, for the timing (the median of each, and the spread
   * about it): twice for a model whose steps take a tenth of a second, up
   * to 8 times for a millisecond model, whose single steps the machine's
   * noise swamps */
  int again = (int)(0.1 / (t[0] + t[1] + 1e-9));
  again = again < 2 ? 2 : again > DT_PLAN_PROBE_AGAIN ? DT_PLAN_PROBE_AGAIN : again;
  double ts[2][DT_PLAN_PROBE_AGAIN + 1], us[2 * DT_PLAN_PROBE_AGAIN + 2];
  int n = 1, nu = 2;
  ts[0][0] = t[0], ts[1][0] = t[1], us[0] = u[0], us[1] = u[1];
  for (int r = 0; r < again; r++, n++) {
    DT_CHECK_GOTO(probe_step(task, rep, &peaks, b1, ctx, NULL, &ts[0][n], &us[nu++]), st, done);
    DT_CHECK_GOTO(probe_step(task, rep, &peaks, 2 * b1, ctx, NULL, &ts[1][n], &us[nu++]), st, done);
  }
  out->update_seconds = median(us, nu);
  double per_sample = probe_flops(task, ctx), spread = 0.0;
  for (int k = 0; k < 2; k++) {
    out->fb_seconds[k] = median(ts[k], n);
    out->fb_flops[k] = per_sample * b1 * (k + 1);
    for (int i = 0; i < n; i++)
      spread += fabs(ts[k][i] - out->fb_seconds[k]) / out->fb_seconds[k];
  }
  /* the mean absolute deviation over both sizes, as a normal's sigma */
  out->step_cv = spread / (2 * n) * 1.2533141 /* sqrt(pi / 2) */;
  out->parameters = dt_module_parameter_count(dt_replica_model(rep));
  DT_CHECK_GOTO(dt_plan_probe_zero2(task, rep, b1, ctx, units, &peaks.fb, out), st, done);
  dt_replica_memory rm = dt_replica_memory_use(rep);
  out->resident = resident;
  out->gradients = (double)rm.gradients;
  out->optimizer_state = (double)rm.optimizer_state;
  out->act_per_unit = (fb2 - fb1) / units;
  if (out->act_per_unit < 0)
    out->act_per_unit = 0;
  out->act_fixed = fb1 - resident - out->act_per_unit * units;
  out->traffic_per_unit = recompute ? traffic : out->act_per_unit;
  out->update_peak = up1 - resident;
done:
  dt_replica_destroy(rep);
  return st;
}

/* The probe's steps as load, until go_on says stop (see plan.h). */
dt_status dt_plan_probe_load(const dt_task *task, dt_precision precision, bool recompute,
                             const dt_optimizer_spec *spec, bool (*go_on)(void *user, int steps),
                             void *user) {
  dt_grad_scaler scaler;
  dt_replica *rep = NULL;
  DT_CHECK(dt_plan_replica_create(task, DT_CPU, probe_precision(precision), recompute, spec, NULL,
                                  NULL, &scaler, &rep));
  int64_t ctx;
  int b1 = probe_sizes(task, &ctx);
  dt_status st = DT_OK;
  for (int steps = 0; st == DT_OK && go_on(user, steps); steps++)
    st = plan_step(task, rep, steps % 2 ? 2 * b1 : b1, ctx, NULL);
  dt_replica_destroy(rep);
  return st;
}

/* ---- the plan ---- */

static double peak_of(const dt_plan_device *d, dt_precision p) {
  if (p == DT_PRECISION_BF16 || p == DT_PRECISION_FP16)
    return d->bf16_flops;
  if (p == DT_PRECISION_FP32)
    return d->f32_flops;
  return d->tf32_flops; /* tf32, and a GPU's default */
}

/* Per-rank memory at micro-batch b (the static parts already in *m). */
static double total_at(const dt_plan_config *cfg, const dt_plan_probe_result *p, dt_plan_memory *m,
                       int b, int accum) {
  double act = p->act_fixed + p->act_per_unit * p->units_per_sample * b;
  double update = p->update_peak;
  int mode = accum > 1;
  if (cfg->zero >= 2 && cfg->gpus_per_node * cfg->nodes > 1 && p->z2_lines[mode] > 0) {
    /* ZeRO 2: the forward + backward's highest line (the gradient memory
     * beside the activations then alive: m->comm); the buckets are freed
     * before the update, which gathers the parameters in place */
    double u = p->units_per_sample * b, best = -INFINITY;
    for (int j = 0; j < p->z2_lines[mode]; j++) {
      const dt_plan_z2_line *l = &p->z2[mode][j];
      if (l->fixed + l->per_unit * u + l->comm > best) {
        best = l->fixed + l->per_unit * u + l->comm;
        act = l->fixed + l->per_unit * u;
        m->comm = l->comm;
      }
    }
    act = act > 0 ? act : 0.0;
    if (update > act + m->comm)
      m->comm = 0.0;
  }
  m->activations = act > update ? act : update;
  m->overhead = cfg->device.alloc_overhead * (m->activations + m->workspace);
  m->total = m->weights + m->copies + m->gradients + m->optimizer + m->activations + m->workspace +
             m->comm + m->overhead;
  return m->total;
}

/* The accumulation at micro-batch b: > 1 when the global batch needs more
 * than one per rank (ZeRO 2 then keeps whole gradients between them). */
static int accum_at(const dt_plan_config *cfg, int ranks, int b) {
  return cfg->global_batch > 0 && cfg->global_batch / ranks > b ? 2 : 1;
}

static int largest_divisor_at_most(int64_t n, int64_t cap) {
  for (int64_t d = cap < n ? cap : n; d > 1; d--)
    if (n % d == 0)
      return (int)d;
  return 1;
}

/* One ring pass (a reduce-scatter, or an all-gather) of `bytes` over
 * `ranks` in `buckets` collectives: (R - 1)/R of the bytes at the link's
 * bandwidth, and the latency of a tree per bucket (NCCL picks trees at
 * scale). An all-reduce is two passes. On a CPU the "link" is the node's
 * memory (half its memcpy bandwidth: each byte is written to a shared slot
 * and read from it), and the ranks of a node pass their chunks through it
 * at the same time: `per_node` ranks share it. */
static double ring_pass_s(const dt_plan_device *d, int ranks, int nodes, int per_node, double bytes,
                          int buckets) {
  if (ranks < 2)
    return 0.0;
  double bw = nodes > 1 ? d->net_bw : d->nvlink_bw;
  if (d->cpu)
    bw /= per_node;
  return (double)(ranks - 1) / ranks * bytes / bw +
         buckets * ceil(log2((double)ranks)) * d->latency;
}

/* E[max of n standard normal draws]: exact to n = 16, then the
 * extreme-value asymptote. */
static double expected_max(int n) {
  static const double e[17] = {0,     0,     0.564, 0.846, 1.029, 1.163, 1.267, 1.352, 1.424,
                               1.485, 1.539, 1.586, 1.629, 1.668, 1.703, 1.736, 1.766};
  if (n <= 16)
    return e[n < 0 ? 0 : n];
  double l = sqrt(2.0 * log((double)n));
  return l - (log(log((double)n)) + log(4.0 * 3.14159265358979)) / (2.0 * l);
}

static double at_least(double v, double floor) { return v > floor ? v : floor; }

dt_status dt_plan_compute(const dt_plan_config *cfg, const dt_plan_probe_result *p,
                          dt_plan_result *out) {
  memset(out, 0, sizeof *out);
  const dt_plan_device *d = &cfg->device;
  if (cfg->zero < 0 || cfg->zero > 2)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`zero` %d: expected 0, 1 or 2", cfg->zero);
  if (cfg->gpus_per_node < 1 || cfg->nodes < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`gpus_per_node` (%d) and `nodes` (%d) must be >= 1",
                    cfg->gpus_per_node, cfg->nodes);
  int ranks = cfg->gpus_per_node * cfg->nodes;
  out->ranks = ranks;
  dt_plan_memory *m = &out->memory;
  m->weights = 4.0 * (double)p->parameters;
  m->gradients = p->gradients / (cfg->zero >= 2 ? ranks : 1);
  if (ranks > 1 && cfg->zero == 1) /* the full buckets and this rank's reduce-scattered shard */
    m->gradients = p->gradients * (1.0 + 1.0 / ranks);
  if (ranks > 1 && cfg->zero == 0 && d->cpu)
    m->gradients = 0; /* the MPI reducer's host buckets, outside the CPU allocator */
  m->optimizer = p->optimizer_state / (cfg->zero >= 1 ? ranks : 1);
  m->copies = p->resident - m->weights - p->gradients - p->optimizer_state;
  if (m->copies < 0)
    m->copies = 0;
  m->workspace = d->workspace;
  double bucket = (double)cfg->bucket_cap_mb * DT_MIB;
  out->fixed = total_at(cfg, p, m, 0, 1);
  out->per_sample = p->act_per_unit * p->units_per_sample * (1.0 + d->alloc_overhead);
  int fit = 0;
  /* the largest b (below 2^30) with total_at(b) <= memory */
  for (int step = 1 << 29; step > 0; step >>= 1)
    if (total_at(cfg, p, m, fit + step, accum_at(cfg, ranks, fit + step)) <= d->memory)
      fit += step;
  out->max_micro_batch = fit;
  double rule = out->per_sample > 0 ? (d->memory - out->fixed) / out->per_sample * 0.9 : 0.0;
  if (cfg->data_samples > 0 && rule > (double)cfg->data_samples / 10)
    rule = (double)cfg->data_samples / 10;
  out->rule_batch = rule >= 1 ? (rule > (1 << 30) ? (1 << 30) : (int)rule) : 0;

  int micro = cfg->micro_batch;
  if (cfg->global_batch > 0) {
    if (cfg->global_batch % ranks != 0)
      return DT_ERROR(
          DT_ERR_INVALID_ARG,
          "`global_batch` %lld: not a multiple of the %d ranks (devices per node x nodes)",
          (long long)cfg->global_batch, ranks);
    int64_t per_rank = cfg->global_batch / ranks;
    if (micro > 0 && per_rank % micro != 0)
      return DT_ERROR(DT_ERR_INVALID_ARG,
                      "`global_batch` %lld: %lld samples per rank is not a multiple of the "
                      "`micro_batch` %d",
                      (long long)cfg->global_batch, (long long)per_rank, micro);
    if (micro <= 0)
      micro = largest_divisor_at_most(per_rank, fit > 0 ? fit : 1);
    out->accumulation = (int)(per_rank / micro);
  } else {
    if (micro <= 0)
      micro = fit > 0 ? fit : 1;
    out->accumulation = 1;
  }
  out->micro_batch = micro;
  out->global_batch = (int64_t)micro * out->accumulation * ranks;
  total_at(cfg, p, m, micro, out->accumulation);

  /* The roofline: the GEMMs' FLOPs at the peak, the activations' traffic
   * (written in forward, read in backward, their gradients written and
   * read: 4 passes) at the bandwidth, summed over the micro-batches. */
  const dt_task *t = cfg->task;
  double fps = task_flops(t);
  out->peak_flops = peak_of(d, cfg->precision);
  double bw = d->mem_bw * d->memory_eff;
  double act_bw = (d->act_bw > 0 ? d->act_bw : d->mem_bw) * d->memory_eff;
  double rc = cfg->recompute ? 4.0 / 3.0 : 1.0;
  out->matmul_eff = d->matmul_eff;
  out->memory_s =
      (cfg->recompute ? 5.0 : 4.0) * p->traffic_per_unit * p->units_per_sample * micro / act_bw;
  double fixed_s = 0.0; /* per micro-batch, whatever its size (the CPU's calibration) */
  const double *ps = p->fb_seconds, *pf = p->fb_flops;
  if (d->cpu && ps[0] > 0 && ps[1] > 0 && pf[0] > 0 && pf[1] > pf[0] && out->peak_flops > 0) {
    /* This CPU: the model's own probe steps (forward + backward at the
     * probe's two micro-batches, at this precision and thread count) give
     * the rate its kernels reach on each further FLOP (traffic included)
     * and the time a micro-batch takes whatever its size; a slope that
     * noise made flat: the rate of the larger step alone. */
    double rate = (pf[1] - pf[0]) / (ps[1] - ps[0]);
    if (ps[1] > ps[0] && rate <= pf[1] / ps[1] * 4)
      fixed_s = ps[0] - pf[0] / rate;
    else
      rate = pf[1] / ps[1];
    if (fixed_s < 0)
      fixed_s = 0, rate = pf[1] / ps[1];
    out->matmul_eff = rate / out->peak_flops; /* recomputation's re-run included */
    out->memory_s = 0.0;
    rc = 1.0;
  }
  out->compute_s = fixed_s + fps * micro * rc / (out->peak_flops * out->matmul_eff);
  double per_param = cfg->adamw ? 28.0 : 20.0; /* f32 p, g, state read; p, state written */
  if (cfg->precision == DT_PRECISION_BF16 || cfg->precision == DT_PRECISION_FP16)
    per_param += 2.0; /* the working copy written */
  out->optimizer_s = per_param * (double)p->parameters / (cfg->zero >= 1 ? ranks : 1) / bw;
  if (d->cpu && p->update_seconds > 0) /* this CPU: the probe's own update, sharded by ZeRO */
    out->optimizer_s = p->update_seconds / (cfg->zero >= 1 ? ranks : 1);
  double grad_bytes = 4.0 * (double)p->parameters;
  int buckets = (int)ceil(grad_bytes / bucket);
  buckets = buckets < 1 ? 1 : buckets;
  /* The gradients' pass(es) overlap the last micro-batch's backward, all
   * but the last bucket's share. ZeRO >= 1 reduce-scatters them instead
   * (one pass) and all-gathers the updated f32 parameters (the other):
   * each bucket's gather starts once its segment is updated, so only the
   * update of the later segments hides it, and the step waits for all. */
  double pass = ring_pass_s(d, ranks, cfg->nodes, cfg->gpus_per_node, grad_bytes, buckets);
  double backward = 2.0 / 3.0 * (out->compute_s + out->memory_s);
  if (d->cpu) {
    /* a CPU has no copy engine: each rank's own cores copy and sum its
     * collectives' chunks, time its backward and update do not get */
    out->comm_s = 2.0 * pass;
    out->comm_exposed_s = out->comm_s;
  } else if (cfg->zero >= 1 && ranks > 1) {
    double hidden = out->optimizer_s * (buckets - 1) / buckets;
    out->comm_s = 2.0 * pass;
    out->comm_exposed_s =
        at_least(pass - backward, pass / buckets) + at_least(pass - hidden, pass / buckets);
  } else {
    out->comm_s = 2.0 * pass;
    out->comm_exposed_s = at_least(out->comm_s - backward, out->comm_s / buckets);
  }
  if (d->cpu && ranks > 1) /* each micro-batch's backward ends in the ranks' collective */
    out->straggler_s = out->accumulation * out->compute_s * p->step_cv * expected_max(ranks);
  out->step_s = out->accumulation * (out->compute_s + out->memory_s) + out->optimizer_s +
                out->comm_exposed_s + out->straggler_s;
  out->flops_per_step = fps * (double)out->global_batch;
  out->samples_per_s = (double)out->global_batch / out->step_s;
  if (cfg->task->sequence_targets)
    out->tokens_per_s = out->samples_per_s * p->units_per_sample;
  out->mfu = fps > 0 ? out->flops_per_step / out->step_s / (ranks * out->peak_flops) : 0.0;
  return DT_OK;
}
