// Helpers shared by the dist/ test suites: synthetic batches, a plain
// single-process training reference, a DDP training run over any
// communicator, and comparisons.
#ifndef DT_TESTS_DIST_TEST_UTIL_H
#define DT_TESTS_DIST_TEST_UTIL_H

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/half.h"
#include "core/module.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/rng.h"
#include "core/step.h"
#include "core/tensor.h"
#include "dist/comm.h"
#include "dist/ddp.h"
#include "dist/dp.h"
#include "dist/process_group.h"
#include "dist/replica.h"
#include "models/models.h"
#include "models/tasks.h"
#include "tests/dt_assert.h"

// The dist suites' name for ASSERT_DT_OK (tests/dt_assert.h).
#define DT_ASSERT_OK(expr) ASSERT_DT_OK(expr)

namespace dtt {

constexpr int kImage = 28 * 28;

// The MPI process group and the mpi communicator over it (30 s deadline per
// collective; DT_COMM_SHM from the environment) of a suite run under mpirun. false, with the reason
// printed as "<suite>: <error>", when either cannot be made.
inline bool start_mpi(const char *suite, dt_pg **pg, dt_comm **comm) {
  dt_pg_config pc = DT_PG_CONFIG_DEFAULT;
  pc.mode = DT_PG_MPI;
  if (dt_pg_create(&pc, pg) != DT_OK) {
    std::fprintf(stderr, "%s: %s\n", suite, dt_last_error());
    return false;
  }
  dt_comm_config cc = DT_COMM_CONFIG_DEFAULT;
  cc.timeout_s = 30;
  if (dt_comm_config_from_env(&cc) != DT_OK || dt_comm_create_mpi(*pg, &cc, comm) != DT_OK) {
    std::fprintf(stderr, "%s: %s\n", suite, dt_last_error());
    dt_pg_destroy(*pg);
    *pg = nullptr;
    return false;
  }
  return true;
}

// RUN_ALL_TESTS(), then the communicator and the process group destroyed;
// the exit status of the suite.
inline int run_all_then_stop_mpi(dt_pg *pg, dt_comm *comm) {
  int rc = RUN_ALL_TESTS();
  dt_comm_destroy(comm);
  dt_pg_destroy(pg);
  return rc;
}

// The main() of a suite run under mpirun that needs nothing else set up:
// GoogleTest's flags, start_mpi into *pg and *comm (1 when it fails), then
// run_all_then_stop_mpi.
inline int mpi_suite_main(int argc, char **argv, const char *suite, dt_pg **pg, dt_comm **comm) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!start_mpi(suite, pg, comm))
    return 1;
  return run_all_then_stop_mpi(*pg, *comm);
}

// A 1-d tensor of `dtype` holding v's elements (of that type's size) on
// dev (NULL, with a test failure, when it fails).
template <typename T>
dt_tensor *VectorOf(dt_device dev, dt_dtype dtype, const std::vector<T> &v) {
  int64_t n = static_cast<int64_t>(v.size());
  dt_tensor *t = nullptr;
  EXPECT_EQ(dt_tensor_from_host(v.data(), &n, 1, dtype, dev, &t), DT_OK) << dt_last_error();
  return t;
}
inline dt_tensor *VectorOn(dt_device dev, const std::vector<float> &v) {
  return VectorOf(dev, DT_DTYPE_F32, v);
}

// The elements of a tensor whose element type is T's size, on the host.
template <typename T>
std::vector<T> HostOf(dt_tensor *t) {
  std::vector<T> v(static_cast<size_t>(dt_tensor_numel(t)));
  EXPECT_EQ(dt_tensor_to_host(t, v.data(), v.size() * sizeof(T)), DT_OK) << dt_last_error();
  return v;
}
inline std::vector<float> Host(dt_tensor *t) { return HostOf<float>(t); }

// Samples [first, first + n) of an endless synthetic data set: inputs
// (n, 1, 28, 28) in [-1, 1), labels (n) i32 in [0, 10). Deterministic, so
// every rank and the reference see the same global batch.
inline void make_batch(int64_t first, int64_t n, dt_tensor **x, dt_tensor **y) {
  std::vector<float> xs(static_cast<size_t>(n) * kImage);
  std::vector<int32_t> ys(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) {
    uint64_t sample = static_cast<uint64_t>(first + i);
    for (int j = 0; j < kImage; j++)
      xs[static_cast<size_t>(i) * kImage + j] =
          2.0f * dt_rng_uniform(1234, sample * kImage + static_cast<uint64_t>(j)) - 1.0f;
    ys[static_cast<size_t>(i)] = static_cast<int32_t>(dt_rng_bits(99, sample) % 10);
  }
  int64_t xshape[4] = {n, 1, 28, 28};
  int64_t yshape[1] = {n};
  *x = nullptr;
  *y = nullptr;
  dt_tensor_from_host(xs.data(), xshape, 4, DT_DTYPE_F32, DT_CPU, x);
  dt_tensor_from_host(ys.data(), yshape, 1, DT_DTYPE_I32, DT_CPU, y);
}

// "gpt2-micro": a GPT-2 small enough for the equivalence tests (2 layers,
// 2 heads, C 16, context kGptCtx, kGptVocab tokens padded to 40), its LM
// head tied to the token embedding as in every GPT-2.
constexpr int kGptVocab = 37, kGptCtx = 8;
inline bool is_gpt(const std::string &model) { return model == "gpt2-micro"; }

