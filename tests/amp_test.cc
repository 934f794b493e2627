// Mixed precision (core/amp.h, the GradScaler of core/optim.h and its use by
// the training step, core/step.h): precision names, the per-thread autocast
// scope, the scaler's schedule, and training steps with the scaler.
#include "core/amp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/autograd.h"
#include "core/half.h"
#include "core/memory.h"
#include "core/module.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/rng.h"
#include "core/step.h"
#include "models/models.h"
#include "models/tasks.h"
#include "tests/test_util.h"

namespace {

TEST(Precision, NamesParseAndDtypes) {
  const char *names[] = {"fp32", "tf32", "bf16", "fp16"};
  const dt_dtype autocast[] = {DT_DTYPE_F32, DT_DTYPE_F32, DT_DTYPE_BF16, DT_DTYPE_F16};
  for (int p = 0; p < DT_PRECISION_COUNT; p++) {
    dt_precision got;
    ASSERT_DT_OK(dt_precision_parse(names[p], &got));
    EXPECT_EQ(got, (dt_precision)p);
    EXPECT_STREQ(dt_precision_name(got), names[p]);
    EXPECT_EQ(dt_precision_autocast_dtype(got), autocast[p]);
    EXPECT_EQ(dt_precision_needs_scaler(got), p == DT_PRECISION_FP16);
  }
  dt_precision got;
  EXPECT_EQ(dt_precision_parse("half", &got), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("expected fp32, tf32, bf16 or fp16"),
            std::string::npos);
}

TEST(Autocast, ScopesNestAndArePerThread) {
  EXPECT_EQ(dt_autocast_dtype(), DT_DTYPE_F32);
  dt_dtype outer = dt_autocast_begin(DT_DTYPE_BF16);
  EXPECT_EQ(outer, DT_DTYPE_F32);
  EXPECT_EQ(dt_autocast_dtype_for("dt_op_linear"), DT_DTYPE_BF16);
  EXPECT_EQ(dt_autocast_dtype_for("dt_op_layer_norm"), DT_DTYPE_F32);
  EXPECT_EQ(dt_autocast_dtype_for("dt_op_no_such_op"), DT_DTYPE_F32);
  dt_dtype inner = dt_autocast_begin(DT_DTYPE_F16);
  EXPECT_EQ(inner, DT_DTYPE_BF16);
  EXPECT_EQ(dt_autocast_dtype_for("dt_op_conv2d"), DT_DTYPE_F16);
  dt_dtype seen = DT_DTYPE_BF16;
  std::thread([&] { seen = dt_autocast_dtype(); }).join();
  EXPECT_EQ(seen, DT_DTYPE_F32) << "another thread has autocast off";
  dt_autocast_end(inner);
  EXPECT_EQ(dt_autocast_dtype(), DT_DTYPE_BF16);
  dt_autocast_end(outer);
  EXPECT_EQ(dt_autocast_dtype(), DT_DTYPE_F32);
  dt_autocast_end(dt_autocast_begin(DT_DTYPE_I32));  // not a 16-bit float: off
  EXPECT_EQ(dt_autocast_begin(DT_DTYPE_I32), DT_DTYPE_F32);
  dt_autocast_end(DT_DTYPE_F32);
}

// Under autocast a linear layer's output is 16-bit: the f32 product of the
// inputs rounded to the 16-bit dtype, rounded once.
TEST(Autocast, LinearComputesOnRoundedInputs) {
  for (dt_dtype d : {DT_DTYPE_BF16, DT_DTYPE_F16}) {
    dtt::Tensors ts;
    dt_tensor *x = ts.add(dtt::RandomTensor({3, 40}, 1));
    dt_tensor *w = ts.add(dtt::RandomTensor({5, 40}, 2));
    dt_tensor *xr, *wr, *xh, *wh, *want, *got;
    ASSERT_DT_OK(dt_tensor_to_dtype(x, d, &xh));
    ts.add(xh);
    ASSERT_DT_OK(dt_tensor_to_dtype(w, d, &wh));
    ts.add(wh);
    ASSERT_DT_OK(dt_tensor_to_dtype(xh, DT_DTYPE_F32, &xr));
    ts.add(xr);
    ASSERT_DT_OK(dt_tensor_to_dtype(wh, DT_DTYPE_F32, &wr));
    ts.add(wr);
    ASSERT_DT_OK(dt_op_linear(xr, wr, nullptr, &want));
    ts.add(want);
    dt_dtype prev = dt_autocast_begin(d);
    dt_status st = dt_op_linear(x, w, nullptr, &got);
    dt_autocast_end(prev);
    ASSERT_DT_OK(st);
    ts.add(got);
    // the result is 16-bit: the f32 sum of the rounded products, rounded once
    EXPECT_EQ(dt_tensor_dtype(got), d);
    dt_tensor *got32 = nullptr;
    ASSERT_DT_OK(dt_tensor_to_dtype(got, DT_DTYPE_F32, &got32));
    ts.add(got32);
    std::vector<float> a = dtt::ToVector(got32), b = dtt::ToVector(want);
    ASSERT_EQ(a.size(), b.size());
    const float half_ulp = std::ldexp(1.0f, d == DT_DTYPE_BF16 ? -8 : -11);  // of [1, 2)
    for (size_t i = 0; i < a.size(); i++)
      EXPECT_NEAR(a[i], b[i], half_ulp * std::fabs(b[i]) + 1e-5f) << dt_dtype_name(d) << " " << i;
  }
}

// ---- the GradScaler ----

TEST(GradScaler, PyTorchDefaultsAndSchedule) {
  dt_grad_scaler_config cfg = DT_GRAD_SCALER_CONFIG_DEFAULT;
  EXPECT_EQ(cfg.init_scale, 65536.0f);
  EXPECT_EQ(cfg.growth_factor, 2.0f);
  EXPECT_EQ(cfg.backoff_factor, 0.5f);
  EXPECT_EQ(cfg.growth_interval, 2000);
  dt_grad_scaler s;
  ASSERT_DT_OK(dt_grad_scaler_init(&s, &cfg));
  EXPECT_EQ(s.scale, 65536.0f);
  for (int i = 0; i < 1999; i++)
    dt_grad_scaler_update(&s, false);
  EXPECT_EQ(s.scale, 65536.0f) << "1999 clean steps: not yet";
  dt_grad_scaler_update(&s, false);
  EXPECT_EQ(s.scale, 131072.0f) << "x2 after 2000 clean steps";
  EXPECT_EQ(s.growth_tracker, 0);
  for (int i = 0; i < 1500; i++)
    dt_grad_scaler_update(&s, false);
  dt_grad_scaler_update(&s, true);
  EXPECT_EQ(s.scale, 65536.0f) << "x0.5 on overflow";
  EXPECT_EQ(s.growth_tracker, 0) << "an overflow restarts the clean-step count";
  EXPECT_EQ(s.skipped_steps, 1);
  EXPECT_TRUE(s.last_skipped);
  for (int i = 0; i < 1999; i++)
    dt_grad_scaler_update(&s, false);
  EXPECT_EQ(s.scale, 65536.0f);
  EXPECT_FALSE(s.last_skipped);
  cfg.init_scale = 3e38f;  // growing would overflow f32: the scale stays finite
  cfg.growth_interval = 1;
  ASSERT_DT_OK(dt_grad_scaler_init(&s, &cfg));
  dt_grad_scaler_update(&s, false);
  EXPECT_EQ(s.scale, 3e38f);
}

TEST(GradScaler, RejectsBadConfigs) {
  dt_grad_scaler s;
  const dt_grad_scaler_config bad[] = {
      {0.0f, 2.0f, 0.5f, 2000}, {INFINITY, 2.0f, 0.5f, 2000}, {1.0f, 1.0f, 0.5f, 2000},
      {1.0f, 2.0f, 1.0f, 2000}, {1.0f, 2.0f, 0.0f, 2000},     {1.0f, 2.0f, 0.5f, 0},
      {NAN, 2.0f, 0.5f, 2000},
  };
  for (const dt_grad_scaler_config &c : bad) {
    EXPECT_EQ(dt_grad_scaler_init(&s, &c), DT_ERR_INVALID_ARG) << c.init_scale;
    EXPECT_NE(std::string(dt_last_error()).find("grad scaler"), std::string::npos);
  }
}

// ---- training steps with the scaler ----

dt_status CrossEntropy(dt_tensor *out, dt_tensor *target, dt_reduction r, dt_tensor **loss) {
  return dt_op_cross_entropy(out, target, r, DT_IGNORE_INDEX, loss);
}

struct Trainer {
  dt_module *model = nullptr;
  dt_param_arena *arena = nullptr;
  dt_optimizer *opt = nullptr;
  dt_lr_schedule sched = DT_LR_SCHEDULE_DEFAULT;
  dt_step step{};
  explicit Trainer(dt_dtype autocast, dt_grad_scaler *scaler, bool adamw = false) {
    EXPECT_EQ(DT_OK, dt_model_create("lenet", 3, &model)) << dt_last_error();
    EXPECT_EQ(DT_OK, dt_param_arena_create(model, &arena)) << dt_last_error();
    if (adamw) {
      dt_adamw_config cfg = DT_ADAMW_CONFIG_DEFAULT;
      cfg.lr = 0.01f;
      EXPECT_EQ(DT_OK, dt_optim_adamw_create(arena, &cfg, &opt)) << dt_last_error();
    } else {
      dt_sgd_config cfg = DT_SGD_CONFIG_DEFAULT;
      cfg.lr = 0.05f;
      cfg.momentum = 0.9f;
      EXPECT_EQ(DT_OK, dt_optim_sgd_create(arena, &cfg, &opt)) << dt_last_error();
    }
    sched.base_lr = 0.05f;
    sched.warmup_steps = 10;
    step = {model, arena, opt, DT_GRAD_SYNC_NONE, DT_STEP_CONFIG_DEFAULT};
    step.cfg.loss = CrossEntropy;
    step.cfg.schedule = &sched;
    step.cfg.autocast = autocast;
    step.cfg.scaler = scaler;
  }
  ~Trainer() {
    dt_optim_destroy(opt);
    dt_param_arena_destroy(arena);
    dt_module_destroy(model);
  }
  // A fixed batch of 16 (seed picks it).
  static void Batch(dtt::Tensors &ts, uint64_t seed, dt_tensor **x, dt_tensor **y) {
    *x = ts.add(dtt::RandomTensor({16, 1, 28, 28}, 50 + seed));
    std::vector<int64_t> labels(16);
    for (int64_t i = 0; i < 16; i++)
      labels[i] = (int64_t)((i * 3 + seed) % 10);
    *y = ts.add(dtt::MakeIndexTensor(labels, {16}, DT_DTYPE_I64));
  }
  // One optimizer step on batch `seed`.
  void Step(uint64_t seed) {
    dtt::Tensors ts;
    dt_tensor *x, *y;
    Batch(ts, seed, &x, &y);
    ASSERT_DT_OK(dt_step_forward_backward(&step, x, y, 1.0f, true, nullptr));
    ASSERT_DT_OK(dt_step_update(&step));
  }
  // The same step outside dt_step, so without the optimizer's working copy:
  // the LOW ops round the parameters each time they use them.
  void StepRoundingPerUse(uint64_t seed) {
    dtt::Tensors ts;
    dt_tensor *x, *y, *loss = nullptr;
    Batch(ts, seed, &x, &y);
    ASSERT_DT_OK(Loss(x, y, &loss));
    ts.add(loss);
    ASSERT_DT_OK(dt_backward(loss, nullptr));
    dt_optim_set_lr(opt, dt_lr_at(&sched, dt_optim_step_count(opt)));
    ASSERT_DT_OK(dt_optim_step(opt));
    ASSERT_DT_OK(dt_optim_zero_grad(opt));
  }
  // The loss of batch (x, y) under the step's autocast.
  dt_status Loss(dt_tensor *x, dt_tensor *y, dt_tensor **loss) {
    dt_tensor *out = nullptr;
    dt_dtype prev = dt_autocast_begin(step.cfg.autocast);
    dt_status st = dt_module_call(model, x, &out);
    if (st == DT_OK)
      st = CrossEntropy(out, y, DT_REDUCTION_MEAN, loss);
    dt_autocast_end(prev);
    dt_tensor_release(out);
    return st;
  }
  std::vector<uint16_t> WorkingCopy() const {
    dt_tensor *w = dt_optim_working_copy(opt);
    std::vector<uint16_t> v(w ? (size_t)dt_tensor_numel(w) : 0);
    if (w) {
      EXPECT_EQ(DT_OK, dt_tensor_to_host(w, v.data(), v.size() * 2)) << dt_last_error();
    }
    return v;
  }
  std::vector<float> Params() const { return dtt::ToVector(dt_param_arena_data(arena)); }
};

// Scaling by a power of two and unscaling is exact in f32: with f32 math
// the scaler changes nothing, bit for bit.
TEST(GradScalerStep, ScalingIsExactInF32) {
  dt_grad_scaler s;
  dt_grad_scaler_config cfg = DT_GRAD_SCALER_CONFIG_DEFAULT;
  cfg.init_scale = 1024.0f;
  cfg.growth_interval = 2;  // the scale changes between steps too
  ASSERT_DT_OK(dt_grad_scaler_init(&s, &cfg));
  Trainer plain(DT_DTYPE_F32, nullptr), scaled(DT_DTYPE_F32, &s);
  for (uint64_t i = 0; i < 4; i++) {
    plain.Step(i);
    scaled.Step(i);
  }
  EXPECT_EQ(s.scale, 4096.0f);
  EXPECT_EQ(s.skipped_steps, 0);
  EXPECT_EQ(dt_optim_step_count(scaled.opt), 4);
  EXPECT_EQ(plain.Params(), scaled.Params());
}

// fp16 with a scale so large that the gradient overflows f16 in the
// backward: the step is skipped (parameters, momentum, step count and lr
// unchanged), the scale halves until it fits, then training proceeds.
TEST(GradScalerStep, Fp16OverflowSkipsTheStepAndBacksOff) {
  dt_grad_scaler s;
  dt_grad_scaler_config cfg = DT_GRAD_SCALER_CONFIG_DEFAULT;
  cfg.init_scale = 1099511627776.0f;  // 2^40: f16's largest finite value is 65504
  ASSERT_DT_OK(dt_grad_scaler_init(&s, &cfg));
  Trainer t(DT_DTYPE_F16, &s);
  std::vector<float> before = t.Params();
  float lr = dt_optim_lr(t.opt);
  t.Step(0);
  EXPECT_EQ(s.skipped_steps, 1);
  EXPECT_TRUE(s.last_skipped);
  EXPECT_EQ(s.scale, 549755813888.0f);
  EXPECT_EQ(dt_optim_step_count(t.opt), 0) << "a skipped step is not counted";
  EXPECT_EQ(dt_optim_lr(t.opt), lr) << "the schedule did not advance";
  EXPECT_EQ(t.Params(), before) << "a skipped step leaves the parameters";
  int steps = 1;
  while (s.last_skipped && steps < 60) {
    t.Step(0);
    steps++;
  }
  ASSERT_FALSE(s.last_skipped) << "the scale backs off until the gradients fit f16";
  EXPECT_EQ(dt_optim_step_count(t.opt), 1);
  EXPECT_EQ(s.skipped_steps, steps - 1);
  EXPECT_EQ(s.scale, 1099511627776.0f * std::ldexp(1.0f, -(steps - 1)));
  EXPECT_NE(t.Params(), before);
  EXPECT_EQ(dt_optim_lr(t.opt), dt_lr_at(&t.sched, 1))
      << "the schedule moved on with the step taken";
}

// A forced overflow (dt_grad_scaler.debug_overflow_step) skips exactly that
// step, once.
TEST(GradScalerStep, DebugOverflowSkipsOneStep) {
  dt_grad_scaler s;
  dt_grad_scaler_config cfg = DT_GRAD_SCALER_CONFIG_DEFAULT;
  ASSERT_DT_OK(dt_grad_scaler_init(&s, &cfg));
  s.debug_overflow_step = 2;
  Trainer t(DT_DTYPE_F16, &s);
  for (uint64_t i = 0; i < 5; i++)
    t.Step(i);
  EXPECT_EQ(s.skipped_steps, 1);
  EXPECT_EQ(s.scale, 32768.0f);
  EXPECT_EQ(dt_optim_step_count(t.opt), 4);
  EXPECT_EQ(s.debug_overflow_step, -1);
}

// bf16 autocast trains close to f32 but not bit for bit.
TEST(AutocastStep, Bf16StaysCloseToF32) {
  Trainer f32(DT_DTYPE_F32, nullptr), bf16(DT_DTYPE_BF16, nullptr);
  for (uint64_t i = 0; i < 3; i++) {
    f32.Step(i);
    bf16.Step(i);
  }
  std::vector<float> a = f32.Params(), b = bf16.Params();
  ASSERT_EQ(a.size(), b.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); i++) {
    diff += (a[i] - b[i]) * (double)(a[i] - b[i]);
    norm += a[i] * (double)a[i];
  }
  EXPECT_GT(diff, 0.0) << "bf16 autocast changed nothing";
  EXPECT_LT(std::sqrt(diff / norm), 1e-2) << "bf16 drifted from f32 after 3 steps";
}

