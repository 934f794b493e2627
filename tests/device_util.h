// The device under test of the CUDA suites (parity with the CPU backend):
// which device it is, why it cannot be used, and the elementwise comparison
// with the CPU's result.
#ifndef DT_TESTS_DEVICE_UTIL_H
#define DT_TESTS_DEVICE_UTIL_H

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/device.h"
#include "core/env.h"

namespace dtt {

// cuda:0, or the device the test parameter `param` names (e.g.
// DT_PARITY_TEST_DEVICE=cpu:1: the harness checked against the CPU itself);
// a bad value is reported on stderr and cuda:0 kept.
dt_device TestDevice(dt_env_param param);

// Why `dev` cannot be used ("" when it can), with the CUDA probe's reason.
std::string NoDeviceReason(dt_device dev);

// |got - want| <= atol + rtol * |want| + scale * max |want| everywhere (NaN
// matches NaN, equal infinities match); on failure it names how many
// elements differ and the worst one.
::testing::AssertionResult ParityClose(const std::vector<double> &got,
                                       const std::vector<double> &want, double rtol, double atol,
                                       double scale = 0.0);

}  // namespace dtt

#endif