// Token windows [first, first + n) of an endless synthetic text: inputs
// (n, kGptCtx) i32 in [0, kGptVocab), targets the next tokens (n, kGptCtx).
inline void make_token_batch(int64_t first, int64_t n, dt_tensor **x, dt_tensor **y) {
  std::vector<int32_t> xs(static_cast<size_t>(n) * kGptCtx), ys(xs.size());
  for (int64_t i = 0; i < n; i++)
    for (int t = 0; t <= kGptCtx; t++) {
      uint64_t pos = static_cast<uint64_t>(first + i) * (kGptCtx + 1) + static_cast<uint64_t>(t);
      int32_t tok = static_cast<int32_t>(dt_rng_bits(77, pos) % kGptVocab);
      size_t k = static_cast<size_t>(i) * kGptCtx + static_cast<size_t>(t);
      if (t < kGptCtx)
        xs[k] = tok;
      if (t > 0)
        ys[k - 1] = tok;
    }
  int64_t shape[2] = {n, kGptCtx};
  *x = nullptr;
  *y = nullptr;
  dt_tensor_from_host(xs.data(), shape, 2, DT_DTYPE_I32, DT_CPU, x);
  dt_tensor_from_host(ys.data(), shape, 2, DT_DTYPE_I32, DT_CPU, y);
}

// The batch of the model's input: tokens for GPT, images otherwise.
inline void make_model_batch(const std::string &model, int64_t first, int64_t n, dt_tensor **x,
                             dt_tensor **y) {
  if (is_gpt(model))
    make_token_batch(first, n, x, y);
  else
    make_batch(first, n, x, y);
}

inline dt_status build_model(const std::string &name, dt_module **out) {
  if (is_gpt(name)) {
    dt_gpt2_config c = {2, 2, 16, kGptCtx, kGptVocab, 40};
    return dt_model_gpt2(&c, 7, out);
  }
  if (name == "mlp-small") {
    static const int sizes[] = {784, 64, 10};
    return dt_model_mlp(sizes, 3, 7, out);
  }
  if (name == "mlp-wide") {  // bigger, for overlap measurements
    static const int sizes[] = {784, 1024, 1024, 1024, 10};
    return dt_model_mlp(sizes, 5, 7, out);
  }
  return dt_model_create(name.c_str(), 7, out);
}

inline dt_sgd_config test_sgd() {
  dt_sgd_config c = DT_SGD_CONFIG_DEFAULT;
  c.lr = 0.05f;
  c.momentum = 0.9f;
  return c;
}

// The task loss of a batch: cross-entropy of class ids (y (n)), the
// next-token loss of token windows (y (n, T)).
inline dt_status task_loss(dt_tensor *logits, dt_tensor *y, dt_reduction r, dt_tensor **loss) {
  return dt_tensor_ndim(y) == 2 ? dt_task_loss_next_token_of(logits, y, kGptVocab, r, loss)
                                : dt_task_loss_cross_entropy(logits, y, r, loss);
}

// Mean cross-entropy of model(x) against y, times `scale`, backpropagated.
inline dt_status loss_backward(dt_module *m, dt_tensor *x, dt_tensor *y, float scale,
                               double *loss_value) {
  dt_tensor *logits = nullptr, *loss = nullptr, *scaled = nullptr;
  dt_status st = dt_module_call(m, x, &logits);
  if (st == DT_OK)
    st = task_loss(logits, y, DT_REDUCTION_MEAN, &loss);
  if (st == DT_OK && loss_value)
    st = dt_tensor_item(loss, 0, loss_value);
  if (st == DT_OK && scale != 1.0f)
    st = dt_op_scale(loss, scale, &scaled);
  if (st == DT_OK)
    st = dt_backward(scaled ? scaled : loss, nullptr);
  dt_tensor_release(scaled);
  dt_tensor_release(loss);
  dt_tensor_release(logits);
  return st;
}

// Data-parallel mode with the classification tasks' loss (cross-entropy).
inline dt_dp_config dp_config() {
  dt_dp_config c = DT_DP_CONFIG_DEFAULT;
  c.step.loss = task_loss;
  return c;
}

// `steps` data-parallel steps over the synthetic batches [s * batch,
// (s + 1) * batch) (call under ASSERT_NO_FATAL_FAILURE).
inline void dp_train(dt_dp *dp, int steps, int batch) {
  for (int s = 0; s < steps; s++) {
    dt_tensor *x, *y;
    make_batch(static_cast<int64_t>(s) * batch, batch, &x, &y);
    dt_status st = dt_dp_step(dp, x, y, nullptr);
    dt_tensor_release(x);
    dt_tensor_release(y);
    ASSERT_DT_OK(st);
  }
}

inline dt_param_arena *replica_arena(const dt_dp *dp, int i) {
  return dt_replica_arena(dt_dp_replica(dp, i));
}

inline std::vector<float> arena_values(dt_param_arena *a) {
  std::vector<float> v(static_cast<size_t>(dt_param_arena_numel(a)));
  dt_tensor_to_host(dt_param_arena_data(a), v.data(), v.size() * sizeof(float));
  return v;
}

inline std::vector<float> arena_grads(dt_param_arena *a) {
  std::vector<float> v(static_cast<size_t>(dt_param_arena_numel(a)));
  dt_tensor_to_host(dt_param_arena_grads(a), v.data(), v.size() * sizeof(float));
  return v;
}

