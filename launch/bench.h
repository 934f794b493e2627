/* `dtrain bench`: training-step throughput on synthetic data.
 *
 * Builds a model, one fixed batch of random inputs (N(0,1), the model's
 * input shape) and random labels on the device, runs `warmup` untimed
 * training steps, then times `steps` steps of zero_grad, forward,
 * cross-entropy, backward and optimizer update. The per-phase times come
 * from device synchronisations at phase boundaries (free on the CPU).
 * tools/bench_torch.py runs the same benchmark in PyTorch.
 */
#ifndef DT_LAUNCH_BENCH_H
#define DT_LAUNCH_BENCH_H

#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_bench_config {
  const char *model;     /* "mlp", "lenet" */
  const char *optimizer; /* "sgd" (lr 0.01, momentum 0.9) or "adamw" (lr 1e-3) */
  const char *device;    /* "cpu", "cuda:0" */
  int batch;
  int steps;   /* timed steps */
  int warmup;  /* untimed steps before */
  int threads; /* CPU threads, 0 = default */
  uint64_t seed;
} dt_bench_config;

/* mlp, sgd, cpu, batch 128, 100 steps, 10 warm-up, default threads, seed 0 */
dt_bench_config dt_bench_config_default(void);

typedef struct dt_bench_result {
  int64_t parameters;
  double seconds; /* timed steps only */
  double steps_per_s;
  double samples_per_s;
  double ms_per_step;
  double forward_ms;   /* per step: forward + loss */
  double backward_ms;  /* per step */
  double optimizer_ms; /* per step: zero_grad + update */
  double peak_mib;     /* peak device memory during the timed steps */
  double final_loss;
} dt_bench_result;

dt_status dt_bench_run(const dt_bench_config *cfg, dt_bench_result *out);

/* The `dtrain bench` subcommand: argv holds the arguments after "bench".
 * Returns the process exit status (0, 1 on a runtime error, 2 on bad flags). */
int dt_cli_bench(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
