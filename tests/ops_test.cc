// Ops: forward values against hand-computed references, argument errors
// (device, shape, dtype), no_grad, views, dtype round trips and
// grad-ready hooks across several ops. Gradients and backend parity: op_table_test.cc.
#include "core/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/memory.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "tests/test_util.h"

namespace {

using dtt::GradCheck;
using dtt::MakeIndexTensor;
using dtt::MakeTensor;
using dtt::OpFn;
using dtt::RandomTensor;
using dtt::Shape;
using dtt::TensorRef;
using dtt::Tensors;
using dtt::ToVector;
using In = std::vector<dt_tensor *>;
using V = std::vector<float>;
using S = std::vector<int64_t>;

void ExpectNear(const V &got, const V &want, float tol = 1e-5f) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

// ---- forward values ----

TEST(OpsForward, BroadcastingArithmetic) {
  Tensors ts;
  dt_tensor *a = ts.add(MakeTensor({1, 2, 3, 4, 5, 6}, {2, 3}));
  dt_tensor *row = ts.add(MakeTensor({10, 20, 30}, {3}));
  dt_tensor *col = ts.add(MakeTensor({1, 2}, {2, 1}));
  dt_tensor *y = nullptr;
  ASSERT_EQ(dt_op_add(a, row, &y), DT_OK) << dt_last_error();
  ts.add(y);
  EXPECT_EQ(Shape(y), (S{2, 3}));
  ExpectNear(ToVector(y), {11, 22, 33, 14, 25, 36});
  ASSERT_EQ(dt_op_sub(row, col, &y), DT_OK);
  ts.add(y);
  EXPECT_EQ(Shape(y), (S{2, 3}));
  ExpectNear(ToVector(y), {9, 19, 29, 8, 18, 28});
  ASSERT_EQ(dt_op_mul(a, col, &y), DT_OK);
  ts.add(y);
  ExpectNear(ToVector(y), {1, 2, 3, 8, 10, 12});
  ASSERT_EQ(dt_op_scale(a, -0.5f, &y), DT_OK);
  ts.add(y);
  ExpectNear(ToVector(y), {-0.5f, -1, -1.5f, -2, -2.5f, -3});
  // (2,1) * (3) -> (2,3): an outer product by broadcasting
  ASSERT_EQ(dt_op_mul(col, row, &y), DT_OK);
  ts.add(y);
  ExpectNear(ToVector(y), {10, 20, 30, 20, 40, 60});
}

TEST(OpsForward, Activations) {
  Tensors ts;
  dt_tensor *x = ts.add(MakeTensor({-2, -0.5f, 0, 1.5f}, {4}));
  dt_tensor *y = nullptr;
  ASSERT_EQ(dt_op_relu(x, &y), DT_OK);
  ts.add(y);
  ExpectNear(ToVector(y), {0, 0, 0, 1.5f});
  ASSERT_EQ(dt_op_tanh(x, &y), DT_OK);
  ts.add(y);
  ExpectNear(ToVector(y), {std::tanh(-2.0f), std::tanh(-0.5f), 0, std::tanh(1.5f)});
  ASSERT_EQ(dt_op_gelu(x, &y), DT_OK);
  ts.add(y);
  V want;
  for (float v : {-2.0f, -0.5f, 0.0f, 1.5f})
    want.push_back(0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v))));
  ExpectNear(ToVector(y), want);
}

TEST(OpsForward, MatmulAndLinear) {
  Tensors ts;
  dt_tensor *a = ts.add(MakeTensor({1, 2, 3, 4}, {2, 2}));
  dt_tensor *b = ts.add(MakeTensor({5, 6, 7, 8}, {2, 2}));
  dt_tensor *y = nullptr;
  ASSERT_EQ(dt_op_matmul(a, b, &y), DT_OK);
  ts.add(y);
  ExpectNear(ToVector(y), {19, 22, 43, 50});
  // batched: the second batch is the identity times b
  dt_tensor *a3 = ts.add(MakeTensor({1, 2, 3, 4, 1, 0, 0, 1}, {2, 2, 2}));
  dt_tensor *b3 = ts.add(MakeTensor({5, 6, 7, 8, 5, 6, 7, 8}, {2, 2, 2}));
  ASSERT_EQ(dt_op_matmul(a3, b3, &y), DT_OK);
  ts.add(y);
  EXPECT_EQ(Shape(y), (S{2, 2, 2}));
  ExpectNear(ToVector(y), {19, 22, 43, 50, 5, 6, 7, 8});

  dt_tensor *x = ts.add(MakeTensor({1, 2}, {1, 2}));
  dt_tensor *w = ts.add(MakeTensor({1, 0, 0, 1, 1, 1}, {3, 2}));
  dt_tensor *bias = ts.add(MakeTensor({0.5f, -0.5f, 1}, {3}));
  ASSERT_EQ(dt_op_linear(x, w, bias, &y), DT_OK);
  ts.add(y);
  EXPECT_EQ(Shape(y), (S{1, 3}));
  ExpectNear(ToVector(y), {1.5f, 1.5f, 4});
  ASSERT_EQ(dt_op_linear(x, w, nullptr, &y), DT_OK);
  ts.add(y);
  ExpectNear(ToVector(y), {1, 2, 3});
}

TEST(OpsForward, SoftmaxAndLogSoftmax) {
  Tensors ts;
  dt_tensor *x = ts.add(MakeTensor({1, 2, 3, 0, 0, 0}, {2, 3}));
  dt_tensor *y = nullptr;
  ASSERT_EQ(dt_op_softmax(x, -1, &y), DT_OK);
  ts.add(y);
  ExpectNear(ToVector(y), {0.0900306f, 0.2447285f, 0.6652410f, 1 / 3.0f, 1 / 3.0f, 1 / 3.0f});
  ASSERT_EQ(dt_op_log_softmax(x, 1, &y), DT_OK);
  ts.add(y);
  float l3 = std::log(3.0f);
  ExpectNear(ToVector(y),
             {std::log(0.0900306f), std::log(0.2447285f), std::log(0.6652410f), -l3, -l3, -l3});
}

TEST(OpsForward, CrossEntropy) {
  Tensors ts;
  dt_tensor *logits = ts.add(MakeTensor({1, 2, 3, 0, 0, 0}, {2, 3}));
  dt_tensor *target = ts.add(MakeIndexTensor({2, 1}, {2}));
  float l0 = std::log(std::exp(1.0f) + std::exp(2.0f) + std::exp(3.0f)) - 3.0f;
  float l1 = std::log(3.0f);
  dt_tensor *y = nullptr;
  ASSERT_EQ(dt_op_cross_entropy(logits, target, DT_REDUCTION_MEAN, -100, &y), DT_OK)
      << dt_last_error();
  ts.add(y);
  EXPECT_EQ(dt_tensor_ndim(y), 0);
  ExpectNear(ToVector(y), {(l0 + l1) / 2});
  ASSERT_EQ(dt_op_cross_entropy(logits, target, DT_REDUCTION_SUM, -100, &y), DT_OK);
  ts.add(y);
  ExpectNear(ToVector(y), {l0 + l1});
  ASSERT_EQ(dt_op_cross_entropy(logits, target, DT_REDUCTION_NONE, -100, &y), DT_OK);
  ts.add(y);
  EXPECT_EQ(Shape(y), (S{2}));
  ExpectNear(ToVector(y), {l0, l1});
  // ignore_index: the mean divides by the rows kept
  dt_tensor *t_ign = ts.add(MakeIndexTensor({2, -100}, {2}, DT_DTYPE_I32));
  ASSERT_EQ(dt_op_cross_entropy(logits, t_ign, DT_REDUCTION_MEAN, -100, &y), DT_OK);
  ts.add(y);
  ExpectNear(ToVector(y), {l0});
  ASSERT_EQ(dt_op_cross_entropy(logits, t_ign, DT_REDUCTION_NONE, -100, &y), DT_OK);
  ts.add(y);
  ExpectNear(ToVector(y), {l0, 0});
}

// Bytes of live CPU tensors.
size_t CpuAllocated() {
  dt_memory_stats m;
  EXPECT_EQ(dt_memory_stats_get(DT_CPU, &m), DT_OK) << dt_last_error();
  return m.allocated;
}

