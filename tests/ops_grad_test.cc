// Finite-difference gradient checks for every differentiable op in
// core/ops.h (see dtt::GradCheck in test_util.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/ops.h"
#include "core/rng.h"
#include "tests/test_util.h"

namespace {

using dtt::GradCheck;
using dtt::GradCheckOptions;
using dtt::MakeIndexTensor;
using dtt::MakeTensor;
using dtt::OpFn;
using dtt::RandomTensor;
using dtt::TensorRef;
using dtt::Tensors;
using In = std::vector<dt_tensor *>;

// Random values whose magnitude is at least `margin` (away from the kinks of
// relu and the ties of max).
std::vector<float> AwayFromZero(size_t n, uint64_t seed, float margin) {
  std::vector<float> v = dtt::RandomValues(n, seed, -1.0f, 1.0f);
  for (float &x : v)
    x = x < 0 ? x - margin : x + margin;
  return v;
}

// A permutation of distinct values spaced `gap` apart, so max pooling has
// no near-ties.
std::vector<float> DistinctValues(size_t n, uint64_t seed, float gap) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = ((float)i - (float)n / 2) * gap;
  for (size_t i = n; i > 1; --i)
    std::swap(v[i - 1], v[dt_rng_bits(seed, i) % i]);
  return v;
}

// ---- elementwise with broadcasting ----

struct BinaryCase {
  std::vector<int64_t> a, b;
};

const BinaryCase kBroadcastCases[] = {
    {{3, 4}, {3, 4}},        // identical shapes
    {{2, 3, 4}, {4}},        // trailing vector
    {{5, 3}, {1, 3}},        // bias (1, C)
    {{5, 3}, {3}},           // bias (C)
    {{2, 1, 4}, {3, 1}},     // both broadcast
    {{1}, {2, 3}},           // scalar-like on the left
    {{2, 3, 4}, {2, 1, 4}},  // middle dim
    {{4, 1, 3, 1}, {2, 1, 5}},
};

void CheckBinary(dt_status (*op)(dt_tensor *, dt_tensor *, dt_tensor **)) {
  uint64_t seed = 1;
  for (const BinaryCase &c : kBroadcastCases) {
    Tensors ts;
    dt_tensor *a = ts.add(RandomTensor(c.a, seed++, true));
    dt_tensor *b = ts.add(RandomTensor(c.b, seed++, true));
    OpFn fn = [op](const In &x, dt_tensor **out) { return op(x[0], x[1], out); };
    EXPECT_TRUE(GradCheck(fn, {a, b}))
        << "a " << ::testing::PrintToString(c.a) << " b " << ::testing::PrintToString(c.b);
  }
}

TEST(OpsGrad, Add) { CheckBinary(dt_op_add); }
TEST(OpsGrad, Sub) { CheckBinary(dt_op_sub); }
TEST(OpsGrad, Mul) { CheckBinary(dt_op_mul); }

TEST(OpsGrad, BinaryOnlyOneInputRequiresGrad) {
  Tensors ts;
  dt_tensor *a = ts.add(RandomTensor({3, 4}, 11, true));
  dt_tensor *b = ts.add(RandomTensor({4}, 12, false));
  OpFn mul = [](const In &x, dt_tensor **out) { return dt_op_mul(x[0], x[1], out); };
  EXPECT_TRUE(GradCheck(mul, {a, b}));
  OpFn sub = [](const In &x, dt_tensor **out) { return dt_op_sub(x[1], x[0], out); };
  EXPECT_TRUE(GradCheck(sub, {a, b}));
}

TEST(OpsGrad, MulNonContiguousInputs) {
  Tensors ts;
  dt_tensor *a = ts.add(RandomTensor({4, 3}, 13, true));
  dt_tensor *b = ts.add(RandomTensor({3, 4}, 14, true));
  OpFn fn = [](const In &x, dt_tensor **out) {
    dt_tensor *at = nullptr;
    DT_CHECK(dt_tensor_transpose(x[0], 0, 1, &at));  // (3, 4), strides (1, 3)
    dt_status st = dt_op_mul(at, x[1], out);
    dt_tensor_release(at);
    return st;
  };
  EXPECT_TRUE(GradCheck(fn, {a, b}));
}

