// dist/ in one process: the local communicator (threads), the process group
// without a launcher, the DDP reducer over a group of one (buckets, unused
// parameters, no_sync, timeline) and the data-parallel mode.
#include <dirent.h>
#include <gtest/gtest.h>
#include <omp.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/cpu.h"
#include "core/memory.h"
#include "core/nn.h"
#include "core/ops.h"
#include "dist/dp.h"
#include "dist/process_group.h"
#include "tests/dist/dist_test_util.h"

namespace {

using dtt::make_batch;

class DistLocal : public ::testing::Test {
 protected:
  void SetUp() override { dt_cpu_set_num_threads(1); }
};

dt_comm_config test_comm_config(double timeout = 20.0) {
  dt_comm_config c = DT_COMM_CONFIG_DEFAULT;
  c.timeout_s = timeout;
  c.abort_on_timeout = 0;
  return c;
}

// Runs body(rank, comm) on n threads over one local group.
void run_group(int n, const std::function<void(int, dt_comm *)> &body, double timeout = 20.0) {
  dt_local_group *g = nullptr;
  DT_ASSERT_OK(dt_local_group_create(n, &g));
  std::vector<dt_comm *> comms(n, nullptr);
  dt_comm_config cc = test_comm_config(timeout);
  for (int r = 0; r < n; r++)
    DT_ASSERT_OK(dt_comm_create_local(g, r, &cc, &comms[r]));
  dt_local_group_release(g);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; r++)
    threads.emplace_back([&, r] { body(r, comms[r]); });
  for (auto &t : threads)
    t.join();
  for (int r = 0; r < n; r++)
    dt_comm_destroy(comms[r]);
}

dt_tensor *host_f32(const std::vector<float> &v) {
  int64_t n = static_cast<int64_t>(v.size());
  dt_tensor *t = nullptr;
  dt_tensor_from_host(v.data(), &n, 1, DT_DTYPE_F32, DT_CPU, &t);
  return t;
}

std::vector<float> to_vec(dt_tensor *t) {
  std::vector<float> v(static_cast<size_t>(dt_tensor_numel(t)));
  dt_tensor_to_host(t, v.data(), v.size() * sizeof(float));
  return v;
}

// Threads of this process under Linux's SCHED_BATCH policy (3).
int batch_threads() {
  int n = 0;
  DIR *d = opendir("/proc/self/task");
  if (d == nullptr)
    return -1;
  while (dirent *e = readdir(d))
    if (e->d_name[0] != '.' && sched_getscheduler(std::atoi(e->d_name)) == 3)
      n++;
  closedir(d);
  return n;
}

// The communication thread's polls must not preempt the computation on
// its core: it runs under SCHED_BATCH (a fair share, no wake-up
// preemption), one per communicator, while the caller's thread does not.
TEST_F(DistLocal, CommunicationThreadsDoNotPreemptTheComputation) {
  int before = batch_threads();
  ASSERT_GE(before, 0) << "no /proc/self/task";
  int allowed = -1;  // may this process use SCHED_BATCH at all (a sandbox may refuse)?
  std::thread probe([&] {
    sched_param prio{};
    allowed = pthread_setschedparam(pthread_self(), 3, &prio) == 0;
  });
  probe.join();
  if (!allowed)
    GTEST_SKIP()
        << "this sandbox refuses SCHED_BATCH (the communicator then uses ordinary threads)";
  dt_local_group *g = nullptr;
  DT_ASSERT_OK(dt_local_group_create(2, &g));
  dt_comm_config cc = test_comm_config();
  dt_comm *a = nullptr, *b = nullptr;
  DT_ASSERT_OK(dt_comm_create_local(g, 0, &cc, &a));
  DT_ASSERT_OK(dt_comm_create_local(g, 1, &cc, &b));
  dt_local_group_release(g);
  EXPECT_EQ(batch_threads(), before + 2);
  EXPECT_NE(sched_getscheduler(0), 3) << "the caller's thread keeps its policy";
  dt_comm_destroy(a);
  dt_comm_destroy(b);
  EXPECT_EQ(batch_threads(), before);
}

