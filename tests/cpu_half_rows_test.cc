// The CPU row kernels of 16-bit inputs (softmax, log-softmax, the causal
// softmax, layer norm forward, the fused residual layer norm, layer norm
// backward) widen blocks of rows into scratch (dt_cpu_rows,
// core/cpu_half.c), the pooling kernels a plane at a time and
// dropout a block at a time,
// instead of a widened copy of the whole tensor; they give bit for bit
// what the f32 kernel gives on that copy (its 16-bit results rounded once),
// for bf16 and f16, under 1, 2 and 3 threads. Shapes: many rows per block
// with a partial last block, rows longer than a block (one row each), more
// than one column block of the backward's parameter gradients, and enough
// elements for the threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/half.h"
#include "tests/cpu_kernels_test_util.h"

namespace {

using namespace dtk;  // the kernel-test helpers (tests/cpu_kernels_test_util.h)

// Values in [lo, hi) rounded to a 16-bit dtype: their codes, and the same
// values widened to f32 (what the op passed its f32 kernels before).
struct Half {
  std::vector<uint16_t> bits;
  Vec wide;
  const float *data() const { return reinterpret_cast<const float *>(bits.data()); }
};

Half MakeHalf(dt_dtype dtype, size_t n, uint64_t seed, float lo, float hi) {
  Vec v = randn(n, seed, lo, hi);
  Half h{std::vector<uint16_t>(n), Vec(n)};
  EXPECT_EQ(DT_OK, dt_half_from_f32(dtype, v.data(), h.bits.data(), (int64_t)n));
  EXPECT_EQ(DT_OK, dt_half_to_f32(dtype, h.bits.data(), h.wide.data(), (int64_t)n));
  return h;
}

// The CPU's execution context for kernels of ex->dtype `dtype`.
const dt_exec *ExecOf(dt_dtype dtype) {
  static dt_exec ex[DT_DTYPE_COUNT];
  if (!ex[dtype].be) {
    EXPECT_EQ(DT_OK, dt_exec_init(DT_CPU, dtype, &ex[dtype])) << dt_last_error();
  }
  return &ex[dtype];
}

::testing::AssertionResult SameBits(const Vec &got, const Vec &want, const std::string &what) {
  if (got.size() == want.size() &&
      std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0)
    return ::testing::AssertionSuccess();
  for (size_t i = 0; i < got.size() && i < want.size(); i++)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure()
             << what << ": element " << i << " is " << got[i] << ", the f32 kernel's " << want[i];
  return ::testing::AssertionFailure() << what << ": sizes differ";
}

struct Shape {
  int64_t rows, cols;
};
const Shape kShapes[] = {{3, 5}, {37, 300}, {300, 260}, {5, 5000}, {40, 64}};

std::string Case(dt_dtype dtype, const Shape &s, const char *what) {
  return std::string(dt_dtype_name(dtype)) + " " + std::to_string(s.rows) + "x" +
         std::to_string(s.cols) + " " + what;
}

TEST_P(ThreadCounts, HalfSoftmaxesAreTheF32KernelsOfTheWidenedInputBitForBit) {
  for (dt_dtype d : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (const Shape &s : kShapes) {
      const int64_t n = s.rows * s.cols;
      Half x = MakeHalf(d, (size_t)n, 41, -6.0f, 6.0f);
      for (int log = 0; log < 2; log++) {
        Vec want((size_t)n), got((size_t)n, -1.0f);
        ASSERT_EQ(DT_OK, dt_kernel_softmax_forward(cpu_exec(), x.wide.data(), want.data(), s.rows,
                                                   s.cols, log));
        ASSERT_EQ(DT_OK,
                  dt_kernel_softmax_forward(ExecOf(d), x.data(), got.data(), s.rows, s.cols, log))
            << dt_last_error();
        EXPECT_TRUE(SameBits(got, want, Case(d, s, log ? "log_softmax" : "softmax")));
      }
      Vec want((size_t)n), got((size_t)n, -1.0f);
      ASSERT_EQ(DT_OK, dt_kernel_causal_softmax_forward(cpu_exec(), x.wide.data(), want.data(),
                                                        s.rows, s.cols));
      ASSERT_EQ(DT_OK,
                dt_kernel_causal_softmax_forward(ExecOf(d), x.data(), got.data(), s.rows, s.cols))
          << dt_last_error();
      EXPECT_TRUE(SameBits(got, want, Case(d, s, "causal softmax")));
    }
}

// What a layer norm forward writes.
struct LnOut {
  Vec sum, y, mean, rstd;
  explicit LnOut(const Shape &s)
      : sum((size_t)(s.rows * s.cols), -1.0f),
        y((size_t)(s.rows * s.cols), -1.0f),
        mean((size_t)s.rows, -1.0f),
        rstd((size_t)s.rows, -1.0f) {}
};

void ExpectSameLn(const LnOut &got, const LnOut &want, const std::string &what) {
  EXPECT_TRUE(SameBits(got.sum, want.sum, what + " sum"));
  EXPECT_TRUE(SameBits(got.y, want.y, what + " y"));
  EXPECT_TRUE(SameBits(got.mean, want.mean, what + " mean"));
  EXPECT_TRUE(SameBits(got.rstd, want.rstd, what + " rstd"));
}

TEST_P(ThreadCounts, HalfLayerNormsAreTheF32KernelsOfTheWidenedInputsBitForBit) {
  const float eps = 1e-5f;
  for (dt_dtype d : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (const Shape &s : kShapes) {
      const int64_t n = s.rows * s.cols, r = s.rows, c = s.cols;
      Half x = MakeHalf(d, (size_t)n, 42, -3.0f, 3.0f), res = MakeHalf(d, (size_t)n, 43, -1, 1);
      Vec x32 = randn((size_t)n, 44, -3, 3), res32 = randn((size_t)n, 45);
      Vec gamma = randn((size_t)c, 46, 0.5f, 1.5f), beta = randn((size_t)c, 47);
      // forward, affine and plain
      for (int affine = 0; affine < 2; affine++) {
        const float *g = affine ? gamma.data() : nullptr, *b = affine ? beta.data() : nullptr;
        LnOut want(s), got(s);
        ASSERT_EQ(DT_OK, dt_kernel_layer_norm_forward(cpu_exec(), x.wide.data(), g, b,
                                                      want.y.data(), DT_DTYPE_F32, want.mean.data(),
                                                      want.rstd.data(), r, c, eps));
        ASSERT_EQ(DT_OK, dt_kernel_layer_norm_forward(ExecOf(d), x.data(), g, b, got.y.data(),
                                                      DT_DTYPE_F32, got.mean.data(),
                                                      got.rstd.data(), r, c, eps))
            << dt_last_error();
        ExpectSameLn(got, want, Case(d, s, affine ? "layer norm" : "plain layer norm"));
      }
      // the fused residual: 16-bit x, 16-bit residual (GPT-2's), both
      struct Fused {
        const char *what;
        dt_dtype xd, rd;
        const float *x, *res, *x_wide, *res_wide;
      };
      const Fused fused[] = {
          {"16-bit x + f32 residual", d, DT_DTYPE_F32, x.data(), res32.data(), x.wide.data(),
           res32.data()},
          {"f32 x + 16-bit residual", DT_DTYPE_F32, d, x32.data(), res.data(), x32.data(),
           res.wide.data()},
          {"16-bit x + 16-bit residual", d, d, x.data(), res.data(), x.wide.data(),
           res.wide.data()},
      };
      for (const Fused &f : fused) {
        LnOut want(s), got(s);
        ASSERT_EQ(DT_OK, dt_kernel_residual_layer_norm_forward(
                             cpu_exec(), f.x_wide, f.res_wide, DT_DTYPE_F32, gamma.data(),
                             beta.data(), want.sum.data(), want.y.data(), DT_DTYPE_F32,
                             want.mean.data(), want.rstd.data(), r, c, eps));
        ASSERT_EQ(DT_OK,
                  dt_kernel_residual_layer_norm_forward(
                      ExecOf(f.xd), f.x, f.res, f.rd, gamma.data(), beta.data(), got.sum.data(),
                      got.y.data(), DT_DTYPE_F32, got.mean.data(), got.rstd.data(), r, c, eps))
            << dt_last_error();
        ExpectSameLn(got, want, Case(d, s, f.what));
      }
      // backward from the forward's statistics; dgamma and dbeta accumulate
      LnOut fwd(s);
      ASSERT_EQ(DT_OK, dt_kernel_layer_norm_forward(cpu_exec(), x.wide.data(), gamma.data(),
                                                    beta.data(), fwd.y.data(), DT_DTYPE_F32,
                                                    fwd.mean.data(), fwd.rstd.data(), r, c, eps));
      Vec dy = randn((size_t)n, 48);
      Vec dx_want((size_t)n), dg_want((size_t)c, 1.0f), db_want((size_t)c, 2.0f);
      Vec dx_got((size_t)n, -1.0f), dg_got = dg_want, db_got = db_want;
      ASSERT_EQ(DT_OK, dt_kernel_layer_norm_backward(cpu_exec(), x.wide.data(), gamma.data(),
                                                     fwd.mean.data(), fwd.rstd.data(), dy.data(),
                                                     DT_DTYPE_F32, dx_want.data(), dg_want.data(),
                                                     db_want.data(), r, c));
      ASSERT_EQ(DT_OK,
                dt_kernel_layer_norm_backward(ExecOf(d), x.data(), gamma.data(), fwd.mean.data(),
                                              fwd.rstd.data(), dy.data(), DT_DTYPE_F32,
                                              dx_got.data(), dg_got.data(), db_got.data(), r, c))
          << dt_last_error();
      EXPECT_TRUE(SameBits(dx_got, dx_want, Case(d, s, "layer norm dx")));
      EXPECT_TRUE(SameBits(dg_got, dg_want, Case(d, s, "layer norm dgamma")));
      EXPECT_TRUE(SameBits(db_got, db_want, Case(d, s, "layer norm dbeta")));
    }
}

// The 16-bit codes of an f32 kernel's result: what the op stored before,
// rounding the f32 kernel's output once.
std::vector<uint16_t> Rounded(dt_dtype dtype, const Vec &v) {
  std::vector<uint16_t> bits(v.size());
  EXPECT_EQ(DT_OK, dt_half_from_f32(dtype, v.data(), bits.data(), (int64_t)v.size()));
  return bits;
}

::testing::AssertionResult SameCodes(const std::vector<uint16_t> &got,
                                     const std::vector<uint16_t> &want, const std::string &what) {
  for (size_t i = 0; i < got.size() && i < want.size(); i++)
    if (got[i] != want[i])
      return ::testing::AssertionFailure() << what << ": element " << i << " is 0x" << std::hex
                                           << got[i] << ", the f32 kernel's rounded 0x" << want[i];
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": sizes differ";
  return ::testing::AssertionSuccess();
}

// The norms under autocast (core/autocast_policy.def's NORM): a 16-bit y
// is the f32 kernel's y rounded once, the statistics and the residual sum
// are unchanged; a 16-bit dy gives what the f32 kernel gives on the widened
// dy, bit for bit. Layer norm (plain and fused residual, of f32 and 16-bit
// x) and RMS norm.
TEST_P(ThreadCounts, HalfNormResultsAreRoundedOnceAndHalfGradientsWidened) {
  const float eps = 1e-5f;
  for (dt_dtype d : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (const Shape &s : kShapes) {
      const int64_t n = s.rows * s.cols, r = s.rows, c = s.cols;
      Half x = MakeHalf(d, (size_t)n, 61, -3.0f, 3.0f), dy = MakeHalf(d, (size_t)n, 62, -1, 1);
      Vec x32 = randn((size_t)n, 63, -3, 3), res32 = randn((size_t)n, 64);
      Vec gamma = randn((size_t)c, 65, 0.5f, 1.5f), beta = randn((size_t)c, 66);
      std::vector<uint16_t> y16((size_t)n, 0xffff);
      float *y16p = reinterpret_cast<float *>(y16.data());
      for (int half_x = 0; half_x < 2; half_x++) {
        const dt_exec *ex = half_x ? ExecOf(d) : cpu_exec();
        const float *xp = half_x ? x.data() : x32.data(), *xw = half_x ? x.wide.data() : x32.data();
        const std::string xs = half_x ? " of 16-bit x" : " of f32 x";
        LnOut want(s), got(s);
        ASSERT_EQ(DT_OK, dt_kernel_layer_norm_forward(cpu_exec(), xw, gamma.data(), beta.data(),
                                                      want.y.data(), DT_DTYPE_F32, want.mean.data(),
                                                      want.rstd.data(), r, c, eps));
        ASSERT_EQ(DT_OK, dt_kernel_layer_norm_forward(ex, xp, gamma.data(), beta.data(), y16p, d,
                                                      got.mean.data(), got.rstd.data(), r, c, eps))
            << dt_last_error();
        EXPECT_TRUE(SameCodes(y16, Rounded(d, want.y), Case(d, s, "layer norm y") + xs));
        EXPECT_TRUE(SameBits(got.mean, want.mean, Case(d, s, "layer norm mean") + xs));
        EXPECT_TRUE(SameBits(got.rstd, want.rstd, Case(d, s, "layer norm rstd") + xs));
        // the fused residual (GPT-2's: an f32 residual stream)
        ASSERT_EQ(DT_OK, dt_kernel_residual_layer_norm_forward(
                             cpu_exec(), xw, res32.data(), DT_DTYPE_F32, gamma.data(), beta.data(),
                             want.sum.data(), want.y.data(), DT_DTYPE_F32, want.mean.data(),
                             want.rstd.data(), r, c, eps));
        ASSERT_EQ(DT_OK, dt_kernel_residual_layer_norm_forward(
                             ex, xp, res32.data(), DT_DTYPE_F32, gamma.data(), beta.data(),
                             got.sum.data(), y16p, d, got.mean.data(), got.rstd.data(), r, c, eps))
            << dt_last_error();
        EXPECT_TRUE(SameCodes(y16, Rounded(d, want.y), Case(d, s, "residual layer norm y") + xs));
        EXPECT_TRUE(SameBits(got.sum, want.sum, Case(d, s, "residual layer norm sum") + xs));
        // RMS norm
        ASSERT_EQ(DT_OK, dt_kernel_rms_norm_forward(cpu_exec(), xw, gamma.data(), want.y.data(),
                                                    DT_DTYPE_F32, want.rstd.data(), r, c, eps));
        ASSERT_EQ(DT_OK, dt_kernel_rms_norm_forward(ex, xp, gamma.data(), y16p, d, got.rstd.data(),
                                                    r, c, eps))
            << dt_last_error();
        EXPECT_TRUE(SameCodes(y16, Rounded(d, want.y), Case(d, s, "rms norm y") + xs));
        EXPECT_TRUE(SameBits(got.rstd, want.rstd, Case(d, s, "rms norm rstd") + xs));
      }
      // the backward of a 16-bit dy: layer norm (dx, dgamma, dbeta accumulated), RMS norm
      LnOut fwd(s);
      ASSERT_EQ(DT_OK, dt_kernel_layer_norm_forward(cpu_exec(), x32.data(), gamma.data(),
                                                    beta.data(), fwd.y.data(), DT_DTYPE_F32,
                                                    fwd.mean.data(), fwd.rstd.data(), r, c, eps));
      for (int rms = 0; rms < 2; rms++) {
        const std::string what = rms ? "rms norm" : "layer norm";
        Vec dx_want((size_t)n), dg_want((size_t)c, 1.0f), db_want((size_t)c, 2.0f);
        Vec dx_got((size_t)n, -1.0f), dg_got = dg_want, db_got = db_want;
        if (rms) {
          ASSERT_EQ(DT_OK, dt_kernel_rms_norm_backward(
                               cpu_exec(), x32.data(), gamma.data(), fwd.rstd.data(),
                               dy.wide.data(), DT_DTYPE_F32, dx_want.data(), dg_want.data(), r, c));
          ASSERT_EQ(DT_OK, dt_kernel_rms_norm_backward(cpu_exec(), x32.data(), gamma.data(),
                                                       fwd.rstd.data(), dy.data(), d, dx_got.data(),
                                                       dg_got.data(), r, c))
              << dt_last_error();
        } else {
          ASSERT_EQ(DT_OK, dt_kernel_layer_norm_backward(
                               cpu_exec(), x32.data(), gamma.data(), fwd.mean.data(),
                               fwd.rstd.data(), dy.wide.data(), DT_DTYPE_F32, dx_want.data(),
                               dg_want.data(), db_want.data(), r, c));
          ASSERT_EQ(DT_OK, dt_kernel_layer_norm_backward(cpu_exec(), x32.data(), gamma.data(),
                                                         fwd.mean.data(), fwd.rstd.data(),
                                                         dy.data(), d, dx_got.data(), dg_got.data(),
                                                         db_got.data(), r, c))
              << dt_last_error();
        }
        EXPECT_TRUE(SameBits(dx_got, dx_want, Case(d, s, "dx") + " of " + what));
        EXPECT_TRUE(SameBits(dg_got, dg_want, Case(d, s, "dgamma") + " of " + what));
        EXPECT_TRUE(SameBits(db_got, db_want, Case(d, s, "dbeta") + " of " + what));
      }
    }
}

// The batch norm of a 16-bit x and/or y (autocast's NORM policy, ResNet's
// convolutions' 16-bit outputs): y is the f32 kernel's y on the widened x
// rounded once; the statistics (saved and running) are the f32 kernel's bit
// for bit; a 16-bit dy gives the f32 kernel's dgamma and dbeta on the
// widened dy, and dx of x's dtype is its dx rounded once. Training and
// eval; planes of 1, 7x7 and 16x16.
TEST_P(ThreadCounts, HalfBatchNormIsTheF32KernelRoundedOnce) {
  const float eps = 1e-5f, mom = 0.1f;
  struct Geom {
    int64_t n, c, hw;
  };
  for (dt_dtype d : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (Geom g : {Geom{6, 5, 1}, Geom{4, 3, 49}, Geom{3, 8, 256}}) {
      const int64_t total = g.n * g.c * g.hw, c = g.c;
      const std::string geo = " " + std::to_string(g.n) + "x" + std::to_string(c) + "x" +
                              std::to_string(g.hw) + " " + dt_dtype_name(d);
      Half x = MakeHalf(d, (size_t)total, 71, -3.0f, 3.0f),
           dy = MakeHalf(d, (size_t)total, 72, -1, 1);
      Vec x32 = randn((size_t)total, 73, -3, 3);
      Vec gamma = randn((size_t)c, 74, 0.5f, 1.5f), beta = randn((size_t)c, 75);
      for (int training = 0; training < 2; training++)
        for (int half_x = 0; half_x < 2; half_x++)
          for (int half_y = 0; half_y < 2; half_y++) {
            const std::string what = geo + (training ? " train" : " eval") +
                                     (half_x ? ", 16-bit x" : ", f32 x") +
                                     (half_y ? ", 16-bit y" : ", f32 y");
            const dt_exec *ex = half_x ? ExecOf(d) : cpu_exec();
            const float *xp = half_x ? x.data() : x32.data(),
                        *xw = half_x ? x.wide.data() : x32.data();
            Vec rm_w = randn((size_t)c, 76), rv_w = randn((size_t)c, 77, 0.5f, 2.0f);
            Vec rm_g = rm_w, rv_g = rv_w, sm_w((size_t)c), si_w((size_t)c), sm_g((size_t)c),
                si_g((size_t)c), y_w((size_t)total);
            std::vector<uint16_t> y16((size_t)total, 0xffff);
            Vec y32((size_t)total, -7.0f);
            ASSERT_EQ(DT_OK, dt_kernel_batch_norm2d_forward(
                                 cpu_exec(), xw, y_w.data(), DT_DTYPE_F32, gamma.data(),
                                 beta.data(), rm_w.data(), rv_w.data(), sm_w.data(), si_w.data(),
                                 g.n, c, g.hw, training, mom, eps));
            float *yp = half_y ? reinterpret_cast<float *>(y16.data()) : y32.data();
            ASSERT_EQ(DT_OK, dt_kernel_batch_norm2d_forward(ex, xp, yp, half_y ? d : DT_DTYPE_F32,
                                                            gamma.data(), beta.data(), rm_g.data(),
                                                            rv_g.data(), sm_g.data(), si_g.data(),
                                                            g.n, c, g.hw, training, mom, eps))
                << dt_last_error();
            if (half_y)
              EXPECT_TRUE(SameCodes(y16, Rounded(d, y_w), "y" + what));
            else
              EXPECT_TRUE(SameBits(y32, y_w, "y" + what));
            EXPECT_TRUE(SameBits(sm_g, sm_w, "saved mean" + what));
            EXPECT_TRUE(SameBits(si_g, si_w, "saved invstd" + what));
            EXPECT_TRUE(SameBits(rm_g, rm_w, "running mean" + what));
            EXPECT_TRUE(SameBits(rv_g, rv_w, "running var" + what));
            if (!training)
              continue;
            // the backward: dy 16-bit when y was
            Vec dx_w((size_t)total), dg_w((size_t)c), db_w((size_t)c), dg_g((size_t)c, NAN),
                db_g((size_t)c, NAN), dx32((size_t)total, NAN);
            std::vector<uint16_t> dx16((size_t)total, 0xffff);
            const float *dyw = half_y ? dy.wide.data() : x32.data();
            ASSERT_EQ(DT_OK, dt_kernel_batch_norm2d_backward(cpu_exec(), xw, dyw, DT_DTYPE_F32,
                                                             gamma.data(), sm_w.data(), si_w.data(),
                                                             dx_w.data(), dg_w.data(), db_w.data(),
                                                             g.n, c, g.hw, eps));
            float *dxp = half_x ? reinterpret_cast<float *>(dx16.data()) : dx32.data();
            ASSERT_EQ(DT_OK, dt_kernel_batch_norm2d_backward(
                                 ex, xp, half_y ? dy.data() : x32.data(), half_y ? d : DT_DTYPE_F32,
                                 gamma.data(), sm_w.data(), si_w.data(), dxp, dg_g.data(),
                                 db_g.data(), g.n, c, g.hw, eps))
                << dt_last_error();
            if (half_x)
              EXPECT_TRUE(SameCodes(dx16, Rounded(d, dx_w), "dx" + what));
            else
              EXPECT_TRUE(SameBits(dx32, dx_w, "dx" + what));
            EXPECT_TRUE(SameBits(dg_g, dg_w, "dgamma" + what));
            EXPECT_TRUE(SameBits(db_g, db_w, "dbeta" + what));
          }
    }
}

// The pooling kernels of 16-bit x, y, dy, dx: each plane widened into
// scratch, the f32 body, one rounding. LeNet's 2x2 windows (with enough
// planes for the threads), overlapping padded windows (the backward sums
// several windows' gradients before its one rounding), odd sizes, a NaN.
TEST_P(ThreadCounts, HalfPoolingIsTheF32KernelsOfTheWidenedInputsRoundedBitForBit) {
  const dt_conv2d_geom geoms[] = {
      geom(8, 6, 28, 28, 0, 2, 2, 2, 2, 0, 0), geom(3, 5, 9, 7, 0, 3, 3, 2, 2, 1, 1),
      geom(2, 3, 10, 11, 0, 3, 3, 1, 1, 1, 1), geom(2, 3, 7, 9, 0, 2, 2, 2, 2, 0, 0),
      geom(40, 16, 10, 10, 0, 3, 2, 1, 2, 1, 1)};
  for (dt_dtype d : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (const dt_conv2d_geom &g : geoms) {
      const size_t nx = (size_t)g.n * g.c * g.h * g.w, ny = (size_t)g.n * g.c * g.oh * g.ow;
      const std::string what =
          std::string(dt_dtype_name(d)) + " " + std::to_string(g.n) + "x" + std::to_string(g.c) +
          "x" + std::to_string(g.h) + "x" + std::to_string(g.w) + " k" + std::to_string(g.kh) +
          "x" + std::to_string(g.kw) + " s" + std::to_string(g.sh) + " p" + std::to_string(g.ph);
      Half x = MakeHalf(d, nx, 51, -4.0f, 4.0f), dy = MakeHalf(d, ny, 52, -2.0f, 2.0f);
      x.bits[nx / 3] = d == DT_DTYPE_BF16 ? 0x7fc0 : 0x7e00;  // a quiet NaN wins its window
      x.wide[nx / 3] = NAN;
      // max pooling: y, argmax, dx
      Vec y32(ny), dx32(nx);
      std::vector<int32_t> am32(ny), am(ny, -1);
      std::vector<uint16_t> y(ny, 0xffff), dx(nx, 0xffff);
      ASSERT_EQ(DT_OK, dt_kernel_max_pool2d_forward(cpu_exec(), &g, x.wide.data(), y32.data(),
                                                    am32.data()));
      ASSERT_EQ(DT_OK, dt_kernel_max_pool2d_forward(ExecOf(d), &g, x.data(),
                                                    reinterpret_cast<float *>(y.data()), am.data()))
          << dt_last_error();
      EXPECT_TRUE(SameCodes(y, Rounded(d, y32), what + " max y"));
      EXPECT_EQ(am, am32) << what << " argmax";
      ASSERT_EQ(DT_OK, dt_kernel_max_pool2d_backward(cpu_exec(), &g, dy.wide.data(), am32.data(),
                                                     dx32.data()));
      ASSERT_EQ(DT_OK, dt_kernel_max_pool2d_backward(ExecOf(d), &g, dy.data(), am.data(),
                                                     reinterpret_cast<float *>(dx.data())))
          << dt_last_error();
      EXPECT_TRUE(SameCodes(dx, Rounded(d, dx32), what + " max dx"));
      // average pooling: y, dx
      std::fill(y.begin(), y.end(), 0xffff);
      std::fill(dx.begin(), dx.end(), 0xffff);
      ASSERT_EQ(DT_OK, dt_kernel_avg_pool2d_forward(cpu_exec(), &g, x.wide.data(), y32.data()));
      ASSERT_EQ(DT_OK, dt_kernel_avg_pool2d_forward(ExecOf(d), &g, x.data(),
                                                    reinterpret_cast<float *>(y.data())))
          << dt_last_error();
      EXPECT_TRUE(SameCodes(y, Rounded(d, y32), what + " avg y"));
      ASSERT_EQ(DT_OK, dt_kernel_avg_pool2d_backward(cpu_exec(), &g, dy.wide.data(), dx32.data()));
      ASSERT_EQ(DT_OK, dt_kernel_avg_pool2d_backward(ExecOf(d), &g, dy.data(),
                                                     reinterpret_cast<float *>(dx.data())))
          << dt_last_error();
      EXPECT_TRUE(SameCodes(dx, Rounded(d, dx32), what + " avg dx"));
    }
}

// Dropout of 16-bit x and dy: blocks widened, the f32 kernel's keep test
// (the element's global index) and scaling, one rounding. Sizes below, at
// and across a block and large enough for the threads; an offset into the
// generator's stream; p 0.3, 0.5 and 1 (everything dropped); a NaN.
TEST_P(ThreadCounts, HalfDropoutIsTheF32KernelOfTheWidenedInputsRoundedBitForBit) {
  for (dt_dtype d : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (size_t n : {(size_t)3, (size_t)2048, (size_t)2049, (size_t)100003})
      for (float p : {0.3f, 0.5f, 1.0f}) {
        const std::string what =
            std::string(dt_dtype_name(d)) + " n " + std::to_string(n) + " p " + std::to_string(p);
        const uint64_t seed = 99, offset = 12345;
        Half x = MakeHalf(d, n, 61, -4.0f, 4.0f), dy = MakeHalf(d, n, 62, -2.0f, 2.0f);
        x.bits[n / 2] = d == DT_DTYPE_BF16 ? 0x7fc0 : 0x7e00;
        x.wide[n / 2] = NAN;
        Vec y32(n), dx32(n);
        std::vector<uint8_t> mask32(n), mask(n, 7);
        std::vector<uint16_t> y(n, 0xffff), dx(n, 0xffff);
        ASSERT_EQ(DT_OK, dt_kernel_dropout_forward(cpu_exec(), x.wide.data(), y32.data(),
                                                   mask32.data(), (int64_t)n, p, seed, offset));
        ASSERT_EQ(DT_OK, dt_kernel_dropout_forward(ExecOf(d), x.data(),
                                                   reinterpret_cast<float *>(y.data()), mask.data(),
                                                   (int64_t)n, p, seed, offset))
            << dt_last_error();
        EXPECT_EQ(mask, mask32) << what << " mask";
        EXPECT_TRUE(SameCodes(y, Rounded(d, y32), what + " y"));
        ASSERT_EQ(DT_OK, dt_kernel_dropout_backward(cpu_exec(), dy.wide.data(), mask32.data(),
                                                    dx32.data(), (int64_t)n, p));
        ASSERT_EQ(DT_OK,
                  dt_kernel_dropout_backward(ExecOf(d), dy.data(), mask.data(),
                                             reinterpret_cast<float *>(dx.data()), (int64_t)n, p))
            << dt_last_error();
        EXPECT_TRUE(SameCodes(dx, Rounded(d, dx32), what + " dx"));
      }
}

TEST(CpuHalfRows, HalfMaxPoolBackwardRefusesABadArgmax) {
  const dt_conv2d_geom g = geom(1, 2, 4, 4, 0, 2, 2, 2, 2, 0, 0);
  std::vector<uint16_t> dy(8, 0x3f80), dx(32);
  std::vector<int32_t> am(8, 0);
  am[5] = 16;  // h*w: one past the plane
  EXPECT_EQ(DT_ERR_INVALID_ARG,
            dt_kernel_max_pool2d_backward(ExecOf(DT_DTYPE_BF16), &g,
                                          reinterpret_cast<const float *>(dy.data()), am.data(),
                                          reinterpret_cast<float *>(dx.data())));
  EXPECT_NE(std::string(dt_last_error()).find("argmax outside [0, 16)"), std::string::npos)
      << dt_last_error();
}

TEST(CpuHalfRows, ResidualOfAnIntegerDtypeIsRefused) {
  const int64_t r = 2, c = 3;
  Vec x = randn(6, 1), res = randn(6, 2), sum(6), y(6), mean(2), rstd(2);
  EXPECT_EQ(DT_ERR_DTYPE,
            dt_kernel_residual_layer_norm_forward(
                cpu_exec(), x.data(), res.data(), DT_DTYPE_I32, nullptr, nullptr, sum.data(),
                y.data(), DT_DTYPE_F32, mean.data(), rstd.data(), r, c, 1e-5f));
  EXPECT_NE(std::string(dt_last_error()).find("residual dtype i32"), std::string::npos)
      << dt_last_error();
  EXPECT_EQ(DT_ERR_DTYPE,
            dt_kernel_layer_norm_forward(cpu_exec(), x.data(), nullptr, nullptr, y.data(),
                                         DT_DTYPE_I32, mean.data(), rstd.data(), r, c, 1e-5f));
  EXPECT_NE(std::string(dt_last_error()).find("result dtype i32"), std::string::npos)
      << dt_last_error();
}

INSTANTIATE_TEST_SUITE_P(Threads, ThreadCounts, ::testing::Values(1, 2, 3));

}  // namespace
