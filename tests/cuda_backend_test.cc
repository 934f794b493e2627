// The CUDA backend beyond the ops: TF32 and mixed-precision GEMM against
// the CPU reference (dt_cpu_backend()), streams and events ordering work,
// index errors reported at the next synchronisation, a tensor round
// trip. The ops' kernels (CPU-vs-CUDA parity, every dtype) are checked by
// the op table, tests/op_table_test.cc. TF32 is off except where a test says
// so. Without a GPU every test skips with the reason dt_backend_get() gives.
//
// DT_PARITY_TEST_DEVICE=cpu:1 runs the suite against the CPU backend itself
// (//tests:cuda_backend_selfcheck_test, in CI): both sides must agree, which
// checks the harness and the calls it makes before a GPU ever runs them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/cpu.h"
#include "core/env.h"
#include "core/half.h"
#include "core/memory.h"
#include "core/ops.h"
#include "core/rng.h"
#include "core/status.h"
#include "core/tensor.h"
#include "cuda/cuda.h"
#include "tests/device_util.h"

namespace {

using Vec = std::vector<float>;

Vec Rand(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Vec v(n);
  for (size_t i = 0; i < n; i++)
    v[i] = lo + (hi - lo) * dt_rng_uniform(seed, i);
  return v;
}

// cuda:0, or the device named by DT_PARITY_TEST_DEVICE.
dt_device TestDevice() { return dtt::TestDevice(DT_ENV_PARITY_TEST_DEVICE); }
std::string NoGpuReason() { return dtt::NoDeviceReason(TestDevice()); }

// |got - want| <= atol + rtol * |want| everywhere; reports the worst element.
::testing::AssertionResult Close(const Vec &got, const Vec &want, double rtol, double atol) {
  return dtt::ParityClose(std::vector<double>(got.begin(), got.end()),
                          std::vector<double>(want.begin(), want.end()), rtol, atol);
}

class CudaBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason = NoGpuReason();
    if (!reason.empty())
      GTEST_SKIP() << "no CUDA device: " << reason;
    ASSERT_EQ(DT_OK, dt_backend_get(dev_, &gpu_)) << dt_last_error();
    ASSERT_EQ(DT_OK, dt_exec_init(DT_CPU, DT_DTYPE_F32, &cex_)) << dt_last_error();
    ASSERT_EQ(DT_OK, dt_exec_init(dev_, DT_DTYPE_F32, &gex_)) << dt_last_error();
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
  dt_exec cex_{}, gex_{};  // f32 kernels on the CPU and on dev_
  // The CPU-against-itself run: CUDA-only APIs are skipped.
  bool SelfCheck() const { return dev_.type == DT_DEVICE_CPU; }
  std::vector<std::pair<void *, size_t>> bufs_;
};

#define OK(expr) ASSERT_EQ(DT_OK, (expr)) << dt_last_error()

/* ---- GEMM: TF32 and mixed precision (f32 parity of every op: tests/op_table_test.cc) ---- */

TEST_F(CudaBackend, GemmWithTf32IsCloseAndMixedPrecisionWorks) {
  if (SelfCheck())
    GTEST_SKIP() << "CUDA-only (TF32, GemmEx, streams, pinned memory): not in the CPU self-check";
  const int m = 64, n = 48, k = 128;
  Vec a = Rand(m * k, 13), b = Rand(k * n, 14), want(m * n, 0.0f);
  OK(dt_kernel_gemm(&cex_, 0, 0, m, n, k, 1.0f, a.data(), k, 0, b.data(), n, 0, 0.0f, want.data(),
                    n, 0, 1));
  float *da = Up(a), *db = Up(b), *dc = Zeros(m * n);
  dt_cuda_set_tf32(1);
  OK(dt_kernel_gemm(&gex_, 0, 0, m, n, k, 1.0f, da, k, 0, db, n, 0, 0.0f, dc, n, 0, 1));
  EXPECT_TRUE(Close(Down(dc, m * n), want, 1e-2, 2e-2)) << "TF32";
  // bf16 and f16 inputs, f32 output
  for (dt_dtype t : {DT_DTYPE_F16, DT_DTYPE_BF16}) {
    void *ha = Alloc(m * k * 2), *hb = Alloc(k * n * 2);
    OK(dt_kernel_cast(&gex_, da, DT_DTYPE_F32, ha, t, m * k));
    OK(dt_kernel_cast(&gex_, db, DT_DTYPE_F32, hb, t, k * n));
    OK(dt_cuda_gemm_ex(dev_, 0, 0, m, n, k, 1.0f, ha, k, 0, hb, n, 0, t, 0.0f, dc, n, 0,
                       DT_DTYPE_F32, 1));
    EXPECT_TRUE(Close(Down(dc, m * n), want, 2e-2, 0.15)) << dt_dtype_name(t);
  }
}

// A 16-bit copy of v (core/half.h's rounding) and its widened values.
std::vector<uint16_t> Half(const Vec &v, dt_dtype t) {
  std::vector<uint16_t> h(v.size());
  EXPECT_EQ(DT_OK, dt_half_from_f32(t, v.data(), h.data(), (int64_t)v.size()));
  return h;
}
Vec Widen(const std::vector<uint16_t> &h, dt_dtype t) {
  Vec v(h.size());
  EXPECT_EQ(DT_OK, dt_half_to_f32(t, h.data(), v.data(), (int64_t)h.size()));
  return v;
}

