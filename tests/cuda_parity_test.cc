// CPU-vs-CUDA parity: every kernel of the CUDA backend against the CPU
// reference (dt_cpu_backend()) on the same random inputs, with tolerances
// by kind of computation. TF32 is off except where a test says so. Without
// a GPU every test skips with the reason dt_backend_get() gives.
//
// DT_PARITY_TEST_DEVICE=cpu:1 runs the suite against the CPU backend itself
// (//tests:cuda_parity_selfcheck_test, in CI): both sides must agree, which
// checks the harness and the calls it makes before a GPU ever runs them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/env.h"
#include "core/memory.h"
#include "core/rng.h"
#include "core/status.h"
#include "core/tensor.h"
#include "cuda/cuda.h"

namespace {

using Vec = std::vector<float>;

Vec Rand(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Vec v(n);
  for (size_t i = 0; i < n; i++)
    v[i] = lo + (hi - lo) * dt_rng_uniform(seed, i);
  return v;
}

// cuda:0, or the device named by DT_PARITY_TEST_DEVICE.
dt_device TestDevice() {
  dt_device d = {DT_DEVICE_CUDA, 0};
  const char *s = nullptr;
  if (dt_env_string(DT_ENV_PARITY_TEST_DEVICE, &s) != DT_OK || dt_device_parse(s, &d) != DT_OK)
    std::fprintf(stderr, "DT_PARITY_TEST_DEVICE=%s: %s\n", s ? s : "", dt_last_error());
  return d;
}

std::string NoGpuReason() {
  const dt_backend_ops *ops = nullptr;
  if (dt_backend_get(TestDevice(), &ops) == DT_OK)
    return "";
  std::string r = dt_last_error();
  if (dt_cuda_probe() != DT_OK)
    r += " [" + std::string(dt_last_error()) + "]";
  return r;
}

// |got - want| <= atol + rtol * |want| everywhere; reports the worst element.
::testing::AssertionResult Close(const Vec &got, const Vec &want, double rtol, double atol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  size_t worst = 0, bad = 0;
  double worst_excess = 0.0;
  for (size_t i = 0; i < got.size(); i++) {
    double g = got[i], w = want[i];
    if ((std::isnan(w) && std::isnan(g)) || g == w)  // g == w: equal infinities too
      continue;
    double excess = std::fabs(g - w) - (atol + rtol * std::fabs(w));
    if (!(excess <= 0.0)) {
      bad++;
      if (!(excess <= worst_excess)) {
        worst_excess = excess;
        worst = i;
      }
    }
  }
  if (bad == 0)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements differ; worst at " << worst << ": cuda "
         << got[worst] << " vs cpu " << want[worst] << " (rtol " << rtol << ", atol " << atol
         << ")";
}

constexpr double kRtol = 1e-5, kAtol = 1e-6;  // elementwise f32
constexpr double kRedRtol = 1e-5, kRedAtol = 1e-5;  // reductions

class CudaParity : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason = NoGpuReason();
    if (!reason.empty())
      GTEST_SKIP() << "no CUDA device: " << reason;
    ASSERT_EQ(DT_OK, dt_backend_get(dev_, &gpu_)) << dt_last_error();
    dt_cuda_set_tf32(0);
  }
  void TearDown() override {
    for (auto &b : bufs_)
      gpu_->free(dev_, b.first, b.second);
    if (gpu_)
      dt_cuda_set_tf32(1);
  }

  void *Alloc(size_t bytes) {
    void *p = nullptr;
    EXPECT_EQ(DT_OK, gpu_->alloc(dev_, bytes, &p)) << dt_last_error();
    bufs_.push_back({p, bytes});
    return p;
  }
  template <class T>
  T *Up(const std::vector<T> &v) {
    T *d = static_cast<T *>(Alloc(v.size() * sizeof(T) + 1));
    EXPECT_EQ(DT_OK, gpu_->copy(d, dev_, v.data(), DT_CPU, v.size() * sizeof(T), nullptr))
        << dt_last_error();
    return d;
  }
  template <class T>
  std::vector<T> Down(const T *d, size_t n) {
    std::vector<T> v(n);
    EXPECT_EQ(DT_OK, gpu_->copy(v.data(), DT_CPU, d, dev_, n * sizeof(T), nullptr))
        << dt_last_error();
    return v;
  }
  float *Zeros(size_t n) { return Up(Vec(n, 0.0f)); }

  const dt_backend_ops *cpu_ = dt_cpu_backend();
  const dt_backend_ops *gpu_ = nullptr;
  dt_device dev_ = TestDevice();
  // The CPU-against-itself run: CUDA-only APIs are skipped.
  bool SelfCheck() const { return dev_.type == DT_DEVICE_CPU; }
  std::vector<std::pair<void *, size_t>> bufs_;
};

#define OK(expr) ASSERT_EQ(DT_OK, (expr)) << dt_last_error()

/* ---- conversions and copies ---- */

