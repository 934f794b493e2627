// CPU reference backend: each kernel of dt_cpu_backend() against a naive
// implementation or values computed by hand from the PyTorch formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/device.h"
#include "core/half.h"
#include "core/memory.h"
#include "core/rng.h"
#include "core/status.h"
#include "tests/cpu_kernels_test_util.h"

namespace {

using namespace dtk;  // the kernel-test helpers (tests/cpu_kernels_test_util.h)

/* ---------------------------------------------------------------- gemm */

/* Without OPENBLAS_CORETYPE, a CPU with AVX-512 gets GEMM kernels with at
 * least AVX2: OpenBLAS 0.3.21 fell back to its SSE3 "Prescott" set on CPU
 * models newer than it (Emerald Rapids), a third of the speed. */
TEST(CpuBlas, AnAvx512CpuGetsVectorGemmKernels) {
  const char *forced = getenv("OPENBLAS_CORETYPE");
  if (forced && *forced)
    GTEST_SKIP() << "OPENBLAS_CORETYPE=" << forced << " chooses the kernels";
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512cd") ||
      !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512dq") ||
      !__builtin_cpu_supports("avx512vl"))
    GTEST_SKIP() << "the CPU has no AVX-512";
  (void)dt_cpu_num_threads(); /* the backend's start-up, before its first GEMM */
  std::string kernels = dt_cpu_blas_kernels();
  bool vector = false;
  for (const char *set : {"SkylakeX", "Cooperlake", "SapphireRapids", "Haswell", "Zen"})
    vector |= kernels.rfind(set, 0) == 0;
  EXPECT_TRUE(vector) << "BLAS kernels: " << kernels;
  /* and the GEMMs still compute on the set chosen */
  std::vector<float> a(64 * 64), b(64 * 64), c(64 * 64, -1.0f);
  for (int i = 0; i < 64 * 64; i++) {
    a[i] = (float)(i % 7) - 3.0f;
    b[i] = (float)(i % 5) - 2.0f;
  }
  ASSERT_EQ(DT_OK, dt_kernel_gemm(cpu_exec(), 0, 0, 64, 64, 64, 1.0f, a.data(), 64, 0, b.data(), 64,
                                  0, 0.0f, c.data(), 64, 0, 1))
      << dt_last_error();
  for (int i = 0; i < 64; i += 9)
    for (int j = 0; j < 64; j += 7) {
      double ref = 0.0;
      for (int k = 0; k < 64; k++)
        ref += (double)a[i * 64 + k] * b[k * 64 + j];
      EXPECT_EQ(c[i * 64 + j], (float)ref) << i << "," << j;
    }
}

TEST(CpuGemm, AllTransposesAlphaBetaAndLeadingDims) {
  const int m = 5, n = 7, k = 4, pad = 3;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
      int lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
      Vec a = randn((size_t)a_rows * lda, 1), b = randn((size_t)b_rows * ldb, 2);
      Vec c = randn((size_t)m * ldc, 3);
      Vec c0 = c;
      float alpha = 1.5f, beta = -0.5f;
      ASSERT_EQ(DT_OK, dt_kernel_gemm(cpu_exec(), ta, tb, m, n, k, alpha, a.data(), lda, 0,
                                      b.data(), ldb, 0, beta, c.data(), ldc, 0, 1))
          << dt_last_error();
      for (int i = 0; i < m; i++)
        for (int j = 0; j < ldc; j++) {
          double want = c0[i * ldc + j];
          if (j < n) {
            double s = 0;
            for (int p = 0; p < k; p++) {
              double av = ta ? a[p * lda + i] : a[i * lda + p];
              double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
              s += av * bv;
            }
            want = alpha * s + beta * c0[i * ldc + j];
          }
          ASSERT_NEAR(c[i * ldc + j], want, 1e-5) << "ta=" << ta << " tb=" << tb;
        }
    }
}

TEST(CpuGemm, BetaZeroIgnoresNaNInOutput) {
  Vec a = {1, 2, 3, 4}, b = {1, 0, 0, 1}, c(4, NAN);
  ASSERT_EQ(DT_OK, dt_kernel_gemm(cpu_exec(), 0, 0, 2, 2, 2, 1.0f, a.data(), 2, 0, b.data(), 2, 0,
                                  0.0f, c.data(), 2, 0, 1));
  EXPECT_EQ(c, (Vec{1, 2, 3, 4}));
}

TEST_P(ThreadCounts, GemmBatched) {
  const int batch = 6, m = 3, n = 4, k = 5;
  Vec a = randn((size_t)batch * m * k, 4), b = randn((size_t)batch * k * n, 5);
  Vec c((size_t)batch * m * n, 0.0f);
  // B transposed storage (n,k) per batch
  ASSERT_EQ(DT_OK, dt_kernel_gemm(cpu_exec(), 0, 1, m, n, k, 2.0f, a.data(), k, m * k, b.data(), k,
                                  n * k, 0.0f, c.data(), n, m * n, batch));
  std::vector<double> want(c.size());
  for (int t = 0; t < batch; t++)
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) {
        double s = 0;
        for (int p = 0; p < k; p++)
          s += (double)a[t * m * k + i * k + p] * b[t * n * k + j * k + p];
        want[t * m * n + i * n + j] = 2.0 * s;
      }
  expect_close(c, want, 1e-5, 1e-5, "batched gemm");
}

