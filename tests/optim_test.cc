// Optimizers (SGD, AdamW), LR schedules and gradient clipping against values
// worked out from the update rules published in PyTorch's documentation
// (torch.optim.SGD, torch.optim.AdamW, clip_grad_norm_).
#include "core/optim.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/module.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "tests/test_util.h"

namespace {

dt_status NoForward(dt_module *, dt_tensor *, dt_tensor **) {
  return DT_ERROR(DT_ERR_UNSUPPORTED, "test module has no forward");
}
const dt_module_vtable kParamsOnly = {"ParamsOnly", NoForward, nullptr};

// A module with parameters "w" (3) and "b" (2): a 5-element arena.
class OptimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_DT_OK(dt_module_create(&kParamsOnly, nullptr, &m_));
    const int64_t sizes[2] = {3, 2};
    const char *names[2] = {"w", "b"};
    for (int i = 0; i < 2; i++) {
      dt_tensor *t = nullptr;
      ASSERT_DT_OK(dt_tensor_zeros(&sizes[i], 1, DT_DTYPE_F32, DT_CPU, &t));
      ASSERT_DT_OK(dt_module_register_parameter(m_, names[i], t));
      dt_tensor_release(t);
    }
    ASSERT_DT_OK(dt_param_arena_create(m_, &arena_));
    ASSERT_EQ(dt_param_arena_numel(arena_), 5);
  }
  void TearDown() override {
    dt_optim_destroy(opt_);
    dt_param_arena_destroy(arena_);
    dt_module_destroy(m_);
  }

  void SetParams(const std::vector<float> &v) {
    ASSERT_DT_OK(dtt::CopyFromHost(dt_param_arena_data(arena_), v));
  }
  void SetGrads(const std::vector<float> &v) {
    ASSERT_DT_OK(dtt::CopyFromHost(dt_param_arena_grads(arena_), v));
  }
  std::vector<float> Params() { return dtt::ToVector(dt_param_arena_data(arena_)); }
  std::vector<float> Grads() { return dtt::ToVector(dt_param_arena_grads(arena_)); }
  void ExpectAdamWReference(const dt_adamw_config &c, int steps, int decayed, double tol);

  dt_module *m_ = nullptr;
  dt_param_arena *arena_ = nullptr;
  dt_optimizer *opt_ = nullptr;
};

const std::vector<float> kOnes(5, 1.0f);
const std::vector<float> kHalf(5, 0.5f);

// `want` holds p after each step, worked out by hand from torch.optim.SGD's
// algorithm.
struct SgdCase {
  const char *what;
  dt_sgd_config cfg;
  std::vector<double> want;
};

TEST_F(OptimTest, SgdHandWorked) {
  const SgdCase cases[] = {
      // p -= 0.1 * 0.5
      {"plain", {0.1f, 0.0f, 0.0f, 0.0f, 0}, {0.95, 0.90, 0.85}},
      // b1 = g = 0.5; b2 = 0.9*0.5 + 0.5 = 0.95; b3 = 0.9*0.95 + 0.5 = 1.355
      {"momentum", {0.1f, 0.9f, 0.0f, 0.0f, 0}, {0.95, 0.855, 0.7195}},
      // first step b = g (no dampening); b2 = 0.45 + 0.5*0.5 = 0.7; b3 = 0.63 + 0.25 = 0.88
      {"dampening", {0.1f, 0.9f, 0.5f, 0.0f, 0}, {0.95, 0.88, 0.792}},
      // g + 0.9*b: 0.95, 0.5 + 0.9*0.95 = 1.355, 0.5 + 0.9*1.355 = 1.7195
      {"nesterov", {0.1f, 0.9f, 0.0f, 0.0f, 1}, {0.905, 0.7695, 0.59755}},
      // g = 0.5 + 0.1*p: 0.6, 0.594, 0.58806
      {"weight_decay", {0.1f, 0.0f, 0.0f, 0.1f, 0}, {0.94, 0.8806, 0.821794}},
  };
  for (const SgdCase &c : cases) {
    SCOPED_TRACE(c.what);
    SetParams(kOnes);
    dt_optimizer *o = nullptr;
    ASSERT_DT_OK(dt_optim_sgd_create(arena_, &c.cfg, &o));
    EXPECT_STREQ(dt_optim_name(o), "sgd");
    EXPECT_FLOAT_EQ(dt_optim_lr(o), 0.1f);
    // Three steps from p = 1 with a constant gradient 0.5, lr 0.1.
    for (size_t k = 0; k < c.want.size(); k++) {
      SetGrads(kHalf);
      ASSERT_DT_OK(dt_optim_step(o));
      for (float x : Params())
        EXPECT_NEAR(x, c.want[k], 1e-6) << "after step " << k + 1;
    }
    EXPECT_EQ(dt_optim_step_count(o), (int64_t)c.want.size());
    dt_optim_destroy(o);
  }
}

