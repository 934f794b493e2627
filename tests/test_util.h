// Helpers shared by the GoogleTest suites: tensors from host vectors,
// seeded random tensors, reading tensors back, owning holders, and a
// finite-difference gradient checker for differentiable ops.
#ifndef DT_TESTS_TEST_UTIL_H
#define DT_TESTS_TEST_UTIL_H

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/module.h"
#include "core/optim.h"
#include "core/status.h"
#include "core/tensor.h"
#include "tests/dt_assert.h"

namespace dtt {

// Owning handle: releases its tensor when it goes out of scope.
struct TensorDeleter {
  void operator()(dt_tensor *t) const { dt_tensor_release(t); }
};
using TensorRef = std::unique_ptr<dt_tensor, TensorDeleter>;

// Holds a test's tensors and releases them at the end of the scope:
// `dt_tensor *x = ts.add(MakeTensor(...));`.
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

// What a grad-ready hook saw: how often it fired, and the leaf's gradient
// when it last did. Registered as
//   dt_tensor_add_grad_ready_hook(leaf, dtt::RecordGradReady, &record, &handle)
struct GradReadyRecord {
  int fired = 0;
  std::vector<float> grad;
};
void RecordGradReady(dt_tensor *leaf, void *record);

// A model with its parameter arena and SGD optimizer, destroyed together.
struct SgdModel {
  dt_module *model = nullptr;
  dt_param_arena *arena = nullptr;
  dt_optimizer *opt = nullptr;
  ~SgdModel() {
    dt_optim_destroy(opt);
    dt_param_arena_destroy(arena);
    dt_module_destroy(model);
  }
};
// The arena of m->model (already where it trains) and SGD over it with
// lr, momentum and weight_decay (the other settings at their defaults).
dt_status AttachSgd(SgdModel *m, float lr, float momentum, float weight_decay);

// n uniform values in [lo, hi), a pure function of (seed, index).
std::vector<float> RandomValues(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f);
// n small deterministic values, scale * ((7i mod 13) - 6): no RNG needed.
std::vector<float> Ramp(int64_t n, float scale = 0.1f);

// f32 tensor with the given values (numel must match the shape).
dt_tensor *MakeTensor(const std::vector<float> &values, const std::vector<int64_t> &shape,
                      bool requires_grad = false, dt_device dev = DT_CPU);
// f32 tensor of seeded uniform values in [lo, hi).
dt_tensor *RandomTensor(const std::vector<int64_t> &shape, uint64_t seed,
                        bool requires_grad = false, float lo = -1.0f, float hi = 1.0f,
                        dt_device dev = DT_CPU);
// i32 or i64 tensor (class ids, token ids).
dt_tensor *MakeIndexTensor(const std::vector<int64_t> &values, const std::vector<int64_t> &shape,
                           dt_dtype dtype = DT_DTYPE_I64, dt_device dev = DT_CPU);

// Elements (row-major) of an f32 tensor of any layout, on the host.
std::vector<float> ToVector(const dt_tensor *t);
// Elements of an i32/i64 tensor as int64.
std::vector<int64_t> ToIndexVector(const dt_tensor *t);
std::vector<int64_t> Shape(const dt_tensor *t);
// Overwrites the elements (row-major) of the f32 tensor t, of any layout and
// device, with values (numel must match).
dt_status CopyFromHost(dt_tensor *t, const std::vector<float> &values);

// ---- finite-difference gradient check ----

// The upstream gradient R that GradCheck (and the op table's parity check)
// seed backward with: random signs, magnitudes in [0.5, 1.5), so that no
// output element is nearly ignored.
std::vector<float> UpstreamGradient(size_t n, uint64_t seed);

// concat(sum, norm) along the last dimension (st: the status that made them;
// both released).
dt_status ConcatBoth(dt_status st, dt_tensor *sum, dt_tensor *norm, dt_tensor **cat);
// concat(sum, norm) from the fused residual layer norm (inputs x,
// residual[, gamma, beta], eps 1e-5): both results in one tensor, so a
// gradient check or a comparison covers both.
dt_status ResidualLayerNormBoth(const std::vector<dt_tensor *> &x, dt_tensor **out);

// Builds the op's output from the inputs (the same tensors every call).
using OpFn = std::function<dt_status(const std::vector<dt_tensor *> &inputs, dt_tensor **out)>;

struct GradCheckOptions {
  double eps = 1e-2;   // central-difference step (on the f32 values)
  double atol = 5e-4;  // |analytic - numeric| <= atol + rtol * max(|analytic|, |numeric|)
  double rtol = 5e-3;
  uint64_t seed = 777;  // of the random projection R
  // Fail when every numeric gradient of an input is ~0 (the check would be
  // vacuous); set for inputs whose gradient really is zero.
  bool allow_zero_grad = false;
};

// Checks the gradients of every input with requires_grad. The loss is
// L = sum(op(x) * R) for a fixed random R (every output element matters);
// the analytic gradient comes from dt_backward(out, R), the numeric one
// from central differences of L computed in double on the host.
::testing::AssertionResult GradCheck(const OpFn &fn, const std::vector<dt_tensor *> &inputs,
                                     const GradCheckOptions &opt = GradCheckOptions());

}  // namespace dtt

#endif  // DT_TESTS_TEST_UTIL_H