// Plain single-process training: `steps` SGD steps, each over global
// samples [s * batch, (s + 1) * batch), gradient of the batch mean.
inline std::vector<float> train_reference(const std::string &model, int steps, int batch) {
  dt_module *m = nullptr;
  dt_param_arena *arena = nullptr;
  dt_optimizer *opt = nullptr;
  std::vector<float> out;
  dt_sgd_config sgd = test_sgd();
  if (build_model(model, &m) != DT_OK || dt_param_arena_create(m, &arena) != DT_OK ||
      dt_optim_sgd_create(arena, &sgd, &opt) != DT_OK) {
    ADD_FAILURE() << "reference setup: " << dt_last_error();
  } else {
    for (int s = 0; s < steps; s++) {
      dt_tensor *x, *y;
      make_model_batch(model, static_cast<int64_t>(s) * batch, batch, &x, &y);
      dt_status st = loss_backward(m, x, y, 1.0f, nullptr);
      if (st == DT_OK)
        st = dt_optim_step(opt);
      if (st == DT_OK)
        st = dt_optim_zero_grad(opt);
      dt_tensor_release(x);
      dt_tensor_release(y);
      if (st != DT_OK) {
        ADD_FAILURE() << "reference step " << s << ": " << dt_last_error();
        break;
      }
    }
    out = arena_values(arena);
  }
  dt_optim_destroy(opt);
  dt_param_arena_destroy(arena);
  dt_module_destroy(m);
  return out;
}

struct DdpRun {
  std::vector<float> params;
  dt_ddp_timeline timeline{};
  std::vector<dt_ddp_bucket_timing> buckets;
  int n_buckets = 0;
};

// Where train_ddp runs and what it lets a test watch: the model and the
// batches on `dev`; before_backward(step) once the step's first
// micro-batch is on the device; after_step(step, ddp) after each
// completed optimizer step.
struct DdpWatch {
  dt_device dev = DT_CPU;
  std::function<void(int)> before_backward;
  std::function<void(int, dt_ddp *)> after_step;
};

// The batch of make_model_batch on dev (a copy when dev is not the CPU).
inline dt_status model_batch_on(dt_device dev, const std::string &model, int64_t first, int64_t n,
                                dt_tensor **x, dt_tensor **y) {
  make_model_batch(model, first, n, x, y);
  if (dev.type == DT_DEVICE_CPU)
    return DT_OK;
  dt_tensor *xh = *x, *yh = *y;
  *x = *y = nullptr;
  dt_status st = dt_tensor_to_device(xh, dev, x);
  if (st == DT_OK)
    st = dt_tensor_to_device(yh, dev, y);
  dt_tensor_release(xh);
  dt_tensor_release(yh);
  return st;
}

// DDP training over `comm`: `steps` steps with a global batch of
// world * per_rank * accum samples per step; this rank takes its per_rank
// slice of each of `accum` micro-batches (no_sync for all but the last).
inline DdpRun train_ddp(dt_comm *comm, const std::string &model, int steps, int per_rank,
                        int accum = 1, dt_ddp_config cfg = DT_DDP_CONFIG_DEFAULT,
                        const DdpWatch &watch = DdpWatch()) {
  DdpRun run;
  int world = dt_comm_size(comm), rank = dt_comm_rank(comm);
  dt_module *m = nullptr;
  dt_param_arena *arena = nullptr;
  dt_optimizer *opt = nullptr;
  dt_ddp *ddp = nullptr;
  dt_sgd_config sgd = test_sgd();
  if (build_model(model, &m) != DT_OK ||
      (watch.dev.type != DT_DEVICE_CPU && dt_module_to(m, watch.dev) != DT_OK) ||
      dt_param_arena_create(m, &arena) != DT_OK ||
      dt_optim_sgd_create(arena, &sgd, &opt) != DT_OK ||
      dt_ddp_create(m, arena, comm, &cfg, &ddp) != DT_OK) {
    ADD_FAILURE() << "DDP setup on rank " << rank << ": " << dt_last_error();
  } else {
    int64_t global = static_cast<int64_t>(world) * per_rank;
    for (int s = 0; s < steps; s++) {
      dt_status st = DT_OK;
      for (int k = 0; k < accum && st == DT_OK; k++) {
        int64_t first = (static_cast<int64_t>(s) * accum + k) * global + rank * per_rank;
        dt_tensor *x = nullptr, *y = nullptr;
        st = model_batch_on(watch.dev, model, first, per_rank, &x, &y);
        if (st == DT_OK && k == 0 && watch.before_backward)
          watch.before_backward(s);
        int last = k == accum - 1;
        if (st == DT_OK && !last)
          st = dt_ddp_no_sync_begin(ddp);
        if (st == DT_OK)
          st = loss_backward(m, x, y, 1.0f / static_cast<float>(accum), nullptr);
        if (st == DT_OK && !last)
          st = dt_ddp_no_sync_end(ddp);
        if (st == DT_OK && last)
          st = dt_ddp_finish_backward(ddp);
        dt_tensor_release(x);
        dt_tensor_release(y);
      }
      if (st == DT_OK)
        st = dt_optim_step(opt);
      if (st == DT_OK)
        st = dt_optim_zero_grad(opt);
      if (st != DT_OK) {
        ADD_FAILURE() << "DDP step " << s << " on rank " << rank << ": " << dt_last_error();
        break;
      }
      if (watch.after_step)
        watch.after_step(s, ddp);
    }
    run.params = arena_values(arena);
    dt_ddp_get_timeline(ddp, &run.timeline);
    run.n_buckets = dt_ddp_num_buckets(ddp);
    run.buckets.assign(run.timeline.buckets, run.timeline.buckets + run.timeline.n_buckets);
    run.timeline.buckets = nullptr;
  }
  dt_ddp_destroy(ddp);
  dt_optim_destroy(opt);
  dt_param_arena_destroy(arena);
  dt_module_destroy(m);
  return run;
}

