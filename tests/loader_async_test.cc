// The loader's asynchronous path (pinned slots, copy stream, events), driven
// through a stand-in device backend: the CPU table registered as device type
// CUDA, with page-locked memory and events that record what the loader does.
// It checks the protocol the real CUDA backend relies on, on any machine;
// tools/gpu_check.sh runs the real thing.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <vector>

#include "core/backend.h"
#include "core/cpu.h"
#include "core/data.h"
#include "core/tensor.h"
#include "core/text.h"
#include "tests/stand_in_device.h"

namespace {

struct Trace {
  int host_allocs = 0, host_frees = 0;
  int copies_on_copy_stream = 0;
  int records = 0, waits_on_compute = 0, syncs = 0;
  std::set<void *> pinned;
} trace;

dt_stream *const kCompute = reinterpret_cast<dt_stream *>(0x10);
dt_stream *const kCopy = reinterpret_cast<dt_stream *>(0x20);

struct FakeEvent {
  int recorded = 0;
  int synced = 0;
};

dt_status FakeHostAlloc(size_t bytes, void **out) {
  *out = malloc(bytes);
  trace.host_allocs++;
  trace.pinned.insert(*out);
  return DT_OK;
}
void FakeHostFree(void *p) {
  trace.host_frees++;
  trace.pinned.erase(p);
  free(p);
}
dt_stream *FakeStream(dt_device, dt_stream_kind kind) {
  return kind == DT_STREAM_COPY ? kCopy : kCompute;
}
dt_status FakeEventCreate(dt_device, dt_event **out) {
  *out = reinterpret_cast<dt_event *>(new FakeEvent());
  return DT_OK;
}
void FakeEventDestroy(dt_event *e) { delete reinterpret_cast<FakeEvent *>(e); }
dt_status FakeEventRecord(dt_event *e, dt_stream *s) {
  EXPECT_EQ(s, kCopy) << "the loader records its copy event on the copy stream";
  reinterpret_cast<FakeEvent *>(e)->recorded++;
  trace.records++;
  return DT_OK;
}
dt_status FakeStreamWait(dt_stream *s, dt_event *) {
  EXPECT_EQ(s, kCompute) << "the compute stream waits for the copy";
  trace.waits_on_compute++;
  return DT_OK;
}
dt_status FakeEventSync(dt_event *e) {
  reinterpret_cast<FakeEvent *>(e)->synced++;
  trace.syncs++;
  return DT_OK;
}
dt_status FakeCopy(void *dst, dt_device dd, const void *src, dt_device sd, size_t bytes,
                   dt_stream *stream) {
  if (stream == kCopy) {
    EXPECT_TRUE(trace.pinned.count(const_cast<void *>(src)))
        << "async copies read from page-locked slots";
    trace.copies_on_copy_stream++;
  }
  return dtt::StandInCopy(dst, dd, src, sd, bytes, stream);
}

struct Digits {
  int64_t n;
};
int64_t DigitsLength(void *impl) { return static_cast<Digits *>(impl)->n; }
dt_status DigitsGet(void *, int64_t i, float *input, int32_t *label) {
  input[0] = (float)i;
  input[1] = (float)(2 * i);
  *label = (int32_t)(i % 5);
  return DT_OK;
}
const dt_dataset_vtable kDigitsVt = {DigitsLength, DigitsGet, nullptr};

// Registers the stand-in as the CUDA backend (once per process).
void RegisterFakeDevice() {
  static bool done = false;
  if (done)
    return;
  done = true;
  static dt_backend_ops fake;
  fake = dtt::StandInDeviceOps("fake-async");
  fake.host_alloc = FakeHostAlloc;
  fake.host_free = FakeHostFree;
  fake.stream = FakeStream;
  fake.event_create = FakeEventCreate;
  fake.event_destroy = FakeEventDestroy;
  fake.event_record = FakeEventRecord;
  fake.stream_wait_event = FakeStreamWait;
  fake.event_synchronize = FakeEventSync;
  fake.copy = FakeCopy;
  ASSERT_EQ(dt_backend_register(DT_DEVICE_CUDA, &fake), DT_OK);
}

TEST(LoaderAsync, PinnedSlotsCopyStreamAndEvents) {
  RegisterFakeDevice();
  trace = Trace();

  static Digits digits{23};
  int64_t shape[] = {2};
  dt_dataset *d;
  ASSERT_EQ(dt_dataset_create(&kDigitsVt, &digits, shape, 1, 5, &d), DT_OK);
  dt_sampler_config sc = DT_SAMPLER_CONFIG_DEFAULT;
  sc.seed = 3;
  dt_sampler *s;
  ASSERT_EQ(dt_sampler_create(23, &sc, &s), DT_OK);
  dt_loader_config lc = DT_LOADER_CONFIG_DEFAULT;
  lc.batch_size = 4;
  lc.prefetch = 3;
  lc.device = {DT_DEVICE_CUDA, 0};
  dt_loader *l;
  ASSERT_EQ(dt_loader_create(d, s, &lc, &l), DT_OK) << dt_last_error();
  EXPECT_EQ(trace.host_allocs, 2 * 3) << "inputs and labels of each slot are page-locked";

  ASSERT_EQ(dt_loader_start_epoch(l, 0), DT_OK);
  std::vector<int> seen(23, 0);
  int batches = 0;
  for (;;) {
    dt_tensor *x, *y;
    ASSERT_EQ(dt_loader_next(l, &x, &y), DT_OK) << dt_last_error();
    if (x == nullptr)
      break;
    EXPECT_EQ(dt_tensor_device(x).type, DT_DEVICE_CUDA);
    batches++;
    // Each batch: two copies (inputs, labels), one event, one wait; the
    // previous batch's slot was handed back only after its event synced.
    EXPECT_EQ(trace.copies_on_copy_stream, 2 * batches);
    EXPECT_EQ(trace.records, batches);
    EXPECT_EQ(trace.waits_on_compute, batches);
    EXPECT_EQ(trace.syncs, batches - 1);
    std::vector<float> xv(dt_tensor_numel(x));
    std::vector<int32_t> yv(dt_tensor_numel(y));
    ASSERT_EQ(dt_tensor_to_host(x, xv.data(), xv.size() * 4), DT_OK);
    ASSERT_EQ(dt_tensor_to_host(y, yv.data(), yv.size() * 4), DT_OK);
    for (size_t r = 0; r < yv.size(); r++) {
      int i = (int)xv[2 * r];
      ASSERT_GE(i, 0);
      ASSERT_LT(i, 23);
      EXPECT_EQ(xv[2 * r + 1], 2.0f * i);
      EXPECT_EQ(yv[r], i % 5);
      seen[i]++;
    }
    dt_tensor_release(x);
    dt_tensor_release(y);
  }
  EXPECT_EQ(batches, 6);
  for (int c : seen)
    EXPECT_EQ(c, 1);
  dt_loader_destroy(l);
  EXPECT_EQ(trace.host_frees, trace.host_allocs);
  EXPECT_TRUE(trace.pinned.empty());
  dt_sampler_destroy(s);
  dt_dataset_destroy(d);
}

// Token windows (i32 inputs and targets, core/text.h) take the same path:
// pinned slots, copies on the copy stream, the compute stream waits.
TEST(LoaderAsync, TokenWindowsTakeTheSamePath) {
  RegisterFakeDevice();
  trace = Trace();
  std::vector<uint16_t> tokens(8 * 12 + 1);
  for (size_t i = 0; i < tokens.size(); i++)
    tokens[i] = (uint16_t)(1000 + i);
  dt_shard shard = {tokens.data(), (int64_t)tokens.size()};
  dt_token_loader_config c = DT_TOKEN_LOADER_CONFIG_DEFAULT;
  c.batch = 3;
  c.seq_len = 8;
  c.device = {DT_DEVICE_CUDA, 0};
  dt_token_loader *l;
  ASSERT_EQ(dt_token_loader_create(&shard, 50257, &c, &l), DT_OK) << dt_last_error();
  EXPECT_EQ(trace.host_allocs, 2 * c.prefetch);
  ASSERT_EQ(dt_token_loader_start_epoch(l, 0), DT_OK);
  std::set<int32_t> firsts;
  int batches = 0;
  for (;;) {
    dt_tensor *x, *y;
    ASSERT_EQ(dt_token_loader_next(l, &x, &y), DT_OK) << dt_last_error();
    if (x == nullptr)
      break;
    batches++;
    EXPECT_EQ(dt_tensor_device(x).type, DT_DEVICE_CUDA);
    EXPECT_EQ(dt_tensor_dtype(x), DT_DTYPE_I32);
    EXPECT_EQ(dt_tensor_dtype(y), DT_DTYPE_I32);
    EXPECT_EQ(trace.copies_on_copy_stream, 2 * batches);
    EXPECT_EQ(trace.waits_on_compute, batches);
    std::vector<int32_t> xv(24), yv(24);
    ASSERT_EQ(dt_tensor_to_host(x, xv.data(), 24 * 4), DT_OK);
    ASSERT_EQ(dt_tensor_to_host(y, yv.data(), 24 * 4), DT_OK);
    for (int r = 0; r < 3; r++) {
      firsts.insert(xv[8 * r]);
      for (int t = 0; t < 8; t++)
        EXPECT_EQ(yv[8 * r + t], xv[8 * r + t] + 1);
    }
    dt_tensor_release(x);
    dt_tensor_release(y);
  }
  EXPECT_EQ(batches, 4);
  EXPECT_EQ(firsts.size(), 12u);
  dt_token_loader_destroy(l);
  EXPECT_EQ(trace.host_frees, trace.host_allocs);
}

}  // namespace