TEST_F(CudaParity, CastBetweenAllDtypes) {
  const int64_t n = 1000;
  Vec f = Rand(n, 1, -300.0f, 300.0f);
  f[0] = 0.5f, f[1] = -0.5f, f[2] = 65504.0f, f[3] = 1e-8f, f[4] = NAN, f[5] = INFINITY;
  for (int s = 0; s < DT_DTYPE_COUNT; s++) {
    dt_dtype src = (dt_dtype)s;
    size_t ss = dt_dtype_size(src);
    std::vector<uint8_t> in(n * ss);
    OK(cpu_->cast(DT_CPU, f.data(), DT_DTYPE_F32, in.data(), src, n));  // values in src type
    uint8_t *din = Up(in);
    for (int t = 0; t < DT_DTYPE_COUNT; t++) {
      dt_dtype dst = (dt_dtype)t;
      size_t ds = dt_dtype_size(dst);
      std::vector<uint8_t> want(n * ds);
      OK(cpu_->cast(DT_CPU, in.data(), src, want.data(), dst, n));
      uint8_t *dout = static_cast<uint8_t *>(Alloc(n * ds));
      OK(gpu_->cast(dev_, din, src, dout, dst, n));
      std::vector<uint8_t> got = Down(dout, n * ds);
      // Compare as f32 values so that NaN payloads may differ.
      Vec gv(n), wv(n);
      OK(cpu_->cast(DT_CPU, got.data(), dst, gv.data(), DT_DTYPE_F32, n));
      OK(cpu_->cast(DT_CPU, want.data(), dst, wv.data(), DT_DTYPE_F32, n));
      EXPECT_TRUE(Close(gv, wv, 0, 0)) << dt_dtype_name(src) << " -> " << dt_dtype_name(dst);
    }
  }
}

TEST_F(CudaParity, CopyStridedTransposeAndSlice) {
  const int64_t shape[3] = {4, 5, 6};
  Vec x = Rand(4 * 5 * 6, 2);
  int64_t src_strides[3] = {1, 4, 20};  // a permuted view of a (6,5,4) buffer
  int64_t dst_strides[3] = {30, 6, 1};
  Vec want(120), got;
  OK(cpu_->copy_strided(DT_CPU, want.data(), dst_strides, x.data(), src_strides, shape, 3, 4));
  float *dx = Up(x), *dy = Zeros(120);
  OK(gpu_->copy_strided(dev_, dy, dst_strides, dx, src_strides, shape, 3, 4));
  EXPECT_TRUE(Close(Down(dy, 120), want, 0, 0));
  // 2-byte elements with a broadcast (stride 0) source dim
  int64_t s2[3] = {0, 1, 5};
  std::vector<uint16_t> h(30), want16(120), got16;
  for (int i = 0; i < 30; i++)
    h[i] = (uint16_t)(i * 7 + 1);
  OK(cpu_->copy_strided(DT_CPU, want16.data(), dst_strides, h.data(), s2, shape, 3, 2));
  uint16_t *dh = Up(h), *d16 = static_cast<uint16_t *>(Alloc(240));
  OK(gpu_->copy_strided(dev_, d16, dst_strides, dh, s2, shape, 3, 2));
  EXPECT_EQ(Down(d16, 120), want16);
}

TEST_F(CudaParity, FillAxpbyBinary) {
  const int64_t n = 5000;
  float *d = Zeros(n);
  OK(gpu_->fill(dev_, d, 3.25f, n));
  EXPECT_TRUE(Close(Down(d, n), Vec(n, 3.25f), 0, 0));

  Vec x = Rand(n, 3), y = Rand(n, 4), want = y;
  OK(cpu_->axpby(DT_CPU, n, 1.5f, x.data(), -0.25f, want.data()));
  float *dx = Up(x), *dy = Up(y);
  OK(gpu_->axpby(dev_, n, 1.5f, dx, -0.25f, dy));
  EXPECT_TRUE(Close(Down(dy, n), want, kRtol, kAtol));

  // (3,4,5) = a (3,4,5) op b broadcast (1,4,1), and a transposed view
  dt_binary_args args = {};
  args.ndim = 3;
  int64_t shape[3] = {3, 4, 5}, as[3] = {20, 5, 1}, bs[3] = {0, 1, 0};
  std::memcpy(args.shape, shape, sizeof shape);
  std::memcpy(args.a_strides, as, sizeof as);
  std::memcpy(args.b_strides, bs, sizeof bs);
  Vec a = Rand(60, 5), b = Rand(4, 6);
  float *da = Up(a), *db = Up(b), *dout = Zeros(60);
  for (int op = 0; op <= DT_BINARY_MUL; op++) {
    args.op = (dt_binary_op)op;
    Vec w(60);
    OK(cpu_->binary(DT_CPU, &args, a.data(), b.data(), w.data()));
    OK(gpu_->binary(dev_, &args, da, db, dout));
    EXPECT_TRUE(Close(Down(dout, 60), w, kRtol, kAtol)) << "op " << op;
  }
  int64_t at[3] = {1, 3, 12};  // a read as a permuted view
  std::memcpy(args.a_strides, at, sizeof at);
  args.op = DT_BINARY_SUB;
  Vec w(60);
  OK(cpu_->binary(DT_CPU, &args, a.data(), b.data(), w.data()));
  OK(gpu_->binary(dev_, &args, da, db, dout));
  EXPECT_TRUE(Close(Down(dout, 60), w, kRtol, kAtol));
}

