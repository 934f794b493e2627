// Model FLOPs utilisation (train/mfu.h): the FLOPs a GPT-2 task counts per
// token against the matmuls of the model it builds, and the CPU roof the
// MFU is taken against: how it is made of timed runs (a run that lost its
// cores to other work counts at its CPU-time rate), its sanity on this
// machine, and an MFU that is never reported above 100 %.
#include "train/mfu.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "core/cpu.h"
#include "core/device.h"
#include "cuda/cuda.h"
#include "models/models.h"
#include "models/tasks.h"
#include "tests/dt_assert.h"

namespace {

// Training FLOPs per token counted from the model's own tensors: each 2-D
// weight is a matmul over every token (2 x in x out forward, twice that
// backward), the tied embedding once as the LM head; the attention's two
// T x T products 12 L T C (forward and backward, the full square). What
// the 6 N formula adds beyond that (biases, norms, the position table)
// must stay small.
double counted_flops_per_token(const dt_task *task, int64_t T) {
  dt_module *m = nullptr;
  EXPECT_EQ(task->build(task, 0, &m), DT_OK) << dt_last_error();
  if (!m)
    return 0.0;
  double flops = 0.0;
  int64_t C = 0, layers = 0;
  for (int i = 0; i < dt_module_num_parameters(m); i++) {
    const char *name = nullptr;
    dt_tensor *p = dt_module_parameter_at(m, i, &name);
    std::string n = name;
    if (n == "wpe.weight" || dt_tensor_ndim(p) != 2)
      continue; /* a lookup table, biases and norms: no matmul */
    flops += 6.0 * (double)dt_tensor_numel(p);
    if (n == "wte.weight")
      C = dt_tensor_dim(p, 1);
    if (n.find(".attn.c_attn.weight") != std::string::npos)
      layers++;
  }
  dt_module_destroy(m);
  return flops + 12.0 * (double)layers * (double)T * (double)C;
}

TEST(Mfu, Gpt2FlopsPerTokenAreTheModelsMatmuls) {
  // gpt2 (124M) is counted by the formula only: building it takes a minute here.
  for (const char *name : {"gpt2-tiny", "gpt2"}) {
    const dt_task *table = nullptr;
    ASSERT_DT_OK(dt_task_find(name, &table));
    for (int64_t T : {(int64_t)16, table->max_context}) {
      dt_task task;
      ASSERT_DT_OK(dt_task_with_context(table, T, &task));
      dt_gpt2_config cfg;
      ASSERT_DT_OK(dt_gpt2_config_named(name, &cfg));
      cfg.block_size = (int)T; /* --ctx: the position table has T rows */
      double per_token = dt_gpt2_flops_per_token(&cfg, T);
      EXPECT_DOUBLE_EQ(task.flops_per_sample(&task), (double)T * per_token) << name << " T " << T;
      if (std::strcmp(name, "gpt2-tiny") != 0)
        continue;
      double counted = counted_flops_per_token(&task, T);
      EXPECT_NEAR(per_token / counted, 1.0, 0.01) << name << " T " << T;
      EXPECT_GT(per_token, counted) << "6 N counts every parameter: at least the matmuls";
    }
  }
  dt_gpt2_config tiny;
  ASSERT_DT_OK(dt_gpt2_config_named("gpt2-tiny", &tiny));
  EXPECT_NEAR(dt_gpt2_flops_per_token(&tiny, 64), 43.8e6, 0.05e6) << "the README's figure";
}

TEST(Mfu, RoofOfRunsCountsAPreemptedRunAtItsCpuTimeRate) {
  const double flops = 2e9;
  // Quiet: 2 threads busy the whole 20 ms (40 ms of CPU time): 100 GFLOP/s.
  double wall_quiet[] = {0.020}, cpu_quiet[] = {0.040};
  EXPECT_DOUBLE_EQ(dt_mfu_roof_of_runs(flops, wall_quiet, cpu_quiet, 1, 2), 100e9);
  // Other work held the cores half the time: 40 ms of wall, still 40 ms
  // of CPU time: the cores' rate when they ran, 100 GFLOP/s, not 50.
  double wall_busy[] = {0.040}, cpu_busy[] = {0.040};
  EXPECT_DOUBLE_EQ(dt_mfu_roof_of_runs(flops, wall_busy, cpu_busy, 1, 2), 100e9);
  // Another thread of the process ran meanwhile (more CPU time than the
  // threads could use): the wall-clock rate stands.
  double wall_extra[] = {0.020}, cpu_extra[] = {0.080};
  EXPECT_DOUBLE_EQ(dt_mfu_roof_of_runs(flops, wall_extra, cpu_extra, 1, 2), 100e9);
  // The best run; no CPU times; no time at all.
  double wall[] = {0.040, 0.025, 0.020, 0.030};
  EXPECT_DOUBLE_EQ(dt_mfu_roof_of_runs(flops, wall, nullptr, 4, 2), 100e9);
  double none[] = {0.0};
  EXPECT_EQ(dt_mfu_roof_of_runs(flops, none, none, 1, 2), 0.0);
}

TEST(Mfu, CpuRoofIsAMeasurementAtTheRunsThreadCount) {
  for (int threads : {1, 2}) {
    dt_cpu_set_num_threads(threads);
    dt_peak_flops peak;
    ASSERT_DT_OK(dt_mfu_peak(DT_CPU, DT_PRECISION_DEVICE_DEFAULT, nullptr, &peak));
    char want[64];
    std::snprintf(want, sizeof want, "%d threads (measured)", threads);
    EXPECT_NE(std::strstr(peak.source, want), nullptr) << peak.source;
    // Some GFLOP/s, and below what any x86 core can do: 64 f32 FLOP per
    // cycle (two 512-bit FMA units) at 6 GHz.
    EXPECT_GT(peak.flops, 1e9) << peak.source;
    EXPECT_LT(peak.flops, threads * 64.0 * 6e9) << peak.source;
  }
}

TEST(Mfu, IsNeverReportedAboveOneHundredPercent) {
  dt_cpu_set_num_threads(1);
  dt_mfu mfu;
  dt_mfu_cache cache = {0.0, 0};  // the run's: the roof is measured once, kept here
  const dt_precision p = DT_PRECISION_DEVICE_DEFAULT;
  ASSERT_DT_OK(dt_mfu_of(DT_CPU, p, &cache, 0.0, &mfu));
  double roof = mfu.peak.flops;
  ASSERT_GT(roof, 0.0);
  ASSERT_DT_OK(dt_mfu_of(DT_CPU, p, &cache, 0.5 * roof, &mfu));
  EXPECT_FALSE(mfu.above_roof);
  EXPECT_GT(mfu.value, 0.0);
  EXPECT_LE(mfu.value, 0.5 + 1e-12);
  // Far above any roof: measured again, still above, so no number.
  ASSERT_DT_OK(dt_mfu_of(DT_CPU, p, &cache, 1e6 * roof, &mfu));
  EXPECT_TRUE(mfu.above_roof);
  EXPECT_EQ(mfu.value, -1.0);
  EXPECT_GE(mfu.peak.flops, roof) << "a roof measured again keeps the higher value";
}

}  // namespace

