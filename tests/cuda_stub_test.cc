// cuda/stub.c: the CUDA library of a CPU-only build (--config=cpu, or no
// toolkit). Linked here without //cuda, as that build links it: nothing is
// registered for cuda:N, every entry point refuses with one clear message
// (rebuild with the toolkit, or --device cpu), the doctor reports it, and
// the CPU works regardless.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/backend.h"
#include "core/tensor.h"
#include "cuda/cuda.h"

namespace {

bool SaysNotBuilt(const std::string &msg) {
  return msg.find("this build of dtrain has no CUDA") != std::string::npos &&
         msg.find("--device cpu") != std::string::npos;
}

TEST(CudaStub, NotBuiltAndEveryEntryPointSaysSo) {
  EXPECT_EQ(0, dt_cuda_built());
  EXPECT_EQ(DT_ERR_UNSUPPORTED, dt_cuda_probe());
  EXPECT_TRUE(SaysNotBuilt(dt_last_error())) << dt_last_error();
  dt_cuda_device_info info;
  EXPECT_EQ(DT_ERR_UNSUPPORTED, dt_cuda_get_device_info(0, &info));
  EXPECT_TRUE(SaysNotBuilt(dt_last_error())) << dt_last_error();
  void *p = reinterpret_cast<void *>(1);
  EXPECT_EQ(DT_ERR_UNSUPPORTED, dt_cuda_pinned_alloc(4096, &p));
  EXPECT_EQ(nullptr, p);
  EXPECT_TRUE(SaysNotBuilt(dt_last_error())) << dt_last_error();
}

TEST(CudaStub, ACudaTensorIsRefusedAndTheCpuWorks) {
  const int64_t n = 8;
  dt_tensor *t = nullptr;
  dt_device cuda0 = {DT_DEVICE_CUDA, 0};
  EXPECT_EQ(DT_ERR_UNSUPPORTED, dt_tensor_empty(&n, 1, DT_DTYPE_F32, cuda0, &t));
  EXPECT_EQ(nullptr, t);
  EXPECT_NE(std::string(dt_last_error()).find("no CUDA backend"), std::string::npos)
      << dt_last_error();
  ASSERT_EQ(DT_OK, dt_tensor_empty(&n, 1, DT_DTYPE_F32, DT_CPU, &t)) << dt_last_error();
  dt_tensor_release(t);
}

TEST(CudaStub, TheDoctorReportsOneProblem) {
  char *text = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  ASSERT_NE(nullptr, f);
  int problems = 0;
  EXPECT_EQ(DT_OK, dt_cuda_doctor(f, &problems));
  std::fclose(f);
  EXPECT_EQ(1, problems);
  EXPECT_TRUE(SaysNotBuilt(text)) << text;
  std::free(text);
}

}  // namespace