TEST_F(CudaParity, UnaryForwardBackward) {
  const int64_t n = 4096;
  Vec x = Rand(n, 7, -4.0f, 4.0f), dy = Rand(n, 8);
  x[0] = 0.0f;
  float *dx_in = Up(x), *ddy = Up(dy), *dout = Zeros(n);
  for (int op = 0; op <= DT_UNARY_TANH; op++) {
    Vec y(n), g(n);
    OK(cpu_->unary_forward(DT_CPU, (dt_unary_op)op, n, x.data(), y.data()));
    OK(gpu_->unary_forward(dev_, (dt_unary_op)op, n, dx_in, dout));
    EXPECT_TRUE(Close(Down(dout, n), y, 1e-5, 1e-6)) << "forward op " << op;
    OK(cpu_->unary_backward(DT_CPU, (dt_unary_op)op, n, x.data(), dy.data(), g.data()));
    OK(gpu_->unary_backward(dev_, (dt_unary_op)op, n, dx_in, ddy, dout));
    EXPECT_TRUE(Close(Down(dout, n), g, 1e-5, 1e-6)) << "backward op " << op;
  }
}

/* ---- GEMM ---- */

TEST_F(CudaParity, GemmAllTransposesAndBatches) {
  const int m = 37, n = 29, k = 64, pad = 3;
  for (int batch : {1, 3})
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
        int lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
        int64_t sa = (int64_t)a_rows * lda, sb = (int64_t)b_rows * ldb, sc = (int64_t)m * ldc;
        Vec a = Rand(sa * batch, 10), b = Rand(sb * batch, 11), c = Rand(sc * batch, 12);
        Vec want = c;
        OK(cpu_->gemm(DT_CPU, ta, tb, m, n, k, 1.25f, a.data(), lda, sa, b.data(), ldb, sb,
                      -0.5f, want.data(), ldc, sc, batch));
        float *da = Up(a), *db = Up(b), *dc = Up(c);
        OK(gpu_->gemm(dev_, ta, tb, m, n, k, 1.25f, da, lda, sa, db, ldb, sb, -0.5f, dc, ldc, sc,
                      batch));
        EXPECT_TRUE(Close(Down(dc, c.size()), want, 1e-5, 1e-4))
            << "ta " << ta << " tb " << tb << " batch " << batch;
      }
}

TEST_F(CudaParity, GemmWithTf32IsCloseAndMixedPrecisionWorks) {
  if (SelfCheck())
    GTEST_SKIP() << "CUDA-only (TF32, GemmEx, streams, pinned memory): not in the CPU self-check";
  const int m = 64, n = 48, k = 128;
  Vec a = Rand(m * k, 13), b = Rand(k * n, 14), want(m * n, 0.0f);
  OK(cpu_->gemm(DT_CPU, 0, 0, m, n, k, 1.0f, a.data(), k, 0, b.data(), n, 0, 0.0f, want.data(), n,
                0, 1));
  float *da = Up(a), *db = Up(b), *dc = Zeros(m * n);
  dt_cuda_set_tf32(1);
  OK(gpu_->gemm(dev_, 0, 0, m, n, k, 1.0f, da, k, 0, db, n, 0, 0.0f, dc, n, 0, 1));
  EXPECT_TRUE(Close(Down(dc, m * n), want, 1e-2, 2e-2)) << "TF32";
  // bf16 and f16 inputs, f32 output
  for (dt_dtype t : {DT_DTYPE_F16, DT_DTYPE_BF16}) {
    void *ha = Alloc(m * k * 2), *hb = Alloc(k * n * 2);
    OK(gpu_->cast(dev_, da, DT_DTYPE_F32, ha, t, m * k));
    OK(gpu_->cast(dev_, db, DT_DTYPE_F32, hb, t, k * n));
    OK(dt_cuda_gemm_ex(dev_, 0, 0, m, n, k, 1.0f, ha, k, 0, hb, n, 0, t, 0.0f, dc, n, 0,
                       DT_DTYPE_F32, 1));
    EXPECT_TRUE(Close(Down(dc, m * n), want, 2e-2, 0.15)) << dt_dtype_name(t);
  }
}

/* ---- reductions ---- */