TEST(OpsGrad, SameInputTwice) {
  Tensors ts;
  dt_tensor *a = ts.add(RandomTensor({2, 5}, 15, true));
  OpFn fn = [](const In &x, dt_tensor **out) { return dt_op_mul(x[0], x[0], out); };
  EXPECT_TRUE(GradCheck(fn, {a}));
}

TEST(OpsGrad, Scale) {
  Tensors ts;
  dt_tensor *a = ts.add(RandomTensor({3, 4}, 16, true));
  for (float alpha : {2.5f, -0.5f}) {
    OpFn fn = [alpha](const In &x, dt_tensor **out) { return dt_op_scale(x[0], alpha, out); };
    EXPECT_TRUE(GradCheck(fn, {a})) << "alpha " << alpha;
  }
}

TEST(OpsGrad, Relu) {
  Tensors ts;
  dt_tensor *a = ts.add(MakeTensor(AwayFromZero(24, 17, 0.05f), {2, 3, 4}, true));
  OpFn fn = [](const In &x, dt_tensor **out) { return dt_op_relu(x[0], out); };
  EXPECT_TRUE(GradCheck(fn, {a}));
}

TEST(OpsGrad, Gelu) {
  Tensors ts;
  dt_tensor *a = ts.add(RandomTensor({2, 3, 4}, 18, true, -3.0f, 3.0f));
  OpFn fn = [](const In &x, dt_tensor **out) { return dt_op_gelu(x[0], out); };
  EXPECT_TRUE(GradCheck(fn, {a}));
}

TEST(OpsGrad, Tanh) {
  Tensors ts;
  dt_tensor *a = ts.add(RandomTensor({5, 4}, 19, true, -2.0f, 2.0f));
  OpFn fn = [](const In &x, dt_tensor **out) { return dt_op_tanh(x[0], out); };
  EXPECT_TRUE(GradCheck(fn, {a}));
}

// ---- linear algebra ----

TEST(OpsGrad, Matmul2D) {
  Tensors ts;
  dt_tensor *a = ts.add(RandomTensor({3, 4}, 20, true));
  dt_tensor *b = ts.add(RandomTensor({4, 5}, 21, true));
  OpFn fn = [](const In &x, dt_tensor **out) { return dt_op_matmul(x[0], x[1], out); };
  EXPECT_TRUE(GradCheck(fn, {a, b}));
}

TEST(OpsGrad, MatmulLeadingDimsFlattened) {
  Tensors ts;
  dt_tensor *a = ts.add(RandomTensor({2, 3, 4}, 22, true));
  dt_tensor *b = ts.add(RandomTensor({4, 2}, 23, true));
  OpFn fn = [](const In &x, dt_tensor **out) { return dt_op_matmul(x[0], x[1], out); };
  EXPECT_TRUE(GradCheck(fn, {a, b}));
}

TEST(OpsGrad, MatmulBatched) {
  Tensors ts;
  dt_tensor *a = ts.add(RandomTensor({2, 3, 4}, 24, true));
  dt_tensor *b = ts.add(RandomTensor({2, 4, 5}, 25, true));
  OpFn fn = [](const In &x, dt_tensor **out) { return dt_op_matmul(x[0], x[1], out); };
  EXPECT_TRUE(GradCheck(fn, {a, b}));
  // 4-D: (B1, B2, m, k) @ (B1, B2, k, n)
  dt_tensor *c = ts.add(RandomTensor({2, 2, 3, 2}, 26, true));
  dt_tensor *d = ts.add(RandomTensor({2, 2, 2, 3}, 27, true));
  EXPECT_TRUE(GradCheck(fn, {c, d}));
}