// torch.optim.SGD's documented algorithm in double precision.
void SgdReference(std::vector<double> &p, std::vector<double> &buf, const std::vector<float> &g,
                  const dt_sgd_config &c, bool first) {
  for (size_t i = 0; i < p.size(); i++) {
    double gi = g[i] + (double)c.weight_decay * p[i];
    if (c.momentum != 0.0f) {
      buf[i] = first ? gi : c.momentum * buf[i] + (1.0 - c.dampening) * gi;
      gi = c.nesterov ? gi + c.momentum * buf[i] : buf[i];
    }
    p[i] -= (double)c.lr * gi;
  }
}

std::vector<float> StepGrads(int k) {
  std::vector<float> g(5);
  for (int i = 0; i < 5; i++)
    g[i] = 0.3f * (float)(i + 1) * (k % 2 ? -1.0f : 1.0f) + 0.05f * (float)k;
  return g;
}

const std::vector<float> kStart = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f};

TEST_F(OptimTest, SgdMatchesTheDocumentedAlgorithm) {
  const dt_sgd_config cfgs[] = {
      {0.05f, 0.9f, 0.1f, 0.01f, 0},
      {0.05f, 0.8f, 0.0f, 0.02f, 1},
      {0.2f, 0.0f, 0.0f, 0.0f, 0},
  };
  for (const dt_sgd_config &c : cfgs) {
    SetParams(kStart);
    dt_optimizer *o = nullptr;
    ASSERT_DT_OK(dt_optim_sgd_create(arena_, &c, &o));
    std::vector<double> p(kStart.begin(), kStart.end()), buf(5, 0.0);
    for (int k = 0; k < 4; k++) {
      std::vector<float> g = StepGrads(k);
      SetGrads(g);
      ASSERT_DT_OK(dt_optim_step(o));
      SgdReference(p, buf, g, c, k == 0);
      std::vector<float> got = Params();
      for (int i = 0; i < 5; i++)
        EXPECT_NEAR(got[i], p[i], 1e-5) << "momentum " << c.momentum << " step " << k << " i " << i;
    }
    dt_optim_destroy(o);
  }
}

TEST_F(OptimTest, AdamWHandWorkedWithBiasCorrection) {
  // Constant g = 0.5: m_hat = g and v_hat = g^2 at every step thanks to the
  // bias correction, so each step is p = p*(1 - lr*wd) - lr*g/(|g| + eps).
  // Step 1: p = 1*0.99 = 0.99; m = 0.05, v = 0.00025; m_hat = 0.05/0.1 = 0.5,
  // v_hat = 0.00025/0.001 = 0.25; p = 0.99 - 0.1*0.5/(0.5+1e-8) = 0.890000002.
  // (Without bias correction the step would be 0.1*0.05/sqrt(0.00025) = 0.316.)
  SetParams(kOnes);
  dt_adamw_config c = {0.1f, 0.9f, 0.999f, 1e-8f, 0.1f};
  ASSERT_DT_OK(dt_optim_adamw_create(arena_, &c, &opt_));
  EXPECT_STREQ(dt_optim_name(opt_), "adamw");
  ASSERT_EQ(dt_optim_state_numel(opt_), 10);
  const double want[3] = {0.890000002, 0.7811000040, 0.6732890059};
  for (int k = 0; k < 3; k++) {
    SetGrads(kHalf);
    ASSERT_DT_OK(dt_optim_step(opt_));
    for (float x : Params())
      EXPECT_NEAR(x, want[k], 2e-6) << "after step " << k + 1;
    if (k == 1) {
      // m2 = 0.9*0.05 + 0.1*0.5 = 0.095; v2 = 0.999*0.00025 + 0.001*0.25 = 0.00049975.
      std::vector<float> state(10);
      ASSERT_DT_OK(dt_optim_state_get(opt_, state.data(), 10));
      for (int i = 0; i < 5; i++) {
        EXPECT_NEAR(state[i], 0.095, 1e-7);
        // Relative 2e-5: the config holds beta2 as f32 (1 - 0.999f = 0.00099998713).
        EXPECT_NEAR(state[5 + i], 0.00049975, 0.00049975 * 2e-5);
      }
    }
  }
}

// One element of torch.optim.AdamW's documented update at step t (from 1).
void adamw_reference(const dt_adamw_config &c, int t, bool decay, double g, double *p, double *m,
                     double *v) {
  if (decay)
    *p -= (double)c.lr * c.weight_decay * *p;
  *m = c.beta1 * *m + (1.0 - c.beta1) * g;
  *v = c.beta2 * *v + (1.0 - c.beta2) * g * g;
  double mhat = *m / (1.0 - std::pow((double)c.beta1, t));
  double vhat = *v / (1.0 - std::pow((double)c.beta2, t));
  *p -= c.lr * mhat / (std::sqrt(vhat) + c.eps);
}

