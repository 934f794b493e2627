// The CUDA caching allocator. The block pool (cuda/block_pool.c) runs here
// over a fake raw allocator, so reuse, per-stream caching, splitting,
// merging, statistics and cap -> OOM -> recovery are tested without a GPU.
// The tests on a real GPU skip, with the reason, when none is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/memory.h"
#include "core/rng.h"
#include "core/status.h"
#include "cuda/block_pool.h"
#include "cuda/cuda.h"
#include "tests/device_util.h"

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

// Hands out addresses (never dereferenced) from a counter, up to `capacity`
// bytes outstanding; DT_ERR_OOM beyond it.
struct FakeRaw {
  uintptr_t next = 0x100000000ull;
  size_t capacity = SIZE_MAX;
  size_t outstanding = 0;
  int allocs = 0, frees = 0, failures = 0;
  std::map<uintptr_t, size_t> live;

  static dt_status Alloc(void *ctx, size_t bytes, void **out) {
    FakeRaw *f = static_cast<FakeRaw *>(ctx);
    if (bytes > f->capacity - f->outstanding) {
      f->failures++;
      return DT_ERR_OOM;
    }
    *out = reinterpret_cast<void *>(f->next);
    f->live[f->next] = bytes;
    f->next += bytes + 4096;  // a gap: segments are never adjacent
    f->outstanding += bytes;
    f->allocs++;
    return DT_OK;
  }
  static void Free(void *ctx, void *ptr, size_t bytes) {
    FakeRaw *f = static_cast<FakeRaw *>(ctx);
    auto it = f->live.find(reinterpret_cast<uintptr_t>(ptr));
    ASSERT_NE(it, f->live.end()) << "raw free of a pointer the fake never gave out";
    EXPECT_EQ(it->second, bytes) << "raw free with a different size";
    f->outstanding -= it->second;
    f->live.erase(it);
    f->frees++;
  }
};

class BlockPoolTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(0); }
  void TearDown() override {
    dt_block_pool_destroy(pool_);
    EXPECT_EQ(raw_.outstanding, 0u) << "destroy must return every segment";
  }
  void Make(size_t limit) {
    dt_block_pool_config cfg = DT_BLOCK_POOL_CONFIG_DEFAULT;
    cfg.device_name = "cuda:7";
    cfg.capacity = 80 * MiB;
    cfg.limit = limit;
    dt_raw_allocator raw = {&raw_, FakeRaw::Alloc, FakeRaw::Free};
    ASSERT_EQ(DT_OK, dt_block_pool_create(&cfg, raw, &pool_)) << dt_last_error();
  }
  void *Alloc(size_t bytes, uintptr_t stream = 1) {
    void *p = nullptr;
    EXPECT_EQ(DT_OK, dt_block_pool_alloc(pool_, bytes, stream, &p)) << dt_last_error();
    return p;
  }
  void Free(void *p) { EXPECT_EQ(DT_OK, dt_block_pool_free(pool_, p)) << dt_last_error(); }
  dt_memory_stats Stats() {
    dt_memory_stats s;
    dt_block_pool_stats(pool_, &s);
    return s;
  }
  dt_block_pool_info Info() {
    dt_block_pool_info i;
    dt_block_pool_get_info(pool_, &i);
    return i;
  }
  static uintptr_t U(void *p) { return reinterpret_cast<uintptr_t>(p); }

  FakeRaw raw_;
  dt_block_pool *pool_ = nullptr;
};

TEST_F(BlockPoolTest, RoundsTo512Bytes) {
  void *a = Alloc(1), *b = Alloc(513), *c = Alloc(0);
  EXPECT_EQ(dt_block_pool_block_size(pool_, a), 512u);
  EXPECT_EQ(dt_block_pool_block_size(pool_, b), 1024u);
  EXPECT_EQ(dt_block_pool_block_size(pool_, c), 512u);
  EXPECT_EQ(Stats().allocated, 2048u);
  Free(a);
  Free(b);
  Free(c);
}

