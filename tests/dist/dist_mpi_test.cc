// dist/ across processes: run under `mpirun -np W` (see dist_mpi_test.sh).
// Every rank runs every test; each test's collectives are the same on all
// ranks. The communicator's watchdog (30 s here) turns a rank that fails
// early into a job abort rather than a hang.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/cpu.h"
#include "dist/process_group.h"
#include "tests/dist/dist_test_util.h"

namespace {

dt_pg *g_pg = nullptr;
dt_comm *g_comm = nullptr;

class DistMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    dt_cpu_set_num_threads(1);
    ASSERT_NE(g_comm, nullptr);
  }
  int world() const { return dt_comm_size(g_comm); }
  int rank() const { return dt_comm_rank(g_comm); }
};

TEST_F(DistMpi, ProcessGroupFromMpirun) {
  EXPECT_TRUE(dt_pg_uses_mpi(g_pg));
  EXPECT_EQ(dt_pg_world_size(g_pg), world());
  EXPECT_GE(dt_pg_mpi_thread_level(g_pg), 2);  // SERIALIZED or MULTIPLE
  // One host: the shared-memory split gives every rank.
  EXPECT_EQ(dt_pg_local_size(g_pg), world());
  EXPECT_EQ(dt_pg_local_rank(g_pg), rank());
  char buf[256];
  std::printf("[rank %d] %s\n", rank(), dt_pg_describe(g_pg, buf, sizeof buf));
}

TEST_F(DistMpi, Collectives) {
  int w = world(), r = rank();
  std::vector<float> v = {1.0f + r, 2.0f * r, 3.0f};
  int64_t n = 3, nw = 3 * w;
  dt_tensor *t = nullptr, *a = nullptr, *g = nullptr, *rs_out = nullptr;
  DT_ASSERT_OK(dt_tensor_from_host(v.data(), &n, 1, DT_DTYPE_F32, DT_CPU, &t));
  DT_ASSERT_OK(dt_tensor_from_host(v.data(), &n, 1, DT_DTYPE_F32, DT_CPU, &a));
  DT_ASSERT_OK(dt_tensor_zeros(&nw, 1, DT_DTYPE_F32, DT_CPU, &g));
  DT_ASSERT_OK(dt_tensor_zeros(&n, 1, DT_DTYPE_F32, DT_CPU, &rs_out));
  dt_work *w1 = nullptr, *w2 = nullptr;
  DT_ASSERT_OK(dt_comm_allreduce(g_comm, t, DT_REDUCE_SUM, nullptr, &w1));
  DT_ASSERT_OK(dt_comm_allreduce(g_comm, a, DT_REDUCE_AVG, nullptr, &w2));
  DT_ASSERT_OK(dt_work_wait(w2, 0));  // in order: w1 is done too
  EXPECT_TRUE(dt_work_test(w1));
  DT_ASSERT_OK(dt_work_wait(w1, 0));
  EXPECT_LT(dt_work_seq(w1), dt_work_seq(w2));
  dt_work_release(w1);
  dt_work_release(w2);
  float sum_r = w * (w - 1) / 2.0f;
  auto item = [](dt_tensor *p, int64_t i) {
    double v = NAN;
    dt_tensor_item(p, i, &v);
    return v;
  };
  EXPECT_EQ(item(t, 0), w + sum_r);
  EXPECT_EQ(item(t, 1), 2 * sum_r);
  EXPECT_FLOAT_EQ(item(a, 2), 3.0f);
  EXPECT_FLOAT_EQ(item(a, 0), (w + sum_r) / w);
  DT_ASSERT_OK(dt_comm_allgather_sync(g_comm, t, g));
  EXPECT_EQ(item(g, 3 * (w - 1) + 1), 2 * sum_r);
  // reduce_scatter of g (every rank holds the same w*3 values)
  dt_work *w3 = nullptr;
  DT_ASSERT_OK(dt_comm_reduce_scatter(g_comm, g, rs_out, DT_REDUCE_SUM, nullptr, &w3));
  DT_ASSERT_OK(dt_work_wait(w3, 30));
  dt_work_release(w3);
  EXPECT_EQ(item(rs_out, 1), w * 2 * sum_r);
  // broadcast from the last rank
  float mine = 100.0f + r;
  int64_t one = 1;
  dt_tensor *b = nullptr;
  DT_ASSERT_OK(dt_tensor_from_host(&mine, &one, 1, DT_DTYPE_F32, DT_CPU, &b));
  DT_ASSERT_OK(dt_comm_broadcast_sync(g_comm, b, w - 1));
  EXPECT_EQ(item(b, 0), 100.0 + w - 1);
  DT_ASSERT_OK(dt_comm_barrier_sync(g_comm));
  for (dt_tensor *p : {t, a, g, rs_out, b})
    dt_tensor_release(p);
}

