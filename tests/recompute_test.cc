// Activation recomputation (dt_module_set_recompute, dt_model_set_recompute):
// one step of gpt2-tiny and llama-tiny with and without it gives the same
// gradients bit for bit, in f32 and under bf16 autocast; resnet18 and
// resnet50 too, their BatchNorm running statistics moved once per step; a
// block with
// Dropout replays its masks; the peak of allocated memory is lower.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "core/amp.h"
#include "core/memory.h"
#include "core/module.h"
#include "core/nn.h"
#include "core/tensor.h"
#include "models/models.h"
}
#include "tests/test_util.h"

namespace {

#define EXPECT_DT_OK(expr) EXPECT_EQ((expr), DT_OK) << #expr << ": " << dt_last_error()

using Grads = std::vector<std::vector<float>>;

// Every parameter's gradient (empty where it has none).
Grads AllGrads(dt_module *m) {
  Grads g;
  for (int i = 0; i < dt_module_num_parameters(m); i++) {
    dt_tensor *grad = dt_tensor_grad(dt_module_parameter_at(m, i, nullptr));
    g.push_back(grad ? dtt::ToVector(grad) : std::vector<float>());
  }
  return g;
}

// Forward of `input` through m (under autocast to `dtype`), backward from
// a fixed upstream gradient of the output; the parameters' gradients and
// the peak of allocated CPU memory during the step.
Grads Step(dt_module *m, dt_tensor *input, dt_dtype dtype, size_t *peak = nullptr) {
  dt_device cpu = DT_CPU;
  EXPECT_DT_OK(dt_memory_reset_peak(cpu));
  dt_dtype prev = dt_autocast_begin(dtype);
  dt_tensor *out = nullptr;
  EXPECT_DT_OK(dt_module_call(m, input, &out));
  dt_autocast_end(prev);
  if (out == nullptr)
    return {};
  dt_tensor *up =
      dtt::MakeTensor(dtt::UpstreamGradient((size_t)dt_tensor_numel(out), 7), dtt::Shape(out));
  EXPECT_DT_OK(dt_backward(out, up));
  dt_tensor_release(up);
  dt_tensor_release(out);
  dt_memory_stats s{};
  EXPECT_DT_OK(dt_memory_stats_get(cpu, &s));
  if (peak != nullptr)
    *peak = s.peak_allocated;
  return AllGrads(m);
}

void ExpectBitwiseEqual(const Grads &a, const Grads &b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); i++) {
    ASSERT_EQ(a[i].size(), b[i].size()) << "parameter " << i;
    ASSERT_FALSE(a[i].empty()) << "parameter " << i << " got no gradient";
    EXPECT_EQ(0, memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)))
        << "parameter " << i << " differs with recomputation";
  }
}

dt_tensor *Tokens(int64_t B, int64_t T, int64_t vocab) {
  std::vector<int64_t> ids((size_t)(B * T));
  for (size_t i = 0; i < ids.size(); i++)
    ids[i] = (int64_t)((i * 7919 + 13) % (size_t)vocab);
  return dtt::MakeIndexTensor(ids, {B, T});
}

dt_module *Gpt2(int context) {
  dt_gpt2_config c{};
  EXPECT_DT_OK(dt_gpt2_config_named("gpt2-tiny", &c));
  c.block_size = context;
  c.vocab = 1000;  // the blocks, not the head, are what is measured
  c.padded_vocab = 1024;
  dt_module *m = nullptr;
  EXPECT_DT_OK(dt_model_gpt2(&c, 42, &m));
  return m;
}

dt_module *Llama() {
  dt_llama_config c{};
  EXPECT_DT_OK(dt_llama_config_named("llama-tiny", &c));
  c.vocab = 1000;
  c.padded_vocab = 1024;
  dt_module *m = nullptr;
  EXPECT_DT_OK(dt_model_llama(&c, 42, &m));
  return m;
}