// `steps` steps of opt_ (from kStart, gradients StepGrads(t)) against
// adamw_reference element by element, within tol; the first `decayed`
// elements decay.
void OptimTest::ExpectAdamWReference(const dt_adamw_config &c, int steps, int decayed, double tol) {
  std::vector<double> p(kStart.begin(), kStart.end()), m(5, 0.0), v(5, 0.0);
  for (int t = 1; t <= steps; t++) {
    std::vector<float> g = StepGrads(t);
    SetGrads(g);
    ASSERT_DT_OK(dt_optim_step(opt_));
    for (int i = 0; i < 5; i++)
      adamw_reference(c, t, i < decayed, g[i], &p[i], &m[i], &v[i]);
    std::vector<float> got = Params();
    for (int i = 0; i < 5; i++)
      EXPECT_NEAR(got[i], p[i], tol) << "step " << t << " i " << i;
  }
}

TEST_F(OptimTest, AdamWMatchesTheDocumentedAlgorithm) {
  dt_adamw_config c = {0.01f, 0.8f, 0.95f, 1e-6f, 0.05f};
  SetParams(kStart);
  ASSERT_DT_OK(dt_optim_adamw_create(arena_, &c, &opt_));
  ExpectAdamWReference(c, 5, 5, 1e-5);
}

// Parameter groups: with a mask only "w" (the first 3 elements) decays;
// "b" follows AdamW without decay; both through the fused kernel. The mask
// of the wrong length and NULL (all decay again) as documented.
TEST_F(OptimTest, AdamWDecayMaskDecaysOnlyTheMaskedParameters) {
  dt_adamw_config c = {0.01f, 0.8f, 0.95f, 1e-6f, 0.05f};
  SetParams(kStart);
  ASSERT_DT_OK(dt_optim_adamw_create(arena_, &c, &opt_));
  const uint8_t mask[2] = {1, 0};
  EXPECT_EQ(dt_optim_set_decay_mask(opt_, mask, 3), DT_ERR_INVALID_ARG);
  ASSERT_DT_OK(dt_optim_set_decay_mask(opt_, mask, 2));
  ExpectAdamWReference(c, 3, 3, 1e-6);
  // Back to decay everywhere: a zero gradient then only decays.
  ASSERT_DT_OK(dt_optim_set_decay_mask(opt_, nullptr, 0));
  std::vector<float> before = Params();
  SetGrads(std::vector<float>(5, 0.0f));
  ASSERT_DT_OK(dt_optim_step(opt_));
  std::vector<float> after = Params();
  EXPECT_LT(std::fabs(after[4]), std::fabs(before[4])) << "b decays again";
}

// SGD with the mask of dt_optim_decay_matrices_only: 1-D parameters (all
// of them here) do not decay, so a zero gradient leaves them unchanged.
TEST_F(OptimTest, SgdDecayMatricesOnlySparesVectors) {
  dt_sgd_config c = {0.1f, 0.0f, 0.0f, 0.5f, 0};
  SetParams(kStart);
  ASSERT_DT_OK(dt_optim_sgd_create(arena_, &c, &opt_));
  ASSERT_DT_OK(dt_optim_decay_matrices_only(opt_));
  SetGrads(std::vector<float>(5, 0.0f));
  ASSERT_DT_OK(dt_optim_step(opt_));
  EXPECT_EQ(Params(), kStart);
}

TEST_F(OptimTest, StateRoundTripResumesIdentically) {
  // Run A: three steps. Run B: two steps, state saved, a fresh optimizer
  // restored from it, third step. Parameters must agree bit for bit.
  struct Make {
    const char *what;
    int adamw;
  } kinds[] = {{"sgd", 0}, {"adamw", 1}};
  for (const Make &kind : kinds) {
    SCOPED_TRACE(kind.what);
    dt_sgd_config sc = {0.05f, 0.9f, 0.0f, 0.01f, 1};
    dt_adamw_config ac = DT_ADAMW_CONFIG_DEFAULT;
    auto create = [&](dt_optimizer **o) {
      return kind.adamw ? dt_optim_adamw_create(arena_, &ac, o)
                        : dt_optim_sgd_create(arena_, &sc, o);
    };
    // A fresh optimizer from kStart after `steps` steps.
    auto stepped = [&](int steps, dt_optimizer **o) {
      SetParams(kStart);
      DT_CHECK(create(o));
      for (int k = 0; k < steps; k++) {
        SetGrads(StepGrads(k));
        DT_CHECK(dt_optim_step(*o));
      }
      return DT_OK;
    };
    dt_optimizer *a = nullptr;
    ASSERT_DT_OK(stepped(3, &a));
    std::vector<float> want = Params();
    dt_optim_destroy(a);

    dt_optimizer *b = nullptr;
    ASSERT_DT_OK(stepped(2, &b));
    int64_t n = dt_optim_state_numel(b);
    EXPECT_EQ(n, kind.adamw ? 10 : 5);
    std::vector<float> state((size_t)n);
    ASSERT_DT_OK(dt_optim_state_get(b, state.data(), n));
    int64_t steps = dt_optim_step_count(b);
    EXPECT_EQ(steps, 2);
    dt_optim_destroy(b);

    dt_optimizer *c = nullptr;
    ASSERT_DT_OK(create(&c));
    EXPECT_EQ(dt_optim_state_set(c, state.data(), n + 1, steps), DT_ERR_SHAPE);
    EXPECT_NE(std::string(dt_last_error()).find("checkpoint"), std::string::npos);
    EXPECT_EQ(dt_optim_state_set(c, state.data(), n, -1), DT_ERR_INVALID_ARG);
    ASSERT_DT_OK(dt_optim_state_set(c, state.data(), n, steps));
    EXPECT_EQ(dt_optim_step_count(c), 2);
    SetGrads(StepGrads(2));
    ASSERT_DT_OK(dt_optim_step(c));
    EXPECT_EQ(Params(), want);
    dt_optim_destroy(c);
  }

  // Plain SGD has no state.
  dt_sgd_config plain = DT_SGD_CONFIG_DEFAULT;
  ASSERT_DT_OK(dt_optim_sgd_create(arena_, &plain, &opt_));
  EXPECT_EQ(dt_optim_state_numel(opt_), 0);
  ASSERT_DT_OK(dt_optim_state_get(opt_, nullptr, 0));
  ASSERT_DT_OK(dt_optim_state_set(opt_, nullptr, 0, 7));
  EXPECT_EQ(dt_optim_step_count(opt_), 7);
}

