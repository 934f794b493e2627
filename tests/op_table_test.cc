// The table-driven op test (ggml's test-backend-ops, MODE_GRAD and
// MODE_TEST): every row of tests/op_table_cases.cc is
//   OpTable/Grad.FiniteDifferences/<row>  the finite-difference gradient on
//                                         the CPU (rows that are not
//                                         kParityOnly), and
//   OpTable/Parity.MatchesCpu/<row>       output, input gradients and inputs
//                                         after the call on the device under
//                                         test against the CPU.
// The device under test is cuda:0, or the one DT_PARITY_TEST_DEVICE names
// (cpu:1 in //tests:op_table_selfcheck_test, so that CI runs the parity
// path without a GPU). Without it every Parity case skips with the reason
// dt_backend_get() gives. TF32 is off: f32 rows compare exact products.
#include "tests/op_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/amp.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "core/env.h"
#include "core/half.h"
#include "core/ops.h"
#include "core/rng.h"
#include "cuda/cuda.h"
#include "tests/device_util.h"
#include "tests/test_util.h"

namespace optable {
namespace {

// ---- tolerances, by dtype ----

// |got - want| <= atol + rtol * |want| + scale * max |want| (over the tensor:
// the small elements of a sum are dominated by its summation order).
struct Tolerance {
  double rtol, atol, scale;
};

struct DtypeTolerances {
  dt_dtype dtype;
  double fd_eps, fd_atol, fd_rtol;  // finite differences (fd_eps 0: parity only)
  Tolerance parity[4];              // by Acc: exact, elementwise, reduction, normalisation
};

const DtypeTolerances kTolerances[] = {
    // f32, TF32 off: the same products as the CPU, summed in another order.
    {DT_DTYPE_F32,
     1e-2,
     5e-4,
     5e-3,
     {{0, 0, 0}, {1e-5, 1e-6, 0}, {1e-5, 1e-5, 1e-5}, {1e-3, 1e-5, 1e-5}}},
    // f16, bf16: the rows of the ops autocast runs in low precision (f32
    // inputs rounded to 16 bits, f32 accumulation). From the unit roundoff
    // (2^-11, 2^-8): the AutocastVsF32 check holds them to these against
    // f32 on the CPU, the parity check the device against the CPU (both
    // round the same inputs; the GPU sums in another order). Finite
    // differences need more precision than these dtypes have, so there is
    // no Grad check (the f32 row of the same op checks the gradient).
    {DT_DTYPE_F16, 0, 0, 0, {{0, 0, 0}, {1e-3, 1e-3, 0}, {1e-2, 1e-3, 1e-3}, {1e-2, 1e-3, 1e-3}}},
    {DT_DTYPE_BF16, 0, 0, 0, {{0, 0, 0}, {8e-3, 8e-3, 0}, {4e-2, 8e-3, 8e-3}, {4e-2, 8e-3, 8e-3}}},
};

const DtypeTolerances *TolerancesFor(dt_dtype d) {
  for (const DtypeTolerances &t : kTolerances)
    if (t.dtype == d)
      return &t;
  return nullptr;
}

constexpr uint64_t kUpstreamSeed = 777;  // the upstream gradient of both checks

// ---- the device under test ----

// cuda:0, or the device named by DT_PARITY_TEST_DEVICE.
dt_device TestDevice() { return dtt::TestDevice(DT_ENV_PARITY_TEST_DEVICE); }

std::string DeviceName(dt_device d) {
  char buf[32];
  return dt_device_format(d, buf, sizeof buf);
}

// Why the device under test cannot be used ("" when it can).
std::string NoDeviceReason() { return dtt::NoDeviceReason(TestDevice()); }

// TF32 off for the scope of a parity check.
struct NoTf32 {
  NoTf32() { dt_cuda_set_tf32(0); }
  ~NoTf32() { dt_cuda_set_tf32(1); }
};

// ---- inputs ----

uint64_t InputSeed(const OpCase &c, size_t k) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the row's name
  for (char ch : c.Name())
    h = (h ^ (uint8_t)ch) * 1099511628211ull;
  return dt_rng_bits(h, k);
}

std::vector<float> FloatValues(const Input &in, uint64_t seed) {
  size_t n = 1;
  for (int64_t d : in.shape)
    n *= (size_t)d;
  std::vector<float> v;
  switch (in.fill) {
    case Fill::kAwayFromZero:
      v = dtt::RandomValues(n, seed, -1.0f, 1.0f);
      for (float &x : v)
        x = x < 0 ? x - in.lo : x + in.lo;
      break;
    case Fill::kDistinct:
      v.resize(n);
      for (size_t i = 0; i < n; ++i)
        v[i] = ((float)i - (float)n / 2) * in.lo;
      for (size_t i = n; i > 1; --i)
        std::swap(v[i - 1], v[dt_rng_bits(seed, i) % i]);
      break;
    default: v = dtt::RandomValues(n, seed, in.lo, in.hi);
  }
  std::copy(in.head.begin(), in.head.begin() + std::min(in.head.size(), n), v.begin());
  return v;
}

std::vector<int64_t> IndexValues(const Input &in, uint64_t seed) {
  if (!in.ids.empty())
    return in.ids;
  size_t n = 1;
  for (int64_t d : in.shape)
    n *= (size_t)d;
  std::vector<int64_t> v(n);
  for (size_t i = 0; i < n; i++)
    v[i] = in.ignore_every > 0 && (int64_t)i % in.ignore_every == in.ignore_every / 2
               ? in.ignore
               : (int64_t)(dt_rng_bits(seed, i) % (uint64_t)in.hi);
  return v;
}

// Input k of row c on dev (a leaf; nullptr with a test failure on error).
// A 16-bit row's inputs marked Half() are 16-bit under autocast (f32 in the
// row's f32 reference).
dt_tensor *MakeInput(const OpCase &c, size_t k, dt_device dev, bool autocast = true) {
  const Input &in = c.inputs[k];
  uint64_t seed = InputSeed(c, k);
  if (in.fill == Fill::kIndex)
    return dtt::MakeIndexTensor(IndexValues(in, seed), in.shape, in.index_dtype, dev);
  dt_tensor *t = dtt::MakeTensor(FloatValues(in, seed), in.shape, false, dev);
  // a 16-bit row takes f32 inputs and runs under autocast (RunRow)
  bool convert = c.dtype != DT_DTYPE_F32 && (!dt_dtype_is_half(c.dtype) || (in.half && autocast));
  if (t && convert) {
    dt_tensor *conv = nullptr;
    EXPECT_EQ(dt_tensor_to_dtype(t, c.dtype, &conv), DT_OK) << dt_last_error();
    dt_tensor_release(t);
    t = conv;
  }
  if (t && in.requires_grad) {
    EXPECT_EQ(dt_tensor_set_requires_grad(t, 1), DT_OK) << dt_last_error();
  }
  return t;
}

// ---- reading back and comparing ----

// The elements of a tensor of any dtype, as doubles (exact for f32 and for
// ids below 2^53).
std::vector<double> Read(dt_tensor *t) {
  dt_dtype d = dt_tensor_dtype(t);
  if (d == DT_DTYPE_I32 || d == DT_DTYPE_I64) {
    std::vector<int64_t> v = dtt::ToIndexVector(t);
    return std::vector<double>(v.begin(), v.end());
  }
  dtt::TensorRef f32;
  if (d != DT_DTYPE_F32) {
    dt_tensor *c = nullptr;
    dt_no_grad_begin();
    EXPECT_EQ(dt_tensor_to_dtype(t, DT_DTYPE_F32, &c), DT_OK) << dt_last_error();
    dt_no_grad_end();
    f32.reset(c);
    t = c;
  }
  if (!t)
    return {};
  std::vector<float> v = dtt::ToVector(t);
  return std::vector<double>(v.begin(), v.end());
}

// got within tol of want everywhere (NaN matches NaN); reports the worst
// element.
::testing::AssertionResult Close(const std::vector<double> &got, const std::vector<double> &want,
                                 Tolerance tol) {
  return dtt::ParityClose(got, want, tol.rtol, tol.atol, tol.scale);
}

// What one backend made of a row.
struct Outcome {
  dt_status status = DT_OK;
  std::string message;  // dt_last_error() when status is not DT_OK
  std::string error;    // the harness's own failure (backward failed, ...)
  std::vector<int64_t> shape;
  dt_dtype dtype = DT_DTYPE_F32;
  std::vector<double> out;
  std::vector<bool> has_grad;
  std::vector<std::vector<double>> grads, after;  // per input
};

// Autocast to the row's dtype for the scope, when it is a 16-bit row.
struct RowAutocast {
  dt_dtype prev;
  RowAutocast(const OpCase &c, bool on)
      : prev(dt_autocast_begin(on && dt_dtype_is_half(c.dtype) ? c.dtype : DT_DTYPE_F32)) {}
  ~RowAutocast() { dt_autocast_end(prev); }
};

// The row on dev: forward; backward with the upstream gradient when the
// output requires grad; then the gradients and the inputs read back.
// autocast false runs a 16-bit row in f32 (its reference).
Outcome RunRow(const OpCase &c, dt_device dev, bool autocast = true) {
  Outcome o;
  RowAutocast scope(c, autocast);
  dtt::Tensors ts;
  std::vector<dt_tensor *> in;
  for (size_t k = 0; k < c.inputs.size(); k++) {
    in.push_back(ts.add(MakeInput(c, k, dev, autocast)));
    if (!in.back()) {
      o.error = "input " + std::to_string(k) + " could not be made on " + DeviceName(dev);
      return o;
    }
  }
  dt_tensor *out = nullptr;
  o.status = c.fn(in, &out);
  dtt::TensorRef out_ref(out);
  if (o.status == DT_OK) {
    // What a kernel found on the device (an index out of range) comes back
    // at the next synchronisation: a GPU's op returns before its kernels
    // ran. The row's status is the op's or that one.
    const dt_backend_ops *be = nullptr;
    o.status = dt_backend_get(dev, &be);
    if (o.status == DT_OK)
      o.status = be->device_synchronize(dev);
  }
  if (o.status != DT_OK) {
    o.message = dt_last_error();
    return o;
  }
  o.shape = dtt::Shape(out);
  o.dtype = dt_tensor_dtype(out);
  o.out = Read(out);
  if (dt_tensor_requires_grad(out)) {
    std::vector<float> r = dtt::UpstreamGradient((size_t)dt_tensor_numel(out), kUpstreamSeed);
    dtt::TensorRef rt(dtt::MakeTensor(r, o.shape, false, dev));
    dt_status st = dt_backward(out, rt.get());
    if (st != DT_OK) {
      o.error = std::string("backward failed: ") + dt_status_name(st) + ": " + dt_last_error();
      return o;
    }
  }
  for (dt_tensor *x : in) {
    dt_tensor *g = dt_tensor_grad(x);
    o.has_grad.push_back(g != nullptr);
    o.grads.push_back(g ? Read(g) : std::vector<double>());
    o.after.push_back(Read(x));
  }
  return o;
}

// The row's expected status (and message) on dev.
::testing::AssertionResult CheckStatus(const OpCase &c, const Outcome &o, dt_device dev) {
  if (!o.error.empty())
    return ::testing::AssertionFailure() << DeviceName(dev) << ": " << o.error;
  if (o.status != c.expect)
    return ::testing::AssertionFailure()
           << DeviceName(dev) << " returned " << dt_status_name(o.status) << " (" << o.message
           << "), the row expects " << dt_status_name(c.expect);
  if (c.expect != DT_OK && o.message.find(c.expect_msg) == std::string::npos)
    return ::testing::AssertionFailure() << DeviceName(dev) << ": the message \"" << o.message
                                         << "\" lacks \"" << c.expect_msg << "\"";
  return ::testing::AssertionSuccess();
}

// The row on dev against the row on the CPU.
::testing::AssertionResult CheckParity(const OpCase &c, dt_device dev) {
  const DtypeTolerances *t = TolerancesFor(c.dtype);
  if (!t)
    return ::testing::AssertionFailure()
           << "no tolerances for " << dt_dtype_name(c.dtype) << " in kTolerances";
  Outcome want = RunRow(c, DT_CPU), got = RunRow(c, dev);
  for (auto *r : {&want, &got}) {
    auto ok = CheckStatus(c, *r, r == &want ? DT_CPU : dev);
    if (!ok)
      return ok;
  }
  if (c.expect != DT_OK)
    return ::testing::AssertionSuccess();
  if (got.shape != want.shape || got.dtype != want.dtype)
    return ::testing::AssertionFailure()
           << "output " << dt_dtype_name(got.dtype) << ::testing::PrintToString(got.shape)
           << " vs cpu " << dt_dtype_name(want.dtype) << ::testing::PrintToString(want.shape);
  Tolerance tol = t->parity[(int)c.acc];
  Tolerance exact = {0, 0, 0};
  std::ostringstream failures;
  auto check = [&](const std::vector<double> &g, const std::vector<double> &w, Tolerance tl,
                   const std::string &what) {
    auto r = Close(g, w, tl);
    if (!r)
      failures << "\n  " << what << ": " << r.message();
  };
  check(got.out, want.out, c.flags & kExactForward ? exact : tol, "output");
  for (size_t k = 0; k < c.inputs.size(); k++) {
    std::string in = "input " + std::to_string(k);
    if (got.has_grad[k] != want.has_grad[k])
      failures << "\n  " << in << (want.has_grad[k] ? " got no gradient" : " got a gradient")
               << " on " << DeviceName(dev) << ", unlike on the cpu";
    else if (want.has_grad[k])
      check(got.grads[k], want.grads[k], tol, in + " gradient");
    check(got.after[k], want.after[k], tol, in + " after the call");
  }
  if (!failures.str().empty())
    return ::testing::AssertionFailure()
           << DeviceName(dev) << " differs from the cpu:" << failures.str();
  return ::testing::AssertionSuccess();
}

// ---- the two checks of every row ----

class Grad : public ::testing::TestWithParam<const OpCase *> {};
class Parity : public ::testing::TestWithParam<const OpCase *> {};

TEST_P(Grad, FiniteDifferences) {
  const OpCase &c = *GetParam();
  const DtypeTolerances *t = TolerancesFor(c.dtype);
  ASSERT_NE(t, nullptr) << "no tolerances for " << dt_dtype_name(c.dtype);
  dtt::Tensors ts;
  std::vector<dt_tensor *> in;
  for (size_t k = 0; k < c.inputs.size(); k++) {
    in.push_back(ts.add(MakeInput(c, k, DT_CPU)));
    ASSERT_NE(in.back(), nullptr);
  }
  dtt::GradCheckOptions opt;
  opt.eps = t->fd_eps, opt.atol = t->fd_atol, opt.rtol = t->fd_rtol, opt.seed = kUpstreamSeed;
  EXPECT_TRUE(dtt::GradCheck(c.fn, in, opt));
}

TEST_P(Parity, MatchesCpu) {
  const OpCase &c = *GetParam();
  if (c.expect != DT_OK) {  // the reference refuses the bad input, GPU or not
    EXPECT_TRUE(CheckStatus(c, RunRow(c, DT_CPU), DT_CPU));
  }
  std::string reason = NoDeviceReason();
  if (!reason.empty())
    GTEST_SKIP() << "no " << DeviceName(TestDevice()) << " to compare with the cpu: " << reason;
  NoTf32 no_tf32;
  EXPECT_TRUE(CheckParity(c, TestDevice()));
}

// A 16-bit row under autocast against the same row in f32, on the CPU:
// within the dtype's tolerances, and not bit for bit (the inputs were
// rounded: autocast took effect).
class Autocast : public ::testing::TestWithParam<const OpCase *> {};

// The dtype of a 16-bit row's output under autocast, from the op's policy
// (core/autocast_policy.def): the 16-bit dtype for a low-precision op, a
// norm, and a PROMOTE op all of whose float inputs are 16-bit, else f32.
dt_dtype AutocastResultDtype(const OpCase &c) {
  dt_autocast_policy p = dt_autocast_policy_of(("dt_op_" + c.op).c_str());
  bool all_half = true;
  for (const Input &in : c.inputs)
    all_half = all_half && (in.fill == Fill::kIndex || in.half);
  if (p == DT_AUTOCAST_LOW || (p == DT_AUTOCAST_PROMOTE && all_half))
    return c.dtype;
  // a norm's result is 16-bit; the residual layer norm's rows concatenate
  // it with the f32 sum, which promotes
  if (p == DT_AUTOCAST_NORM)
    return c.op == "residual_layer_norm" ? DT_DTYPE_F32 : c.dtype;
  return DT_DTYPE_F32;
}

// Whether a row gives the op a 16-bit input (Half()).
bool HasHalfInput(const OpCase &c) {
  for (const Input &in : c.inputs)
    if (in.half)
      return true;
  return false;
}

TEST_P(Autocast, CloseToF32) {
  const OpCase &c = *GetParam();
  Outcome got = RunRow(c, DT_CPU), want = RunRow(c, DT_CPU, /*autocast=*/false);
  ASSERT_TRUE(CheckStatus(c, got, DT_CPU));
  ASSERT_TRUE(CheckStatus(c, want, DT_CPU));
  ASSERT_EQ(got.shape, want.shape);
  EXPECT_EQ(got.dtype, AutocastResultDtype(c))
      << "the result's dtype under autocast (core/autocast_policy.def)";
  Tolerance tol = TolerancesFor(c.dtype)->parity[(int)c.acc];
  EXPECT_TRUE(Close(got.out, want.out, tol)) << "output";
  EXPECT_NE(got.out, want.out) << "autocast to " << dt_dtype_name(c.dtype)
                               << " left the output bit for bit the f32 one";
  for (size_t k = 0; k < c.inputs.size(); k++)
    if (want.has_grad[k]) {
      ASSERT_TRUE(got.has_grad[k]) << "input " << k;
      EXPECT_TRUE(Close(got.grads[k], want.grads[k], tol)) << "input " << k << " gradient";
    }
}

std::vector<const OpCase *> Rows(bool grad) {
  std::vector<const OpCase *> r;
  for (const OpCase &c : OpCases()) {
    const DtypeTolerances *t = TolerancesFor(c.dtype);
    bool fd = !(c.flags & kParityOnly) && c.expect == DT_OK && !(t && t->fd_eps == 0);
    if (!grad || fd)
      r.push_back(&c);
  }
  return r;
}

std::string RowName(const ::testing::TestParamInfo<const OpCase *> &info) {
  return info.param->Name();
}

INSTANTIATE_TEST_SUITE_P(OpTable, Grad, ::testing::ValuesIn(Rows(true)), RowName);
INSTANTIATE_TEST_SUITE_P(OpTable, Parity, ::testing::ValuesIn(Rows(false)), RowName);

std::vector<const OpCase *> HalfRows() {
  std::vector<const OpCase *> r;
  for (const OpCase &c : OpCases())
    if (dt_dtype_is_half(c.dtype) && c.expect == DT_OK)
      r.push_back(&c);
  return r;
}
INSTANTIATE_TEST_SUITE_P(OpTable, Autocast, ::testing::ValuesIn(HalfRows()), RowName);

// Every op of the op table has a policy in core/autocast_policy.def, every
// op the policy runs in low precision has rows for bf16 and f16, and, as
// under autocast any op can receive a low-precision op's 16-bit result,
// every op has bf16 and f16 rows with a 16-bit input.
TEST(OpTableCoverage, AutocastPolicyCoversEveryOp) {
  const std::set<std::string> policy = {
#define DT_AUTOCAST(op, policy) #op,
#include "core/autocast_policy.def"
  };
  std::set<std::string> bf16, f16, bf16_in, f16_in;
  for (const OpCase *c : HalfRows()) {
    (c->dtype == DT_DTYPE_BF16 ? bf16 : f16).insert("dt_op_" + c->op);
    if (HasHalfInput(*c))
      (c->dtype == DT_DTYPE_BF16 ? bf16_in : f16_in).insert("dt_op_" + c->op);
  }
  const char *declared[] = {
#define DT_OP(name, params) #name,
#include "core/op_table.def"
  };
  int low = 0;
  for (const char *op : declared) {
    EXPECT_TRUE(policy.count(op)) << op << " has no row in core/autocast_policy.def";
    EXPECT_TRUE(bf16_in.count(op)) << op << " takes 16-bit inputs but has no bf16 row with one";
    EXPECT_TRUE(f16_in.count(op)) << op << " takes 16-bit inputs but has no f16 row with one";
    if (dt_autocast_policy_of(op) == DT_AUTOCAST_LOW) {
      low++;
      EXPECT_TRUE(bf16.count(op)) << op << " runs in bf16 under autocast but has no bf16 row";
      EXPECT_TRUE(f16.count(op)) << op << " runs in f16 under autocast but has no f16 row";
    }
  }
  EXPECT_EQ(low, 6)
      << "GEMM (matmul, linear, the GELU MLP), convolution (both layouts) and attention";
  EXPECT_EQ(dt_autocast_policy_of("dt_op_layer_norm"), DT_AUTOCAST_NORM);
  EXPECT_EQ(dt_autocast_policy_of("dt_op_softmax"), DT_AUTOCAST_F32);
}

// ---- the table covers the op table ----

// Every op of core/op_table.def (DT_OP), and argmax, declared beside them in
// core/ops.h, has a row, and a gradient-checked row unless it is not
// differentiable.
TEST(OpTableCoverage, EveryOpHasRows) {
  std::vector<std::string> declared = {
#define DT_OP(name, params) #name,
#include "core/op_table.def"
      "dt_op_argmax",
  };
  const std::set<std::string> kNotDifferentiable = {"argmax"};
  ASSERT_GE(declared.size(), 20u) << "core/op_table.def lists too few ops";
  std::set<std::string> any, graded;
  for (const OpCase *c : Rows(false))
    any.insert(c->op);
  for (const OpCase *c : Rows(true))
    graded.insert(c->op);
  for (const std::string &full : declared) {
    std::string op = full.substr(std::string("dt_op_").size());
    EXPECT_TRUE(any.count(op)) << full << " has no row in tests/op_table_cases.cc";
    EXPECT_TRUE(graded.count(op) || kNotDifferentiable.count(op))
        << full << " has no row that checks its gradient (all are kParityOnly)";
  }
}

// ---- the checks can fail ----

using V = std::vector<dt_tensor *>;

// x * detach(x): the analytic gradient x, the true derivative 2x.
dt_status MulByDetached(dt_tensor *x, dt_tensor **out) {
  dt_tensor *d = nullptr;
  DT_CHECK(dt_tensor_detach(x, &d));
  dt_status st = dt_op_mul(x, d, out);
  dt_tensor_release(d);
  return st;
}

TEST(OpTableHarness, GradCheckCatchesWrongGradients) {
  dtt::Tensors ts;
  dt_tensor *x = ts.add(dtt::RandomTensor({3, 3}, 150, true));
  dtt::OpFn wrong = [](const V &v, dt_tensor **out) { return MulByDetached(v[0], out); };
  EXPECT_FALSE(dtt::GradCheck(wrong, {x}));
  // a sign error: x - 2 detach(x) has the derivative -1, the analytic +1
  dtt::OpFn sign = [](const V &v, dt_tensor **out) {
    dt_tensor *d = nullptr, *t = nullptr;
    DT_CHECK(dt_tensor_detach(v[0], &d));
    dt_status st = dt_op_scale(d, -2.0f, &t);
    if (st == DT_OK)
      st = dt_op_add(v[0], t, out);
    dt_tensor_release(t);
    dt_tensor_release(d);
    return st;
  };
  EXPECT_FALSE(dtt::GradCheck(sign, {x}));
}

// Rows that behave differently off the CPU: in the output, in a gradient
// only, in an input updated in place, in the status.
TEST(OpTableHarness, ParityCatchesDifferences) {
  std::string reason = NoDeviceReason();
  if (!reason.empty())
    GTEST_SKIP() << "no " << DeviceName(TestDevice()) << ": " << reason;
  auto on_cpu = [](dt_tensor *x) {
    dt_device d = dt_tensor_device(x);
    return d.type == DT_DEVICE_CPU && d.index == 0;
  };
  OpCase output = {
      "scale", "off_by_1e-4", DT_DTYPE_F32, {X({64})}, [&](const V &v, dt_tensor **out) {
        return dt_op_scale(v[0], on_cpu(v[0]) ? 1.0f : 1.0001f, out);
      }};
  OpCase gradient = {
      "mul", "gradient_halved", DT_DTYPE_F32, {X({64})}, [&](const V &v, dt_tensor **out) {
        return on_cpu(v[0]) ? dt_op_mul(v[0], v[0], out) : MulByDetached(v[0], out);
      }};
  OpCase in_place = {
      "fill", "input_changed", DT_DTYPE_F32, {X({8}).Const()}, [&](const V &v, dt_tensor **out) {
        if (!on_cpu(v[0]))
          DT_CHECK(dt_tensor_fill_(v[0], 0.5f));
        return dt_op_scale(v[0], 1.0f, out);
      }};
  OpCase status = {
      "scale", "fails_off_the_cpu", DT_DTYPE_F32, {X({8})}, [&](const V &v, dt_tensor **out) {
        return on_cpu(v[0]) ? dt_op_scale(v[0], 1.0f, out)
                            : DT_ERROR(DT_ERR_UNSUPPORTED, "only on the cpu");
      }};
  NoTf32 no_tf32;
  for (const OpCase *c : {&output, &gradient, &in_place, &status})
    EXPECT_FALSE(CheckParity(*c, TestDevice())) << c->Name();
  EXPECT_TRUE(CheckParity(*OpCases().data(), TestDevice()));  // and passes a good row
}

}  // namespace
}  // namespace optable
