#include "tests/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "core/env.h"
#include "core/ops.h"
#include "core/rng.h"

namespace dtt {

void RecordGradReady(dt_tensor *leaf, void *record) {
  auto *r = static_cast<GradReadyRecord *>(record);
  r->fired++;
  r->grad = ToVector(dt_tensor_grad(leaf));
}

dt_status AttachSgd(SgdModel *m, float lr, float momentum, float weight_decay) {
  DT_CHECK(dt_param_arena_create(m->model, &m->arena));
  dt_sgd_config cfg = DT_SGD_CONFIG_DEFAULT;
  cfg.lr = lr;
  cfg.momentum = momentum;
  cfg.weight_decay = weight_decay;
  return dt_optim_sgd_create(m->arena, &cfg, &m->opt);
}

std::vector<float> RandomValues(size_t n, uint64_t seed, float lo, float hi) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = lo + (hi - lo) * dt_rng_uniform(seed, i);
  return v;
}

std::vector<float> Ramp(int64_t n, float scale) {
  std::vector<float> v((size_t)n);
  for (int64_t i = 0; i < n; i++)
    v[(size_t)i] = scale * (float)((i * 7) % 13 - 6);
  return v;
}

// A shape pointer that is never NULL (an empty vector's data() may be).
static const int64_t *ShapePtr(const std::vector<int64_t> &shape) {
  static const int64_t scalar = 1;
  return shape.empty() ? &scalar : shape.data();
}