// The 16-bit GEMMs (cuBLASLt, cuda/blas.c) against the CPU on the same
// rounded operands: every transpose, a batch, f32 and 16-bit outputs,
// alpha/beta, and operands one element off the allocation's alignment
// (the plan takes the pointers' real alignment; the heuristic may then
// choose the GemmEx fallback, which must agree too). The aligned products
// run through cuBLASLt (dt_cuda_gemm_counts).
TEST_F(CudaBackend, HalfGemmThroughCublasLtMatchesTheCpu) {
  if (SelfCheck())
    GTEST_SKIP() << "CUDA-only (cuBLASLt): not in the CPU self-check";
  dt_cuda_gemm_counts before{}, after{};
  OK(dt_cuda_gemm_counts_get(dev_, &before));
  const int m = 96, n = 80, k = 72, batch = 3;
  for (dt_dtype t : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int off : {0, 1}) {
          // A (m,k) or (k,m), B (k,n) or (n,k), batch matrices each, `off` elements in
          const int lda = ta ? m : k, ldb = tb ? k : n;
          const int64_t sa = (int64_t)m * k, sb = (int64_t)k * n, sc = (int64_t)m * n;
          Vec a = Rand(off + batch * sa, 31 + ta), b = Rand(off + batch * sb, 33 + tb),
              c0 = Rand(off + batch * sc, 35);
          std::vector<uint16_t> ah = Half(a, t), bh = Half(b, t);
          Vec ar = Widen(ah, t), br = Widen(bh, t), want = c0;
          OK(dt_kernel_gemm(&cex_, ta, tb, m, n, k, 0.5f, ar.data() + off, lda, sa, br.data() + off,
                            ldb, sb, 0.25f, want.data() + off, n, sc, batch));
          uint16_t *da = Up(ah), *db = Up(bh);
          float *dc = Up(c0);
          dt_exec hex = gex_;
          hex.dtype = t;
          OK(dt_kernel_gemm(&hex, ta, tb, m, n, k, 0.5f, (const float *)(da + off), lda, sa,
                            (const float *)(db + off), ldb, sb, 0.25f, dc + off, n, sc, batch));
          EXPECT_TRUE(Close(Down(dc, c0.size()), want, 1e-4, 1e-4))
              << dt_dtype_name(t) << " f32 C, trans " << ta << tb << " offset " << off;
          // one matrix, a 16-bit C (gemm_ex): the f32 result rounded once
          auto *dh = static_cast<uint16_t *>(Alloc((off + sc) * 2));
          OK(dt_cuda_gemm_ex(dev_, ta, tb, m, n, k, 1.0f, da + off, lda, 0, db + off, ldb, 0, t,
                             0.0f, dh + off, n, 0, t, 1));
          Vec want1(sc, 0.0f);
          OK(dt_kernel_gemm(&cex_, ta, tb, m, n, k, 1.0f, ar.data() + off, lda, 0, br.data() + off,
                            ldb, 0, 0.0f, want1.data(), n, 0, 1));
          std::vector<uint16_t> got16 = Down(dh, off + sc);
          got16.erase(got16.begin(), got16.begin() + off);
          const double ulp = t == DT_DTYPE_BF16 ? 1.0 / 128 : 1.0 / 1024;
          EXPECT_TRUE(Close(Widen(got16, t), want1, ulp, 1e-3))
              << dt_dtype_name(t) << " 16-bit C, trans " << ta << tb << " offset " << off;
        }
  OK(dt_cuda_gemm_counts_get(dev_, &after));
  std::printf("gemm counts: %lld through cuBLASLt, %lld through GemmEx, %lld plans\n",
              (long long)(after.lt_calls - before.lt_calls),
              (long long)(after.fallback_calls - before.fallback_calls), (long long)after.plans);
  // the 16 aligned products at least (offset 0) found a cuBLASLt algorithm
  EXPECT_GE(after.lt_calls - before.lt_calls, 16);
}