TEST_F(CudaParity, ReduceSumBroadcastAxisSumSquares) {
  struct Case {
    int64_t outer, r, inner;
  } cases[] = {{1, 100000, 1}, {7, 33, 1}, {5, 3000, 13}, {1, 8192, 768}, {3, 1, 4}, {2, 70, 100}};
  for (const Case &c : cases) {
    Vec x = Rand(c.outer * c.r * c.inner, 20), want(c.outer * c.inner);
    OK(cpu_->reduce_sum(DT_CPU, x.data(), want.data(), c.outer, c.r, c.inner, 0.5f));
    float *dx = Up(x), *dy = Zeros(want.size());
    OK(gpu_->reduce_sum(dev_, dx, dy, c.outer, c.r, c.inner, 0.5f));
    EXPECT_TRUE(Close(Down(dy, want.size()), want, kRedRtol, kRedAtol))
        << c.outer << "x" << c.r << "x" << c.inner;
    Vec bw(x.size());
    OK(cpu_->broadcast_axis(DT_CPU, want.data(), bw.data(), c.outer, c.r, c.inner, 2.0f));
    OK(gpu_->broadcast_axis(dev_, dy, dx, c.outer, c.r, c.inner, 2.0f));
    EXPECT_TRUE(Close(Down(dx, x.size()), bw, kRedRtol, kRedAtol));
  }
  for (int64_t n : {1, 1000, 3000000}) {
    Vec x = Rand(n, 21, -2.0f, 2.0f);
    double want = 0, got = 0;
    OK(cpu_->sum_squares(DT_CPU, x.data(), n, &want));
    OK(gpu_->sum_squares(dev_, Up(x), n, &got));
    EXPECT_NEAR(got, want, 1e-9 * want) << n;
  }
}

/* ---- softmax and cross-entropy ---- */

TEST_F(CudaParity, SoftmaxForwardBackward) {
  for (int64_t cols : {10, 257, 5000})
    for (int log_ = 0; log_ < 2; log_++) {
      const int64_t rows = 33;
      Vec x = Rand(rows * cols, 30, -8.0f, 8.0f), dy = Rand(rows * cols, 31), y(x.size()),
          dx(x.size());
      OK(cpu_->softmax_forward(DT_CPU, x.data(), y.data(), rows, cols, log_));
      OK(cpu_->softmax_backward(DT_CPU, y.data(), dy.data(), dx.data(), rows, cols, log_));
      float *gx = Up(x), *gy = Zeros(x.size()), *gdy = Up(dy), *gdx = Zeros(x.size());
      OK(gpu_->softmax_forward(dev_, gx, gy, rows, cols, log_));
      EXPECT_TRUE(Close(Down(gy, x.size()), y, 1e-5, 1e-6)) << "cols " << cols << " log " << log_;
      OK(gpu_->softmax_backward(dev_, Up(y), gdy, gdx, rows, cols, log_));
      EXPECT_TRUE(Close(Down(gdx, x.size()), dx, 1e-4, 1e-6))
          << "backward cols " << cols << " log " << log_;
    }
}

TEST_F(CudaParity, CrossEntropyForwardBackwardAndBadTargets) {
  const int64_t n = 50, c = 1000, ignore = -100;
  Vec logits = Rand(n * c, 40, -5.0f, 5.0f), dloss = Rand(n, 41, 0.0f, 1.0f);
  for (dt_dtype td : {DT_DTYPE_I32, DT_DTYPE_I64}) {
    std::vector<int64_t> t64(n);
    for (int64_t i = 0; i < n; i++)
      t64[i] = i % 7 == 3 ? ignore : (int64_t)(dt_rng_bits(42, i) % c);
    std::vector<int32_t> t32(t64.begin(), t64.end());
    const void *ht = td == DT_DTYPE_I32 ? (const void *)t32.data() : (const void *)t64.data();
    void *dt_ = td == DT_DTYPE_I32 ? (void *)Up(t32) : (void *)Up(t64);
    Vec loss(n), lse(n), dl(n * c);
    int64_t count = 0, gcount = -1;
    OK(cpu_->cross_entropy_forward(DT_CPU, logits.data(), ht, td, n, c, ignore, loss.data(),
                                   lse.data(), &count));
    OK(cpu_->cross_entropy_backward(DT_CPU, logits.data(), ht, td, lse.data(), dloss.data(),
                                    dl.data(), n, c, ignore));
    float *gl = Up(logits), *gloss = Zeros(n), *glse = Zeros(n), *gdl = Zeros(n * c);
    OK(gpu_->cross_entropy_forward(dev_, gl, dt_, td, n, c, ignore, gloss, glse, &gcount));
    EXPECT_EQ(gcount, count);
    EXPECT_TRUE(Close(Down(gloss, n), loss, 1e-5, 1e-5));
    EXPECT_TRUE(Close(Down(glse, n), lse, 1e-6, 1e-6));
    OK(gpu_->cross_entropy_backward(dev_, gl, dt_, td, glse, Up(dloss), gdl, n, c, ignore));
    EXPECT_TRUE(Close(Down(gdl, n * c), dl, 1e-5, 1e-7));

    // A target out of range is DT_ERR_INVALID_ARG naming the first bad row.
    t64[17] = c + 5, t64[30] = -3;
    std::vector<int32_t> b32(t64.begin(), t64.end());
    void *bad = td == DT_DTYPE_I32 ? (void *)Up(b32) : (void *)Up(t64);
    EXPECT_EQ(DT_ERR_INVALID_ARG,
              gpu_->cross_entropy_forward(dev_, gl, bad, td, n, c, ignore, gloss, glse, &gcount));
    std::string msg = dt_last_error();
    EXPECT_NE(msg.find("target 1005 at row 17"), std::string::npos) << msg;
  }
}