// The fused classifier keeps one (N, Vp) gradient buffer when it records a
// node, none in evaluation, and with _consume it writes the gradient over
// logits that nothing else holds; the gradients agree bit for bit.
TEST(OpsForward, ClassifierLossBuffers) {
  const int64_t n = 64, vp = 4096, classes = 4000;
  const size_t logits_bytes = (size_t)(n * vp) * sizeof(float);
  Tensors ts;
  dt_tensor *target = ts.add(MakeIndexTensor(std::vector<int64_t>(n, 7), {n}));
  std::vector<std::vector<float>> grads;
  std::vector<float> losses;
  for (int mode = 0; mode < 3; mode++) {  // plain, consume, evaluation
    TensorRef x(RandomTensor({n, vp}, 11, mode < 2));
    dt_tensor *logits = nullptr, *loss = nullptr;
    if (mode == 2)
      dt_no_grad_begin();
    ASSERT_EQ(dt_op_scale(x.get(), 1.0f, &logits), DT_OK) << dt_last_error();
    size_t before = CpuAllocated();
    dt_status st = mode == 1 ? dt_op_classifier_loss_consume(&logits, target, classes, -100, &loss)
                             : dt_op_classifier_loss(logits, target, classes, -100, &loss);
    size_t grew = CpuAllocated() - before;
    if (mode == 2)
      dt_no_grad_end();
    ASSERT_EQ(st, DT_OK) << dt_last_error();
    TensorRef loss_ref(loss);
    if (mode == 1) {
      EXPECT_EQ(logits, nullptr) << "the caller's reference was taken over";
    }
    dt_tensor_release(logits);
    if (mode == 0)
      EXPECT_GE(grew, logits_bytes) << "a gradient buffer of its own";
    else
      EXPECT_LT(grew, logits_bytes / 8) << "no (N, Vp) buffer, mode " << mode;
    losses.push_back(ToVector(loss)[0]);
    if (mode < 2) {
      ASSERT_EQ(dt_backward(loss, nullptr), DT_OK) << dt_last_error();
      grads.push_back(ToVector(dt_tensor_grad(x.get())));
    }
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(losses[0], losses[2]);
  EXPECT_EQ(grads[0], grads[1]);
}

TEST(OpsForward, CrossEntropyAllIgnoredIsNanWithZeroGradient) {
  Tensors ts;
  dt_tensor *logits = ts.add(RandomTensor({3, 4}, 5, true));
  dt_tensor *target = ts.add(MakeIndexTensor({-1, -1, -1}, {3}));
  dt_tensor *y = nullptr;
  ASSERT_EQ(dt_op_cross_entropy(logits, target, DT_REDUCTION_MEAN, -1, &y), DT_OK);
  ts.add(y);
  EXPECT_TRUE(std::isnan(ToVector(y)[0]));  // PyTorch: 0/0
  ASSERT_EQ(dt_backward(y, nullptr), DT_OK) << dt_last_error();
  ASSERT_NE(dt_tensor_grad(logits), nullptr);
  for (float g : ToVector(dt_tensor_grad(logits)))
    EXPECT_EQ(g, 0.0f);
  // sum over no rows is 0
  ASSERT_EQ(dt_op_cross_entropy(logits, target, DT_REDUCTION_SUM, -1, &y), DT_OK);
  ts.add(y);
  EXPECT_EQ(ToVector(y)[0], 0.0f);
}

TEST(OpsForward, CrossEntropyRejectsOutOfRangeTarget) {
  Tensors ts;
  dt_tensor *logits = ts.add(RandomTensor({2, 3}, 6));
  dt_tensor *target = ts.add(MakeIndexTensor({0, 3}, {2}));
  dt_tensor *y = nullptr;
  EXPECT_EQ(dt_op_cross_entropy(logits, target, DT_REDUCTION_MEAN, -100, &y), DT_ERR_INVALID_ARG);
  EXPECT_EQ(y, nullptr);
}

TEST(OpsForward, Mse) {
  Tensors ts;
  dt_tensor *a = ts.add(MakeTensor({1, 2, 3}, {3}));
  dt_tensor *b = ts.add(MakeTensor({1, 0, 0}, {3}));
  dt_tensor *y = nullptr;
  ASSERT_EQ(dt_op_mse(a, b, DT_REDUCTION_MEAN, &y), DT_OK);
  ts.add(y);
  ExpectNear(ToVector(y), {13.0f / 3});
  ASSERT_EQ(dt_op_mse(a, b, DT_REDUCTION_SUM, &y), DT_OK);
  ts.add(y);
  ExpectNear(ToVector(y), {13});
  ASSERT_EQ(dt_op_mse(a, b, DT_REDUCTION_NONE, &y), DT_OK);
  ts.add(y);
  ExpectNear(ToVector(y), {0, 4, 9});
}

TEST(OpsForward, Conv2d) {
  Tensors ts;
  dt_tensor *x = ts.add(MakeTensor({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3}));
  dt_tensor *w = ts.add(MakeTensor({1, 0, 0, -1}, {1, 1, 2, 2}));  // x[i][j] - x[i+1][j+1]
  dt_tensor *b = ts.add(MakeTensor({0.5f}, {1}));
  dt_tensor *y = nullptr;
  ASSERT_EQ(dt_op_conv2d(x, w, b, 1, 0, &y), DT_OK) << dt_last_error();
  ts.add(y);
  EXPECT_EQ(Shape(y), (S{1, 1, 2, 2}));
  ExpectNear(ToVector(y), {-3.5f, -3.5f, -3.5f, -3.5f});
  ASSERT_EQ(dt_op_conv2d(x, w, b, 2, 1, &y), DT_OK);
  ts.add(y);
  EXPECT_EQ(Shape(y), (S{1, 1, 2, 2}));
  ExpectNear(ToVector(y), {-0.5f, -2.5f, -6.5f, -3.5f});
}

TEST(OpsForward, Pooling) {
  Tensors ts;
  V v(16);
  for (int i = 0; i < 16; ++i)
    v[i] = (float)i;
  dt_tensor *x = ts.add(MakeTensor(v, {1, 1, 4, 4}));
  dt_tensor *y = nullptr;
  ASSERT_EQ(dt_op_max_pool2d(x, 2, 2, 0, &y), DT_OK);
  ts.add(y);
  ExpectNear(ToVector(y), {5, 7, 13, 15});
  ASSERT_EQ(dt_op_max_pool2d(x, 3, 2, 1, &y), DT_OK);
  ts.add(y);
  EXPECT_EQ(Shape(y), (S{1, 1, 2, 2}));
  ExpectNear(ToVector(y), {5, 7, 13, 15});
  ASSERT_EQ(dt_op_avg_pool2d(x, 2, 2, 0, &y), DT_OK);
  ts.add(y);
  ExpectNear(ToVector(y), {2.5f, 4.5f, 10.5f, 12.5f});
  // padding counts in the divisor (count_include_pad)
  dt_tensor *x2 = ts.add(MakeTensor({1, 2, 3, 4}, {1, 1, 2, 2}));
  ASSERT_EQ(dt_op_avg_pool2d(x2, 2, 2, 1, &y), DT_OK);
  ts.add(y);
  ExpectNear(ToVector(y), {0.25f, 0.5f, 0.75f, 1});
}

TEST(OpsForward, LayerNorm) {
  Tensors ts;
  dt_tensor *x = ts.add(MakeTensor({1, 2, 3, 4, 2, 2, 2, 2}, {2, 4}));
  dt_tensor *g = ts.add(MakeTensor({1, 1, 2, 2}, {4}));
  dt_tensor *b = ts.add(MakeTensor({0, 1, 0, 1}, {4}));
  dt_tensor *y = nullptr;
  ASSERT_EQ(dt_op_layer_norm(x, g, b, 1e-5f, &y), DT_OK);
  ts.add(y);
  float s = 1 / std::sqrt(1.25f + 1e-5f);
  // a constant row normalises to 0, leaving beta
  ExpectNear(ToVector(y), {-1.5f * s, -0.5f * s + 1, 2 * 0.5f * s, 2 * 1.5f * s + 1, 0, 1, 0, 1});
}

TEST(OpsForward, BatchNormEvalUsesRunningStats) {
  Tensors ts;
  dt_tensor *x = ts.add(MakeTensor({1, 2, 3, 4}, {2, 2}));  // (N, C)
  dt_tensor *rm = ts.add(MakeTensor({1, 2}, {2}));
  dt_tensor *rv = ts.add(MakeTensor({4, 1}, {2}));
  dt_tensor *g = ts.add(MakeTensor({2, 1}, {2}));
  dt_tensor *b = ts.add(MakeTensor({0, 1}, {2}));
  dt_tensor *y = nullptr;
  ASSERT_EQ(dt_op_batch_norm2d(x, g, b, rm, rv, 0, 0.1f, 0.0f, &y), DT_OK) << dt_last_error();
  ts.add(y);
  ExpectNear(ToVector(y), {0, 1, 2, 3});
  ExpectNear(ToVector(rm), {1, 2});  // untouched in eval mode
  ExpectNear(ToVector(rv), {4, 1});
}

// With no samples the parameter gradients are zeros, not whatever the
// allocator hands out: blocks of the gradients' size are poisoned with NaN
// and freed first, so uninitialised memory would show.
TEST(OpsAutograd, BatchNormOfAnEmptyBatchHasZeroParameterGradients) {
  for (int i = 0; i < 8; i++) {
    dt_tensor *poison = MakeTensor({NAN, NAN, NAN}, {3});
    dt_tensor_release(poison);
  }
  Tensors ts;
  dt_tensor *x = ts.add(MakeTensor({}, {0, 3, 2, 2}, true));
  dt_tensor *g = ts.add(MakeTensor({1, 1, 1}, {3}, true));
  dt_tensor *b = ts.add(MakeTensor({0, 0, 0}, {3}, true));
  dt_tensor *rm = ts.add(MakeTensor({0, 0, 0}, {3}));
  dt_tensor *rv = ts.add(MakeTensor({1, 1, 1}, {3}));
  dt_tensor *y = nullptr, *loss = nullptr;
  ASSERT_EQ(dt_op_batch_norm2d(x, g, b, rm, rv, false, 0.1f, 1e-5f, &y), DT_OK) << dt_last_error();
  ts.add(y);
  ASSERT_EQ(dt_op_sum(y, nullptr, 0, false, &loss), DT_OK) << dt_last_error();
  ts.add(loss);
  ASSERT_EQ(dt_backward(loss, nullptr), DT_OK) << dt_last_error();
  ExpectNear(ToVector(dt_tensor_grad(g)), {0, 0, 0});
  ExpectNear(ToVector(dt_tensor_grad(b)), {0, 0, 0});
}

TEST(OpsForward, BatchNormTrainingUpdatesRunningStats) {
  Tensors ts;
  dt_tensor *x = ts.add(MakeTensor({1, 2, 3, 4}, {4, 1, 1, 1}));
  dt_tensor *rm = ts.add(MakeTensor({0}, {1}));
  dt_tensor *rv = ts.add(MakeTensor({1}, {1}));
  dt_tensor *y = nullptr;
  ASSERT_EQ(dt_op_batch_norm2d(x, nullptr, nullptr, rm, rv, 1, 0.1f, 0.0f, &y), DT_OK)
      << dt_last_error();
  ts.add(y);
  float s = 1 / std::sqrt(1.25f);  // biased variance normalises
  ExpectNear(ToVector(y), {-1.5f * s, -0.5f * s, 0.5f * s, 1.5f * s});
  ExpectNear(ToVector(rm), {0.25f});
  ExpectNear(ToVector(rv), {0.9f + 0.1f * 5.0f / 3.0f});  // unbiased variance is tracked
  // one value per channel cannot estimate a variance
  dt_tensor *one = ts.add(MakeTensor({1, 2}, {1, 2}));
  EXPECT_EQ(dt_op_batch_norm2d(one, nullptr, nullptr, nullptr, nullptr, 1, 0.1f, 1e-5f, &y),
            DT_ERR_SHAPE);
}

TEST(OpsForward, Embedding) {
  Tensors ts;
  dt_tensor *table = ts.add(MakeTensor({0, 1, 10, 11, 20, 21}, {3, 2}));
  dt_tensor *idx = ts.add(MakeIndexTensor({2, 0, 2, 1}, {2, 2}, DT_DTYPE_I32));
  dt_tensor *y = nullptr;
  ASSERT_EQ(dt_op_embedding(idx, table, &y), DT_OK) << dt_last_error();
  ts.add(y);
  EXPECT_EQ(Shape(y), (S{2, 2, 2}));
  ExpectNear(ToVector(y), {20, 21, 0, 1, 20, 21, 10, 11});
  dt_tensor *bad = ts.add(MakeIndexTensor({3}, {1}));
  EXPECT_EQ(dt_op_embedding(bad, table, &y), DT_ERR_INVALID_ARG);
}

TEST(OpsForward, Dropout) {
  Tensors ts;
  const int n = 4000;
  dt_tensor *x = ts.add(MakeTensor(V(n, 1.0f), {n}));
  dt_generator gen;
  dt_generator_init(&gen, 42);
  dt_tensor *y = nullptr;
  ASSERT_EQ(dt_op_dropout(x, 0.25f, 1, &gen, &y), DT_OK) << dt_last_error();
  ts.add(y);
  EXPECT_EQ(gen.offset, (uint64_t)n);  // the generator advanced by numel
  V v = ToVector(y);
  int kept = 0;
  for (int i = 0; i < n; ++i) {
    bool keep = dt_rng_uniform(42, (uint64_t)i) >= 0.25f;  // the documented mask
    EXPECT_FLOAT_EQ(v[i], keep ? 1.0f / 0.75f : 0.0f) << i;
    kept += keep;
  }
  EXPECT_NEAR(kept / (double)n, 0.75, 0.03);
  // the next call draws fresh counters: a different mask
  dt_tensor *y2 = nullptr;
  ASSERT_EQ(dt_op_dropout(x, 0.25f, 1, &gen, &y2), DT_OK);
  ts.add(y2);
  EXPECT_NE(ToVector(y2), v);
  // eval mode and p = 0 return x itself
  dt_tensor *same = nullptr;
  ASSERT_EQ(dt_op_dropout(x, 0.25f, 0, &gen, &same), DT_OK);
  ts.add(same);
  EXPECT_EQ(same, x);
  ASSERT_EQ(dt_op_dropout(x, 0.0f, 1, &gen, &same), DT_OK);
  ts.add(same);
  EXPECT_EQ(same, x);
  EXPECT_EQ(dt_op_dropout(x, 1.5f, 1, &gen, &same), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_op_dropout(x, 0.5f, 1, nullptr, &same), DT_ERR_INVALID_ARG);
}

TEST(OpsForward, SumAndMeanShapes) {
  Tensors ts;
  V v(24);
  for (int i = 0; i < 24; ++i)
    v[i] = (float)i;
  dt_tensor *x = ts.add(MakeTensor(v, {2, 3, 4}));
  dt_tensor *y = nullptr;
  ASSERT_EQ(dt_op_sum(x, nullptr, 0, 0, &y), DT_OK);
  ts.add(y);
  EXPECT_EQ(dt_tensor_ndim(y), 0);
  ExpectNear(ToVector(y), {276});
  int d02[] = {0, 2};
  ASSERT_EQ(dt_op_sum(x, d02, 2, 1, &y), DT_OK);
  ts.add(y);
  EXPECT_EQ(Shape(y), (S{1, 3, 1}));
  // sum over i0, i2 of 12*i0 + 4*i1 + i2 = 2*(0+1+2+3) + 12*4 + 8*4*i1
  ExpectNear(ToVector(y), {60, 92, 124});
  int dlast[] = {-1};
  ASSERT_EQ(dt_op_mean(x, dlast, 1, 0, &y), DT_OK);
  ts.add(y);
  EXPECT_EQ(Shape(y), (S{2, 3}));
  ExpectNear(ToVector(y), {1.5f, 5.5f, 9.5f, 13.5f, 17.5f, 21.5f});
  int d1[] = {1};
  ASSERT_EQ(dt_op_mean(x, d1, 1, 1, &y), DT_OK);
  ts.add(y);
  EXPECT_EQ(Shape(y), (S{2, 1, 4}));
  ExpectNear(ToVector(y), {4, 5, 6, 7, 16, 17, 18, 19});
  int dup[] = {1, -2};
  EXPECT_EQ(dt_op_sum(x, dup, 2, 0, &y), DT_ERR_INVALID_ARG);
  int out_of_range[] = {3};
  EXPECT_EQ(dt_op_sum(x, out_of_range, 1, 0, &y), DT_ERR_INVALID_ARG);
}

TEST(OpsForward, ConcatAndFlatten) {
  Tensors ts;
  dt_tensor *a = ts.add(MakeTensor({1, 2, 3, 4}, {2, 2}));
  dt_tensor *b = ts.add(MakeTensor({5, 6}, {1, 2}));
  dt_tensor *c = ts.add(MakeTensor({7, 8}, {2, 1}));
  dt_tensor *y = nullptr;
  dt_tensor *ab[] = {a, b};
  ASSERT_EQ(dt_op_concat(ab, 2, 0, &y), DT_OK) << dt_last_error();
  ts.add(y);
  EXPECT_EQ(Shape(y), (S{3, 2}));
  ExpectNear(ToVector(y), {1, 2, 3, 4, 5, 6});
  dt_tensor *ac[] = {a, c, a};
  ASSERT_EQ(dt_op_concat(ac, 3, 1, &y), DT_OK);
  ts.add(y);
  EXPECT_EQ(Shape(y), (S{2, 5}));
  ExpectNear(ToVector(y), {1, 2, 7, 1, 2, 3, 4, 8, 3, 4});
  // a transposed (non-contiguous) input is copied by its strides
  dt_tensor *at = nullptr;
  ASSERT_EQ(dt_tensor_transpose(a, 0, 1, &at), DT_OK);
  ts.add(at);
  dt_tensor *tb[] = {at, b};
  ASSERT_EQ(dt_op_concat(tb, 2, 0, &y), DT_OK);
  ts.add(y);
  ExpectNear(ToVector(y), {1, 3, 2, 4, 5, 6});
  dt_tensor *bad[] = {a, c};
  EXPECT_EQ(dt_op_concat(bad, 2, 0, &y), DT_ERR_SHAPE);

  dt_tensor *x4 = ts.add(RandomTensor({2, 3, 2, 2}, 3));
  ASSERT_EQ(dt_op_flatten(x4, &y), DT_OK);
  ts.add(y);
  EXPECT_EQ(Shape(y), (S{2, 12}));
  EXPECT_TRUE(dt_tensor_shares_storage(y, x4));
  EXPECT_EQ(ToVector(y), ToVector(x4));
}

TEST(OpsForward, Argmax) {
  Tensors ts;
  dt_tensor *x = ts.add(MakeTensor({1, 3, 3, -1, -5, -0.5f, 0, NAN, 9}, {3, 3}));
  dt_tensor *y = nullptr;
  ASSERT_EQ(dt_op_argmax(x, &y), DT_OK) << dt_last_error();
  ts.add(y);
  EXPECT_EQ(dt_tensor_dtype(y), DT_DTYPE_I64);
  EXPECT_EQ(Shape(y), (S{3}));
  // first maximum wins ties; NaN is the maximum (as PyTorch)
  EXPECT_EQ(dtt::ToIndexVector(y), (std::vector<int64_t>{1, 2, 1}));
}

// ---- argument errors ----

TEST(OpsErrors, DeviceMismatchNamesOpAndDevices) {
  Tensors ts;
  dt_device cpu1 = {DT_DEVICE_CPU, 1};
  dt_tensor *a = ts.add(RandomTensor({2, 3}, 1));
  dt_tensor *b = ts.add(RandomTensor({2, 3}, 2, false, -1, 1, cpu1));
  ASSERT_NE(b, nullptr);
  dt_tensor *y = nullptr;
  EXPECT_EQ(dt_op_add(a, b, &y), DT_ERR_DEVICE_MISMATCH);
  EXPECT_EQ(y, nullptr);
  std::string msg = dt_last_error();
  EXPECT_NE(msg.find("dt_op_add"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cpu:0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cpu:1"), std::string::npos) << msg;

  dt_tensor *w = ts.add(RandomTensor({4, 3}, 3, false, -1, 1, cpu1));
  EXPECT_EQ(dt_op_linear(a, w, nullptr, &y), DT_ERR_DEVICE_MISMATCH);
  EXPECT_NE(std::string(dt_last_error()).find("dt_op_linear"), std::string::npos);
  dt_tensor *t = ts.add(MakeIndexTensor({0, 1}, {2}, DT_DTYPE_I64, cpu1));
  EXPECT_EQ(dt_op_cross_entropy(a, t, DT_REDUCTION_MEAN, -100, &y), DT_ERR_DEVICE_MISMATCH);
  EXPECT_NE(std::string(dt_last_error()).find("dt_op_cross_entropy"), std::string::npos);
  dt_tensor *ab[] = {a, b};
  EXPECT_EQ(dt_op_concat(ab, 2, 0, &y), DT_ERR_DEVICE_MISMATCH);
  // the same op on one device works
  EXPECT_EQ(dt_op_mul(b, b, &y), DT_OK);
  ts.add(y);
  EXPECT_TRUE(dt_device_equal(dt_tensor_device(y), cpu1));
}

TEST(OpsErrors, ShapeErrors) {
  Tensors ts;
  dt_tensor *a = ts.add(RandomTensor({2, 3}, 1));
  dt_tensor *b = ts.add(RandomTensor({4}, 2));
  dt_tensor *y = nullptr;
  EXPECT_EQ(dt_op_add(a, b, &y), DT_ERR_SHAPE);
  std::string msg = dt_last_error();
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
  EXPECT_EQ(dt_op_matmul(a, a, &y), DT_ERR_SHAPE);
  dt_tensor *w = ts.add(RandomTensor({5, 4}, 3));
  EXPECT_EQ(dt_op_linear(a, w, nullptr, &y), DT_ERR_SHAPE);
  dt_tensor *w3 = ts.add(RandomTensor({5, 3}, 4));
  EXPECT_EQ(dt_op_linear(a, w3, b, &y), DT_ERR_SHAPE);  // bias (4) for 5 outputs
  dt_tensor *b3a = ts.add(RandomTensor({2, 3, 4}, 5)), *b3b = ts.add(RandomTensor({3, 4, 2}, 6));
  EXPECT_EQ(dt_op_matmul(b3a, b3b, &y), DT_ERR_SHAPE);  // batch sizes differ
  dt_tensor *x4 = ts.add(RandomTensor({1, 2, 5, 5}, 7));
  dt_tensor *k = ts.add(RandomTensor({3, 4, 3, 3}, 8));
  EXPECT_EQ(dt_op_conv2d(x4, k, nullptr, 1, 0, &y), DT_ERR_SHAPE);  // 2 vs 4 channels
  dt_tensor *k7 = ts.add(RandomTensor({3, 2, 7, 7}, 9));
  EXPECT_EQ(dt_op_conv2d(x4, k7, nullptr, 1, 0, &y), DT_ERR_SHAPE);  // kernel > input
  EXPECT_EQ(dt_op_conv2d(a, k, nullptr, 1, 0, &y), DT_ERR_SHAPE);    // not 4-D
  EXPECT_EQ(dt_op_max_pool2d(x4, 2, 0, 0, &y), DT_ERR_INVALID_ARG);  // stride 0
  EXPECT_EQ(dt_op_mse(a, b, DT_REDUCTION_MEAN, &y), DT_ERR_SHAPE);
  dt_tensor *t = ts.add(MakeIndexTensor({0, 1, 2}, {3}));
  EXPECT_EQ(dt_op_cross_entropy(a, t, DT_REDUCTION_MEAN, -100, &y), DT_ERR_SHAPE);
  dt_tensor *g = ts.add(RandomTensor({4}, 10));
  EXPECT_EQ(dt_op_layer_norm(a, g, nullptr, 1e-5f, &y), DT_ERR_SHAPE);
  EXPECT_EQ(dt_op_batch_norm2d(x4, g, nullptr, nullptr, nullptr, 1, 0.1f, 1e-5f, &y), DT_ERR_SHAPE);
  EXPECT_EQ(y, nullptr);
}

TEST(OpsErrors, SoftmaxOnlyOverTheLastDim) {
  Tensors ts;
  dt_tensor *a = ts.add(RandomTensor({2, 3}, 1));
  dt_tensor *y = nullptr;
  EXPECT_EQ(dt_op_softmax(a, 0, &y), DT_ERR_UNSUPPORTED);
  EXPECT_EQ(dt_op_log_softmax(a, 2, &y), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_op_softmax(a, 1, &y), DT_OK);
  ts.add(y);
}

// Integer tensors are no float op's input; 16-bit ones are (mixed
// precision: core/autocast_policy.def gives each result's dtype).
TEST(OpsErrors, IntegerInputsAreRejected) {
  Tensors ts;
  dt_tensor *a = ts.add(RandomTensor({2, 3}, 1));
  dt_tensor *i = ts.add(MakeIndexTensor({0, 1, 2, 0, 1, 2}, {2, 3}, DT_DTYPE_I32));
  dt_tensor *y = nullptr;
  EXPECT_EQ(dt_op_add(a, i, &y), DT_ERR_DTYPE);
  EXPECT_NE(std::string(dt_last_error()).find("dt_op_add"), std::string::npos);
  EXPECT_EQ(dt_op_relu(i, &y), DT_ERR_DTYPE);
  EXPECT_EQ(dt_op_softmax(i, -1, &y), DT_ERR_DTYPE);
  dt_tensor *w = ts.add(RandomTensor({4, 3}, 2));
  EXPECT_EQ(dt_op_linear(i, w, nullptr, &y), DT_ERR_DTYPE);
  EXPECT_EQ(dt_op_sum(i, nullptr, 0, 0, &y), DT_ERR_DTYPE);
  EXPECT_EQ(y, nullptr);
  for (dt_dtype dt : {DT_DTYPE_F16, DT_DTYPE_BF16}) {
    dt_tensor *h = nullptr;
    ASSERT_EQ(dt_tensor_to_dtype(a, dt, &h), DT_OK) << dt_last_error();
    ts.add(h);
    auto dtype_of = [&](const std::function<dt_status(dt_tensor **)> &op) {
      dt_tensor *r = nullptr;
      EXPECT_EQ(op(&r), DT_OK) << dt_last_error();
      ts.add(r);
      return r ? dt_tensor_dtype(r) : DT_DTYPE_COUNT;
    };
    EXPECT_EQ(dtype_of([&](dt_tensor **r) { return dt_op_add(a, h, r); }), DT_DTYPE_F32);
    EXPECT_EQ(dtype_of([&](dt_tensor **r) { return dt_op_add(h, h, r); }), dt);
    EXPECT_EQ(dtype_of([&](dt_tensor **r) { return dt_op_relu(h, r); }), dt);
    EXPECT_EQ(dtype_of([&](dt_tensor **r) { return dt_op_softmax(h, -1, r); }), DT_DTYPE_F32);
    EXPECT_EQ(dtype_of([&](dt_tensor **r) { return dt_op_sum(h, nullptr, 0, 0, r); }),
              DT_DTYPE_F32);
    // a low-precision op outside autocast computes in f32
    EXPECT_EQ(dtype_of([&](dt_tensor **r) { return dt_op_linear(h, w, nullptr, r); }),
              DT_DTYPE_F32);
  }
  // class ids must be integers
  dt_tensor *ft = ts.add(MakeTensor({0, 1}, {2}));
  EXPECT_EQ(dt_op_cross_entropy(a, ft, DT_REDUCTION_MEAN, -100, &y), DT_ERR_DTYPE);
  dt_tensor *table = ts.add(RandomTensor({3, 2}, 3));
  EXPECT_EQ(dt_op_embedding(ft, table, &y), DT_ERR_DTYPE);
}

// ---- autograd behaviour of ops ----

TEST(OpsAutograd, NoGradRecordsNothing) {
  Tensors ts;
  dt_tensor *x = ts.add(RandomTensor({2, 3}, 1, true));
  dt_tensor *w = ts.add(RandomTensor({4, 3}, 2, true));
  dt_tensor *t = ts.add(MakeIndexTensor({0, 3}, {2}));
  dt_no_grad_begin();
  EXPECT_FALSE(dt_grad_enabled());
  dt_tensor *h = nullptr, *a = nullptr, *loss = nullptr;
  ASSERT_EQ(dt_op_linear(x, w, nullptr, &h), DT_OK);
  ts.add(h);
  ASSERT_EQ(dt_op_relu(h, &a), DT_OK);
  ts.add(a);
  ASSERT_EQ(dt_op_cross_entropy(a, t, DT_REDUCTION_MEAN, -100, &loss), DT_OK);
  ts.add(loss);
  dt_no_grad_end();
  for (dt_tensor *o : {h, a, loss}) {
    EXPECT_EQ(dt_tensor_requires_grad(o), 0);
    EXPECT_TRUE(dt_tensor_is_leaf(o));
  }
  EXPECT_EQ(dt_backward(loss, nullptr), DT_ERR_INVALID_ARG);
  // and with grad mode back on, the same ops record
  ASSERT_EQ(dt_op_linear(x, w, nullptr, &h), DT_OK);
  ts.add(h);
  EXPECT_EQ(dt_tensor_requires_grad(h), 1);
  EXPECT_FALSE(dt_tensor_is_leaf(h));
  // inputs that do not require grad record nothing either
  dt_tensor *c = ts.add(RandomTensor({2, 3}, 3));
  ASSERT_EQ(dt_op_tanh(c, &a), DT_OK);
  ts.add(a);
  EXPECT_EQ(dt_tensor_requires_grad(a), 0);
}

TEST(OpsAutograd, ViewsShareStorageAndPassGradients) {
  Tensors ts;
  dt_tensor *x = ts.add(RandomTensor({4, 6}, 1, true));
  dt_tensor *v = nullptr;
  int64_t shape[] = {2, 3, 4};
  ASSERT_EQ(dt_tensor_reshape(x, shape, 3, &v), DT_OK);
  ts.add(v);
  EXPECT_TRUE(dt_tensor_shares_storage(v, x));
  int perm[] = {2, 0, 1};
  dt_tensor *p = nullptr;
  ASSERT_EQ(dt_tensor_permute(v, perm, &p), DT_OK);
  ts.add(p);
  EXPECT_TRUE(dt_tensor_shares_storage(p, x));
  EXPECT_FALSE(dt_tensor_is_contiguous(p));
  dt_tensor *tr = nullptr;
  ASSERT_EQ(dt_tensor_transpose(x, 0, 1, &tr), DT_OK);
  ts.add(tr);
  EXPECT_TRUE(dt_tensor_shares_storage(tr, x));
  dt_tensor *sl = nullptr;
  ASSERT_EQ(dt_tensor_slice(x, 1, 3, &sl), DT_OK);
  ts.add(sl);
  EXPECT_TRUE(dt_tensor_shares_storage(sl, x));
  EXPECT_EQ(Shape(sl), (S{2, 6}));

  // gradients through each view, checked by finite differences
  OpFn reshape_fn = [](const In &in, dt_tensor **out) {
    int64_t s[] = {3, 8};
    dt_tensor *r = nullptr;
    DT_CHECK(dt_tensor_reshape(in[0], s, 2, &r));
    dt_status st = dt_op_mul(r, r, out);
    dt_tensor_release(r);
    return st;
  };
  OpFn permute_fn = [](const In &in, dt_tensor **out) {
    int64_t s[] = {2, 3, 4};
    int pm[] = {2, 0, 1};
    dt_tensor *r = nullptr, *q = nullptr;
    DT_CHECK(dt_tensor_reshape(in[0], s, 3, &r));
    dt_status st = dt_tensor_permute(r, pm, &q);
    if (st == DT_OK)
      st = dt_op_matmul(q, in[1], out);  // (4, 2, 3) @ (3, 2): non-contiguous a
    dt_tensor_release(q);
    dt_tensor_release(r);
    return st;
  };
  OpFn transpose_fn = [](const In &in, dt_tensor **out) {
    dt_tensor *t = nullptr;
    DT_CHECK(dt_tensor_transpose(in[0], 0, 1, &t));
    dt_status st = dt_op_softmax(t, -1, out);
    dt_tensor_release(t);
    return st;
  };
  OpFn slice_fn = [](const In &in, dt_tensor **out) {
    dt_tensor *s = nullptr;
    DT_CHECK(dt_tensor_slice(in[0], 1, 3, &s));
    dt_status st = dt_op_tanh(s, out);
    dt_tensor_release(s);
    return st;
  };
  dt_tensor *m = ts.add(RandomTensor({3, 2}, 2, true));
  EXPECT_TRUE(GradCheck(reshape_fn, {x}));
  EXPECT_TRUE(GradCheck(permute_fn, {x, m}));
  EXPECT_TRUE(GradCheck(transpose_fn, {x}));
  EXPECT_TRUE(GradCheck(slice_fn, {x}));
  // the rows outside the slice get exactly zero
  V g = ToVector(dt_tensor_grad(x));
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(g[i], 0.0f);
    EXPECT_EQ(g[18 + i], 0.0f);
  }
}

TEST(OpsAutograd, DtypeRoundTrips) {
  Tensors ts;
  const float one_plus = 1.0f + std::ldexp(1.0f, -11);  // halfway between two f16 values
  V v = {0.5f, -2.0f, 65504.0f, one_plus, 1.0f + 3 * std::ldexp(1.0f, -11), std::ldexp(1.0f, -24),
         1e5f, 0.1f};
  dt_tensor *x = ts.add(MakeTensor(v, {8}));
  dt_tensor *h = nullptr, *back = nullptr;
  ASSERT_EQ(dt_tensor_to_dtype(x, DT_DTYPE_F16, &h), DT_OK);
  ts.add(h);
  ASSERT_EQ(dt_tensor_to_dtype(h, DT_DTYPE_F32, &back), DT_OK);
  ts.add(back);
  V r = ToVector(back);
  EXPECT_EQ(r[0], 0.5f);
  EXPECT_EQ(r[1], -2.0f);
  EXPECT_EQ(r[2], 65504.0f);                              // largest f16
  EXPECT_EQ(r[3], 1.0f);                                  // tie rounds to even (down)
  EXPECT_EQ(r[4], 1.0f + std::ldexp(1.0f, -9));           // tie rounds to even (up)
  EXPECT_EQ(r[5], std::ldexp(1.0f, -24));                 // smallest subnormal
  EXPECT_TRUE(std::isinf(r[6]));                          // overflow
  EXPECT_NEAR(r[7], 0.1f, 0.1f * std::ldexp(1.0f, -11));  // within half an ulp

  V vb = {1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8), 3.0e38f, -0.0f};
  dt_tensor *xb = ts.add(MakeTensor(vb, {4}));
  dt_tensor *b16 = nullptr;
  ASSERT_EQ(dt_tensor_to_dtype(xb, DT_DTYPE_BF16, &b16), DT_OK);
  ts.add(b16);
  ASSERT_EQ(dt_tensor_to_dtype(b16, DT_DTYPE_F32, &back), DT_OK);
  ts.add(back);
  r = ToVector(back);
  EXPECT_EQ(r[0], 1.0f);                         // tie to even (down)
  EXPECT_EQ(r[1], 1.0f + std::ldexp(1.0f, -6));  // tie to even (up)
  EXPECT_NEAR(r[2], 3.0e38f, 3.0e38f * 1e-2f);   // bf16 keeps f32's range
  EXPECT_TRUE(std::signbit(r[3]));

  // the conversion is differentiable: d/dx sum(f32(f16(x))) = 1
  dt_tensor *xg = ts.add(MakeTensor({0.25f, -1.5f, 3.0f}, {3}, true));
  dt_tensor *hg = nullptr, *bg = nullptr, *s = nullptr;
  ASSERT_EQ(dt_tensor_to_dtype(xg, DT_DTYPE_F16, &hg), DT_OK);
  ts.add(hg);
  ASSERT_EQ(dt_tensor_to_dtype(hg, DT_DTYPE_F32, &bg), DT_OK);
  ts.add(bg);
  ASSERT_EQ(dt_op_sum(bg, nullptr, 0, 0, &s), DT_OK);
  ts.add(s);
  ASSERT_EQ(dt_backward(s, nullptr), DT_OK) << dt_last_error();
  ExpectNear(ToVector(dt_tensor_grad(xg)), {1, 1, 1});
}

// dt_backward requires a seed of the loss's shape (as PyTorch does); with it
// the broadcasting ops reduce over the right dims.
TEST(OpsAutograd, SeedGradientThroughBroadcastAndConcat) {
  Tensors ts;
  dt_tensor *a = ts.add(MakeTensor({1, 2, 3, 4, 5, 6}, {2, 3}, true));
  dt_tensor *b = ts.add(MakeTensor({1, 1, 1}, {3}, true));
  dt_tensor *y = nullptr;
  ASSERT_EQ(dt_op_mul(a, b, &y), DT_OK);
  ts.add(y);
  dt_tensor *flat = ts.add(MakeTensor({1, 2, 3, 4, 5, 6}, {6}));
  EXPECT_EQ(dt_backward(y, flat), DT_ERR_SHAPE);
  EXPECT_NE(std::string(dt_last_error()).find("shape"), std::string::npos);
  dt_tensor *seed = ts.add(MakeTensor({1, 2, 3, 4, 5, 6}, {2, 3}));
  ASSERT_EQ(dt_backward(y, seed), DT_OK) << dt_last_error();
  ExpectNear(ToVector(dt_tensor_grad(a)), {1, 2, 3, 4, 5, 6});
  ExpectNear(ToVector(dt_tensor_grad(b)), {1 + 4 * 4, 2 * 2 + 5 * 5, 3 * 3 + 6 * 6});

  dt_tensor *c = ts.add(MakeTensor({7, 8}, {2, 1}, true));
  dt_tensor *ac[] = {a, c};
  ASSERT_EQ(dt_op_concat(ac, 2, 1, &y), DT_OK);  // (2, 4)
  ts.add(y);
  dt_tensor *seed8 = ts.add(MakeTensor({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4}));
  ASSERT_EQ(dt_backward(y, seed8), DT_OK) << dt_last_error();
  ExpectNear(ToVector(dt_tensor_grad(c)), {4, 8});
}

struct HookLog {
  int calls = 0;
  unsigned long pass_at_last_call = 0;
  V grad_at_call;
};

void RecordHook(dt_tensor *leaf, void *user) {
  HookLog *log = static_cast<HookLog *>(user);
  log->calls++;
  log->pass_at_last_call = dt_backward_pass_count();
  log->grad_at_call = ToVector(dt_tensor_grad(leaf));
}

TEST(OpsAutograd, GradReadyHookFiresOncePerLeafAcrossOps) {
  Tensors ts;
  dt_tensor *x = ts.add(RandomTensor({3, 4}, 1, true));
  dt_tensor *w = ts.add(RandomTensor({2, 4}, 2, true));
  dt_tensor *b = ts.add(RandomTensor({2}, 3, true));
  HookLog wlog, xlog, blog;
  dt_hook_handle hw = 0, hx = 0, hb = 0;
  ASSERT_EQ(dt_tensor_add_grad_ready_hook(w, RecordHook, &wlog, &hw), DT_OK);
  ASSERT_EQ(dt_tensor_add_grad_ready_hook(x, RecordHook, &xlog, &hx), DT_OK);
  ASSERT_EQ(dt_tensor_add_grad_ready_hook(b, RecordHook, &blog, &hb), DT_OK);
  for (int pass = 1; pass <= 2; ++pass) {
    // w feeds two linears and a mul; x feeds both linears; b one add
    dt_tensor *h1 = nullptr, *h2 = nullptr, *s = nullptr, *ww = nullptr, *t = nullptr, *u = nullptr,
              *loss = nullptr;
    ASSERT_EQ(dt_op_linear(x, w, b, &h1), DT_OK);
    ASSERT_EQ(dt_op_linear(x, w, nullptr, &h2), DT_OK);
    ASSERT_EQ(dt_op_add(h1, h2, &s), DT_OK);
    ASSERT_EQ(dt_op_mul(w, w, &ww), DT_OK);
    ASSERT_EQ(dt_op_sum(s, nullptr, 0, 0, &t), DT_OK);
    ASSERT_EQ(dt_op_sum(ww, nullptr, 0, 0, &u), DT_OK);
    ASSERT_EQ(dt_op_add(t, u, &loss), DT_OK);
    unsigned long before = dt_backward_pass_count();
    ASSERT_EQ(dt_backward(loss, nullptr), DT_OK) << dt_last_error();
    EXPECT_EQ(wlog.calls, pass);
    EXPECT_EQ(xlog.calls, pass);
    EXPECT_EQ(blog.calls, pass);
    // the hook ran during this pass, with the pass's gradient complete
    EXPECT_EQ(wlog.pass_at_last_call, before);
    EXPECT_EQ(wlog.grad_at_call, ToVector(dt_tensor_grad(w)));
    EXPECT_EQ(xlog.grad_at_call, ToVector(dt_tensor_grad(x)));
    for (dt_tensor *o : {h1, h2, s, ww, t, u, loss})
      dt_tensor_release(o);
  }
  // the gradient accumulated over the two passes: 2 * (2 * colsum(x) + 2w)
  V xv = ToVector(x), wv = ToVector(w), gw = ToVector(dt_tensor_grad(w));
  for (int o = 0; o < 2; ++o)
    for (int i = 0; i < 4; ++i) {
      float colsum = xv[i] + xv[4 + i] + xv[8 + i];
      EXPECT_NEAR(gw[o * 4 + i], 2 * (2 * colsum + 2 * wv[o * 4 + i]), 1e-4f);
    }
  ExpectNear(ToVector(dt_tensor_grad(b)), {6, 6});
  EXPECT_EQ(dt_tensor_remove_grad_ready_hook(w, hw), DT_OK);
  EXPECT_EQ(dt_tensor_remove_grad_ready_hook(x, hx), DT_OK);
  EXPECT_EQ(dt_tensor_remove_grad_ready_hook(b, hb), DT_OK);
}

// A leaf that already has a gradient gets the next pass's weight gradient
// added into it in place (the GEMM with beta = 1, the embedding's scatter),
// for linear, matmul and embedding, and an input sharing the gradient's
// storage still sees the old values.
TEST(OpsAutograd, WeightGradientAddsIntoAnExistingGradient) {
  Tensors ts;
  dt_tensor *x = ts.add(RandomTensor({5, 4}, 11));
  dt_tensor *w = ts.add(RandomTensor({3, 4}, 12, true));
  dt_tensor *b = ts.add(RandomTensor({3}, 13, true));
  dt_tensor *c = ts.add(RandomTensor({5, 3}, 14));
  dt_tensor *m = ts.add(RandomTensor({4, 3}, 15, true));
  V xv = ToVector(x), cv = ToVector(c);
  for (int pass = 1; pass <= 3; ++pass) {
    // loss = sum(linear(x, w, b) * c) + sum((x @ m) * c): dw = c^T x, dm = x^T c
    dt_tensor *y = nullptr, *yc = nullptr, *p = nullptr, *pc = nullptr, *s = nullptr,
              *loss = nullptr;
    ASSERT_EQ(dt_op_linear(x, w, b, &y), DT_OK);
    ASSERT_EQ(dt_op_mul(y, c, &yc), DT_OK);
    ASSERT_EQ(dt_op_matmul(x, m, &p), DT_OK);
    ASSERT_EQ(dt_op_mul(p, c, &pc), DT_OK);
    ASSERT_EQ(dt_op_add(yc, pc, &s), DT_OK);
    ASSERT_EQ(dt_op_sum(s, nullptr, 0, 0, &loss), DT_OK);
    ASSERT_EQ(dt_backward(loss, nullptr), DT_OK) << dt_last_error();
    V gw = ToVector(dt_tensor_grad(w)), gm = ToVector(dt_tensor_grad(m)),
      gb = ToVector(dt_tensor_grad(b));
    for (int o = 0; o < 3; ++o) {
      float bsum = 0;
      for (int i = 0; i < 4; ++i) {
        float dw = 0;
        for (int r = 0; r < 5; ++r)
          dw += cv[r * 3 + o] * xv[r * 4 + i];
        EXPECT_NEAR(gw[o * 4 + i], pass * dw, 1e-4f) << "pass " << pass;
        EXPECT_NEAR(gm[i * 3 + o], pass * dw, 1e-4f) << "pass " << pass;
      }
      for (int r = 0; r < 5; ++r)
        bsum += cv[r * 3 + o];
      EXPECT_NEAR(gb[o], pass * bsum, 1e-4f) << "pass " << pass;
    }
    for (dt_tensor *t : {y, yc, p, pc, s, loss})
      dt_tensor_release(t);
  }
  // embedding: the scatter of the rows' gradients adds into the table's gradient
  dt_tensor *table = ts.add(RandomTensor({4, 3}, 19, true));
  dt_tensor *idx = ts.add(MakeIndexTensor({1, 3, 1}, {3}));
  dt_tensor *ce = ts.add(RandomTensor({3, 3}, 20));
  V cev = ToVector(ce);
  for (int pass = 1; pass <= 2; ++pass) {
    dt_tensor *e = nullptr, *ec = nullptr, *loss = nullptr;
    ASSERT_EQ(dt_op_embedding(idx, table, &e), DT_OK);
    ASSERT_EQ(dt_op_mul(e, ce, &ec), DT_OK);
    ASSERT_EQ(dt_op_sum(ec, nullptr, 0, 0, &loss), DT_OK);
    ASSERT_EQ(dt_backward(loss, nullptr), DT_OK) << dt_last_error();
    V g = ToVector(dt_tensor_grad(table));
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(g[0 * 3 + j], 0.0f);
      EXPECT_NEAR(g[1 * 3 + j], pass * (cev[0 * 3 + j] + cev[2 * 3 + j]), 1e-5f);
      EXPECT_EQ(g[2 * 3 + j], 0.0f);
      EXPECT_NEAR(g[3 * 3 + j], pass * cev[1 * 3 + j], 1e-5f);
    }
    for (dt_tensor *t : {e, ec, loss})
      dt_tensor_release(t);
  }
  // linear(G, w) with G the very gradient of w: dw = c^T G adds to G
  dt_tensor *w2 = ts.add(RandomTensor({3, 3}, 16, true));
  dt_tensor *c2 = ts.add(RandomTensor({3, 3}, 17));
  V c2v = ToVector(c2);
  for (int pass = 1; pass <= 2; ++pass) {
    dt_tensor *in = pass == 1 ? ts.add(RandomTensor({3, 3}, 18)) : dt_tensor_grad(w2);
    V inv = ToVector(in), before = pass == 1 ? V(9, 0.0f) : ToVector(dt_tensor_grad(w2));
    dt_tensor *y = nullptr, *yc = nullptr, *loss = nullptr;
    ASSERT_EQ(dt_op_linear(in, w2, nullptr, &y), DT_OK);
    ASSERT_EQ(dt_op_mul(y, c2, &yc), DT_OK);
    ASSERT_EQ(dt_op_sum(yc, nullptr, 0, 0, &loss), DT_OK);
    ASSERT_EQ(dt_backward(loss, nullptr), DT_OK) << dt_last_error();
    V g = ToVector(dt_tensor_grad(w2));
    for (int o = 0; o < 3; ++o)
      for (int i = 0; i < 3; ++i) {
        float dw = 0;
        for (int r = 0; r < 3; ++r)
          dw += c2v[r * 3 + o] * inv[r * 3 + i];
        EXPECT_NEAR(g[o * 3 + i], before[o * 3 + i] + dw, 1e-4f) << "pass " << pass;
      }
    for (dt_tensor *t : {y, yc, loss})
      dt_tensor_release(t);
  }
}