// What train_steps runs: the training step (core/step.h) of `model`, SGD
// (test_sgd) or AdamW (lr 0.01), `accum` micro-batches of per_rank
// samples per rank and step, clipping at `clip` (0 = off), and the
// reducer's settings (zero_stage among them).
struct StepSpec {
  std::string model = "mlp";
  int steps = 4, per_rank = 8, accum = 1;
  float clip = 0.0f;
  bool adamw = false;
  dt_ddp_config ddp = DT_DDP_CONFIG_DEFAULT;
  float init_scale = 0.0f;           // > 0: a GradScaler (fp16 loss scaling) starting there
  dt_dtype autocast = DT_DTYPE_F32;  // bf16/f16: mixed precision, the optimizer's working copy
  bool stochastic_rounding = false;  // of the working copy, seed kRoundingSeed
  int64_t overflow_step = -1;        // with init_scale: this step's gradients get an Inf
};

constexpr uint64_t kRoundingSeed = 99;

// A case of the ZeRO equivalence tests, and its run: 4 steps of 4 samples
// per rank, buckets of 20000 then 300000 bytes (not parameter boundaries,
// so buckets split parameters).
struct ZeroCase {
  const char *model;
  int accum;
  float clip;
  bool adamw;
};

// The ZeRO equivalence cases of the local and MPI suites: MLP, LeNet and a
// GPT-2 (tied embedding), with and without accumulation, clipping, AdamW.
constexpr ZeroCase kZeroCases[] = {{"mlp", 1, 0.0f, false},      {"lenet", 2, 0.05f, false},
                                   {"lenet", 2, 0.0f, true},     {"mlp", 2, 0.5f, true},
                                   {"lenet", 1, 0.0f, true},     {"lenet", 1, 0.05f, false},
                                   {"gpt2-micro", 2, 0.5f, true}};

inline StepSpec zero_case_spec(const ZeroCase &c) {
  StepSpec spec;
  spec.model = c.model;
  spec.steps = 4;
  spec.per_rank = 4;
  spec.accum = c.accum;
  spec.clip = c.clip;
  spec.adamw = c.adamw;
  spec.ddp.first_bucket_bytes = 20000;
  spec.ddp.bucket_bytes = 300000;
  return spec;
}

inline dt_status spec_optimizer(void *user, int, dt_param_arena *arena, dt_optimizer **out) {
  if (static_cast<const StepSpec *>(user)->adamw) {
    dt_adamw_config c = DT_ADAMW_CONFIG_DEFAULT;
    c.lr = 0.01f;
    return dt_optim_adamw_create(arena, &c, out);
  }
  dt_sgd_config c = test_sgd();
  return dt_optim_sgd_create(arena, &c, out);
}

struct StepRun {
  std::vector<float> params;
  dt_replica_memory memory{};  // the reducer's figures (dt_ddp_gradient_bytes...)
  int64_t padded_numel = 0;    // the arena's numel + tail
  int n_buckets = 0;
  float final_scale = 0.0f;  // with spec.init_scale: the scaler's state at the end
  int64_t skipped_steps = 0;
  std::vector<uint16_t> working_copy;  // with spec.autocast: the optimizer's, at the end
  bool working_copy_fresh = false;
  double update_s = 0.0;      // the reducer's update per bucket in the last pass (0: one pass)
  bool grads_shared = false;  // the reducer's gradients in memory the ranks share
};

