// The nccl communicator in one process (world size 1) and data-parallel
// mode over an NCCL clique. Needs a GPU: without one (CI) every GPU test
// skips and says why; what can be checked without one (a clear error from
// dt_comm_create_nccl) runs everywhere. tools/gpu_check.sh runs it on a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/backend.h"
#include "cuda/cuda.h"
#include "dist/dp.h"
#include "dist/process_group.h"
#include "tests/dist/dist_test_util.h"

namespace {

const dt_device kGpu = {DT_DEVICE_CUDA, 0};

// Why NCCL cannot run here, or "" when it can.
std::string NcclUnavailable() {
  if (!dt_nccl_built())
    return "this build has no NCCL (built without the CUDA toolkit, or --config=cpu)";
  if (dt_cuda_probe() != DT_OK)
    return std::string("no usable GPU: ") + dt_last_error();
  return "";
}

#define SKIP_WITHOUT_NCCL()                          \
  do {                                               \
    std::string why_ = NcclUnavailable();            \
    if (!why_.empty())                               \
      GTEST_SKIP() << "NCCL test skipped: " << why_; \
  } while (0)

class DistNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    dt_cuda_set_tf32(0);  // compare f32 GEMMs with the CPU reference
    dt_pg_config pc = DT_PG_CONFIG_DEFAULT;
    pc.mode = DT_PG_SINGLE;
    DT_ASSERT_OK(dt_pg_create(&pc, &pg_));
  }
  void TearDown() override {
    dt_comm_destroy(comm_);
    dt_pg_destroy(pg_);
  }
  void CreateComm() {
    dt_comm_config cc = DT_COMM_CONFIG_DEFAULT;
    cc.timeout_s = 60;
    cc.backend = DT_COMM_BACKEND_NCCL;
    DT_ASSERT_OK(dt_comm_create_for_device(pg_, kGpu, &cc, &comm_));
    ASSERT_STREQ(dt_comm_backend_name(comm_), "nccl");
  }
  dt_pg *pg_ = nullptr;
  dt_comm *comm_ = nullptr;
};

dt_tensor *OnGpu(const std::vector<float> &v) { return dtt::VectorOn(kGpu, v); }
using dtt::Host;

// Runs everywhere: the failure is a status with a message, never a crash.
TEST_F(DistNccl, CreationFailsClearlyWithoutNcclOrGpu) {
  std::string why = NcclUnavailable();
  if (why.empty())
    GTEST_SKIP() << "a GPU and NCCL are present: the creation tests below cover this machine";
  dt_comm *c = nullptr;
  dt_status st = dt_comm_create_nccl(pg_, kGpu, nullptr, &c);
  std::string msg = dt_last_error();
  std::printf("dt_comm_create_nccl here: %s: %s\n", dt_status_name(st), msg.c_str());
  EXPECT_NE(st, DT_OK);
  EXPECT_EQ(c, nullptr);
  EXPECT_FALSE(msg.empty());
  if (!dt_nccl_built()) {
    EXPECT_EQ(st, DT_ERR_UNSUPPORTED);
    EXPECT_NE(msg.find("no NCCL"), std::string::npos) << msg;
  }
  // auto still gives a working communicator for cpu tensors.
  DT_ASSERT_OK(dt_comm_create_for_device(pg_, DT_CPU, nullptr, &comm_));
}