TEST_F(DistLocal, AllreduceSumAndAvgAreExactAndIdentical) {
  for (int n : {1, 2, 3, 4}) {
    const int count = 1000 + 7;  // not divisible by n: uneven slices
    std::vector<std::vector<float>> results(n), avgs(n);
    run_group(n, [&](int r, dt_comm *c) {
      std::vector<float> v(count);
      for (int i = 0; i < count; i++)
        v[i] = 0.1f * static_cast<float>(i % 13) + static_cast<float>(r) * 1.37f;
      dt_tensor *t = host_f32(v), *u = host_f32(v);
      dt_work *w = nullptr;
      EXPECT_EQ(dt_comm_allreduce(c, t, DT_REDUCE_SUM, nullptr, &w), DT_OK) << dt_last_error();
      EXPECT_EQ(dt_work_wait(w, 0), DT_OK) << dt_last_error();
      EXPECT_TRUE(dt_work_test(w));
      dt_work_release(w);
      EXPECT_EQ(dt_comm_allreduce_sync(c, u, DT_REDUCE_AVG), DT_OK) << dt_last_error();
      results[r] = to_vec(t);
      avgs[r] = to_vec(u);
      dt_tensor_release(t);
      dt_tensor_release(u);
    });
    for (int i = 0; i < count; i++) {
      float expect = 0;
      for (int r = 0; r < n; r++)
        expect += 0.1f * static_cast<float>(i % 13) + static_cast<float>(r) * 1.37f;
      ASSERT_NEAR(results[0][i], expect, 1e-4) << "n=" << n << " i=" << i;
      ASSERT_NEAR(avgs[0][i], expect / n, 1e-5) << "n=" << n << " i=" << i;
    }
    for (int r = 1; r < n; r++) {
      EXPECT_EQ(0, std::memcmp(results[r].data(), results[0].data(), count * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(avgs[r].data(), avgs[0].data(), count * sizeof(float)));
    }
  }
}

// 16-bit all-reduce and reduce-scatter (--grad-compress) equal the f32
// sum in rank order rounded once to f16 / bf16, bit for bit, at W 2 and 3;
// f16 overflow is inf.
TEST_F(DistLocal, SixteenBitReductionsRoundTheF32SumOnce) {
  for (int n : {2, 3})
    for (dt_dtype t : {DT_DTYPE_BF16, DT_DTYPE_F16})
      run_group(n, [&](int, dt_comm *c) { dtt::check_reduce16(c, t); });
}

TEST_F(DistLocal, BroadcastAllgatherReduceScatterBarrier) {
  const int n = 3, count = 5;
  std::vector<std::vector<float>> bcast(n), gathered(n), scattered(n);
  run_group(n, [&](int r, dt_comm *c) {
    std::vector<float> mine(count), big(count * n);
    for (int i = 0; i < count; i++)
      mine[i] = static_cast<float>(10 * r + i);
    for (int i = 0; i < count * n; i++)
      big[i] = static_cast<float>(r + 1) * static_cast<float>(i);
    dt_tensor *b = host_f32(mine), *in = host_f32(mine), *all = host_f32(big),
              *rs_in = host_f32(big), *rs_out = host_f32(std::vector<float>(count));
    EXPECT_EQ(dt_comm_broadcast_sync(c, b, 1), DT_OK) << dt_last_error();
    EXPECT_EQ(dt_comm_allgather_sync(c, in, all), DT_OK) << dt_last_error();
    dt_work *w = nullptr;
    EXPECT_EQ(dt_comm_reduce_scatter(c, rs_in, rs_out, DT_REDUCE_SUM, nullptr, &w), DT_OK);
    EXPECT_EQ(dt_work_wait(w, 10.0), DT_OK) << dt_last_error();
    dt_work_release(w);
    EXPECT_EQ(dt_comm_barrier_sync(c), DT_OK) << dt_last_error();
    bcast[r] = to_vec(b);
    gathered[r] = to_vec(all);
    scattered[r] = to_vec(rs_out);
    for (dt_tensor *t : {b, in, all, rs_in, rs_out})
      dt_tensor_release(t);
  });
  for (int r = 0; r < n; r++) {
    for (int i = 0; i < count; i++) {
      EXPECT_EQ(bcast[r][i], static_cast<float>(10 + i));
      for (int k = 0; k < n; k++)
        EXPECT_EQ(gathered[r][k * count + i], static_cast<float>(10 * k + i));
      // sum over k of (k+1) * (r*count + i) = 6 * (r*count + i)
      EXPECT_EQ(scattered[r][i], 6.0f * static_cast<float>(r * count + i));
    }
  }
}

TEST_F(DistLocal, DisagreeingCollectivesFailOnEveryParticipant) {
  std::vector<dt_status> got(2, DT_OK), later(2, DT_OK);
  std::vector<std::string> msg(2);
  std::vector<int> broken(2, 0);
  run_group(2, [&](int r, dt_comm *c) {
    dt_tensor *t = host_f32(std::vector<float>(r == 0 ? 4 : 5, 1.0f));
    got[r] = dt_comm_allreduce_sync(c, t, DT_REDUCE_SUM);
    msg[r] = dt_last_error();
    // A failed collective breaks the communicator: the ranks are out of
    // step, so the next one fails at once instead of pairing wrongly.
    broken[r] = dt_comm_is_broken(c);
    later[r] = dt_comm_barrier_sync(c);
    dt_tensor_release(t);
  });
  for (int r = 0; r < 2; r++) {
    EXPECT_EQ(got[r], DT_ERR_DIST_MISMATCH) << msg[r];
    EXPECT_NE(msg[r].find("disagree"), std::string::npos) << msg[r];
    EXPECT_TRUE(broken[r]);
    EXPECT_EQ(later[r], DT_ERR_STATE);
  }
}

TEST_F(DistLocal, MissingParticipantTimesOutInsteadOfHanging) {
  dt_status got = DT_OK, later = DT_OK;
  std::string msg;
  double seconds = 0;
  ::testing::internal::CaptureStderr();
  run_group(
      2,
      [&](int r, dt_comm *c) {
        if (r == 1)
          return;  // never submits
        dt_tensor *t = host_f32(std::vector<float>(8, 1.0f));
        auto t0 = std::chrono::steady_clock::now();
        got = dt_comm_allreduce_sync(c, t, DT_REDUCE_SUM);
        msg = dt_last_error();
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        later = dt_comm_allreduce_sync(c, t, DT_REDUCE_SUM);
        dt_tensor_release(t);
      },
      0.5);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(got, DT_ERR_TIMEOUT) << msg;
  EXPECT_LT(seconds, 5.0);
  EXPECT_NE(err.find("dtrain: rank 0: collective #1 (allreduce, 32 bytes, peers local "
                     "participants 0-1) did not complete within 0.5 s"),
            std::string::npos)
      << err;
  EXPECT_EQ(later, DT_ERR_STATE);  // broken: fails at once
}

TEST_F(DistLocal, WaitWithDeadlineReturnsTimeout) {
  run_group(
      2,
      [&](int r, dt_comm *c) {
        if (r == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(600));
          EXPECT_EQ(dt_comm_barrier_sync(c), DT_OK) << dt_last_error();
          return;
        }
        dt_work *w = nullptr;
        ASSERT_EQ(dt_comm_barrier(c, nullptr, &w), DT_OK);
        EXPECT_EQ(dt_work_wait(w, 0.1), DT_ERR_TIMEOUT);
        EXPECT_FALSE(dt_work_test(w));
        EXPECT_EQ(dt_work_wait(w, 0), DT_OK) << dt_last_error();
        dt_work_release(w);
      },
      10.0);
}

TEST_F(DistLocal, ProcessGroupWithoutLauncherIsOneProcess) {
  if (dt_pg_detect_launcher() != DT_LAUNCHER_NONE)
    GTEST_SKIP() << "running under a launcher";
  dt_pg *pg = nullptr;
  DT_ASSERT_OK(dt_pg_create(nullptr, &pg));
  EXPECT_EQ(dt_pg_world_size(pg), 1);
  EXPECT_EQ(dt_pg_rank(pg), 0);
  EXPECT_EQ(dt_pg_local_rank(pg), 0);
  EXPECT_FALSE(dt_pg_uses_mpi(pg));
  EXPECT_GT(std::strlen(dt_pg_host(pg)), 0u);
  dt_comm *c = nullptr;
  DT_ASSERT_OK(dt_comm_create_for_pg(pg, nullptr, &c));
  EXPECT_STREQ(dt_comm_backend_name(c), "local");
  dt_tensor *t = host_f32({1, 2, 3});
  DT_ASSERT_OK(dt_comm_allreduce_sync(c, t, DT_REDUCE_AVG));
  EXPECT_EQ(to_vec(t), (std::vector<float>{1, 2, 3}));
  dt_tensor_release(t);
  dt_comm_destroy(c);
  dt_comm *m = nullptr;
  EXPECT_EQ(dt_comm_create_mpi(pg, nullptr, &m), DT_ERR_INVALID_ARG);
  dt_pg_destroy(pg);
}

