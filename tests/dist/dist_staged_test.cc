// Host-staged device tensors over the mpi communicator, under mpirun.
//
// Default: a stand-in device backend (the CPU table registered as CUDA,
// with page-locked memory, streams and events that record what they are
// asked to do), so the staging protocol and DDP's event protocol run on any
// machine: ready event on the compute stream -> comm stream waits on it ->
// device->host copy on the comm stream -> host all-reduce -> host->device
// copy on the comm stream -> completion event -> the compute stream waits
// on it before the optimizer; the host thread running backward never
// synchronises an event.
//
// DT_TEST_REAL_CUDA=1, or the dist_gpu_staged build (run by
// tools/gpu_check.sh under mpirun -np 2 on a GPU machine): the real CUDA
// backend; the ranks share cuda:0 through host staging (NCCL refuses
// duplicate GPUs) and must match the single-process result.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/cpu.h"
#include "core/env.h"
#include "cuda/cuda.h"
#include "dist/dp.h"
#include "dist/process_group.h"
#include "tests/dist/dist_test_util.h"
#include "tests/stand_in_device.h"

namespace {

dt_pg *g_pg = nullptr;
dt_comm *g_comm = nullptr;
bool g_real = false;
const dt_device kDev = {DT_DEVICE_CUDA, 0};

// ---- the stand-in backend ----

dt_stream *const kCompute = dtt::StandInStream(DT_STREAM_COMPUTE);
dt_stream *const kComm = dtt::StandInStream(DT_STREAM_COMM);

struct Entry {
  std::thread::id thread;
  std::string op;  // record, wait, sync, d2h, h2d, sgd, ssync
  const dt_stream *stream;
  int event;                 // -1 none
  const dt_stream *ev_from;  // where the event was last recorded
};

std::mutex g_mu;
std::vector<Entry> g_trace;
const dt_backend_ops *g_cpu = nullptr;

void Log(const char *op, dt_stream *s, const dtt::StandInEvent *e) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_trace.push_back({std::this_thread::get_id(), op, s, e ? e->id : -1, e ? e->stream : nullptr});
}
std::vector<Entry> TakeTrace() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<Entry> t;
  t.swap(g_trace);
  return t;
}

// The stand-in's watch: the protocol's steps in the trace; staging copies
// checked to use page-locked memory.
void Watch(const dtt::StandInCall &c) {
  switch (c.op) {
    case dtt::StandInOp::kRecord: Log("record", c.stream, c.event); break;
    case dtt::StandInOp::kWait: Log("wait", c.stream, c.event); break;
    case dtt::StandInOp::kEventSync: Log("sync", nullptr, c.event); break;
    case dtt::StandInOp::kStreamSync: Log("ssync", c.stream, nullptr); break;
    case dtt::StandInOp::kCopy:
      if (c.stream == kComm && c.dst_dev.type != c.src_dev.type) {
        bool d2h = c.dst_dev.type == DT_DEVICE_CPU;
        EXPECT_TRUE(dtt::StandInIsPinned(d2h ? c.dst : c.src, c.bytes))
            << "staging copies use page-locked host memory";
        Log(d2h ? "d2h" : "h2d", c.stream, nullptr);
      }
      break;
    case dtt::StandInOp::kAlloc: break;
  }
}
dt_status FakeSgd(const dt_exec *ex, float *param, const float *grad, float *buf, int64_t n,
                  float lr, float momentum, float dampening, float wd, bool nesterov, bool first,
                  const dt_half_out *half) {
  Log("sgd", ex->stream, nullptr);
  return g_cpu->sgd_update(ex, param, grad, buf, n, lr, momentum, dampening, wd, nesterov, first,
                           half);
}

void RegisterStandIn() {
  g_cpu = dt_cpu_backend();
  static dt_backend_ops fake;
  fake = dtt::StandInAsyncOps("stand-in cuda", Watch);
  fake.unavailable = nullptr;
  fake.sgd_update = FakeSgd;
  dt_backend_register(DT_DEVICE_CUDA, &fake);
}