// spec.steps optimizer steps through dt_step_forward_backward and
// dt_step_update. With `comm` (borrowed) this is rank `rank` of a DDP job
// (spec.ddp, ZeRO included): micro-batch k of step s is global samples
// [(s * accum + k) * world * per_rank, ...) and this rank takes its
// per_rank slice. Without (nullptr), one process takes every micro-batch
// whole: the reference for any world.
// `after_step` (if given) runs after the last update, before anything is
// freed (memory measurements, the optimizer's state).
inline StepRun train_steps(dt_comm *comm, int world, const StepSpec &spec, dt_device dev = DT_CPU,
                           const std::function<void(const dt_step &)> &after_step = nullptr) {
  StepRun run;
  int rank = comm ? dt_comm_rank(comm) : 0;
  int64_t per_rank = comm ? spec.per_rank : static_cast<int64_t>(world) * spec.per_rank;
  dt_module *m = nullptr;
  dt_param_arena *arena = nullptr;
  dt_optimizer *opt = nullptr;
  dt_ddp *ddp = nullptr;
  dt_step_config sc = DT_STEP_CONFIG_DEFAULT;
  sc.loss = task_loss;
  sc.clip = spec.clip;
  sc.autocast = spec.autocast;
  sc.stochastic_rounding = spec.stochastic_rounding;
  sc.rounding_seed = kRoundingSeed;
  dt_grad_scaler scaler;
  dt_grad_scaler_config scfg = DT_GRAD_SCALER_CONFIG_DEFAULT;
  scfg.init_scale = spec.init_scale;
  dt_status st = spec.init_scale > 0 ? dt_grad_scaler_init(&scaler, &scfg) : DT_OK;
  if (spec.init_scale > 0) {
    sc.scaler = &scaler;
    scaler.debug_overflow_step = spec.overflow_step;
  }
  if (st == DT_OK)
    st = build_model(spec.model, &m);
  if (st == DT_OK)
    st = dt_module_to(m, dev);
  if (st == DT_OK)
    st = dt_param_arena_create(m, &arena);
  if (st == DT_OK)
    st = spec_optimizer(const_cast<StepSpec *>(&spec), 0, arena, &opt);
  if (st == DT_OK && comm)
    st = dt_ddp_create(m, arena, comm, &spec.ddp, &ddp);
  if (st == DT_OK && comm)
    st = dt_ddp_shard_optimizer(ddp, opt);
  if (st != DT_OK)
    ADD_FAILURE() << "setup on rank " << rank << ": " << dt_last_error();
  dt_step step = {m, arena, opt, dt_ddp_grad_sync(ddp), sc};
  int64_t global = static_cast<int64_t>(world) * spec.per_rank;
  for (int s = 0; s < spec.steps && st == DT_OK; s++) {
    for (int k = 0; k < spec.accum && st == DT_OK; k++) {
      dt_tensor *x, *y, *xd = nullptr, *yd = nullptr;
      make_model_batch(spec.model,
                       (static_cast<int64_t>(s) * spec.accum + k) * global + rank * per_rank,
                       per_rank, &x, &y);
      st = dt_tensor_to_device(x, dev, &xd);
      if (st == DT_OK)
        st = dt_tensor_to_device(y, dev, &yd);
      if (st == DT_OK)
        st = dt_step_forward_backward(&step, xd, yd, 1.0f / static_cast<float>(spec.accum),
                                      k == spec.accum - 1, nullptr);
      for (dt_tensor *t : {x, y, xd, yd})
        dt_tensor_release(t);
    }
    if (st == DT_OK)
      st = dt_step_update(&step);
    if (st != DT_OK)
      ADD_FAILURE() << "step " << s << " on rank " << rank << ": " << dt_last_error();
  }
  if (after_step && st == DT_OK)
    after_step(step);
  if (arena != nullptr) {
    run.params = arena_values(arena);
    run.padded_numel = dt_param_arena_numel(arena) + dt_param_arena_tail(arena);
  }
  if (opt != nullptr)
    run.memory.optimizer_state = dt_optim_state_bytes(opt);
  if (dt_tensor *w = opt ? dt_optim_working_copy(opt) : nullptr) {
    run.working_copy.resize(static_cast<size_t>(dt_tensor_numel(w)));
    if (dt_tensor_to_host(w, run.working_copy.data(), run.working_copy.size() * 2) != DT_OK)
      ADD_FAILURE() << "reading the working copy: " << dt_last_error();
    run.working_copy_fresh = dt_optim_working_copy_is_fresh(opt);
  }
  if (sc.scaler != nullptr) {
    run.final_scale = scaler.scale;
    run.skipped_steps = scaler.skipped_steps;
  }
  if (ddp != nullptr) {
    run.memory.gradients = dt_ddp_gradient_bytes(ddp);
    run.memory.gradients_in_flight = dt_ddp_bucket_buffer_peak(ddp);
    run.n_buckets = dt_ddp_num_buckets(ddp);
    run.grads_shared = dt_ddp_grads_shared(ddp) != 0;
    run.update_s = dt_ddp_last_comm_times(ddp).update_s;
  }
  dt_ddp_destroy(ddp);
  dt_optim_destroy(opt);
  dt_param_arena_destroy(arena);
  dt_module_destroy(m);
  return run;
}

// ---- 16-bit reductions (--grad-compress) ----

// Rank r's values for the 16-bit reduction checks: signs and magnitudes
// mixed so that sums round, and the sums of three ranks round differently
// when each step is rounded than when only the f32 sum is.
inline std::vector<float> reduce16_values(int rank, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) {
    float u = dt_rng_uniform(4242 + static_cast<uint64_t>(rank), static_cast<uint64_t>(i));
    v[static_cast<size_t>(i)] = (2.0f * u - 1.0f) * std::ldexp(1.0f, static_cast<int>(i % 9) - 4);
  }
  return v;
}

inline uint16_t round16(dt_dtype t, float v) {
  return t == DT_DTYPE_BF16 ? dt_f32_to_bf16(v) : dt_f32_to_f16(v);
}
inline float widen16(dt_dtype t, uint16_t h) {
  return t == DT_DTYPE_BF16 ? dt_bf16_to_f32(h) : dt_f16_to_f32(h);
}

// A 1-d tensor of type t (f16/bf16) holding v rounded to it.
inline dt_tensor *Vector16(dt_dtype t, const std::vector<float> &v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); i++)
    h[i] = round16(t, v[i]);
  return VectorOf(DT_CPU, t, h);
}

inline std::vector<uint16_t> Bits16(dt_tensor *t) { return HostOf<uint16_t>(t); }