// ---- the optimizer's 16-bit working copy of the weights ----

std::vector<uint16_t> RoundedToNearest(dt_dtype t, const std::vector<float> &x) {
  std::vector<uint16_t> h(x.size());
  EXPECT_EQ(DT_OK, dt_half_from_f32(t, x.data(), h.data(), (int64_t)x.size()));
  return h;
}

// Training through dt_step (the LOW ops read the copy the fused update
// wrote) equals rounding each parameter where it is used, bit for bit,
// for both optimizers and both 16-bit types; the copy is the masters
// rounded to nearest after every step.
TEST(WorkingCopy, StepEqualsRoundingPerUseBitForBit) {
  for (bool adamw : {false, true})
    for (dt_dtype t : {DT_DTYPE_BF16, DT_DTYPE_F16}) {
      Trainer with(t, nullptr, adamw), per_use(t, nullptr, adamw);
      for (uint64_t i = 0; i < 3; i++) {
        with.Step(i);
        per_use.StepRoundingPerUse(i);
        ASSERT_TRUE(dt_optim_working_copy_is_fresh(with.opt));
        ASSERT_EQ(with.WorkingCopy(), RoundedToNearest(t, with.Params()))
            << dt_dtype_name(t) << " step " << i;
      }
      EXPECT_EQ(with.Params(), per_use.Params()) << dt_dtype_name(t) << " adamw " << adamw;
      EXPECT_EQ(dt_optim_working_copy(per_use.opt), nullptr);
    }
}

