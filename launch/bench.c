#include "launch/bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/memory.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/rng.h"
#include "launch/flags.h"
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
  DT_CHECK_GOTO(dt_tensor_from_host(xs, xshape, 4, DT_DTYPE_F32, dev, x), done);
  DT_CHECK_GOTO(dt_tensor_from_host(ys, yshape, 1, DT_DTYPE_I32, dev, y), done);
done:
  free(ys);
  free(xs);
  return st;
}

typedef struct phase_times {
  double forward, backward, optimizer;
} phase_times;

/* One training step; adds each phase's time to *t. */
static dt_status train_step(dt_module *model, dt_optimizer *opt, const dt_backend_ops *be,
                            dt_device dev, dt_tensor *x, dt_tensor *y, phase_times *t,
                            double *loss_value) {
  dt_status st;
  dt_tensor *logits = NULL, *loss = NULL;
  double t0 = now_seconds();
  DT_CHECK_GOTO(dt_optim_zero_grad(opt), done);
  double t1 = now_seconds();
  DT_CHECK_GOTO(dt_module_call(model, x, &logits), done);
  DT_CHECK_GOTO(dt_op_cross_entropy(logits, y, DT_REDUCTION_MEAN, -100, &loss), done);
  DT_CHECK_GOTO(be->device_synchronize(dev), done);
  double t2 = now_seconds();
  DT_CHECK_GOTO(dt_backward(loss, NULL), done);
  DT_CHECK_GOTO(be->device_synchronize(dev), done);
  double t3 = now_seconds();
  DT_CHECK_GOTO(dt_optim_step(opt), done);
  DT_CHECK_GOTO(be->device_synchronize(dev), done);
  double t4 = now_seconds();
  t->forward += t2 - t1;
  t->backward += t3 - t2;
  t->optimizer += (t4 - t3) + (t1 - t0);
  if (loss_value)
    DT_CHECK_GOTO(dt_tensor_item(loss, 0, loss_value), done);
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
  dt_tensor *x = NULL, *y = NULL;
  dt_bench_result r;
  memset(&r, 0, sizeof r);

  if (cfg->batch < 1 || cfg->steps < 1 || cfg->warmup < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "batch (%d) and steps (%d) must be >= 1, warmup (%d) >= 0",
                    cfg->batch, cfg->steps, cfg->warmup);
  DT_CHECK(dt_device_parse(cfg->device, &dev));
  DT_CHECK(dt_backend_get(dev, &be));
  if (cfg->threads > 0)
    dt_cpu_set_num_threads(cfg->threads);

  DT_CHECK(dt_model_create(cfg->model, cfg->seed, &model));
  DT_CHECK_GOTO(dt_module_to(model, dev), cleanup);
  dt_module_train(model, 1);
  DT_CHECK_GOTO(dt_param_arena_create(model, &arena), cleanup);
  if (!strcmp(cfg->optimizer, "sgd")) {
    dt_sgd_config sgd = DT_SGD_CONFIG_DEFAULT;
    sgd.lr = 0.01f;
    sgd.momentum = 0.9f;
    DT_CHECK_GOTO(dt_optim_sgd_create(arena, &sgd, &opt), cleanup);
  } else if (!strcmp(cfg->optimizer, "adamw")) {
    dt_adamw_config adamw = DT_ADAMW_CONFIG_DEFAULT;
    DT_CHECK_GOTO(dt_optim_adamw_create(arena, &adamw, &opt), cleanup);
  } else {
    st = DT_ERROR(DT_ERR_INVALID_ARG, "unknown optimizer '%s': expected sgd or adamw",
                  cfg->optimizer);
    goto cleanup;
  }
  DT_CHECK_GOTO(make_batch(cfg->batch, cfg->seed, dev, &x, &y), cleanup);

  phase_times warm = {0, 0, 0}, timed = {0, 0, 0};
  for (int i = 0; i < cfg->warmup; i++)
    DT_CHECK_GOTO(train_step(model, opt, be, dev, x, y, &warm, NULL), cleanup);
  DT_CHECK_GOTO(dt_memory_reset_peak(dev), cleanup);
  double t0 = now_seconds();
  for (int i = 0; i < cfg->steps; i++)
    DT_CHECK_GOTO(
        train_step(model, opt, be, dev, x, y, &timed, i + 1 == cfg->steps ? &r.final_loss : NULL),
        cleanup);
  r.seconds = now_seconds() - t0;

  dt_memory_stats ms;
  memset(&ms, 0, sizeof ms);
  if (dt_memory_stats_get(dev, &ms) == DT_OK)
    r.peak_mib = (double)ms.peak_allocated / (1024.0 * 1024.0);
  r.parameters = dt_module_parameter_count(model);
  r.steps_per_s = cfg->steps / r.seconds;
  r.samples_per_s = r.steps_per_s * cfg->batch;
  r.ms_per_step = 1e3 * r.seconds / cfg->steps;
  r.forward_ms = 1e3 * timed.forward / cfg->steps;
  r.backward_ms = 1e3 * timed.backward / cfg->steps;
  r.optimizer_ms = 1e3 * timed.optimizer / cfg->steps;
  if (out)
    *out = r;
cleanup:
  dt_tensor_release(y);
  dt_tensor_release(x);
  dt_optim_destroy(opt);
  dt_param_arena_destroy(arena);
  dt_module_destroy(model);
  return st;
}

