// The loader's asynchronous path (pinned slots, copy stream, events), driven
// through a stand-in device backend: the CPU table registered as device type
// CUDA, with page-locked memory and events that record what the loader does.
// It checks the protocol the real CUDA backend relies on, on any machine;
// tools/gpu_check.sh runs the real thing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/cpu.h"
#include "core/data.h"
#include "core/tensor.h"
#include "core/text.h"
#include "tests/stand_in_device.h"

namespace {

// The stand-in's timeline: the test "runs" kernels on the compute stream
// (UseOnCompute: position++, the buffers they read); an event records the
// position of its stream when recorded; the copy stream's fence is the
// highest compute position it has waited for. A copy into a buffer is safe
// when that fence covers the buffer's last use; it overlaps compute when
// the fence is below the current position (it need not wait for the step
// just queued).
struct Trace {
  int device_allocs = 0;
  int copies_on_copy_stream = 0, unsafe_copies = 0;
  int records = 0, waits_on_compute = 0, syncs = 0, syncs_on_caller = 0;
  long compute_pos = 0, copy_fence = 0;
  std::vector<long> lead;  // per copy: compute_pos - copy_fence at the copy
  std::map<const void *, long> last_use;
  std::thread::id caller;
} trace;

dt_stream *const kCompute = dtt::StandInStream(DT_STREAM_COMPUTE);
dt_stream *const kCopy = dtt::StandInStream(DT_STREAM_COPY);

void UseOnCompute(dt_tensor *t) { trace.last_use[dt_tensor_data(t)] = ++trace.compute_pos; }

// The stand-in's watch: what the loader asks of the device, checked and
// counted.
void Watch(const dtt::StandInCall &c) {
  dtt::StandInEvent *ev = c.event;
  switch (c.op) {
    case dtt::StandInOp::kAlloc: trace.device_allocs++; break;
    case dtt::StandInOp::kRecord:
      EXPECT_TRUE(c.stream == kCopy || c.stream == kCompute);
      ev->pos = c.stream == kCompute ? trace.compute_pos : 0;
      trace.records++;
      break;
    case dtt::StandInOp::kWait:
      EXPECT_TRUE(ev->recorded) << "a wait on an event never recorded orders nothing";
      if (c.stream == kCopy) {
        EXPECT_EQ(ev->stream, kCompute) << "the copy stream waits on compute events";
        trace.copy_fence = std::max(trace.copy_fence, ev->pos);
      } else {
        EXPECT_EQ(c.stream, kCompute);
        EXPECT_EQ(ev->stream, kCopy) << "the compute stream waits for the copy";
        trace.waits_on_compute++;
      }
      break;
    case dtt::StandInOp::kEventSync:
      trace.syncs++;
      if (std::this_thread::get_id() == trace.caller)
        trace.syncs_on_caller++;
      break;
    case dtt::StandInOp::kCopy:
      if (c.stream == kCopy) {
        EXPECT_TRUE(dtt::StandInIsPinned(c.src, c.bytes))
            << "async copies read from page-locked slots";
        trace.copies_on_copy_stream++;
        auto it = trace.last_use.find(c.dst);
        if (it != trace.last_use.end() && trace.copy_fence < it->second)
          trace.unsafe_copies++;  // compute queued before may still read dst
        trace.lead.push_back(trace.compute_pos - trace.copy_fence);
      }
      break;
    case dtt::StandInOp::kStreamSync: break;
  }
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
  fake = dtt::StandInAsyncOps("fake-async", Watch);
  ASSERT_EQ(dt_backend_register(DT_DEVICE_CUDA, &fake), DT_OK);
}

// The stand-in registered, a fresh trace, the caller's thread noted.
void StartTrace() {
  RegisterFakeDevice();
  trace = Trace();
  dtt::ResetStandInPinned();
  trace.caller = std::this_thread::get_id();
}

// A loader over Digits{n} in batches of `batch` on the stand-in device.
struct DigitsLoader {
  Digits digits;
  dt_dataset *d = nullptr;
  dt_sampler *s = nullptr;
  dt_loader *l = nullptr;
  DigitsLoader(int64_t n, int batch, int prefetch, int workers = 1) : digits{n} {
    int64_t shape[] = {2};
    EXPECT_EQ(dt_dataset_create(&kDigitsVt, &digits, shape, 1, 5, &d), DT_OK);
    dt_sampler_config sc = DT_SAMPLER_CONFIG_DEFAULT;
    sc.seed = 3;
    EXPECT_EQ(dt_sampler_create(n, &sc, &s), DT_OK);
    // batch_size, drop_last, prefetch, device, workers
    dt_loader_config lc = {batch, 0, prefetch, {DT_DEVICE_CUDA, 0}, workers};
    EXPECT_EQ(dt_loader_create(d, s, &lc, &l), DT_OK) << dt_last_error();
  }
  ~DigitsLoader() {
    dt_loader_destroy(l);
    dt_sampler_destroy(s);
    dt_dataset_destroy(d);
  }
};

// The training loop's pattern: next, `use` the batch, let go of it, until
// the epoch ends; returns the batches. Every batch: on the stand-in
// device, two copies (inputs, labels) on the copy stream, the compute
// stream waits for them; the caller's thread never waits (the worker
// does, before it refills a slot).
int DrainOnDevice(const std::function<dt_status(dt_tensor **, dt_tensor **)> &next,
                  const std::function<void(dt_tensor *, dt_tensor *)> &use) {
  int batches = 0;
  for (;;) {
    dt_tensor *x = nullptr, *y = nullptr;
    dt_status st = next(&x, &y);
    EXPECT_EQ(st, DT_OK) << dt_last_error();
    if (st != DT_OK || x == nullptr)
      return batches;
    batches++;
    EXPECT_EQ(dt_tensor_device(x).type, DT_DEVICE_CUDA);
    EXPECT_EQ(trace.copies_on_copy_stream, 2 * batches);
    EXPECT_EQ(trace.waits_on_compute, batches);
    EXPECT_EQ(trace.syncs_on_caller, 0);
    use(x, y);
    dt_tensor_release(x);
    dt_tensor_release(y);
  }
}

TEST(LoaderAsync, PinnedSlotsCopyStreamAndEvents) {
  StartTrace();
  auto dl = std::make_unique<DigitsLoader>(23, 4, 3);
  dt_loader *l = dl->l;
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(dtt::StandInPinned().allocs, 2 * 3) << "inputs and labels of each slot are page-locked";

  ASSERT_EQ(dt_loader_start_epoch(l, 0), DT_OK);
  std::vector<int> seen(23, 0);
  auto next = [l](dt_tensor **x, dt_tensor **y) { return dt_loader_next(l, x, y); };
  int batches = DrainOnDevice(next, [&seen](dt_tensor *x, dt_tensor *y) {
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
    UseOnCompute(x);  // the step's kernels read the batch...
    UseOnCompute(y);
    UseOnCompute(x);  // ...and the host lets go while they are queued
  });
  EXPECT_EQ(batches, 6);
  for (int c : seen)
    EXPECT_EQ(c, 1);
  EXPECT_EQ(trace.unsafe_copies, 0) << "a copy overwrote a buffer queued kernels still read";
  // Five full batches in two reused buffer pairs, the short last batch in
  // its own: 2 * 2 + 2 device allocations, not 2 per batch.
  EXPECT_EQ(trace.device_allocs, 2 * 2 + 2);
  // From the third batch on, the copy into a reused pair waits only for
  // the step that read it two batches ago, not for the step just queued.
  ASSERT_EQ(trace.lead.size(), 12u);
  for (size_t k = 4; k < 10; k++)
    EXPECT_GT(trace.lead[k], 0) << "copy " << k << " waited for all queued compute";
  dl.reset();
  EXPECT_EQ(dtt::StandInPinned().frees, dtt::StandInPinned().allocs);
  EXPECT_EQ(dtt::StandInPinned().live, 0);
}

// Several workers share the ring (max(prefetch, workers) pinned slots):
// every copy still goes through the copy stream without the caller
// waiting, no copy overwrites a buffer in use, and the batches are those
// of one worker, in the same order.
TEST(LoaderAsync, WorkersShareThePinnedRing) {
  std::vector<std::vector<float>> batches[2];
  for (int run = 0; run < 2; run++) {
    StartTrace();
    int workers = run == 0 ? 1 : 4;
    auto dl = std::make_unique<DigitsLoader>(37, 3, 2, workers);
    ASSERT_NE(dl->l, nullptr);
    EXPECT_EQ(dtt::StandInPinned().allocs, 2 * std::max(2, workers));
    for (int epoch = 0; epoch < 2; epoch++) {
      ASSERT_EQ(dt_loader_start_epoch(dl->l, epoch), DT_OK);
      trace.copies_on_copy_stream = trace.waits_on_compute = 0;
      auto next = [&dl](dt_tensor **x, dt_tensor **y) { return dt_loader_next(dl->l, x, y); };
      int n = DrainOnDevice(next, [&](dt_tensor *x, dt_tensor *) {
        std::vector<float> xv(dt_tensor_numel(x));
        ASSERT_EQ(dt_tensor_to_host(x, xv.data(), xv.size() * 4), DT_OK);
        batches[run].push_back(xv);
        UseOnCompute(x);
      });
      EXPECT_EQ(n, 13);
    }
    EXPECT_EQ(trace.unsafe_copies, 0);
    dl.reset();
    EXPECT_EQ(dtt::StandInPinned().live, 0);
  }
  EXPECT_EQ(batches[1], batches[0]);
}

// A caller that keeps its batches (or a view of them): the loader never
// writes into a buffer a tensor still refers to; each batch gets new
// buffers, fenced after all queued compute.
TEST(LoaderAsync, HeldBatchesAreNeverOverwritten) {
  StartTrace();
  DigitsLoader dl(24, 4, 2);
  dt_loader *l = dl.l;
  ASSERT_NE(l, nullptr);
  for (int epoch = 0; epoch < 2; epoch++) {
    ASSERT_EQ(dt_loader_start_epoch(l, epoch), DT_OK);
    std::vector<dt_tensor *> held;
    std::vector<std::vector<float>> first;
    for (;;) {
      dt_tensor *x, *y;
      ASSERT_EQ(dt_loader_next(l, &x, &y), DT_OK) << dt_last_error();
      if (x == nullptr)
        break;
      std::vector<float> xv(dt_tensor_numel(x));
      ASSERT_EQ(dt_tensor_to_host(x, xv.data(), xv.size() * 4), DT_OK);
      first.push_back(xv);
      UseOnCompute(x);
      dt_tensor *v = nullptr;  // a view keeps the storage as the tensor would
      int64_t flat[1] = {dt_tensor_numel(x)};
      ASSERT_EQ(dt_tensor_reshape(x, flat, 1, &v), DT_OK) << dt_last_error();
      held.push_back(epoch == 0 ? v : dt_tensor_retain(x));
      if (epoch == 1)
        dt_tensor_release(v);
      dt_tensor_release(x);
      dt_tensor_release(y);
    }
    ASSERT_EQ(held.size(), 6u);
    for (size_t b = 0; b < held.size(); b++) {
      std::vector<float> now(dt_tensor_numel(held[b]));
      ASSERT_EQ(dt_tensor_to_host(held[b], now.data(), now.size() * 4), DT_OK);
      EXPECT_EQ(now, first[b]) << "epoch " << epoch << " batch " << b << " was overwritten";
      dt_tensor_release(held[b]);
    }
  }
  EXPECT_EQ(trace.unsafe_copies, 0);
  EXPECT_EQ(trace.syncs_on_caller, 0);
}

// Token windows (i32 inputs and targets, core/text.h) take the same path:
// pinned slots, copies on the copy stream, the compute stream waits.
TEST(LoaderAsync, TokenWindowsTakeTheSamePath) {
  StartTrace();
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
  EXPECT_EQ(dtt::StandInPinned().allocs, 2 * c.prefetch);
  ASSERT_EQ(dt_token_loader_start_epoch(l, 0), DT_OK);
  std::set<int32_t> firsts;
  auto next = [l](dt_tensor **x, dt_tensor **y) { return dt_token_loader_next(l, x, y); };
  int batches = DrainOnDevice(next, [&firsts](dt_tensor *x, dt_tensor *y) {
    EXPECT_EQ(dt_tensor_dtype(x), DT_DTYPE_I32);
    EXPECT_EQ(dt_tensor_dtype(y), DT_DTYPE_I32);
    std::vector<int32_t> xv(24), yv(24);
    ASSERT_EQ(dt_tensor_to_host(x, xv.data(), 24 * 4), DT_OK);
    ASSERT_EQ(dt_tensor_to_host(y, yv.data(), 24 * 4), DT_OK);
    for (int r = 0; r < 3; r++) {
      firsts.insert(xv[8 * r]);
      for (int t = 0; t < 8; t++)
        EXPECT_EQ(yv[8 * r + t], xv[8 * r + t] + 1);
    }
  });
  EXPECT_EQ(batches, 4);
  EXPECT_EQ(firsts.size(), 12u);
  EXPECT_EQ(trace.unsafe_copies, 0);
  dt_token_loader_destroy(l);
  EXPECT_EQ(dtt::StandInPinned().frees, dtt::StandInPinned().allocs);
}

}  // namespace