// ---- rows-ready hooks: a leaf's gradient in blocks (DDP's split buckets) ----

// Every report (which tensor, rows) and the reported rows' values then.
struct RowsEvent {
  char who;
  int64_t row0, nrows;
  V rows;
};
struct RowsLog {
  char who;
  std::vector<RowsEvent> *events;
};
void RecordRows(dt_tensor *leaf, int64_t row0, int64_t nrows, void *user) {
  RowsLog *log = static_cast<RowsLog *>(user);
  V g = ToVector(dt_tensor_grad(leaf));
  int64_t row = dt_tensor_numel(leaf) / dt_tensor_dim(leaf, 0);
  log->events->push_back(
      {log->who, row0, nrows, V(g.begin() + row0 * row, g.begin() + (row0 + nrows) * row)});
}
void RecordReady(dt_tensor *leaf, void *user) {
  RowsLog *log = static_cast<RowsLog *>(user);
  log->events->push_back({static_cast<char>(log->who - 'a' + 'A'), 0, 0, {}});
  (void)leaf;
}

// loss = sum(linear(x1, w, b) * c1) [+ sum(linear(x2, w, nullptr) * c2)],
// then its backward: the backward's status (an op's failure: its status).
dt_status linear_loss_backward(dt_tensor *x1, dt_tensor *x2, dt_tensor *c1, dt_tensor *c2,
                               dt_tensor *w, dt_tensor *b, bool shared) {
  dt_tensor *y1 = nullptr, *yc1 = nullptr, *y2 = nullptr, *yc2 = nullptr, *s = nullptr,
            *loss = nullptr;
  dt_status st = dt_op_linear(x1, w, b, &y1);
  if (st == DT_OK)
    st = dt_op_mul(y1, c1, &yc1);
  if (st == DT_OK && shared) {
    st = dt_op_linear(x2, w, nullptr, &y2);
    if (st == DT_OK)
      st = dt_op_mul(y2, c2, &yc2);
    if (st == DT_OK)
      st = dt_op_add(yc1, yc2, &s);
  }
  if (st == DT_OK)
    st = dt_op_sum(shared ? s : yc1, nullptr, 0, 0, &loss);
  if (st == DT_OK)
    st = dt_backward(loss, nullptr);
  for (dt_tensor *t : {y1, yc1, y2, yc2, s, loss})
    dt_tensor_release(t);
  return st;
}