TEST(OpsGrad, MatmulTransposedOperand) {
  Tensors ts;
  dt_tensor *a = ts.add(RandomTensor({3, 4}, 28, true));
  dt_tensor *b = ts.add(RandomTensor({5, 4}, 29, true));
  OpFn fn = [](const In &x, dt_tensor **out) {
    dt_tensor *bt = nullptr;
    DT_CHECK(dt_tensor_transpose(x[1], 0, 1, &bt));
    dt_status st = dt_op_matmul(x[0], bt, out);
    dt_tensor_release(bt);
    return st;
  };
  EXPECT_TRUE(GradCheck(fn, {a, b}));
}

TEST(OpsGrad, Linear) {
  Tensors ts;
  dt_tensor *x = ts.add(RandomTensor({4, 3}, 30, true));
  dt_tensor *w = ts.add(RandomTensor({5, 3}, 31, true));
  dt_tensor *b = ts.add(RandomTensor({5}, 32, true));
  OpFn with_bias = [](const In &v, dt_tensor **out) { return dt_op_linear(v[0], v[1], v[2], out); };
  OpFn no_bias = [](const In &v, dt_tensor **out) {
    return dt_op_linear(v[0], v[1], nullptr, out);
  };
  EXPECT_TRUE(GradCheck(with_bias, {x, w, b}));
  EXPECT_TRUE(GradCheck(no_bias, {x, w}));
  // (B, T, in) input
  dt_tensor *x3 = ts.add(RandomTensor({2, 3, 3}, 33, true));
  EXPECT_TRUE(GradCheck(with_bias, {x3, w, b}));
  // weight frozen: only x and b
  dt_tensor *wf = ts.add(RandomTensor({5, 3}, 34, false));
  EXPECT_TRUE(GradCheck(with_bias, {x, wf, b}));
}

// ---- softmax and losses ----

TEST(OpsGrad, Softmax) {
  Tensors ts;
  for (auto shape : {std::vector<int64_t>{3, 5}, std::vector<int64_t>{2, 3, 4}}) {
    dt_tensor *x = ts.add(RandomTensor(shape, 35, true, -2.0f, 2.0f));
    OpFn sm = [](const In &v, dt_tensor **out) { return dt_op_softmax(v[0], -1, out); };
    OpFn lsm = [](const In &v, dt_tensor **out) { return dt_op_log_softmax(v[0], -1, out); };
    EXPECT_TRUE(GradCheck(sm, {x}));
    EXPECT_TRUE(GradCheck(lsm, {x}));
  }
}

TEST(OpsGrad, CrossEntropyReductions) {
  Tensors ts;
  dt_tensor *logits = ts.add(RandomTensor({4, 5}, 36, true, -2.0f, 2.0f));
  dt_tensor *target = ts.add(MakeIndexTensor({1, 0, 4, 2}, {4}));
  for (dt_reduction r : {DT_REDUCTION_MEAN, DT_REDUCTION_SUM, DT_REDUCTION_NONE}) {
    OpFn fn = [r](const In &v, dt_tensor **out) {
      return dt_op_cross_entropy(v[0], v[1], r, -100, out);
    };
    EXPECT_TRUE(GradCheck(fn, {logits, target})) << "reduction " << r;
  }
}

TEST(OpsGrad, CrossEntropyIgnoreIndexAndI32Targets) {
  Tensors ts;
  dt_tensor *logits = ts.add(RandomTensor({5, 3}, 37, true, -2.0f, 2.0f));
  dt_tensor *target = ts.add(MakeIndexTensor({2, -1, 0, -1, 1}, {5}, DT_DTYPE_I32));
  for (dt_reduction r : {DT_REDUCTION_MEAN, DT_REDUCTION_SUM, DT_REDUCTION_NONE}) {
    OpFn fn = [r](const In &v, dt_tensor **out) {
      return dt_op_cross_entropy(v[0], v[1], r, -1, out);
    };
    EXPECT_TRUE(GradCheck(fn, {logits, target})) << "reduction " << r;
  }
}