TEST_F(OptimTest, ZeroGradAndSetLr) {
  dt_sgd_config c = DT_SGD_CONFIG_DEFAULT;
  ASSERT_DT_OK(dt_optim_sgd_create(arena_, &c, &opt_));
  SetGrads(kHalf);
  ASSERT_DT_OK(dt_optim_zero_grad(opt_));
  for (float g : Grads())
    EXPECT_EQ(g, 0.0f);
  SetParams(kOnes);
  SetGrads(kHalf);
  dt_optim_set_lr(opt_, 0.2f);
  EXPECT_FLOAT_EQ(dt_optim_lr(opt_), 0.2f);
  ASSERT_DT_OK(dt_optim_step(opt_));
  for (float x : Params())
    EXPECT_NEAR(x, 0.9f, 1e-7);
  dt_optim_set_lr(opt_, -1.0f);
  EXPECT_EQ(dt_optim_step(opt_), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("learning rate -1"), std::string::npos);
  dt_optim_set_lr(opt_, NAN);
  EXPECT_EQ(dt_optim_step(opt_), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_optim_step_count(opt_), 1);
  dt_optim_destroy(nullptr);
}

TEST_F(OptimTest, RejectsInvalidHyperParameters) {
  struct SgdBad {
    dt_sgd_config cfg;
    const char *says;
  } sgd_bad[] = {
      {{-0.1f, 0.0f, 0.0f, 0.0f, 0}, "learning rate"},
      {{NAN, 0.0f, 0.0f, 0.0f, 0}, "learning rate"},
      {{0.1f, -0.5f, 0.0f, 0.0f, 0}, "momentum"},
      {{0.1f, 0.0f, 0.0f, -1.0f, 0}, "weight_decay"},
      {{0.1f, 0.0f, 0.0f, 0.0f, 1}, "nesterov"},
      {{0.1f, 0.9f, 0.1f, 0.0f, 1}, "dampening 0"},
  };
  for (const SgdBad &b : sgd_bad) {
    dt_optimizer *o = nullptr;
    EXPECT_EQ(dt_optim_sgd_create(arena_, &b.cfg, &o), DT_ERR_INVALID_ARG) << b.says;
    EXPECT_EQ(o, nullptr);
    EXPECT_NE(std::string(dt_last_error()).find(b.says), std::string::npos) << dt_last_error();
  }
  struct AdamBad {
    dt_adamw_config cfg;
    const char *says;
  } adam_bad[] = {
      {{-1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f}, "learning rate"},
      {{1e-3f, 1.0f, 0.999f, 1e-8f, 0.0f}, "beta1"},
      {{1e-3f, 0.9f, -0.1f, 1e-8f, 0.0f}, "beta2"},
      {{1e-3f, 0.9f, 0.999f, -1e-8f, 0.0f}, "eps"},
      {{1e-3f, 0.9f, 0.999f, 1e-8f, -0.1f}, "weight_decay"},
  };
  for (const AdamBad &b : adam_bad) {
    dt_optimizer *o = nullptr;
    EXPECT_EQ(dt_optim_adamw_create(arena_, &b.cfg, &o), DT_ERR_INVALID_ARG) << b.says;
    EXPECT_NE(std::string(dt_last_error()).find(b.says), std::string::npos) << dt_last_error();
  }
  dt_sgd_config ok = DT_SGD_CONFIG_DEFAULT;
  dt_optimizer *o = nullptr;
  EXPECT_EQ(dt_optim_sgd_create(nullptr, &ok, &o), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_optim_sgd_create(arena_, nullptr, &o), DT_ERR_INVALID_ARG);
}

// ---- LR schedules ----