// linear_loss_backward over three passes, the gradients accumulating: with rows-ready hooks
// (w in blocks of `part` rows, b whole) the gradients are bit for bit those
// without, and the hooks see, on the last contributor only, the bias, then
// w's blocks from the last to the first, each with its final values.
void check_rows_hooks(bool shared, int64_t part) {
  SCOPED_TRACE(std::string(shared ? "w in two linears" : "one linear") + ", part " +
               std::to_string(part));
  Tensors ts;
  dt_tensor *x1 = ts.add(RandomTensor({24, 40}, 31)), *x2 = ts.add(RandomTensor({24, 40}, 32));
  dt_tensor *c1 = ts.add(RandomTensor({24, 100}, 33)), *c2 = ts.add(RandomTensor({24, 100}, 34));
  std::vector<RowsEvent> events;
  V grads[2][2];
  for (int hooked = 0; hooked < 2; hooked++) {
    dt_tensor *w = ts.add(RandomTensor({100, 40}, 35, true));
    dt_tensor *b = ts.add(RandomTensor({100}, 36, true));
    RowsLog wl = {'w', &events}, bl = {'b', &events};
    for (int pass = 0; pass < 3; pass++) {
      if (hooked && pass == 1) {  // the first pass made the .grad the ops add into
        ASSERT_DT_OK(dt_tensor_set_grad_rows_hook(w, part, RecordRows, &wl));
        ASSERT_DT_OK(dt_tensor_set_grad_rows_hook(b, 100, RecordRows, &bl));
        EXPECT_EQ(dt_tensor_set_grad_rows_hook(b, 100, RecordRows, &bl), DT_ERR_STATE);
        ASSERT_DT_OK(dt_tensor_add_grad_ready_hook(w, RecordReady, &wl, nullptr));
        ASSERT_DT_OK(dt_tensor_add_grad_ready_hook(b, RecordReady, &bl, nullptr));
      }
      events.clear();
      ASSERT_DT_OK(linear_loss_backward(x1, x2, c1, c2, w, b, shared));
      if (!hooked || pass == 0)
        continue;
      V gw = ToVector(dt_tensor_grad(w)), gb = ToVector(dt_tensor_grad(b));
      std::string order;
      for (const RowsEvent &e : events) {
        order += e.who;
        if (e.who == 'w') {
          order += std::to_string(e.row0) + "+" + std::to_string(e.nrows);
          EXPECT_EQ(e.rows, V(gw.begin() + e.row0 * 40, gw.begin() + (e.row0 + e.nrows) * 40))
              << "rows " << e.row0 << ": not final when reported";
        } else if (e.who == 'b') {
          EXPECT_EQ(e.rows, gb) << "the bias was not final when reported";
        }
        order += " ";
      }
      if (part < 100)
        EXPECT_EQ(order, "b w96+4 w64+32 w32+32 w0+32 W B ") << "pass " << pass;
      else  // one block: nothing to report early
        EXPECT_EQ(order, "W B ") << "pass " << pass;
    }
    grads[hooked][0] = ToVector(dt_tensor_grad(w));
    grads[hooked][1] = ToVector(dt_tensor_grad(b));
    dt_tensor_clear_grad_rows_hook(w);
    dt_tensor_clear_grad_rows_hook(b);
  }
  EXPECT_EQ(grads[1][0], grads[0][0]) << "the weight's gradient in blocks differs";
  EXPECT_EQ(grads[1][1], grads[0][1]) << "the bias's gradient differs";
}