// The f32 all-reduce (comm_mpi.c's ring: world segments, each passed on in
// chunks of 32768 elements) at sizes around the segment and chunk
// boundaries, odd ones and ones smaller than the world: every element the
// exact sum (small integers) or average, the same bits on every rank.
TEST_F(DistMpi, AllreduceF32AtSegmentAndChunkBoundaries) {
  const int w = world(), r = rank();
  const int64_t chunk = 32768;
  std::vector<int64_t> sizes = {1, 2, 3, 5, 7, 1000, chunk - 1, chunk, chunk + 1};
  for (int64_t k : {1, 2, 3})
    for (int64_t d : {-1, 0, 1})
      sizes.push_back(k * w * chunk + d);
  sizes.push_back(2 * w * chunk + 3 * chunk / 2 + 5);
  for (int64_t n : sizes) {
    for (dt_reduce_op op : {DT_REDUCE_SUM, DT_REDUCE_AVG}) {
      std::vector<float> v(n);
      auto value = [](int rank, int64_t i) { return (float)((i * 7 + rank * 13) % 101 - 50); };
      for (int64_t i = 0; i < n; i++)
        v[i] = value(r, i);
      dt_tensor *t = nullptr;
      DT_ASSERT_OK(dt_tensor_from_host(v.data(), &n, 1, DT_DTYPE_F32, DT_CPU, &t));
      DT_ASSERT_OK(dt_comm_allreduce_sync(g_comm, t, op));
      const float *got = static_cast<const float *>(dt_tensor_data(t));
      int64_t bad = -1;
      for (int64_t i = 0; i < n && bad < 0; i++) {
        float sum = 0;
        for (int k = 0; k < w; k++)
          sum += value(k, i);  // small integers: exact in any order
        float want = op == DT_REDUCE_AVG ? sum / (float)w : sum;
        if (std::memcmp(&got[i], &want, sizeof want) != 0)
          bad = i;
      }
      EXPECT_EQ(bad, -1) << "n " << n << (op == DT_REDUCE_AVG ? " avg" : " sum") << ": element "
                         << bad << " is " << (bad >= 0 ? got[bad] : 0.0f);
      dt_tensor_release(t);
    }
  }
}

// 16-bit all-reduce and reduce-scatter over MPI (our reduce-scatter +
// all-gather of 2-byte elements) equal the f32 sum in rank order rounded
// once, bit for bit; f16 overflow is inf.
TEST_F(DistMpi, SixteenBitReductionsRoundTheF32SumOnce) {
  for (dt_dtype t : {DT_DTYPE_BF16, DT_DTYPE_F16})
    dtt::check_reduce16(g_comm, t);
}

// The reducer's --grad-compress over MPI: the f32 gradients hold exactly
// the documented 16-bit average; f16 gradients past 65504 are inf.
TEST_F(DistMpi, CompressedGradientsAreTheRounded16BitAverage) {
  for (dt_dtype t : {DT_DTYPE_BF16, DT_DTYPE_F16})
    dtt::check_compressed_gradients(g_comm, t, 1.0f);
  dtt::check_compressed_gradients(g_comm, DT_DTYPE_F16, 1048576.0f);
}

// Every rank holds bitwise the same parameters.
void expect_same_on_every_rank(dt_comm *comm, const std::vector<float> &params) {
  int w = dt_comm_size(comm);
  int64_t n = static_cast<int64_t>(params.size()), nw = n * w;
  dt_tensor *mine = nullptr, *all = nullptr;
  DT_ASSERT_OK(dt_tensor_from_host(params.data(), &n, 1, DT_DTYPE_F32, DT_CPU, &mine));
  DT_ASSERT_OK(dt_tensor_zeros(&nw, 1, DT_DTYPE_F32, DT_CPU, &all));
  DT_ASSERT_OK(dt_comm_allgather_sync(comm, mine, all));
  std::vector<float> v(static_cast<size_t>(nw));
  dt_tensor_to_host(all, v.data(), v.size() * sizeof(float));
  for (int k = 1; k < w; k++)
    EXPECT_EQ(0, std::memcmp(v.data(), v.data() + k * n, n * sizeof(float)))
        << "rank " << k << " differs from rank 0";
  dt_tensor_release(mine);
  dt_tensor_release(all);
}

