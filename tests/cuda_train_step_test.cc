// One training step on the GPU equals the same step on the CPU: MLP,
// LeNet-5 and GPT-2 (gpt2-tiny; the 124M gpt2 at T 1024 with TF32, the
// step tools/gpu_check.sh reports) built from the same seed, the same
// batch, forward + the task's loss + backward + SGD (momentum) on cpu and
// on cuda:0, then the loss, every gradient and every parameter compared,
// with TF32 off (exact f32 products on both sides) and tolerances by dtype. Also: the dropout op
// draws the same mask on both devices, bit for bit. Without a GPU every test skips with the reason
// dt_backend_get() gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/env.h"
#include "core/module.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/rng.h"
#include "core/status.h"
#include "core/tensor.h"
#include "cuda/cuda.h"
#include "models/models.h"
#include "models/tasks.h"
#include "tests/device_util.h"
#include "tests/test_util.h"

namespace {

using dtt::TensorRef;
using Vec = std::vector<float>;

// cuda:0, or the device named by DT_TRAIN_STEP_TEST_DEVICE (e.g. "cpu": a
// check of this harness itself, where both sides must agree exactly).
const dt_device kGpu = dtt::TestDevice(DT_ENV_TRAIN_STEP_TEST_DEVICE);

std::string NoGpuReason() { return dtt::NoDeviceReason(kGpu); }

// How far the GPU may be from the CPU reference, by the dtype the step runs
// in. Exact products (f32 with TF32 off) are held elementwise: `rtol`
// relative to each element plus `scale_atol` relative to the largest
// magnitude of the tensor (gradients of one layer span orders of magnitude,
// and the tiny ones are dominated by summation order, which differs between
// OpenBLAS and cuBLAS/cuDNN algorithms). Reduced-precision products (TF32,
// f16, bf16) are held by the relative L2 error of each tensor (`l2`), since
// single elements can cancel to nothing.
struct Tolerance {
  double rtol, scale_atol;
  double l2;  // > 0: compare ||got - want|| / ||want|| <= l2 instead
};

Tolerance ToleranceFor(dt_dtype dtype, bool tf32) {
  switch (dtype) {
    case DT_DTYPE_F16: return {0, 0, 1e-2};
    case DT_DTYPE_BF16: return {0, 0, 4e-2};
    default: return tf32 ? Tolerance{0, 0, 1e-2} : Tolerance{1e-3, 1e-4, 0};
  }
}

::testing::AssertionResult Close(const Vec &got, const Vec &want, Tolerance tol,
                                 const std::string &what) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << what << ": sizes " << got.size() << " vs " << want.size();
  if (tol.l2 > 0) {
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); i++) {
      double d = (double)got[i] - want[i];
      num += d * d;
      den += (double)want[i] * want[i];
    }
    double rel = std::sqrt(num) / (std::sqrt(den) + 1e-30);
    if (rel <= tol.l2)
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << what << ": relative L2 error " << rel << " > " << tol.l2;
  }
  double scale = 0.0;
  for (float w : want)
    scale = std::max(scale, (double)std::fabs(w));
  double atol = tol.scale_atol * scale + 1e-12;
  size_t bad = 0, worst = 0;
  double worst_excess = 0.0;
  for (size_t i = 0; i < got.size(); i++) {
    double g = got[i], w = want[i];
    double excess = std::fabs(g - w) - (atol + tol.rtol * std::fabs(w));
    if (!(excess <= 0.0)) {  // NaN counts as bad
      if (bad++ == 0 || !(excess <= worst_excess)) {
        worst_excess = excess;
        worst = i;
      }
    }
  }
  if (bad == 0)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << bad << " of " << got.size() << " elements differ; worst at " << worst
         << ": cuda " << got[worst] << " vs cpu " << want[worst] << " (rtol " << tol.rtol
         << ", atol " << atol << " = " << tol.scale_atol << " x max|cpu| " << scale << ")";
}

#define OK(expr) ASSERT_EQ(DT_OK, (expr)) << dt_last_error()

// A model with its arena and SGD optimizer on one device.
struct Trainer : dtt::SgdModel {
  dt_device dev = DT_CPU;
};