TEST(OpsGrad, CrossEntropySequenceLogits) {
  Tensors ts;
  dt_tensor *logits = ts.add(RandomTensor({2, 3, 4}, 38, true, -2.0f, 2.0f));
  dt_tensor *target = ts.add(MakeIndexTensor({3, 0, 1, 2, 2, 0}, {2, 3}));
  OpFn fn = [](const In &v, dt_tensor **out) {
    return dt_op_cross_entropy(v[0], v[1], DT_REDUCTION_MEAN, -100, out);
  };
  EXPECT_TRUE(GradCheck(fn, {logits, target}));
}

TEST(OpsGrad, Mse) {
  Tensors ts;
  dt_tensor *a = ts.add(RandomTensor({3, 4}, 39, true));
  dt_tensor *b = ts.add(RandomTensor({3, 4}, 40, true));
  for (dt_reduction r : {DT_REDUCTION_MEAN, DT_REDUCTION_SUM, DT_REDUCTION_NONE}) {
    OpFn fn = [r](const In &v, dt_tensor **out) { return dt_op_mse(v[0], v[1], r, out); };
    EXPECT_TRUE(GradCheck(fn, {a, b})) << "reduction " << r;
  }
}

// ---- convolution and pooling ----

struct ConvCase {
  std::vector<int64_t> x, w;
  int stride, padding;
  bool bias;
};

TEST(OpsGrad, Conv2d) {
  const ConvCase cases[] = {
      {{1, 1, 5, 5}, {2, 1, 3, 3}, 1, 0, true},
      {{2, 3, 6, 5}, {4, 3, 3, 3}, 2, 1, true},   // stride 2 + padding
      {{2, 2, 5, 6}, {3, 2, 2, 3}, 1, 1, false},  // rectangular kernel, no bias
      {{1, 2, 7, 7}, {2, 2, 3, 3}, 3, 2, true},
      {{2, 4, 3, 3}, {3, 4, 1, 1}, 1, 0, true},  // 1x1
  };
  uint64_t seed = 41;
  for (const ConvCase &c : cases) {
    Tensors ts;
    dt_tensor *x = ts.add(RandomTensor(c.x, seed++, true));
    dt_tensor *w = ts.add(RandomTensor(c.w, seed++, true));
    dt_tensor *b = c.bias ? ts.add(RandomTensor({c.w[0]}, seed++, true)) : nullptr;
    int stride = c.stride, padding = c.padding;
    OpFn fn = [stride, padding](const In &v, dt_tensor **out) {
      return dt_op_conv2d(v[0], v[1], v.size() > 2 ? v[2] : nullptr, stride, padding, out);
    };
    In inputs = {x, w};
    if (b)
      inputs.push_back(b);
    EXPECT_TRUE(GradCheck(fn, inputs))
        << "x " << ::testing::PrintToString(c.x) << " w " << ::testing::PrintToString(c.w)
        << " stride " << stride << " padding " << padding;
  }
}

struct PoolCase {
  std::vector<int64_t> x;
  int kernel, stride, padding;
};

const PoolCase kPoolCases[] = {
    {{1, 2, 4, 4}, 2, 2, 0},
    {{2, 2, 5, 5}, 3, 2, 1},  // stride 2 + padding
    {{1, 3, 6, 5}, 3, 1, 1},  // overlapping windows
    {{2, 1, 7, 6}, 2, 3, 1},  // stride > kernel: some inputs get no gradient
};

TEST(OpsGrad, MaxPool2d) {
  uint64_t seed = 60;
  for (const PoolCase &c : kPoolCases) {
    Tensors ts;
    size_t n = 1;
    for (int64_t d : c.x)
      n *= (size_t)d;
    dt_tensor *x = ts.add(MakeTensor(DistinctValues(n, seed++, 0.05f), c.x, true));
    int k = c.kernel, s = c.stride, p = c.padding;
    OpFn fn = [k, s, p](const In &v, dt_tensor **out) {
      return dt_op_max_pool2d(v[0], k, s, p, out);
    };
    EXPECT_TRUE(GradCheck(fn, {x})) << "x " << ::testing::PrintToString(c.x) << " kernel " << k
                                    << " stride " << s << " padding " << p;
  }
}