// The LOW ops really read the copy: a copy changed behind their back
// changes the loss; invalidated, they round the masters again; rebuilt, the
// copy gives that loss again.
TEST(WorkingCopy, LowOpsReadIt) {
  Trainer t(DT_DTYPE_BF16, nullptr);
  t.Step(0);
  dtt::Tensors ts;
  dt_tensor *x, *y;
  Trainer::Batch(ts, 1, &x, &y);
  auto loss = [&] {
    dt_tensor *l = nullptr;
    EXPECT_EQ(DT_OK, t.Loss(x, y, &l)) << dt_last_error();
    float v = dtt::ToVector(l)[0];
    dt_tensor_release(l);
    return v;
  };
  float with_copy = loss();
  std::vector<uint16_t> halved = t.WorkingCopy();
  for (uint16_t &h : halved)
    h = dt_f32_to_bf16(0.5f * dt_bf16_to_f32(h));
  dt_tensor *w = dt_optim_working_copy(t.opt), *src = nullptr;
  const int64_t n = (int64_t)halved.size();
  ASSERT_DT_OK(dt_tensor_from_host(halved.data(), &n, 1, DT_DTYPE_BF16, DT_CPU, &src));
  ts.add(src);
  ASSERT_DT_OK(dt_tensor_copy_(w, src));
  EXPECT_NE(loss(), with_copy) << "the LOW ops ignored the working copy";
  dt_optim_working_copy_invalidate(t.opt);
  EXPECT_FALSE(dt_optim_working_copy_is_fresh(t.opt));
  EXPECT_EQ(loss(), with_copy) << "a stale copy is not used";
  const dt_working_copy_config cfg = {DT_DTYPE_BF16, false, 0};
  ASSERT_DT_OK(dt_optim_use_working_copy(t.opt, &cfg));
  EXPECT_EQ(t.WorkingCopy(), RoundedToNearest(DT_DTYPE_BF16, t.Params()));
  EXPECT_EQ(loss(), with_copy);
  const dt_working_copy_config f32 = {DT_DTYPE_F32, false, 0};
  EXPECT_EQ(dt_optim_use_working_copy(t.opt, &f32), DT_ERR_DTYPE);
}