/* ---- normalisation ---- */

TEST_F(CudaParity, LayerNormForwardBackward) {
  const int64_t rows = 300, cols = 768;
  Vec x = Rand(rows * cols, 50, -3.0f, 3.0f), g = Rand(cols, 51, 0.5f, 1.5f),
      b = Rand(cols, 52), dy = Rand(rows * cols, 53);
  Vec y(x.size()), mean(rows), rstd(rows), dx(x.size()), dg = Rand(cols, 54), db = Rand(cols, 55);
  float *gdg = Up(dg), *gdb = Up(db);
  OK(cpu_->layernorm_forward(DT_CPU, x.data(), g.data(), b.data(), y.data(), mean.data(),
                             rstd.data(), rows, cols, 1e-5f));
  OK(cpu_->layernorm_backward(DT_CPU, x.data(), g.data(), mean.data(), rstd.data(), dy.data(),
                              dx.data(), dg.data(), db.data(), rows, cols));
  float *gx = Up(x), *gg = Up(g), *gb = Up(b), *gy = Zeros(x.size()), *gm = Zeros(rows),
        *gr = Zeros(rows), *gdx = Zeros(x.size());
  OK(gpu_->layernorm_forward(dev_, gx, gg, gb, gy, gm, gr, rows, cols, 1e-5f));
  EXPECT_TRUE(Close(Down(gy, x.size()), y, 1e-5, 1e-5));
  EXPECT_TRUE(Close(Down(gm, rows), mean, 1e-5, 1e-6));
  EXPECT_TRUE(Close(Down(gr, rows), rstd, 1e-5, 1e-6));
  OK(gpu_->layernorm_backward(dev_, gx, gg, gm, gr, Up(dy), gdx, gdg, gdb, rows, cols));
  EXPECT_TRUE(Close(Down(gdx, x.size()), dx, 1e-4, 1e-5));
  EXPECT_TRUE(Close(Down(gdg, cols), dg, 1e-5, 1e-4)) << "dgamma (accumulated)";
  EXPECT_TRUE(Close(Down(gdb, cols), db, 1e-5, 1e-4)) << "dbeta (accumulated)";
}

TEST_F(CudaParity, BatchNormTrainEvalBackward) {
  const int64_t n = 8, c = 16, hw = 49, total = n * c * hw;
  Vec x = Rand(total, 60, -2.0f, 3.0f), g = Rand(c, 61, 0.5f, 1.5f), b = Rand(c, 62),
      dy = Rand(total, 63);
  Vec rm = Rand(c, 64), rv = Rand(c, 65, 0.5f, 2.0f);
  Vec y(total), sm(c), si(c), crm = rm, crv = rv, dx(total), dg(c), db(c);
  OK(cpu_->batchnorm_forward(DT_CPU, x.data(), y.data(), g.data(), b.data(), crm.data(),
                             crv.data(), sm.data(), si.data(), n, c, hw, 1, 0.1f, 1e-5f));
  OK(cpu_->batchnorm_backward(DT_CPU, x.data(), dy.data(), g.data(), sm.data(), si.data(),
                              dx.data(), dg.data(), db.data(), n, c, hw));
  float *gx = Up(x), *gg = Up(g), *gb = Up(b), *grm = Up(rm), *grv = Up(rv),
        *gy = Zeros(total), *gsm = Zeros(c), *gsi = Zeros(c);
  OK(gpu_->batchnorm_forward(dev_, gx, gy, gg, gb, grm, grv, gsm, gsi, n, c, hw, 1, 0.1f, 1e-5f));
  EXPECT_TRUE(Close(Down(gy, total), y, 1e-4, 1e-5)) << "train y";
  EXPECT_TRUE(Close(Down(gsm, c), sm, 1e-5, 1e-6)) << "save_mean";
  EXPECT_TRUE(Close(Down(gsi, c), si, 1e-4, 1e-6)) << "save_invstd";
  EXPECT_TRUE(Close(Down(grm, c), crm, 1e-5, 1e-6)) << "running_mean";
  EXPECT_TRUE(Close(Down(grv, c), crv, 1e-4, 1e-6)) << "running_var (unbiased)";
  float *gdx = Zeros(total), *gdg = Zeros(c), *gdb = Zeros(c);
  OK(gpu_->batchnorm_backward(dev_, gx, Up(dy), gg, gsm, gsi, gdx, gdg, gdb, n, c, hw));
  EXPECT_TRUE(Close(Down(gdx, total), dx, 1e-3, 1e-5)) << "dx";
  EXPECT_TRUE(Close(Down(gdg, c), dg, 1e-4, 1e-4)) << "dgamma";
  EXPECT_TRUE(Close(Down(gdb, c), db, 1e-4, 1e-4)) << "dbeta";
  // eval mode
  OK(cpu_->batchnorm_forward(DT_CPU, x.data(), y.data(), g.data(), b.data(), rm.data(), rv.data(),
                             sm.data(), si.data(), n, c, hw, 0, 0.1f, 1e-5f));
  float *erm = Up(rm), *erv = Up(rv);
  OK(gpu_->batchnorm_forward(dev_, gx, gy, gg, gb, erm, erv, gsm, gsi, n, c, hw, 0, 0.1f, 1e-5f));
  EXPECT_TRUE(Close(Down(gy, total), y, 1e-5, 1e-5)) << "eval y";
  EXPECT_TRUE(Close(Down(gsi, c), si, 1e-5, 1e-6)) << "eval save_invstd";
}