TEST(LrSchedule, LinearWarmupThenConstant) {
  dt_lr_schedule s = DT_LR_SCHEDULE_DEFAULT;
  s.base_lr = 0.1f;
  s.warmup_steps = 4;
  ASSERT_DT_OK(dt_lr_schedule_check(&s));
  EXPECT_FLOAT_EQ(dt_lr_at(&s, 0), 0.025f);
  EXPECT_FLOAT_EQ(dt_lr_at(&s, 1), 0.05f);
  EXPECT_FLOAT_EQ(dt_lr_at(&s, 2), 0.075f);
  EXPECT_FLOAT_EQ(dt_lr_at(&s, 3), 0.1f);
  EXPECT_FLOAT_EQ(dt_lr_at(&s, 4), 0.1f);
  EXPECT_FLOAT_EQ(dt_lr_at(&s, 1000), 0.1f);
  s.warmup_steps = 0;
  EXPECT_FLOAT_EQ(dt_lr_at(&s, 0), 0.1f);
}

TEST(LrSchedule, CosineEndpointsAndMidpoint) {
  dt_lr_schedule s = DT_LR_SCHEDULE_DEFAULT;
  s.base_lr = 1.0f;
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.decay = DT_LR_DECAY_COSINE;
  s.min_lr = 0.1f;
  ASSERT_DT_OK(dt_lr_schedule_check(&s));
  EXPECT_FLOAT_EQ(dt_lr_at(&s, 0), 0.1f);    // warm-up: 1 * 1/10
  EXPECT_FLOAT_EQ(dt_lr_at(&s, 9), 1.0f);    // warm-up ends at base
  EXPECT_FLOAT_EQ(dt_lr_at(&s, 10), 1.0f);   // cosine starts at base
  EXPECT_FLOAT_EQ(dt_lr_at(&s, 60), 0.55f);  // midpoint: (base + min) / 2
  // 0.1 + 0.9 * (1 + cos(pi * 99/100)) / 2
  EXPECT_NEAR(dt_lr_at(&s, 109), 0.10022204783542078, 1e-7);
  EXPECT_FLOAT_EQ(dt_lr_at(&s, 110), 0.1f);  // end: min_lr
  EXPECT_FLOAT_EQ(dt_lr_at(&s, 500), 0.1f);
  // Monotone non-increasing after warm-up.
  for (int64_t t = 10; t < 115; t++)
    EXPECT_LE(dt_lr_at(&s, t + 1), dt_lr_at(&s, t)) << t;

  s.warmup_steps = 0;
  s.total_steps = 100;
  s.min_lr = 0.0f;
  EXPECT_FLOAT_EQ(dt_lr_at(&s, 0), 1.0f);
  EXPECT_FLOAT_EQ(dt_lr_at(&s, 50), 0.5f);
  EXPECT_NEAR(dt_lr_at(&s, 25), 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-7);
}

TEST(LrSchedule, StepDecay) {
  dt_lr_schedule s = DT_LR_SCHEDULE_DEFAULT;
  s.base_lr = 1.0f;
  s.decay = DT_LR_DECAY_STEP;
  s.step_size = 3;
  s.gamma = 0.5f;
  ASSERT_DT_OK(dt_lr_schedule_check(&s));
  const float want[] = {1, 1, 1, 0.5f, 0.5f, 0.5f, 0.25f, 0.25f, 0.25f, 0.125f};
  for (int t = 0; t < 10; t++)
    EXPECT_FLOAT_EQ(dt_lr_at(&s, t), want[t]) << t;
  s.warmup_steps = 2;  // decay counts from the end of warm-up
  EXPECT_FLOAT_EQ(dt_lr_at(&s, 0), 0.5f);
  EXPECT_FLOAT_EQ(dt_lr_at(&s, 1), 1.0f);
  EXPECT_FLOAT_EQ(dt_lr_at(&s, 4), 1.0f);
  EXPECT_FLOAT_EQ(dt_lr_at(&s, 5), 0.5f);
}

TEST(LrSchedule, CheckRejectsWhatCannotBeHonoured) {
  dt_lr_schedule s = DT_LR_SCHEDULE_DEFAULT;
  ASSERT_DT_OK(dt_lr_schedule_check(&s));
  s.base_lr = -1.0f;
  EXPECT_EQ(dt_lr_schedule_check(&s), DT_ERR_INVALID_ARG);
  s = DT_LR_SCHEDULE_DEFAULT;
  s.warmup_steps = -1;
  EXPECT_EQ(dt_lr_schedule_check(&s), DT_ERR_INVALID_ARG);
  s = DT_LR_SCHEDULE_DEFAULT;
  s.decay = DT_LR_DECAY_COSINE;
  s.warmup_steps = 10;
  s.total_steps = 10;
  EXPECT_EQ(dt_lr_schedule_check(&s), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("total_steps"), std::string::npos);
  s.total_steps = 20;
  s.min_lr = 1.0f;  // above base 0.01
  EXPECT_EQ(dt_lr_schedule_check(&s), DT_ERR_INVALID_ARG);
  s = DT_LR_SCHEDULE_DEFAULT;
  s.decay = DT_LR_DECAY_STEP;
  s.step_size = 0;
  EXPECT_EQ(dt_lr_schedule_check(&s), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("step_size"), std::string::npos);
  s.step_size = 1;
  s.gamma = 0.0f;
  EXPECT_EQ(dt_lr_schedule_check(&s), DT_ERR_INVALID_ARG);
}