// Stochastic rounding of the copy: each element is one of the master's two
// 16-bit neighbours, unbiased over the elements, the same for the same seed
// (and when rebuilt after a checkpoint load: the draws depend on the seed,
// the step count and the element) and different for another seed.
TEST(WorkingCopy, StochasticRoundingReproducibleAndUnbiased) {
  for (dt_dtype t : {DT_DTYPE_BF16, DT_DTYPE_F16}) {
    Trainer a(t, nullptr, true), b(t, nullptr, true), other(t, nullptr, true);
    for (Trainer *tr : {&a, &b, &other}) {
      tr->step.cfg.stochastic_rounding = true;
      tr->step.cfg.rounding_seed = tr == &other ? 8 : 7;
    }
    for (uint64_t i = 0; i < 2; i++)
      for (Trainer *tr : {&a, &b, &other})
        tr->Step(i);
    std::vector<float> p = a.Params();
    std::vector<uint16_t> sr = a.WorkingCopy(), nearest = RoundedToNearest(t, p);
    ASSERT_EQ(sr.size(), p.size());
    EXPECT_EQ(b.Params(), p);
    EXPECT_EQ(b.WorkingCopy(), sr) << "the same seed draws the same rounding";
    EXPECT_NE(other.WorkingCopy(), sr) << "another seed draws another rounding";
    auto widen = [t](uint16_t h) {
      return t == DT_DTYPE_BF16 ? dt_bf16_to_f32(h) : dt_f16_to_f32(h);
    };
    int64_t differ = 0;
    double bias = 0;  // sum of (copy - master) / the gap between the master's neighbours
    for (size_t i = 0; i < p.size(); i++) {
      float vn = widen(nearest[i]);
      if (vn == p[i]) {
        ASSERT_EQ(sr[i], nearest[i]) << "a representable master is kept, element " << i;
        continue;
      }
      // codes of one sign are ordered by magnitude
      uint16_t far = std::abs(vn) > std::abs(p[i]) ? nearest[i] - 1 : nearest[i] + 1;
      ASSERT_TRUE(sr[i] == nearest[i] || sr[i] == far) << "element " << i;
      bias += ((double)widen(sr[i]) - p[i]) / std::abs((double)widen(far) - vn);
      differ += sr[i] != nearest[i];
    }
    EXPECT_GT(differ, (int64_t)p.size() / 10) << "stochastic rounding left the copy nearest";
    // each term has mean 0 and |term| < 1: the sum's standard deviation is < sqrt(n)/2
    EXPECT_LT(std::abs(bias), 5 * std::sqrt((double)p.size()) / 2) << dt_dtype_name(t);
    // a resumed run rebuilds the copy it left
    dt_optim_working_copy_invalidate(a.opt);
    const dt_working_copy_config cfg = {t, true, 7};
    ASSERT_DT_OK(dt_optim_use_working_copy(a.opt, &cfg));
    EXPECT_EQ(a.WorkingCopy(), sr) << dt_dtype_name(t);
  }
}

}  // namespace

// GPT-2 tiny (context 32) with an arena and a batch of 4 x 32 random tokens.
struct Gpt2TinyBatch {
  dt_task small;
  dt_module *model = nullptr;
  dt_param_arena *arena = nullptr;
  dtt::Tensors ts;
  dt_tensor *x = nullptr, *y = nullptr;

  Gpt2TinyBatch() {
    const dt_task *task = nullptr;
    EXPECT_EQ(DT_OK, dt_task_find("gpt2-tiny", &task)) << dt_last_error();
    EXPECT_EQ(DT_OK, dt_task_with_context(task, 32, &small)) << dt_last_error();
    EXPECT_EQ(DT_OK, small.build(&small, 5, &model)) << dt_last_error();
    EXPECT_EQ(DT_OK, dt_param_arena_create(model, &arena)) << dt_last_error();
    const int64_t b = 4, t = 32;
    std::vector<int64_t> ids(b * t), next(b * t);
    for (int64_t i = 0; i < b * t; i++) {
      ids[i] = (int64_t)(dt_rng_bits(11, (uint64_t)i) % 2000);
      next[i] = (int64_t)(dt_rng_bits(12, (uint64_t)i) % 2000);
    }
    x = ts.add(dtt::MakeIndexTensor(ids, {b, t}, DT_DTYPE_I32));
    y = ts.add(dtt::MakeIndexTensor(next, {b, t}, DT_DTYPE_I32));
  }
  ~Gpt2TinyBatch() {
    dt_param_arena_destroy(arena);
    dt_module_destroy(model);
  }
  // One forward and backward under autocast to `autocast` (f32: off).
  dt_status Step(dt_dtype autocast) {
    dt_step s = {model, arena, nullptr, DT_GRAD_SYNC_NONE, DT_STEP_CONFIG_DEFAULT};
    s.cfg.loss = small.loss;
    s.cfg.autocast = autocast;
    DT_CHECK(dt_param_arena_zero_grad(arena));
    return dt_step_forward_backward(&s, x, y, 1.0f, true, nullptr);
  }
};