// ---- helpers ----

dt_tensor *OnDevice(const std::vector<float> &v) { return dtt::VectorOn(kDev, v); }
using dtt::Host;

class DistStaged : public ::testing::Test {
 protected:
  void SetUp() override {
    dt_cpu_set_num_threads(1);
    ASSERT_NE(g_comm, nullptr);
    TakeTrace();
  }
  int world() const { return dt_comm_size(g_comm); }
  int rank() const { return dt_comm_rank(g_comm); }
};

TEST_F(DistStaged, CollectivesOnDeviceTensors) {
  int w = world(), r = rank();
  dt_tensor *t = OnDevice({1.0f + r, 2.0f * r, 3.0f});
  dt_tensor *a = OnDevice({1.0f + r, 2.0f * r, 3.0f});
  dt_work *w1 = nullptr, *w2 = nullptr;
  DT_ASSERT_OK(dt_comm_allreduce(g_comm, t, DT_REDUCE_SUM, nullptr, &w1));
  DT_ASSERT_OK(dt_comm_allreduce(g_comm, a, DT_REDUCE_AVG, nullptr, &w2));
  DT_ASSERT_OK(dt_work_wait(w1, 0));
  DT_ASSERT_OK(dt_work_wait(w2, 0));
  dt_work_release(w1);
  dt_work_release(w2);
  float sum_r = w * (w - 1) / 2.0f;
  EXPECT_EQ(Host(t), (std::vector<float>{w + sum_r, 2 * sum_r, 3.0f * w}));
  std::vector<float> avg = Host(a);
  EXPECT_FLOAT_EQ(avg[0], (w + sum_r) / w);
  EXPECT_FLOAT_EQ(avg[2], 3.0f);
  // allgather and reduce_scatter stage input and output separately.
  std::vector<float> zeros(3 * w, 0.0f);
  dt_tensor *g = OnDevice(zeros), *rs = OnDevice({0, 0, 0});
  DT_ASSERT_OK(dt_comm_allgather_sync(g_comm, t, g));
  EXPECT_EQ(Host(g)[3 * (w - 1) + 1], 2 * sum_r);
  dt_work *w3 = nullptr;
  DT_ASSERT_OK(dt_comm_reduce_scatter(g_comm, g, rs, DT_REDUCE_SUM, nullptr, &w3));
  DT_ASSERT_OK(dt_work_wait(w3, 30));
  dt_work_release(w3);
  EXPECT_EQ(Host(rs)[1], w * 2 * sum_r);
  dt_tensor *b = OnDevice({100.0f + r});
  DT_ASSERT_OK(dt_comm_broadcast_sync(g_comm, b, w - 1));
  EXPECT_EQ(Host(b)[0], 100.0f + w - 1);
  if (!g_real) {
    // The first all-reduce, on the communication thread: the comm stream
    // waits on the event the communicator recorded on the compute stream
    // (ready was NULL), copies down, the host syncs only that copy, copies
    // up, records completion; dt_work_wait then syncs the completion.
    std::vector<Entry> tr = TakeTrace();
    std::vector<std::string> ops;
    for (const Entry &e : tr)
      ops.push_back(e.op + (e.stream ? std::string(":") + dtt::StandInStreamName(e.stream) : ""));
    ASSERT_GE(ops.size(), 6u);
    EXPECT_EQ(ops[0], "record:compute");  // w1's own ready event at submission
    auto first = [&](const std::string &op) {
      for (size_t i = 0; i < ops.size(); i++)
        if (ops[i] == op)
          return static_cast<int>(i);
      return -1;
    };
    int wait = first("wait:comm"), d2h = first("d2h:comm"), h2d = first("h2d:comm");
    ASSERT_GE(wait, 0);
    EXPECT_EQ(tr[wait].ev_from, kCompute);
    EXPECT_LT(wait, d2h);
    EXPECT_LT(d2h, h2d);
    bool done_recorded = false;
    for (int i = h2d + 1; i < static_cast<int>(ops.size()) && !done_recorded; i++)
      done_recorded = ops[i] == "record:comm";
    EXPECT_TRUE(done_recorded) << "completion recorded on the comm stream after the copy up";
  }
  for (dt_tensor *p : {t, a, g, rs, b})
    dt_tensor_release(p);
}