void check_ddp_equals_big_batch(dt_comm *comm, const std::string &model, int per_rank,
                                int accum = 1) {
  const int steps = 5;
  int w = dt_comm_size(comm);
  std::vector<float> ref = dtt::train_reference(model, steps, w * per_rank * accum);
  dtt::DdpRun run = dtt::train_ddp(comm, model, steps, per_rank, accum);
  double rel = dtt::rel_error(run.params, ref);
  std::printf("[rank %d] %s W=%d b=%d accum=%d: relative error %.3g, max abs diff %.3g\n",
              dt_comm_rank(comm), model.c_str(), w, per_rank, accum, rel,
              dtt::max_abs_diff(run.params, ref));
  EXPECT_LE(rel, 1e-5);
  expect_same_on_every_rank(comm, run.params);
}

// ZeRO stages 1 and 2 over MPI equal stage 0 and one process on the whole
// batch (the training step: forward, loss, backward, clipping, update),
// with accumulation, clipping (partial norms summed over the ranks) and
// AdamW; buckets that split parameters; every rank ends bitwise equal.
TEST_F(DistMpi, ZeroStagesEqualAllReduceAndOneProcess) {
  const std::string who = "[rank " + std::to_string(rank()) + "] ";
  for (const dtt::ZeroCase &c : dtt::kZeroCases) {
    std::vector<float> ref = dtt::train_steps(nullptr, world(), dtt::zero_case_spec(c)).params;
    dtt::expect_zero_stages(
        c, world(), ref,
        [this](const dtt::StepSpec &s) {
          dtt::StepRun run = dtt::train_steps(g_comm, world(), s);
          expect_same_on_every_rank(g_comm, run.params);
          return run;
        },
        who);
  }
}

// --grad-compress bf16 over MPI with accumulation and clipping: every
// stage leaves every rank bitwise equal, ZeRO 1 and 2 equal stage 0, and
// all are close to (not equal to) uncompressed training.
TEST_F(DistMpi, CompressedTrainingOnEveryStage) {
  dtt::StepSpec spec = dtt::zero_case_spec({"mlp", 2, 0.5f, false});
  std::vector<float> plain = dtt::train_steps(g_comm, world(), spec).params, stage0;
  spec.ddp.grad_compress = DT_DTYPE_BF16;
  for (int stage : {0, 1, 2}) {
    spec.ddp.zero_stage = stage;
    std::vector<float> p = dtt::train_steps(g_comm, world(), spec).params;
    double rel = dtt::rel_error(p, plain);
    std::printf("[rank %d] mlp W=%d bf16 zero %d: relative error to f32 %.3g\n", rank(), world(),
                stage, rel);
    EXPECT_GT(rel, 1e-7);
    EXPECT_LT(rel, 2e-4);
    if (stage == 0)
      stage0 = p;
    else
      EXPECT_LE(dtt::rel_error(p, stage0), 1e-5) << "zero " << stage;
    expect_same_on_every_rank(g_comm, p);
  }
}

// The schedule of issue 16 over MPI (2 and 3 ranks): the update per bucket
// gives the bits of one update, split buckets those of unsplit ones on 2
// ranks and within 1e-5 on 3 (dtt::expect_schedule_bitwise: the ring's
// order of addition depends on where a bucket begins); every rank equal.
TEST_F(DistMpi, UpdatePerBucketChangesNoBitAndSplitBucketsAgree) {
  const std::string who = "[rank " + std::to_string(rank()) + "] ";
  dtt::expect_schedule_bitwise(
      world(),
      [this](const dtt::StepSpec &s) {
        dtt::StepRun run = dtt::train_steps(g_comm, world(), s);
        expect_same_on_every_rank(g_comm, run.params);
        return run;
      },
      who, world() <= 2);
}

