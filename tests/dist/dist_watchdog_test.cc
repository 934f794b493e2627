// The stream-backend watchdog (the NCCL path) when submission itself
// blocks: a transport whose enqueue hangs — as a launch queue full behind a
// stuck NCCL kernel would — holds the communicator's lock, and the watchdog
// must still name the blockage and end the job instead of waiting forever.
// Driven through a stand-in stream backend, so it runs without a GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/backend.h"
#include "core/tensor.h"
#include "dist/comm.h"
#include "dist/comm_internal.h"
#include "tests/stand_in_device.h"

namespace {

struct Fake {
  std::atomic<int> enqueue_entered{0};
  std::atomic<int> release_enqueue{0};
  std::atomic<int> abort_job_calls{0};
  std::atomic<int> abort_comm_calls{0};
  std::atomic<int> destroyed_broken{-1};
};

dt_status FakeEnqueue(void *impl, dt_work *) {
  auto *f = static_cast<Fake *>(impl);
  f->enqueue_entered = 1;
  while (!f->release_enqueue)  // the blocked transport
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return DT_OK;
}
dt_status FakeQuery(void *, dt_work *, int *done) {
  *done = 1;
  return DT_OK;
}
dt_status FakeCheckAsync(void *) { return DT_OK; }
void FakeAbortComm(void *impl) { static_cast<Fake *>(impl)->abort_comm_calls++; }
void FakeAbortJob(void *impl, int code) {
  EXPECT_EQ(code, DT_COMM_WATCHDOG_EXIT_CODE);
  auto *f = static_cast<Fake *>(impl);
  // A real backend ends the job here; the stand-in records the call and
  // lets the transport go so the test can finish.
  f->abort_job_calls++;
  f->release_enqueue = 1;
}
void FakeDestroy(void *impl, int broken) { static_cast<Fake *>(impl)->destroyed_broken = broken; }

const dt_comm_backend *FakeBackend() {
  static dt_comm_backend be = {};
  be.name = "fake-stream";
  be.abort_job = FakeAbortJob;
  be.destroy = FakeDestroy;
  be.enqueue = FakeEnqueue;
  be.query = FakeQuery;
  be.check_async = FakeCheckAsync;
  be.abort_comm = FakeAbortComm;
  return &be;
}

TEST(CommWatchdog, BlockedEnqueueEndsTheJobInsteadOfHanging) {
  static Fake fake;
  const dt_comm_backend &be = *FakeBackend();
  dt_comm_config cfg = DT_COMM_CONFIG_DEFAULT;
  cfg.timeout_s = 0.3;
  dt_comm *c = nullptr;
  ASSERT_EQ(dt_comm_create_with_backend(&be, &fake, 0, 1, "rank 0", &cfg, &c), DT_OK)
      << dt_last_error();
  // First a collective completes normally (the watchdog's loop is running).
  dt_work *w = nullptr;
  fake.release_enqueue = 1;
  ASSERT_EQ(dt_comm_barrier(c, nullptr, &w), DT_OK) << dt_last_error();
  EXPECT_EQ(dt_work_wait(w, 5.0), DT_OK) << dt_last_error();
  dt_work_release(w);
  // Now the transport blocks inside enqueue, holding the communicator.
  fake.release_enqueue = 0;
  testing::internal::CaptureStderr();
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(dt_comm_barrier(c, nullptr, &w), DT_OK) << dt_last_error();
  double blocked = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(fake.abort_job_calls.load(), 1) << "the watchdog ended the job";
  EXPECT_LT(blocked, 5.0) << "released by the watchdog's abort, well within the test";
  EXPECT_NE(err.find("submitting collective #2"), std::string::npos) << err;
  EXPECT_NE(err.find("blocked the host for more than 0.3 s"), std::string::npos) << err;
  EXPECT_EQ(dt_work_wait(w, 5.0), DT_OK) << dt_last_error();
  dt_work_release(w);
  dt_comm_destroy(c);
}

// Error paths: dt_comm_abort aborts the transport at once (nccl:
// ncclCommAbort) and breaks the communicator, so later collectives fail
// instead of pairing wrongly, and the destroy that follows is told the
// transport may be stuck (nccl: never ncclCommDestroy, which can block on
// dead peers). On a host backend later collectives fail alike.
TEST(CommWatchdog, AbortOnAnErrorPathBreaksTheCommunicatorAndAbortsTheTransport) {
  static Fake fake;
  fake.release_enqueue = 1;
  dt_comm *c = nullptr;
  ASSERT_EQ(dt_comm_create_with_backend(FakeBackend(), &fake, 0, 1, "rank 0", nullptr, &c), DT_OK)
      << dt_last_error();
  dt_comm_abort(c, "the test failed on purpose");
  dt_comm_abort(c, "twice");
  EXPECT_EQ(fake.abort_comm_calls.load(), 2)
      << "each call reaches the transport (it is idempotent)";
  EXPECT_TRUE(dt_comm_is_broken(c));
  dt_work *w = nullptr;
  EXPECT_EQ(dt_comm_barrier(c, nullptr, &w), DT_ERR_STATE);
  EXPECT_NE(std::string(dt_last_error()).find("aborted on rank 0: the test failed on purpose"),
            std::string::npos)
      << dt_last_error();
  dt_comm_destroy(c);
  EXPECT_EQ(fake.destroyed_broken.load(), 1);
  dt_comm_abort(nullptr, "no-op");

  dt_local_group *g = nullptr;
  ASSERT_EQ(dt_local_group_create(1, &g), DT_OK);
  ASSERT_EQ(dt_comm_create_local(g, 0, nullptr, &c), DT_OK) << dt_last_error();
  dt_local_group_release(g);
  dt_comm_abort(c, "a data error");
  float v = 1;
  int64_t n = 1;
  dt_tensor *t = nullptr;
  ASSERT_EQ(dt_tensor_from_host(&v, &n, 1, DT_DTYPE_F32, DT_CPU, &t), DT_OK);
  EXPECT_EQ(dt_comm_allreduce(c, t, DT_REDUCE_SUM, nullptr, &w), DT_ERR_STATE);
  dt_tensor_release(t);
  dt_comm_destroy(c);
}

// A device whose streams never reach their events (a hung kernel): a
// collective of its tensors, host-staged over the local communicator,
// gives up at the deadline waiting for the device, says so, and fails
// instead of blocking the communication thread in event_synchronize.
std::atomic<int> g_queries{0};
dt_status StuckQuery(dt_event *, int *done) {
  g_queries++;
  *done = 0;
  return DT_OK;
}
dt_status StuckSynchronize(dt_event *) {
  ADD_FAILURE() << "event_synchronize on a stuck device blocks for ever";
  return DT_OK;
}

TEST(CommWatchdog, StuckDeviceFailsTheCollectiveAtTheDeadline) {
  static dt_backend_ops ops = dtt::StandInDeviceOps("stuck-device");
  ops.event_query = StuckQuery;
  ops.event_synchronize = StuckSynchronize;
  ASSERT_EQ(dt_backend_register(DT_DEVICE_CUDA, &ops), DT_OK) << dt_last_error();
  const dt_device dev = {DT_DEVICE_CUDA, 0};
  dt_local_group *g = nullptr;
  ASSERT_EQ(dt_local_group_create(1, &g), DT_OK);
  dt_comm_config cfg = DT_COMM_CONFIG_DEFAULT;
  cfg.timeout_s = 0.3;
  cfg.abort_on_timeout = 0;
  dt_comm *c = nullptr;
  ASSERT_EQ(dt_comm_create_local(g, 0, &cfg, &c), DT_OK) << dt_last_error();
  dt_local_group_release(g);
  float v[4] = {1, 2, 3, 4};
  int64_t n = 4;
  dt_tensor *t = nullptr;
  ASSERT_EQ(dt_tensor_from_host(v, &n, 1, DT_DTYPE_F32, dev, &t), DT_OK) << dt_last_error();
  testing::internal::CaptureStderr();
  auto t0 = std::chrono::steady_clock::now();
  dt_work *w = nullptr;
  ASSERT_EQ(dt_comm_allreduce(c, t, DT_REDUCE_SUM, nullptr, &w), DT_OK) << dt_last_error();
  dt_status st = dt_work_wait(w, 30.0);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(st, DT_ERR_TIMEOUT) << dt_last_error();
  EXPECT_NE(std::string(dt_last_error()).find("was not ready on the device within 0.3 s"),
            std::string::npos)
      << dt_last_error();
  EXPECT_NE(err.find("collective #1 (allreduce, 16 bytes"), std::string::npos) << err;
  EXPECT_NE(err.find("was not ready on the device"), std::string::npos) << err;
  EXPECT_GT(g_queries.load(), 0) << "the wait polled the event";
  EXPECT_LT(took, 20.0) << "failed at the deadline, not when the test gave up";
  EXPECT_TRUE(dt_comm_is_broken(c));
  dt_work_release(w);
  dt_tensor_release(t);  // the work kept its reference (the device may still write)
  dt_comm_destroy(c);
}

}  // namespace