// The 16-bit GEMM (f16/bf16 A and B, f32 C) is the f32 GEMM of the widened
// operands bit for bit: its panels (a large operand widened a block of
// columns or rows of C at a time) split C, never k. Shapes: both operands
// whole, B in panels (n large), A in panels (m large), a k too long for
// panels, and a batch; padded leading dimensions, alpha and beta.
namespace half_gemm {

struct Shape {
  int m, n, k, batch;
};

// C of the 16-bit GEMM against C of the f32 GEMM of the widened operands,
// bit for bit; empty when they agree, else what differs.
std::string compare(dt_dtype dtype, const Shape &s, int ta, int tb) {
  const int pad = 3, m = s.m, n = s.n, k = s.k;
  const int lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
  const int64_t sa = (int64_t)(ta ? k : m) * lda, sb = (int64_t)(tb ? n : k) * ldb;
  const int64_t sc = (int64_t)m * ldc;
  Vec a32 = randn((size_t)(sa * s.batch), 11), b32 = randn((size_t)(sb * s.batch), 12);
  std::vector<uint16_t> a16(a32.size()), b16(b32.size());
  if (dt_half_from_f32(dtype, a32.data(), a16.data(), (int64_t)a32.size()) != DT_OK ||
      dt_half_from_f32(dtype, b32.data(), b16.data(), (int64_t)b32.size()) != DT_OK ||
      dt_half_to_f32(dtype, a16.data(), a32.data(), (int64_t)a32.size()) != DT_OK ||
      dt_half_to_f32(dtype, b16.data(), b32.data(), (int64_t)b32.size()) != DT_OK)
    return dt_last_error();
  Vec want = randn((size_t)(sc * s.batch), 13), got = want;
  if (dt_kernel_gemm(cpu_exec(), ta, tb, m, n, k, 1.5f, a32.data(), lda, sa, b32.data(), ldb, sb,
                     -0.5f, want.data(), ldc, sc, s.batch) != DT_OK)
    return dt_last_error();
  dt_exec ex = *cpu_exec();
  ex.dtype = dtype;
  if (dt_kernel_gemm(&ex, ta, tb, m, n, k, 1.5f, (const float *)a16.data(), lda, sa,
                     (const float *)b16.data(), ldb, sb, -0.5f, got.data(), ldc, sc,
                     s.batch) != DT_OK)
    return dt_last_error();
  if (std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0)
    return "";
  return std::string(dt_dtype_name(dtype)) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
         " k=" + std::to_string(k) + " batch=" + std::to_string(s.batch) +
         " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) + ": C differs";
}

}  // namespace half_gemm

// The 16-bit GEMM (f16/bf16 A and B, f32 C) is the f32 GEMM of the widened
// operands bit for bit: its panels (a large operand widened a block of
// columns or rows of C at a time) split C, never k. Shapes: both operands
// whole, B in panels (n large), A in panels (m large), a k too long for
// panels, and a batch; padded leading dimensions, alpha and beta.
TEST_P(ThreadCounts, HalfGemmIsTheF32GemmOfTheWidenedOperandsBitForBit) {
  const half_gemm::Shape shapes[] = {
      {5, 7, 4, 1}, {40, 9000, 100, 1}, {9000, 30, 64, 1}, {9, 8, 70000, 1}, {3, 300, 200, 4}};
  for (dt_dtype dtype : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (const half_gemm::Shape &s : shapes)
      for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
          ASSERT_EQ("", half_gemm::compare(dtype, s, ta, tb));
}

// Threads running 16-bit GEMMs at once (the replicas of the data-parallel
// mode) each get their own widening scratch; dt_empty_cache frees it.
TEST(CpuGemm, HalfGemmOnConcurrentThreads) {
  std::string errs[3];
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; t++)
    threads.emplace_back([&errs, t] {
      for (int rep = 0; rep < 4 && errs[t].empty(); rep++)
        errs[t] = half_gemm::compare(t == 1 ? DT_DTYPE_F16 : DT_DTYPE_BF16, {40 + t, 9000, 100, 1},
                                     rep & 1, rep >> 1);
    });
  for (std::thread &th : threads)
    th.join();
  for (const std::string &e : errs)
    EXPECT_EQ("", e);
  EXPECT_EQ(DT_OK, dt_empty_cache(cpu_exec()->dev));
  EXPECT_EQ("", half_gemm::compare(DT_DTYPE_BF16, {40, 9000, 100, 1}, 0, 0));
}

TEST(CpuGemm, RejectsSmallLeadingDimension) {
  Vec a(16), b(16), c(16);
  EXPECT_EQ(DT_ERR_INVALID_ARG, dt_kernel_gemm(cpu_exec(), 0, 0, 4, 4, 4, 1.0f, a.data(), 3, 0,
                                               b.data(), 4, 0, 0.0f, c.data(), 4, 0, 1));
  EXPECT_NE(std::string(dt_last_error()).find("lda=3"), std::string::npos) << dt_last_error();
}

/* ------------------------------------------------ elementwise and reductions */

TEST_P(ThreadCounts, BinaryBroadcastAndStrides) {
  // a (4, 50, 300) viewed transposed from storage (300, 50, 4); b (50, 1) broadcast
  const int d0 = 4, d1 = 50, d2 = 300;
  Vec a = randn((size_t)d0 * d1 * d2, 6), b = randn(d1, 7);
  dt_binary_args args;
  memset(&args, 0, sizeof args);
  args.ndim = 3;
  args.shape[0] = d0, args.shape[1] = d1, args.shape[2] = d2;
  args.a_strides[0] = 1, args.a_strides[1] = d0, args.a_strides[2] = d0 * d1;
  args.b_strides[0] = 0, args.b_strides[1] = 1, args.b_strides[2] = 0;
  for (int op = 0; op < 3; op++) {
    args.op = (dt_binary_op)op;
    Vec out(a.size());
    ASSERT_EQ(DT_OK, dt_kernel_binary(cpu_exec(), &args, a.data(), b.data(), out.data()));
    for (int i = 0; i < d0; i++)
      for (int j = 0; j < d1; j++)
        for (int l = 0; l < d2; l++) {
          float u = a[i + j * d0 + l * d0 * d1], v = b[j];
          float want = op == 0 ? u + v : op == 1 ? u - v : u * v;
          ASSERT_EQ(out[(i * d1 + j) * d2 + l], want) << "op " << op;
        }
  }
  // contiguous fast path and scalar broadcast
  args.ndim = 1;
  args.shape[0] = 40000;
  args.a_strides[0] = 1;
  args.b_strides[0] = 0;
  args.op = DT_BINARY_MUL;
  Vec x = randn(40000, 8), s = {3.0f}, out(40000);
  ASSERT_EQ(DT_OK, dt_kernel_binary(cpu_exec(), &args, x.data(), s.data(), out.data()));
  for (int i = 0; i < 40000; i++)
    ASSERT_EQ(out[i], x[i] * 3.0f);
  // division, IEEE at zero (cross-entropy's mean over zero kept rows is 0/0)
  args.op = DT_BINARY_DIV;
  args.shape[0] = 4;
  args.a_strides[0] = 1;
  Vec num = {6.0f, -1.0f, 0.0f, 1.0f}, den = {2.0f}, zero = {0.0f}, q(4);
  ASSERT_EQ(DT_OK, dt_kernel_binary(cpu_exec(), &args, num.data(), den.data(), q.data()));
  EXPECT_EQ(q, (Vec{3.0f, -0.5f, 0.0f, 0.5f}));
  ASSERT_EQ(DT_OK, dt_kernel_binary(cpu_exec(), &args, num.data(), zero.data(), q.data()));
  EXPECT_TRUE(std::isinf(q[0]) && q[0] > 0 && std::isinf(q[1]) && q[1] < 0 && std::isnan(q[2]));
  args.op = (dt_binary_op)(DT_BINARY_DIV + 1);
  EXPECT_EQ(DT_ERR_INVALID_ARG,
            dt_kernel_binary(cpu_exec(), &args, num.data(), den.data(), q.data()));
}

