#include "launch/bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/cpu.h"
#include "core/memory.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/rng.h"
#include "dist/comm.h"
#include "dist/ddp.h"
#include "launch/cli.h"
#include "launch/flags.h"
#include "launch/train_loop.h"
#include "models/models.h"

#define NUM_CLASSES 10

dt_bench_config dt_bench_config_default(void) {
  dt_bench_config c;
  memset(&c, 0, sizeof c);
  c.model = "mlp";
  c.optimizer = "sgd";
  c.device = "cpu";
  c.batch = 128;
  c.steps = 100;
  c.warmup = 10;
  c.threads = 0;
  c.seed = 0;
  c.pg = NULL;
  c.comm_backend = NULL;
  c.comm_timeout = 300.0;
  c.bucket_cap_mb = 25.0f;
  c.first_bucket_mb = 1.0f;
  return c;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Random inputs (batch,1,28,28) ~ N(0,1) and labels in [0, NUM_CLASSES). */
static dt_status make_batch(int batch, uint64_t seed, dt_device dev, dt_tensor **x, dt_tensor **y) {
  dt_status st = DT_OK;
  const int64_t xshape[4] = {batch, 1, 28, 28};
  const int64_t yshape[1] = {batch};
  size_t n = (size_t)batch * 28 * 28;
  float *xs = malloc(n * sizeof *xs);
  int32_t *ys = malloc((size_t)batch * sizeof *ys);
  if (!xs || !ys) {
    st = DT_ERROR(DT_ERR_OOM, "no host memory for a synthetic batch of %d", batch);
    goto done;
  }
  dt_generator gen;
  dt_generator_init(&gen, seed ^ 0x5eedULL);
  for (size_t i = 0; i < n; i++)
    xs[i] = dt_generator_normal(&gen);
  for (int i = 0; i < batch; i++)
    ys[i] = (int32_t)dt_generator_below(&gen, NUM_CLASSES);
  DT_CHECK_GOTO(dt_tensor_from_host(xs, xshape, 4, DT_DTYPE_F32, dev, x), st, done);
  DT_CHECK_GOTO(dt_tensor_from_host(ys, yshape, 1, DT_DTYPE_I32, dev, y), st, done);
done:
  free(ys);
  free(xs);
  return st;
}

typedef struct phase_times {
  double forward, backward, optimizer;
  double allreduce, overlapped, exposed; /* DDP, from the reducer's timeline */
} phase_times;

/* Adds the last synchronised pass's communication figures to *t. */
static void add_comm_times(const dt_ddp *ddp, phase_times *t) {
  dt_ddp_timeline tl;
  dt_ddp_get_timeline(ddp, &tl);
  for (int b = 0; b < tl.n_buckets; b++) {
    const dt_ddp_bucket_timing *bt = &tl.buckets[b];
    if (bt->end_s <= 0 || bt->start_s <= 0)
      continue;
    t->allreduce += bt->end_s - bt->start_s;
    double hidden_end = bt->end_s < tl.backward_end_s ? bt->end_s : tl.backward_end_s;
    if (hidden_end > bt->start_s)
      t->overlapped += hidden_end - bt->start_s;
  }
  t->exposed += tl.finish_end_s - tl.backward_end_s;
}

/* One training step; adds each phase's time to *t. With a reducer the
 * backward phase includes waiting for the gradient all-reduce. */
static dt_status train_step(dt_module *model, dt_optimizer *opt, dt_ddp *ddp,
                            const dt_backend_ops *be, dt_device dev, dt_tensor *x, dt_tensor *y,
                            phase_times *t, double *loss_value) {
  dt_status st;
  dt_tensor *logits = NULL, *loss = NULL;
  double t0 = now_seconds();
  DT_CHECK_GOTO(dt_optim_zero_grad(opt), st, done);
  double t1 = now_seconds();
  DT_CHECK_GOTO(dt_module_call(model, x, &logits), st, done);
  DT_CHECK_GOTO(dt_op_cross_entropy(logits, y, DT_REDUCTION_MEAN, DT_IGNORE_INDEX, &loss), st,
                done);
  DT_CHECK_GOTO(be->device_synchronize(dev), st, done);
  double t2 = now_seconds();
  DT_CHECK_GOTO(dt_backward(loss, NULL), st, done);
  if (ddp) {
    DT_CHECK_GOTO(dt_ddp_finish_backward(ddp), st, done);
    add_comm_times(ddp, t);
  }
  DT_CHECK_GOTO(be->device_synchronize(dev), st, done);
  double t3 = now_seconds();
  DT_CHECK_GOTO(dt_optim_step(opt), st, done);
  DT_CHECK_GOTO(be->device_synchronize(dev), st, done);
  double t4 = now_seconds();
  t->forward += t2 - t1;
  t->backward += t3 - t2;
  t->optimizer += (t4 - t3) + (t1 - t0);
  if (loss_value)
    DT_CHECK_GOTO(dt_tensor_item(loss, 0, loss_value), st, done);
done:
  dt_tensor_release(loss);
  dt_tensor_release(logits);
  return st;
}

dt_status dt_bench_run(const dt_bench_config *cfg, dt_bench_result *out) {
  dt_status st = DT_OK;
  dt_device dev;
  const dt_backend_ops *be = NULL;
  dt_module *model = NULL;
  dt_param_arena *arena = NULL;
  dt_optimizer *opt = NULL;
  dt_comm *comm = NULL;
  dt_ddp *ddp = NULL;
  int world = cfg->pg ? dt_pg_world_size(cfg->pg) : 1;
  int rank = cfg->pg ? dt_pg_rank(cfg->pg) : 0;
  dt_tensor *x = NULL, *y = NULL;
  dt_bench_result r;
  memset(&r, 0, sizeof r);

  if (cfg->batch < 1 || cfg->steps < 1 || cfg->warmup < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "batch (%d) and steps (%d) must be >= 1, warmup (%d) >= 0",
                    cfg->batch, cfg->steps, cfg->warmup);
  if (cfg->threads > DT_CPU_MAX_THREADS)
    return DT_ERROR(DT_ERR_INVALID_ARG, "threads %d: at most %d CPU threads (0 = all cores)",
                    cfg->threads, DT_CPU_MAX_THREADS);
  DT_CHECK(dt_train_rank_device(cfg->device, cfg->pg, &dev));
  DT_CHECK(dt_backend_get(dev, &be));
  if (cfg->threads > 0)
    dt_cpu_set_num_threads(cfg->threads);

  DT_CHECK(dt_model_create(cfg->model, cfg->seed, &model));
  DT_CHECK_GOTO(dt_module_to(model, dev), st, cleanup);
  dt_module_train(model, 1);
  DT_CHECK_GOTO(dt_param_arena_create(model, &arena), st, cleanup);
  if (world > 1) {
    dt_comm_config cc = DT_COMM_CONFIG_DEFAULT;
    cc.timeout_s = cfg->comm_timeout;
    DT_CHECK_GOTO(dt_train_comm_config(cfg->comm_backend, &cc), st, cleanup);
    DT_CHECK_GOTO(dt_comm_create_for_device(cfg->pg, dev, &cc, &comm), st, cleanup);
    dt_ddp_config dc = DT_DDP_CONFIG_DEFAULT;
    dc.first_bucket_bytes = (size_t)(cfg->first_bucket_mb * DT_MIB);
    dc.bucket_bytes = (size_t)(cfg->bucket_cap_mb * DT_MIB);
    if (dc.first_bucket_bytes < 4)
      dc.first_bucket_bytes = 4;
    if (dc.bucket_bytes < 4)
      dc.bucket_bytes = 4;
    DT_CHECK_GOTO(dt_ddp_create(model, arena, comm, &dc, &ddp), st, cleanup);
  }
  if (!strcmp(cfg->optimizer, "sgd")) {
    dt_sgd_config sgd = DT_SGD_CONFIG_DEFAULT;
    sgd.lr = 0.01f;
    sgd.momentum = 0.9f;
    DT_CHECK_GOTO(dt_optim_sgd_create(arena, &sgd, &opt), st, cleanup);
  } else if (!strcmp(cfg->optimizer, "adamw")) {
    dt_adamw_config adamw = DT_ADAMW_CONFIG_DEFAULT;
    DT_CHECK_GOTO(dt_optim_adamw_create(arena, &adamw, &opt), st, cleanup);
  } else {
    st = DT_ERROR(DT_ERR_INVALID_ARG, "unknown optimizer '%s': expected sgd or adamw",
                  cfg->optimizer);
    goto cleanup;
  }
  /* Each rank its own batch, as in data-parallel training. */
  DT_CHECK_GOTO(make_batch(cfg->batch, cfg->seed + (uint64_t)rank, dev, &x, &y), st, cleanup);

  phase_times warm, timed;
  memset(&warm, 0, sizeof warm);
  memset(&timed, 0, sizeof timed);
  for (int i = 0; i < cfg->warmup; i++)
    DT_CHECK_GOTO(train_step(model, opt, ddp, be, dev, x, y, &warm, NULL), st, cleanup);
  DT_CHECK_GOTO(dt_memory_reset_peak(dev), st, cleanup);
  if (comm)
    DT_CHECK_GOTO(dt_comm_barrier_sync(comm), st, cleanup);
  double t0 = now_seconds();
  for (int i = 0; i < cfg->steps; i++)
    DT_CHECK_GOTO(train_step(model, opt, ddp, be, dev, x, y, &timed,
                             i + 1 == cfg->steps ? &r.final_loss : NULL),
                  st, cleanup);
  if (comm)
    DT_CHECK_GOTO(dt_comm_barrier_sync(comm), st, cleanup);
  r.seconds = now_seconds() - t0;

  dt_memory_stats ms;
  memset(&ms, 0, sizeof ms);
  if (dt_memory_stats_get(dev, &ms) == DT_OK)
    r.peak_mib = (double)ms.peak_allocated / DT_MIB;
  r.parameters = dt_module_parameter_count(model);
  r.steps_per_s = cfg->steps / r.seconds;
  r.samples_per_s = r.steps_per_s * cfg->batch * world;
  r.world = world;
  r.device = dev;
  if (ddp) {
    const char *name = dt_comm_backend_name(comm);
    snprintf(r.comm, sizeof r.comm, "%s",
             dev.type != DT_DEVICE_CPU && strcmp(name, "nccl") != 0 ? "mpi (host-staged)" : name);
    r.buckets = dt_ddp_num_buckets(ddp);
    r.allreduce_ms = 1e3 * timed.allreduce / cfg->steps;
    r.overlapped_ms = 1e3 * timed.overlapped / cfg->steps;
    r.exposed_ms = 1e3 * timed.exposed / cfg->steps;
    r.grad_mib = (double)dt_param_arena_numel(arena) * sizeof(float) / DT_MIB;
  }
  r.ms_per_step = 1e3 * r.seconds / cfg->steps;
  r.forward_ms = 1e3 * timed.forward / cfg->steps;
  r.backward_ms = 1e3 * timed.backward / cfg->steps;
  r.optimizer_ms = 1e3 * timed.optimizer / cfg->steps;
  if (out)
    *out = r;
cleanup:
  dt_tensor_release(y);
  dt_tensor_release(x);
  dt_ddp_destroy(ddp);
  dt_comm_destroy(comm);
  dt_optim_destroy(opt);
  dt_param_arena_destroy(arena);
  dt_module_destroy(model);
  return st;
}

int dt_cli_bench(int argc, char **argv, dt_pg *pg, FILE *err) {
  dt_bench_config cfg = dt_bench_config_default();
  const char *default_backend = dt_cli_comm_backend_default();
  const char *comm_backend = default_backend; /* cfg gets it only when given */
  dt_flag flags[] = {
      dt_cli_flag_model(&cfg.model),
      {.name = "batch",
       .type = DT_FLAG_INT,
       .target = &cfg.batch,
       .metavar = "N",
       .help = "batch size (per rank under a launcher)",
       .min = 1},
      {.name = "steps",
       .type = DT_FLAG_INT,
       .target = &cfg.steps,
       .metavar = "N",
       .help = "timed training steps",
       .min = 1},
      {.name = "warmup",
       .type = DT_FLAG_INT,
       .target = &cfg.warmup,
       .metavar = "N",
       .help = "untimed warm-up steps"},
      dt_cli_flag_optimizer(&cfg.optimizer,
                            "optimizer (sgd: lr 0.01, momentum 0.9; adamw: lr 1e-3)"),
      dt_cli_flag_threads(&cfg.threads),
      dt_cli_flag_device(&cfg.device),
      dt_cli_flag_seed(&cfg.seed, "seed for the model and the synthetic batch"),
      dt_cli_flag_comm_timeout(&cfg.comm_timeout),
      dt_cli_flag_bucket_cap_mb(&cfg.bucket_cap_mb),
      dt_cli_flag_first_bucket_mb(&cfg.first_bucket_mb),
      dt_cli_flag_comm_backend(&comm_backend),
  };
  dt_flag_set set = {
      .command = "bench",
      .usage = "bench [flags]",
      .about =
          "Times training steps (forward, cross-entropy, backward, optimizer) on one\n"
          "synthetic batch, after untimed warm-up steps, and prints\n"
          "  steps_per_s=... samples_per_s=... ms_per_step=...\n"
          "  breakdown: forward_ms=... backward_ms=... optimizer_ms=... peak_mem=... loss=...\n"
          "Under a launcher (dtrain launch -n N -- bench ...) every rank runs --batch\n"
          "samples per step through a DDP reducer and samples_per_s counts all ranks; a\n"
          "line\n"
          "  ddp: world N, per-rank batch B, global batch ..., K buckets (... MiB) over ...\n"
          "names the reducer, and the line\n"
          "  comm: allreduce_ms=... overlapped_ms=... hidden=...% exposed_ms=... (per step)\n"
          "carries the all-reduce time per step, the part of it the overlap with backward\n"
          "hid, and the part the step waited for.",
      .epilogue = "example: dtrain launch -n 2 --threads 1 -- bench --model mlp --batch 128",
      .flags = flags,
      .nflags = (int)(sizeof flags / sizeof flags[0]),
  };
  switch (dt_flags_parse(&set, argc, argv, err, NULL)) {
    case DT_FLAGS_OK: break;
    case DT_FLAGS_HELP: dt_flags_print_help(&set, stdout); return 0;
    case DT_FLAGS_ERROR: return 2;
  }
  if (dt_cli_check_env() != DT_OK)
    return 1;
  cfg.comm_backend = comm_backend != default_backend ? comm_backend : NULL;
  cfg.pg = pg;
  int rank = pg ? dt_pg_rank(pg) : 0;

  dt_bench_result r;
  dt_status st = dt_bench_run(&cfg, &r);
  if (st != DT_OK)
    return 1; /* the caller prints dt_last_error() with the rank */
  if (rank != 0)
    return 0;
  char dev[32];
  printf(
      "dtrain bench: model %s (%lld parameters) batch %d steps %d warmup %d optimizer %s "
      "device %s threads %d\n",
      cfg.model, (long long)r.parameters, cfg.batch, cfg.steps, cfg.warmup, cfg.optimizer,
      dt_device_format(r.device, dev, sizeof dev), dt_cpu_num_threads());
  if (r.world > 1)
    printf(
        "ddp: world %d, per-rank batch %d, global batch %d, %d buckets (%.2f MiB of gradients) "
        "over %s\n",
        r.world, cfg.batch, r.world * cfg.batch, r.buckets, r.grad_mib, r.comm);
  printf("steps_per_s=%.2f samples_per_s=%.1f ms_per_step=%.3f\n", r.steps_per_s, r.samples_per_s,
         r.ms_per_step);
  printf(
      "breakdown: forward_ms=%.3f backward_ms=%.3f optimizer_ms=%.3f peak_mem=%.1fMiB "
      "loss=%.4f\n",
      r.forward_ms, r.backward_ms, r.optimizer_ms, r.peak_mib, r.final_loss);
  if (r.world > 1)
    printf("comm: allreduce_ms=%.3f overlapped_ms=%.3f hidden=%.0f%% exposed_ms=%.3f (per step)\n",
           r.allreduce_ms, r.overlapped_ms,
           r.allreduce_ms > 0 ? 100.0 * r.overlapped_ms / r.allreduce_ms : 0.0, r.exposed_ms);
  return 0;
}