// GPT-2 tiny, one forward and backward on random tokens: under bf16 and f16
// autocast every parameter's gradient stays close to f32's (relative L2
// error), so no op of the transformer loses its gradient in 16 bits.
TEST(AutocastStep, Gpt2TinyGradientsCloseToF32) {
  Gpt2TinyBatch g2;
  dt_module *model = g2.model;
  dt_param_arena *arena = g2.arena;
  auto grads = [&](dt_dtype autocast) {
    EXPECT_EQ(DT_OK, g2.Step(autocast)) << dt_last_error();
    return dtt::ToVector(dt_param_arena_grads(arena));
  };
  std::vector<float> want = grads(DT_DTYPE_F32);
  for (dt_dtype d : {DT_DTYPE_BF16, DT_DTYPE_F16}) {
    std::vector<float> got = grads(d);
    ASSERT_EQ(got.size(), want.size());
    double bound = d == DT_DTYPE_BF16
                       ? 2e-2
                       : 4e-3;  // measured: 0.0066 and 0.0009 at most  // ~ 8 x the unit roundoff
    for (int p = 0; p < dt_param_arena_count(arena); p++) {
      const char *name = nullptr;
      dt_tensor *param = dt_param_arena_param(arena, p, &name);
      int64_t off = dt_param_arena_offset(arena, p), n = dt_tensor_numel(param);
      double diff = 0, norm = 0;
      for (int64_t i = off; i < off + n; i++) {
        diff += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        norm += (double)want[i] * want[i];
      }
      double rel = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
      EXPECT_LT(rel, bound) << dt_dtype_name(d) << " parameter " << p << " (" << name
                            << "): relative gradient error";
    }
  }
  (void)model;
}

// The fused classifier's f16 gradient buffer holds (softmax - onehot) times
// 2^15 until its backward scales it: GPT-2's small probabilities (~1e-6 ..
// 5e-5 here) would be f16 subnormals unscaled, with relative errors of
// several percent (measured: 3.7% before the scaling). With it every element
// of the loss-scaled gradient is within two f16 roundings of f32's.
TEST(AutocastOps, Fp16ClassifierGradientKeepsSmallProbabilitiesNormal) {
  const int64_t rows = 4, vp = 4096;
  std::vector<float> v = dtt::RandomValues((size_t)(rows * vp), 7, -4.0f, 0.0f);
  for (int64_t r = 0; r < rows; r++)
    v[(size_t)(r * vp + r)] = 10.0f;  // one large logit per row: the rest are ~1e-6 .. 5e-5
  dt_tensor *x32 = dtt::MakeTensor(v, {rows, vp}), *x16 = nullptr, *xw = nullptr;
  ASSERT_DT_OK(dt_tensor_to_dtype(x32, DT_DTYPE_F16, &x16));
  ASSERT_DT_OK(dt_tensor_to_dtype(x16, DT_DTYPE_F32, &xw));  // the same values in f32
  dt_tensor *target = dtt::MakeIndexTensor({5, 6, 7, 8}, {rows});
  auto grad = [&](dt_tensor *x) {
    std::vector<float> out;
    dt_tensor *loss = nullptr, *scaled = nullptr, *g32 = nullptr;
    EXPECT_EQ(DT_OK, dt_tensor_set_requires_grad(x, 1)) << dt_last_error();
    EXPECT_EQ(DT_OK, dt_op_classifier_loss(x, target, vp, -100, &loss)) << dt_last_error();
    EXPECT_EQ(DT_OK, dt_op_scale(loss, 65536.0f, &scaled)) << dt_last_error();  // the scaler's
    EXPECT_EQ(DT_OK, dt_backward(scaled, nullptr)) << dt_last_error();
    dt_tensor *g = dt_tensor_grad(x);
    EXPECT_NE(g, nullptr);
    if (g && dt_tensor_to_dtype(g, DT_DTYPE_F32, &g32) == DT_OK)
      out = dtt::ToVector(g32);
    for (dt_tensor *t : {g32, scaled, loss})
      dt_tensor_release(t);
    return out;
  };
  std::vector<float> got = grad(x16), want = grad(xw);
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); i++)
    worst = std::fmax(worst, std::fabs((double)got[i] - want[i]) / std::fabs((double)want[i]));
  EXPECT_LT(worst, 2e-3) << "largest relative error of the f16 gradient";
  for (dt_tensor *t : {target, xw, x16, x32})
    dt_tensor_release(t);
}