TEST_F(BlockPoolTest, ReusesFreedBlockWithoutNewSegment) {
  void *a = Alloc(1000);
  Free(a);
  void *b = Alloc(900);
  EXPECT_EQ(a, b);
  EXPECT_EQ(raw_.allocs, 1);
  Free(b);
}

TEST_F(BlockPoolTest, SmallRequestsShareOneSegmentBySplitting) {
  void *a = Alloc(512), *b = Alloc(512), *c = Alloc(100 * KiB);
  EXPECT_EQ(U(b), U(a) + 512);
  EXPECT_EQ(U(c), U(b) + 512);
  EXPECT_EQ(raw_.allocs, 1);
  EXPECT_EQ(Stats().reserved, 2 * MiB);  // one small segment
  Free(a);
  Free(b);
  Free(c);
}

TEST_F(BlockPoolTest, CachedBlocksAreReusedOnlyOnTheirStream) {
  void *a = Alloc(4096, /*stream=*/1);
  Free(a);
  void *b = Alloc(4096, /*stream=*/2);
  EXPECT_NE(a, b);
  EXPECT_EQ(raw_.allocs, 2);
  void *c = Alloc(4096, /*stream=*/1);
  EXPECT_EQ(a, c);
  Free(b);
  Free(c);
}

TEST_F(BlockPoolTest, FreedNeighboursMerge) {
  void *a = Alloc(512 * KiB), *b = Alloc(512 * KiB), *c = Alloc(512 * KiB);
  EXPECT_EQ(raw_.allocs, 1);
  Free(a);
  Free(b);
  // a and b merged into one 1 MiB block at a: a 1 MiB request fits there.
  void *d = Alloc(1 * MiB);
  EXPECT_EQ(d, a);
  EXPECT_EQ(raw_.allocs, 1);
  Free(d);
  Free(c);
  // Everything free again: a single block spans the segment.
  EXPECT_EQ(Info().free_blocks, 1u);
  EXPECT_EQ(Info().live_blocks, 0u);
}

TEST_F(BlockPoolTest, LargeRequestsUseLargeSegments) {
  void *a = Alloc(5 * MiB);  // < 10 MiB: carved from a 20 MiB segment
  void *b = Alloc(5 * MiB);
  EXPECT_EQ(U(b), U(a) + 5 * MiB);
  EXPECT_EQ(raw_.allocs, 1);
  EXPECT_EQ(Stats().reserved, 20 * MiB);
  void *c = Alloc(12 * MiB + 1);  // >= 10 MiB: its own segment, rounded to 2 MiB
  EXPECT_EQ(raw_.allocs, 2);
  EXPECT_EQ(Stats().reserved, 20 * MiB + 14 * MiB);
  Free(a);
  Free(b);
  Free(c);
}

TEST_F(BlockPoolTest, StatisticsAndPeakReset) {
  void *a = Alloc(1 * MiB), *b = Alloc(3 * MiB);
  dt_memory_stats s = Stats();
  EXPECT_EQ(s.allocated, 4 * MiB);
  EXPECT_EQ(s.peak_allocated, 4 * MiB);
  EXPECT_EQ(s.num_allocs, 2u);
  EXPECT_EQ(s.num_ooms, 0u);
  EXPECT_EQ(s.capacity, 80 * MiB);
  EXPECT_GE(s.reserved, s.allocated);
  Free(b);
  s = Stats();
  EXPECT_EQ(s.allocated, 1 * MiB);
  EXPECT_EQ(s.peak_allocated, 4 * MiB);
  dt_block_pool_reset_peak(pool_);
  EXPECT_EQ(Stats().peak_allocated, 1 * MiB);
  Free(a);
  dt_block_pool_empty_cache(pool_);
  s = Stats();
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(s.reserved, 0u);
  EXPECT_EQ(raw_.outstanding, 0u);
}