// DDP with every parameter and gradient on the device, over 2+ ranks, equals
// one process on the whole batch (CPU reference).
// The event protocol of one DDP step on the stand-in (the trace since
// before its backward), run on the training thread `me`.
void CheckStepProtocol(int s, int n_buckets, std::thread::id me) {
  std::vector<Entry> tr = TakeTrace();
  std::set<int> ready_events, done_events, comm_waited_on, compute_waited_on;
  size_t first_sgd = tr.size();
  int d2h = 0, h2d = 0;
  // The trace interleaves the training and communication threads: "the
  // entry before" means the same thread's previous entry.
  std::map<std::thread::id, std::string> prev_op;
  for (size_t i = 0; i < tr.size(); i++) {
    const Entry &e = tr[i];
    std::string before = prev_op[e.thread];
    prev_op[e.thread] = e.op;
    if (e.op == "sgd" && first_sgd == tr.size())
      first_sgd = i;
    if (e.op == "record" && e.stream == kCompute && e.thread == me)
      ready_events.insert(e.event);
    if (e.op == "record" && e.stream == kComm && before == "h2d")
      done_events.insert(e.event);
    if (e.op == "wait" && e.stream == kComm)
      comm_waited_on.insert(e.event);
    if (e.op == "wait" && e.stream == kCompute && i < first_sgd)
      compute_waited_on.insert(e.event);
    d2h += e.op == "d2h";
    h2d += e.op == "h2d";
    if (i < first_sgd) {
      EXPECT_FALSE(e.op == "sync" && e.thread == me)
          << "step " << s << ": the training thread synchronised an event before the "
          << "optimizer (the host must not block on the device during backward)";
    }
  }
  EXPECT_EQ(static_cast<int>(ready_events.size()), n_buckets) << "step " << s;
  EXPECT_EQ(ready_events, comm_waited_on) << "the comm stream waits on each bucket's event";
  EXPECT_EQ(d2h, n_buckets);
  EXPECT_EQ(h2d, n_buckets);
  EXPECT_EQ(static_cast<int>(done_events.size()), n_buckets);
  EXPECT_EQ(done_events, compute_waited_on)
      << "the compute stream waits on every bucket's completion before the optimizer";
  EXPECT_LT(first_sgd, tr.size()) << "the optimizer ran on the device";
}

// DDP on kDev (several buckets), and with check_protocol every step's
// event protocol checked.
dtt::DdpRun TrainDdpOnDevice(const std::string &model, int steps, int per_rank,
                             bool check_protocol) {
  dt_ddp_config cfg = DT_DDP_CONFIG_DEFAULT;
  cfg.first_bucket_bytes = 32 << 10;  // several buckets
  cfg.bucket_bytes = 128 << 10;
  dtt::DdpWatch watch;
  watch.dev = kDev;
  watch.before_backward = [](int) { TakeTrace(); };
  std::thread::id me = std::this_thread::get_id();
  if (check_protocol)
    watch.after_step = [me](int s, dt_ddp *ddp) {
      CheckStepProtocol(s, dt_ddp_num_buckets(ddp), me);
    };
  return dtt::train_ddp(g_comm, model, steps, per_rank, 1, cfg, watch);
}

TEST_F(DistStaged, DdpOnDeviceEqualsOneProcessWithWorldTimesBatch) {
  const int steps = 4, per_rank = 8;
  for (const char *model : {"mlp", "lenet"}) {
    std::vector<float> ref = dtt::train_reference(model, steps, world() * per_rank);
    dtt::DdpRun run = TrainDdpOnDevice(model, steps, per_rank, !g_real);
    double rel = dtt::rel_error(run.params, ref);
    std::printf("[rank %d] %s on %s over %d ranks, %d buckets, host-staged: relative error %.3g\n",
                rank(), model, g_real ? "cuda:0 (shared)" : "a stand-in device", world(),
                run.n_buckets, rel);
    EXPECT_GE(run.n_buckets, 2) << model;
    // The stand-in computes with the CPU kernels; a GPU differs in rounding.
    EXPECT_LE(rel, g_real ? 1e-4 : 1e-5) << model;
  }
}