static int64_t Numel(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

dt_tensor *MakeTensor(const std::vector<float> &values, const std::vector<int64_t> &shape,
                      bool requires_grad, dt_device dev) {
  EXPECT_EQ((int64_t)values.size(), Numel(shape)) << "MakeTensor: values do not fill the shape";
  dt_tensor *t = nullptr;
  dt_status st =
      dt_tensor_from_host(values.data(), ShapePtr(shape), (int)shape.size(), DT_DTYPE_F32, dev, &t);
  EXPECT_EQ(st, DT_OK) << dt_last_error();
  if (t && requires_grad) {
    EXPECT_EQ(dt_tensor_set_requires_grad(t, 1), DT_OK) << dt_last_error();
  }
  return t;
}

dt_tensor *RandomTensor(const std::vector<int64_t> &shape, uint64_t seed, bool requires_grad,
                        float lo, float hi, dt_device dev) {
  return MakeTensor(RandomValues((size_t)Numel(shape), seed, lo, hi), shape, requires_grad, dev);
}

dt_tensor *MakeIndexTensor(const std::vector<int64_t> &values, const std::vector<int64_t> &shape,
                           dt_dtype dtype, dt_device dev) {
  EXPECT_EQ((int64_t)values.size(), Numel(shape));
  dt_tensor *t = nullptr;
  dt_status st;
  if (dtype == DT_DTYPE_I32) {
    std::vector<int32_t> v(values.begin(), values.end());
    st = dt_tensor_from_host(v.data(), ShapePtr(shape), (int)shape.size(), dtype, dev, &t);
  } else {
    st = dt_tensor_from_host(values.data(), ShapePtr(shape), (int)shape.size(), dtype, dev, &t);
  }
  EXPECT_EQ(st, DT_OK) << dt_last_error();
  return t;
}

std::vector<float> ToVector(const dt_tensor *t) {
  std::vector<float> v((size_t)dt_tensor_numel(t));
  EXPECT_EQ(dt_tensor_dtype(t), DT_DTYPE_F32);
  EXPECT_EQ(dt_tensor_to_host(t, v.data(), v.size() * sizeof(float)), DT_OK) << dt_last_error();
  return v;
}

std::vector<int64_t> ToIndexVector(const dt_tensor *t) {
  size_t n = (size_t)dt_tensor_numel(t);
  if (dt_tensor_dtype(t) == DT_DTYPE_I32) {
    std::vector<int32_t> v(n);
    EXPECT_EQ(dt_tensor_to_host(t, v.data(), n * 4), DT_OK) << dt_last_error();
    return std::vector<int64_t>(v.begin(), v.end());
  }
  EXPECT_EQ(dt_tensor_dtype(t), DT_DTYPE_I64);
  std::vector<int64_t> v(n);
  EXPECT_EQ(dt_tensor_to_host(t, v.data(), n * 8), DT_OK) << dt_last_error();
  return v;
}

std::vector<int64_t> Shape(const dt_tensor *t) {
  return std::vector<int64_t>(dt_tensor_shape(t), dt_tensor_shape(t) + dt_tensor_ndim(t));
}

dt_status CopyFromHost(dt_tensor *t, const std::vector<float> &values) {
  if ((int64_t)values.size() != dt_tensor_numel(t))
    return DT_ERROR(DT_ERR_SHAPE, "CopyFromHost: %zu values for a tensor of %lld elements",
                    values.size(), (long long)dt_tensor_numel(t));
  dt_tensor *tmp = nullptr;
  DT_CHECK(dt_tensor_from_host(values.data(), dt_tensor_shape(t), dt_tensor_ndim(t), DT_DTYPE_F32,
                               dt_tensor_device(t), &tmp));
  dt_status st = dt_tensor_copy_(t, tmp);
  dt_tensor_release(tmp);
  return st;
}

// ---- gradient check ----

std::vector<float> UpstreamGradient(size_t n, uint64_t seed) {
  std::vector<float> r = RandomValues(n, seed, -1.0f, 1.0f);
  for (float &v : r)
    v = v < 0 ? v - 0.5f : v + 0.5f;
  return r;
}

dt_status ConcatBoth(dt_status st, dt_tensor *sum, dt_tensor *norm, dt_tensor **cat) {
  dt_tensor *parts[2] = {sum, norm};
  if (st == DT_OK)
    st = dt_op_concat(parts, 2, -1, cat);
  dt_tensor_release(norm);
  dt_tensor_release(sum);
  return st;
}

dt_status ResidualLayerNormBoth(const std::vector<dt_tensor *> &x, dt_tensor **out) {
  dt_tensor *sum = nullptr, *norm = nullptr;
  dt_status st = dt_op_residual_layer_norm(x[0], x[1], x.size() > 2 ? x[2] : nullptr,
                                           x.size() > 3 ? x[3] : nullptr, 1e-5f, &sum, &norm);
  return ConcatBoth(st, sum, norm, out);
}

// L = sum(op(inputs) * r) in double, without recording.
static ::testing::AssertionResult EvalLoss(const OpFn &fn, const std::vector<dt_tensor *> &inputs,
                                           const std::vector<float> &r, double *loss) {
  dt_tensor *out = nullptr;
  dt_no_grad_begin();
  dt_status st = fn(inputs, &out);
  dt_no_grad_end();
  if (st != DT_OK)
    return ::testing::AssertionFailure()
           << "op failed during the finite differences: " << dt_status_name(st) << ": "
           << dt_last_error();
  std::vector<float> y = ToVector(out);
  dt_tensor_release(out);
  if (y.size() != r.size())
    return ::testing::AssertionFailure() << "output size changed between calls";
  double s = 0.0;
  for (size_t i = 0; i < y.size(); ++i)
    s += (double)y[i] * (double)r[i];
  *loss = s;
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult GradCheck(const OpFn &fn, const std::vector<dt_tensor *> &inputs,
                                     const GradCheckOptions &opt) {
  // 1. analytic gradients: backward of L = sum(out * R), i.e. seed R
  for (dt_tensor *t : inputs)
    if (dt_tensor_requires_grad(t))
      dt_tensor_set_grad(t, nullptr);
  dt_tensor *out = nullptr;
  dt_status st = fn(inputs, &out);
  if (st != DT_OK)
    return ::testing::AssertionFailure()
           << "op failed: " << dt_status_name(st) << ": " << dt_last_error();
  TensorRef out_ref(out);
  if (!dt_tensor_requires_grad(out))
    return ::testing::AssertionFailure() << "the op's output does not require grad";
  std::vector<float> r = UpstreamGradient((size_t)dt_tensor_numel(out), opt.seed);
  TensorRef rt(MakeTensor(r, Shape(out), false, dt_tensor_device(out)));
  st = dt_backward(out, rt.get());
  if (st != DT_OK)
    return ::testing::AssertionFailure()
           << "backward failed: " << dt_status_name(st) << ": " << dt_last_error();
  out_ref.reset();

  std::ostringstream failures;
  int n_fail = 0;
  for (size_t k = 0; k < inputs.size(); ++k) {
    dt_tensor *x = inputs[k];
    if (!dt_tensor_requires_grad(x))
      continue;
    size_t n = (size_t)dt_tensor_numel(x);
    std::vector<float> analytic(n, 0.0f);
    if (dt_tensor_grad(x))
      analytic = ToVector(dt_tensor_grad(x));
    else if (n > 0)
      return ::testing::AssertionFailure() << "input " << k << " got no gradient";

    // 2. numeric gradients, one element at a time
    std::vector<float> orig = ToVector(x), work = orig;
    double max_numeric = 0.0, max_err = 0.0;
    for (size_t i = 0; i < n; ++i) {
      double lp = 0, lm = 0;
      work[i] = (float)((double)orig[i] + opt.eps);
      float xp = work[i];
      if (CopyFromHost(x, work) != DT_OK)
        return ::testing::AssertionFailure() << "upload failed: " << dt_last_error();
      auto r1 = EvalLoss(fn, inputs, r, &lp);
      work[i] = (float)((double)orig[i] - opt.eps);
      float xm = work[i];
      if (CopyFromHost(x, work) != DT_OK)
        return ::testing::AssertionFailure() << "upload failed: " << dt_last_error();
      auto r2 = EvalLoss(fn, inputs, r, &lm);
      work[i] = orig[i];
      if (!r1)
        return r1;
      if (!r2)
        return r2;
      double numeric = (lp - lm) / ((double)xp - (double)xm);
      double a = analytic[i];
      double err = std::fabs(a - numeric);
      double tol = opt.atol + opt.rtol * std::max(std::fabs(a), std::fabs(numeric));
      max_numeric = std::max(max_numeric, std::fabs(numeric));
      max_err = std::max(max_err, err);
      if (!(err <= tol)) {
        if (n_fail < 8)
          failures << "\n  input " << k << " element " << i << ": analytic " << a << ", numeric "
                   << numeric << " (|diff| " << err << " > tol " << tol << ")";
        n_fail++;
      }
    }
    bool verbose = false;
    dt_env_bool(DT_ENV_GRADCHECK_VERBOSE, &verbose);
    if (verbose)
      fprintf(stderr, "gradcheck input %zu: %zu elements, max |numeric| %.3g, max |diff| %.3g\n", k,
              n, max_numeric, max_err);
    if (CopyFromHost(x, orig) != DT_OK)
      return ::testing::AssertionFailure() << "upload failed: " << dt_last_error();
    if (!opt.allow_zero_grad && n > 0 && max_numeric < 1e-6)
      return ::testing::AssertionFailure()
             << "input " << k << ": every numeric gradient is ~0: the check is vacuous";
  }
  if (n_fail > 0)
    return ::testing::AssertionFailure()
           << n_fail << " gradient element(s) differ:" << failures.str();
  return ::testing::AssertionSuccess();
}

}  // namespace dtt