void MakeTrainer(const dt_task *task, uint64_t seed, dt_device dev, Trainer *t) {
  t->dev = dev;
  OK(task->build(task, seed, &t->model));
  OK(dt_module_to(t->model, dev));
  dt_module_train(t->model, 1);
  OK(dtt::AttachSgd(t, 0.05f, 0.9f, 1e-4f));
}

// A batch of the task's input, as `dtrain bench` makes it: images
// (batch,1,28,28) ~ N(0,1) and labels in [0,10), or token ids (batch, T) in
// [0, vocab) and next-token targets (batch, T).
struct Batch {
  Vec x;                     // images
  std::vector<int64_t> ids;  // tokens
  std::vector<int64_t> y;
  std::vector<int64_t> x_shape, y_shape;
};

void MakeBatch(const dt_task *task, int batch, uint64_t seed, Batch *b) {
  dt_generator g;
  dt_generator_init(&g, seed);
  if (task->max_context > 0) {
    int64_t T = task->input_shape[0];
    b->ids.resize((size_t)(batch * T));
    b->y.resize(b->ids.size());
    for (size_t i = 0; i < b->ids.size(); i++) {
      b->ids[i] = (int64_t)dt_generator_below(&g, (uint64_t)task->input_range);
      b->y[i] = (int64_t)dt_generator_below(&g, (uint64_t)task->num_classes);
    }
    b->x_shape = {batch, T};
    b->y_shape = {batch, T};
    return;
  }
  b->x.resize((size_t)batch * 28 * 28);
  for (float &v : b->x)
    v = dt_generator_normal(&g);
  b->y.resize(batch);
  for (int64_t &v : b->y)
    v = (int64_t)dt_generator_below(&g, 10);
  b->x_shape = {batch, 1, 28, 28};
  b->y_shape = {batch};
}

// zero_grad, forward, the task's loss (mean), backward.
void Step(Trainer *t, const dt_task *task, const Batch &b, double *loss_out) {
  TensorRef x(b.ids.empty() ? dtt::MakeTensor(b.x, b.x_shape, false, t->dev)
                            : dtt::MakeIndexTensor(b.ids, b.x_shape, DT_DTYPE_I32, t->dev));
  TensorRef y(dtt::MakeIndexTensor(b.y, b.y_shape, DT_DTYPE_I32, t->dev));
  ASSERT_TRUE(x && y) << dt_last_error();
  OK(dt_optim_zero_grad(t->opt));
  dt_tensor *logits = nullptr, *loss = nullptr;
  OK(dt_module_call(t->model, x.get(), &logits));
  TensorRef logits_ref(logits);
  OK(task->loss(logits, y.get(), DT_REDUCTION_MEAN, &loss));
  TensorRef loss_ref(loss);
  OK(dt_backward(loss, nullptr));
  OK(dt_tensor_item(loss, 0, loss_out));
}

// The flat parameters (or gradients) of a trainer, on the host.
Vec Flat(const Trainer &t, bool grads) {
  return dtt::ToVector(grads ? dt_param_arena_grads(t.arena) : dt_param_arena_data(t.arena));
}

// Compares one flat buffer parameter by parameter, naming the first that
// differs.
void ExpectSameByParameter(const Trainer &cpu, const Vec &got, const Vec &want, Tolerance tol,
                           const std::string &what) {
  ASSERT_EQ(got.size(), want.size());
  int n = dt_param_arena_count(cpu.arena);
  for (int i = 0; i < n; i++) {
    const char *name = nullptr;
    dt_tensor *p = dt_param_arena_param(cpu.arena, i, &name);
    int64_t off = dt_param_arena_offset(cpu.arena, i), len = dt_tensor_numel(p);
    Vec g(got.begin() + off, got.begin() + off + len),
        w(want.begin() + off, want.begin() + off + len);
    EXPECT_TRUE(Close(g, w, tol, what + " of " + name));
  }
}

class CudaTrainStep : public ::testing::TestWithParam<const char *> {
 protected:
  void SetUp() override {
    std::string reason = NoGpuReason();
    if (!reason.empty())
      GTEST_SKIP() << "no CUDA device: " << reason;
    if (kGpu.type != DT_DEVICE_CUDA)
      std::fprintf(stderr, "DT_TRAIN_STEP_TEST_DEVICE: comparing the CPU with %s\n",
                   dt_env_raw(DT_ENV_TRAIN_STEP_TEST_DEVICE));
    dt_cuda_set_tf32(0);
  }
  void TearDown() override { dt_cuda_set_tf32(1); }