// What dist/comm.h documents for the host backends: element i of the
// reduction of ranks' 16-bit values v[k] is the f32 sum over k in rank
// order of widen(v[k][i]) (divided by the world size for avg), rounded
// once to the type.
inline std::vector<uint16_t> expected_reduce16(dt_dtype t, const std::vector<std::vector<float>> &v,
                                               bool avg) {
  std::vector<uint16_t> out(v[0].size());
  for (size_t i = 0; i < out.size(); i++) {
    float acc = 0.0f;
    for (size_t k = 0; k < v.size(); k++)
      acc = k == 0 ? widen16(t, round16(t, v[k][i])) : acc + widen16(t, round16(t, v[k][i]));
    if (avg)
      acc /= static_cast<float>(v.size());
    out[i] = round16(t, acc);
  }
  return out;
}

// Counts the elements where `got` and `want` differ, and names the first.
inline ::testing::AssertionResult same_bits(const std::vector<uint16_t> &got,
                                            const std::vector<uint16_t> &want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " elements, expected " << want.size();
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); i++)
    if (got[i] != want[i] && bad++ == 0)
      first = i;
  if (bad == 0)
    return ::testing::AssertionSuccess();
  char what[96];
  std::snprintf(what, sizeof what, "first %zu: got 0x%04x, expected 0x%04x", first,
                static_cast<unsigned>(got[first]), static_cast<unsigned>(want[first]));
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements differ; " << what;
}

// On every rank of `comm`: all-reduce (sum and average) and reduce-scatter
// of 16-bit data equal the documented rounding of the f32 sum bit for bit
// (every rank computes every rank's inputs), for a count that the world
// size does not divide; f16 sums past 65504 are inf, their average is not.
inline void check_reduce16(dt_comm *comm, dt_dtype t) {
  const int w = dt_comm_size(comm), r = dt_comm_rank(comm);
  const int64_t n = 1000 + 7;
  std::vector<std::vector<float>> all;
  for (int k = 0; k < w; k++)
    all.push_back(reduce16_values(k, n));
  for (bool avg : {false, true}) {
    dt_tensor *x = Vector16(t, all[r]);
    ASSERT_DT_OK(dt_comm_allreduce_sync(comm, x, avg ? DT_REDUCE_AVG : DT_REDUCE_SUM));
    EXPECT_TRUE(same_bits(Bits16(x), expected_reduce16(t, all, avg)))
        << dt_dtype_name(t) << (avg ? " avg" : " sum") << " all-reduce, W=" << w << ", rank " << r;
    dt_tensor_release(x);
  }
  // reduce-scatter: slice s of rank k's input is all[k][s, s + m), so
  // rank r reduces all[k][r, r + m) over k.
  const int64_t m = 257;
  std::vector<float> in;
  for (int s = 0; s < w; s++)
    in.insert(in.end(), all[r].begin() + s, all[r].begin() + s + m);
  std::vector<std::vector<float>> mine;
  for (int k = 0; k < w; k++)
    mine.emplace_back(all[k].begin() + r, all[k].begin() + r + m);
  dt_tensor *rs_in = Vector16(t, in), *rs_out = Vector16(t, std::vector<float>(m));
  dt_work *work = nullptr;
  ASSERT_DT_OK(dt_comm_reduce_scatter(comm, rs_in, rs_out, DT_REDUCE_AVG, nullptr, &work));
  ASSERT_DT_OK(dt_work_wait(work, 0));
  dt_work_release(work);
  EXPECT_TRUE(same_bits(Bits16(rs_out), expected_reduce16(t, mine, true)))
      << dt_dtype_name(t) << " reduce-scatter, W=" << w << ", rank " << r;
  dt_tensor_release(rs_in);
  dt_tensor_release(rs_out);
  if (t != DT_DTYPE_F16 || w < 2)
    return;
  // f16 overflow: 40000 on every rank sums to inf (the sign kept); the
  // average, taken in f32, is 40000 again; an inf input stays inf.
  std::vector<float> big = {40000.0f, -40000.0f, r == 0 ? INFINITY : 1.0f};
  dt_tensor *s = Vector16(t, big), *a = Vector16(t, big);
  ASSERT_DT_OK(dt_comm_allreduce_sync(comm, s, DT_REDUCE_SUM));
  ASSERT_DT_OK(dt_comm_allreduce_sync(comm, a, DT_REDUCE_AVG));
  std::vector<uint16_t> sb = Bits16(s), ab = Bits16(a);
  EXPECT_EQ(sb[0], 0x7c00) << "40000 x " << w << " in f16 is +inf";
  EXPECT_EQ(sb[1], 0xfc00) << "-40000 x " << w << " in f16 is -inf";
  EXPECT_EQ(sb[2], 0x7c00);
  EXPECT_EQ(widen16(t, ab[0]), 40000.0f);
  EXPECT_EQ(ab[2], 0x7c00) << "an inf input averages to inf";
  dt_tensor_release(s);
  dt_tensor_release(a);
}