TEST(CpuElementwise, AxpbyFillUnary) {
  Vec x = {1, -2, 3}, y = {10, 20, 30};
  ASSERT_EQ(DT_OK, dt_kernel_axpby(cpu_exec(), 3, 2.0f, x.data(), 0.5f, y.data()));
  EXPECT_EQ(y, (Vec{7, 6, 21}));
  Vec z = {NAN, NAN, NAN};
  ASSERT_EQ(DT_OK, dt_kernel_axpby(cpu_exec(), 3, -1.0f, x.data(), 0.0f, z.data()));
  EXPECT_EQ(z, (Vec{-1, 2, -3}));
  ASSERT_EQ(DT_OK, dt_kernel_fill(cpu_exec(), z.data(), 2.5f, 3));
  EXPECT_EQ(z, (Vec{2.5f, 2.5f, 2.5f}));

  Vec in = {-2.0f, -0.5f, 0.0f, 0.5f, 2.0f}, out(5), dy = {1, 2, 3, 4, 5}, dx(5);
  ASSERT_EQ(DT_OK, dt_kernel_unary_forward(cpu_exec(), DT_UNARY_RELU, 5, in.data(), out.data()));
  EXPECT_EQ(out, (Vec{0, 0, 0, 0.5f, 2.0f}));
  ASSERT_EQ(DT_OK, dt_kernel_unary_backward(cpu_exec(), DT_UNARY_RELU, 5, in.data(), dy.data(),
                                            dx.data()));
  EXPECT_EQ(dx, (Vec{0, 0, 0, 4, 5}));
  // GELU, tanh approximation: gelu(1) = 0.5 * (1 + tanh(sqrt(2/pi) * 1.044715))
  ASSERT_EQ(DT_OK, dt_kernel_unary_forward(cpu_exec(), DT_UNARY_GELU, 5, in.data(), out.data()));
  for (int i = 0; i < 5; i++) {
    double v = in[i];
    double want = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(out[i], want, 1e-6);
  }
  EXPECT_NEAR(out[4], 1.9545977, 1e-6);
  for (int op = 0; op < 3; op++) {  // backward vs central differences in double
    ASSERT_EQ(DT_OK, dt_kernel_unary_backward(cpu_exec(), (dt_unary_op)op, 5, in.data(), dy.data(),
                                              dx.data()));
    for (int i = 0; i < 5; i++) {
      if (op == DT_UNARY_RELU && in[i] == 0.0f)
        continue;
      auto f = [&](double v) {
        if (op == DT_UNARY_RELU)
          return v > 0 ? v : 0.0;
        if (op == DT_UNARY_TANH)
          return std::tanh(v);
        return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      };
      double h = 1e-5, fd = (f(in[i] + h) - f(in[i] - h)) / (2 * h);
      EXPECT_NEAR(dx[i], dy[i] * fd, 1e-4) << "op " << op << " x " << in[i];
    }
  }
}

TEST_P(ThreadCounts, ReduceSumBroadcastAxisSumSquares) {
  struct Case {
    int64_t outer, r, inner;
  };
  for (Case cs : {Case{3, 5, 7}, Case{1, 200000, 1}, Case{70000, 3, 1}, Case{2, 300, 600},
                  Case{1, 4, 1}, Case{5, 0, 2}}) {
    size_t nx = (size_t)(cs.outer * cs.r * cs.inner);
    Vec x = randn(nx, 9), y((size_t)(cs.outer * cs.inner), -1.0f);
    ASSERT_EQ(DT_OK,
              dt_kernel_reduce_sum(cpu_exec(), x.data(), y.data(), cs.outer, cs.r, cs.inner, 0.5f));
    std::vector<double> want(y.size(), 0.0);
    for (int64_t o = 0; o < cs.outer; o++)
      for (int64_t k = 0; k < cs.r; k++)
        for (int64_t i = 0; i < cs.inner; i++)
          want[o * cs.inner + i] += 0.5 * x[(o * cs.r + k) * cs.inner + i];
    expect_close(y, want, 1e-6, 1e-6, "reduce_sum");
    // a 16-bit x (a 16-bit linear's bias gradient) is widened as it is
    // read: the f32 result of its widened values, bit for bit
    for (dt_dtype t : {DT_DTYPE_BF16, DT_DTYPE_F16}) {
      std::vector<uint16_t> xh(nx);
      Vec xw(nx), yh(y.size(), -1.0f), yw(y.size(), -2.0f);
      ASSERT_EQ(DT_OK, dt_half_from_f32(t, x.data(), xh.data(), (int64_t)nx));
      ASSERT_EQ(DT_OK, dt_half_to_f32(t, xh.data(), xw.data(), (int64_t)nx));
      dt_exec hex = *cpu_exec();
      hex.dtype = t;
      ASSERT_EQ(DT_OK, dt_kernel_reduce_sum(&hex, (const float *)xh.data(), yh.data(), cs.outer,
                                            cs.r, cs.inner, 0.5f));
      ASSERT_EQ(DT_OK, dt_kernel_reduce_sum(cpu_exec(), xw.data(), yw.data(), cs.outer, cs.r,
                                            cs.inner, 0.5f));
      EXPECT_EQ(0, memcmp(yh.data(), yw.data(), y.size() * sizeof(float)))
          << "reduce_sum of " << dt_dtype_name(t) << " x, " << cs.outer << "x" << cs.r << "x"
          << cs.inner;
    }

    Vec back(nx);
    ASSERT_EQ(DT_OK, dt_kernel_broadcast_axis(cpu_exec(), y.data(), back.data(), cs.outer, cs.r,
                                              cs.inner, 2.0f));
    for (int64_t o = 0; o < cs.outer; o++)
      for (int64_t k = 0; k < cs.r; k++)
        for (int64_t i = 0; i < cs.inner; i++)
          ASSERT_EQ(back[(o * cs.r + k) * cs.inner + i], 2.0f * y[o * cs.inner + i]);
  }
  Vec x = randn(300001, 10);
  double ss = 0, want = 0;
  for (float v : x)
    want += (double)v * v;
  ASSERT_EQ(DT_OK, dt_kernel_sum_squares(cpu_exec(), x.data(), (int64_t)x.size(), &ss));
  EXPECT_NEAR(ss, want, 1e-9 * want);
}