TEST_F(DistLocal, LauncherDetectionFromEnvironment) {
  if (dt_pg_detect_launcher() != DT_LAUNCHER_NONE)
    GTEST_SKIP() << "running under a launcher";
  // A batch script: one task in the step, not a launch to join.
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_STEP_NUM_TASKS", "1", 1);
  EXPECT_EQ(dt_pg_detect_launcher(), DT_LAUNCHER_NONE);
  // srun -n 2 without --mpi=pmix: refuse with advice instead of running two
  // unrelated single-process trainings.
  setenv("SLURM_STEP_NUM_TASKS", "2", 1);
  EXPECT_EQ(dt_pg_detect_launcher(), DT_LAUNCHER_SLURM_NO_PMI);
  dt_pg *pg = nullptr;
  EXPECT_EQ(dt_pg_create(nullptr, &pg), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("srun --mpi=pmix"), std::string::npos)
      << dt_last_error();
  setenv("PMIX_RANK", "0", 1);  // srun --mpi=pmix
  EXPECT_EQ(dt_pg_detect_launcher(), DT_LAUNCHER_PMIX);
  unsetenv("PMIX_RANK");
  unsetenv("SLURM_PROCID");
  unsetenv("SLURM_STEP_NUM_TASKS");
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  EXPECT_EQ(dt_pg_detect_launcher(), DT_LAUNCHER_OPEN_MPI);
  unsetenv("OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(dt_pg_detect_launcher(), DT_LAUNCHER_NONE);
}

// ---- DDP over a group of one ----

struct Single {
  dt_comm *comm = nullptr;
  Single() {
    dt_comm_config cc = test_comm_config();
    dt_local_group *g = nullptr;
    dt_local_group_create(1, &g);
    dt_comm_create_local(g, 0, &cc, &comm);
    dt_local_group_release(g);
  }
  ~Single() { dt_comm_destroy(comm); }
};

// DDP's buckets over a group of one: the MLP 784-512-512-10 and its arena.
class DistLocalMlp : public DistLocal {
 protected:
  void SetUp() override {
    DistLocal::SetUp();
    DT_ASSERT_OK(dtt::build_model("mlp", &m));
    DT_ASSERT_OK(dt_param_arena_create(m, &arena));
  }
  void TearDown() override {
    dt_param_arena_destroy(arena);
    dt_module_destroy(m);
  }
  Single s;
  dt_module *m = nullptr;
  dt_param_arena *arena = nullptr;
};

TEST_F(DistLocalMlp, BucketsAreReverseOrderedContiguousSlices) {
  dt_ddp *ddp = nullptr;
  dt_ddp_config cfg = DT_DDP_CONFIG_DEFAULT;
  cfg.first_bucket_bytes = 64 << 10;
  cfg.bucket_bytes = 1 << 20;
  DT_ASSERT_OK(dt_ddp_create(m, arena, s.comm, &cfg, &ddp));
  int nb = dt_ddp_num_buckets(ddp);
  // reverse order: bucket 0 = 3.weight+3.bias (20 KiB) + 2.bias... until >= 64 KiB
  int64_t end = dt_param_arena_numel(arena);
  int expect_last = dt_param_arena_count(arena) - 1;
  for (int b = 0; b < nb; b++) {
    int64_t off, numel;
    int first, last;
    dt_ddp_bucket_info(ddp, b, &off, &numel, &first, &last);
    EXPECT_EQ(last, expect_last) << "bucket " << b;
    EXPECT_EQ(off + numel, end) << "bucket " << b;
    EXPECT_EQ(off, dt_param_arena_offset(arena, first));
    expect_last = first - 1;
    end = off;
  }
  EXPECT_EQ(end, 0);
  EXPECT_EQ(expect_last, -1);
  // A bucket closes as soon as it reaches its cap: without its last-added
  // (lowest-index) parameter it was still below the cap.
  for (int b = 0; b < nb; b++) {
    int64_t off, numel;
    int first, last;
    dt_ddp_bucket_info(ddp, b, &off, &numel, &first, &last);
    size_t cap = b == 0 ? cfg.first_bucket_bytes : cfg.bucket_bytes;
    int64_t without_first = numel - dt_tensor_numel(dt_param_arena_param(arena, first, nullptr));
    EXPECT_LT(static_cast<size_t>(without_first) * 4, cap) << "bucket " << b;
    if (b + 1 < nb) {
      EXPECT_GE(static_cast<size_t>(numel) * 4, cap) << "bucket " << b;
    }
  }
  // 784-512-512-10: {5.bias, 5.weight, 3.bias, 3.weight} then {1.bias, 1.weight}
  EXPECT_EQ(nb, 2);
  dt_ddp_destroy(ddp);
}

// A module whose forward uses child "used" and never child "unused".
dt_status half_forward(dt_module *m, dt_tensor *x, dt_tensor **out) {
  dt_tensor *flat = nullptr;
  DT_CHECK(dt_op_flatten(x, &flat));
  dt_status st = dt_module_call(dt_module_child(m, "used"), flat, out);
  dt_tensor_release(flat);
  return st;
}
const dt_module_vtable kHalfVt = {"Half", half_forward, nullptr};

TEST_F(DistLocal, UnusedParametersAreNamedOrZeroFilled) {
  for (int allow : {0, 1}) {
    Single s;
    dt_module *m = nullptr, *a = nullptr, *b = nullptr;
    dt_generator gen;
    dt_generator_init(&gen, 3);
    DT_ASSERT_OK(dt_module_create(&kHalfVt, nullptr, &m));
    DT_ASSERT_OK(dt_nn_linear(784, 10, 1, &gen, &a));
    DT_ASSERT_OK(dt_nn_linear(4, 4, 1, &gen, &b));
    DT_ASSERT_OK(dt_module_add_child(m, "used", a));
    DT_ASSERT_OK(dt_module_add_child(m, "unused", b));
    dt_param_arena *arena = nullptr;
    dt_ddp *ddp = nullptr;
    DT_ASSERT_OK(dt_param_arena_create(m, &arena));
    dt_ddp_config cfg = DT_DDP_CONFIG_DEFAULT;
    cfg.allow_unused = allow;
    DT_ASSERT_OK(dt_ddp_create(m, arena, s.comm, &cfg, &ddp));
    dt_tensor *x, *y;
    make_batch(0, 4, &x, &y);
    DT_ASSERT_OK(dtt::loss_backward(m, x, y, 1.0f, nullptr));
    dt_status st = dt_ddp_finish_backward(ddp);
    if (allow) {
      EXPECT_EQ(st, DT_OK) << dt_last_error();
      dt_tensor *g = dt_tensor_grad(dt_module_parameter(b, "weight"));
      double v = 1;
      DT_ASSERT_OK(dt_tensor_item(g, 0, &v));
      EXPECT_EQ(v, 0.0);
    } else {
      EXPECT_EQ(st, DT_ERR_STATE);
      std::string msg = dt_last_error();
      EXPECT_NE(msg.find("parameters that received no gradient"), std::string::npos) << msg;
      EXPECT_NE(msg.find("unused.weight, unused.bias"), std::string::npos) << msg;
      EXPECT_NE(msg.find("allow_unused"), std::string::npos) << msg;
    }
    // The reducer is usable again for the next pass.
    DT_ASSERT_OK(dt_param_arena_zero_grad(arena));
    DT_ASSERT_OK(dtt::loss_backward(m, x, y, 1.0f, nullptr));
    EXPECT_EQ(dt_ddp_finish_backward(ddp), allow ? DT_OK : DT_ERR_STATE);
    dt_tensor_release(x);
    dt_tensor_release(y);
    dt_ddp_destroy(ddp);
    dt_param_arena_destroy(arena);
    dt_module_destroy(m);
  }
}

// ZeRO with a parameter the forward never uses, over 2 ranks: named, or
// (allow_unused) reduced as zeros so that every bucket still launches; the
// unused parameters then stay as they were, the used ones train.
TEST_F(DistLocal, ZeroUnusedParametersAreNamedOrZeroFilled) {
  for (int stage : {1, 2}) {
    for (int allow : {0, 1}) {
      std::vector<dt_status> got(2, DT_OK);
      std::vector<std::string> msg(2);
      std::vector<std::vector<float>> unused(2), used(2);
      run_group(2, [&](int r, dt_comm *c) {
        dt_module *m = nullptr, *a = nullptr, *b = nullptr;
        dt_generator gen;
        dt_generator_init(&gen, 3);
        EXPECT_EQ(dt_module_create(&kHalfVt, nullptr, &m), DT_OK);
        EXPECT_EQ(dt_nn_linear(784, 10, 1, &gen, &a), DT_OK);
        EXPECT_EQ(dt_nn_linear(4, 4, 1, &gen, &b), DT_OK);
        EXPECT_EQ(dt_module_add_child(m, "used", a), DT_OK);
        EXPECT_EQ(dt_module_add_child(m, "unused", b), DT_OK);
        dt_param_arena *arena = nullptr;
        dt_optimizer *opt = nullptr;
        dt_ddp *ddp = nullptr;
        dt_sgd_config sgd = dtt::test_sgd();
        dt_ddp_config cfg = DT_DDP_CONFIG_DEFAULT;
        cfg.allow_unused = allow;
        cfg.zero_stage = stage;
        cfg.first_bucket_bytes = 64;  // the unused layer is a bucket of its own
        EXPECT_EQ(dt_param_arena_create(m, &arena), DT_OK);
        EXPECT_EQ(dt_optim_sgd_create(arena, &sgd, &opt), DT_OK);
        EXPECT_EQ(dt_ddp_create(m, arena, c, &cfg, &ddp), DT_OK) << dt_last_error();
        EXPECT_EQ(dt_ddp_shard_optimizer(ddp, opt), DT_OK) << dt_last_error();
        std::vector<float> before = dtt::arena_values(arena);
        for (int s = 0; s < 2 && got[r] == DT_OK; s++) {
          dt_tensor *x, *y;
          make_batch(4 * (2 * s + r), 4, &x, &y);
          got[r] = dtt::loss_backward(m, x, y, 1.0f, nullptr);
          dt_status fin = dt_ddp_finish_backward(ddp);
          got[r] = got[r] == DT_OK ? fin : got[r];
          msg[r] = dt_last_error();
          if (got[r] == DT_OK)
            got[r] = dt_optim_step(opt);
          dt_optim_zero_grad(opt);
          dt_tensor_release(x);
          dt_tensor_release(y);
        }
        std::vector<float> after = dtt::arena_values(arena);
        int64_t split = dt_param_arena_offset(arena, 2);  // unused.weight comes after used.*
        for (int64_t i = 0; i < static_cast<int64_t>(after.size()); i++)
          (i < split ? used : unused)[r].push_back(after[i] - before[i]);
        dt_ddp_destroy(ddp);
        dt_optim_destroy(opt);
        dt_param_arena_destroy(arena);
        dt_module_destroy(m);
      });
      for (int r = 0; r < 2; r++) {
        if (allow) {
          EXPECT_EQ(got[r], DT_OK) << "stage " << stage << ": " << msg[r];
          EXPECT_EQ(unused[r], std::vector<float>(unused[r].size(), 0.0f)) << "stage " << stage;
          EXPECT_GT(dtt::max_abs_diff(used[r], std::vector<float>(used[r].size(), 0.0f)), 0);
        } else {
          EXPECT_EQ(got[r], DT_ERR_STATE) << "stage " << stage;
          EXPECT_NE(msg[r].find("unused.weight, unused.bias"), std::string::npos) << msg[r];
        }
      }
    }
  }
}

TEST_F(DistLocal, ForwardBeforeFinishBackwardIsAnError) {
  Single s;
  dt_module *m = nullptr;
  dt_param_arena *arena = nullptr;
  dt_ddp *ddp = nullptr;
  DT_ASSERT_OK(dtt::build_model("mlp-small", &m));
  DT_ASSERT_OK(dt_param_arena_create(m, &arena));
  DT_ASSERT_OK(dt_ddp_create(m, arena, s.comm, nullptr, &ddp));
  dt_tensor *x, *y, *out = nullptr;
  make_batch(0, 4, &x, &y);
  DT_ASSERT_OK(dtt::loss_backward(m, x, y, 1.0f, nullptr));
  EXPECT_EQ(dt_module_call(m, x, &out), DT_ERR_STATE);
  EXPECT_NE(std::string(dt_last_error()).find("dt_ddp_finish_backward"), std::string::npos);
  DT_ASSERT_OK(dt_ddp_finish_backward(ddp));
  DT_ASSERT_OK(dt_module_call(m, x, &out));
  dt_tensor_release(out);
  dt_tensor_release(x);
  dt_tensor_release(y);
  dt_ddp_destroy(ddp);
  dt_param_arena_destroy(arena);
  dt_module_destroy(m);
}

TEST_F(DistLocal, NoSyncAccumulationEqualsOneBatch) {
  Single s;
  const int k = 3, b = 4, steps = 3;
  std::vector<float> ref = dtt::train_reference("mlp-small", steps, k * b);
  dtt::DdpRun run = dtt::train_ddp(s.comm, "mlp-small", steps, b, k);
  EXPECT_LE(dtt::rel_error(run.params, ref), 1e-5)
      << "max abs diff " << dtt::max_abs_diff(run.params, ref);
}

TEST_F(DistLocal, TimelineRecordsEveryBucket) {
  Single s;
  dt_ddp_config cfg = DT_DDP_CONFIG_DEFAULT;
  cfg.first_bucket_bytes = cfg.bucket_bytes = 256 << 10;
  dtt::DdpRun run = dtt::train_ddp(s.comm, "mlp-wide", 1, 16, 1, cfg);
  ASSERT_GE(run.n_buckets, 3);
  const dt_ddp_timeline &t = run.timeline;
  EXPECT_LE(t.first_grad_s, t.last_grad_s);
  EXPECT_LE(t.last_grad_s, t.backward_end_s);
  EXPECT_LE(t.backward_end_s, t.finish_end_s);
  for (int i = 0; i < run.n_buckets; i++) {
    const dt_ddp_bucket_timing &bt = run.buckets[i];
    EXPECT_GT(bt.launch_s, 0) << i;
    EXPECT_GE(bt.start_s, bt.launch_s) << i;
    EXPECT_GE(bt.end_s, bt.start_s) << i;
    if (i > 0) {
      EXPECT_GE(bt.launch_s, run.buckets[i - 1].launch_s) << i;  // bucket order
    }
  }
  EXPECT_LT(run.buckets[0].launch_s, t.backward_end_s);  // launched from a hook
}

// ---- ZeRO over threads ----

// Every rank of a local group of `world` trains `spec`; returns rank 0's run
// after checking that every rank holds bitwise the same parameters.
dtt::StepRun run_zero(int world, const dtt::StepSpec &spec) {
  std::vector<dtt::StepRun> runs(world);
  run_group(
      world, [&](int r, dt_comm *c) { runs[r] = dtt::train_steps(c, world, spec); }, 60.0);
  for (int r = 1; r < world; r++) {
    EXPECT_EQ(runs[r].params.size(), runs[0].params.size());
    EXPECT_EQ(0, std::memcmp(runs[r].params.data(), runs[0].params.data(),
                             runs[0].params.size() * sizeof(float)))
        << "rank " << r << " differs from rank 0, zero stage " << spec.ddp.zero_stage;
  }
  return runs[0];
}

// Stages 1 and 2 equal stage 0 and one process on the whole batch: MLP,
// LeNet and a GPT-2 (tied embedding), 2 and 3 ranks (the flat spaces are
// not multiples of 3: padding), with gradient accumulation, with clipping,
// with AdamW; small buckets so that buckets split parameters.
TEST_F(DistLocal, ZeroStagesEqualAllReduceAndOneProcess) {
  for (const dtt::ZeroCase &c : dtt::kZeroCases) {
    for (int world : {2, 3}) {
      dtt::StepSpec spec = dtt::zero_case_spec(c);
      std::vector<float> ref = dtt::train_steps(nullptr, world, spec).params;
      dtt::expect_zero_stages(
          c, world, ref, [world](const dtt::StepSpec &s) { return run_zero(world, s); }, "");
      if (c.clip > 0) {  // the cap was reached: clipping changed the result
        dtt::StepSpec unclipped = spec;
        unclipped.clip = 0;
        unclipped.ddp.zero_stage = 0;
        EXPECT_GT(dtt::rel_error(dtt::train_steps(nullptr, world, unclipped).params, ref), 1e-3);
      }
    }
  }
}

// The schedule of issue 16 over threads, 2 and 3 ranks: split buckets and
// the update per bucket give the bits of unsplit buckets and one update
// (dtt::expect_schedule_bitwise: clipping, accumulation, a bf16 working
// copy, fp16 with an overflow, LeNet, GPT-2, ZeRO).
TEST_F(DistLocal, UpdatePerBucketAndSplitBucketsChangeNoBit) {
  for (int world : {2, 3})
    dtt::expect_schedule_bitwise(
        world, [world](const dtt::StepSpec &s) { return run_zero(world, s); }, "", true);
}

// A parameter of the last bucket above split_bytes is cut into parts of
// whole rows (a multiple of 16, at most 8 parts), each closing its bucket,
// from its last rows to its first; the buckets still tile the flat space
// in reverse order, and parameters outside the last bucket stay whole.
TEST_F(DistLocalMlp, SplitBucketsAreRowBlocksOfTheLastBucketsParameters) {
  dt_ddp *ddp = nullptr;
  dt_ddp_config cfg = DT_DDP_CONFIG_DEFAULT;
  cfg.split_bytes = 512 << 10;  // 1.weight (1.53 MiB, rows of 3136 bytes): 176 rows a part
  DT_ASSERT_OK(dt_ddp_create(m, arena, s.comm, &cfg, &ddp));
  // {5.bias, 5.weight, 3.bias, 3.weight} {1.bias, 1.weight[352:512)}
  // {1.weight[176:352)} {1.weight[0:176)}
  ASSERT_EQ(dt_ddp_num_buckets(ddp), 4);
  int64_t end = dt_param_arena_numel(arena), row = 784;
  const int64_t want_numel[4] = {end - 512 * row - 512, 160 * row + 512, 176 * row, 176 * row};
  const int want_first[4] = {2, 0, 0, 0}, want_last[4] = {5, 1, 0, 0};
  for (int b = 0; b < 4; b++) {
    int64_t off, numel;
    int first, last;
    dt_ddp_bucket_info(ddp, b, &off, &numel, &first, &last);
    EXPECT_EQ(off + numel, end) << "bucket " << b;
    EXPECT_EQ(numel, want_numel[b]) << "bucket " << b;
    EXPECT_EQ(first, want_first[b]) << "bucket " << b;
    EXPECT_EQ(last, want_last[b]) << "bucket " << b;
    end = off;
  }
  EXPECT_EQ(end, 0);
  dt_ddp_destroy(ddp);
  // split_bytes 0 (the default): the buckets of BucketsAreReverseOrderedContiguousSlices
  cfg.split_bytes = 0;
  DT_ASSERT_OK(dt_ddp_create(m, arena, s.comm, &cfg, &ddp));
  EXPECT_EQ(dt_ddp_num_buckets(ddp), 2);
  dt_ddp_destroy(ddp);
}

// Mixed precision under DDP and ZeRO: after every sharded step each rank's
// 16-bit working copy of the weights is complete and the same everywhere
// (its own shards from the fused update, the others rebuilt from the
// gathered masters with the same draws): the masters rounded to nearest, or
// stochastically with the draws of (seed, step, element).
TEST_F(DistLocal, WorkingCopyIsTheSameOnEveryRankAfterShardedSteps) {
  const int world = 2;
  for (bool stochastic : {false, true})
    for (int stage : {0, 1, 2}) {
      dtt::StepSpec spec = dtt::zero_case_spec({"mlp", 1, 0.0f, true});
      spec.autocast = DT_DTYPE_BF16;
      spec.stochastic_rounding = stochastic;
      spec.ddp.zero_stage = stage;
      std::vector<dtt::StepRun> runs(world);
      run_group(
          world, [&](int r, dt_comm *c) { runs[r] = dtt::train_steps(c, world, spec); }, 60.0);
      const std::vector<float> &p = runs[0].params;
      std::vector<uint16_t> want(p.size());
      if (stochastic)
        ASSERT_DT_OK(dt_half_from_f32_stochastic(DT_DTYPE_BF16, p.data(), want.data(),
                                                 (int64_t)p.size(),
                                                 dt_rng_bits(dtt::kRoundingSeed, spec.steps), 0));
      else
        ASSERT_DT_OK(dt_half_from_f32(DT_DTYPE_BF16, p.data(), want.data(), (int64_t)p.size()));
      for (int r = 0; r < world; r++) {
        EXPECT_EQ(runs[r].params, p) << "rank " << r << " zero " << stage;
        EXPECT_TRUE(runs[r].working_copy_fresh) << "rank " << r;
        EXPECT_EQ(runs[r].working_copy, want)
            << "rank " << r << " zero " << stage << " stochastic " << stochastic;
      }
    }
}

// ---- gradient compression (--grad-compress) over threads ----

// The reducer with f16 / bf16 compression leaves in every rank's f32
// gradients exactly the documented 16-bit average (dtt::check_compressed_
// gradients) at W 2 and 3; with the loss scaled by 2^20 some f16
// gradients pass 65504 and are inf.
TEST_F(DistLocal, CompressedGradientsAreTheRounded16BitAverage) {
  for (int world : {2, 3})
    for (dt_dtype t : {DT_DTYPE_BF16, DT_DTYPE_F16})
      for (float scale : {1.0f, 1048576.0f})
        if (scale == 1.0f || t == DT_DTYPE_F16)
          run_group(world, [&](int, dt_comm *c) { dtt::check_compressed_gradients(c, t, scale); });
}

// fp16 compression under loss scaling: with the loss scaled by 2^40 the
// gradients fit f32 but not f16, so every compressed bucket overflows to
// inf; the GradScaler sees it on every rank, skips every step and halves
// its scale each time (the ranks stay bitwise equal), where the f32
// all-reduce skips none.
TEST_F(DistLocal, CompressedFp16OverflowIsCaughtByTheGradScaler) {
  dtt::StepSpec spec = dtt::zero_case_spec({"mlp", 1, 0.0f, false});
  dtt::StepSpec untrained = spec;
  untrained.steps = 0;
  std::vector<float> initial = dtt::train_steps(nullptr, 2, untrained).params;
  spec.init_scale = 1099511627776.0f;  // 2^40
  for (int stage : {0, 2}) {
    spec.ddp.zero_stage = stage;
    spec.ddp.grad_compress = DT_DTYPE_F32;
    dtt::StepRun plain = run_zero(2, spec);
    EXPECT_EQ(plain.skipped_steps, 0) << "zero " << stage;
    EXPECT_EQ(plain.final_scale, spec.init_scale);
    spec.ddp.grad_compress = DT_DTYPE_F16;
    dtt::StepRun run = run_zero(2, spec);
    EXPECT_EQ(run.skipped_steps, spec.steps) << "zero " << stage;
    EXPECT_EQ(run.final_scale, std::ldexp(spec.init_scale, -spec.steps)) << "zero " << stage;
    EXPECT_EQ(run.params, initial) << "no step was applied";
  }
}

// Training with compression: every rank ends bitwise equal; ZeRO 1 and 2
// compressed equal compressed stage 0 (the same 16-bit sums, per element);
// and the result is close to, but not the same as, uncompressed training
// (with accumulation, clipping and AdamW as in the ZeRO cases).
TEST_F(DistLocal, CompressedTrainingTracksUncompressedOnEveryStage) {
  // SGD: AdamW's update divides by the root of tiny second moments, so
  // it magnifies the rounding of small gradients far beyond their size.
  const dtt::ZeroCase cases[] = {{"mlp", 2, 0.5f, false}, {"lenet", 1, 0.05f, false}};
  for (const dtt::ZeroCase &c : cases) {
    for (int world : {2, 3}) {
      dtt::StepSpec spec = dtt::zero_case_spec(c);
      std::vector<float> plain = run_zero(world, spec).params;
      for (dt_dtype t : {DT_DTYPE_BF16, DT_DTYPE_F16}) {
        spec.ddp.grad_compress = t;
        std::vector<float> stage0;
        for (int stage : {0, 1, 2}) {
          spec.ddp.zero_stage = stage;
          std::vector<float> p = run_zero(world, spec).params;
          double rel = dtt::rel_error(p, plain);
          std::printf("%s W=%d accum %d clip %g %s zero %d %s: relative error to f32 %.3g\n",
                      c.model, world, c.accum, c.clip, c.adamw ? "adamw" : "sgd", stage,
                      dt_dtype_name(t), rel);
          EXPECT_GT(rel, 1e-7) << "compression changed nothing";
          // measured: bf16 1.6e-5, f16 2e-6 (mlp); about ten times that
          EXPECT_LT(rel, t == DT_DTYPE_BF16 ? 2e-4 : 3e-5) << c.model << " zero " << stage;
          if (stage == 0)
            stage0 = p;
          else
            EXPECT_LE(dtt::rel_error(p, stage0), 1e-5) << c.model << " zero " << stage;
        }
        spec.ddp.zero_stage = 0;
      }
      spec.ddp.grad_compress = DT_DTYPE_F32;
    }
  }
}

// ---- data-parallel mode ----

struct DpArgs {
  std::string model;
};

dt_status dp_model(void *user, int, dt_module **out) {
  return dtt::build_model(static_cast<DpArgs *>(user)->model, out);
}

dt_status dp_optim(void *, int, dt_param_arena *arena, dt_optimizer **out) {
  dt_sgd_config c = dtt::test_sgd();
  return dt_optim_sgd_create(arena, &c, out);
}

using BatchFn = void (*)(int64_t first, int64_t n, dt_tensor **x, dt_tensor **y);

// Data-parallel training of `model` over n_devices cpu devices with cfg,
// `steps` steps over batches [s * batch, (s + 1) * batch) from make_batch,
// ends with the parameters `ref` (one device) on every replica.
void check_dp_equals(const std::vector<float> &ref, const std::string &model, int n_devices,
                     int steps, int batch, dt_dp_config cfg, BatchFn make) {
  std::vector<dt_device> devs;
  for (int i = 0; i < n_devices; i++)
    devs.push_back({DT_DEVICE_CPU, i});
  DpArgs args{model};
  dt_dp *dp = nullptr;
  cfg.comm = test_comm_config();
  DT_ASSERT_OK(dt_dp_create(devs.data(), n_devices, dp_model, &args, dp_optim, nullptr, &cfg, &dp));
  for (int s = 0; s < steps; s++) {
    dt_tensor *x, *y;
    make(static_cast<int64_t>(s) * batch, batch, &x, &y);
    double loss = 0;
    DT_ASSERT_OK(dt_dp_step(dp, x, y, &loss));
    EXPECT_TRUE(std::isfinite(loss));
    dt_tensor_release(x);
    dt_tensor_release(y);
  }
  std::vector<float> p0 = dtt::arena_values(dtt::replica_arena(dp, 0));
  EXPECT_LE(dtt::rel_error(p0, ref), 1e-5)
      << model << " over " << n_devices << " devices: max abs diff " << dtt::max_abs_diff(p0, ref);
  for (int i = 1; i < n_devices; i++) {
    std::vector<float> pi = dtt::arena_values(dtt::replica_arena(dp, i));
    EXPECT_EQ(0, std::memcmp(pi.data(), p0.data(), p0.size() * sizeof(float)))
        << "replica " << i << " differs from replica 0";
  }
  dt_dp_destroy(dp);
}

void check_dp_equals_one_device(const std::string &model, int n_devices, int batch) {
  const int steps = 5;
  std::vector<float> ref = dtt::train_reference(model, steps, batch);
  check_dp_equals(ref, model, n_devices, steps, batch, dtt::dp_config(), make_batch);
}

TEST_F(DistLocal, DataParallelMlpEqualsOneDevice) {
  check_dp_equals_one_device("mlp", 2, 16);
  check_dp_equals_one_device("mlp", 3, 16);  // uneven split: 5, 5, 6
}

TEST_F(DistLocal, DataParallelLenetEqualsOneDevice) {
  check_dp_equals_one_device("lenet", 2, 12);
  check_dp_equals_one_device("lenet", 3, 12);
}

// Token windows split across the replicas; the tied embedding's gradient
// (two uses) reduced like any other.
TEST_F(DistLocal, DataParallelTinyGptEqualsOneDevice) {
  const int steps = 5;
  std::vector<float> ref = dtt::train_reference("gpt2-micro", steps, 6);
  check_dp_equals(ref, "gpt2-micro", 2, steps, 6, dtt::dp_config(), dtt::make_token_batch);
  check_dp_equals(ref, "gpt2-micro", 3, steps, 6, dtt::dp_config(), dtt::make_token_batch);
}

// ZeRO in data-parallel mode: every replica updates its shard and the
// replicas stay identical, equal to one device.
TEST_F(DistLocal, DataParallelZeroEqualsOneDevice) {
  const int steps = 4;
  for (const char *model : {"mlp", "lenet"}) {
    std::vector<float> ref = dtt::train_reference(model, steps, 12);
    for (int n : {2, 3}) {
      for (int stage : {1, 2}) {
        dt_dp_config cfg = dtt::dp_config();
        cfg.ddp.zero_stage = stage;
        cfg.ddp.first_bucket_bytes = 20000;
        check_dp_equals(ref, model, n, steps, 12, cfg, make_batch);
      }
    }
  }
}

// Per-rank memory, from the allocator: each rank's replica on its own cpu
// device (statistics are per device). After a step, the device holds the
// parameters (padded), the gradient memory the reducer reports and the
// optimizer state, nothing else; with AdamW the state is 2 floats per
// element of the shard, about 1/W of stage 0's, and stage 2 keeps no full
// gradient: the shard and the bucket buffers.
TEST_F(DistLocal, ZeroMemoryPerRankFromTheAllocator) {
  const int world = 3;
  dtt::StepSpec spec;
  spec.model = "mlp-wide";  // 784-1024-1024-1024-10: 2,913,290 parameters, not a multiple of 3
  spec.steps = 1;
  spec.per_rank = 4;
  spec.adamw = true;
  spec.ddp.first_bucket_bytes = 256 << 10;
  spec.ddp.bucket_bytes = 1 << 20;
  size_t state[3] = {0, 0, 0}, grads[3] = {0, 0, 0}, live[3] = {0, 0, 0}, in_flight[3] = {0, 0, 0};
  int64_t numel = 0;
  for (int stage : {0, 1, 2}) {
    spec.ddp.zero_stage = stage;
    std::vector<size_t> before(world), after(world);
    std::vector<dtt::StepRun> runs(world);
    std::mutex mu;
    run_group(
        world,
        [&](int r, dt_comm *c) {
          dt_device dev = {DT_DEVICE_CPU, r};
          dt_memory_stats ms;
          if (r > 0) {  // cpu:0 also sees the models built (then moved) by every rank
            dt_memory_stats_get(dev, &ms);
            before[r] = ms.allocated;
          }
          runs[r] = dtt::train_steps(c, world, spec, dev, [&](const dt_step &) {
            dt_memory_stats now;
            dt_memory_stats_get(dev, &now);
            after[r] = now.allocated;
          });
        },
        60.0);
    for (int r = 1; r < world; r++) {
      const dtt::StepRun &run = runs[r];
      size_t params = static_cast<size_t>(run.padded_numel) * sizeof(float);
      EXPECT_EQ(after[r] - before[r], params + run.memory.gradients + run.memory.optimizer_state)
          << "stage " << stage << " rank " << r << ": the device holds more than the reducer "
          << "and the optimizer report";
    }
    numel = static_cast<int64_t>(runs[1].params.size());
    state[stage] = runs[1].memory.optimizer_state;
    grads[stage] = runs[1].memory.gradients;
    in_flight[stage] = runs[1].memory.gradients_in_flight;
    live[stage] = after[1] - before[1];
    std::printf(
        "zero %d, rank 1 of %d: optimizer state %zu B, gradients %zu B (+ %zu B of "
        "buckets in flight at most), live after the step %zu B\n",
        stage, world, state[stage], grads[stage], in_flight[stage], live[stage]);
  }
  size_t f = sizeof(float), pad = 2 * f * world * 8;  // < W elements per bucket, few buckets
  EXPECT_EQ(state[0], 2 * f * static_cast<size_t>(numel));
  EXPECT_LE(state[1], state[0] / world + pad);
  EXPECT_GE(state[1], state[0] / world);
  EXPECT_EQ(state[2], state[1]);
  EXPECT_EQ(grads[0], f * static_cast<size_t>(numel));
  // Stage 2 keeps the shard's gradients only (about 1/W); during backward
  // the buckets in flight come on top: here those of one 1024 x 1024
  // weight (its gradient arrives whole) and the reduce-scatters not yet
  // complete.
  EXPECT_LE(grads[2], grads[0] / world + pad);
  EXPECT_GE(grads[2], grads[0] / world);
  EXPECT_GT(in_flight[2], 0u);
  EXPECT_LT(in_flight[2], grads[0] / 2);
  EXPECT_EQ(live[1] - live[2], grads[1] - grads[2]);
}

// What a checkpoint does with shards: every rank of a ZeRO run writes its
// segments' state into one array in the arena's coordinates; it equals
// stage 0's whole state (every element owned by exactly one rank), and
// the ranks of another world size load their own segments from it and
// write back the same array.
TEST_F(DistLocal, ZeroStateInArenaCoordinatesReshards) {
  dtt::StepSpec spec;
  spec.model = "mlp";
  spec.steps = 2;
  spec.per_rank = 4;
  spec.adamw = true;
  spec.ddp.first_bucket_bytes = 20000;
  spec.ddp.bucket_bytes = 300000;
  std::vector<float> whole;
  run_group(2, [&](int r, dt_comm *c) {
    dtt::train_steps(c, 2, spec, DT_CPU, [&](const dt_step &s) {
      if (r != 0)
        return;
      whole.resize(static_cast<size_t>(dt_optim_state_numel(s.opt)));  // unsharded: arena's
      EXPECT_EQ(dt_optim_state_get(s.opt, whole.data(), static_cast<int64_t>(whole.size())), DT_OK)
          << dt_last_error();
    });
  });
  const int64_t n = static_cast<int64_t>(whole.size());
  ASSERT_GT(n, 0);
  std::vector<float> sharded(whole.size(), NAN), resharded(whole.size(), NAN);
  int64_t steps = 0;
  spec.ddp.zero_stage = 1;
  run_group(2, [&](int r, dt_comm *c) {
    dtt::train_steps(c, 2, spec, DT_CPU, [&](const dt_step &s) {
      EXPECT_LT(dt_optim_state_numel(s.opt), n);
      EXPECT_EQ(dt_optim_state_to_flat(s.opt, sharded.data(), n), DT_OK) << dt_last_error();
      if (r == 0)
        steps = dt_optim_step_count(s.opt);
      EXPECT_EQ(dt_optim_state_to_flat(s.opt, sharded.data(), n - 1), DT_ERR_SHAPE);
    });
  });
  EXPECT_EQ(steps, 2);
  EXPECT_LE(dtt::rel_error(sharded, whole), 1e-5) << "every element came from one rank";
  spec.steps = 0;
  spec.ddp.zero_stage = 2;
  run_group(3, [&](int, dt_comm *c) {
    dtt::train_steps(c, 3, spec, DT_CPU, [&](const dt_step &s) {
      EXPECT_EQ(dt_optim_state_from_flat(s.opt, sharded.data(), n, steps), DT_OK)
          << dt_last_error();
      EXPECT_EQ(dt_optim_step_count(s.opt), 2);
      EXPECT_EQ(dt_optim_state_to_flat(s.opt, resharded.data(), n), DT_OK) << dt_last_error();
    });
  });
  EXPECT_EQ(0, std::memcmp(resharded.data(), sharded.data(), n * sizeof(float)));
}

TEST_F(DistLocal, DataParallelRejectsBadDevicesAndBatches) {
  DpArgs args{"mlp-small"};
  dt_dp *dp = nullptr;
  dt_dp_config cfg = dtt::dp_config();
  dt_device twice[2] = {{DT_DEVICE_CPU, 0}, {DT_DEVICE_CPU, 0}};
  EXPECT_EQ(dt_dp_create(twice, 2, dp_model, &args, dp_optim, nullptr, &cfg, &dp),
            DT_ERR_INVALID_ARG);
  dt_device two[2] = {{DT_DEVICE_CPU, 0}, {DT_DEVICE_CPU, 1}};
  DT_ASSERT_OK(dt_dp_create(two, 2, dp_model, &args, dp_optim, nullptr, &cfg, &dp));
  dt_tensor *x, *y;
  make_batch(0, 1, &x, &y);
  EXPECT_EQ(dt_dp_step(dp, x, y, nullptr), DT_ERR_INVALID_ARG);
  dt_tensor_release(x);
  dt_tensor_release(y);
  dt_dp_destroy(dp);
}

// The loss is the caller's, never the mode's: data-parallel training with a
// mean-squared-error loss (regression targets, not class ids) equals one
// device trained on that loss, and every replica called it.
std::atomic<int> g_mse_calls{0};

dt_status mse_loss(dt_tensor *output, dt_tensor *target, dt_reduction reduction, dt_tensor **loss) {
  g_mse_calls++;
  return dt_op_mse(output, target, reduction, loss);
}

// Inputs as make_batch, targets (n, 10) f32 in [-1, 1).
void make_regression_batch(int64_t first, int64_t n, dt_tensor **x, dt_tensor **t) {
  dt_tensor *labels = nullptr;
  make_batch(first, n, x, &labels);
  dt_tensor_release(labels);
  std::vector<float> v(static_cast<size_t>(n) * 10);
  for (size_t i = 0; i < v.size(); i++)
    v[i] = 2.0f * dt_rng_uniform(77, static_cast<uint64_t>(first) * 10 + i) - 1.0f;
  int64_t shape[2] = {n, 10};
  *t = nullptr;
  dt_tensor_from_host(v.data(), shape, 2, DT_DTYPE_F32, DT_CPU, t);
}

// One device, written out by hand: forward, mean squared error, backward, SGD.
std::vector<float> train_reference_mse(const std::string &model, int steps, int batch) {
  dt_module *m = nullptr;
  dt_param_arena *arena = nullptr;
  dt_optimizer *opt = nullptr;
  dt_sgd_config sgd = dtt::test_sgd();
  std::vector<float> out;
  EXPECT_EQ(dtt::build_model(model, &m), DT_OK);
  EXPECT_EQ(dt_param_arena_create(m, &arena), DT_OK);
  EXPECT_EQ(dt_optim_sgd_create(arena, &sgd, &opt), DT_OK);
  for (int s = 0; s < steps && opt != nullptr; s++) {
    dt_tensor *x, *t, *y = nullptr, *loss = nullptr;
    make_regression_batch(static_cast<int64_t>(s) * batch, batch, &x, &t);
    EXPECT_EQ(dt_module_call(m, x, &y), DT_OK);
    EXPECT_EQ(dt_op_mse(y, t, DT_REDUCTION_MEAN, &loss), DT_OK);
    EXPECT_EQ(dt_backward(loss, nullptr), DT_OK);
    EXPECT_EQ(dt_optim_step(opt), DT_OK);
    EXPECT_EQ(dt_optim_zero_grad(opt), DT_OK);
    for (dt_tensor *u : {loss, y, t, x})
      dt_tensor_release(u);
  }
  if (arena != nullptr)
    out = dtt::arena_values(arena);
  dt_optim_destroy(opt);
  dt_param_arena_destroy(arena);
  dt_module_destroy(m);
  return out;
}

TEST_F(DistLocal, DataParallelTakesTheLossFromItsCaller) {
  const int steps = 4, batch = 13;  // 3 replicas: 4, 4, 5 samples
  std::vector<float> ref = train_reference_mse("mlp-small", steps, batch);
  dt_dp_config cfg = DT_DP_CONFIG_DEFAULT;
  cfg.step.loss = mse_loss;
  for (int n : {2, 3}) {
    g_mse_calls = 0;
    check_dp_equals(ref, "mlp-small", n, steps, batch, cfg, make_regression_batch);
    EXPECT_EQ(g_mse_calls.load(), n * steps) << "every replica's every step calls the loss";
  }
  // Without a loss there is no step to run: refused, not defaulted.
  dt_device two[2] = {{DT_DEVICE_CPU, 0}, {DT_DEVICE_CPU, 1}};
  DpArgs args{"mlp-small"};
  dt_dp *dp = nullptr;
  EXPECT_EQ(dt_dp_create(two, 2, dp_model, &args, dp_optim, nullptr, nullptr, &dp),
            DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("loss"), std::string::npos) << dt_last_error();
}

// OpenMP's thread count is per thread: each replica thread must set its own
// (threads_per_replica), whatever the creating thread has.
struct ThreadProbe {
  std::mutex mu;
  std::vector<int> omp_threads;  // omp_get_max_threads() on each replica's thread
};

dt_status probe_model(void *user, int replica, dt_module **out) {
  auto *p = static_cast<ThreadProbe *>(user);
  {
    std::lock_guard<std::mutex> lock(p->mu);
    p->omp_threads[static_cast<size_t>(replica)] = omp_get_max_threads();
  }
  return dtt::build_model("mlp-small", out);
}

void expect_replica_threads(int threads_per_replica, int caller_threads, int want) {
  dt_cpu_set_num_threads(caller_threads);
  ThreadProbe probe;
  probe.omp_threads.assign(2, -1);
  dt_device two[2] = {{DT_DEVICE_CPU, 0}, {DT_DEVICE_CPU, 1}};
  dt_dp_config cfg = dtt::dp_config();
  cfg.threads_per_replica = threads_per_replica;
  dt_dp *dp = nullptr;
  DT_ASSERT_OK(dt_dp_create(two, 2, probe_model, &probe, dp_optim, nullptr, &cfg, &dp));
  for (int r = 0; r < 2; r++)
    EXPECT_EQ(probe.omp_threads[static_cast<size_t>(r)], want)
        << "replica " << r << " with threads_per_replica " << threads_per_replica << ", caller "
        << caller_threads;
  dt_dp_destroy(dp);
}

TEST_F(DistLocal, DataParallelReplicaThreadsSetTheirOwnThreadCount) {
  expect_replica_threads(3, 1, 3);  // explicit, whatever the caller has
  expect_replica_threads(0, 4, 2);  // default: the caller's 4 shared by 2 replicas
  expect_replica_threads(0, 1, 1);  // never below one
  dt_device two[2] = {{DT_DEVICE_CPU, 0}, {DT_DEVICE_CPU, 1}};
  dt_dp_config cfg = dtt::dp_config();
  cfg.threads_per_replica = -1;
  DpArgs args{"mlp-small"};
  dt_dp *dp = nullptr;
  EXPECT_EQ(dt_dp_create(two, 2, dp_model, &args, dp_optim, nullptr, &cfg, &dp),
            DT_ERR_INVALID_ARG);
  dt_cpu_set_num_threads(1);
}

}  // namespace
