// Ops: forward values against hand-computed references, argument errors
// (device, shape, dtype), no_grad, views, dtype round trips and
// grad-ready hooks across several ops. Gradients: ops_grad_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
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
using dtt::ToVector;
using In = std::vector<dt_tensor *>;
using V = std::vector<float>;
using S = std::vector<int64_t>;

struct Tensors {
  std::vector<dt_tensor *> v;
  dt_tensor *add(dt_tensor *t) {
    v.push_back(t);
    return t;
  }
  ~Tensors() {
    for (dt_tensor *t : v)
      dt_tensor_release(t);
  }
};

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
    want.push_back(0.5f * v *
                   (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v))));
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
  ExpectNear(ToVector(y), {std::log(0.0900306f), std::log(0.2447285f), std::log(0.6652410f), -l3,
                           -l3, -l3});
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
  EXPECT_EQ(dt_op_cross_entropy(logits, target, DT_REDUCTION_MEAN, -100, &y),
            DT_ERR_INVALID_ARG);
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
  ASSERT_EQ(dt_op_layer_norm(x, g, b, 0.0f, &y), DT_OK);
  ts.add(y);
  float s = 1 / std::sqrt(1.25f);
  ExpectNear(ToVector(y), {-1.5f * s, -0.5f * s + 1, 2 * 0.5f * s, 2 * 1.5f * s + 1, NAN, NAN,
                           NAN, NAN}
                              .size() == 8
                              ? V{-1.5f * s, -0.5f * s + 1, 2 * 0.5f * s, 2 * 1.5f * s + 1}
                              : V{},
             1e-5f);
}

}  // namespace