// ---- clipping ----

TEST_F(OptimTest, ClipGradNorm) {
  // Norm of (3, 0, 0, 0, 4) is 5.
  const std::vector<float> g = {3.0f, 0.0f, 0.0f, 0.0f, 4.0f};
  SetGrads(g);
  double norm = -1;
  ASSERT_DT_OK(dt_clip_grad_norm(arena_, 10.0f, &norm));
  EXPECT_NEAR(norm, 5.0, 1e-9);
  EXPECT_EQ(Grads(), g);  // below max_norm: untouched, bit for bit

  ASSERT_DT_OK(dt_clip_grad_norm(arena_, 1.0f, &norm));
  EXPECT_NEAR(norm, 5.0, 1e-9);
  std::vector<float> got = Grads();
  const double coef = 1.0 / (5.0 + 1e-6);
  for (int i = 0; i < 5; i++)
    EXPECT_NEAR(got[i], g[i] * coef, 1e-7) << i;
  ASSERT_DT_OK(dt_clip_grad_norm(arena_, 100.0f, &norm));
  EXPECT_NEAR(norm, 1.0, 1e-6);  // now at max_norm

  SetGrads(g);
  ASSERT_DT_OK(dt_clip_grad_norm(arena_, 2.5f, nullptr));
  got = Grads();
  EXPECT_NEAR(got[0], 3.0 * 2.5 / (5.0 + 1e-6), 1e-6);
  EXPECT_NEAR(got[4], 4.0 * 2.5 / (5.0 + 1e-6), 1e-6);

  EXPECT_EQ(dt_clip_grad_norm(arena_, 0.0f, &norm), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_clip_grad_norm(arena_, -1.0f, &norm), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("max_norm"), std::string::npos);
  EXPECT_EQ(dt_clip_grad_norm(nullptr, 1.0f, &norm), DT_ERR_INVALID_ARG);
}

}  // namespace

namespace {

// A shard's hooks: the calls they saw, and a stand-in for the other
// shards' sum of squares.
struct ShardLog {
  std::vector<int> updated;
  int done = 0;
  double others_sum_sq = 0;
};
dt_status LogSum(void *ctx, double *values, int n) {
  EXPECT_EQ(n, 1);
  values[0] += static_cast<ShardLog *>(ctx)->others_sum_sq;
  return DT_OK;
}
dt_status LogUpdated(void *ctx, int segment) {
  static_cast<ShardLog *>(ctx)->updated.push_back(segment);
  return DT_OK;
}
dt_status LogDone(void *ctx, dt_status st) {
  static_cast<ShardLog *>(ctx)->done++;
  return st;
}

// Segments {1, 2 at local 0} and {4, 1 at local 3}: local element 2 is
// padding. Only arena elements 1, 2 and 4 move, with the shard's own
// gradients; the hooks see every segment in order, then the end.
TEST_F(OptimTest, ShardUpdatesOnlyItsSegmentsWithItsGradients) {
  dt_sgd_config c = DT_SGD_CONFIG_DEFAULT;
  c.lr = 0.5f;
  c.momentum = 0.9f;
  ASSERT_DT_OK(dt_optim_sgd_create(arena_, &c, &opt_));
  EXPECT_EQ(dt_optim_state_tensor(opt_, 0), nullptr) << "state is allocated at the first step";
  EXPECT_EQ(dt_optim_state_bytes(opt_), 5 * sizeof(float));
  const dt_optim_segment segs[2] = {{1, 2, 0}, {4, 1, 3}};
  dt_tensor *g = dtt::MakeTensor({2.0f, 4.0f, 0.0f, 6.0f}, {4});
  ShardLog log;
  log.others_sum_sq = 56.0;  // 4 + 16 + 36 here: norm sqrt(112)
  dt_optim_shard sh = {segs, 2, 4, g, &log, LogSum, LogUpdated, LogDone};
  ASSERT_DT_OK(dt_optim_set_shard(opt_, &sh));
  EXPECT_TRUE(dt_optim_is_sharded(opt_));
  EXPECT_EQ(dt_optim_num_segments(opt_), 2);
  EXPECT_EQ(dt_optim_segment_at(opt_, 1).offset, 4);
  EXPECT_EQ(dt_optim_state_numel(opt_), 4);
  SetParams({1, 1, 1, 1, 1});
  SetGrads({100, 100, 100, 100, 100});  // the arena's: not what a shard reads
  ASSERT_DT_OK(dt_optim_step(opt_));
  EXPECT_EQ(Params(), (std::vector<float>{1, 0, -1, 1, -2}));
  EXPECT_EQ(log.updated, (std::vector<int>{0, 1}));
  EXPECT_EQ(log.done, 1);
  ASSERT_NE(dt_optim_state_tensor(opt_, 0), nullptr);
  std::vector<float> state(4);
  ASSERT_DT_OK(dt_optim_state_get(opt_, state.data(), 4));
  EXPECT_EQ(state, (std::vector<float>{2, 4, 0, 6}));  // first step: momentum = gradient

  // Clipping reads the shard and adds the other shards' sum of squares.
  double norm = 0;
  ASSERT_DT_OK(dt_optim_clip_grad_norm(opt_, 1.0f, &norm));
  EXPECT_NEAR(norm, std::sqrt(112.0), 1e-9);
  std::vector<float> clipped = dtt::ToVector(g);
  EXPECT_NEAR(clipped[1], 4.0 / (std::sqrt(112.0) + 1e-6), 1e-6);

  // Sharding comes before the first step; bad shards are refused.
  EXPECT_EQ(dt_optim_set_shard(opt_, &sh), DT_ERR_STATE);
  dt_optimizer *fresh = nullptr;
  ASSERT_DT_OK(dt_optim_sgd_create(arena_, &c, &fresh));
  const dt_optim_segment outside[1] = {{4, 2, 0}};
  dt_optim_shard bad = {outside, 1, 4, g, nullptr, nullptr, nullptr, nullptr};
  EXPECT_EQ(dt_optim_set_shard(fresh, &bad), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("outside"), std::string::npos) << dt_last_error();
  bad.segments = segs;
  bad.n_segments = 2;
  bad.local_numel = 5;  // the gradients hold 4
  EXPECT_EQ(dt_optim_set_shard(fresh, &bad), DT_ERR_INVALID_ARG);
  dt_optim_destroy(fresh);
  dt_tensor_release(g);
}

}  // namespace

