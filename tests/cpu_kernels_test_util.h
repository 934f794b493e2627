// Helpers shared by the CPU kernel suites (cpu_kernels_test.cc,
// cpu_conv_kernels_test.cc, cpu_half_rows_test.cc). They need only //core:base, unlike
// test_util.h, which builds on the ops and autograd.
#ifndef DT_TESTS_CPU_KERNELS_TEST_UTIL_H
#define DT_TESTS_CPU_KERNELS_TEST_UTIL_H

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/backend.h"
#include "core/cpu.h"

namespace dtk {

using Vec = std::vector<float>;

// The CPU reference backend under test.
const dt_backend_ops *be();
// Its execution context on cpu:0 for f32 kernels (the dispatch in front of
// the CPU kernels, dt_kernel_<name>, checks the arguments).
const dt_exec *cpu_exec();

// n uniform values in [lo, hi), a pure function of (seed, index).
Vec randn(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f);

// The geometry of a convolution (oc filters) or pooling (oc 0) of an
// (n, c, h, w) input: kh x kw windows, strides sh, sw, paddings ph, pw.
dt_conv2d_geom geom(int n, int c, int h, int w, int oc, int kh, int kw, int sh, int sw, int ph,
                    int pw);

// Asserts |got[i] - want[i]| <= atol + rtol * |want[i]| for every i; `what`
// names the check in the failure message.
void expect_close(const Vec &got, const std::vector<double> &want, double atol, double rtol,
                  const char *what);

// Runs the body under several thread counts (serial and both parallel paths).
class ThreadCounts : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override;
  void TearDown() override;
  int saved_ = 1;
};

}  // namespace dtk

#endif  // DT_TESTS_CPU_KERNELS_TEST_UTIL_H