// The f32 ops of 16-bit inputs whose kernels read 16 bits (the softmaxes,
// layer norm, the fused residual layer norm) pass their 16-bit tensors as
// they are: no widened copy. Their results and every gradient are bit for
// bit those of the earlier path, the op on inputs widened by a recorded
// cast (the 16-bit inputs' gradients rounded once, by the cast's backward
// then, by the engine now).
namespace widened_path {

struct In {
  std::vector<int64_t> shape;
  bool half;  // 16-bit (the row's dtype), else f32
};

// The op's output and then each input's gradient (after a backward with a
// fixed upstream gradient), as f32 values; with `widen` every 16-bit input
// reaches the op through a recorded cast to f32.
std::vector<std::vector<float>> Run(dt_dtype d, const std::vector<In> &ins, const dtt::OpFn &fn,
                                    bool widen) {
  std::vector<dt_tensor *> leaves, args;
  std::vector<std::vector<float>> res;
  for (size_t k = 0; k < ins.size(); k++) {
    int64_t n = 1;
    for (int64_t e : ins[k].shape)
      n *= e;
    dt_tensor *t = dtt::MakeTensor(dtt::RandomValues((size_t)n, 60 + k, -2.0f, 2.0f), ins[k].shape);
    dt_tensor *leaf = t, *arg = nullptr;
    if (ins[k].half) {
      EXPECT_EQ(DT_OK, dt_tensor_to_dtype(t, d, &leaf)) << dt_last_error();
      dt_tensor_release(t);
    }
    EXPECT_EQ(DT_OK, dt_tensor_set_requires_grad(leaf, 1)) << dt_last_error();
    if (ins[k].half && widen)
      EXPECT_EQ(DT_OK, dt_tensor_to_dtype(leaf, DT_DTYPE_F32, &arg)) << dt_last_error();
    else
      arg = dt_tensor_retain(leaf);
    leaves.push_back(leaf);
    args.push_back(arg);
  }
  dt_tensor *out = nullptr, *up = nullptr;
  EXPECT_EQ(DT_OK, fn(args, &out)) << dt_last_error();
  if (out) {
    EXPECT_EQ(dt_tensor_dtype(out), DT_DTYPE_F32) << "autocast's f32 ops return f32";
    res.push_back(dtt::ToVector(out));
    up = dtt::MakeTensor(dtt::UpstreamGradient(res[0].size(), 777), dtt::Shape(out));
    EXPECT_EQ(DT_OK, dt_backward(out, up)) << dt_last_error();
  }
  for (dt_tensor *leaf : leaves) {
    dt_tensor *g = dt_tensor_grad(leaf), *g32 = nullptr;
    EXPECT_NE(g, nullptr);
    if (g) {
      EXPECT_EQ(dt_tensor_dtype(g), dt_tensor_dtype(leaf)) << "a gradient has its tensor's dtype";
      dt_no_grad_begin();
      EXPECT_EQ(DT_OK, dt_tensor_to_dtype(g, DT_DTYPE_F32, &g32)) << dt_last_error();
      dt_no_grad_end();
      res.push_back(g32 ? dtt::ToVector(g32) : std::vector<float>());
      dt_tensor_release(g32);
    }
  }
  for (dt_tensor *t : args)
    dt_tensor_release(t);
  for (dt_tensor *t : leaves)
    dt_tensor_release(t);
  dt_tensor_release(up);
  dt_tensor_release(out);
  return res;
}

// Expects fn's output and every input's gradient, with the 16-bit inputs
// passed as they are, to be bit for bit those of the widened path.
void ExpectSameAsWidened(dt_dtype d, const char *name, const std::vector<In> &ins,
                         const dtt::OpFn &fn) {
  std::vector<std::vector<float>> got = Run(d, ins, fn, false), want = Run(d, ins, fn, true);
  ASSERT_EQ(got.size(), ins.size() + 1) << name;
  ASSERT_EQ(want.size(), got.size()) << name;
  for (size_t k = 0; k < got.size(); k++) {
    std::string what = std::string(dt_dtype_name(d)) + " " + name +
                       (k == 0 ? " output" : " gradient of input " + std::to_string(k - 1));
    ASSERT_EQ(got[k].size(), want[k].size()) << what;
    EXPECT_EQ(0, std::memcmp(got[k].data(), want[k].data(), got[k].size() * sizeof(float)))
        << what << " differs from the widened path";
  }
}

// An op's result y (status st) as the harness reads it: rounded to the
// row's dtype d (a no-op on a 16-bit y) and widened to *out; releases y.
dt_status RoundedAndWidened(dt_status st, dt_tensor *y, dt_dtype d, dt_tensor **out) {
  dt_tensor *rounded = nullptr;
  if (st == DT_OK)
    st = dt_tensor_to_dtype(y, d, &rounded);
  if (st == DT_OK)
    st = dt_tensor_to_dtype(rounded, DT_DTYPE_F32, out);
  dt_tensor_release(rounded);
  dt_tensor_release(y);
  return st;
}

}  // namespace widened_path

