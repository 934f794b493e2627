// The data loader on a GPU: its uploads on the copy stream overlap the
// compute of the previous step (issue 10, item 1), seen on the device's
// timeline through timing marks, and the compute still reads the right
// batches. tests/loader_async_test.cc checks the same protocol through a
// stand-in backend on any machine; this runs it for real, and skips with
// the reason without a GPU. tools/gpu_check.sh puts the timeline line it
// prints ("loader timeline: ...") into its summary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/data.h"
#include "core/status.h"
#include "core/tensor.h"
#include "cuda/cuda.h"

namespace {

constexpr int64_t kSampleFloats = 256 * 1024;  // 1 MiB per sample
constexpr int kBatch = 8;                      // 8 MiB per upload
constexpr int kSteps = 14;

struct Samples {
  int64_t n;
};
int64_t SamplesLength(void *impl) { return static_cast<Samples *>(impl)->n; }
float SampleValue(int64_t i) { return (float)(i % 7 + 1); }
dt_status SamplesGet(void *, int64_t i, float *input, int32_t *label) {
  std::fill(input, input + kSampleFloats, SampleValue(i));
  *label = (int32_t)(i % 10);
  return DT_OK;
}
const dt_dataset_vtable kSamplesVt = {SamplesLength, SamplesGet, nullptr};

#define OK(expr) ASSERT_EQ(DT_OK, (expr)) << dt_last_error()

class CudaLoader : public ::testing::Test {
 protected:
  void SetUp() override {
    const dt_backend_ops *be = nullptr;
    if (dt_backend_get(dev_, &be) != DT_OK) {
      std::string r = dt_last_error();
      if (dt_cuda_probe() != DT_OK)
        r += " [" + std::string(dt_last_error()) + "]";
      GTEST_SKIP() << "no CUDA device: " << r;
    }
    be_ = be;
  }
  dt_device dev_ = {DT_DEVICE_CUDA, 0};
  const dt_backend_ops *be_ = nullptr;
};

// Each step: take a batch, add it into an accumulator (the kernels read
// the upload), then a few large GEMMs (about 10 ms of compute), let go of
// the batch. Upload k+1 is queued right after step k; it must finish
// before step k's compute does, which the loader's former fence (every
// upload behind all queued compute) made impossible.
TEST_F(CudaLoader, UploadsOverlapThePreviousStepsCompute) {
  Samples samples{kBatch * kSteps};
  int64_t shape[1] = {kSampleFloats};
  dt_dataset *d = nullptr;
  OK(dt_dataset_create(&kSamplesVt, &samples, shape, 1, 10, &d));
  dt_sampler_config sc = DT_SAMPLER_CONFIG_DEFAULT;
  dt_sampler *s = nullptr;
  OK(dt_sampler_create(samples.n, &sc, &s));
  dt_loader_config lc = DT_LOADER_CONFIG_DEFAULT;
  lc.batch_size = kBatch;
  lc.prefetch = 4;
  lc.device = dev_;
  dt_loader *l = nullptr;
  OK(dt_loader_create(d, s, &lc, &l));

  dt_exec ex;
  OK(dt_exec_init(dev_, DT_DTYPE_F32, &ex));
  const int g = 4096;
  const int64_t batch_floats = (int64_t)kBatch * kSampleFloats;
  void *acc = nullptr, *a = nullptr, *c = nullptr;
  OK(be_->alloc(dev_, batch_floats * 4, &acc));
  OK(be_->alloc(dev_, (size_t)g * g * 4, &a));
  OK(be_->alloc(dev_, (size_t)g * g * 4, &c));
  OK(dt_kernel_fill(&ex, (float *)acc, 0.0f, batch_floats));
  OK(dt_kernel_fill(&ex, (float *)a, 1e-3f, (int64_t)g * g));
  dt_cuda_set_tf32(0);

  std::vector<dt_cuda_mark *> upload_end(kSteps), compute_end(kSteps);
  for (int k = 0; k < kSteps; k++) {
    OK(dt_cuda_mark_create(dev_, &upload_end[k]));
    OK(dt_cuda_mark_create(dev_, &compute_end[k]));
  }
  dt_stream *copy = be_->stream(dev_, DT_STREAM_COPY);
  dt_stream *compute = be_->stream(dev_, DT_STREAM_COMPUTE);
  OK(dt_loader_start_epoch(l, 0));
  for (int k = 0; k < kSteps; k++) {
    dt_tensor *x = nullptr, *y = nullptr;
    OK(dt_loader_next(l, &x, &y));
    ASSERT_NE(x, nullptr);
    OK(dt_cuda_mark_record(upload_end[k], copy));  // after the upload, on its stream
    OK(dt_kernel_axpby(&ex, batch_floats, 1.0f, (const float *)dt_tensor_data(x), 1.0f,
                       (float *)acc));
    for (int r = 0; r < 4; r++)
      OK(dt_kernel_gemm(&ex, false, false, g, g, g, 1.0f, (const float *)a, g, 0, (const float *)a,
                        g, 0, 0.0f, (float *)c, g, 0, 1));
    OK(dt_cuda_mark_record(compute_end[k], compute));
    dt_tensor_release(x);
    dt_tensor_release(y);
  }
  OK(be_->device_synchronize(dev_));
  dt_cuda_set_tf32(1);

  // The compute read every batch, each once, intact.
  std::vector<float> got(batch_floats);
  OK(be_->copy(got.data(), DT_CPU, acc, dev_, got.size() * 4, nullptr));
  double sum = 0.0, want = 0.0;
  for (float v : got)
    sum += v;
  for (int64_t i = 0; i < samples.n; i++)
    want += (double)SampleValue(i) * kSampleFloats;
  EXPECT_EQ(sum, want) << "the compute read a batch that was not (yet, or still) its own";

  // The timeline: lead = how long before step k's compute ended upload k+1
  // was done. The first steps fill the loader's buffers (fenced on all
  // compute), so steady state starts at k = 2.
  int overlapped = 0, measured = 0;
  std::vector<float> leads;
  for (int k = 2; k + 1 < kSteps; k++) {
    float ms = 0.0f;
    OK(dt_cuda_mark_elapsed(upload_end[k + 1], compute_end[k], &ms));
    leads.push_back(ms);
    measured++;
    overlapped += ms > 0.0f;
  }
  float step_ms = 0.0f;
  OK(dt_cuda_mark_elapsed(compute_end[kSteps - 2], compute_end[kSteps - 1], &step_ms));
  std::sort(leads.begin(), leads.end());
  std::printf(
      "loader timeline: %d of %d uploads (%d MiB each) finished while the previous step "
      "computed; median lead %.2f ms, step %.2f ms\n",
      overlapped, measured, (int)(batch_floats * 4 >> 20), leads[leads.size() / 2], step_ms);
  EXPECT_GE(overlapped, measured - 1) << "uploads waited for the compute queued before them";

  for (int k = 0; k < kSteps; k++) {
    dt_cuda_mark_destroy(upload_end[k]);
    dt_cuda_mark_destroy(compute_end[k]);
  }
  be_->free(dev_, c, (size_t)g * g * 4);
  be_->free(dev_, a, (size_t)g * g * 4);
  be_->free(dev_, acc, batch_floats * 4);
  dt_loader_destroy(l);
  dt_sampler_destroy(s);
  dt_dataset_destroy(d);
}

}  // namespace