int dt_cli_bench(int argc, char **argv) {
  dt_bench_config cfg = dt_bench_config_default();
  dt_flag flags[] = {
      {"model", DT_FLAG_STRING, &cfg.model, "NAME", "model: mlp (784-512-512-10) or lenet", 0,
       NULL},
      {"batch", DT_FLAG_INT, &cfg.batch, "N", "batch size", 1, NULL},
      {"steps", DT_FLAG_INT, &cfg.steps, "N", "timed training steps", 1, NULL},
      {"warmup", DT_FLAG_INT, &cfg.warmup, "N", "untimed warm-up steps", 0, NULL},
      {"optimizer", DT_FLAG_STRING, &cfg.optimizer, "NAME",
       "sgd (lr 0.01, momentum 0.9) or adamw (lr 1e-3)", 0, "sgd|adamw"},
      {"threads", DT_FLAG_INT, &cfg.threads, "N", "CPU threads, 0 = all available cores", 0, NULL},
      {"device", DT_FLAG_STRING, &cfg.device, "DEV", "cpu, cpu:N or cuda:N", 0, NULL},
      {"seed", DT_FLAG_U64, &cfg.seed, "N", "seed for the model and the synthetic batch", 0, NULL},
  };
  int nflags = (int)(sizeof flags / sizeof flags[0]);
  switch (dt_flags_parse("bench", flags, nflags, argc, argv, stderr)) {
    case DT_FLAGS_OK: break;
    case DT_FLAGS_HELP:
      printf(
          "usage: dtrain bench [flags]\n\n"
          "Times training steps (forward, cross-entropy, backward, optimizer) on one\n"
          "synthetic batch, after untimed warm-up steps, and prints\n"
          "steps_per_s=... samples_per_s=... ms_per_step=...\n\nflags:\n");
      dt_flags_print(flags, nflags, stdout);
      return 0;
    case DT_FLAGS_ERROR: return 2;
  }

  dt_bench_result r;
  dt_status st = dt_bench_run(&cfg, &r);
  if (st != DT_OK) {
    fprintf(stderr, "dtrain: error: %s\n", dt_last_error());
    return 1;
  }
  printf(
      "dtrain bench: model %s (%lld parameters) batch %d steps %d warmup %d optimizer %s "
      "device %s threads %d\n",
      cfg.model, (long long)r.parameters, cfg.batch, cfg.steps, cfg.warmup, cfg.optimizer,
      cfg.device, dt_cpu_num_threads());
  printf("steps_per_s=%.2f samples_per_s=%.1f ms_per_step=%.3f\n", r.steps_per_s, r.samples_per_s,
         r.ms_per_step);
  printf(
      "breakdown: forward_ms=%.3f backward_ms=%.3f optimizer_ms=%.3f peak_mem=%.1fMiB "
      "loss=%.4f\n",
      r.forward_ms, r.backward_ms, r.optimizer_ms, r.peak_mib, r.final_loss);
  return 0;
}