  // Runs `steps` steps on both devices and compares after each.
  // A language model runs at context `ctx` (0: its own); a ResNet
  // channels-last with `channels_last`.
  void RunAndCompare(const char *model, int steps, bool tf32, int batch = 0, int ctx = 16,
                     bool channels_last = false) {
    dt_cuda_set_tf32(tf32 ? 1 : 0);
    const uint64_t seed = 1234;
    const dt_task *found = nullptr;
    OK(dt_task_find(model, &found));
    dt_task at_ctx = *found;
    if (found->max_context > 0 && ctx > 0) {
      OK(dt_task_with_context(found, ctx, &at_ctx));
    }
    at_ctx.channels_last = channels_last;
    const dt_task *task = &at_ctx;
    Trainer cpu, gpu;
    ASSERT_NO_FATAL_FAILURE(MakeTrainer(task, seed, DT_CPU, &cpu));
    ASSERT_NO_FATAL_FAILURE(MakeTrainer(task, seed, kGpu, &gpu));
    // Same initial parameters: the initialisation is the CPU generator's.
    ASSERT_TRUE(Close(Flat(gpu, false), Flat(cpu, false), {0, 0, 0}, "initial parameters"));
    Tolerance tol = ToleranceFor(DT_DTYPE_F32, tf32);
    if (batch == 0) {
      batch = std::string(model) == "lenet" ? 32 : task->max_context > 0 ? 4 : 64;
    }
    Vec before = Flat(cpu, false);
    for (int s = 0; s < steps; s++) {
      SCOPED_TRACE(std::string(model) + " step " + std::to_string(s + 1) +
                   (tf32 ? " (TF32 on)" : " (TF32 off)"));
      Batch b;
      MakeBatch(task, batch, seed + (uint64_t)s, &b);
      double lc = 0, lg = 0;
      ASSERT_NO_FATAL_FAILURE(Step(&cpu, task, b, &lc));
      ASSERT_NO_FATAL_FAILURE(Step(&gpu, task, b, &lg));
      EXPECT_NEAR(lg, lc, (tf32 ? 1e-2 : 1e-4) * std::fabs(lc) + 1e-6) << "loss";
      Vec gc = Flat(cpu, true), gg = Flat(gpu, true);
      ExpectSameByParameter(cpu, gg, gc, tol, "gradient");
      OK(dt_optim_step(cpu.opt));
      OK(dt_optim_step(gpu.opt));
      Vec pc = Flat(cpu, false), pg = Flat(gpu, false);
      // The update itself (p_after - p_before), then the parameters.
      Vec dc(pc.size()), dg(pc.size());
      for (size_t i = 0; i < pc.size(); i++) {
        dc[i] = pc[i] - before[i];
        dg[i] = pg[i] - before[i];
      }
      ExpectSameByParameter(cpu, dg, dc, tol, "update");
      Tolerance ptol = {tol.rtol * 0.1, tol.scale_atol * 0.1, tol.l2 * 0.1};
      ExpectSameByParameter(cpu, pg, pc, ptol, "parameter");
      std::fprintf(stderr, "%s step %d: loss cpu %.7f cuda %.7f\n", model, s + 1, lc, lg);
      // Continue from the CPU's parameters so each step is compared alone.
      before = pc;
      dt_no_grad_begin();
      dt_status cst =
          dt_tensor_copy_(dt_param_arena_data(gpu.arena), dt_param_arena_data(cpu.arena));
      dt_no_grad_end();
      OK(cst);
    }
  }
};

TEST_P(CudaTrainStep, OneSgdStepMatchesCpuWithTf32Off) { RunAndCompare(GetParam(), 1, false); }

// The second step takes the momentum buffers' non-first path.
TEST_P(CudaTrainStep, ThreeMomentumStepsMatchCpuWithTf32Off) {
  RunAndCompare(GetParam(), 3, false);
}

// TF32 (the default) is close, with the looser tolerance.
TEST_P(CudaTrainStep, OneStepIsCloseWithTf32On) { RunAndCompare(GetParam(), 1, true); }

INSTANTIATE_TEST_SUITE_P(Models, CudaTrainStep, ::testing::Values("mlp", "lenet"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                           return std::string(i.param);
                         });