// The 16-bit linear forward (cuBLASLt's bias epilogue) against the CPU's
// (an f32 accumulator per slice of rows): with and without a bias, a
// GPT-2-like shape, odd sizes, and rows x outputs above the CPU's slicing
// threshold (2^20), so the CPU slices while the GPU makes one call. The
// bias at 256, 8 and 2 bytes of alignment: after the first update a
// 16-bit linear reads its bias from the packed working copy (LeNet's fc1.b
// and fc2.b at 8 bytes), and cuBLASLt's bias epilogue needs 16.
TEST_F(CudaBackend, HalfLinearForwardWithBiasMatchesTheCpu) {
  struct Shape {
    int m, n, k;
  };
  for (dt_dtype t : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (Shape sh : {Shape{64, 2304, 768}, Shape{7, 5, 3}, Shape{1100, 1000, 33}})
      for (int bias_at : {-1, 0, 4, 1}) {  // no bias, then the bias's offset in elements
        bool with_bias = bias_at >= 0;
        std::vector<uint16_t> x = Half(Rand((size_t)sh.m * sh.k, 41), t),
                              w = Half(Rand((size_t)sh.n * sh.k, 42, -0.2f, 0.2f), t),
                              b = Half(Rand(sh.n, 43), t);
        std::vector<uint16_t> want((size_t)sh.m * sh.n);
        dt_exec cex = cex_, hex = gex_;
        cex.dtype = hex.dtype = t;
        OK(dt_kernel_linear_forward(
            &cex, sh.m, sh.n, sh.k, (const float *)x.data(), (const float *)w.data(),
            with_bias ? (const float *)b.data() : nullptr, (float *)want.data()));
        std::vector<uint16_t> placed(b);
        placed.insert(placed.begin(), (size_t)std::max(bias_at, 0), 0);
        uint16_t *dx = Up(x), *dw = Up(w), *dbias = Up(placed) + std::max(bias_at, 0);
        auto *dy = static_cast<uint16_t *>(Alloc(want.size() * 2));
        OK(dt_kernel_linear_forward(&hex, sh.m, sh.n, sh.k, (const float *)dx, (const float *)dw,
                                    with_bias ? (const float *)dbias : nullptr, (float *)dy));
        const double ulp = t == DT_DTYPE_BF16 ? 1.0 / 128 : 1.0 / 1024;
        EXPECT_TRUE(Close(Widen(Down(dy, want.size()), t), Widen(want, t), ulp, 1e-3))
            << dt_dtype_name(t) << " " << sh.m << "x" << sh.n << "x" << sh.k << " bias at "
            << bias_at;
      }
  dt_exec f32 = gex_;
  float z = 0.0f;
  EXPECT_EQ(dt_kernel_linear_forward(&f32, 1, 1, 1, &z, &z, nullptr, &z), DT_ERR_DTYPE);
}

// The GELU MLP's kernels (dt_op_gelu_mlp) against the CPU's: c_fc with
// GELU (linear_gelu_forward: cuBLASLt's GELU_AUX(_BIAS) epilogue, the GELU
// of the f32 sum) and c_proj's dx through GELU's gradient (gemm_dgelu: the
// DGELU epilogue on the f32 product). The CPU takes GELU of the rounded pre
// and rounds the product before the gradient: a rounding or two apart. A
// GPT-2 124M layer's shapes (the epilogues: dt_cuda_gemm_counts'
// gelu_calls), a hidden width of 12 (the aux leading dimension must be a
// multiple of 8: the fallback kernels) and a bias at 8 bytes (the
// fallback too).
TEST_F(CudaBackend, HalfGeluEpiloguesMatchTheCpu) {
  struct Shape {
    int m, n, k;  // rows, hidden, in (the forward); rows, hidden, out (the dgelu)
    int bias_at;  // the bias's offset in elements, -1 none
  };
  dt_cuda_gemm_counts before{}, after{};
  if (!SelfCheck())
    OK(dt_cuda_gemm_counts_get(dev_, &before));
  int epilogue_calls = 0;
  for (dt_dtype t : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (Shape sh : {Shape{256, 3072, 768, 0}, Shape{64, 3072, 768, -1}, Shape{7, 12, 16, 0},
                     Shape{64, 256, 64, 4}}) {
      const double ulp = t == DT_DTYPE_BF16 ? 1.0 / 128 : 1.0 / 1024;
      const size_t mn = (size_t)sh.m * sh.n;
      std::vector<uint16_t> x = Half(Rand((size_t)sh.m * sh.k, 51, -2.0f, 2.0f), t),
                            w = Half(Rand((size_t)sh.n * sh.k, 52, -0.1f, 0.1f), t),
                            b = Half(Rand(sh.n, 53), t);
      std::vector<uint16_t> pre(mn), y(mn);
      dt_exec cex = cex_, hex = gex_;
      cex.dtype = hex.dtype = t;
      const bool with_bias = sh.bias_at >= 0;
      OK(dt_kernel_linear_gelu_forward(
          &cex, sh.m, sh.n, sh.k, (const float *)x.data(), (const float *)w.data(),
          with_bias ? (const float *)b.data() : nullptr, (float *)pre.data(), (float *)y.data()));
      std::vector<uint16_t> placed(b);
      placed.insert(placed.begin(), (size_t)std::max(sh.bias_at, 0), 0);
      uint16_t *dx = Up(x), *dw = Up(w), *dbias = Up(placed) + std::max(sh.bias_at, 0);
      auto *dpre = static_cast<uint16_t *>(Alloc(mn * 2)),
           *dy = static_cast<uint16_t *>(Alloc(mn * 2));
      OK(dt_kernel_linear_gelu_forward(&hex, sh.m, sh.n, sh.k, (const float *)dx, (const float *)dw,
                                       with_bias ? (const float *)dbias : nullptr, (float *)dpre,
                                       (float *)dy));
      const std::string what = std::string(dt_dtype_name(t)) + " " + std::to_string(sh.m) + "x" +
                               std::to_string(sh.n) + "x" + std::to_string(sh.k);
      EXPECT_TRUE(Close(Widen(Down(dpre, mn), t), Widen(pre, t), ulp, 1e-3)) << what << " pre";
      EXPECT_TRUE(Close(Widen(Down(dy, mn), t), Widen(y, t), 2 * ulp, 2e-3)) << what << " y";
      // dpre (m, n) = (g (m, k) @ w2 (k, n)) * gelu'(pre), k = the layer's outputs
      std::vector<uint16_t> g = Half(Rand((size_t)sh.m * sh.k, 54), t),
                            w2 = Half(Rand((size_t)sh.k * sh.n, 55, -0.1f, 0.1f), t), want(mn);
      OK(dt_kernel_gemm_dgelu(&cex, sh.m, sh.n, sh.k, (const float *)g.data(),
                              (const float *)w2.data(), (const float *)pre.data(),
                              (float *)want.data()));
      uint16_t *dg = Up(g), *dw2 = Up(w2), *dpre_cpu = Up(pre);
      auto *dgrad = static_cast<uint16_t *>(Alloc(mn * 2));
      OK(dt_kernel_gemm_dgelu(&hex, sh.m, sh.n, sh.k, (const float *)dg, (const float *)dw2,
                              (const float *)dpre_cpu, (float *)dgrad));
      EXPECT_TRUE(Close(Widen(Down(dgrad, mn), t), Widen(want, t), 2 * ulp, 2e-3))
          << what << " dpre";
      epilogue_calls += sh.n % 8 == 0 && sh.bias_at != 4 ? 2 : sh.n % 8 == 0 ? 1 : 0;
    }
  if (SelfCheck())
    return;
  OK(dt_cuda_gemm_counts_get(dev_, &after));
  std::printf("GELU epilogues: %lld of the %d calls that may take them\n",
              (long long)(after.gelu_calls - before.gelu_calls), epilogue_calls);
  // the GPT-2 shapes at least (forward and dgelu, two dtypes, two shapes)
  EXPECT_GE(after.gelu_calls - before.gelu_calls, 8);
}

// The batch norm of 16-bit tensors (autocast's NORM policy: a ResNet's
// convolution output normalised into a 16-bit y) against the CPU's (the f32
// kernel on widened copies, rounded once): training forward (y, the saved
// and running statistics) and backward (dx of x's dtype, dgamma, dbeta), a
// ResNet-50 stage-1 plane and a small odd one; then an f32 x with a 16-bit
// y, which runs on f32 copies. Prints whether cuDNN took the 16-bit calls
// (dt_cuda_bn_counts): cuDNN 9 documents half, not bfloat16, for the
// legacy batch norm, and a declined call takes the f32 copies.
TEST_F(CudaBackend, HalfBatchNormMatchesTheCpu) {
  struct Geom {
    int64_t n, c, hw;
  };
  dt_cuda_bn_counts before{}, after{};
  if (!SelfCheck())
    OK(dt_cuda_bn_counts_get(dev_, &before));
  const float eps = 1e-5f, mom = 0.1f;
  for (dt_dtype t : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (Geom g : {Geom{8, 64, 56 * 56}, Geom{4, 3, 49}})
      for (int half_x = 0; half_x < 2; half_x++) {
        const size_t total = (size_t)(g.n * g.c * g.hw), c = (size_t)g.c;
        const double ulp = t == DT_DTYPE_BF16 ? 1.0 / 128 : 1.0 / 1024;
        const std::string what = std::string(dt_dtype_name(t)) + (half_x ? " x" : " f32 x") + " " +
                                 std::to_string(g.n) + "x" + std::to_string(g.c) + "x" +
                                 std::to_string(g.hw);
        Vec x32 = Rand(total, 81, -2.0f, 3.0f), gamma = Rand(c, 82, 0.5f, 1.5f), beta = Rand(c, 83);
        std::vector<uint16_t> x16 = Half(x32, t), dy16 = Half(Rand(total, 84), t);
        const void *xh = half_x ? (const void *)x16.data() : (const void *)x32.data();
        dt_exec cex = cex_, hex = gex_;
        cex.dtype = hex.dtype = half_x ? t : DT_DTYPE_F32;
        Vec rm(c, 0.0f), rv(c, 1.0f), sm(c), si(c);
        std::vector<uint16_t> y(total);
        OK(dt_kernel_batch_norm2d_forward(&cex, (const float *)xh, (float *)y.data(), t,
                                          gamma.data(), beta.data(), rm.data(), rv.data(),
                                          sm.data(), si.data(), g.n, g.c, g.hw, true, mom, eps));
        const size_t xbytes = total * (half_x ? 2 : 4);
        auto *dx_in = static_cast<char *>(Alloc(xbytes));
        OK(gpu_->copy(dx_in, dev_, xh, DT_CPU, xbytes, nullptr));
        float *dgam = Up(gamma), *dbet = Up(beta), *drm = Up(Vec(c, 0.0f)), *drv = Up(Vec(c, 1.0f));
        float *dsm = Zeros(c), *dsi = Zeros(c);
        auto *dy_out = static_cast<uint16_t *>(Alloc(total * 2));
        OK(dt_kernel_batch_norm2d_forward(&hex, (const float *)dx_in, (float *)dy_out, t, dgam,
                                          dbet, drm, drv, dsm, dsi, g.n, g.c, g.hw, true, mom,
                                          eps));
        EXPECT_TRUE(Close(Widen(Down(dy_out, total), t), Widen(y, t), ulp, 1e-3)) << what << " y";
        EXPECT_TRUE(Close(Down(dsm, c), sm, 1e-4, 1e-5)) << what << " saved mean";
        EXPECT_TRUE(Close(Down(dsi, c), si, 1e-4, 1e-5)) << what << " saved invstd";
        EXPECT_TRUE(Close(Down(drm, c), rm, 1e-4, 1e-5)) << what << " running mean";
        EXPECT_TRUE(Close(Down(drv, c), rv, 1e-4, 1e-5)) << what << " running var";
        // the backward: dy 16-bit (y's), dx of x's dtype
        std::vector<char> dx(xbytes);
        Vec dg(c), db(c);
        OK(dt_kernel_batch_norm2d_backward(&cex, (const float *)xh, (const float *)dy16.data(), t,
                                           gamma.data(), sm.data(), si.data(), (float *)dx.data(),
                                           dg.data(), db.data(), g.n, g.c, g.hw, eps));
        uint16_t *ddy = Up(dy16);
        auto *ddx = static_cast<char *>(Alloc(xbytes));
        float *ddg = Zeros(c), *ddb = Zeros(c);
        OK(dt_kernel_batch_norm2d_backward(&hex, (const float *)dx_in, (const float *)ddy, t, dgam,
                                           dsm, dsi, (float *)ddx, ddg, ddb, g.n, g.c, g.hw, eps));
        std::vector<char> got(xbytes);
        OK(gpu_->copy(got.data(), dev_, ddx, DT_CPU, xbytes, nullptr));
        if (half_x) {
          std::vector<uint16_t> a(total), b(total);
          std::memcpy(a.data(), got.data(), xbytes);
          std::memcpy(b.data(), dx.data(), xbytes);
          EXPECT_TRUE(Close(Widen(a, t), Widen(b, t), 2 * ulp, 2e-3)) << what << " dx";
        } else {
          Vec a(total), b(total);
          std::memcpy(a.data(), got.data(), xbytes);
          std::memcpy(b.data(), dx.data(), xbytes);
          EXPECT_TRUE(Close(a, b, 1e-3, 1e-4)) << what << " dx";
        }
        EXPECT_TRUE(Close(Down(ddg, c), dg, 2e-3, 2e-3)) << what << " dgamma";
        EXPECT_TRUE(Close(Down(ddb, c), db, 2e-3, 2e-3)) << what << " dbeta";
      }
  if (SelfCheck())
    return;
  OK(dt_cuda_bn_counts_get(dev_, &after));
  std::printf(
      "16-bit batch norm calls: %lld through cuDNN on 16-bit tensors, %lld on f32 copies "
      "(%lld of them declined by cuDNN)\n",
      (long long)(after.half_cudnn - before.half_cudnn),
      (long long)(after.f32_copies - before.f32_copies),
      (long long)(after.declined - before.declined));
  // every call counted: 2 dtypes x 2 shapes x 2 x dtypes, forward and backward
  EXPECT_EQ(after.half_cudnn + after.f32_copies - before.half_cudnn - before.f32_copies, 16);
}

// The fused attention kernels on a 16-bit qkv against the CPU's (f32 math
// on the widened qkv): the tensor-core (WMMA) kernels for head sizes 16,
// 32, 64 and 128, the f32 tiles for 48; T across the 64-row blocks and a
// GPT-2 124M layer. The tensor cores read P, dO and dS rounded to 16 bits,
// so the tolerance is the dtype's (max error over the largest element).
TEST_F(CudaBackend, HalfAttentionKernelsMatchTheCpu) {
  struct Geom {
    int64_t b, t, h, hd;
  };
  auto rel = [](const Vec &got, const Vec &want) {
    double err = 0.0, scale = 0.0;
    for (size_t i = 0; i < want.size(); i++) {
      err = std::fmax(err, std::fabs((double)got[i] - want[i]));
      scale = std::fmax(scale, std::fabs((double)want[i]));
    }
    return err / (scale > 0 ? scale : 1.0);
  };
  for (dt_dtype t : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (Geom q : {Geom{2, 9, 2, 16}, Geom{1, 130, 2, 32}, Geom{2, 65, 3, 64}, Geom{1, 77, 1, 128},
                   Geom{2, 65, 3, 48}, Geom{1, 1024, 12, 64}}) {
      const size_t nqkv = (size_t)(q.b * q.t * 3 * q.h * q.hd), nout = nqkv / 3,
                   nlse = (size_t)(q.b * q.h * q.t);
      // qkv, out, dout and dqkv of the 16-bit type, lse f32 (op_table.def)
      std::vector<uint16_t> qkv = Half(Rand(nqkv, 71, -2.0f, 2.0f), t),
                            dout = Half(Rand(nout, 72), t), out(nout), dqkv(nqkv);
      Vec lse(nlse);
      dt_exec cex = cex_, hex = gex_;
      cex.dtype = hex.dtype = t;
      auto f = [](auto &v) { return (float *)v.data(); };
      OK(dt_kernel_causal_attention_forward(&cex, f(qkv), f(out), lse.data(), q.b, q.t, q.h, q.hd));
      OK(dt_kernel_causal_attention_backward(&cex, f(qkv), f(out), lse.data(), f(dout), f(dqkv),
                                             q.b, q.t, q.h, q.hd));
      const Vec want_out = Widen(out, t), want_dqkv = Widen(dqkv, t);
      uint16_t *dq = Up(qkv), *dd = Up(dout), *dout_ = Up(out), *dg = Up(dqkv);
      float *dlse = Zeros(nlse);
      OK(dt_kernel_causal_attention_forward(&hex, (const float *)dq, (float *)dout_, dlse, q.b, q.t,
                                            q.h, q.hd));
      OK(dt_kernel_causal_attention_backward(&hex, (const float *)dq, (const float *)dout_, dlse,
                                             (const float *)dd, (float *)dg, q.b, q.t, q.h, q.hd));
      const double tol = t == DT_DTYPE_BF16 ? 2e-2 : 4e-3;
      const std::string what = std::string(dt_dtype_name(t)) + " " + std::to_string(q.b) + "x" +
                               std::to_string(q.t) + " h" + std::to_string(q.h) + " hd" +
                               std::to_string(q.hd);
      EXPECT_LE(rel(Widen(Down(dout_, nout), t), want_out), tol) << what << ": out";
      EXPECT_TRUE(Close(Down(dlse, nlse), lse, 1e-4, 1e-4)) << what << ": lse";
      EXPECT_LE(rel(Widen(Down(dg, nqkv), t), want_dqkv), tol) << what << ": dqkv";
      if (q.hd != 64)
        continue;
      // qkv and dO 2 bytes past a 16-byte boundary: the tensor-core kernels
      // copy their tiles an element at a time instead of 16 bytes at a time
      auto shifted = [&](const std::vector<uint16_t> &v) {
        std::vector<uint16_t> s1(v.size() + 1, 0);
        std::copy(v.begin(), v.end(), s1.begin() + 1);
        return (const float *)(Up(s1) + 1);
      };
      const float *sq = shifted(qkv), *sdo = shifted(dout);
      uint16_t *sout = Up(out), *sg = Up(dqkv);
      float *slse = Zeros(nlse);
      OK(dt_kernel_causal_attention_forward(&hex, sq, (float *)sout, slse, q.b, q.t, q.h, q.hd));
      OK(dt_kernel_causal_attention_backward(&hex, sq, (const float *)sout, slse, sdo, (float *)sg,
                                             q.b, q.t, q.h, q.hd));
      EXPECT_LE(rel(Widen(Down(sout, nout), t), want_out), tol)
          << what << " (not 16-byte aligned): out";
      EXPECT_LE(rel(Widen(Down(sg, nqkv), t), want_dqkv), tol)
          << what << " (not 16-byte aligned): dqkv";
    }
}

// gemm_rounded (16-bit A, B and C, one rounding of the f32 accumulator;
// the linear's dx of a 16-bit input): every transpose, a C wider than n
// (ldc > n), k = 0 (C = 0), against the CPU's.
// reduce_sum of a 16-bit x (a 16-bit linear's bias gradient, with no f32
// copy of it) into f32: rows (inner 1), columns (GPT-2's c_fc bias: 3072
// columns over 4096 rows), and a middle axis.
TEST_F(CudaBackend, HalfReduceSumMatchesTheCpu) {
  struct Shape {
    int64_t outer, r, inner;
  };
  for (dt_dtype t : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (Shape sh : {Shape{1, 4096, 3072}, Shape{37, 513, 1}, Shape{3, 70, 45}}) {
      size_t nx = (size_t)(sh.outer * sh.r * sh.inner), ny = (size_t)(sh.outer * sh.inner);
      std::vector<uint16_t> x = Half(Rand(nx, 51), t);
      Vec want(ny);
      dt_exec cex = cex_, hex = gex_;
      cex.dtype = hex.dtype = t;
      OK(dt_kernel_reduce_sum(&cex, (const float *)x.data(), want.data(), sh.outer, sh.r, sh.inner,
                              0.5f));
      uint16_t *dx = Up(x);
      float *dy = Zeros(ny);
      OK(dt_kernel_reduce_sum(&hex, (const float *)dx, dy, sh.outer, sh.r, sh.inner, 0.5f));
      EXPECT_TRUE(Close(Down(dy, ny), want, 1e-5, 1e-5))
          << dt_dtype_name(t) << " " << sh.outer << "x" << sh.r << "x" << sh.inner;
    }
}

TEST_F(CudaBackend, HalfGemmRoundedMatchesTheCpu) {
  struct Shape {
    int m, n, k;
  };
  for (dt_dtype t : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (Shape sh : {Shape{1024, 768, 3072}, Shape{7, 5, 3}, Shape{300, 33, 1000}, Shape{4, 6, 0}})
      for (int tr = 0; tr < 4; tr++) {
        const bool ta = tr & 1, tb = tr & 2;
        const int lda = ta ? sh.m : (sh.k > 0 ? sh.k : 1), ldb = tb ? (sh.k > 0 ? sh.k : 1) : sh.n;
        const int ldc = sh.n + 3;
        std::vector<uint16_t> a = Half(Rand((size_t)sh.m * sh.k, 61), t),
                              b = Half(Rand((size_t)sh.k * sh.n, 62, -0.2f, 0.2f), t);
        std::vector<uint16_t> want((size_t)sh.m * ldc, 0x3c00);  // the gaps stay as they were
        dt_exec cex = cex_, hex = gex_;
        cex.dtype = hex.dtype = t;
        OK(dt_kernel_gemm_rounded(&cex, ta, tb, sh.m, sh.n, sh.k, 0.5f, (const float *)a.data(),
                                  lda, (const float *)b.data(), ldb, (float *)want.data(), ldc));
        uint16_t *da = Up(a), *db = Up(b);
        std::vector<uint16_t> init((size_t)sh.m * ldc, 0x3c00);
        uint16_t *dc = Up(init);
        OK(dt_kernel_gemm_rounded(&hex, ta, tb, sh.m, sh.n, sh.k, 0.5f, (const float *)da, lda,
                                  (const float *)db, ldb, (float *)dc, ldc));
        const double ulp = t == DT_DTYPE_BF16 ? 1.0 / 128 : 1.0 / 1024;
        EXPECT_TRUE(Close(Widen(Down(dc, want.size()), t), Widen(want, t), ulp, 1e-3))
            << dt_dtype_name(t) << " " << sh.m << "x" << sh.n << "x" << sh.k << " ta " << ta
            << " tb " << tb;
      }
  dt_exec f32 = gex_;
  float z = 0.0f;
  EXPECT_EQ(dt_kernel_gemm_rounded(&f32, false, false, 1, 1, 1, 1.0f, &z, 1, &z, 1, &z, 1),
            DT_ERR_DTYPE);
}

// The 16-bit convolution kernels (cuDNN with bf16/f16 tensors and f32
// compute, the bias through kernels_conv.cu) against the CPU's (the f32
// kernel on widened copies): forward with and without a bias, and the
// backward's dx, dw (16-bit) and db (f32), on LeNet-5's first layer, a
// strided padded one and an odd one.
TEST_F(CudaBackend, HalfConvolutionMatchesTheCpu) {
  struct Geom {
    int n, c, h, w, oc, k, s, p;
  };
  for (dt_dtype t : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (Geom q : {Geom{8, 1, 28, 28, 6, 5, 1, 2}, Geom{3, 6, 13, 11, 16, 3, 2, 1},
                   Geom{1, 3, 5, 7, 5, 2, 1, 0}})
      for (bool with_bias : {true, false}) {
        dt_conv2d_geom g{};
        g.n = q.n, g.c = q.c, g.h = q.h, g.w = q.w, g.oc = q.oc, g.kh = g.kw = q.k;
        g.sh = g.sw = q.s, g.ph = g.pw = q.p;
        g.oh = (q.h + 2 * q.p - q.k) / q.s + 1;
        g.ow = (q.w + 2 * q.p - q.k) / q.s + 1;
        const size_t nx = (size_t)q.n * q.c * q.h * q.w, nw = (size_t)q.oc * q.c * q.k * q.k,
                     ny = (size_t)q.n * q.oc * g.oh * g.ow;
        std::vector<uint16_t> x = Half(Rand(nx, 51), t), w = Half(Rand(nw, 52, -0.3f, 0.3f), t),
                              dy = Half(Rand(ny, 53), t);
        Vec bias = Rand(q.oc, 54);
        dt_exec cex = cex_, hex = gex_;
        cex.dtype = hex.dtype = t;
        size_t cws = 0, gws = 0;
        OK(dt_kernel_conv2d_workspace(&cex, &g, &cws));
        OK(dt_kernel_conv2d_workspace(&hex, &g, &gws));
        std::vector<uint8_t> cwork(cws + 1);
        void *gwork = gws ? Alloc(gws) : nullptr;
        std::vector<uint16_t> y(ny), dx(nx), dw(nw);
        Vec db(q.oc);
        const float *b = with_bias ? bias.data() : nullptr;
        OK(dt_kernel_conv2d_forward(&cex, &g, (const float *)x.data(), (const float *)w.data(), b,
                                    (float *)y.data(), cwork.data()));
        OK(dt_kernel_conv2d_backward(&cex, &g, (const float *)x.data(), (const float *)w.data(),
                                     (const float *)dy.data(), (float *)dx.data(),
                                     (float *)dw.data(), db.data(), cwork.data()));
        uint16_t *gx = Up(x), *gw = Up(w), *gdy = Up(dy);
        float *gb = Up(bias), *gdb = Zeros(q.oc);
        auto *gy = static_cast<uint16_t *>(Alloc(ny * 2));
        auto *gdx = static_cast<uint16_t *>(Alloc(nx * 2));
        auto *gdw = static_cast<uint16_t *>(Alloc(nw * 2));
        OK(dt_kernel_conv2d_forward(&hex, &g, (const float *)gx, (const float *)gw,
                                    with_bias ? gb : nullptr, (float *)gy, gwork));
        OK(dt_kernel_conv2d_backward(&hex, &g, (const float *)gx, (const float *)gw,
                                     (const float *)gdy, (float *)gdx, (float *)gdw, gdb, gwork));
        // two roundings on the GPU (cuDNN's result, then the bias) against one
        const double ulp = t == DT_DTYPE_BF16 ? 1.0 / 128 : 1.0 / 1024;
        std::string what = std::string(dt_dtype_name(t)) + " n" + std::to_string(q.n) + " c" +
                           std::to_string(q.c) + " oc" + std::to_string(q.oc) + " bias " +
                           std::to_string(with_bias);
        EXPECT_TRUE(Close(Widen(Down(gy, ny), t), Widen(y, t), 2 * ulp, 1e-2)) << "y " << what;
        EXPECT_TRUE(Close(Widen(Down(gdx, nx), t), Widen(dx, t), ulp, 1e-2)) << "dx " << what;
        EXPECT_TRUE(Close(Widen(Down(gdw, nw), t), Widen(dw, t), ulp, 1e-2)) << "dw " << what;
        EXPECT_TRUE(Close(Down(gdb, q.oc), db, 1e-5, 1e-4)) << "db " << what;
      }
}

/* ---- the optimizers' 16-bit working copy (dt_half_out) ---- */

// The fused updates and the half_copy kernel write the same parameters and
// the same 16-bit copy as the CPU, bit for bit, rounded to nearest and
// stochastically (the draws are dt_rng_uniform on both).
TEST_F(CudaBackend, OptimizersWriteTheCpusWorkingCopy) {
  const int64_t n = 5000;
  for (dt_dtype t : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (bool stochastic : {false, true}) {
      Vec p = Rand(n, 21), g = Rand(n, 22, -0.1f, 0.1f), m = Rand(n, 23, -0.01f, 0.01f),
          v = Rand(n, 24, 0.0f, 1e-4f);
      float *dp = Up(p), *dg = Up(g), *dm = Up(m), *dv = Up(v);
      std::vector<uint16_t> h(n), hs(n), hc(n);
      auto *dh = static_cast<uint16_t *>(Alloc(n * 2));
      auto *dhs = static_cast<uint16_t *>(Alloc(n * 2));
      dt_half_out out = {h.data(), t, stochastic, 77, 1000};
      dt_half_out dout = {dh, t, stochastic, 77, 1000};
      OK(dt_kernel_adamw_update(&cex_, p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f,
                                0.95f, 1e-8f, 0.1f, 3, &out));
      OK(dt_kernel_adamw_update(&gex_, dp, dg, dm, dv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3,
                                &dout));
      EXPECT_EQ(Down(dp, n), p) << "adamw parameters";
      EXPECT_EQ(Down(dh, n), h) << "adamw " << dt_dtype_name(t) << " stochastic " << stochastic;
      dt_half_out sout = {hs.data(), t, stochastic, 78, 0}, dsout = {dhs, t, stochastic, 78, 0};
      OK(dt_kernel_sgd_update(&cex_, p.data(), g.data(), m.data(), n, 0.05f, 0.9f, 0.0f, 0.0f, 0, 0,
                              &sout));
      OK(dt_kernel_sgd_update(&gex_, dp, dg, dm, n, 0.05f, 0.9f, 0.0f, 0.0f, 0, 0, &dsout));
      EXPECT_EQ(Down(dp, n), p) << "sgd parameters";
      EXPECT_EQ(Down(dhs, n), hs) << "sgd " << dt_dtype_name(t) << " stochastic " << stochastic;
      dt_half_out cout = {hc.data(), t, stochastic, 79, 5}, dcout = {dh, t, stochastic, 79, 5};
      OK(dt_kernel_half_copy(&cex_, p.data(), n, &cout));
      OK(dt_kernel_half_copy(&gex_, dp, n, &dcout));
      EXPECT_EQ(Down(dh, n), hc) << "half_copy " << dt_dtype_name(t);
      if (!stochastic) {  // nearest: the copy is core/half.h's conversion of the parameters
        std::vector<uint16_t> want(n);
        OK(dt_half_from_f32(t, p.data(), want.data(), n));
        EXPECT_EQ(hc, want);
        EXPECT_EQ(hs, want);
      }
    }
  dt_half_out bad = {nullptr, DT_DTYPE_F32, false, 0, 0};
  float x = 1.0f;
  EXPECT_EQ(dt_kernel_half_copy(&gex_, &x, 1, &bad), DT_ERR_DTYPE);
  EXPECT_EQ(dt_kernel_half_copy(&gex_, &x, 1, nullptr), DT_ERR_INVALID_ARG);
}

/* ---- streams, events and memory through the table ---- */

TEST_F(CudaBackend, StreamsOrderWorkThroughEvents) {
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
    OK(dt_kernel_fill(&gex_, a, (float)round + 1.0f, n));  // compute stream
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

// An op's status, or that of the first synchronisation after it: a GPU
// finds a bad index in its kernel and says so when the host next waits
// for the device (here, reading the result back, as the loss item does).
dt_status StatusAtNextSync(dt_status op_status, dt_tensor *out) {
  if (op_status != DT_OK)
    return op_status;
  std::vector<float> v(dt_tensor_numel(out));
  return dt_tensor_to_host(out, v.data(), v.size() * sizeof(float));
}

// Index validation without a host sync (issue 10, item 6): the op returns
// before the kernel ran; the next synchronisation reports what the kernel
// found, with the CPU's message; then the device is clean again. The first
// of two failures is the one reported.
TEST_F(CudaBackend, BadIndicesAreReportedAtTheNextSyncWithTheCpuMessage) {
  const int64_t n = 64, c = 10;
  Vec logits_v = Rand(n * c, 7);
  std::vector<int64_t> target_v(n);
  for (int64_t i = 0; i < n; i++)
    target_v[i] = i % 5 == 2 ? -100 : i % c;
  target_v[41] = 12;
  target_v[50] = -7;
  int64_t ls[2] = {n, c}, ts[1] = {n};
  std::string msg[2];
  for (int side = 0; side < 2; side++) {
    dt_device d = side == 0 ? DT_CPU : dev_;
    dt_tensor *logits = nullptr, *target = nullptr, *loss = nullptr;
    OK(dt_tensor_from_host(logits_v.data(), ls, 2, DT_DTYPE_F32, d, &logits));
    OK(dt_tensor_from_host(target_v.data(), ts, 1, DT_DTYPE_I64, d, &target));
    dt_status st = dt_op_cross_entropy(logits, target, DT_REDUCTION_MEAN, -100, &loss);
    char dn[32];
    EXPECT_EQ(StatusAtNextSync(st, loss), DT_ERR_INVALID_ARG) << dt_device_format(d, dn, sizeof dn);
    msg[side] = dt_last_error();
    dt_tensor_release(loss);
    // The error was taken: the device works on.
    loss = nullptr;
    target_v[41] = 3;
    target_v[50] = 4;
    dt_tensor *good = nullptr;
    OK(dt_tensor_from_host(target_v.data(), ts, 1, DT_DTYPE_I64, d, &good));
    OK(dt_op_cross_entropy(logits, good, DT_REDUCTION_MEAN, -100, &loss));
    float item = 0.0f;
    OK(dt_tensor_to_host(loss, &item, sizeof item));
    EXPECT_TRUE(std::isfinite(item));
    target_v[41] = 12;
    target_v[50] = -7;
    for (dt_tensor *t : {loss, good, target, logits})
      dt_tensor_release(t);
  }
  EXPECT_NE(msg[0].find("target 12 at row 41"), std::string::npos) << msg[0];
  EXPECT_EQ(msg[1].rfind(msg[0], 0), 0u)
      << "the device's message starts with the CPU's\ncpu: " << msg[0] << "\ndevice: " << msg[1];

  // Embedding: two bad forwards queued before the host looks; the first
  // is the one reported, once.
  std::vector<int32_t> ids1 = {1, 2, 3, 9, 0}, ids2 = {1, 2, 3, 4, -1};
  Vec table_v = Rand(9 * 4, 8);
  int64_t is[1] = {5}, tbs[2] = {9, 4};
  dt_tensor *idx1 = nullptr, *idx2 = nullptr, *table = nullptr, *y1 = nullptr, *y2 = nullptr;
  OK(dt_tensor_from_host(ids1.data(), is, 1, DT_DTYPE_I32, dev_, &idx1));
  OK(dt_tensor_from_host(ids2.data(), is, 1, DT_DTYPE_I32, dev_, &idx2));
  OK(dt_tensor_from_host(table_v.data(), tbs, 2, DT_DTYPE_F32, dev_, &table));
  dt_status st = dt_op_embedding(idx1, table, &y1);
  if (st == DT_OK) {  // a GPU: both queued, reported at the sync
    OK(dt_op_embedding(idx2, table, &y2));
    st = StatusAtNextSync(st, y2);
  }
  EXPECT_EQ(st, DT_ERR_INVALID_ARG);
  std::string e = dt_last_error();
  EXPECT_NE(e.find("index 9 at position 3 is outside [0, 9)"), std::string::npos) << e;
  if (y2) {
    OK(StatusAtNextSync(DT_OK, y2));  // reported once
  }
  for (dt_tensor *t : {y2, y1, table, idx2, idx1})
    dt_tensor_release(t);
}

TEST_F(CudaBackend, TensorRoundTripThroughCuda) {
  int64_t shape[2] = {3, 4};
  Vec v = Rand(12, 120);
  dt_tensor *t = nullptr;
  OK(dt_tensor_from_host(v.data(), shape, 2, DT_DTYPE_F32, dev_, &t));
  Vec back(12);
  OK(dt_tensor_to_host(t, back.data(), back.size() * sizeof(float)));
  EXPECT_EQ(back, v);
  dt_tensor_release(t);
}

// cuDNN's descriptors index with int: a convolution whose tensors reach 2^31
// elements is refused with a clear status before a descriptor sees it (no
// memory is touched: only the plan is asked for).
TEST_F(CudaBackend, CudnnRefusesTensorsOf2To31Elements) {
  if (SelfCheck())
    GTEST_SKIP() << "cuDNN's limit: CUDA only";
  dt_conv2d_geom g{};
  g.n = 1 << 15, g.c = 64, g.h = 1024, g.w = 1024;  // 2^41 input elements
  g.oc = 8, g.kh = g.kw = 1, g.sh = g.sw = 1, g.oh = 1024, g.ow = 1024;
  size_t ws = 0;
  EXPECT_EQ(DT_ERR_UNSUPPORTED, dt_kernel_conv2d_workspace(&gex_, &g, &ws));
  EXPECT_NE(std::string(dt_last_error()).find("2^31"), std::string::npos) << dt_last_error();
}

}  // namespace