/* ---- convolution and pooling ---- */

TEST_F(CudaParity, Conv2dForwardBackward) {
  dt_conv2d_geom geoms[] = {
      {4, 3, 28, 28, 8, 5, 5, 1, 1, 2, 2, 28, 28},  // LeNet-like, padded
      {2, 16, 15, 13, 32, 3, 3, 2, 2, 1, 1, 8, 7},  // strided
      {3, 8, 7, 7, 4, 1, 1, 1, 1, 0, 0, 7, 7},      // pointwise
  };
  for (const dt_conv2d_geom &g : geoms) {
    int64_t nx = (int64_t)g.n * g.c * g.h * g.w, nw = (int64_t)g.oc * g.c * g.kh * g.kw,
            ny = (int64_t)g.n * g.oc * g.oh * g.ow;
    Vec x = Rand(nx, 70), w = Rand(nw, 71), bias = Rand(g.oc, 72), dy = Rand(ny, 73);
    Vec y(ny), dx(nx), dw(nw), db(g.oc);
    std::vector<uint8_t> cws(cpu_->conv2d_workspace(DT_CPU, &g) + 1);
    OK(cpu_->conv2d_forward(DT_CPU, &g, x.data(), w.data(), bias.data(), y.data(), cws.data()));
    OK(cpu_->conv2d_backward(DT_CPU, &g, x.data(), w.data(), dy.data(), dx.data(), dw.data(),
                             db.data(), cws.data()));
    float *gx = Up(x), *gw = Up(w), *gy = Zeros(ny), *gdx = Zeros(nx), *gdw = Zeros(nw),
          *gdb = Zeros(g.oc);
    size_t ws = gpu_->conv2d_workspace(dev_, &g);
    void *gws = ws ? Alloc(ws) : nullptr;
    OK(gpu_->conv2d_forward(dev_, &g, gx, gw, Up(bias), gy, gws));
    EXPECT_TRUE(Close(Down(gy, ny), y, 1e-4, 1e-4)) << "forward c=" << g.c;
    OK(gpu_->conv2d_backward(dev_, &g, gx, gw, Up(dy), gdx, gdw, gdb, gws));
    EXPECT_TRUE(Close(Down(gdx, nx), dx, 1e-4, 1e-4)) << "dx c=" << g.c;
    EXPECT_TRUE(Close(Down(gdw, nw), dw, 1e-4, 5e-4)) << "dw c=" << g.c;
    EXPECT_TRUE(Close(Down(gdb, g.oc), db, 1e-4, 1e-4)) << "db c=" << g.c;
    // a NULL workspace makes the backend take its own
    OK(gpu_->conv2d_forward(dev_, &g, gx, gw, nullptr, gy, nullptr));
  }
}

TEST_F(CudaParity, MaxAndAvgPoolingMatchBitForBit) {
  dt_conv2d_geom geoms[] = {
      {2, 3, 8, 8, 0, 2, 2, 2, 2, 0, 0, 4, 4},
      {2, 4, 9, 7, 0, 3, 3, 2, 2, 1, 1, 5, 4},  // overlapping windows, padding
      {1, 2, 5, 5, 0, 3, 3, 1, 1, 1, 1, 5, 5},
  };
  for (const dt_conv2d_geom &g : geoms) {
    int64_t nx = (int64_t)g.n * g.c * g.h * g.w, ny = (int64_t)g.n * g.c * g.oh * g.ow;
    Vec x = Rand(nx, 80), dy = Rand(ny, 81), y(ny), dx(nx);
    x[3] = x[4];  // a tie
    std::vector<int32_t> am(ny);
    OK(cpu_->maxpool2d_forward(DT_CPU, &g, x.data(), y.data(), am.data()));
    OK(cpu_->maxpool2d_backward(DT_CPU, &g, dy.data(), am.data(), dx.data()));
    float *gx = Up(x), *gy = Zeros(ny), *gdy = Up(dy), *gdx = Zeros(nx);
    int32_t *gam = static_cast<int32_t *>(Alloc(ny * 4));
    OK(gpu_->maxpool2d_forward(dev_, &g, gx, gy, gam));
    EXPECT_TRUE(Close(Down(gy, ny), y, 0, 0)) << "maxpool y";
    EXPECT_EQ(Down(gam, ny), am) << "argmax";
    OK(gpu_->maxpool2d_backward(dev_, &g, gdy, gam, gdx));
    EXPECT_TRUE(Close(Down(gdx, nx), dx, 0, 0)) << "maxpool dx";
    OK(cpu_->avgpool2d_forward(DT_CPU, &g, x.data(), y.data()));
    OK(cpu_->avgpool2d_backward(DT_CPU, &g, dy.data(), dx.data()));
    OK(gpu_->avgpool2d_forward(dev_, &g, gx, gy));
    EXPECT_TRUE(Close(Down(gy, ny), y, 0, 0)) << "avgpool y";
    OK(gpu_->avgpool2d_backward(dev_, &g, gdy, gdx));
    EXPECT_TRUE(Close(Down(gdx, nx), dx, 0, 0)) << "avgpool dx";
  }
}