TEST_P(ThreadCounts, CopyStridedTransposeAndBytes) {
  const int64_t R = 130, C = 270;
  Vec src = randn((size_t)(R * C), 11), dst((size_t)(R * C));
  int64_t shape[2] = {C, R}, s_strides[2] = {1, C}, d_strides[2] = {R, 1};
  ASSERT_EQ(DT_OK, dt_kernel_copy_strided(cpu_exec(), dst.data(), d_strides, src.data(), s_strides,
                                          shape, 2, sizeof(float)));
  for (int64_t i = 0; i < R; i++)
    for (int64_t j = 0; j < C; j++)
      ASSERT_EQ(dst[j * R + i], src[i * C + j]);
  // 1-byte elements, every other element of a (3, 8) into (3, 4)
  std::vector<uint8_t> b(24), out(12, 0);
  for (int i = 0; i < 24; i++)
    b[i] = (uint8_t)i;
  int64_t sh[2] = {3, 4}, ss[2] = {8, 2}, ds[2] = {4, 1};
  ASSERT_EQ(DT_OK, dt_kernel_copy_strided(cpu_exec(), out.data(), ds, b.data(), ss, sh, 2, 1));
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++)
      EXPECT_EQ(out[i * 4 + j], 8 * i + 2 * j);
}

/* ---------------------------------------------------------------- casts */

TEST(CpuCast, F32ToBf16RoundsToNearestEven) {
  Vec in = {1.0f,
            1.0f + 1.0f / 256,                 // halfway: ties to even -> 1.0
            1.0f + 3.0f / 256,                 // halfway: ties to even -> 1 + 4/256
            1.0f + 1.0f / 256 + 1.0f / 65536,  // above halfway -> 1 + 1/128
            -3.14159265f,
            1e30f,
            INFINITY,
            -INFINITY};
  std::vector<uint16_t> mid(in.size());
  Vec back(in.size());
  ASSERT_EQ(DT_OK, dt_kernel_cast(cpu_exec(), in.data(), DT_DTYPE_F32, mid.data(), DT_DTYPE_BF16,
                                  (int64_t)in.size()));
  ASSERT_EQ(DT_OK, dt_kernel_cast(cpu_exec(), mid.data(), DT_DTYPE_BF16, back.data(), DT_DTYPE_F32,
                                  (int64_t)in.size()));
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 1.0f);
  EXPECT_EQ(back[2], 1.0f + 4.0f / 256);
  EXPECT_EQ(back[3], 1.0f + 1.0f / 128);
  EXPECT_EQ(back[4], -3.140625f);
  EXPECT_NEAR(back[5], 1e30, 1e30 / 128);
  EXPECT_EQ(back[6], INFINITY);
  EXPECT_EQ(back[7], -INFINITY);
  Vec nan = {NAN};
  ASSERT_EQ(DT_OK,
            dt_kernel_cast(cpu_exec(), nan.data(), DT_DTYPE_F32, mid.data(), DT_DTYPE_BF16, 1));
  ASSERT_EQ(DT_OK,
            dt_kernel_cast(cpu_exec(), mid.data(), DT_DTYPE_BF16, back.data(), DT_DTYPE_F32, 1));
  EXPECT_TRUE(std::isnan(back[0]));
}