TEST_F(DistNccl, WorldSizeOneCollectives) {
  SKIP_WITHOUT_NCCL();
  CreateComm();
  EXPECT_EQ(dt_comm_size(comm_), 1);
  dt_tensor *t = OnGpu({1, 2, 3}), *a = OnGpu({4, 5, 6});
  dt_work *w1 = nullptr, *w2 = nullptr;
  DT_ASSERT_OK(dt_comm_allreduce(comm_, t, DT_REDUCE_SUM, nullptr, &w1));
  DT_ASSERT_OK(dt_comm_allreduce(comm_, a, DT_REDUCE_AVG, nullptr, &w2));
  // The compute stream waits; the host does not.
  DT_ASSERT_OK(dt_work_wait_stream(w2, nullptr));
  DT_ASSERT_OK(dt_work_wait(w1, 30));
  EXPECT_TRUE(dt_work_test(w1));
  double s = -1, e = -1, waited = -1;
  DT_ASSERT_OK(dt_work_device_times(w2, &s, &e, &waited));
  EXPECT_GE(e, s);
  EXPECT_GE(waited, 0);
  dt_work_release(w1);
  dt_work_release(w2);
  EXPECT_EQ(Host(t), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(Host(a), (std::vector<float>{4, 5, 6}));
  dt_tensor *g = OnGpu({0, 0, 0}), *rs = OnGpu({0, 0, 0}), *b = OnGpu({7});
  DT_ASSERT_OK(dt_comm_allgather_sync(comm_, t, g));
  EXPECT_EQ(Host(g), (std::vector<float>{1, 2, 3}));
  dt_work *w3 = nullptr;
  DT_ASSERT_OK(dt_comm_reduce_scatter(comm_, g, rs, DT_REDUCE_SUM, nullptr, &w3));
  DT_ASSERT_OK(dt_work_wait(w3, 30));
  dt_work_release(w3);
  EXPECT_EQ(Host(rs), (std::vector<float>{1, 2, 3}));
  DT_ASSERT_OK(dt_comm_broadcast_sync(comm_, b, 0));
  DT_ASSERT_OK(dt_comm_barrier_sync(comm_));
  // Host tensors are refused with a clear status.
  int64_t one = 1;
  float v = 1;
  dt_tensor *h = nullptr;
  DT_ASSERT_OK(dt_tensor_from_host(&v, &one, 1, DT_DTYPE_F32, DT_CPU, &h));
  dt_work *bad = nullptr;
  EXPECT_EQ(dt_comm_allreduce(comm_, h, DT_REDUCE_SUM, nullptr, &bad), DT_ERR_DEVICE_MISMATCH);
  for (dt_tensor *p : {t, a, g, rs, b, h})
    dt_tensor_release(p);
}

// DDP on cuda:0 over nccl (world 1) through the same reducer: matches the
// CPU reference, and the device timeline of one step shows the first
// bucket's all-reduce starting on the communication stream before the
// compute stream finished backward.
TEST_F(DistNccl, DdpStepMatchesReferenceAndOverlapsBackward) {
  SKIP_WITHOUT_NCCL();
  CreateComm();
  const std::string model = "mlp-wide";
  const int steps = 3, batch = 256;
  std::vector<float> ref = dtt::train_reference(model, steps, batch);
  dt_module *m = nullptr;
  dt_param_arena *arena = nullptr;
  dt_optimizer *opt = nullptr;
  dt_ddp *ddp = nullptr;
  dt_ddp_config cfg = DT_DDP_CONFIG_DEFAULT;
  cfg.first_bucket_bytes = 1 << 20;
  cfg.bucket_bytes = 4 << 20;
  dt_sgd_config sgd = dtt::test_sgd();
  DT_ASSERT_OK(dtt::build_model(model, &m));
  DT_ASSERT_OK(dt_module_to(m, kGpu));
  DT_ASSERT_OK(dt_param_arena_create(m, &arena));
  DT_ASSERT_OK(dt_optim_sgd_create(arena, &sgd, &opt));
  DT_ASSERT_OK(dt_ddp_create(m, arena, comm_, &cfg, &ddp));
  ASSERT_GE(dt_ddp_num_buckets(ddp), 3);
  int overlapped = 0;
  for (int s = 0; s < steps; s++) {
    dt_tensor *xh, *yh, *x = nullptr, *y = nullptr;
    dtt::make_batch(static_cast<int64_t>(s) * batch, batch, &xh, &yh);
    DT_ASSERT_OK(dt_tensor_to_device(xh, kGpu, &x));
    DT_ASSERT_OK(dt_tensor_to_device(yh, kGpu, &y));
    DT_ASSERT_OK(dtt::loss_backward(m, x, y, 1.0f, nullptr));
    DT_ASSERT_OK(dt_ddp_finish_backward(ddp));
    DT_ASSERT_OK(dt_optim_step(opt));
    DT_ASSERT_OK(dt_optim_zero_grad(opt));
    for (dt_tensor *p : {xh, yh, x, y})
      dt_tensor_release(p);
    DT_ASSERT_OK(dt_ddp_read_device_timeline(ddp));
    dt_ddp_timeline t;
    dt_ddp_get_timeline(ddp, &t);
    std::printf(
        "step %d timeline (ms on cuda:0's clock): backward ends on the compute stream at "
        "%.3f; all-reduces on the comm stream:",
        s, t.dev_backward_end_ms);
    for (int b = 0; b < t.n_buckets; b++)
      std::printf(" #%d %zu B [%.3f, %.3f]", b, t.buckets[b].bytes, t.buckets[b].dev_start_ms,
                  t.buckets[b].dev_end_ms);
    std::printf("\n");
    for (int b = 0; b < t.n_buckets; b++) {
      EXPECT_GE(t.buckets[b].dev_end_ms, t.buckets[b].dev_start_ms);
      if (b > 0) {
        EXPECT_GE(t.buckets[b].dev_start_ms, t.buckets[b - 1].dev_end_ms);  // one stream
      }
    }
    overlapped += t.buckets[0].dev_start_ms < t.dev_backward_end_ms;
  }
  EXPECT_EQ(overlapped, steps) << "bucket 0's all-reduce started before backward ended";
  std::vector<float> got = dtt::arena_values(arena);
  double rel = dtt::rel_error(got, ref);
  std::printf("%s DDP on cuda:0 over nccl vs CPU reference: relative error %.3g\n", model.c_str(),
              rel);
  EXPECT_LE(rel, 1e-4);
  dt_ddp_destroy(ddp);
  dt_optim_destroy(opt);
  dt_param_arena_destroy(arena);
  dt_module_destroy(m);
}

dt_status DpModel(void *, int, dt_module **out) { return dtt::build_model("mlp", out); }
dt_status DpOptim(void *, int, dt_param_arena *arena, dt_optimizer **out) {
  dt_sgd_config c = dtt::test_sgd();
  return dt_optim_sgd_create(arena, &c, out);
}

// --mode dp over every visible GPU (an NCCL clique; one GPU works too).
TEST_F(DistNccl, DataParallelOverGpusEqualsOneDevice) {
  SKIP_WITHOUT_NCCL();
  int n = dt_device_count(DT_DEVICE_CUDA);
  if (n > 4)
    n = 4;
  const int steps = 3, batch = 32;
  std::vector<float> ref = dtt::train_reference("mlp", steps, batch);
  std::vector<dt_device> devs;
  for (int i = 0; i < n; i++)
    devs.push_back({DT_DEVICE_CUDA, i});
  dt_dp_config cfg = dtt::dp_config();
  cfg.comm.timeout_s = 60;
  cfg.comm.backend = DT_COMM_BACKEND_NCCL;
  dt_dp *dp = nullptr;
  DT_ASSERT_OK(dt_dp_create(devs.data(), n, DpModel, nullptr, DpOptim, nullptr, &cfg, &dp));
  ASSERT_NO_FATAL_FAILURE(dtt::dp_train(dp, steps, batch));
  std::vector<float> p0 = dtt::arena_values(dtt::replica_arena(dp, 0));
  double rel = dtt::rel_error(p0, ref);
  std::printf("data-parallel over %d GPU(s) via an NCCL clique: relative error %.3g\n", n, rel);
  EXPECT_LE(rel, 1e-4);
  for (int i = 1; i < n; i++)
    EXPECT_EQ(dtt::arena_values(dtt::replica_arena(dp, i)), p0) << "replica " << i;
  dt_dp_destroy(dp);
}

}  // namespace