/* ---- embedding, dropout ---- */

TEST_F(CudaParity, EmbeddingForwardBackwardAndBadIndex) {
  const int64_t n = 500, v = 1000, d = 64;
  Vec table = Rand(v * d, 90), dy = Rand(n * d, 91), dtab = Rand(v * d, 92);
  std::vector<int64_t> idx(n);
  for (int64_t i = 0; i < n; i++)
    idx[i] = (int64_t)(dt_rng_bits(93, i) % 50);  // many repeats
  Vec y(n * d), want_dtab = dtab;
  OK(cpu_->embedding_forward(DT_CPU, idx.data(), DT_DTYPE_I64, table.data(), y.data(), n, v, d));
  OK(cpu_->embedding_backward(DT_CPU, idx.data(), DT_DTYPE_I64, dy.data(), want_dtab.data(), n,
                              v, d));
  int64_t *gidx = Up(idx);
  float *gy = Zeros(n * d), *gdtab = Up(dtab);
  OK(gpu_->embedding_forward(dev_, gidx, DT_DTYPE_I64, Up(table), gy, n, v, d));
  EXPECT_TRUE(Close(Down(gy, n * d), y, 0, 0));
  OK(gpu_->embedding_backward(dev_, gidx, DT_DTYPE_I64, Up(dy), gdtab, n, v, d));
  EXPECT_TRUE(Close(Down(gdtab, v * d), want_dtab, 1e-5, 1e-5)) << "atomics reorder sums";
  idx[123] = v;
  EXPECT_EQ(DT_ERR_INVALID_ARG,
            gpu_->embedding_forward(dev_, Up(idx), DT_DTYPE_I64, Up(table), gy, n, v, d));
  std::string msg = dt_last_error();
  EXPECT_NE(msg.find("index 1000 at position 123"), std::string::npos) << msg;
}

TEST_F(CudaParity, DropoutMaskIsTheCpuMaskBitForBit) {
  const int64_t n = 100003;
  Vec x = Rand(n, 100), dy = Rand(n, 101), y(n), dx(n);
  std::vector<uint8_t> mask(n);
  const uint64_t seed = 0xC0FFEE, offset = 12345;
  OK(cpu_->dropout_forward(DT_CPU, x.data(), y.data(), mask.data(), n, 0.3f, seed, offset));
  OK(cpu_->dropout_backward(DT_CPU, dy.data(), mask.data(), dx.data(), n, 0.3f));
  float *gy = Zeros(n), *gdx = Zeros(n);
  uint8_t *gm = static_cast<uint8_t *>(Alloc(n));
  OK(gpu_->dropout_forward(dev_, Up(x), gy, gm, n, 0.3f, seed, offset));
  EXPECT_EQ(Down(gm, n), mask);
  EXPECT_TRUE(Close(Down(gy, n), y, 0, 0));
  OK(gpu_->dropout_backward(dev_, Up(dy), gm, gdx, n, 0.3f));
  EXPECT_TRUE(Close(Down(gdx, n), dx, 0, 0));
}

/* ---- optimizers ---- */

TEST_F(CudaParity, SgdAndAdamwUpdates) {
  const int64_t n = 10000;
  Vec p = Rand(n, 110), g = Rand(n, 111), buf = Rand(n, 112);
  for (int nesterov = 0; nesterov < 2; nesterov++)
    for (int first = 0; first < 2; first++) {
      Vec cp = p, cb = buf;
      float dampening = nesterov ? 0.0f : 0.1f;  // Nesterov needs zero dampening (PyTorch)
      OK(cpu_->sgd_update(DT_CPU, cp.data(), g.data(), cb.data(), n, 0.1f, 0.9f, dampening,
                          1e-4f, nesterov, first));
      float *gp = Up(p), *gb = Up(buf);
      OK(gpu_->sgd_update(dev_, gp, Up(g), gb, n, 0.1f, 0.9f, dampening, 1e-4f, nesterov,
                          first));
      EXPECT_TRUE(Close(Down(gp, n), cp, 1e-6, 1e-7)) << "sgd nesterov " << nesterov;
      EXPECT_TRUE(Close(Down(gb, n), cb, 1e-6, 1e-7)) << "sgd buf";
    }
  Vec m = Rand(n, 113, -0.1f, 0.1f), v = Rand(n, 114, 0.0f, 0.01f);
  for (int step : {1, 10, 1000}) {
    Vec cp = p, cm = m, cv = v;
    OK(cpu_->adamw_update(DT_CPU, cp.data(), g.data(), cm.data(), cv.data(), n, 1e-3f, 0.9f,
                          0.999f, 1e-8f, 0.01f, step));
    float *gp = Up(p), *gm = Up(m), *gv = Up(v);
    OK(gpu_->adamw_update(dev_, gp, Up(g), gm, gv, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, step));
    EXPECT_TRUE(Close(Down(gp, n), cp, 1e-5, 1e-6)) << "adamw step " << step;
    EXPECT_TRUE(Close(Down(gm, n), cm, 1e-5, 1e-7));
    EXPECT_TRUE(Close(Down(gv, n), cv, 1e-5, 1e-9));
  }
}