TEST(CpuCast, F16AndIntegerConversions) {
  Vec in = {1.0f / 3, 65504.0f, -2.5f, 1e-8f};
  std::vector<uint16_t> h(4);
  Vec back(4);
  ASSERT_EQ(DT_OK, dt_kernel_cast(cpu_exec(), in.data(), DT_DTYPE_F32, h.data(), DT_DTYPE_F16, 4));
  ASSERT_EQ(DT_OK,
            dt_kernel_cast(cpu_exec(), h.data(), DT_DTYPE_F16, back.data(), DT_DTYPE_F32, 4));
  EXPECT_EQ(back[0], 0.333251953125f);
  EXPECT_EQ(back[1], 65504.0f);
  EXPECT_EQ(back[2], -2.5f);
  EXPECT_EQ(back[3], 0.0f);  // below the smallest f16 subnormal (2^-24) / 2

  Vec f = {-1.7f, 2.9f, 300.0f, NAN};
  std::vector<int32_t> i32(4);
  ASSERT_EQ(DT_OK, dt_kernel_cast(cpu_exec(), f.data(), DT_DTYPE_F32, i32.data(), DT_DTYPE_I32, 4));
  EXPECT_EQ(i32, (std::vector<int32_t>{-1, 2, 300, 0}));
  std::vector<uint8_t> u8(4);
  ASSERT_EQ(DT_OK, dt_kernel_cast(cpu_exec(), i32.data(), DT_DTYPE_I32, u8.data(), DT_DTYPE_U8, 4));
  EXPECT_EQ(u8, (std::vector<uint8_t>{255, 2, 44, 0}));  // wraps modulo 256
  std::vector<int64_t> i64 = {(int64_t)1 << 40, -7, 16777217, 3};
  ASSERT_EQ(DT_OK,
            dt_kernel_cast(cpu_exec(), i64.data(), DT_DTYPE_I64, i32.data(), DT_DTYPE_I32, 4));
  EXPECT_EQ(i32[1], -7);
  EXPECT_EQ(i32[3], 3);
  Vec fo(4);
  ASSERT_EQ(DT_OK,
            dt_kernel_cast(cpu_exec(), i64.data(), DT_DTYPE_I64, fo.data(), DT_DTYPE_F32, 4));
  EXPECT_EQ(fo[0], 1099511627776.0f);
  EXPECT_EQ(fo[2], 16777216.0f);  // nearest f32
  std::vector<uint16_t> bf(4);
  ASSERT_EQ(DT_OK, dt_kernel_cast(cpu_exec(), u8.data(), DT_DTYPE_U8, bf.data(), DT_DTYPE_BF16, 4));
  ASSERT_EQ(DT_OK,
            dt_kernel_cast(cpu_exec(), bf.data(), DT_DTYPE_BF16, i64.data(), DT_DTYPE_I64, 4));
  EXPECT_EQ(i64, (std::vector<int64_t>{255, 2, 44, 0}));
  // large f32 -> f16 in parallel blocks equals the scalar conversion
  Vec big = randn(70001, 12, -100.0f, 100.0f);
  std::vector<uint16_t> hb(big.size());
  ASSERT_EQ(DT_OK, dt_kernel_cast(cpu_exec(), big.data(), DT_DTYPE_F32, hb.data(), DT_DTYPE_F16,
                                  (int64_t)big.size()));
  for (size_t i = 0; i < big.size(); i += 997)
    ASSERT_EQ(hb[i], dt_f32_to_f16(big[i]));
}

/* ----------------------------------------------------- softmax and losses */

TEST(CpuSoftmax, ForwardBackwardVsNaive) {
  const int rows = 3, cols = 5;
  Vec x = randn(rows * cols, 13, -3.0f, 3.0f), dy = randn(rows * cols, 14);
  x[7] = 80.0f;  // large logit: must not overflow
  for (int log = 0; log < 2; log++) {
    Vec y(x.size()), dx(x.size());
    ASSERT_EQ(DT_OK, dt_kernel_softmax_forward(cpu_exec(), x.data(), y.data(), rows, cols, log));
    ASSERT_EQ(DT_OK, dt_kernel_softmax_backward(cpu_exec(), y.data(), dy.data(), dx.data(), rows,
                                                cols, log));
    std::vector<double> wy(x.size()), wdx(x.size());
    for (int r = 0; r < rows; r++) {
      double mx = -1e300, s = 0;
      for (int j = 0; j < cols; j++)
        mx = std::max(mx, (double)x[r * cols + j]);
      for (int j = 0; j < cols; j++)
        s += std::exp(x[r * cols + j] - mx);
      std::vector<double> p(cols);
      double dot = 0, sdy = 0;
      for (int j = 0; j < cols; j++) {
        p[j] = std::exp(x[r * cols + j] - mx) / s;
        wy[r * cols + j] = log ? std::log(p[j]) : p[j];
        dot += dy[r * cols + j] * p[j];
        sdy += dy[r * cols + j];
      }
      for (int j = 0; j < cols; j++)
        wdx[r * cols + j] = log ? dy[r * cols + j] - p[j] * sdy : p[j] * (dy[r * cols + j] - dot);
    }
    expect_close(y, wy, 1e-5, 1e-5, log ? "log_softmax" : "softmax");
    expect_close(dx, wdx, 1e-5, 1e-4, log ? "log_softmax backward" : "softmax backward");
  }
}

TEST(CpuCrossEntropy, HandValuesIgnoreIndexAndGradient) {
  // rows: [1,2,3] target 2; [0,0,0] target 0; [5,1,1] ignored (-100)
  Vec logits = {1, 2, 3, 0, 0, 0, 5, 1, 1};
  std::vector<int64_t> t64 = {2, 0, -100};
  std::vector<int32_t> t32 = {2, 0, -100};
  for (int use64 = 0; use64 < 2; use64++) {
    const void *t = use64 ? (const void *)t64.data() : (const void *)t32.data();
    dt_dtype td = use64 ? DT_DTYPE_I64 : DT_DTYPE_I32;
    Vec loss(3), lse(3);
    float count = -1;
    ASSERT_EQ(DT_OK, dt_kernel_cross_entropy_forward(cpu_exec(), logits.data(), t, td, 3, 3, -100,
                                                     loss.data(), lse.data(), &count))
        << dt_last_error();
    EXPECT_EQ(count, 2.0f);
    EXPECT_NEAR(loss[0], 0.40760596, 1e-6);  // log(e + e^2 + e^3) - 3
    EXPECT_NEAR(loss[1], 1.09861229, 1e-6);  // log 3
    EXPECT_EQ(loss[2], 0.0f);
    EXPECT_NEAR(lse[0], 3.40760596, 1e-6);

    Vec dloss = {0.5f, 0.5f, 0.5f}, dl(9, 123.0f);
    ASSERT_EQ(DT_OK, dt_kernel_cross_entropy_backward(cpu_exec(), logits.data(), t, td, lse.data(),
                                                      dloss.data(), dl.data(), 3, 3, -100));
    // softmax([1,2,3]) = [0.09003057, 0.24472847, 0.66524096]
    EXPECT_NEAR(dl[0], 0.5 * 0.09003057, 1e-6);
    EXPECT_NEAR(dl[1], 0.5 * 0.24472847, 1e-6);
    EXPECT_NEAR(dl[2], 0.5 * (0.66524096 - 1), 1e-6);
    EXPECT_NEAR(dl[3], 0.5 * (1.0 / 3 - 1), 1e-6);
    EXPECT_NEAR(dl[4], 0.5 / 3, 1e-6);
    EXPECT_EQ(dl[6], 0.0f);
    EXPECT_EQ(dl[7], 0.0f);
    EXPECT_EQ(dl[8], 0.0f);
  }
}

