// The CUDA backend beyond the ops: TF32 and mixed-precision GEMM against
// the CPU reference (dt_cpu_backend()), streams and events ordering work,
// the copy stream waiting for compute on a reused block, a tensor round
// trip. The ops' kernels (CPU-vs-CUDA parity, every dtype) are checked by
// the op table, tests/op_table_test.cc. TF32 is off except where a test says
// so. Without a GPU every test skips with the reason dt_backend_get() gives.
//
// DT_PARITY_TEST_DEVICE=cpu:1 runs the suite against the CPU backend itself
// (//tests:cuda_backend_selfcheck_test, in CI): both sides must agree, which
// checks the harness and the calls it makes before a GPU ever runs them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/cpu.h"
#include "core/env.h"
#include "core/memory.h"
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

// A block freed by the host while queued compute kernels still read it is
// cached for the compute stream; handed out again and filled on the copy
// stream (as the loader does), the copy must wait for those kernels.
TEST_F(CudaBackend, CopyStreamWaitsForComputeStillUsingAReusedBlock) {
  if (SelfCheck())
    GTEST_SKIP() << "CUDA-only (TF32, GemmEx, streams, pinned memory): not in the CPU self-check";
  const int64_t n = 1 << 24;  // 64 MiB: the queued kernels take a while
  const size_t bytes = (size_t)n * sizeof(float);
  void *a = nullptr;
  OK(gpu_->alloc(dev_, bytes, &a));
  float *b = Zeros(n);
  OK(dt_kernel_fill(&gex_, (float *)a, 1.0f, n));
  const int rounds = 20;
  for (int r = 0; r < rounds; r++)  // b += a, queued on the compute stream
    OK(dt_kernel_axpby(&gex_, n, 1.0f, (const float *)a, 1.0f, b));
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