// Rank r's gradient of mlp-small for its `per_rank` samples of the global
// batch, times `scale` (comm NULL: no reducer, the local gradient); with a
// reducer over comm, what dt_ddp_finish_backward leaves in the gradients,
// and *bytes gets its bytes per pass.
inline std::vector<float> one_backward(dt_comm *comm, int r, int per_rank, float scale,
                                       dt_ddp_config cfg, size_t *bytes = nullptr) {
  dt_module *m = nullptr;
  dt_param_arena *arena = nullptr;
  dt_ddp *ddp = nullptr;
  std::vector<float> grads;
  dt_tensor *x = nullptr, *y = nullptr;
  make_batch(static_cast<int64_t>(r) * per_rank, per_rank, &x, &y);
  dt_status st = build_model("mlp-small", &m);
  if (st == DT_OK)
    st = dt_param_arena_create(m, &arena);
  if (st == DT_OK && comm)
    st = dt_ddp_create(m, arena, comm, &cfg, &ddp);
  if (st == DT_OK)
    st = loss_backward(m, x, y, scale, nullptr);
  if (st == DT_OK && ddp)
    st = dt_ddp_finish_backward(ddp);
  if (st == DT_OK)
    grads = arena_grads(arena);
  else
    ADD_FAILURE() << "rank " << r << ": " << dt_last_error();
  if (bytes && ddp)
    *bytes = dt_ddp_comm_bytes_per_pass(ddp);
  dt_tensor_release(x);
  dt_tensor_release(y);
  dt_ddp_destroy(ddp);
  dt_param_arena_destroy(arena);
  dt_module_destroy(m);
  return grads;
}

// On every rank of `comm`: one backward of mlp-small through a reducer
// with grad_compress t (several buckets) leaves in the f32 gradients
// exactly the documented 16-bit average of the ranks' gradients (each
// rounded to t, summed in f32 in rank order, divided, rounded once: every
// rank computes every rank's local gradient), and hands the communicator
// half the bytes of an uncompressed reducer. scale != 1 must make some f16
// gradients overflow (to inf), scale 1 none.
inline void check_compressed_gradients(dt_comm *comm, dt_dtype t, float scale) {
  const int per_rank = 6, world = dt_comm_size(comm), r = dt_comm_rank(comm);
  std::vector<std::vector<float>> local;
  for (int k = 0; k < world; k++)
    local.push_back(one_backward(nullptr, k, per_rank, scale, DT_DDP_CONFIG_DEFAULT));
  std::vector<uint16_t> want = expected_reduce16(t, local, true);
  int infs = 0;
  for (uint16_t h : want)
    infs += std::isinf(widen16(t, h));
  EXPECT_EQ(infs > 0, scale != 1.0f) << infs << " of " << want.size() << " overflow";
  dt_ddp_config cfg = DT_DDP_CONFIG_DEFAULT;
  cfg.first_bucket_bytes = 20000;
  size_t plain_bytes = 0, bytes = 0;
  one_backward(comm, r, per_rank, scale, cfg, &plain_bytes);
  cfg.grad_compress = t;
  std::vector<float> got = one_backward(comm, r, per_rank, scale, cfg, &bytes);
  ASSERT_EQ(got.size(), want.size());
  std::vector<uint16_t> bits(want.size());
  for (size_t i = 0; i < want.size(); i++)
    bits[i] = round16(t, got[i]);
  EXPECT_TRUE(same_bits(bits, want))
      << dt_dtype_name(t) << " W=" << world << " scale " << scale << " rank " << r;
  for (size_t i = 0; i < want.size(); i++) {  // the f32 gradient is the 16-bit value
    float back = widen16(t, bits[i]);
    ASSERT_EQ(0, std::memcmp(&got[i], &back, sizeof back)) << i << ": " << got[i];
  }
  EXPECT_EQ(2 * bytes, plain_bytes);
  EXPECT_EQ(plain_bytes, want.size() * sizeof(float));
}

// ||a - b|| / ||b||
inline double rel_error(const std::vector<float> &a, const std::vector<float> &b) {
  if (a.size() != b.size() || b.empty())
    return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); i++) {
    double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num) / (std::sqrt(den) + 1e-30);
}