TEST(CpuCrossEntropy, OutOfRangeTargetIsInvalidArg) {
  Vec logits(6, 0.0f), loss(2), lse(2);
  std::vector<int64_t> t = {1, 3};
  float count = 0;
  EXPECT_EQ(DT_ERR_INVALID_ARG,
            dt_kernel_cross_entropy_forward(cpu_exec(), logits.data(), t.data(), DT_DTYPE_I64, 2, 3,
                                            -100, loss.data(), lse.data(), &count));
  std::string msg = dt_last_error();
  EXPECT_NE(msg.find("target 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[0, 3)"), std::string::npos) << msg;
  t[1] = -1;
  Vec dloss(2, 1.0f), dl(6);
  EXPECT_EQ(DT_ERR_INVALID_ARG,
            dt_kernel_cross_entropy_backward(cpu_exec(), logits.data(), t.data(), DT_DTYPE_I64,
                                             lse.data(), dloss.data(), dl.data(), 2, 3, -100));
  EXPECT_NE(std::string(dt_last_error()).find("target -1"), std::string::npos);
  std::vector<float> bad_dtype(2);
  EXPECT_EQ(DT_ERR_DTYPE, dt_kernel_cross_entropy_forward(cpu_exec(), logits.data(),
                                                          bad_dtype.data(), DT_DTYPE_F32, 2, 3,
                                                          -100, loss.data(), lse.data(), &count));
}

/* ----------------------------------------------------- embedding, dropout */

TEST(CpuEmbedding, ForwardBackwardAccumulatesAndChecksRange) {
  const int v = 4, d = 3;
  Vec table = randn(v * d, 15);
  std::vector<int32_t> idx = {2, 0, 2};
  Vec y(3 * d);
  ASSERT_EQ(DT_OK, dt_kernel_embedding_forward(cpu_exec(), idx.data(), DT_DTYPE_I32, table.data(),
                                               y.data(), 3, v, d));
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < d; j++)
      EXPECT_EQ(y[i * d + j], table[idx[i] * d + j]);
  Vec dy = {1, 2, 3, 4, 5, 6, 7, 8, 9}, dt(v * d, 1.0f);
  ASSERT_EQ(DT_OK, dt_kernel_embedding_backward(cpu_exec(), idx.data(), DT_DTYPE_I32, dy.data(),
                                                dt.data(), 3, v, d));
  EXPECT_EQ(dt, (Vec{5, 6, 7, 1, 1, 1, 9, 11, 13, 1, 1, 1}));
  std::vector<int64_t> bad = {0, 4};
  EXPECT_EQ(DT_ERR_INVALID_ARG, dt_kernel_embedding_forward(cpu_exec(), bad.data(), DT_DTYPE_I64,
                                                            table.data(), y.data(), 2, v, d));
  std::string msg = dt_last_error();
  EXPECT_NE(msg.find("index 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[0, 4)"), std::string::npos) << msg;
}

TEST_P(ThreadCounts, DropoutMaskDeterministicAndScaled) {
  const int64_t n = 100000;
  const float p = 0.3f;
  Vec x = randn(n, 16), y1(n), y2(n), dx(n);
  std::vector<uint8_t> m1(n), m2(n), m3(n);
  ASSERT_EQ(DT_OK,
            dt_kernel_dropout_forward(cpu_exec(), x.data(), y1.data(), m1.data(), n, p, 42, 1000));
  ASSERT_EQ(DT_OK,
            dt_kernel_dropout_forward(cpu_exec(), x.data(), y2.data(), m2.data(), n, p, 42, 1000));
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(y1, y2);
  // offset shifts the stream: mask at offset 1000+10 starts where this one's element 10 is
  ASSERT_EQ(DT_OK,
            dt_kernel_dropout_forward(cpu_exec(), x.data(), y2.data(), m3.data(), n, p, 42, 1010));
  EXPECT_TRUE(std::equal(m3.begin(), m3.end() - 10, m1.begin() + 10));
  ASSERT_EQ(DT_OK,
            dt_kernel_dropout_forward(cpu_exec(), x.data(), y2.data(), m3.data(), n, p, 43, 1000));
  EXPECT_NE(m1, m3);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; i++) {
    kept += m1[i];
    ASSERT_EQ(m1[i], dt_rng_uniform(42, 1000 + (uint64_t)i) >= p ? 1 : 0);
    ASSERT_FLOAT_EQ(y1[i], m1[i] ? x[i] / (1 - p) : 0.0f);
  }
  EXPECT_NEAR((double)kept / n, 1 - p, 0.01);
  ASSERT_EQ(DT_OK, dt_kernel_dropout_backward(cpu_exec(), x.data(), m1.data(), dx.data(), n, p));
  EXPECT_EQ(dx, y1);
  EXPECT_EQ(DT_ERR_INVALID_ARG,
            dt_kernel_dropout_forward(cpu_exec(), x.data(), y1.data(), m1.data(), n, 1.5f, 1, 0));
}

/* ------------------------------------------------------------- optimizers */

TEST(CpuOptim, SgdMomentumWeightDecayByHand) {
  // p=1, g=0.5 each step, lr 0.1, momentum 0.9 (hand-computed)
  struct Case {
    const char *what;
    float dampening, weight_decay;
    int nesterov;
    std::vector<float> want;
  };
  const Case cases[] = {
      {"step", 0.0f, 0.1f, 0, {0.94f, 0.8266f, 0.666274f}},  // wd 0.1
      {"nesterov step", 0.0f, 0.1f, 1, {0.886f, 0.725566f}},
      // dampening 0.5 (ignored on the first step), no weight decay
      {"dampening step", 0.5f, 0.0f, 0, {0.95f, 0.88f, 0.792f}},
  };
  float p = 1.0f, g = 0.5f, buf = 0.0f;
  for (const Case &c : cases) {
    p = 1.0f;
    for (size_t s = 0; s < c.want.size(); s++) {
      ASSERT_EQ(DT_OK, dt_kernel_sgd_update(cpu_exec(), &p, &g, &buf, 1, 0.1f, 0.9f, c.dampening,
                                            c.weight_decay, c.nesterov, s == 0, nullptr));
      EXPECT_NEAR(p, c.want[s], 1e-6) << c.what << " " << s + 1;
    }
  }
  // plain SGD with weight decay, no buffer: p -= lr * (g + wd p) = 1 - 0.1*0.6
  p = 1.0f;
  ASSERT_EQ(DT_OK, dt_kernel_sgd_update(cpu_exec(), &p, &g, nullptr, 1, 0.1f, 0.0f, 0.0f, 0.1f, 0,
                                        1, nullptr));
  EXPECT_NEAR(p, 0.94f, 1e-7);
  EXPECT_EQ(DT_ERR_INVALID_ARG, dt_kernel_sgd_update(cpu_exec(), &p, &g, &buf, 1, 0.1f, 0.9f, 0.5f,
                                                     0.0f, 1, 1, nullptr));
}

