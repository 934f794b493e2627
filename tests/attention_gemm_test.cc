// The causal attention's two paths (core/ops_attention.c): the fused
// kernels and the heads' batched GEMMs with the softmax between them
// (DT_ATTENTION=gemm; the default for 16-bit qkv on a GPU) give the same
// output and qkv gradient: in f32 to the summation order, under autocast to
// the 16-bit rounding of the probabilities, dO and dS that the GEMMs read.
// The GEMM path's own finite-difference and matmul-composition checks run
// in op_table_attention_gemm_test (the op table's attention rows under
// DT_ATTENTION=gemm). Here: the paths against each other on the CPU, and
// the groups of heads (the scratch budget) changing nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/amp.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/ops_internal.h"
#include "core/tensor.h"
#include "tests/test_util.h"

namespace {

struct Geom {
  int64_t b, t, h, hd;
};

std::string Name(const Geom &g, dt_dtype d) {
  return std::string(dt_dtype_name(d)) + " " + std::to_string(g.b) + "x" + std::to_string(g.t) +
         " h" + std::to_string(g.h) + " hd" + std::to_string(g.hd);
}

// DT_ATTENTION set for the scope of one run.
class AttentionPath {
 public:
  explicit AttentionPath(const char *path) { setenv("DT_ATTENTION", path, 1); }
  ~AttentionPath() { unsetenv("DT_ATTENTION"); }
};

// The output (widened to f32) and then qkv's gradient, after a backward
// with a fixed upstream gradient; qkv f32, under autocast to `d` when d is
// 16-bit (the op computes on qkv's 16-bit copy).
std::vector<std::vector<float>> RunPath(const char *path, const Geom &g, dt_dtype d) {
  AttentionPath scope(path);
  std::vector<std::vector<float>> res;
  dt_tensor *qkv = dtt::RandomTensor({g.b, g.t, 3 * g.h * g.hd}, 91, true, -2.0f, 2.0f);
  dt_tensor *y = nullptr, *y32 = nullptr, *up = nullptr;
  dt_dtype prev = dt_autocast_begin(d);
  dt_status st = dt_op_causal_attention(qkv, (int)g.h, &y);
  dt_autocast_end(prev);
  EXPECT_EQ(DT_OK, st) << dt_last_error();
  if (st == DT_OK) {
    EXPECT_EQ(dt_tensor_dtype(y), d) << "the result has qkv's computing dtype";
    dt_no_grad_begin();
    EXPECT_EQ(DT_OK, dt_tensor_to_dtype(y, DT_DTYPE_F32, &y32)) << dt_last_error();
    dt_no_grad_end();
    res.push_back(y32 ? dtt::ToVector(y32) : std::vector<float>());
    dt_tensor *up32 = dtt::MakeTensor(dtt::UpstreamGradient(res[0].size(), 777), dtt::Shape(y));
    EXPECT_EQ(DT_OK, dt_tensor_to_dtype(up32, d, &up)) << dt_last_error();
    dt_tensor_release(up32);
    EXPECT_EQ(DT_OK, dt_backward(y, up)) << dt_last_error();
    dt_tensor *gq = dt_tensor_grad(qkv);
    EXPECT_NE(gq, nullptr);
    res.push_back(gq ? dtt::ToVector(gq) : std::vector<float>());
  }
  dt_tensor_release(up);
  dt_tensor_release(y32);
  dt_tensor_release(y);
  dt_tensor_release(qkv);
  return res;
}

// max |got - want| / max |want|
double RelMaxError(const std::vector<float> &got, const std::vector<float> &want) {
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.size() && i < got.size(); i++) {
    err = std::fmax(err, std::fabs((double)got[i] - want[i]));
    scale = std::fmax(scale, std::fabs((double)want[i]));
  }
  return err / (scale > 0 ? scale : 1.0);
}

const std::vector<Geom> kGeoms = {
    {2, 9, 2, 8}, {1, 1, 1, 4}, {2, 65, 3, 48}, {1, 130, 4, 32}, {3, 33, 2, 5}, {1, 200, 2, 64},
};

