// The stream-backend watchdog (the NCCL path) when submission itself
// blocks: a transport whose enqueue hangs — as a launch queue full behind a
// stuck NCCL kernel would — holds the communicator's lock, and the watchdog
// must still name the blockage and end the job instead of waiting forever.
// Driven through a stand-in stream backend, so it runs without a GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "dist/comm.h"
#include "dist/comm_internal.h"

namespace {

struct Fake {
  std::atomic<int> enqueue_entered{0};
  std::atomic<int> release_enqueue{0};
  std::atomic<int> abort_job_calls{0};
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
void FakeAbortComm(void *) {}
void FakeAbortJob(void *impl, int code) {
  EXPECT_EQ(code, DT_COMM_WATCHDOG_EXIT_CODE);
  auto *f = static_cast<Fake *>(impl);
  // A real backend ends the job here; the stand-in records the call and
  // lets the transport go so the test can finish.
  f->abort_job_calls++;
  f->release_enqueue = 1;
}
void FakeDestroy(void *, int) {}

TEST(CommWatchdog, BlockedEnqueueEndsTheJobInsteadOfHanging) {
  static Fake fake;
  static dt_comm_backend be = {};
  be.name = "fake-stream";
  be.abort_job = FakeAbortJob;
  be.destroy = FakeDestroy;
  be.enqueue = FakeEnqueue;
  be.query = FakeQuery;
  be.check_async = FakeCheckAsync;
  be.abort_comm = FakeAbortComm;
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

}  // namespace