inline double max_abs_diff(const std::vector<float> &a, const std::vector<float> &b) {
  double m = a.size() == b.size() ? 0 : INFINITY;
  for (size_t i = 0; i < a.size() && i < b.size(); i++)
    m = std::fmax(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// ZeRO stages 0, 1 and 2 of case c over `world` ranks, each trained by
// run(spec), against `ref` (one process on the whole batch): within 1e-5
// (SGD) or 1e-4 (AdamW, whose division by the root of tiny second moments
// shows the reduction's rounding more), stages 1 and 2 within 1e-5 of stage
// 0. Each result is printed after `who` ("" or "[rank R] ").
inline void expect_zero_stages(const ZeroCase &c, int world, const std::vector<float> &ref,
                               const std::function<StepRun(const StepSpec &)> &run,
                               const std::string &who) {
  StepSpec spec = zero_case_spec(c);
  std::vector<float> stage0;
  for (int stage : {0, 1, 2}) {
    spec.ddp.zero_stage = stage;
    StepRun r = run(spec);
    double rel = rel_error(r.params, ref);
    std::printf("%s%s W=%d accum %d clip %g %s zero %d: %d buckets, relative error %.3g\n",
                who.c_str(), c.model, world, c.accum, c.clip, c.adamw ? "adamw" : "sgd", stage,
                r.n_buckets, rel);
    EXPECT_LE(rel, c.adamw ? 1e-4 : 1e-5) << c.model << " W=" << world << " zero " << stage;
    if (stage == 0)
      stage0 = r.params;
    else
      EXPECT_LE(rel_error(r.params, stage0), 1e-5) << c.model << " zero " << stage;
  }
}

// ---- the schedule of issue 16: split buckets, the update per bucket ----

// A case: what it trains, and whether the step may update per bucket
// (no clipping, no GradScaler, no ZeRO).
struct ScheduleCase {
  const char *what;
  StepSpec spec;
  bool per_bucket;
};

inline std::vector<ScheduleCase> schedule_cases() {
  std::vector<ScheduleCase> v;
  StepSpec s;
  s.steps = 3;
  s.per_rank = 4;
  v.push_back({"mlp sgd", s, true});
  StepSpec clip = s;
  clip.clip = 0.5f;
  v.push_back({"mlp sgd clip 0.5", clip, false});
  StepSpec accum = s;
  accum.accum = 2;
  v.push_back({"mlp sgd accum 2", accum, true});
  StepSpec bf16 = s;
  bf16.adamw = true;
  bf16.autocast = DT_DTYPE_BF16;
  bf16.stochastic_rounding = true;
  v.push_back({"mlp adamw bf16 stochastic working copy", bf16, true});
  StepSpec fp16 = s;
  fp16.autocast = DT_DTYPE_F16;
  fp16.init_scale = 65536.0f;
  fp16.overflow_step = 1;  // step 1 overflows and is skipped
  v.push_back({"mlp fp16 GradScaler with an overflow", fp16, false});
  StepSpec lenet = s;  // its last bucket: fc1 (split, reported) and the convolutions
  lenet.model = "lenet";
  lenet.adamw = true;
  lenet.ddp.first_bucket_bytes = 20000;
  v.push_back({"lenet adamw", lenet, true});
  StepSpec gpt = s;  // linears and the tied embedding (two contributors)
  gpt.model = "gpt2-micro";
  gpt.accum = 2;
  v.push_back({"gpt2-micro sgd accum 2", gpt, true});
  return v;
}

// The same bits: parameters, working copy and scaler state.
inline void expect_same_run(const StepRun &b, const StepRun &a, const std::string &what) {
  EXPECT_EQ(b.params, a.params) << what;
  EXPECT_EQ(b.working_copy, a.working_copy) << what;
  EXPECT_EQ(b.working_copy_fresh, a.working_copy_fresh) << what;
  EXPECT_EQ(b.final_scale, a.final_scale) << what;
  EXPECT_EQ(b.skipped_steps, a.skipped_steps) << what;
}

// Every case of schedule_cases over `world` ranks, each trained by
// run(spec), four ways: unsplit or split buckets (every parameter of the
// last bucket above 2 KiB in parts), each with one update after the last
// bucket or the update per bucket. The update per bucket gives bit for bit
// the run with one update on the same buckets, and runs per bucket exactly
// where the case allows it (not with clipping or a GradScaler). Split
// buckets must add buckets; they give the bits of unsplit ones where an
// element's reduction does not depend on where its bucket begins
// (`split_bitwise`: the local backend, MPI on 2 ranks), else (MPI's ring
// on 3 ranks sums each segment of a bucket starting at another rank)
// within 1e-5, as other bucket layouts. ZeRO (which updates its shards
// itself) under the new defaults is within 1e-5 of stage 0 split.
inline void expect_schedule_bitwise(int world, const std::function<StepRun(const StepSpec &)> &run,
                                    const std::string &who, bool split_bitwise) {
  for (const ScheduleCase &c : schedule_cases()) {
    StepRun r[2][2];  // [split][per bucket]
    for (int split = 0; split < 2; split++)
      for (int per_bucket = 0; per_bucket < 2; per_bucket++) {
        StepSpec spec = c.spec;
        spec.ddp.split_bytes = split ? 2048 : 0;
        spec.ddp.update_per_bucket = per_bucket;
        r[split][per_bucket] = run(spec);
      }
    double rel = rel_error(r[1][0].params, r[0][0].params);
    std::printf(
        "%s%s W=%d: %d buckets, %d split (relative difference %.3g); update per bucket "
        "%.3f ms\n",
        who.c_str(), c.what, world, r[0][0].n_buckets, r[1][0].n_buckets, rel,
        1e3 * r[1][1].update_s);
    for (int split = 0; split < 2; split++) {
      std::string what =
          std::string(c.what) + (split ? ", split" : "") + " W=" + std::to_string(world);
      expect_same_run(r[split][1], r[split][0], what + ": update per bucket");
      EXPECT_EQ(r[split][0].update_s, 0.0) << what;
      EXPECT_EQ(r[split][1].update_s > 0.0, c.per_bucket) << what;
    }
    EXPECT_GT(r[1][0].n_buckets, r[0][0].n_buckets) << c.what << ": nothing was split";
    if (split_bitwise)
      expect_same_run(r[1][0], r[0][0], std::string(c.what) + ": split buckets");
    else
      EXPECT_LE(rel, 1e-5) << c.what << ": split buckets";
    if (c.spec.init_scale > 0) {
      EXPECT_EQ(r[1][1].skipped_steps, 1) << c.what << ": the overflow did not skip its step";
    }
    if (std::string(c.what) == "mlp sgd") {
      for (int stage : {1, 2}) {
        StepSpec zero = c.spec;  // the defaults
        zero.ddp.zero_stage = stage;
        StepRun z = run(zero);
        EXPECT_EQ(z.update_s, 0.0) << "zero " << stage;
        EXPECT_LE(rel_error(z.params, r[1][1].params), 1e-5) << "zero " << stage;
      }
    }
  }
}

}  // namespace dtt

#endif