TEST(CpuOptim, AdamWByHandAndVsFormula) {
  // p=1, g=0.5 constant, lr 0.1, betas (0.9, 0.999), eps 1e-8, wd 0.01: with a constant
  // gradient m_hat / sqrt(v_hat) = 1, so p = p*(1 - 0.001) - 0.1 each step.
  float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
  const double want[3] = {0.899, 0.798101, 0.697302899};
  for (int s = 1; s <= 3; s++) {
    ASSERT_EQ(DT_OK, dt_kernel_adamw_update(cpu_exec(), &p, &g, &m, &v, 1, 0.1f, 0.9f, 0.999f,
                                            1e-8f, 0.01f, s, nullptr));
    EXPECT_NEAR(p, want[s - 1], 2e-6) << "step " << s;
  }
  const double b1f = 0.9f, b2f = 0.999f;  // the betas as the kernel sees them
  EXPECT_NEAR(m, 0.5 * (1 - b1f * b1f * b1f), 1e-7);
  EXPECT_NEAR(v, 0.25 * (1 - b2f * b2f * b2f), 1e-9);

  // varying gradients over 40000 elements vs the formula in double
  const int64_t n = 40000;
  Vec P = randn(n, 17), G(n), M(n, 0.0f), V(n, 0.0f);
  std::vector<double> pd(P.begin(), P.end()), md(n, 0.0), vd(n, 0.0);
  const double lr = 1e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  for (int s = 1; s <= 3; s++) {
    G = randn(n, 100 + s);
    ASSERT_EQ(DT_OK, dt_kernel_adamw_update(cpu_exec(), P.data(), G.data(), M.data(), V.data(), n,
                                            (float)lr, (float)b1, (float)b2, (float)eps, (float)wd,
                                            s, nullptr));
    for (int64_t i = 0; i < n; i++) {
      pd[i] -= lr * wd * pd[i];
      md[i] = b1 * md[i] + (1 - b1) * G[i];
      vd[i] = b2 * vd[i] + (1 - b2) * (double)G[i] * G[i];
      pd[i] -=
          lr * (md[i] / (1 - std::pow(b1, s))) / (std::sqrt(vd[i] / (1 - std::pow(b2, s))) + eps);
    }
  }
  expect_close(P, pd, 1e-6, 1e-5, "adamw");
  EXPECT_EQ(DT_ERR_INVALID_ARG,
            dt_kernel_adamw_update(cpu_exec(), P.data(), G.data(), M.data(), V.data(), n, 0.1f,
                                   0.9f, 0.99f, 1e-8f, 0.0f, 0, nullptr));
}

/* ---------------------------------------------------------------- memory */