// Two models from one seed, the second recomputing its blocks: the same
// gradients after one step (and a second, accumulated onto the first).
void CheckModel(dt_module *(*build)(), dt_dtype dtype) {
  dt_module *plain = build(), *rec = build();
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(rec, nullptr);
  ASSERT_DT_OK(dt_model_set_recompute(rec, 1));
  dt_tensor *idx = Tokens(2, 16, 1000);
  for (int step = 0; step < 2; step++)
    ExpectBitwiseEqual(Step(plain, idx, dtype), Step(rec, idx, dtype));
  dt_tensor_release(idx);
  dt_module_destroy(plain);
  dt_module_destroy(rec);
}

dt_module *Gpt2Tiny() { return Gpt2(64); }

// Every buffer's values (BatchNorm's running statistics, as f32).
Grads AllBuffers(dt_module *m) {
  Grads b;
  for (int i = 0; i < dt_module_num_buffers(m); i++) {
    dt_tensor *t = dt_module_buffer_at(m, i, nullptr);
    if (dt_tensor_dtype(t) == DT_DTYPE_F32)
      b.push_back(dtt::ToVector(t));
  }
  return b;
}

dt_module *ResNet(const char *name) {
  dt_resnet_config c{};
  EXPECT_DT_OK(dt_resnet_config_named(name, &c));
  c.in_channels = 1;
  c.num_classes = 10;
  c.small_stem = 1;
  dt_module *m = nullptr;
  EXPECT_DT_OK(dt_model_resnet(&c, 42, &m));
  return m;
}

// ResNets (BasicBlock and Bottleneck) recompute each residual block: the
// same gradients bit for bit over three steps, and the running statistics
// moved once per forward (the re-run leaves them alone) to the same bits.
void CheckResNet(const char *name) {
  dt_module *plain = ResNet(name), *rec = ResNet(name);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(rec, nullptr);
  ASSERT_DT_OK(dt_model_set_recompute(rec, 1));
  dt_tensor *x = dtt::RandomTensor({4, 1, 12, 12}, 9);
  for (int step = 0; step < 3; step++) {
    ExpectBitwiseEqual(Step(plain, x, DT_DTYPE_F32), Step(rec, x, DT_DTYPE_F32));
    Grads a = AllBuffers(plain), b = AllBuffers(rec);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_GT(a.size(), 0u);
    for (size_t i = 0; i < a.size(); i++)
      EXPECT_EQ(0, memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)))
          << name << ": buffer " << i << " after step " << step;
  }
  for (int i = 0; i < dt_module_num_buffers(rec); i++) {
    const char *bn = nullptr;
    dt_tensor *t = dt_module_buffer_at(rec, i, &bn);
    if (dt_tensor_dtype(t) == DT_DTYPE_I64) {
      int64_t n = 0;
      ASSERT_DT_OK(dt_tensor_to_host(t, &n, sizeof n));
      EXPECT_EQ(n, 3) << name << ": " << bn << " counts each forward once";
    }
  }
  dt_tensor_release(x);
  dt_module_destroy(plain);
  dt_module_destroy(rec);
}

TEST(Recompute, ResNet18BlocksBitwiseEqualRunningStatsOnce) { CheckResNet("resnet18"); }
TEST(Recompute, ResNet50BlocksBitwiseEqualRunningStatsOnce) { CheckResNet("resnet50"); }

TEST(Recompute, Gpt2TinyGradientsBitwiseEqual) { CheckModel(Gpt2Tiny, DT_DTYPE_F32); }
TEST(Recompute, LlamaTinyGradientsBitwiseEqual) { CheckModel(Llama, DT_DTYPE_F32); }
TEST(Recompute, Gpt2TinyUnderBf16AutocastBitwiseEqual) { CheckModel(Gpt2Tiny, DT_DTYPE_BF16); }
TEST(Recompute, LlamaTinyUnderBf16AutocastBitwiseEqual) { CheckModel(Llama, DT_DTYPE_BF16); }