TEST(AttentionGemm, MatchesTheFusedKernels) {
  // Measured (max error over the largest element, 6 geometries): f32 <=
  // 8e-7; f16 <= 5.6e-4 and bf16 <= 4.5e-3, about one rounding of the
  // 16-bit output, which both paths round.
  struct Tol {
    dt_dtype d;
    double out, grad;
  };
  for (const Tol &tol : {Tol{DT_DTYPE_F32, 5e-6, 5e-6}, Tol{DT_DTYPE_F16, 2e-3, 2e-3},
                         Tol{DT_DTYPE_BF16, 1.5e-2, 1.5e-2}})
    for (const Geom &g : kGeoms) {
      auto fused = RunPath("fused", g, tol.d), gemm = RunPath("gemm", g, tol.d);
      ASSERT_EQ(fused.size(), 2u);
      ASSERT_EQ(gemm.size(), 2u);
      ASSERT_EQ(gemm[0].size(), fused[0].size());
      ASSERT_EQ(gemm[1].size(), fused[1].size());
      double eo = RelMaxError(gemm[0], fused[0]), eg = RelMaxError(gemm[1], fused[1]);
      EXPECT_LE(eo, tol.out) << Name(g, tol.d) << ": output";
      EXPECT_LE(eg, tol.grad) << Name(g, tol.d) << ": gradient";
      for (float v : gemm[1])
        ASSERT_TRUE(std::isfinite(v)) << Name(g, tol.d);
    }
}

// The 16-bit path is not the f32 one: autocast reaches the GEMMs.
TEST(AttentionGemm, HalfPathRoundsWhatTheGemmsRead) {
  const Geom g = {2, 65, 3, 48};
  auto f32 = RunPath("gemm", g, DT_DTYPE_F32), bf16 = RunPath("gemm", g, DT_DTYPE_BF16);
  ASSERT_EQ(f32.size(), 2u);
  ASSERT_EQ(bf16.size(), 2u);
  EXPECT_GT(RelMaxError(bf16[0], f32[0]), 1e-4);
  EXPECT_LT(RelMaxError(bf16[0], f32[0]), 3e-2);
}

// Groups of heads (a small scratch budget: one head, and uneven groups)
// give what one group gives. Not bit for bit: the CPU's GEMM threads a
// batch of matrices differently from one matrix, so the sums may round
// differently; a wrong offset of a group would be off by O(1).
TEST(AttentionGemm, GroupsOfHeadsGiveTheSameResult) {
  const Geom g = {3, 40, 3, 16};  // 9 heads of 40 x 40 scores
  for (dt_dtype d : {DT_DTYPE_F32, DT_DTYPE_BF16, DT_DTYPE_F16}) {
    const double tol = d == DT_DTYPE_F32 ? 2e-6 : d == DT_DTYPE_F16 ? 2e-3 : 1.5e-2;
    auto whole = RunPath("gemm", g, d);
    ASSERT_EQ(whole.size(), 2u);
    const int64_t per_head = g.t * g.t * (4 + (d == DT_DTYPE_F32 ? 4 : 2));
    for (int64_t heads : {1, 2, 4}) {
      int64_t prev = dt_ops_attention_gemm_scratch(heads * per_head);
      auto grouped = RunPath("gemm", g, d);
      dt_ops_attention_gemm_scratch(prev);
      ASSERT_EQ(grouped.size(), 2u);
      EXPECT_LE(RelMaxError(grouped[0], whole[0]), tol)
          << dt_dtype_name(d) << ", " << heads << " heads a group";
      EXPECT_LE(RelMaxError(grouped[1], whole[1]), tol)
          << dt_dtype_name(d) << ", " << heads << " heads a group";
    }
  }
}

// Without recording (inference) the path needs no lse tensor of the op's.
TEST(AttentionGemm, RunsWithoutRecording) {
  AttentionPath scope("gemm");
  dt_tensor *qkv = dtt::RandomTensor({2, 17, 3 * 2 * 8}, 5, true);
  dt_tensor *y = nullptr;
  dt_no_grad_begin();
  dt_status st = dt_op_causal_attention(qkv, 2, &y);
  dt_no_grad_end();
  ASSERT_EQ(DT_OK, st) << dt_last_error();
  std::vector<float> got = dtt::ToVector(y);
  dt_tensor_release(y);
  {
    AttentionPath fused("fused");
    dt_no_grad_begin();
    ASSERT_EQ(DT_OK, dt_op_causal_attention(qkv, 2, &y)) << dt_last_error();
    dt_no_grad_end();
  }
  EXPECT_LE(RelMaxError(got, dtt::ToVector(y)), 1e-5);
  dt_tensor_release(y);
  dt_tensor_release(qkv);
}

TEST(AttentionGemm, AnUnknownPathIsRefused) {
  AttentionPath scope("flash");
  dt_tensor *qkv = dtt::RandomTensor({1, 4, 6}, 5);
  dt_tensor *y = nullptr;
  EXPECT_EQ(DT_ERR_INVALID_ARG, dt_op_causal_attention(qkv, 1, &y));
  EXPECT_NE(std::string(dt_last_error()).find("DT_ATTENTION"), std::string::npos)
      << dt_last_error();
  EXPECT_EQ(y, nullptr);
  dt_tensor_release(qkv);
}

}  // namespace