// ---- a step in pieces (the DDP reducer's update per bucket) ----
namespace {

// Parameters of 3000, 7, 4100 and 1 elements (more than the kernels'
// blocks of 2048) with values from `seed`.
struct PieceArena {
  dt_module *m = nullptr;
  dt_param_arena *arena = nullptr;
  explicit PieceArena(uint64_t seed) {
    EXPECT_EQ(dt_module_create(&kParamsOnly, nullptr, &m), DT_OK);
    const int64_t sizes[4] = {3000, 7, 4100, 1};
    const char *names[4] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++) {
      dt_tensor *t = nullptr;
      EXPECT_EQ(dt_tensor_zeros(&sizes[i], 1, DT_DTYPE_F32, DT_CPU, &t), DT_OK);
      EXPECT_EQ(dt_module_register_parameter(m, names[i], t), DT_OK);
      dt_tensor_release(t);
    }
    EXPECT_EQ(dt_param_arena_create(m, &arena), DT_OK);
    std::vector<float> p(static_cast<size_t>(dt_param_arena_numel(arena)));
    for (size_t i = 0; i < p.size(); i++)
      p[i] = 2.0f * dt_rng_uniform(seed, i) - 1.0f;
    EXPECT_EQ(dtt::CopyFromHost(dt_param_arena_data(arena), p), DT_OK);
  }
  ~PieceArena() {
    dt_param_arena_destroy(arena);
    dt_module_destroy(m);
  }
  void SetGrads(uint64_t seed) {
    std::vector<float> g(static_cast<size_t>(dt_param_arena_numel(arena)));
    for (size_t i = 0; i < g.size(); i++)
      g[i] = 0.1f * (2.0f * dt_rng_uniform(seed + 1000, i) - 1.0f);
    EXPECT_EQ(dtt::CopyFromHost(dt_param_arena_grads(arena), g), DT_OK);
  }
};

struct PieceCase {
  const char *what;
  int adamw;  // else SGD
  dt_sgd_config sgd;
  bool decay_matrices_only;  // here: the decay mask {1, 0, 1, 0}
  dt_dtype working;          // f32 = no working copy
  bool stochastic;
};

// Ranges over the 7108 elements in an order that is neither ascending nor
// along parameter boundaries, cutting kernel blocks and parameters.
const std::vector<std::pair<int64_t, int64_t>> kPieces = {
    {6107, 1001}, {3007, 3100}, {0, 1}, {2999, 8}, {1, 2998}};