// Linear, Dropout, GELU, Linear: the re-run draws the forward's masks, and
// the generator ends where the forward left it.
dt_module *DropoutBlock() {
  dt_generator gen;
  dt_generator_init(&gen, 3);
  dt_module *parts[4] = {};
  EXPECT_DT_OK(dt_nn_linear(8, 16, 1, &gen, &parts[0]));
  EXPECT_DT_OK(dt_nn_dropout(0.5f, 11, &parts[1]));
  EXPECT_DT_OK(dt_nn_gelu(&parts[2]));
  EXPECT_DT_OK(dt_nn_linear(16, 8, 1, &gen, &parts[3]));
  dt_module *block = nullptr, *outer = nullptr;
  EXPECT_DT_OK(dt_nn_sequential(parts, 4, &block));
  EXPECT_DT_OK(dt_nn_sequential(&block, 1, &outer));
  return outer;
}

TEST(Recompute, DropoutMasksReplayed) {
  dt_module *plain = DropoutBlock(), *rec = DropoutBlock();
  dt_module_set_recompute(dt_module_child_at(rec, 0), 1);
  dt_tensor *x = dtt::RandomTensor({4, 8}, 5);
  for (int step = 0; step < 3; step++)  // the generators move on alike
    ExpectBitwiseEqual(Step(plain, x, DT_DTYPE_F32), Step(rec, x, DT_DTYPE_F32));
  dt_tensor_release(x);
  dt_module_destroy(plain);
  dt_module_destroy(rec);
}

// The input's gradient too: with and without, from a leaf input.
TEST(Recompute, InputGradientBitwiseEqual) {
  dt_module *plain = DropoutBlock(), *rec = DropoutBlock();
  dt_module_set_recompute(dt_module_child_at(rec, 0), 1);
  std::vector<float> gx[2];
  dt_module *models[2] = {plain, rec};
  for (int k = 0; k < 2; k++) {
    dt_tensor *x = dtt::RandomTensor({4, 8}, 5);
    dt_tensor_set_requires_grad(x, 1);
    Step(models[k], x, DT_DTYPE_F32);
    ASSERT_NE(dt_tensor_grad(x), nullptr);
    gx[k] = dtt::ToVector(dt_tensor_grad(x));
    dt_tensor_release(x);
  }
  EXPECT_EQ(0, memcmp(gx[0].data(), gx[1].data(), gx[0].size() * sizeof(float)));
  dt_module_destroy(plain);
  dt_module_destroy(rec);
}

// gpt2-tiny (vocabulary 1000) at context 256, batch 2: recomputation keeps one input per
// block instead of every activation, so the step's peak is lower.
TEST(Recompute, LowersPeakMemory) {
  size_t peak[2] = {};
  for (int k = 0; k < 2; k++) {
    dt_module *m = Gpt2(256);
    ASSERT_NE(m, nullptr);
    if (k == 1)
      ASSERT_DT_OK(dt_model_set_recompute(m, 1));
    dt_tensor *idx = Tokens(2, 256, 1000);
    Step(m, idx, DT_DTYPE_F32, &peak[k]);
    dt_tensor_release(idx);
    dt_module_destroy(m);
  }
  printf("peak of allocated memory: %zu B without recomputation, %zu B with\n", peak[0], peak[1]);
  EXPECT_LT(peak[1], peak[0] * 3 / 4)
      << "peak without " << peak[0] << " B, with " << peak[1] << " B";
}

TEST(Recompute, OtherModelsRefused) {
  dt_module *m = nullptr;
  ASSERT_DT_OK(dt_model_create("mlp", 1, &m));
  dt_status st = dt_model_set_recompute(m, 1);
  EXPECT_EQ(st, DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("GPT-2, Llama or ResNet"), std::string::npos);
  dt_module_destroy(m);
}

}  // namespace