// On one node (the shared-memory transport) the reducer keeps its
// gradients in memory the ranks share by default and all-reduces them in
// place: the bits of a private arena's staged all-reduces, every rank
// equal; with DT_COMM_SHM=0 (MPI's path) there is no such memory.
TEST_F(DistMpi, SharedGradientsChangeNoBit) {
  for (const char *model : {"mlp", "lenet"}) {
    dtt::StepSpec spec = dtt::zero_case_spec({model, 2, 0.0f, false});
    dtt::StepRun shared = dtt::train_steps(g_comm, world(), spec);
    spec.ddp.shared_grads = 0;
    dtt::StepRun own = dtt::train_steps(g_comm, world(), spec);
    bool shm = std::string(dt_comm_transport(g_comm)) == "shm";
    EXPECT_EQ(shared.grads_shared, shm && world() > 1) << model;
    EXPECT_FALSE(own.grads_shared) << model;
    EXPECT_EQ(shared.params, own.params) << model << ": shared gradients changed the result";
    expect_same_on_every_rank(g_comm, shared.params);
  }
}

TEST_F(DistMpi, DdpMlpEqualsOneProcessWithWorldTimesBatch) {
  check_ddp_equals_big_batch(g_comm, "mlp", 8);
}

TEST_F(DistMpi, DdpLenetEqualsOneProcessWithWorldTimesBatch) {
  check_ddp_equals_big_batch(g_comm, "lenet", 8);
}

// GPT-2 with its LM head tied to the token embedding: wte gets gradients
// from two places, and its bucket may launch only after both.
TEST_F(DistMpi, DdpTinyGptEqualsOneProcessWithWorldTimesBatch) {
  check_ddp_equals_big_batch(g_comm, "gpt2-micro", 4);
}

TEST_F(DistMpi, DdpNoSyncAccumulationEqualsOneBatch) {
  check_ddp_equals_big_batch(g_comm, "mlp-small", 4, 3);
}

// Overlap, measured: with several buckets the first bucket's all-reduce is
// launched from a grad-ready hook and starts on the communication thread
// while backward is still running. Launch-before-end is exact; start time
// depends on the scheduler (this machine may be shared and oversubscribed),
// so the start is required in 2 of 8 steps, not all (under load 1 of 3 was
// seen; a reducer that waits for backward's end starts none).
// The same with --grad-compress bf16: the casts do not move the launches.
void check_first_allreduce_starts_early(dt_dtype compress) {
  dt_ddp_config cfg = DT_DDP_CONFIG_DEFAULT;
  cfg.grad_compress = compress;
  cfg.first_bucket_bytes = 64 << 10;
  cfg.bucket_bytes = 256 << 10;
  dt_module *m = nullptr;
  dt_param_arena *arena = nullptr;
  dt_ddp *ddp = nullptr;
  DT_ASSERT_OK(dtt::build_model("mlp-wide", &m));
  DT_ASSERT_OK(dt_param_arena_create(m, &arena));
  DT_ASSERT_OK(dt_ddp_create(m, arena, g_comm, &cfg, &ddp));
  ASSERT_GE(dt_ddp_num_buckets(ddp), 3);
  const int steps = 8, batch = 64;
  int started_early = 0;
  for (int s = 0; s < steps; s++) {
    dt_tensor *x, *y;
    dtt::make_batch((s * dt_comm_size(g_comm) + dt_comm_rank(g_comm)) * batch, batch, &x, &y);
    DT_ASSERT_OK(dtt::loss_backward(m, x, y, 1.0f, nullptr));
    DT_ASSERT_OK(dt_ddp_finish_backward(ddp));
    DT_ASSERT_OK(dt_param_arena_zero_grad(arena));
    dt_tensor_release(x);
    dt_tensor_release(y);
    dt_ddp_timeline t;
    dt_ddp_get_timeline(ddp, &t);
    std::printf(
        "[rank %d] %s step %d: backward %.1f ms (first grad ready -> finish entered); "
        "buckets (ms relative to backward end):",
        dt_comm_rank(g_comm), dt_ddp_grad_compress_name(compress), s,
        1e3 * (t.backward_end_s - t.first_grad_s));
    for (int b = 0; b < t.n_buckets; b++)
      std::printf(" #%d %zu B launch %+.1f start %+.1f end %+.1f;", b, t.buckets[b].bytes,
                  1e3 * (t.buckets[b].launch_s - t.backward_end_s),
                  1e3 * (t.buckets[b].start_s - t.backward_end_s),
                  1e3 * (t.buckets[b].end_s - t.backward_end_s));
    std::printf("\n");
    EXPECT_LT(t.buckets[0].launch_s, t.backward_end_s) << "step " << s;
    for (int b = 1; b < t.n_buckets; b++)
      EXPECT_GE(t.buckets[b].launch_s, t.buckets[b - 1].launch_s) << "step " << s;
    started_early += t.buckets[0].start_s < t.backward_end_s;
  }
  EXPECT_GE(started_early, 2) << "the first bucket's all-reduce started before backward ended in "
                              << started_early << " of " << steps << " steps, "
                              << dt_ddp_grad_compress_name(compress);
  dt_ddp_destroy(ddp);
  dt_param_arena_destroy(arena);
  dt_module_destroy(m);
}

