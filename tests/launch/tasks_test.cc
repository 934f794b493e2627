// The task table (models/tasks.h): every registered task builds, takes the
// input shape it declares, gives one output per class, has a loss, a metric
// and data sets; `dtrain bench` runs a step of each, fed by the table alone.
#include "models/tasks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/cpu.h"
#include "core/step.h"
#include "launch/bench.h"
#include "models/models.h"
#include "tests/dt_assert.h"
#include "train/plan.h"

namespace {

class Tasks : public ::testing::Test {
 protected:
  void SetUp() override { dt_cpu_set_num_threads(1); }
};

// A batch of `n` inputs of the task's shape and dtype.
dt_tensor *task_input(const dt_task *t, int64_t n) {
  std::vector<int64_t> shape = {n};
  int64_t numel = n;
  for (int i = 0; i < t->input_ndim; i++) {
    shape.push_back(t->input_shape[i]);
    numel *= t->input_shape[i];
  }
  std::vector<float> f(static_cast<size_t>(numel));
  std::vector<int64_t> ids(static_cast<size_t>(numel));
  for (size_t i = 0; i < f.size(); i++) {
    f[i] = static_cast<float>((i * 2654435761u) % 1000u) / 1000.0f;
    ids[i] = t->input_range > 0 ? static_cast<int64_t>(i % static_cast<size_t>(t->input_range)) : 0;
  }
  std::vector<int32_t> ids32(ids.begin(), ids.end());
  const void *data = t->input_dtype == DT_DTYPE_F32   ? static_cast<const void *>(f.data())
                     : t->input_dtype == DT_DTYPE_I32 ? static_cast<const void *>(ids32.data())
                                                      : static_cast<const void *>(ids.data());
  dt_tensor *x = nullptr;
  EXPECT_EQ(dt_tensor_from_host(data, shape.data(), static_cast<int>(shape.size()), t->input_dtype,
                                DT_CPU, &x),
            DT_OK)
      << dt_last_error();
  return x;
}

TEST_F(Tasks, TheTableIsWellFormed) {
  ASSERT_GT(dt_task_count(), 0);
  EXPECT_EQ(dt_task_at(dt_task_count()), nullptr);
  for (int i = 0; i < dt_task_count(); i++) {
    const dt_task *t = dt_task_at(i);
    ASSERT_NE(t, nullptr);
    SCOPED_TRACE(t->name);
    const dt_task *found = nullptr;
    ASSERT_DT_OK(dt_task_find(t->name, &found));
    EXPECT_EQ(found, t) << "task names are unique";
    EXPECT_NE(t->build, nullptr);
    EXPECT_NE(t->loss, nullptr);
    EXPECT_NE(t->eval_split, nullptr);
    if (t->result == DT_TASK_RESULT_METRIC) {
      EXPECT_NE(t->metric, nullptr);
      EXPECT_NE(t->metric_name, nullptr);
    }
    if (t->sequence_targets || t->tokenizer) {
      EXPECT_GT(t->max_context, 0) << "sequence targets and text need a sequence input";
      EXPECT_EQ(t->input_ndim, 1);
      EXPECT_EQ(t->input_shape[0], t->max_context);
    }
    EXPECT_GE(t->input_ndim, 1);
    EXPECT_LE(t->input_ndim, DT_TASK_MAX_DIMS);
    EXPECT_GE(t->num_classes, 2);
    ASSERT_GE(t->n_data, 1);
    for (int d = 0; d < t->n_data; d++) {
      const dt_task_data *data = nullptr;
      ASSERT_DT_OK(dt_task_find_data(t, t->data[d].name, &data));
      EXPECT_EQ(data->num_classes, t->num_classes) << data->name;
      EXPECT_GT(data->std, 0.0f) << data->name;
      EXPECT_NE(data->open, nullptr) << data->name;
    }
  }
  const dt_task *none = nullptr;
  EXPECT_EQ(dt_task_find("resnet101", &none), DT_ERR_INVALID_ARG);
  char names[256];
  EXPECT_NE(std::string(dt_last_error()).find(dt_task_names(", ", names, sizeof names)),
            std::string::npos)
      << "the error lists the known models: " << dt_last_error();
  const dt_task *first = dt_task_at(0);
  const dt_task_data *data = nullptr;
  EXPECT_EQ(dt_task_find_data(first, "imagenet", &data), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find(first->data[0].name), std::string::npos)
      << dt_last_error();
}

// Every task counts its training FLOPs (for MFU, or for the plan alone),
// so that `dtrain plan` never predicts a compute time of 0; a ResNet's at
// the task's image size: 6 per forward multiply-add, 4 for conv1's (its
// input needs no gradient).
TEST_F(Tasks, EveryTaskCountsItsFlops) {
  for (int i = 0; i < dt_task_count(); i++) {
    const dt_task *t = dt_task_at(i);
    double (*count)(const dt_task *) =
        t->flops_per_sample ? t->flops_per_sample : t->plan_flops_per_sample;
    ASSERT_NE(count, nullptr) << t->name << " has no FLOP count";
    EXPECT_GT(count(t), 0.0) << t->name;
  }
  const dt_task *table = nullptr;
  ASSERT_DT_OK(dt_task_find("resnet50", &table));
  dt_task imagenet = *table;  // 224x224 RGB, 1000 classes, as --image-size 224 --channels 3
  imagenet.input_shape[0] = 3;
  imagenet.input_shape[1] = imagenet.input_shape[2] = 224;
  imagenet.num_classes = 1000;
  const double stem = 112.0 * 112 * 64 * 3 * 49;
  EXPECT_NEAR(imagenet.plan_flops_per_sample(&imagenet), 6 * 4.089e9 - 2 * stem, 0.005 * 24.3e9);
  dt_resnet_config cfg;
  ASSERT_DT_OK(dt_resnet_config_named("resnet50", &cfg));
  EXPECT_DOUBLE_EQ(imagenet.plan_flops_per_sample(&imagenet),
                   6 * dt_resnet_forward_macs(&cfg, 224, 224, nullptr) - 2 * stem);

  // dtrain plan --model resnet18-small --device h100 --batch 32: the
  // compute term is the task's FLOPs at the bf16 peak (the probe's
  // measurements do not enter it).
  ASSERT_DT_OK(dt_task_find("resnet18-small", &table));
  dt_plan_config pc = DT_PLAN_CONFIG_DEFAULT;
  ASSERT_DT_OK(dt_plan_device_get(DT_PLAN_DEVICE_H100, nullptr, &pc.device));
  pc.task = table;
  pc.precision = DT_PRECISION_BF16;
  pc.micro_batch = 32;
  dt_plan_probe_result probe = {};
  probe.units_per_sample = 1.0;
  dt_plan_result plan;
  ASSERT_DT_OK(dt_plan_compute(&pc, &probe, &plan));
  double fps = table->plan_flops_per_sample(table);
  EXPECT_NEAR(fps, 6 * 455800832.0 - 2 * 784.0 * 64 * 9, 1.0);
  EXPECT_GT(plan.compute_s, 0.0);
  EXPECT_DOUBLE_EQ(plan.compute_s, fps * 32 / (plan.peak_flops * pc.device.matmul_eff));
  EXPECT_DOUBLE_EQ(plan.flops_per_step, fps * 32);
  EXPECT_GT(plan.mfu, 0.0);

  // The activations' traffic (4 passes) at act_bw when set (the CPU's copy
  // bandwidth at their size), else at the memory bandwidth.
  probe.traffic_per_unit = 1e6;
  ASSERT_DT_OK(dt_plan_compute(&pc, &probe, &plan));
  const dt_plan_device &d = pc.device;
  EXPECT_DOUBLE_EQ(plan.memory_s, 4 * 1e6 * 32 / (d.mem_bw * d.memory_eff));
  pc.device.act_bw = 4 * d.mem_bw;
  ASSERT_DT_OK(dt_plan_compute(&pc, &probe, &plan));
  EXPECT_DOUBLE_EQ(plan.memory_s, 4 * 1e6 * 32 / (pc.device.act_bw * d.memory_eff));

  // Communication, 4 x 8 GPUs, 100 M parameters (16 buckets of 25 MiB): a
  // ring pass is 31/32 of the bytes at the network's bandwidth plus the
  // tree's latency per bucket. ZeRO 0 all-reduces (two passes) behind the
  // backward; ZeRO 1 reduce-scatters (one pass, behind the backward) and
  // all-gathers the updated parameters, which only the later segments'
  // update hides.
  pc.gpus_per_node = 8, pc.nodes = 4;
  probe.parameters = 100e6;
  probe.optimizer_state = 8.0 * probe.parameters;
  double bytes = 4.0 * probe.parameters, buckets = ceil(bytes / (25.0 * DT_MIB));
  ASSERT_EQ(16, buckets);
  double pass = 31.0 / 32 * bytes / d.net_bw + buckets * 5 * d.latency;
  ASSERT_DT_OK(dt_plan_compute(&pc, &probe, &plan));
  double backward = 2.0 / 3.0 * (plan.compute_s + plan.memory_s);
  EXPECT_NEAR(plan.comm_s, 2 * pass, 1e-12);
  EXPECT_NEAR(plan.comm_exposed_s, std::max(2 * pass - backward, 2 * pass / buckets), 1e-12);
  pc.zero = 1;
  ASSERT_DT_OK(dt_plan_compute(&pc, &probe, &plan));
  double hidden = plan.optimizer_s * (buckets - 1) / buckets;
  EXPECT_NEAR(plan.comm_s, 2 * pass, 1e-12);
  EXPECT_NEAR(plan.comm_exposed_s,
              std::max(pass - backward, pass / buckets) + std::max(pass - hidden, pass / buckets),
              1e-12);
  EXPECT_GT(plan.comm_exposed_s, pass * 0.9) << "the all-gather waits after the update";
}

// The tasks small enough to build in a unit test, at a context short enough
// for a fast step (the language models' --ctx); of the ResNets, resnet18
// (models_test covers the others' layouts).
std::vector<dt_task> small_tasks() {
  std::vector<dt_task> tasks;
  for (int i = 0; i < dt_task_count(); i++) {
    const dt_task *t = dt_task_at(i);
    if (t->max_context > 0 && std::string(t->name) != "gpt2-tiny" &&
        std::string(t->name) != "llama-tiny")
      continue;
    if (t->residual_bn && std::string(t->name) != "resnet18")
      continue;
    dt_task small = *t;
    if (t->max_context == 0 || dt_task_with_context(t, 8, &small) == DT_OK)
      tasks.push_back(small);
  }
  return tasks;
}

// Each task's model takes a batch of the declared input and gives
// (batch, num_classes), or (batch, T, num_classes) for sequence targets;
// the task's loss of it is finite and backward gives every parameter a
// gradient; the metric counts at most one per sample.
TEST_F(Tasks, EveryTaskBuildsAndTakesItsInputShape) {
  for (const dt_task &small : small_tasks()) {
    const dt_task *t = &small;
    SCOPED_TRACE(t->name);
    dt_module *model = nullptr;
    ASSERT_DT_OK(t->build(t, 3, &model));
    dt_module *by_name = nullptr;
    ASSERT_DT_OK(dt_model_create(t->name, 3, &by_name));
    if (t->max_context == 0) {
      EXPECT_EQ(dt_module_parameter_count(by_name), dt_module_parameter_count(model));
    }
    dt_module_destroy(by_name);

    const int64_t n = 3;
    dt_tensor *x = task_input(t, n);
    ASSERT_NE(x, nullptr);
    int64_t per = t->sequence_targets ? t->input_shape[0] : 1;
    std::vector<int32_t> labels;
    for (int64_t k = 0; k < n * per; k++)
      labels.push_back(k % 3 == 0 ? 0 : k % 3 == 1 ? 1 : t->num_classes - 1);
    int64_t yshape[2] = {n, per};
    dt_tensor *y = nullptr, *out = nullptr, *loss = nullptr;
    ASSERT_DT_OK(dt_tensor_from_host(labels.data(), yshape, t->sequence_targets ? 2 : 1,
                                     DT_DTYPE_I32, DT_CPU, &y));
    ASSERT_DT_OK(dt_module_call(model, x, &out));
    ASSERT_EQ(dt_tensor_ndim(out), t->sequence_targets ? 3 : 2);
    EXPECT_EQ(dt_tensor_dim(out, 0), n);
    if (t->sequence_targets) {
      EXPECT_EQ(dt_tensor_dim(out, 1), per);
    }
    if (t->sequence_targets) {
      EXPECT_GE(dt_tensor_dim(out, -1), t->num_classes) << "the tokens, and maybe padding";
    } else {
      EXPECT_EQ(dt_tensor_dim(out, -1), t->num_classes);
    }
    ASSERT_DT_OK(t->loss(out, y, DT_REDUCTION_MEAN, &loss));
    double v = NAN;
    ASSERT_DT_OK(dt_tensor_item(loss, 0, &v));
    EXPECT_TRUE(std::isfinite(v));
    ASSERT_DT_OK(dt_backward(loss, nullptr));
    for (int p = 0; p < dt_module_num_parameters(model); p++)
      EXPECT_NE(dt_tensor_grad(dt_module_parameter_at(model, p, nullptr)), nullptr) << p;
    double metric = 0.0;
    if (t->metric)
      ASSERT_DT_OK(t->metric(out, y, &metric));
    EXPECT_GE(metric, 0.0);
    EXPECT_LE(metric, static_cast<double>(n));
    for (dt_tensor *u : {loss, out, y, x})
      dt_tensor_release(u);
    dt_module_destroy(model);
  }
}

// bench builds its synthetic batch from the task alone: one step of each.
TEST_F(Tasks, BenchRunsOneStepOfEveryTask) {
  for (const dt_task &small : small_tasks()) {
    const dt_task *t = &small;
    SCOPED_TRACE(t->name);
    dt_bench_config cfg = DT_BENCH_CONFIG_DEFAULT;
    cfg.model = t->name;
    cfg.ctx = t->max_context > 0 ? static_cast<int>(t->input_shape[0]) : 0;
    cfg.batch = 4;
    cfg.steps = 1;
    cfg.warmup = 0;
    cfg.threads = 1;
    dt_bench_result r;
    std::memset(&r, 0, sizeof r);
    ASSERT_DT_OK(dt_bench_run(&cfg, &r));
    EXPECT_GT(r.parameters, 0);
    EXPECT_TRUE(std::isfinite(r.final_loss));
    EXPECT_GT(r.final_loss, 0.0);
    EXPECT_GT(r.steps_per_s, 0.0);
  }
}

}  // namespace