TEST(OpsGrad, AvgPool2d) {
  uint64_t seed = 70;
  for (const PoolCase &c : kPoolCases) {
    Tensors ts;
    dt_tensor *x = ts.add(RandomTensor(c.x, seed++, true));
    int k = c.kernel, s = c.stride, p = c.padding;
    OpFn fn = [k, s, p](const In &v, dt_tensor **out) {
      return dt_op_avg_pool2d(v[0], k, s, p, out);
    };
    EXPECT_TRUE(GradCheck(fn, {x})) << "x " << ::testing::PrintToString(c.x) << " kernel " << k
                                    << " stride " << s << " padding " << p;
  }
}

// ---- normalisation ----

TEST(OpsGrad, BatchNorm2dTraining) {
  for (auto shape : {std::vector<int64_t>{3, 2, 3, 2}, std::vector<int64_t>{5, 3}}) {
    Tensors ts;
    int64_t c = shape[1];
    dt_tensor *x = ts.add(RandomTensor(shape, 80, true, -2.0f, 2.0f));
    dt_tensor *gamma = ts.add(RandomTensor({c}, 81, true, 0.5f, 1.5f));
    dt_tensor *beta = ts.add(RandomTensor({c}, 82, true));
    dt_tensor *rm = ts.add(RandomTensor({c}, 83, false));
    dt_tensor *rv = ts.add(RandomTensor({c}, 84, false, 0.5f, 1.5f));
    OpFn fn = [rm, rv](const In &v, dt_tensor **out) {
      return dt_op_batch_norm2d(v[0], v[1], v[2], rm, rv, 1, 0.1f, 1e-5f, out);
    };
    EXPECT_TRUE(GradCheck(fn, {x, gamma, beta})) << ::testing::PrintToString(shape);
    // affine = False and no running stats
    OpFn plain = [](const In &v, dt_tensor **out) {
      return dt_op_batch_norm2d(v[0], nullptr, nullptr, nullptr, nullptr, 1, 0.1f, 1e-5f, out);
    };
    EXPECT_TRUE(GradCheck(plain, {x})) << ::testing::PrintToString(shape);
  }
}

TEST(OpsGrad, BatchNorm2dEval) {
  Tensors ts;
  dt_tensor *x = ts.add(RandomTensor({2, 3, 2, 2}, 85, true, -2.0f, 2.0f));
  dt_tensor *gamma = ts.add(RandomTensor({3}, 86, true, 0.5f, 1.5f));
  dt_tensor *beta = ts.add(RandomTensor({3}, 87, true));
  dt_tensor *rm = ts.add(RandomTensor({3}, 88, false));
  dt_tensor *rv = ts.add(RandomTensor({3}, 89, false, 0.5f, 1.5f));
  OpFn fn = [rm, rv](const In &v, dt_tensor **out) {
    return dt_op_batch_norm2d(v[0], v[1], v[2], rm, rv, 0, 0.1f, 1e-5f, out);
  };
  EXPECT_TRUE(GradCheck(fn, {x, gamma, beta}));
}

TEST(OpsGrad, LayerNorm) {
  for (auto shape : {std::vector<int64_t>{3, 5}, std::vector<int64_t>{2, 3, 4}}) {
    Tensors ts;
    int64_t d = shape.back();
    dt_tensor *x = ts.add(RandomTensor(shape, 90, true, -2.0f, 2.0f));
    dt_tensor *gamma = ts.add(RandomTensor({d}, 91, true, 0.5f, 1.5f));
    dt_tensor *beta = ts.add(RandomTensor({d}, 92, true));
    OpFn fn = [](const In &v, dt_tensor **out) {
      return dt_op_layer_norm(v[0], v[1], v[2], 1e-5f, out);
    };
    OpFn plain = [](const In &v, dt_tensor **out) {
      return dt_op_layer_norm(v[0], nullptr, nullptr, 1e-5f, out);
    };
    EXPECT_TRUE(GradCheck(fn, {x, gamma, beta})) << ::testing::PrintToString(shape);
    EXPECT_TRUE(GradCheck(plain, {x})) << ::testing::PrintToString(shape);
  }
}

