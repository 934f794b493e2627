#include "launch/bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/cpu.h"
#include "core/memory.h"
#include "core/step.h"
#include "dist/comm.h"
#include "dist/ddp.h"
#include "dist/replica.h"
#include "launch/cli.h"
#include "launch/flags.h"
#include "launch/threads.h"
#include "models/tasks.h"
#include "train/mfu.h"
#include "train/plan.h"
#include "train/train_loop.h"

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct phase_times {
  double forward, backward, optimizer;
  /* DDP, from the reducer's timeline; per bucket as well */
  double allreduce, overlapped, exposed, update;
  double bucket_allreduce[DT_BENCH_MAX_BUCKETS], bucket_hidden[DT_BENCH_MAX_BUCKETS];
} phase_times;

/* Adds the last synchronised pass's communication figures to *t. */
static void add_comm_times(const dt_ddp *ddp, phase_times *t) {
  dt_ddp_timeline tl;
  dt_ddp_get_timeline(ddp, &tl);
  dt_ddp_comm_times c = dt_ddp_timeline_comm_times(&tl);
  t->allreduce += c.allreduce_s;
  t->overlapped += c.hidden_s;
  t->exposed += c.exposed_s;
  t->update += c.update_s;
  for (int b = 0; b < tl.n_buckets && b < DT_BENCH_MAX_BUCKETS; b++) {
    dt_ddp_timeline one = tl; /* bucket b alone */
    one.n_buckets = 1;
    one.buckets = &tl.buckets[b];
    dt_ddp_comm_times cb = dt_ddp_timeline_comm_times(&one);
    t->bucket_allreduce[b] += cb.allreduce_s;
    t->bucket_hidden[b] += cb.hidden_s;
  }
}

/* The step's phase boundaries (core/step.h): synchronise the device and
 * add the phase's time to *acc. With a reducer the backward phase includes
 * waiting for the gradient all-reduce. */
typedef struct phase_timer {
  const dt_backend_ops *be;
  dt_device dev;
  dt_ddp *ddp; /* NULL: one process */
  phase_times *acc;
  double last; /* when the current phase began */
} phase_timer;

static dt_status phase_ended(void *user, dt_step_phase ended) {
  phase_timer *t = user;
  if (ended == DT_STEP_PHASE_BACKWARD && t->ddp)
    add_comm_times(t->ddp, t->acc);
  DT_CHECK(t->be->device_synchronize(t->dev));
  double now = now_seconds();
  double *phase = ended == DT_STEP_PHASE_FORWARD    ? &t->acc->forward
                  : ended == DT_STEP_PHASE_BACKWARD ? &t->acc->backward
                                                    : &t->acc->optimizer;
  *phase += now - t->last;
  t->last = now;
  return DT_OK;
}

/* One training step, timed into *acc; *loss_value (NULL = not read) gets
 * its loss. */
static dt_status timed_step(const dt_replica *r, phase_timer *timer, phase_times *acc, dt_tensor *x,
                            dt_tensor *y, double *loss_value) {
  const dt_step *step = dt_replica_step(r);
  dt_tensor *loss = NULL;
  timer->acc = acc;
  timer->last = now_seconds();
  DT_CHECK(dt_step_forward_backward(step, x, y, 1.0f, true, loss_value ? &loss : NULL));
  dt_status st = dt_step_update(step);
  if (st == DT_OK && loss_value)
    st = dt_tensor_item(loss, 0, loss_value);
  dt_tensor_release(loss);
  return st;
}

/* --precision as the trainer's value (NULL: the device's default). */
static dt_status bench_precision(const char *name, dt_precision *out) {
  *out = DT_PRECISION_DEVICE_DEFAULT;
  return name ? dt_precision_parse(name, out) : DT_OK;
}