namespace {

// Error paths: dt_comm_abort aborts the NCCL communicator (ncclCommAbort)
// after a collective; later collectives fail at once, and the destroy
// does not call ncclCommDestroy.
TEST_F(DistNccl, AbortOnAnErrorPathFailsLaterCollectives) {
  SKIP_WITHOUT_NCCL();
  CreateComm();
  dt_tensor *t = OnGpu({1, 2, 3});
  DT_ASSERT_OK(dt_comm_allreduce_sync(comm_, t, DT_REDUCE_SUM));
  dt_comm_abort(comm_, "the test failed on purpose");
  dt_work *w = nullptr;
  EXPECT_EQ(dt_comm_allreduce(comm_, t, DT_REDUCE_SUM, nullptr, &w), DT_ERR_STATE);
  dt_tensor_release(t);
  dt_comm_destroy(comm_);
  comm_ = nullptr;
}

// 16-bit reductions over nccl (ncclBfloat16 / ncclFloat16) at world size
// 1: all-reduce (sum, average) and reduce-scatter give the input back bit
// for bit; and --grad-compress bf16 training through the reducer on the
// GPU (stages 0, 1, 2) matches the same compressed training on the CPU
// over a local group of one.
TEST_F(DistNccl, SixteenBitReductionsAndCompressedTraining) {
  SKIP_WITHOUT_NCCL();
  CreateComm();
  for (dt_dtype t : {DT_DTYPE_BF16, DT_DTYPE_F16}) {
    dt_tensor *host = dtt::Vector16(t, dtt::reduce16_values(0, 1007));
    std::vector<uint16_t> want = dtt::Bits16(host);
    for (int k = 0; k < 3; k++) {
      dt_tensor *x = nullptr, *out = nullptr;
      DT_ASSERT_OK(dt_tensor_to_device(host, kGpu, &x));
      if (k < 2) {
        DT_ASSERT_OK(dt_comm_allreduce_sync(comm_, x, k == 0 ? DT_REDUCE_SUM : DT_REDUCE_AVG));
      } else {
        DT_ASSERT_OK(dt_tensor_to_device(host, kGpu, &out));
        dt_work *w = nullptr;
        DT_ASSERT_OK(dt_comm_reduce_scatter(comm_, x, out, DT_REDUCE_AVG, nullptr, &w));
        DT_ASSERT_OK(dt_work_wait(w, 30));
        dt_work_release(w);
      }
      EXPECT_TRUE(dtt::same_bits(dtt::Bits16(out ? out : x), want)) << dt_dtype_name(t) << " " << k;
      dt_tensor_release(x);
      dt_tensor_release(out);
    }
    dt_tensor_release(host);
  }
  dt_local_group *g = nullptr;
  dt_comm *local = nullptr;
  DT_ASSERT_OK(dt_local_group_create(1, &g));
  DT_ASSERT_OK(dt_comm_create_local(g, 0, nullptr, &local));
  dt_local_group_release(g);
  dtt::StepSpec spec = dtt::zero_case_spec({"mlp", 2, 0.5f, false});
  spec.ddp.grad_compress = DT_DTYPE_BF16;
  for (int stage : {0, 1, 2}) {
    spec.ddp.zero_stage = stage;
    std::vector<float> cpu = dtt::train_steps(local, 1, spec).params;
    std::vector<float> gpu = dtt::train_steps(comm_, 1, spec, kGpu).params;
    double rel = dtt::rel_error(gpu, cpu);
    std::printf("bf16 zero %d over nccl, world 1: relative error to the CPU %.3g\n", stage, rel);
    EXPECT_LE(rel, 1e-4) << "zero " << stage;
  }
  dt_comm_destroy(local);
}

// ZeRO over nccl at world size 1 (reduce-scatter and in-place all-gather
// on the comm stream, waiting on their events; the clipping sum gathered
// through the GPU) and in data-parallel mode over an NCCL clique of every
// visible GPU (one works too): equal to the CPU reference.
TEST_F(DistNccl, ZeroStagesMatchReference) {
  SKIP_WITHOUT_NCCL();
  CreateComm();
  dtt::StepSpec spec;
  spec.model = "mlp";
  spec.steps = 3;
  spec.per_rank = 16;
  spec.clip = 0.5f;
  spec.ddp.first_bucket_bytes = 20000;
  spec.ddp.bucket_bytes = 300000;
  std::vector<float> ref = dtt::train_steps(nullptr, 1, spec).params;
  for (int stage : {1, 2}) {
    spec.ddp.zero_stage = stage;
    dtt::StepRun run = dtt::train_steps(comm_, 1, spec, kGpu);
    double rel = dtt::rel_error(run.params, ref);
    std::printf("zero %d over nccl, world 1, %d buckets: relative error %.3g\n", stage,
                run.n_buckets, rel);
    EXPECT_LE(rel, 1e-4) << "zero " << stage;
  }
  int n = dt_device_count(DT_DEVICE_CUDA);
  n = n > 4 ? 4 : n;
  std::vector<dt_device> devs;
  for (int i = 0; i < n; i++)
    devs.push_back({DT_DEVICE_CUDA, i});
  const int steps = 3, batch = 32;
  std::vector<float> dp_ref = dtt::train_reference("mlp", steps, batch);
  for (int stage : {1, 2}) {
    dt_dp_config cfg = dtt::dp_config();
    cfg.comm.timeout_s = 60;
    cfg.comm.backend = DT_COMM_BACKEND_NCCL;
    cfg.ddp.zero_stage = stage;
    dt_dp *dp = nullptr;
    DT_ASSERT_OK(dt_dp_create(devs.data(), n, DpModel, nullptr, DpOptim, nullptr, &cfg, &dp));
    for (int s = 0; s < steps; s++) {
      dt_tensor *x, *y;
      dtt::make_batch(static_cast<int64_t>(s) * batch, batch, &x, &y);
      DT_ASSERT_OK(dt_dp_step(dp, x, y, nullptr));
      dt_tensor_release(x);
      dt_tensor_release(y);
    }
    std::vector<float> p0 = dtt::arena_values(dtt::replica_arena(dp, 0));
    double rel = dtt::rel_error(p0, dp_ref);
    std::printf("zero %d, data-parallel over %d GPU(s): relative error %.3g\n", stage, n, rel);
    EXPECT_LE(rel, 1e-4) << "zero " << stage;
    for (int i = 1; i < n; i++)
      EXPECT_EQ(dtt::arena_values(dtt::replica_arena(dp, i)), p0) << "replica " << i;
    dt_dp_destroy(dp);
  }
}

}  // namespace