// ZeRO on device tensors over host staging: reduce-scatters and in-place
// all-gathers of views into the device's flat buffers, each waiting on
// its event, the gathers behind the sharded update; equal to one process
// (CPU reference). On the GPU machine: two ranks sharing cuda:0.
TEST_F(DistStaged, ZeroOnDeviceEqualsOneProcess) {
  for (const char *model : {"mlp", "lenet"}) {
    dtt::StepSpec spec;
    spec.model = model;
    spec.steps = 3;
    spec.per_rank = 4;
    spec.clip = 0.5f;
    spec.ddp.first_bucket_bytes = 20000;
    spec.ddp.bucket_bytes = 300000;
    std::vector<float> ref = dtt::train_steps(nullptr, world(), spec).params;
    for (int stage : {1, 2}) {
      spec.ddp.zero_stage = stage;
      dtt::StepRun run = dtt::train_steps(g_comm, world(), spec, kDev);
      double rel = dtt::rel_error(run.params, ref);
      std::printf("[rank %d] %s zero %d on %s over %d ranks, %d buckets: relative error %.3g\n",
                  rank(), model, stage, g_real ? "cuda:0 (shared)" : "a stand-in device", world(),
                  run.n_buckets, rel);
      EXPECT_LE(rel, g_real ? 1e-4 : 1e-5) << model << " zero " << stage;
    }
  }
}

// --grad-compress bf16 on device tensors: the 16-bit casts run on the
// device's compute stream around the host-staged 16-bit reductions; every
// stage equals the same compressed training on host tensors (the same
// 16-bit sums; on a GPU its kernels' rounding), and differs from f32.
TEST_F(DistStaged, CompressedOnDeviceEqualsCompressedOnHost) {
  dtt::StepSpec spec = dtt::zero_case_spec({"mlp", 2, 0.5f, false});
  std::vector<float> plain = dtt::train_steps(g_comm, world(), spec).params;
  spec.ddp.grad_compress = DT_DTYPE_BF16;
  for (int stage : {0, 1, 2}) {
    spec.ddp.zero_stage = stage;
    std::vector<float> host = dtt::train_steps(g_comm, world(), spec).params;
    std::vector<float> dev = dtt::train_steps(g_comm, world(), spec, kDev).params;
    double rel = dtt::rel_error(dev, host);
    std::printf("[rank %d] mlp bf16 zero %d on %s: relative error to the host run %.3g\n", rank(),
                stage, g_real ? "cuda:0 (shared)" : "a stand-in device", rel);
    EXPECT_LE(rel, g_real ? 1e-4 : 1e-6) << "zero " << stage;
    EXPECT_GT(dtt::rel_error(host, plain), 1e-7) << "compression changed nothing";
  }
}