namespace {

// On a GPU the peak follows the run's precision: bf16 and fp16 the dense
// 16-bit tensor-core figure, fp32 plain f32, tf32 TF32 (train/mfu.h).
TEST(Mfu, GpuPeakFollowsThePrecision) {
  dt_cuda_device_info info;
  if (dt_cuda_get_device_info(0, &info) != DT_OK) {
    std::string why = dt_last_error();
    dt_clear_error();
    GTEST_SKIP() << "no CUDA device: " << why;
  }
  if (dt_mfu_gpu_peak(info.name, "bf16") <= 0.0)
    GTEST_SKIP() << info.name << " is not in the peak table";
  const struct {
    const char *precision, *column;
  } cases[] = {{"bf16", "bf16"}, {"fp16", "bf16"}, {"fp32", "f32"}, {"tf32", "tf32"}};
  for (const auto &c : cases) {
    dt_peak_flops peak;
    dt_precision p;
    ASSERT_DT_OK(dt_precision_parse(c.precision, &p));
    ASSERT_DT_OK(dt_mfu_peak((dt_device){DT_DEVICE_CUDA, 0}, p, nullptr, &peak));
    EXPECT_EQ(peak.flops, dt_mfu_gpu_peak(info.name, c.column)) << c.precision;
    EXPECT_NE(std::strstr(peak.source, c.column), nullptr) << peak.source;
  }
}

}  // namespace