TEST_F(BlockPoolTest, EmptyCacheKeepsSegmentsWithLiveBlocks) {
  void *a = Alloc(512), *b = Alloc(6 * MiB);
  void *c = Alloc(20 * MiB);
  Free(b);
  Free(c);
  dt_block_pool_empty_cache(pool_);
  EXPECT_EQ(Stats().reserved, 2 * MiB);  // only the small segment holding a
  EXPECT_EQ(Info().segments, 1u);
  Free(a);
}

TEST_F(BlockPoolTest, CapGivesOomWithNumbersAndAdvice) {
  dt_block_pool_destroy(pool_);
  Make(4 * MiB);
  void *a = Alloc(3 * MiB);  // under the cap as an exact segment
  ASSERT_NE(a, nullptr);
  void *b = nullptr;
  ASSERT_EQ(DT_ERR_OOM, dt_block_pool_alloc(pool_, 2 * MiB, 1, &b));
  EXPECT_EQ(b, nullptr);
  std::string msg = dt_last_error();
  EXPECT_NE(msg.find("CUDA out of memory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2.00 MiB"), std::string::npos) << msg;   // requested
  EXPECT_NE(msg.find("cuda:7"), std::string::npos) << msg;     // device
  EXPECT_NE(msg.find("80.00 MiB"), std::string::npos) << msg;  // capacity
  EXPECT_NE(msg.find("3.00 MiB allocated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("reserved by dtrain but unused"), std::string::npos) << msg;
  EXPECT_NE(msg.find("DT_CUDA_MEMORY_LIMIT"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--accum"), std::string::npos) << msg;
  EXPECT_NE(msg.find("micro-batch"), std::string::npos) << msg;
  EXPECT_EQ(Stats().num_ooms, 1u);

  // Recovery: the live block goes back to the cache, the cache is emptied,
  // and the same request succeeds (on another stream: no cached block fits).
  Free(a);
  dt_block_pool_empty_cache(pool_);
  EXPECT_EQ(Stats().reserved, 0u);
  void *c = Alloc(3 * MiB + 512 * KiB, 2);
  EXPECT_NE(c, nullptr);
  Free(c);
}

TEST_F(BlockPoolTest, FullDeviceReleasesCacheAndRetries) {
  raw_.capacity = 24 * MiB;
  void *a = Alloc(5 * MiB, 1);  // 20 MiB segment on stream 1
  Free(a);                      // cached, 20 MiB reserved
  void *b = Alloc(8 * MiB, 2);  // stream 2 needs a new 20 MiB segment: the device is full
  EXPECT_NE(b, nullptr);
  EXPECT_GE(raw_.failures, 1);  // the first attempt failed...
  EXPECT_EQ(raw_.frees, 1);     // ...so the cached segment was released, then it worked
  EXPECT_EQ(Stats().num_ooms, 0u);
  Free(b);
}

// A raw allocator whose free would wait for the device (the cudaFree
// fallback) keeps its segments while the device has work queued: the
// retry then fails with a message that says why, and releases once the
// device is idle.
int busy_device = 0;
int Releasable(void *) { return !busy_device; }

TEST_F(BlockPoolTest, SegmentsStayWhileReleasingWouldWaitForTheDevice) {
  dt_block_pool_destroy(pool_);
  dt_block_pool_config cfg = DT_BLOCK_POOL_CONFIG_DEFAULT;
  cfg.device_name = "cuda:7";
  dt_raw_allocator raw = {&raw_, FakeRaw::Alloc, FakeRaw::Free, Releasable};
  ASSERT_EQ(DT_OK, dt_block_pool_create(&cfg, raw, &pool_)) << dt_last_error();
  raw_.capacity = 24 * MiB;
  Free(Alloc(5 * MiB, 1));  // a cached 20 MiB segment
  busy_device = 1;
  void *b = nullptr;
  EXPECT_EQ(DT_ERR_OOM, dt_block_pool_alloc(pool_, 8 * MiB, 2, &b));
  std::string msg = dt_last_error();
  EXPECT_NE(msg.find("cached segments were kept"), std::string::npos) << msg;
  EXPECT_EQ(raw_.frees, 0);
  EXPECT_EQ(dt_block_pool_empty_cache(pool_), 0);
  EXPECT_EQ(raw_.frees, 0);
  busy_device = 0;
  b = Alloc(8 * MiB, 2);  // idle: the retry releases the cached segment
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(raw_.frees, 1);
  Free(b);
  EXPECT_EQ(dt_block_pool_empty_cache(pool_), 1);
}

TEST_F(BlockPoolTest, RawAllocatorFailureAfterRetryIsOom) {
  raw_.capacity = 1 * MiB;
  void *p = nullptr;
  EXPECT_EQ(DT_ERR_OOM, dt_block_pool_alloc(pool_, 4 * MiB, 1, &p));
  EXPECT_NE(std::string(dt_last_error()).find("out of memory"), std::string::npos);
  EXPECT_EQ(Stats().num_ooms, 1u);
}

TEST_F(BlockPoolTest, FreeOfUnknownPointerIsAnErrorAndChangesNothing) {
  void *a = Alloc(1024);
  Free(a);
  EXPECT_EQ(DT_ERR_INVALID_ARG, dt_block_pool_free(pool_, a));  // double free
  EXPECT_NE(std::string(dt_last_error()).find("not a live block"), std::string::npos);
  int x;
  EXPECT_EQ(DT_ERR_INVALID_ARG, dt_block_pool_free(pool_, &x));
  EXPECT_EQ(DT_OK, dt_block_pool_free(pool_, nullptr));
  EXPECT_EQ(Stats().allocated, 0u);
}

// Random allocations and frees over several streams: live blocks never
// overlap, `allocated` is the sum of live block sizes, and freeing
// everything then emptying the cache returns every byte.
TEST_F(BlockPoolTest, RandomWorkloadKeepsInvariants) {
  struct Live {
    uintptr_t p;
    size_t size;
  };
  std::vector<Live> live;
  for (uint64_t step = 0; step < 4000; step++) {
    bool do_free = !live.empty() && dt_rng_uniform(99, 3 * step) < 0.45f;
    if (do_free) {
      size_t i = dt_rng_bits(99, 3 * step + 1) % live.size();
      Free(reinterpret_cast<void *>(live[i].p));
      live[i] = live.back();
      live.pop_back();
    } else {
      // sizes from 1 byte to ~24 MiB, mostly small
      float u = dt_rng_uniform(99, 3 * step + 1);
      size_t bytes = u < 0.7f    ? 1 + dt_rng_bits(7, step) % (256 * KiB)
                     : u < 0.95f ? 1 + dt_rng_bits(8, step) % (4 * MiB)
                                 : 1 + dt_rng_bits(9, step) % (24 * MiB);
      uintptr_t stream = 1 + dt_rng_bits(99, 3 * step + 2) % 3;
      void *p = Alloc(bytes, stream);
      ASSERT_NE(p, nullptr);
      size_t size = dt_block_pool_block_size(pool_, p);
      ASSERT_GE(size, bytes);
      live.push_back({reinterpret_cast<uintptr_t>(p), size});
    }
    if (step % 97 == 0) {
      std::vector<Live> sorted = live;
      std::sort(sorted.begin(), sorted.end(),
                [](const Live &a, const Live &b) { return a.p < b.p; });
      size_t sum = 0;
      for (size_t i = 0; i < sorted.size(); i++) {
        sum += sorted[i].size;
        if (i) {
          ASSERT_LE(sorted[i - 1].p + sorted[i - 1].size, sorted[i].p) << "overlapping blocks";
        }
      }
      dt_memory_stats s = Stats();
      ASSERT_EQ(s.allocated, sum);
      ASSERT_GE(s.reserved, s.allocated);
      ASSERT_EQ(s.reserved, raw_.outstanding);
      if (step % 970 == 0)
        dt_block_pool_empty_cache(pool_);
    }
  }
  for (const Live &l : live)
    Free(reinterpret_cast<void *>(l.p));
  dt_block_pool_empty_cache(pool_);
  EXPECT_EQ(Stats().allocated, 0u);
  EXPECT_EQ(Stats().reserved, 0u);
  EXPECT_EQ(raw_.outstanding, 0u);
}

// ---- without a GPU: the failure is clear ----

TEST(CudaAvailability, RequestingAMissingGpuFailsWithAClearMessage) {
  const dt_backend_ops *ops = nullptr;
  dt_status s = dt_backend_get({DT_DEVICE_CUDA, 0}, &ops);
  if (s == DT_OK)
    GTEST_SKIP() << "a CUDA device is present; this test checks the no-GPU path";
  std::string msg = dt_last_error();
  EXPECT_TRUE(s == DT_ERR_NO_DEVICE || s == DT_ERR_UNSUPPORTED || s == DT_ERR_VERSION)
      << dt_status_name(s);
  EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--device cpu"), std::string::npos) << msg;
  // The probe says why (no driver, old driver, no device, not built).
  dt_status p = dt_cuda_probe();
  EXPECT_NE(p, DT_OK);
  EXPECT_GT(std::strlen(dt_last_error()), 20u);
  std::fprintf(stderr, "no CUDA device: %s\n", dt_last_error());
}

TEST(CudaAvailability, DoctorReportsWithoutAGpu) {
  char *buf = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ASSERT_NE(f, nullptr);
  int problems = -1;
  EXPECT_EQ(DT_OK, dt_cuda_doctor(f, &problems)) << dt_last_error();
  std::fclose(f);
  std::string report(buf, len);
  std::free(buf);
  EXPECT_NE(report.find("CUDA"), std::string::npos);
  EXPECT_NE(report.find("summary"), std::string::npos) << report;
  EXPECT_GE(problems, 0);
  if (dt_cuda_probe() != DT_OK) {
    EXPECT_GE(problems, 1) << report;
  }
  std::fprintf(stderr, "%s", report.c_str());
}

// ---- on a GPU ----

const dt_device kGpu = {DT_DEVICE_CUDA, 0};

// cuda:0's backend (the test skips, saying why, without a GPU), its cache
// emptied, and its statistics before the test in s0.
class CudaAllocatorGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason = dtt::NoDeviceReason(kGpu);
    if (!reason.empty())
      GTEST_SKIP() << "no CUDA device: " << reason;
    ASSERT_EQ(DT_OK, dt_backend_get(kGpu, &ops));
    ASSERT_EQ(DT_OK, dt_empty_cache(kGpu));
    ASSERT_EQ(DT_OK, dt_memory_stats_get(kGpu, &s0));
  }
  const dt_backend_ops *ops = nullptr;
  dt_memory_stats s0{};
};

TEST_F(CudaAllocatorGpu, StatsReuseAndEmptyCache) {
  void *a = nullptr;
  ASSERT_EQ(DT_OK, ops->alloc(kGpu, 3 * MiB, &a)) << dt_last_error();
  dt_memory_stats s1;
  ASSERT_EQ(DT_OK, dt_memory_stats_get(kGpu, &s1));
  EXPECT_EQ(s1.allocated, s0.allocated + 3 * MiB);
  EXPECT_GT(s1.capacity, 0u);
  EXPECT_EQ(s1.num_allocs, s0.num_allocs + 1);
  ops->free(kGpu, a, 3 * MiB);
  void *b = nullptr;
  ASSERT_EQ(DT_OK, ops->alloc(kGpu, 3 * MiB, &b));
  EXPECT_EQ(a, b);  // reused from the cache
  ops->free(kGpu, b, 3 * MiB);
  ASSERT_EQ(DT_OK, dt_empty_cache(kGpu));
  dt_memory_stats s2;
  ASSERT_EQ(DT_OK, dt_memory_stats_get(kGpu, &s2));
  EXPECT_EQ(s2.reserved, s0.reserved);
}

TEST_F(CudaAllocatorGpu, CapOomAndRecovery) {
  ASSERT_EQ(DT_OK, dt_cuda_set_memory_limit(0, s0.reserved + 64 * MiB));
  void *a = nullptr, *b = nullptr;
  ASSERT_EQ(DT_OK, ops->alloc(kGpu, 48 * MiB, &a)) << dt_last_error();
  EXPECT_EQ(DT_ERR_OOM, ops->alloc(kGpu, 32 * MiB, &b));
  std::string msg = dt_last_error();
  EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--accum"), std::string::npos) << msg;
  // the cap's source: dt_cuda_set_memory_limit (dtrain's --max-memory), not the variable
  EXPECT_NE(msg.find("from the program (--max-memory)"), std::string::npos) << msg;
  ops->free(kGpu, a, 48 * MiB);
  ASSERT_EQ(DT_OK, dt_empty_cache(kGpu));
  EXPECT_EQ(DT_OK, ops->alloc(kGpu, 32 * MiB, &b)) << dt_last_error();
  ops->free(kGpu, b, 32 * MiB);
  ASSERT_EQ(DT_OK, dt_cuda_set_memory_limit(0, 0));
  dt_memory_stats s1;
  ASSERT_EQ(DT_OK, dt_memory_stats_get(kGpu, &s1));
  EXPECT_GE(s1.num_ooms, s0.num_ooms + 1);
}

// Issue 10, item 8: the OOM retry releases cached segments without waiting
// for the device. The comm stream is kept busy behind about a second of
// queued compute (as a collective waiting for its peers keeps it); an
// allocation over the cap must release the cache and succeed while that
// work is still queued. cudaFree would have waited for all of it (and in
// dp mode, for a collective that can wait on this very thread).
TEST_F(CudaAllocatorGpu, OomRetryNeverWaitsForQueuedWork) {
  dt_exec ex;
  ASSERT_EQ(DT_OK, dt_exec_init(kGpu, DT_DTYPE_F32, &ex));
  void *cached = nullptr, *a = nullptr, *c = nullptr;
  const int g = 4096;
  const size_t gb = (size_t)g * g * sizeof(float);
  ASSERT_EQ(DT_OK, ops->alloc(kGpu, gb, &a));
  ASSERT_EQ(DT_OK, ops->alloc(kGpu, gb, &c));
  ASSERT_EQ(DT_OK, ops->alloc(kGpu, 64 * MiB, &cached)) << dt_last_error();
  ops->free(kGpu, cached, 64 * MiB);  // a cached segment
  ASSERT_EQ(DT_OK, dt_kernel_fill(&ex, (float *)a, 1e-3f, (int64_t)g * g));
  dt_cuda_set_tf32(0);
  for (int r = 0; r < 300; r++)  // ~3 ms each in f32 on a current GPU
    ASSERT_EQ(DT_OK, dt_kernel_gemm(&ex, false, false, g, g, g, 1.0f, (const float *)a, g, 0,
                                    (const float *)a, g, 0, 0.0f, (float *)c, g, 0, 1));
  dt_cuda_mark *queued_end = nullptr;
  ASSERT_EQ(DT_OK, dt_cuda_mark_create(kGpu, &queued_end));
  dt_stream *compute = ops->stream(kGpu, DT_STREAM_COMPUTE);
  dt_stream *comm = ops->stream(kGpu, DT_STREAM_COMM);
  ASSERT_EQ(DT_OK, dt_cuda_mark_record(queued_end, compute));
  dt_event *ev = nullptr;
  ASSERT_EQ(DT_OK, ops->event_create(kGpu, &ev));
  ASSERT_EQ(DT_OK, ops->event_record(ev, compute));
  ASSERT_EQ(DT_OK, ops->stream_wait_event(comm, ev));  // the comm stream is busy

  dt_memory_stats now;
  ASSERT_EQ(DT_OK, dt_memory_stats_get(kGpu, &now));
  ASSERT_EQ(DT_OK, dt_cuda_set_memory_limit(0, now.reserved + 16 * MiB));
  void *b = nullptr;
  dt_status st = ops->alloc(kGpu, 72 * MiB, &b);  // only fits once the cache is released
  std::string msg = st == DT_OK ? "" : dt_last_error();
  int done = 1;
  ASSERT_EQ(DT_OK, dt_cuda_mark_query(queued_end, &done));
  if (dt_cuda_stream_ordered_memory(0)) {
    EXPECT_EQ(st, DT_OK) << msg;
    EXPECT_EQ(done, 0) << "the allocation waited for the queued work";
  } else {  // the cudaFree fallback keeps the cache while work is queued
    EXPECT_EQ(st, DT_ERR_OOM);
    EXPECT_NE(msg.find("cached segments were kept"), std::string::npos) << msg;
  }
  ASSERT_EQ(DT_OK, ops->device_synchronize(kGpu));
  dt_cuda_set_tf32(1);
  ASSERT_EQ(DT_OK, dt_cuda_set_memory_limit(0, 0));
  if (b)
    ops->free(kGpu, b, 72 * MiB);
  ops->free(kGpu, c, gb);
  ops->free(kGpu, a, gb);
  ops->event_destroy(ev);
  dt_cuda_mark_destroy(queued_end);
  std::printf(
      "allocator: stream-ordered segments %s; the OOM retry returned with the queued "
      "work %s\n",
      dt_cuda_stream_ordered_memory(0) ? "yes" : "no (cudaFree fallback)",
      done ? "finished" : "still running");
}

TEST_F(CudaAllocatorGpu, PinnedMemoryIsCachedAndCopiesAsync) {
  const size_t n = 1 << 20;
  float *h = nullptr, *back = nullptr;
  ASSERT_EQ(DT_OK, dt_cuda_pinned_alloc(n * sizeof(float), (void **)&h)) << dt_last_error();
  ASSERT_EQ(DT_OK, dt_cuda_pinned_alloc(n * sizeof(float), (void **)&back));
  for (size_t i = 0; i < n; i++)
    h[i] = (float)i;
  void *d = nullptr;
  ASSERT_EQ(DT_OK, ops->alloc(kGpu, n * sizeof(float), &d));
  dt_stream *copy = ops->stream(kGpu, DT_STREAM_COPY);
  dt_stream *compute = ops->stream(kGpu, DT_STREAM_COMPUTE);
  ASSERT_NE(copy, nullptr);
  ASSERT_NE(copy, compute);
  dt_event *ev = nullptr;
  ASSERT_EQ(DT_OK, ops->event_create(kGpu, &ev));
  // host -> device on the copy stream; the compute stream waits on an event
  // and scales the data; the result comes back synchronously.
  ASSERT_EQ(DT_OK, ops->copy(d, kGpu, h, DT_CPU, n * sizeof(float), copy));
  ASSERT_EQ(DT_OK, ops->event_record(ev, copy));
  ASSERT_EQ(DT_OK, ops->stream_wait_event(compute, ev));
  dt_exec ex;
  ASSERT_EQ(DT_OK, dt_exec_init(kGpu, DT_DTYPE_F32, &ex));
  ASSERT_EQ(DT_OK, dt_kernel_axpby(&ex, (int64_t)n, 2.0f, (const float *)d, 0.0f, (float *)d));
  ASSERT_EQ(DT_OK, ops->copy(back, DT_CPU, d, kGpu, n * sizeof(float), nullptr));
  for (size_t i = 0; i < n; i += 4099)
    ASSERT_EQ(back[i], 2.0f * (float)i) << i;
  ops->event_destroy(ev);
  ops->free(kGpu, d, n * sizeof(float));
  dt_cuda_pinned_free(h);
  void *again = nullptr;
  ASSERT_EQ(DT_OK, dt_cuda_pinned_alloc(n * sizeof(float), &again));
  EXPECT_EQ(again, (void *)h);  // cached
  dt_cuda_pinned_free(again);
  dt_cuda_pinned_free(back);
  dt_memory_stats ps;
  ASSERT_EQ(DT_OK, dt_cuda_pinned_stats(&ps));
  EXPECT_EQ(ps.allocated, 0u);
}

}  // namespace