TEST(AutocastOps, NormsAndSoftmaxesOfHalfInputsEqualTheWidenedPathBitForBit) {
  using widened_path::In;
  struct Case {
    const char *name;
    std::vector<In> ins;
    dtt::OpFn fn;
  };
  const std::vector<int64_t> rows = {37, 300}, d = {300};  // several blocks of rows
  const std::vector<Case> cases = {
      {"softmax",
       {{{5, 3000}, true}},
       [](auto &x, dt_tensor **o) { return dt_op_softmax(x[0], -1, o); }},
      {"log_softmax",
       {{rows, true}},
       [](auto &x, dt_tensor **o) { return dt_op_log_softmax(x[0], -1, o); }},
      {"causal_softmax",
       {{{2, 3, 40, 40}, true}},
       [](auto &x, dt_tensor **o) { return dt_op_causal_softmax(x[0], o); }},
      {"layer_norm",
       {{rows, true}, {d, false}, {d, false}},
       [](auto &x, dt_tensor **o) { return dt_op_layer_norm(x[0], x[1], x[2], 1e-5f, o); }},
      {"sync_batch_norm2d (one process)",
       {{{4, 6, 5, 5}, true}, {{6}, false}, {{6}, false}},
       [](auto &x, dt_tensor **o) {
         const dt_sum_across one = {[](dt_tensor *, void *) { return DT_OK; }, nullptr};
         return dt_op_sync_batch_norm2d(x[0], x[1], x[2], nullptr, nullptr, 0.1f, 1e-5f, &one, o);
       }},
      {"batch_norm2d (training)",
       {{{4, 6, 5, 5}, true}, {{6}, false}, {{6}, false}},
       [](auto &x, dt_tensor **o) {
         return dt_op_batch_norm2d(x[0], x[1], x[2], nullptr, nullptr, true, 0.1f, 1e-5f, o);
       }},
      {"residual_layer_norm 16-bit x",
       {{rows, true}, {rows, false}, {d, false}, {d, false}},
       dtt::ResidualLayerNormBoth},
      {"residual_layer_norm 16-bit residual",
       {{rows, false}, {rows, true}, {d, false}, {d, false}},
       dtt::ResidualLayerNormBoth},
      {"residual_layer_norm both 16-bit",
       {{rows, true}, {rows, true}, {d, false}, {d, false}},
       dtt::ResidualLayerNormBoth},
  };
  for (dt_dtype dt : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (const Case &c : cases)
      widened_path::ExpectSameAsWidened(dt, c.name, c.ins, c.fn);
}

// The poolings (PROMOTE: 16-bit in, 16-bit out) pass their 16-bit input to
// the kernels; the widened path pooled a widened copy and rounded the
// result once (its recorded cast rounded dx once too). Compared as the
// harness reads them: the result rounded to the row's dtype (a no-op on
// the 16-bit one) and widened.
TEST(AutocastOps, PoolingOfHalfInputsEqualsTheWidenedPathBitForBit) {
  struct Case {
    const char *name;
    dt_status (*op)(dt_tensor *, int, int, int, dt_tensor **);
    std::vector<int64_t> x;
    int k, s, p;
  };
  const Case cases[] = {
      {"max_pool2d 2x2 (LeNet's)", dt_op_max_pool2d, {16, 6, 28, 28}, 2, 2, 0},
      {"max_pool2d 3x3 stride 1 padded (overlapping windows)",
       dt_op_max_pool2d,
       {3, 4, 9, 7},
       3,
       1,
       1},
      {"avg_pool2d 2x2", dt_op_avg_pool2d, {16, 6, 28, 28}, 2, 2, 0},
      {"avg_pool2d 3x3 stride 2 padded", dt_op_avg_pool2d, {3, 4, 9, 7}, 3, 2, 1},
  };
  for (dt_dtype dt : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (const Case &c : cases) {
      dtt::OpFn fn = [&c, dt](const std::vector<dt_tensor *> &x, dt_tensor **out) {
        dt_tensor *y = nullptr;
        dt_status st = c.op(x[0], c.k, c.s, c.p, &y);
        return widened_path::RoundedAndWidened(st, y, dt, out);
      };
      widened_path::ExpectSameAsWidened(dt, c.name, {{c.x, true}}, fn);
    }
}

// Dropout (PROMOTE) passes its 16-bit input to the kernels too and gets a
// 16-bit y and dx: bit for bit the widened path's (the same mask, one
// rounding), with a fresh generator of the same seed for each path.
TEST(AutocastOps, DropoutOfHalfInputsEqualsTheWidenedPathBitForBit) {
  for (dt_dtype dt : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (float p : {0.1f, 0.5f}) {
      dtt::OpFn fn = [dt, p](const std::vector<dt_tensor *> &x, dt_tensor **out) {
        dt_generator gen;
        dt_generator_init(&gen, 4242);
        dt_tensor *y = nullptr;
        dt_status st = dt_op_dropout(x[0], p, true, &gen, &y);
        return widened_path::RoundedAndWidened(st, y, dt, out);
      };
      const std::string name = "dropout p " + std::to_string(p);
      widened_path::ExpectSameAsWidened(dt, name.c_str(), {{{8, 3, 1000}, true}}, fn);
    }
}

// Under autocast the activations between ops are 16-bit, as in PyTorch: the
// logits are, and the step's memory beyond the parameters (the logits and
// their gradient are its largest tensors) is below f32's.
TEST(AutocastStep, Gpt2TinyActivationsAre16Bit) {
  Gpt2TinyBatch g2;
  for (dt_dtype d : {DT_DTYPE_BF16, DT_DTYPE_F16}) {
    dt_tensor *logits = nullptr;
    dt_dtype prev = dt_autocast_begin(d);
    dt_status st = dt_module_call(g2.model, g2.x, &logits);
    dt_autocast_end(prev);
    ASSERT_DT_OK(st);
    EXPECT_EQ(dt_tensor_dtype(logits), d);
    dt_tensor_release(logits);
  }
  auto step_bytes = [&](dt_dtype autocast) {
    dt_memory_stats before, after;
    EXPECT_EQ(DT_OK, dt_memory_reset_peak(DT_CPU)) << dt_last_error();
    EXPECT_EQ(DT_OK, dt_memory_stats_get(DT_CPU, &before)) << dt_last_error();
    EXPECT_EQ(DT_OK, g2.Step(autocast)) << dt_last_error();
    EXPECT_EQ(DT_OK, dt_memory_stats_get(DT_CPU, &after)) << dt_last_error();
    return (double)(after.peak_allocated - before.allocated);
  };
  // measured at 4 x 32 tokens: 66.7 MiB against 78.5 (the 16-bit logits and
  // their gradient save 24.6 MiB; the 16-bit copy of the tied LM-head
  // weight that the linear keeps costs 12.3); with f32 logits the ratio
  // would be above 1
  double f32 = step_bytes(DT_DTYPE_F32), bf16 = step_bytes(DT_DTYPE_BF16);
  EXPECT_LT(bf16, 0.9 * f32) << bf16 / DT_MIB << " MiB against f32's " << f32 / DT_MIB << " MiB";
}

// The linear's gradient for an input that is 16-bit already (an activation
// under autocast: the attention's output, GELU's) is written in 16 bits by
// the backend's gemm_rounded, one rounding of the f32 accumulator: bit for
// bit the widened path's (an f32 dx that the recorded cast rounded), with
// no f32 copy of dx. Sizes: one GEMM, and a dx large enough for the
// linear's slices of rows (an eighth) and the CPU kernel's.
TEST(AutocastOps, LinearGradientOfHalfInputEqualsTheWidenedPathBitForBit) {
  struct Case {
    const char *name;
    std::vector<int64_t> x, w;
    bool bias;
  };
  const Case cases[] = {
      {"linear 5x7x33 -> 19", {5, 7, 33}, {19, 33}, true},
      {"linear 1200x256 -> 1000 (slices)", {4, 300, 256}, {1000, 256}, true},
      {"linear 300x1100 -> 1024 (dx in slices)", {300, 1100}, {1024, 1100}, false},
  };
  for (dt_dtype dt : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (const Case &c : cases) {
      dtt::OpFn fn = [&c, dt](const std::vector<dt_tensor *> &x, dt_tensor **out) {
        dt_tensor *y = nullptr;
        dt_dtype prev = dt_autocast_begin(dt);
        dt_status st = dt_op_linear(x[0], x[1], c.bias ? x[2] : nullptr, &y);
        dt_autocast_end(prev);
        return widened_path::RoundedAndWidened(st, y, dt, out);
      };
      std::vector<widened_path::In> ins = {{c.x, true}, {c.w, false}};
      if (c.bias)
        ins.push_back({{c.w[0]}, false});
      widened_path::ExpectSameAsWidened(dt, c.name, ins, fn);
    }
}

// ... and its dtype is the input's: 16 bits, no f32 copy.
TEST(AutocastOps, LinearGradientOfHalfInputIs16Bit) {
  for (dt_dtype dt : {DT_DTYPE_BF16, DT_DTYPE_F16}) {
    dt_tensor *x32 = dtt::RandomTensor({6, 10}, 3), *x = nullptr, *y = nullptr;
    dt_tensor *w = dtt::RandomTensor({4, 10}, 4, true);
    ASSERT_EQ(DT_OK, dt_tensor_to_dtype(x32, dt, &x)) << dt_last_error();
    ASSERT_EQ(DT_OK, dt_tensor_set_requires_grad(x, 1)) << dt_last_error();
    dt_dtype prev = dt_autocast_begin(dt);
    ASSERT_EQ(DT_OK, dt_op_linear(x, w, nullptr, &y)) << dt_last_error();
    dt_autocast_end(prev);
    dt_tensor *up = nullptr, *up32 = dtt::MakeTensor(dtt::UpstreamGradient(24, 777), {6, 4});
    ASSERT_EQ(DT_OK, dt_tensor_to_dtype(up32, dt, &up)) << dt_last_error();
    ASSERT_EQ(DT_OK, dt_backward(y, up)) << dt_last_error();
    ASSERT_NE(dt_tensor_grad(x), nullptr);
    EXPECT_EQ(dt_tensor_dtype(dt_tensor_grad(x)), dt);
    EXPECT_EQ(dt_tensor_dtype(dt_tensor_grad(w)), DT_DTYPE_F32);
    for (dt_tensor *t : {x32, x, y, w, up, up32})
      dt_tensor_release(t);
  }
}

namespace gelu_mlp {

// The elements of a float tensor of any dtype, widened.
std::vector<float> Values(dt_tensor *t) {
  dt_tensor *w = nullptr;
  EXPECT_EQ(DT_OK, dt_tensor_to_dtype(t, DT_DTYPE_F32, &w)) << dt_last_error();
  std::vector<float> v = dtt::ToVector(w);
  dt_tensor_release(w);
  return v;
}

struct Run {
  std::vector<float> y;
  std::vector<std::vector<float>> grads;  // x, w_fc, b_fc, w_proj, b_proj
  dt_dtype x_grad_dtype = DT_DTYPE_F32;
};

// Two forward and backward passes (the second adds into the .grad the first
// made: the engine's gradient destinations) of the MLP under autocast to
// dt, fused (dt_op_gelu_mlp) or as dt_op_linear, dt_op_gelu, dt_op_linear;
// the input x is 16-bit when half_x (a norm's result under autocast).
Run RunMlp(dt_dtype dt, bool fused, bool half_x, bool b_fc, std::vector<int64_t> xs, int64_t hid,
           int64_t out) {
  const int64_t in = xs.back();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < xs.size(); i++)
    rows *= xs[i];
  dt_tensor *x32 = dtt::RandomTensor(xs, 11, !half_x, -2, 2), *x = x32;
  if (half_x) {
    EXPECT_EQ(DT_OK, dt_tensor_to_dtype(x32, dt, &x)) << dt_last_error();
    EXPECT_EQ(DT_OK, dt_tensor_set_requires_grad(x, 1)) << dt_last_error();
  }
  const float bound = 1.0f / std::sqrt((float)in);
  dt_tensor *p[4] = {dtt::RandomTensor({hid, in}, 12, true, -bound, bound),
                     b_fc ? dtt::RandomTensor({hid}, 13, true, -bound, bound) : nullptr,
                     dtt::RandomTensor({out, hid}, 14, true, -0.1f, 0.1f),
                     dtt::RandomTensor({out}, 15, true, -0.1f, 0.1f)};
  dt_tensor *up32 = dtt::MakeTensor(dtt::UpstreamGradient((size_t)(rows * out), 16), {rows, out});
  dt_tensor *up = nullptr;
  EXPECT_EQ(DT_OK, dt_tensor_to_dtype(up32, dt, &up)) << dt_last_error();
  Run r;
  for (int pass = 0; pass < 2; pass++) {
    dt_tensor *y = nullptr, *pre = nullptr, *h = nullptr, *y2 = nullptr;
    dt_dtype prev = dt_autocast_begin(dt);
    dt_status st = DT_OK;
    if (fused) {
      st = dt_op_gelu_mlp(x, p[0], p[1], p[2], p[3], &y);
    } else {
      st = dt_op_linear(x, p[0], p[1], &pre);
      if (st == DT_OK)
        st = dt_op_gelu(pre, &h);
      if (st == DT_OK)
        st = dt_op_linear(h, p[2], p[3], &y);
    }
    dt_autocast_end(prev);
    EXPECT_EQ(DT_OK, st) << dt_last_error();
    if (st == DT_OK) {
      EXPECT_EQ(dt_tensor_dtype(y), dt);
      EXPECT_EQ(DT_OK, dt_tensor_reshape(y, std::vector<int64_t>{rows, out}.data(), 2, &y2));
      EXPECT_EQ(DT_OK, dt_backward(y2, up)) << dt_last_error();
      r.y = Values(y);
    }
    for (dt_tensor *t : {y2, y, h, pre})
      dt_tensor_release(t);
  }
  r.x_grad_dtype = dt_tensor_dtype(dt_tensor_grad(x));
  r.grads.push_back(Values(dt_tensor_grad(x)));
  for (dt_tensor *t : p)
    r.grads.push_back(t ? Values(dt_tensor_grad(t)) : std::vector<float>());
  for (dt_tensor *t : {p[0], p[1], p[2], p[3], up, up32})
    dt_tensor_release(t);
  if (x != x32)
    dt_tensor_release(x);
  dt_tensor_release(x32);
  return r;
}

}  // namespace gelu_mlp

// On the CPU the fused GELU MLP runs the unfused ops' kernels in the same
// order and slices: its result and every gradient (twice accumulated) are
// theirs bit for bit, f32 or 16-bit x, one GEMM or the slices of rows of
// a large pre (hidden 512 x 2100 rows), with and without the first bias.
TEST(AutocastOps, GeluMlpEqualsTheThreeOpsBitForBit) {
  struct Case {
    const char *name;
    std::vector<int64_t> x;
    int64_t hid, out;
    bool half_x, b_fc;
  };
  const Case cases[] = {
      {"2x5x16 -> 64 -> 16, f32 x", {2, 5, 16}, 64, 16, false, true},
      {"7x16 -> 12 -> 8, 16-bit x", {7, 16}, 12, 8, true, true},
      {"5x16 -> 24 -> 8, no first bias", {5, 16}, 24, 8, true, false},
      {"2100x8 -> 512 -> 8 (slices)", {2100, 8}, 512, 8, true, true},
  };
  const char *names[] = {"x", "w_fc", "b_fc", "w_proj", "b_proj"};
  for (dt_dtype dt : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (const Case &c : cases) {
      SCOPED_TRACE(std::string(c.name) + " " + dt_dtype_name(dt));
      gelu_mlp::Run a = gelu_mlp::RunMlp(dt, true, c.half_x, c.b_fc, c.x, c.hid, c.out);
      gelu_mlp::Run b = gelu_mlp::RunMlp(dt, false, c.half_x, c.b_fc, c.x, c.hid, c.out);
      ASSERT_FALSE(a.y.empty());
      EXPECT_EQ(0, std::memcmp(a.y.data(), b.y.data(), a.y.size() * sizeof(float))) << "y";
      EXPECT_EQ(a.x_grad_dtype, c.half_x ? dt : DT_DTYPE_F32);
      EXPECT_EQ(a.x_grad_dtype, b.x_grad_dtype);
      for (size_t i = 0; i < a.grads.size(); i++) {
        ASSERT_EQ(a.grads[i].size(), b.grads[i].size()) << names[i];
        EXPECT_EQ(
            0, std::memcmp(a.grads[i].data(), b.grads[i].data(), a.grads[i].size() * sizeof(float)))
            << names[i];
      }
    }
}