TEST(CpuMemory, CapGivesOomWithMessageAndStatsRecover) {
  dt_device dev = {DT_DEVICE_CPU, 7};  // a device no other test uses
  dt_memory_stats before, st;
  ASSERT_EQ(DT_OK, dt_memory_stats_get(dev, &before)) << dt_last_error();
  dt_cpu_set_memory_limit(before.allocated + (1 << 20));

  void *a = nullptr, *b = nullptr;
  ASSERT_EQ(DT_OK, be()->alloc(dev, 600000, &a)) << dt_last_error();
  EXPECT_EQ((uintptr_t)a % 64, 0u);
  memset(a, 1, 600000);
  ASSERT_EQ(DT_OK, be()->memory_stats(dev, &st));
  EXPECT_EQ(st.allocated, before.allocated + 600000);
  EXPECT_EQ(st.num_allocs, before.num_allocs + 1);
  EXPECT_GE(st.peak_allocated, st.allocated);

  EXPECT_EQ(DT_ERR_OOM, be()->alloc(dev, 600001, &b));
  EXPECT_EQ(b, nullptr);
  std::string msg = dt_last_error();
  EXPECT_NE(msg.find("600001"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cpu:7"), std::string::npos) << msg;
  EXPECT_NE(msg.find("DT_CPU_MEMORY_LIMIT"), std::string::npos) << msg;
  EXPECT_NE(msg.find("batch size"), std::string::npos) << msg;
  ASSERT_EQ(DT_OK, dt_memory_stats_get(dev, &st));
  EXPECT_EQ(st.num_ooms, before.num_ooms + 1);
  EXPECT_EQ(st.limit, before.allocated + (1 << 20));

  be()->free(dev, a, 600000);
  ASSERT_EQ(DT_OK, dt_memory_stats_get(dev, &st));
  EXPECT_EQ(st.allocated, before.allocated);
  EXPECT_GE(st.peak_allocated, before.allocated + 600000);
  ASSERT_EQ(DT_OK, dt_memory_reset_peak(dev));
  ASSERT_EQ(DT_OK, dt_memory_stats_get(dev, &st));
  EXPECT_EQ(st.peak_allocated, before.allocated);
  EXPECT_EQ(DT_OK, dt_empty_cache(dev));

  dt_cpu_set_memory_limit(0);
  ASSERT_EQ(DT_OK, be()->alloc(dev, 2 << 20, &b));
  be()->free(dev, b, 2 << 20);
  ASSERT_EQ(DT_OK, dt_memory_stats_get(dev, &st));
  EXPECT_EQ(st.allocated, before.allocated);
  // indices past the logical CPU devices are refused
  EXPECT_EQ(DT_ERR_INVALID_ARG, be()->alloc({DT_DEVICE_CPU, 1000}, 16, &b));
}

TEST(CpuMemory, FreedBlocksAreCachedReusedAndReleased) {
  dt_device dev = {DT_DEVICE_CPU, 6};  // a device no other test uses
  ASSERT_EQ(DT_OK, dt_empty_cache(dev));
  dt_memory_stats s0, st;
  ASSERT_EQ(DT_OK, dt_memory_stats_get(dev, &s0));
  EXPECT_EQ(s0.reserved, s0.allocated);

  void *a = nullptr, *b = nullptr;
  ASSERT_EQ(DT_OK, be()->alloc(dev, 100000, &a)) << dt_last_error();
  EXPECT_EQ((uintptr_t)a % 64, 0u);
  ASSERT_EQ(DT_OK, dt_memory_stats_get(dev, &st));
  EXPECT_EQ(st.allocated, s0.allocated + 100000);
  EXPECT_GE(st.reserved, s0.reserved + 100000);  // rounded up to its size class
  size_t block = st.reserved - s0.reserved;
  EXPECT_LE(block, 100000u + 100000u / 8 + 64);

  be()->free(dev, a, 100000);  // kept: allocated drops, reserved does not
  ASSERT_EQ(DT_OK, dt_memory_stats_get(dev, &st));
  EXPECT_EQ(st.allocated, s0.allocated);
  if (st.reserved == s0.reserved)
    GTEST_SKIP() << "the allocator cache is off (AddressSanitizer or DT_CPU_ALLOC_CACHE=0)";
  EXPECT_EQ(st.reserved, s0.reserved + block);

  ASSERT_EQ(DT_OK, be()->alloc(dev, 99000, &b));  // same class: the same block again
  EXPECT_EQ(b, a);
  ASSERT_EQ(DT_OK, dt_memory_stats_get(dev, &st));
  EXPECT_EQ(st.allocated, s0.allocated + 99000);
  EXPECT_EQ(st.reserved, s0.reserved + block);
  EXPECT_EQ(st.num_allocs, s0.num_allocs + 2);  // a cache hit is still an allocation
  be()->free(dev, b, 99000);
  ASSERT_EQ(DT_OK, dt_empty_cache(dev));
  ASSERT_EQ(DT_OK, dt_memory_stats_get(dev, &st));
  EXPECT_EQ(st.reserved, s0.reserved);

  // Under a cap, cached blocks are handed back before they would push the
  // process over it; the cap itself still applies to live bytes only.
  dt_cpu_set_memory_limit(s0.allocated + 300000);
  ASSERT_EQ(DT_OK, be()->alloc(dev, 200000, &a));
  be()->free(dev, a, 200000);
  ASSERT_EQ(DT_OK, be()->alloc(dev, 250000, &b)) << dt_last_error();
  ASSERT_EQ(DT_OK, dt_memory_stats_get(dev, &st));
  EXPECT_LE(st.reserved, st.limit);
  EXPECT_EQ(DT_ERR_OOM, be()->alloc(dev, 60000, &a));
  be()->free(dev, b, 250000);
  dt_cpu_set_memory_limit(0);
  ASSERT_EQ(DT_OK, dt_empty_cache(dev));
  ASSERT_EQ(DT_OK, dt_memory_stats_get(dev, &st));
  EXPECT_EQ(st.allocated, s0.allocated);
  EXPECT_EQ(st.reserved, s0.reserved);
}

TEST(CpuMemory, ParseAndFormatBytes) {
  size_t v = 0;
  ASSERT_EQ(DT_OK, dt_parse_bytes("123", &v));
  EXPECT_EQ(v, 123u);
  ASSERT_EQ(DT_OK, dt_parse_bytes("64K", &v));
  EXPECT_EQ(v, 65536u);
  ASSERT_EQ(DT_OK, dt_parse_bytes("512M", &v));
  EXPECT_EQ(v, 512u << 20);
  ASSERT_EQ(DT_OK, dt_parse_bytes("2G", &v));
  EXPECT_EQ(v, (size_t)2 << 30);
  ASSERT_EQ(DT_OK, dt_parse_bytes("1GiB", &v));
  EXPECT_EQ(v, (size_t)1 << 30);
  for (const char *bad : {"", "abc", "12Q", "-5", "1.5G", "G", "99999999999999999999"})
    EXPECT_EQ(DT_ERR_INVALID_ARG, dt_parse_bytes(bad, &v)) << bad;
  char buf[32];
  EXPECT_STREQ(dt_format_bytes(512, buf, sizeof buf), "512 B");
  EXPECT_STREQ(dt_format_bytes(1536u << 20, buf, sizeof buf), "1.50 GiB");
}

TEST(CpuBackend, ThreadsStreamsAndCopy) {
  int saved = dt_cpu_num_threads();
  EXPECT_GE(saved, 1);
  dt_cpu_set_num_threads(3);
  EXPECT_EQ(dt_cpu_num_threads(), 3);
  dt_cpu_set_num_threads(saved);
  EXPECT_GE(be()->device_count(), 8);
  dt_stream *s = be()->stream(DT_CPU, DT_STREAM_COMPUTE);
  EXPECT_NE(s, nullptr);
  dt_event *ev = nullptr;
  ASSERT_EQ(DT_OK, be()->event_create(DT_CPU, &ev));
  EXPECT_EQ(DT_OK, be()->event_record(ev, s));
  EXPECT_EQ(DT_OK, be()->stream_wait_event(be()->stream(DT_CPU, DT_STREAM_COMM), ev));
  EXPECT_EQ(DT_OK, be()->event_synchronize(ev));
  be()->event_destroy(ev);
  Vec a = randn(1 << 20, 18), b(1 << 20);
  ASSERT_EQ(DT_OK, be()->copy(b.data(), DT_CPU, a.data(), DT_CPU, a.size() * 4, s));
  EXPECT_EQ(a, b);
  ASSERT_EQ(DT_OK, be()->memset_zero(DT_CPU, b.data(), 8));
  EXPECT_EQ(b[0], 0.0f);
  EXPECT_EQ(b[2], a[2]);
}

INSTANTIATE_TEST_SUITE_P(Threads, ThreadCounts, ::testing::Values(1, 2, 3));

}  // namespace