// Auto selection: NCCL is unusable here (no GPU for it; or, on the GPU
// machine, the ranks share cuda:0), every rank agrees and falls back to
// host staging.
TEST_F(DistStaged, AutoFallsBackToHostStagingOnEveryRank) {
  dt_comm_config cc = DT_COMM_CONFIG_DEFAULT;
  cc.timeout_s = 30;
  dt_comm *c = nullptr;
  DT_ASSERT_OK(dt_comm_create_for_device(g_pg, kDev, &cc, &c));
  std::string name = dt_comm_backend_name(c);
  if (g_real && world() == 1) {
    EXPECT_EQ(name, dt_nccl_built() ? "nccl" : "mpi");
  } else {
    EXPECT_EQ(name, "mpi");
  }
  dt_tensor *t = OnDevice({1.0f});
  DT_ASSERT_OK(dt_comm_allreduce_sync(c, t, DT_REDUCE_SUM));
  EXPECT_EQ(Host(t)[0], static_cast<float>(world()));
  dt_tensor_release(t);
  dt_comm_destroy(c);
  if (!g_real || world() > 1) {
    cc.backend = DT_COMM_BACKEND_NCCL;
    dt_status st = dt_comm_create_nccl(g_pg, kDev, &cc, &c);
    std::string msg = dt_last_error();
    std::printf("[rank %d] nccl refused as expected: %s\n", rank(), msg.c_str());
    EXPECT_NE(st, DT_OK);
    EXPECT_EQ(c, nullptr);
    if (g_real) {
      EXPECT_NE(msg.find("share GPU"), std::string::npos) << msg;
    }
  }
  DT_ASSERT_OK(dt_comm_barrier_sync(g_comm));
}

// Data-parallel mode over two devices of the stand-in backend, reduced
// through host memory (the local communicator with staging) equals one
// device. Runs in each rank's process independently.
dt_status DpModel(void *, int, dt_module **out) { return dtt::build_model("mlp", out); }
dt_status DpOptim(void *, int, dt_param_arena *arena, dt_optimizer **out) {
  dt_sgd_config c = dtt::test_sgd();
  return dt_optim_sgd_create(arena, &c, out);
}

TEST_F(DistStaged, DataParallelOverDevicesHostStagedEqualsOneDevice) {
  if (g_real && dt_device_count(DT_DEVICE_CUDA) < 2)
    GTEST_SKIP() << "needs 2 GPUs for data-parallel mode (the stand-in backend runs it in CI)";
  const int steps = 4, batch = 16;
  std::vector<float> ref = dtt::train_reference("mlp", steps, batch);
  dt_device devs[2] = {{DT_DEVICE_CUDA, 0}, {DT_DEVICE_CUDA, 1}};
  dt_dp_config cfg = dtt::dp_config();
  cfg.comm.timeout_s = 30;
  cfg.comm.backend = DT_COMM_BACKEND_MPI;  // host memory: the local communicator stages
  dt_dp *dp = nullptr;
  DT_ASSERT_OK(dt_dp_create(devs, 2, DpModel, nullptr, DpOptim, nullptr, &cfg, &dp));
  ASSERT_NO_FATAL_FAILURE(dtt::dp_train(dp, steps, batch));
  std::vector<float> p0 = dtt::arena_values(dtt::replica_arena(dp, 0));
  std::vector<float> p1 = dtt::arena_values(dtt::replica_arena(dp, 1));
  EXPECT_LE(dtt::rel_error(p0, ref), g_real ? 1e-4 : 1e-5);
  EXPECT_EQ(0, std::memcmp(p0.data(), p1.data(), p0.size() * sizeof(float)));
  dt_dp_destroy(dp);
}

}  // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
#ifdef DT_TEST_REAL_CUDA_DEFAULT
  g_real = true;  // the dist_gpu_staged build of this file
#endif
  if (dt_env_bool(DT_ENV_TEST_REAL_CUDA, &g_real) != DT_OK) {
    std::fprintf(stderr, "dist_staged_test: %s\n", dt_last_error());
    return 2;
  }
  if (g_real) {
    dt_cuda_set_tf32(0);  // f32 GEMMs for the comparison with the CPU reference
    if (dt_cuda_probe() != DT_OK) {
      std::fprintf(stderr, "dist_staged_test: DT_TEST_REAL_CUDA=1 but: %s\n", dt_last_error());
      return 1;
    }
  } else {
    RegisterStandIn();
  }
  if (!dtt::start_mpi("dist_staged_test", &g_pg, &g_comm))
    return 1;
  std::printf("dist_staged_test: %s device backend, rank %d of %d\n",
              g_real ? "the real CUDA" : "a stand-in", dt_comm_rank(g_comm), dt_comm_size(g_comm));
  return dtt::run_all_then_stop_mpi(g_pg, g_comm);
}