TEST(OpsAutograd, RowsHooksReportLinearGradientsInBlocksLastToFirst) {
  for (bool shared : {false, true})
    for (int64_t part : {32, 100})
      check_rows_hooks(shared, part);
}

// A grad-destination hook handing out slices of one buffer: the gradients
// of w and b (w in one or two linears) are written there, bit for bit those
// of the engine's own .grad; a hook that declines changes nothing; a hook's
// error fails the backward.
struct DestLog {
  dt_tensor *buf;
  int64_t offset;
  int calls;
  dt_status fail;
};
dt_status HandOutSlice(dt_tensor *leaf, void *user, dt_tensor **grad) {
  DestLog *l = static_cast<DestLog *>(user);
  l->calls++;
  *grad = nullptr;
  if (l->fail != DT_OK)
    return DT_ERROR(l->fail, "the hook refused");
  if (l->buf == nullptr)
    return DT_OK;
  int64_t n = dt_tensor_numel(leaf);
  return dt_tensor_view_flat(l->buf, l->offset, &n, 1, grad);
}

TEST(OpsAutograd, GradDestHookWritesTheGradientWhereItSays) {
  for (bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "w in two linears" : "one linear");
    Tensors ts;
    dt_tensor *x1 = ts.add(RandomTensor({24, 40}, 41)), *x2 = ts.add(RandomTensor({24, 40}, 42));
    dt_tensor *c1 = ts.add(RandomTensor({24, 100}, 43)), *c2 = ts.add(RandomTensor({24, 100}, 44));
    int64_t total = 100 * 40 + 100 + 7;
    dt_tensor *buf = nullptr;
    ASSERT_DT_OK(dt_tensor_zeros(&total, 1, DT_DTYPE_F32, DT_CPU, &buf));
    ts.add(buf);
    V grads[3][2];
    for (int mode = 0; mode < 4; mode++) {  // none, slices, declining, failing
      dt_tensor *w = ts.add(RandomTensor({100, 40}, 45, true));
      dt_tensor *b = ts.add(RandomTensor({100}, 46, true));
      DestLog wl = {mode == 1 ? buf : nullptr, 3, 0, mode == 3 ? DT_ERR_OOM : DT_OK};
      DestLog bl = {mode == 1 ? buf : nullptr, 3 + 4000, 0, DT_OK};
      if (mode > 0) {
        ASSERT_DT_OK(dt_tensor_set_grad_dest_hook(w, HandOutSlice, &wl));
        ASSERT_DT_OK(dt_tensor_set_grad_dest_hook(b, HandOutSlice, &bl));
        EXPECT_EQ(dt_tensor_set_grad_dest_hook(b, HandOutSlice, &bl), DT_ERR_STATE);
      }
      dt_status st = linear_loss_backward(x1, x2, c1, c2, w, b, shared);
      if (mode == 3) {
        EXPECT_EQ(st, DT_ERR_OOM) << "the hook's error did not fail the backward";
        dt_clear_error();
        continue;
      }
      ASSERT_DT_OK(st);
      if (mode > 0)
        EXPECT_EQ(wl.calls, 1) << "the hook is asked once, while the leaf has no .grad";
      if (mode == 1) {
        const float *base = static_cast<const float *>(dt_tensor_data(buf));
        EXPECT_EQ(dt_tensor_data(dt_tensor_grad(w)), base + 3) << "w's gradient is elsewhere";
        EXPECT_EQ(dt_tensor_data(dt_tensor_grad(b)), base + 4003) << "b's gradient is elsewhere";
        V all = ToVector(buf);
        EXPECT_EQ(all[0], 0.0f);
        EXPECT_EQ(all[total - 1], 0.0f) << "written outside the slices";
      }
      grads[mode][0] = ToVector(dt_tensor_grad(w));
      grads[mode][1] = ToVector(dt_tensor_grad(b));
      dt_tensor_clear_grad_dest_hook(w);
      dt_tensor_clear_grad_dest_hook(b);
    }
    for (int mode = 1; mode < 3; mode++) {
      EXPECT_EQ(grads[mode][0], grads[0][0]) << "w's gradient differs, mode " << mode;
      EXPECT_EQ(grads[mode][1], grads[0][1]) << "b's gradient differs, mode " << mode;
    }
    ASSERT_DT_OK(dt_tensor_fill_(buf, 0.0f));
  }
}

}  // namespace