dt_status dt_bench_run(const dt_bench_config *cfg, dt_bench_result *out) {
  dt_status st = DT_OK;
  dt_device dev;
  const dt_task *found = NULL;
  dt_task ctx_task;
  const dt_task *task = &ctx_task;
  dt_replica *rep = NULL;
  dt_module *model = NULL;
  int world = cfg->pg ? dt_pg_world_size(cfg->pg) : 1;
  int rank = cfg->pg ? dt_pg_rank(cfg->pg) : 0;
  dt_tensor *x = NULL, *y = NULL;
  dt_bench_result r;
  memset(&r, 0, sizeof r);
  phase_timer timer;
  memset(&timer, 0, sizeof timer);

  if (cfg->batch < 0 || cfg->steps < 1 || cfg->warmup < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "batch (%d) must be >= 0 (0 = auto), steps (%d) >= 1, warmup (%d) >= 0",
                    cfg->batch, cfg->steps, cfg->warmup);
  if (cfg->threads > DT_CPU_MAX_THREADS)
    return DT_ERROR(DT_ERR_INVALID_ARG, "threads %d: at most %d CPU threads (0 = all cores)",
                    cfg->threads, DT_CPU_MAX_THREADS);
  dt_device asked;
  DT_CHECK(dt_cli_device(cfg->device, &asked));
  DT_CHECK(dt_train_rank_device(asked, cfg->pg, &dev));
  dt_precision precision;
  DT_CHECK(bench_precision(cfg->precision, &precision));
  DT_CHECK(dt_backend_get(dev, &timer.be));
  timer.dev = dev;
  if (cfg->threads > 0)
    dt_cpu_set_num_threads(cfg->threads);
  DT_CHECK(dt_train_cap_device_memory(dev, cfg->max_memory_mib));

  DT_CHECK(dt_task_find(cfg->model, &found));
  ctx_task = *found;
  if (cfg->ctx > 0)
    DT_CHECK(dt_task_with_context(found, cfg->ctx, &ctx_task));
  DT_CHECK(dt_cli_task_image_shape(&ctx_task, cfg->image_size, cfg->channels));
  if (cfg->channels_last && !ctx_task.residual_bn)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "--channels-last: model %s has no convolutions in residual blocks to run "
                    "channels-last (it is for the resnet* models)",
                    ctx_task.name);
  ctx_task.channels_last = cfg->channels_last;
  dt_step_config sc = DT_STEP_CONFIG_DEFAULT;
  sc.loss = task->loss;
  sc.clip = task->defaults ? task->defaults->clip : 0.0f; /* the step train takes */
  sc.on_phase = phase_ended;
  sc.on_phase_user = &timer;
  dt_grad_scaler scaler; /* fp16 */
  DT_CHECK(dt_train_precision_setup(precision, -1, 0, dev, rank, &sc, &scaler));
  DT_CHECK(dt_train_rounding_setup(cfg->stochastic_rounding, cfg->seed, &sc));
  dt_optimizer_spec os =
      dt_train_bench_optimizer(task, cfg->optimizer && !strcmp(cfg->optimizer, "adamw"));
  int batch = cfg->batch;
  if (batch == 0) { /* auto: the plan's rule, a trial step */
    dt_plan_auto_config a = {task, dev, precision, cfg->recompute, os, cfg->zero, world, 0, 0};
    dt_plan_auto pa;
    DT_CHECK(dt_plan_auto_batch(&a, &pa));
    batch = pa.micro_batch;
    r.auto_rule = pa.rule_batch;
    r.auto_halvings = pa.halvings;
    r.auto_per_sample_mib = pa.per_sample / DT_MIB;
    r.auto_free_mib = (pa.memory - pa.fixed) / DT_MIB;
  }
  r.batch = batch;
  DT_CHECK(dt_train_build_model(task, cfg->seed, cfg->recompute, NULL, &model));
  DT_CHECK(dt_replica_create(model, dev, 0, dt_train_optimizer_create, &os, &sc, &rep));
  if (world > 1) {
    dt_train_comm_options co = {DT_COMM_BACKEND_AUTO, cfg->comm_timeout, cfg->first_bucket_mb,
                                cfg->bucket_cap_mb, false};
    const char *backend = cfg->comm_backend ? cfg->comm_backend : dt_cli_comm_backend_default();
    DT_CHECK_GOTO(dt_comm_backend_parse(backend, &co.backend), st, cleanup);
    co.zero_stage = cfg->zero;
    co.split_bucket_mb = cfg->split_bucket_mb;
    co.update_per_bucket = cfg->bucket_update && !strcmp(cfg->bucket_update, "each");
    DT_CHECK_GOTO(dt_ddp_grad_compress_parse(cfg->grad_compress, &co.grad_compress), st, cleanup);
    DT_CHECK_GOTO(dt_train_connect(rep, cfg->pg, &co), st, cleanup);
    timer.ddp = dt_replica_ddp(rep);
  }
  dt_comm *comm = dt_replica_comm(rep);
  /* Each rank its own batch, as in data-parallel training. */
  DT_CHECK_GOTO(dt_train_synthetic_batch(task, batch, 0, cfg->seed + (uint64_t)rank, dev, &x, &y),
                st, cleanup);

  phase_times warm, timed;
  memset(&warm, 0, sizeof warm);
  memset(&timed, 0, sizeof timed);
  for (int i = 0; i < cfg->warmup; i++)
    DT_CHECK_GOTO(timed_step(rep, &timer, &warm, x, y, NULL), st, cleanup);
  DT_CHECK_GOTO(dt_memory_reset_peak(dev), st, cleanup);
  if (comm)
    DT_CHECK_GOTO(dt_comm_barrier_sync(comm), st, cleanup);
  double t0 = now_seconds();
  for (int i = 0; i < cfg->steps; i++)
    DT_CHECK_GOTO(timed_step(rep, &timer, &timed, x, y, i + 1 == cfg->steps ? &r.final_loss : NULL),
                  st, cleanup);
  if (comm)
    DT_CHECK_GOTO(dt_comm_barrier_sync(comm), st, cleanup);
  r.seconds = now_seconds() - t0;

  dt_memory_stats ms;
  memset(&ms, 0, sizeof ms);
  if (dt_memory_stats_get(dev, &ms) == DT_OK)
    r.peak_mib = (double)ms.peak_allocated / DT_MIB;
  r.parameters = dt_module_parameter_count(dt_replica_model(rep));
  if (task->input_ndim == 3)
    for (int k = 0; k < 3; k++)
      r.input_shape[k] = (int)task->input_shape[k];
  dt_replica_memory rm = dt_replica_memory_use(rep);
  r.optimizer_state_mib = (double)rm.optimizer_state / DT_MIB;
  r.gradient_mem_mib = (double)rm.gradients / DT_MIB;
  r.in_flight_mib = (double)rm.gradients_in_flight / DT_MIB;
  r.steps_per_s = cfg->steps / r.seconds;
  r.samples_per_s = r.steps_per_s * batch * world;
  if (task->max_context > 0)
    r.tokens_per_s = r.samples_per_s * (double)task->input_shape[0];
  dt_mfu mfu;
  dt_mfu_cache roof = {0.0, 0};
  r.flops_per_sample = task->flops_per_sample ? task->flops_per_sample(task) : 0.0;
  if (r.flops_per_sample > 0 &&
      dt_mfu_of(dev, precision, &roof, r.samples_per_s * r.flops_per_sample / world, &mfu) ==
          DT_OK) {
    r.peak_flops = mfu.peak.flops;
    snprintf(r.peak_source, sizeof r.peak_source, "%s", mfu.peak.source);
    r.mfu = mfu.value;
  }
  dt_clear_error();
  r.world = world;
  r.device = dev;
  if (timer.ddp) {
    const char *name = dt_comm_backend_name(comm);
    snprintf(r.comm, sizeof r.comm, "%s",
             dev.type != DT_DEVICE_CPU && strcmp(name, "nccl") != 0 ? "mpi (host-staged)" : name);
    r.buckets = dt_ddp_num_buckets(timer.ddp);
    r.allreduce_ms = 1e3 * timed.allreduce / cfg->steps;
    r.overlapped_ms = 1e3 * timed.overlapped / cfg->steps;
    r.exposed_ms = 1e3 * timed.exposed / cfg->steps;
    r.update_ms = 1e3 * timed.update / cfg->steps;
    dt_ddp_timeline tl;
    dt_ddp_get_timeline(timer.ddp, &tl);
    for (int b = 0; b < tl.n_buckets && b < DT_BENCH_MAX_BUCKETS; b++) {
      r.bucket_bytes[b] = tl.buckets[b].bytes;
      r.bucket_allreduce_ms[b] = 1e3 * timed.bucket_allreduce[b] / cfg->steps;
      r.bucket_hidden_ms[b] = 1e3 * timed.bucket_hidden[b] / cfg->steps;
    }
    r.grad_mib = (double)dt_param_arena_numel(dt_replica_arena(rep)) * sizeof(float) / DT_MIB;
    r.allreduce_bytes = dt_ddp_comm_bytes_per_pass(timer.ddp);
  }
  r.ms_per_step = 1e3 * r.seconds / cfg->steps;
  r.forward_ms = 1e3 * timed.forward / cfg->steps;
  r.backward_ms = 1e3 * timed.backward / cfg->steps;
  r.optimizer_ms = 1e3 * timed.optimizer / cfg->steps;
  if (out)
    *out = r;