/* ---- streams, events and memory through the table ---- */

TEST_F(CudaParity, StreamsOrderWorkThroughEvents) {
  if (SelfCheck())
    GTEST_SKIP() << "CUDA-only (TF32, GemmEx, streams, pinned memory): not in the CPU self-check";
  const int64_t n = 1 << 22;
  float *a = Zeros(n), *b = Zeros(n);
  dt_stream *compute = gpu_->stream(dev_, DT_STREAM_COMPUTE);
  dt_stream *comm = gpu_->stream(dev_, DT_STREAM_COMM);
  ASSERT_NE(compute, nullptr);
  ASSERT_NE(comm, nullptr);
  ASSERT_NE(compute, comm);
  dt_event *ev = nullptr;
  OK(gpu_->event_create(dev_, &ev));
  for (int round = 0; round < 5; round++) {
    OK(gpu_->fill(dev_, a, (float)round + 1.0f, n));  // compute stream
    OK(gpu_->event_record(ev, compute));
    OK(gpu_->stream_wait_event(comm, ev));
    OK(gpu_->copy(b, dev_, a, dev_, n * sizeof(float), comm));  // after the fill
    OK(gpu_->stream_synchronize(comm));
    Vec got = Down(b, n);
    ASSERT_EQ(got[0], round + 1.0f);
    ASSERT_EQ(got[n - 1], round + 1.0f);
  }
  gpu_->event_destroy(ev);
  OK(gpu_->device_synchronize(dev_));
  dt_memory_stats s;
  OK(gpu_->memory_stats(dev_, &s));
  EXPECT_GE(s.allocated, (size_t)(2 * n * sizeof(float)));
}

// A block freed by the host while queued compute kernels still read it is
// cached for the compute stream; handed out again and filled on the copy
// stream (as the loader does), the copy must wait for those kernels.
TEST_F(CudaParity, CopyStreamWaitsForComputeStillUsingAReusedBlock) {
  if (SelfCheck())
    GTEST_SKIP() << "CUDA-only (TF32, GemmEx, streams, pinned memory): not in the CPU self-check";
  const int64_t n = 1 << 24;  // 64 MiB: the queued kernels take a while
  const size_t bytes = (size_t)n * sizeof(float);
  void *a = nullptr;
  OK(gpu_->alloc(dev_, bytes, &a));
  float *b = Zeros(n);
  OK(gpu_->fill(dev_, (float *)a, 1.0f, n));
  const int rounds = 20;
  for (int r = 0; r < rounds; r++)  // b += a, queued on the compute stream
    OK(gpu_->axpby(dev_, n, 1.0f, (const float *)a, 1.0f, b));
  gpu_->free(dev_, a, bytes);  // the host lets go while the kernels are queued
  void *again = nullptr;
  OK(gpu_->alloc(dev_, bytes, &again));
  bufs_.push_back({again, bytes});
  EXPECT_EQ(again, a) << "the cached block is handed out again";
  float *host = nullptr;
  OK(gpu_->host_alloc(bytes, (void **)&host));
  for (int64_t i = 0; i < n; i++)
    host[i] = 5.0f;
  dt_stream *copy = gpu_->stream(dev_, DT_STREAM_COPY);
  OK(gpu_->copy(again, dev_, host, DT_CPU, bytes, copy));
  OK(gpu_->device_synchronize(dev_));
  gpu_->host_free(host);
  Vec got = Down(b, n);
  size_t bad = 0;
  for (int64_t i = 0; i < n; i++)
    bad += got[i] != (float)rounds;
  EXPECT_EQ(bad, 0u) << "the copy overwrote the block before the compute kernels read it";
  Vec fresh = Down((const float *)again, 1000);
  EXPECT_EQ(fresh, Vec(1000, 5.0f));
}

TEST_F(CudaParity, TensorRoundTripThroughCuda) {
  int64_t shape[2] = {3, 4};
  Vec v = Rand(12, 120);
  dt_tensor *t = nullptr;
  OK(dt_tensor_from_host(v.data(), shape, 2, DT_DTYPE_F32, dev_, &t));
  Vec back(12);
  OK(dt_tensor_to_host(t, back.data(), back.size() * sizeof(float)));
  EXPECT_EQ(back, v);
  dt_tensor_release(t);
}

}  // namespace
