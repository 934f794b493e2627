#include "tests/cpu_kernels_test_util.h"

#include <cmath>

#include "core/rng.h"

namespace dtk {

const dt_backend_ops *be() { return dt_cpu_backend(); }

const dt_exec *cpu_exec() {
  static dt_exec ex;
  if (!ex.be && dt_exec_init(DT_CPU, DT_DTYPE_F32, &ex) != DT_OK)
    ADD_FAILURE() << "dt_exec_init(cpu:0): " << dt_last_error();
  return &ex;
}

Vec randn(size_t n, uint64_t seed, float lo, float hi) {
  Vec v(n);
  for (size_t i = 0; i < n; i++)
    v[i] = lo + (hi - lo) * dt_rng_uniform(seed, i);
  return v;
}

dt_conv2d_geom geom(int n, int c, int h, int w, int oc, int kh, int kw, int sh, int sw, int ph,
                    int pw) {
  dt_conv2d_geom g{};
  g.n = n, g.c = c, g.h = h, g.w = w, g.oc = oc, g.kh = kh, g.kw = kw;
  g.sh = sh, g.sw = sw, g.ph = ph, g.pw = pw;
  g.oh = (h + 2 * ph - kh) / sh + 1;
  g.ow = (w + 2 * pw - kw) / sw + 1;
  return g;
}

void expect_close(const Vec &got, const std::vector<double> &want, double atol, double rtol,
                  const char *what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); i++)
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i])) << what << " at " << i;
}

void ThreadCounts::SetUp() {
  saved_ = dt_cpu_num_threads();
  dt_cpu_set_num_threads(GetParam());
}

void ThreadCounts::TearDown() { dt_cpu_set_num_threads(saved_); }

}  // namespace dtk