TEST_F(DistMpi, FirstAllreduceStartsBeforeBackwardEnds) {
  for (dt_dtype compress : {DT_DTYPE_F32, DT_DTYPE_BF16})
    check_first_allreduce_starts_early(compress);
}

TEST_F(DistMpi, ParameterMismatchFailsOnEveryRank) {
  if (world() < 2)
    GTEST_SKIP() << "a mismatch needs at least 2 ranks (this run has " << world() << ")";
  // The last rank builds a narrower hidden layer.
  int hidden = rank() == world() - 1 ? 48 : 64;
  int sizes[] = {784, hidden, 10};
  dt_module *m = nullptr;
  dt_param_arena *arena = nullptr;
  dt_ddp *ddp = nullptr;
  DT_ASSERT_OK(dt_model_mlp(sizes, 3, 1, &m));
  DT_ASSERT_OK(dt_param_arena_create(m, &arena));
  dt_status st = dt_ddp_create(m, arena, g_comm, nullptr, &ddp);
  std::string msg = dt_last_error();
  std::printf("[rank %d] %s\n", rank(), msg.c_str());
  EXPECT_EQ(st, DT_ERR_DIST_MISMATCH) << msg;
  EXPECT_EQ(ddp, nullptr);
  EXPECT_NE(msg.find("\"1.weight\" f32[64, 784]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"1.weight\" f32[48, 784]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank " + std::to_string(world() - 1)), std::string::npos) << msg;
  dt_param_arena_destroy(arena);
  dt_module_destroy(m);
  // The communicator is still in step on every rank.
  DT_ASSERT_OK(dt_comm_barrier_sync(g_comm));
}

// Collectives that would pair up wrongly (another size, another kind) are
// refused on every rank before any data moves, naming the ranges over the
// ranks; without the check MPI exchanged buffers of different sizes and
// corrupted the heap.
TEST_F(DistMpi, MismatchedCollectivesFailOnEveryRankBeforeDataMoves) {
  if (world() < 2)
    GTEST_SKIP() << "a mismatch needs at least 2 ranks (this run has " << world() << ")";
  for (int variant = 0; variant < 2; variant++) {
    dt_comm_config cc = DT_COMM_CONFIG_DEFAULT;
    cc.timeout_s = 30;
    dt_comm *c = nullptr;  // a communicator of its own: the failure breaks it
    DT_ASSERT_OK(dt_comm_create_mpi(g_pg, &cc, &c));
    int64_t n = rank() == 0 ? 4 : 8;
    std::vector<float> v(static_cast<size_t>(n), 1.0f);
    dt_tensor *t = nullptr;
    DT_ASSERT_OK(dt_tensor_from_host(v.data(), &n, 1, DT_DTYPE_F32, DT_CPU, &t));
    dt_status st = variant == 1 && rank() == 0 ? dt_comm_barrier_sync(c)
                                               : dt_comm_allreduce_sync(c, t, DT_REDUCE_SUM);
    std::string msg = dt_last_error();
    std::printf("[rank %d] variant %d: %s\n", rank(), variant, msg.c_str());
    EXPECT_EQ(st, DT_ERR_DIST_MISMATCH) << msg;
    EXPECT_NE(msg.find("not at the same collective"), std::string::npos) << msg;
    if (variant == 0) {
      EXPECT_NE(msg.find("sizes 16..32 bytes"), std::string::npos) << msg;
    }
    std::vector<float> back(static_cast<size_t>(n));
    DT_ASSERT_OK(dt_tensor_to_host(t, back.data(), back.size() * sizeof(float)));
    EXPECT_EQ(back, v) << "the data must not have moved";
    dt_tensor_release(t);
    dt_comm_destroy(c);
  }
  DT_ASSERT_OK(dt_comm_barrier_sync(g_comm));  // the shared communicator is fine
}

}  // namespace

int main(int argc, char **argv) {
  return dtt::mpi_suite_main(argc, argv, "dist_mpi_test", &g_pg, &g_comm);
}