// ---- embedding, dropout ----

TEST(OpsGrad, Embedding) {
  Tensors ts;
  dt_tensor *table = ts.add(RandomTensor({5, 4}, 93, true));
  for (dt_dtype dt : {DT_DTYPE_I64, DT_DTYPE_I32}) {
    // repeated ids accumulate; id 3 unused (zero gradient rows)
    dt_tensor *idx = ts.add(MakeIndexTensor({1, 0, 4, 1, 2, 1}, {2, 3}, dt));
    OpFn fn = [](const In &v, dt_tensor **out) { return dt_op_embedding(v[0], v[1], out); };
    EXPECT_TRUE(GradCheck(fn, {idx, table})) << dt_dtype_name(dt);
  }
}

TEST(OpsGrad, Dropout) {
  Tensors ts;
  dt_tensor *x = ts.add(RandomTensor({4, 6}, 94, true));
  for (float p : {0.3f, 0.7f}) {
    OpFn fn = [p](const In &v, dt_tensor **out) {
      dt_generator gen;
      dt_generator_init(&gen, 1234);  // the same mask on every call
      return dt_op_dropout(v[0], p, 1, &gen, out);
    };
    EXPECT_TRUE(GradCheck(fn, {x})) << "p " << p;
  }
}

// ---- reductions and shape ----

struct ReduceCase {
  std::vector<int64_t> shape;
  std::vector<int> dims;
  int keepdim;
};

const ReduceCase kReduceCases[] = {
    {{2, 3, 4}, {}, 0},  // all dims -> scalar
    {{2, 3, 4}, {}, 1},  // all dims, keepdim -> (1, 1, 1)
    {{2, 3, 4}, {0}, 0},
    {{2, 3, 4}, {-1}, 1},
    {{2, 3, 4}, {1, 2}, 1},     // adjacent dims
    {{2, 3, 4}, {0, 2}, 0},     // non-adjacent dims
    {{2, 3, 4, 2}, {3, 1}, 1},  // unordered, non-adjacent, keepdim
    {{5}, {0}, 0},
};

TEST(OpsGrad, SumAndMean) {
  uint64_t seed = 100;
  for (const ReduceCase &c : kReduceCases) {
    Tensors ts;
    dt_tensor *x = ts.add(RandomTensor(c.shape, seed++, true));
    std::vector<int> dims = c.dims;
    int keep = c.keepdim;
    OpFn sum = [dims, keep](const In &v, dt_tensor **out) {
      return dt_op_sum(v[0], dims.data(), (int)dims.size(), keep, out);
    };
    OpFn mean = [dims, keep](const In &v, dt_tensor **out) {
      return dt_op_mean(v[0], dims.data(), (int)dims.size(), keep, out);
    };
    EXPECT_TRUE(GradCheck(sum, {x})) << ::testing::PrintToString(c.shape) << " dims "
                                     << ::testing::PrintToString(c.dims) << " keepdim " << keep;
    EXPECT_TRUE(GradCheck(mean, {x})) << ::testing::PrintToString(c.shape) << " dims "
                                      << ::testing::PrintToString(c.dims) << " keepdim " << keep;
  }
}

TEST(OpsGrad, Concat) {
  Tensors ts;
  dt_tensor *a = ts.add(RandomTensor({2, 3}, 110, true));
  dt_tensor *b = ts.add(RandomTensor({1, 3}, 111, true));
  dt_tensor *c = ts.add(RandomTensor({2, 2}, 112, true));
  dt_tensor *d = ts.add(RandomTensor({2, 3}, 113, false));
  OpFn dim0 = [](const In &v, dt_tensor **out) { return dt_op_concat(v.data(), 3, 0, out); };
  EXPECT_TRUE(GradCheck(dim0, {a, b, d}));
  OpFn dim1 = [](const In &v, dt_tensor **out) { return dt_op_concat(v.data(), 3, 1, out); };
  EXPECT_TRUE(GradCheck(dim1, {a, c, d}));
  OpFn last = [](const In &v, dt_tensor **out) { return dt_op_concat(v.data(), 2, -1, out); };
  EXPECT_TRUE(GradCheck(last, {c, a}));
}