cleanup:
  if (st != DT_OK) /* peers may be dead or stuck: do not wait for them (ncclCommAbort) */
    dt_comm_abort(rep ? dt_replica_comm(rep) : NULL, "the benchmark failed");
  dt_tensor_release(y);
  dt_tensor_release(x);
  dt_replica_destroy(rep);
  return st;
}

int dt_cli_bench(int argc, char **argv, dt_pg *pg, FILE *err) {
  if (dt_cli_bench_wants_loader(argc, argv))
    return dt_cli_bench_loader(argc, argv, err);
  dt_bench_config cfg = DT_BENCH_CONFIG_DEFAULT;
  const char *default_backend = dt_cli_comm_backend_default();
  const char *comm_backend = default_backend; /* cfg gets it only when given */
  /* A model with training defaults (a language model) is timed as train
   * runs it: its optimizer (with its settings, dt_train_bench_optimizer) and batch;
   * the flags override them. An unknown name is the parser's. */
  const dt_task *task = NULL;
  const char *model = dt_cli_peek_flag(argc, argv, "model");
  if (model && dt_task_find(model, &task) == DT_OK && task->defaults) {
    if (task->defaults->optimizer != DT_TASK_OPTIMIZER_DEFAULT)
      cfg.optimizer = task->defaults->optimizer == DT_TASK_OPTIMIZER_ADAMW ? "adamw" : "sgd";
    cfg.batch = task->defaults->batch;
  }
  dt_clear_error();
  bool batch_auto = false;
  argc = dt_cli_take_batch_auto(argc, argv, &batch_auto);
  dt_flag flags[] = {
      dt_cli_flag_model(&cfg.model),
      DT_INT_FLAG("batch", &cfg.batch, "N",
                  "batch size (per rank under a launcher), or auto: the seed's rule with the "
                  "plan's memory per sample (no data set: memory only), confirmed by a trial "
                  "step",
                  .min = 1),
      DT_INT_FLAG("steps", &cfg.steps, "N", "timed training steps", .min = 1),
      DT_INT_FLAG("warmup", &cfg.warmup, "N", "untimed warm-up steps"),
      dt_cli_flag_optimizer(&cfg.optimizer,
                            "optimizer (sgd: lr 0.01, momentum 0.9; adamw: lr 1e-3, or a language "
                            "model's AdamW settings)"),
      dt_cli_flag_ctx(&cfg.ctx),
      DT_CLI_IMAGE_SHAPE_FLAGS(&cfg.image_size, &cfg.channels),
      dt_cli_flag_threads(&cfg.threads),
      dt_cli_flag_device(&cfg.device),
      dt_cli_flag_precision(&cfg.precision),
      dt_cli_flag_stochastic_rounding(&cfg.stochastic_rounding),
      dt_cli_flag_recompute(&cfg.recompute),
      dt_cli_flag_channels_last(&cfg.channels_last),
      dt_cli_flag_max_memory(&cfg.max_memory_mib),
      dt_cli_flag_seed(&cfg.seed, "seed for the model and the synthetic batch"),
      DT_CLI_DDP_FLAGS(&comm_backend, &cfg.comm_timeout, &cfg.bucket_cap_mb, &cfg.first_bucket_mb,
                       &cfg.split_bucket_mb, &cfg.bucket_update, &cfg.zero, &cfg.grad_compress),
  };
  dt_flag_set set = {
      .command = "bench",
      .usage = "bench [flags]",
      .about =
          "Times training steps (forward, the model's loss, backward, optimizer) on one\n"
          "synthetic batch of the model's input shape, after untimed warm-up steps, and\n"
          "prints\n"
          "  steps_per_s=... samples_per_s=... ms_per_step=...\n"
          "  breakdown: forward_ms=... backward_ms=... optimizer_ms=... peak_mem=... loss=...\n"
          "  memory: optimizer_state_mib=... grad_mib=... in_flight_mib=... (per rank; --zero\n"
          "  shards them; in flight: stage 2's bucket buffers at their peak)\n"
          "Under a launcher (dtrain launch -n N -- bench ...) every rank runs --batch\n"
          "samples per step through a DDP reducer and samples_per_s counts all ranks; a\n"
          "line\n"
          "  ddp: world N, per-rank batch B, global batch ..., K buckets (... MiB) over ...\n"
          "names the reducer, and the line\n"
          "  comm: allreduce_ms=... overlapped_ms=... hidden=...% exposed_ms=...\n"
          "  allreduce_bytes=... (per step)\n"
          "carries the all-reduce time per step, the part of it the overlap with backward\n"
          "hid, the part the step waited for and the bytes handed to the all-reduces\n"
          "(ZeRO: reduce-scatters; --grad-compress halves them); then\n"
          "  buckets: update_ms=... #0 ...KiB ...ms hidden=...% #1 ... (per step)\n"
          "the optimizer's update per bucket inside the wait (--bucket-update each; part\n"
          "of backward_ms) and each bucket's all-reduce time and hidden share, in launch\n"
          "order. bench --loader --data DIR times the image-folder loader instead (see\n"
          "dtrain bench --loader --help).",
      .epilogue = "example: dtrain launch -n 2 --threads 1 -- bench --model mlp --batch 128",
      DT_FLAG_TABLE(flags),
  };
  DT_FLAGS_PARSE_OR_RETURN(&set, argc, argv, err, NULL);
  if (batch_auto)
    cfg.batch = 0;
  if (!dt_cli_check_ctx("bench", cfg.model, cfg.ctx, err) ||
      !dt_cli_check_precision("bench", cfg.precision, cfg.stochastic_rounding, cfg.device, NULL,
                              err))
    return 2;
  if (dt_cli_check_env() != DT_OK)
    return 1;
  cfg.comm_backend = comm_backend != default_backend ? comm_backend : NULL;
  cfg.pg = pg;
  int rank = pg ? dt_pg_rank(pg) : 0;
  if (cfg.threads == 0)
    dt_threads_choose_default(pg ? dt_pg_local_size(pg) : 1);

  dt_bench_result r;
  dt_status st = dt_bench_run(&cfg, &r);
  if (st != DT_OK)
    return 1; /* the caller prints dt_last_error() with the rank */
  if (rank != 0)
    return 0;
  char dev[32], images[48] = "";
  if (cfg.image_size || cfg.channels)
    snprintf(images, sizeof images, " images %dx%d px, %d channel(s)", r.input_shape[1],
             r.input_shape[2], r.input_shape[0]);
  printf(
      "dtrain bench: model %s (%lld parameters)%s batch %d steps %d warmup %d optimizer %s "
      "device %s precision %s threads %d%s%s%s\n",
      cfg.model, (long long)r.parameters, images, r.batch, cfg.steps, cfg.warmup, cfg.optimizer,
      dt_device_format(r.device, dev, sizeof dev),
      cfg.precision                     ? cfg.precision
      : r.device.type == DT_DEVICE_CUDA ? "tf32"
                                        : "fp32",
      dt_cpu_num_threads(), dt_threads_note(), cfg.recompute ? " recompute" : "",
      cfg.channels_last ? " channels-last" : "");
  if (cfg.batch == 0)
    printf(
        "batch auto: %d (the seed's rule min(%.1f MiB free / %.3f MiB per sample x 0.9) = %d; "
        "%d trial step(s) out of memory, halved)\n",
        r.batch, r.auto_free_mib, r.auto_per_sample_mib, r.auto_rule, r.auto_halvings);
  if (r.world > 1)
    printf(
        "ddp: world %d, per-rank batch %d, global batch %d, %d buckets (%.2f MiB of gradients) "
        "over %s, zero %d, grad-compress %s\n",
        r.world, r.batch, r.world * r.batch, r.buckets, r.grad_mib, r.comm, cfg.zero,
        cfg.grad_compress);
  printf("steps_per_s=%.2f samples_per_s=%.1f ms_per_step=%.3f", r.steps_per_s, r.samples_per_s,
         r.ms_per_step);
  if (r.tokens_per_s > 0)
    printf(" tokens_per_s=%.0f", r.tokens_per_s);
  if (r.peak_flops > 0 && r.mfu >= 0)
    printf(" mfu=%.2f%%", 100.0 * r.mfu);
  else if (r.peak_flops > 0)
    printf(" mfu=n/a (above the measured roof)");
  printf("\n");
  if (r.peak_flops > 0)
    printf("flops: %.1f MFLOP per sample, peak %.1f GFLOP/s per device (%s)\n",
           r.flops_per_sample / 1e6, r.peak_flops / 1e9, r.peak_source);
  printf(
      "breakdown: forward_ms=%.3f backward_ms=%.3f optimizer_ms=%.3f peak_mem=%.1fMiB "
      "loss=%.4f\n",
      r.forward_ms, r.backward_ms, r.optimizer_ms, r.peak_mib, r.final_loss);
  printf("memory: optimizer_state_mib=%.3f grad_mib=%.3f in_flight_mib=%.3f (per rank)\n",
         r.optimizer_state_mib, r.gradient_mem_mib, r.in_flight_mib);
  if (r.world > 1) {
    printf(
        "comm: allreduce_ms=%.3f overlapped_ms=%.3f hidden=%.0f%% exposed_ms=%.3f "
        "allreduce_bytes=%zu (per step)\n",
        r.allreduce_ms, r.overlapped_ms,
        r.allreduce_ms > 0 ? 100.0 * r.overlapped_ms / r.allreduce_ms : 0.0, r.exposed_ms,
        r.allreduce_bytes);
    printf("buckets: update_ms=%.3f", r.update_ms);
    for (int b = 0; b < r.buckets && b < DT_BENCH_MAX_BUCKETS; b++)
      printf(" #%d %.0fKiB %.3fms hidden=%.0f%%", b, (double)r.bucket_bytes[b] / 1024.0,
             r.bucket_allreduce_ms[b],
             r.bucket_allreduce_ms[b] > 0 ? 100.0 * r.bucket_hidden_ms[b] / r.bucket_allreduce_ms[b]
                                          : 0.0);
    printf("%s (per step)\n", r.buckets > DT_BENCH_MAX_BUCKETS ? " ..." : "");
  }
  return 0;
}
