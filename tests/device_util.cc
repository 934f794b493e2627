#include "tests/device_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/backend.h"
#include "core/status.h"
#include "cuda/cuda.h"

namespace dtt {

dt_device TestDevice(dt_env_param param) {
  dt_device d = {DT_DEVICE_CUDA, 0};
  const char *s = nullptr;
  if (dt_env_string(param, &s) != DT_OK || dt_device_parse(s, &d) != DT_OK)
    std::fprintf(stderr, "%s=%s: %s\n", dt_env_info_of(param)->name, s ? s : "", dt_last_error());
  return d;
}

std::string NoDeviceReason(dt_device dev) {
  const dt_backend_ops *ops = nullptr;
  if (dt_backend_get(dev, &ops) == DT_OK)
    return "";
  std::string r = dt_last_error();
  if (dt_cuda_probe() != DT_OK && r.find(dt_last_error()) == std::string::npos)
    r += " [" + std::string(dt_last_error()) + "]";
  return r;
}

::testing::AssertionResult ParityClose(const std::vector<double> &got,
                                       const std::vector<double> &want, double rtol, double atol,
                                       double scale) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " elements vs " << want.size();
  double max_want = 0.0;
  for (double w : want)
    if (std::isfinite(w))
      max_want = std::max(max_want, std::fabs(w));
  size_t worst = 0, bad = 0;
  double worst_excess = 0.0;
  for (size_t i = 0; i < got.size(); i++) {
    double g = got[i], w = want[i];
    if ((std::isnan(w) && std::isnan(g)) || g == w)  // g == w: equal infinities too
      continue;
    double excess = std::fabs(g - w) - (atol + rtol * std::fabs(w) + scale * max_want);
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
  char detail[256];
  std::snprintf(detail, sizeof detail,
                "worst at %zu: %.9g vs cpu %.9g (rtol %g, atol %g, scale %g x max %.6g)", worst,
                got[worst], want[worst], rtol, atol, scale, max_want);
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements differ; " << detail;
}

}  // namespace dtt