TEST(OpsGrad, ConcatMoreInputsThanANodeHolds) {
  Tensors ts;
  In xs;
  for (int i = 0; i < 9; ++i)
    xs.push_back(ts.add(RandomTensor({2, 1 + i % 3, 2}, 120 + i, i != 4)));
  OpFn fn = [](const In &v, dt_tensor **out) {
    return dt_op_concat(v.data(), (int)v.size(), 1, out);
  };
  EXPECT_TRUE(GradCheck(fn, xs));
}

TEST(OpsGrad, Flatten) {
  Tensors ts;
  dt_tensor *x = ts.add(RandomTensor({2, 3, 2, 2}, 130, true));
  OpFn fn = [](const In &v, dt_tensor **out) { return dt_op_flatten(v[0], out); };
  EXPECT_TRUE(GradCheck(fn, {x}));
  // non-contiguous input (flatten copies, like torch.flatten)
  OpFn perm = [](const In &v, dt_tensor **out) {
    int p[4] = {0, 2, 3, 1};
    dt_tensor *t = nullptr;
    DT_CHECK(dt_tensor_permute(v[0], p, &t));
    dt_status st = dt_op_flatten(t, out);
    dt_tensor_release(t);
    return st;
  };
  EXPECT_TRUE(GradCheck(perm, {x}));
}

// ---- composition: a small classifier, end to end ----

TEST(OpsGrad, TwoLayerClassifier) {
  Tensors ts;
  dt_tensor *x = ts.add(RandomTensor({4, 6}, 140, true));
  dt_tensor *w1 = ts.add(RandomTensor({5, 6}, 141, true));
  dt_tensor *b1 = ts.add(RandomTensor({5}, 142, true));
  dt_tensor *w2 = ts.add(RandomTensor({3, 5}, 143, true));
  dt_tensor *target = ts.add(MakeIndexTensor({0, 2, 1, 2}, {4}));
  OpFn fn = [target](const In &v, dt_tensor **out) {
    dt_tensor *h = nullptr, *a = nullptr, *logits = nullptr;
    dt_status st = dt_op_linear(v[0], v[1], v[2], &h);
    if (st == DT_OK)
      st = dt_op_gelu(h, &a);
    if (st == DT_OK)
      st = dt_op_linear(a, v[3], nullptr, &logits);
    if (st == DT_OK)
      st = dt_op_cross_entropy(logits, target, DT_REDUCTION_MEAN, -100, out);
    dt_tensor_release(logits);
    dt_tensor_release(a);
    dt_tensor_release(h);
    return st;
  };
  EXPECT_TRUE(GradCheck(fn, {x, w1, b1, w2}));
}

// The checker itself must catch a wrong gradient: x * detach(x) has the
// analytic gradient x but the true derivative 2x.
TEST(OpsGrad, CheckerCatchesWrongGradient) {
  Tensors ts;
  dt_tensor *x = ts.add(RandomTensor({3, 3}, 150, true));
  OpFn fn = [](const In &v, dt_tensor **out) {
    dt_tensor *d = nullptr;
    DT_CHECK(dt_tensor_detach(v[0], &d));
    dt_status st = dt_op_mul(v[0], d, out);
    dt_tensor_release(d);
    return st;
  };
  EXPECT_FALSE(GradCheck(fn, {x}));
  // and a sign error: -x where the "gradient" flows through detach only
  OpFn sign = [](const In &v, dt_tensor **out) {
    dt_tensor *d = nullptr, *t = nullptr;
    DT_CHECK(dt_tensor_detach(v[0], &d));
    dt_status st = dt_op_scale(d, -2.0f, &t);  // no gradient
    if (st == DT_OK)
      st = dt_op_add(v[0], t, out);  // true derivative -1, analytic +1
    dt_tensor_release(t);
    dt_tensor_release(d);
    return st;
  };
  EXPECT_FALSE(GradCheck(sign, {x}));
}

}  // namespace