// The dropout op on cuda:0 keeps exactly the elements the CPU keeps (the
// counter-based generator), scales them identically, advances the generator
// by the same amount, and its backward routes the same gradient.
// GPT-2 124M at its full context T 1024 (one sequence), TF32 on: the step
// tools/gpu_check.sh times. On the CPU side this is the slow part (about
// 0.8 TFLOP); skipped without a GPU, and in the CPU self-check.
class CudaTrainStepGpt2 : public CudaTrainStep {};

// gpt2-tiny at context 16, batch 4: the fused attention, residual layer
// norm, classifier loss and the tied embedding on both devices (one step:
// the 6.4M-row embedding makes each comparison slow on the CPU self-check).
TEST_F(CudaTrainStepGpt2, Gpt2TinyOneSgdStepMatchesCpuWithTf32Off) {
  RunAndCompare("gpt2-tiny", 1, false);
}

// resnet18-small (the 3x3 stem) on 28 px grey images, batch 16: cuDNN's
// convolutions and batch norms, NCHW and channels-last (cuDNN's NHWC
// descriptors, the filters transposed in the workspace, batch norm over
// the (N*H*W, C) view) against the CPU, one step each, held to the
// relative L2 error per tensor (batch norm's normalisation magnifies
// summation-order differences in the small gradients).
class CudaTrainStepResNet : public CudaTrainStep {};

TEST_F(CudaTrainStepResNet, Resnet18SmallStepIsCloseNchw) {
  RunAndCompare("resnet18-small", 1, true, 16);
}

TEST_F(CudaTrainStepResNet, Resnet18SmallStepIsCloseChannelsLast) {
  RunAndCompare("resnet18-small", 1, true, 16, 16, true);
}

TEST_F(CudaTrainStepGpt2, Gpt2OneStepAtT1024IsCloseWithTf32On) {
  if (kGpu.type != DT_DEVICE_CUDA)
    GTEST_SKIP() << "the 124M step runs against a GPU only (it would take minutes on two CPU "
                    "devices)";
  RunAndCompare("gpt2", 1, true, 1, 1024);
}

TEST(CudaDropout, OpMaskIsBitExactWithTheCpu) {
  std::string reason = NoGpuReason();
  if (!reason.empty())
    GTEST_SKIP() << "no CUDA device: " << reason;
  const std::vector<int64_t> shape = {37, 1031};  // odd sizes: no lucky alignment
  Vec xs = dtt::RandomValues(37 * 1031, 5, -2.0f, 2.0f);
  Vec out[2], grad[2];
  uint64_t offsets[2];
  dt_device devs[2] = {DT_CPU, kGpu};
  for (int k = 0; k < 2; k++) {
    dt_generator g;
    dt_generator_init(&g, 0xD00Dull);
    dt_generator_advance(&g, 777);  // a non-zero offset
    TensorRef x(dtt::MakeTensor(xs, shape, true, devs[k]));
    ASSERT_TRUE(x) << dt_last_error();
    dt_tensor *y = nullptr;
    OK(dt_op_dropout(x.get(), 0.35f, 1, &g, &y));
    TensorRef yr(y);
    offsets[k] = g.offset;
    out[k] = dtt::ToVector(y);
    dt_tensor *s = nullptr;
    OK(dt_op_sum(y, nullptr, 0, 0, &s));
    TensorRef sr(s);
    OK(dt_backward(s, nullptr));
    ASSERT_NE(dt_tensor_grad(x.get()), nullptr);
    grad[k] = dtt::ToVector(dt_tensor_grad(x.get()));
  }
  EXPECT_EQ(offsets[1], offsets[0]) << "the generator advances by numel on both devices";
  size_t kept = 0, differ = 0;
  for (size_t i = 0; i < out[0].size(); i++) {
    kept += out[0][i] != 0.0f;
    differ += (out[0][i] != 0.0f) != (out[1][i] != 0.0f);
  }
  EXPECT_EQ(differ, 0u) << "mask bits differ";
  EXPECT_EQ(out[1], out[0]) << "kept values scaled by 1/(1-p) identically";
  EXPECT_EQ(grad[1], grad[0]) << "backward";
  double frac = (double)kept / (double)out[0].size();
  EXPECT_NEAR(frac, 0.65, 0.02) << "keep fraction";
}

}  // namespace