TEST(OptimPieces, StepInPiecesEqualsOneStepBitForBit) {
  const PieceCase cases[] = {
      {"sgd momentum", 0, {0.05f, 0.9f, 0.0f, 0.0f, 0}, false, DT_DTYPE_F32, false},
      {"sgd nesterov decay", 0, {0.05f, 0.9f, 0.0f, 0.01f, 1}, true, DT_DTYPE_F32, false},
      {"sgd plain bf16", 0, {0.1f, 0.0f, 0.0f, 0.0f, 0}, false, DT_DTYPE_BF16, false},
      {"sgd dampening f16", 0, {0.05f, 0.8f, 0.1f, 0.001f, 0}, false, DT_DTYPE_F16, false},
      {"adamw", 1, {}, true, DT_DTYPE_F32, false},
      {"adamw bf16 stochastic", 1, {}, false, DT_DTYPE_BF16, true},
  };
  for (const PieceCase &c : cases) {
    SCOPED_TRACE(c.what);
    PieceArena whole(7), pieces(7);
    dt_optimizer *ow = nullptr, *op = nullptr;
    for (auto [pa, o] : {std::pair{&whole, &ow}, std::pair{&pieces, &op}}) {
      dt_adamw_config ac = DT_ADAMW_CONFIG_DEFAULT;
      ASSERT_DT_OK(c.adamw ? dt_optim_adamw_create(pa->arena, &ac, o)
                           : dt_optim_sgd_create(pa->arena, &c.sgd, o));
      const uint8_t mask[4] = {1, 0, 1, 0};
      if (c.decay_matrices_only)
        ASSERT_DT_OK(dt_optim_set_decay_mask(*o, mask, 4));
      const dt_working_copy_config wc = {c.working, c.stochastic, 99};
      if (c.working != DT_DTYPE_F32)
        ASSERT_DT_OK(dt_optim_use_working_copy(*o, &wc));
    }
    for (int step = 0; step < 3; step++) {  // the first step is special for momentum
      whole.SetGrads(step);
      pieces.SetGrads(step);
      ASSERT_DT_OK(dt_optim_step(ow));
      ASSERT_DT_OK(dt_optim_step_begin(op));
      EXPECT_TRUE(dt_optim_step_begun(op));
      for (auto [off, n] : kPieces)
        ASSERT_DT_OK(dt_optim_step_range(op, off, n));
      ASSERT_DT_OK(dt_optim_step_end(op, DT_OK));
      EXPECT_FALSE(dt_optim_step_begun(op));
      EXPECT_EQ(dt_optim_step_count(op), step + 1);
      EXPECT_EQ(dtt::ToVector(dt_param_arena_data(pieces.arena)),
                dtt::ToVector(dt_param_arena_data(whole.arena)))
          << "step " << step;
    }
    int64_t n = dt_optim_state_numel(ow);
    std::vector<float> sw((size_t)n), sp((size_t)n);
    ASSERT_DT_OK(dt_optim_state_get(ow, sw.data(), n));
    ASSERT_DT_OK(dt_optim_state_get(op, sp.data(), n));
    EXPECT_EQ(sp, sw);
    if (c.working != DT_DTYPE_F32) {
      EXPECT_TRUE(dt_optim_working_copy_is_fresh(op));
      dt_tensor *hw = dt_optim_working_copy(ow), *hp = dt_optim_working_copy(op);
      std::vector<uint16_t> bw((size_t)dt_tensor_numel(hw)), bp(bw.size());
      ASSERT_DT_OK(dt_tensor_to_host(hw, bw.data(), bw.size() * 2));
      ASSERT_DT_OK(dt_tensor_to_host(hp, bp.data(), bp.size() * 2));
      EXPECT_EQ(bp, bw);
    }
    dt_optim_destroy(ow);
    dt_optim_destroy(op);
  }
}

// Misuse is an error, and an abandoned step leaves the count alone and
// the working copy stale (rebuilt from the masters at its next use).
TEST(OptimPieces, MisuseIsAnErrorAndAnAbandonedStepDoesNotCount) {
  PieceArena pa(3);
  dt_sgd_config c = {0.05f, 0.9f, 0.0f, 0.0f, 0};
  dt_optimizer *o = nullptr;
  ASSERT_DT_OK(dt_optim_sgd_create(pa.arena, &c, &o));
  const dt_working_copy_config wc = {DT_DTYPE_BF16, false, 0};
  ASSERT_DT_OK(dt_optim_use_working_copy(o, &wc));
  pa.SetGrads(0);
  EXPECT_EQ(dt_optim_step_range(o, 0, 1), DT_ERR_STATE);
  EXPECT_EQ(dt_optim_step_end(o, DT_OK), DT_ERR_STATE);
  ASSERT_DT_OK(dt_optim_step_begin(o));
  EXPECT_EQ(dt_optim_step_begin(o), DT_ERR_STATE);
  EXPECT_EQ(dt_optim_step(o), DT_ERR_STATE);
  EXPECT_EQ(dt_optim_step_range(o, 8100, 9), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_optim_step_range(o, -1, 2), DT_ERR_INVALID_ARG);
  ASSERT_DT_OK(dt_optim_step_range(o, 0, 7000));
  EXPECT_EQ(dt_optim_step_range(o, 0, 200), DT_ERR_INVALID_ARG);  // more than the arena in all
  EXPECT_EQ(dt_optim_step_end(o, DT_OK), DT_ERR_STATE);           // 108 elements missing
  EXPECT_NE(std::string(dt_last_error()).find("7000 of the arena's 7108"), std::string::npos)
      << dt_last_error();
  EXPECT_EQ(dt_optim_step_count(o), 0);
  EXPECT_FALSE(dt_optim_working_copy_is_fresh(o));
  ASSERT_DT_OK(dt_optim_step_begin(o));
  EXPECT_EQ(dt_optim_step_end(o, DT_ERR_MPI), DT_ERR_MPI);
  EXPECT_EQ(dt_optim_step_count(o), 0);
  dt_optim_destroy(o);
}

}  // namespace
