// Modules: hooks, registration and enumeration, train/eval, initialisation,
// BatchNorm and Dropout behaviour, device moves.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

extern "C" {
#include "core/module.h"
#include "core/nn.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "core/tensor_internal.h"
#include "models/models.h"
}
#include "tests/test_util.h"

namespace {

using dtt::MakeTensor;
using dtt::Ramp;
using dtt::ToVector;

int refcount(const dt_tensor *t) { return __atomic_load_n(&t->refcount, __ATOMIC_RELAXED); }

// ---- an identity module with a log, for the hook tests ----

struct Log {
  std::vector<std::string> events;
};

dt_status identity_forward(dt_module *m, dt_tensor *x, dt_tensor **y) {
  Log *log = (Log *)dt_module_impl(m);
  if (log)
    log->events.push_back("forward");
  *y = dt_tensor_retain(x);
  return DT_OK;
}

const dt_module_vtable identity_vtable = {"Identity", identity_forward, nullptr};

struct HookCtx {
  Log *log;
  std::string name;
  dt_tensor *replacement;  // handed over (a new reference is made per call)
  dt_status fail;
};

// What both kinds of hook do: log the name, hand over the replacement,
// return the status the test asked for.
dt_status log_hook(HookCtx *c, dt_tensor **repl) {
  c->log->events.push_back(c->name);
  if (c->replacement)
    *repl = dt_tensor_retain(c->replacement);
  return c->fail;
}

dt_status pre_hook(dt_module *, dt_tensor *, dt_tensor **repl, void *user) {
  return log_hook(static_cast<HookCtx *>(user), repl);
}

dt_status post_hook(dt_module *, dt_tensor *, dt_tensor *, dt_tensor **repl, void *user) {
  return log_hook(static_cast<HookCtx *>(user), repl);
}

// An Identity module whose forward logs to `log`, destroyed after the test.
class ModuleHooks : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_DT_OK(dt_module_create(&identity_vtable, &log, &m)); }
  void TearDown() override { dt_module_destroy(m); }
  Log log;
  dt_module *m = nullptr;
};

TEST_F(ModuleHooks, RunInRegistrationOrderAroundForward) {
  HookCtx pre1{&log, "pre1", nullptr, DT_OK}, pre2{&log, "pre2", nullptr, DT_OK};
  HookCtx post1{&log, "post1", nullptr, DT_OK}, post2{&log, "post2", nullptr, DT_OK};
  dt_hook_handle h[4];
  ASSERT_DT_OK(dt_module_register_forward_hook(m, post_hook, &post1, &h[0]));
  ASSERT_DT_OK(dt_module_register_forward_pre_hook(m, pre_hook, &pre1, &h[1]));
  ASSERT_DT_OK(dt_module_register_forward_pre_hook(m, pre_hook, &pre2, &h[2]));
  ASSERT_DT_OK(dt_module_register_forward_hook(m, post_hook, &post2, &h[3]));
  for (int i = 0; i < 4; i++)
    for (int j = i + 1; j < 4; j++)
      EXPECT_NE(h[i], h[j]);

  dt_tensor *x = MakeTensor({1, 2, 3}, {3});
  dt_tensor *y = nullptr;
  ASSERT_DT_OK(dt_module_call(m, x, &y));
  EXPECT_EQ(log.events, (std::vector<std::string>{"pre1", "pre2", "forward", "post1", "post2"}));
  EXPECT_EQ(y, x);
  dt_tensor_release(y);
  EXPECT_EQ(refcount(x), 1);

  // Removal by handle; the others keep their order.
  ASSERT_DT_OK(dt_module_remove_hook(m, h[1]));
  ASSERT_DT_OK(dt_module_remove_hook(m, h[3]));
  log.events.clear();
  ASSERT_DT_OK(dt_module_call(m, x, &y));
  EXPECT_EQ(log.events, (std::vector<std::string>{"pre2", "forward", "post1"}));
  dt_tensor_release(y);

  // Unknown handles: already removed, never issued, 0.
  EXPECT_EQ(dt_module_remove_hook(m, h[1]), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("no forward or pre-hook"), std::string::npos);
  EXPECT_EQ(dt_module_remove_hook(m, 0), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_module_remove_hook(m, 1 << 30), DT_ERR_INVALID_ARG);

  dt_tensor_release(x);
}

TEST_F(ModuleHooks, HandlesAreUniqueAcrossModules) {
  dt_module *a = nullptr, *b = nullptr;
  ASSERT_DT_OK(dt_module_create(&identity_vtable, &log, &a));
  ASSERT_DT_OK(dt_module_create(&identity_vtable, &log, &b));
  HookCtx c{&log, "x", nullptr, DT_OK};
  dt_hook_handle ha, hb;
  ASSERT_DT_OK(dt_module_register_forward_pre_hook(a, pre_hook, &c, &ha));
  ASSERT_DT_OK(dt_module_register_forward_pre_hook(b, pre_hook, &c, &hb));
  EXPECT_GT(ha, 0);
  EXPECT_NE(ha, hb);
  // A's handle cannot remove B's hook.
  EXPECT_EQ(dt_module_remove_hook(b, ha), DT_ERR_INVALID_ARG);
  ASSERT_DT_OK(dt_module_remove_hook(a, ha));
  ASSERT_DT_OK(dt_module_remove_hook(b, hb));
  dt_module_destroy(a);
  dt_module_destroy(b);
}

// Module hooks and grad-ready hooks draw from one process-wide sequence, so
// a handle names exactly one hook of any kind (module.h).
TEST_F(ModuleHooks, HandlesAreSharedWithGradReadyHooks) {
  dt_tensor *leaf = MakeTensor({1, 2}, {2}, true);
  HookCtx c{&log, "x", nullptr, DT_OK};
  dt_hook_handle g1, h, g2;
  ASSERT_DT_OK(dt_tensor_add_grad_ready_hook(
      leaf, [](dt_tensor *, void *) {}, nullptr, &g1));
  ASSERT_DT_OK(dt_module_register_forward_pre_hook(m, pre_hook, &c, &h));
  ASSERT_DT_OK(dt_tensor_add_grad_ready_hook(
      leaf, [](dt_tensor *, void *) {}, nullptr, &g2));
  EXPECT_LT(g1, h);
  EXPECT_LT(h, g2);
  dt_tensor_release(leaf);
}

TEST_F(ModuleHooks, PreHookReplacesInputWithoutLeaks) {
  dt_tensor *x = MakeTensor({1, 2}, {2});
  dt_tensor *r1 = MakeTensor({3, 4}, {2});
  dt_tensor *r2 = MakeTensor({5, 6}, {2});
  HookCtx a{&log, "a", r1, DT_OK}, b{&log, "b", r2, DT_OK};
  ASSERT_DT_OK(dt_module_register_forward_pre_hook(m, pre_hook, &a, nullptr));
  ASSERT_DT_OK(dt_module_register_forward_pre_hook(m, pre_hook, &b, nullptr));
  dt_tensor *y = nullptr;
  ASSERT_DT_OK(dt_module_call(m, x, &y));
  EXPECT_EQ(y, r2);  // the last replacement reaches forward
  EXPECT_EQ(ToVector(y), (std::vector<float>{5, 6}));
  EXPECT_EQ(refcount(x), 1);   // caller's reference only
  EXPECT_EQ(refcount(r1), 1);  // intermediate replacement released
  EXPECT_EQ(refcount(r2), 2);  // ours + the output
  dt_tensor_release(y);
  EXPECT_EQ(refcount(r2), 1);
  dt_tensor_release(x);
  dt_tensor_release(r1);
  dt_tensor_release(r2);
}

TEST_F(ModuleHooks, ForwardHookReplacesOutputWithoutLeaks) {
  dt_tensor *x = MakeTensor({1, 2}, {2});
  dt_tensor *r = MakeTensor({7, 8}, {2});
  HookCtx a{&log, "a", r, DT_OK};
  ASSERT_DT_OK(dt_module_register_forward_hook(m, post_hook, &a, nullptr));
  dt_tensor *y = nullptr;
  ASSERT_DT_OK(dt_module_call(m, x, &y));
  EXPECT_EQ(y, r);
  EXPECT_EQ(ToVector(y), (std::vector<float>{7, 8}));
  EXPECT_EQ(refcount(x), 1);  // forward's output (x itself) was released
  EXPECT_EQ(refcount(r), 2);
  dt_tensor_release(y);
  dt_tensor_release(x);
  EXPECT_EQ(refcount(r), 1);
  dt_tensor_release(r);
}

TEST_F(ModuleHooks, FailingHookAbortsTheCallWithoutLeaks) {
  dt_tensor *x = MakeTensor({1}, {1});
  dt_tensor *r = MakeTensor({2}, {1});
  HookCtx bad{&log, "bad", r, DT_ERR_SHAPE};
  dt_hook_handle h;
  ASSERT_DT_OK(dt_module_register_forward_hook(m, post_hook, &bad, &h));
  dt_tensor *y = x;  // must be reset to NULL
  EXPECT_EQ(dt_module_call(m, x, &y), DT_ERR_SHAPE);
  EXPECT_EQ(y, nullptr);
  EXPECT_EQ(refcount(x), 1);
  EXPECT_EQ(refcount(r), 1);
  ASSERT_DT_OK(dt_module_remove_hook(m, h));

  ASSERT_DT_OK(dt_module_register_forward_pre_hook(m, pre_hook, &bad, &h));
  log.events.clear();
  EXPECT_EQ(dt_module_call(m, x, &y), DT_ERR_SHAPE);
  EXPECT_EQ(log.events, (std::vector<std::string>{"bad"}));  // forward never ran
  EXPECT_EQ(refcount(x), 1);
  EXPECT_EQ(refcount(r), 1);
  dt_tensor_release(x);
  dt_tensor_release(r);
}

// ---- registration and enumeration ----

// The names of a module's parameters or buffers (count, at), in order.
std::vector<std::string> tensor_names(const dt_module *m, int (*count)(const dt_module *),
                                      dt_tensor *(*at)(const dt_module *, int, const char **)) {
  std::vector<std::string> names;
  for (int i = 0; i < count(m); i++) {
    const char *n = nullptr;
    EXPECT_NE(at(m, i, &n), nullptr);
    names.push_back(n);
  }
  return names;
}

std::vector<std::string> param_names(const dt_module *m) {
  return tensor_names(m, dt_module_num_parameters, dt_module_parameter_at);
}

std::vector<std::string> buffer_names(const dt_module *m) {
  return tensor_names(m, dt_module_num_buffers, dt_module_buffer_at);
}

TEST(ModuleRegistry, DuplicateNamesAreRejected) {
  dt_module *m = nullptr, *child = nullptr;
  ASSERT_DT_OK(dt_module_create(&identity_vtable, nullptr, &m));
  ASSERT_DT_OK(dt_module_create(&identity_vtable, nullptr, &child));
  dt_tensor *t = MakeTensor({1, 2}, {2});
  ASSERT_DT_OK(dt_module_register_parameter(m, "w", t));
  EXPECT_TRUE(dt_tensor_requires_grad(t));
  EXPECT_EQ(dt_module_register_parameter(m, "w", t), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("\"w\""), std::string::npos);
  EXPECT_EQ(dt_module_register_buffer(m, "w", t), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_module_add_child(m, "w", child), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_module_register_parameter(m, "a.b", t), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_module_register_parameter(m, "", t), DT_ERR_INVALID_ARG);
  ASSERT_DT_OK(dt_module_add_child(m, "c", child));
  EXPECT_EQ(dt_module_register_buffer(m, "c", t), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_module_add_child(m, "d", child), DT_ERR_INVALID_ARG);  // already has a parent
  EXPECT_EQ(dt_module_num_parameters(m), 1);
  EXPECT_EQ(refcount(t), 2);  // failed registrations took no reference
  dt_tensor_release(t);
  dt_module_destroy(m);  // frees the child too
}

TEST(ModuleRegistry, NestedSequentialNamesAreDepthFirst) {
  dt_generator gen;
  dt_generator_init(&gen, 1);
  dt_module *inner[2] = {nullptr, nullptr}, *outer[3] = {nullptr, nullptr, nullptr};
  ASSERT_DT_OK(dt_nn_linear(3, 4, 1, &gen, &inner[0]));
  ASSERT_DT_OK(dt_nn_batch_norm2d(4, 1e-5f, 0.1f, &inner[1]));
  ASSERT_DT_OK(dt_nn_linear(2, 3, 1, &gen, &outer[0]));
  ASSERT_DT_OK(dt_nn_sequential(inner, 2, &outer[1]));
  ASSERT_DT_OK(dt_nn_linear(4, 1, 0, &gen, &outer[2]));
  dt_module *seq = nullptr;
  ASSERT_DT_OK(dt_nn_sequential(outer, 3, &seq));
  EXPECT_EQ(param_names(seq),
            (std::vector<std::string>{"0.weight", "0.bias", "1.0.weight", "1.0.bias", "1.1.weight",
                                      "1.1.bias", "2.weight"}));
  EXPECT_EQ(buffer_names(seq), (std::vector<std::string>{"1.1.running_mean", "1.1.running_var",
                                                         "1.1.num_batches_tracked"}));
  EXPECT_EQ(dt_module_parameter_count(seq), 2 * 3 + 3 + 3 * 4 + 4 + 4 + 4 + 4);
  EXPECT_EQ(dt_module_num_children(seq), 3);
  EXPECT_STREQ(dt_module_type_name(dt_module_child(seq, "1")), "Sequential");
  EXPECT_EQ(dt_module_child_at(seq, 3), nullptr);
  EXPECT_EQ(dt_module_parameter_at(seq, 7, nullptr), nullptr);
  dt_tensor *w = dt_module_parameter(dt_module_child(dt_module_child(seq, "1"), "0"), "weight");
  EXPECT_EQ(dt_module_parameter_at(seq, 2, nullptr), w);
  EXPECT_EQ(dt_tensor_dim(w, 0), 4);
  EXPECT_EQ(dt_tensor_dim(w, 1), 3);

  // Own parameters come before children's, whatever the registration order,
  // and the cached list follows later registrations (here on a child).
  dt_tensor *extra = MakeTensor({0}, {1});
  ASSERT_DT_OK(dt_module_register_parameter(seq, "scale", extra));
  ASSERT_DT_OK(dt_module_register_parameter(dt_module_child(seq, "1"), "gain", extra));
  dt_tensor *other = MakeTensor({0}, {1});
  ASSERT_DT_OK(dt_module_register_parameter(dt_module_child(seq, "1"), "shift", other));
  EXPECT_EQ(param_names(seq),
            (std::vector<std::string>{"scale", "0.weight", "0.bias", "1.shift", "1.0.weight",
                                      "1.0.bias", "1.1.weight", "1.1.bias", "2.weight"}))
      << "a tensor registered twice (tied weights) is listed once, under its first name";
  dt_tensor_release(extra);
  dt_tensor_release(other);
  dt_module_destroy(seq);
}

// Appending a module that already belongs to a container (or the container
// itself) is refused without destroying it: the owner still holds it.
TEST(ModuleRegistry, SequentialAppendOfOwnedModuleIsRefusedSafely) {
  dt_module *relu = nullptr, *seq = nullptr, *other = nullptr;
  ASSERT_DT_OK(dt_nn_relu(&relu));
  ASSERT_DT_OK(dt_nn_sequential(&relu, 1, &seq));
  EXPECT_EQ(dt_nn_sequential_append(seq, relu), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_nn_sequential_append(seq, seq), DT_ERR_INVALID_ARG);
  ASSERT_DT_OK(dt_nn_sequential(nullptr, 0, &other));
  EXPECT_EQ(dt_nn_sequential_append(other, relu), DT_ERR_INVALID_ARG);
  dt_module *outer = nullptr;
  ASSERT_DT_OK(dt_nn_sequential(&other, 1, &outer));
  EXPECT_EQ(dt_nn_sequential_append(other, outer), DT_ERR_INVALID_ARG);  // a cycle
  EXPECT_EQ(dt_module_parent(other), outer);
  EXPECT_EQ(dt_module_num_children(seq), 1);
  EXPECT_EQ(dt_module_child_at(seq, 0), relu);
  dt_tensor *x = MakeTensor({-1, 2}, {2}), *y = nullptr;
  ASSERT_DT_OK(dt_module_call(seq, x, &y));  // seq and relu are intact
  EXPECT_EQ(ToVector(y), (std::vector<float>{0, 2}));
  dt_tensor_release(y);
  dt_tensor_release(x);
  dt_module_destroy(outer);  // owns other
  dt_module_destroy(seq);
}

TEST(ModuleRegistry, LeNetParameterNames) {
  dt_module *m = nullptr;
  ASSERT_DT_OK(dt_model_lenet5(10, 0, &m));
  EXPECT_EQ(param_names(m),
            (std::vector<std::string>{"features.0.weight", "features.0.bias", "features.3.weight",
                                      "features.3.bias", "classifier.1.weight", "classifier.1.bias",
                                      "classifier.3.weight", "classifier.3.bias",
                                      "classifier.5.weight", "classifier.5.bias"}));
  EXPECT_EQ(dt_module_num_buffers(m), 0);
  dt_module_destroy(m);
}

TEST(ModuleRegistry, TrainEvalPropagates) {
  dt_module *m = nullptr;
  ASSERT_DT_OK(dt_model_lenet5(10, 0, &m));
  dt_module *features = dt_module_child(m, "features");
  dt_module *relu = dt_module_child(features, "1");
  EXPECT_TRUE(dt_module_is_training(m));
  EXPECT_TRUE(dt_module_is_training(relu));
  dt_module_train(m, 0);
  EXPECT_FALSE(dt_module_is_training(m));
  EXPECT_FALSE(dt_module_is_training(features));
  EXPECT_FALSE(dt_module_is_training(relu));
  dt_module_train(features, 1);
  EXPECT_FALSE(dt_module_is_training(m));
  EXPECT_TRUE(dt_module_is_training(relu));
  EXPECT_FALSE(dt_module_is_training(dt_module_child(m, "classifier")));
  dt_module_destroy(m);
}

// ---- initialisation ----

TEST(ModuleInit, LinearIsUniformWithinOneOverSqrtFanIn) {
  dt_generator gen;
  dt_generator_init(&gen, 42);
  dt_module *m = nullptr;
  ASSERT_DT_OK(dt_nn_linear(256, 128, 1, &gen, &m));
  std::vector<float> w = ToVector(dt_module_parameter(m, "weight"));
  std::vector<float> b = ToVector(dt_module_parameter(m, "bias"));
  ASSERT_EQ(w.size(), 256u * 128u);
  ASSERT_EQ(b.size(), 128u);
  const double bound = 1.0 / std::sqrt(256.0);
  double sum = 0, sq = 0, mx = 0;
  for (float v : w) {
    ASSERT_LE(std::fabs(v), bound);
    sum += v;
    sq += (double)v * v;
    mx = std::max(mx, (double)std::fabs(v));
  }
  double n = (double)w.size();
  EXPECT_NEAR(sum / n, 0.0, 0.01 * bound);
  EXPECT_NEAR(sq / n, bound * bound / 3.0, 0.03 * bound * bound);  // U(-b,b) variance
  EXPECT_GT(mx, 0.99 * bound);
  for (float v : b)
    ASSERT_LE(std::fabs(v), bound);
  EXPECT_TRUE(dt_tensor_requires_grad(dt_module_parameter(m, "weight")));
  dt_module_destroy(m);

  dt_module *conv = nullptr;
  ASSERT_DT_OK(dt_nn_conv2d(6, 16, 5, 1, 0, 1, &gen, &conv));
  const double cbound = 1.0 / std::sqrt(6.0 * 25.0);
  for (float v : ToVector(dt_module_parameter(conv, "weight")))
    ASSERT_LE(std::fabs(v), cbound);
  for (float v : ToVector(dt_module_parameter(conv, "bias")))
    ASSERT_LE(std::fabs(v), cbound);
  dt_module_destroy(conv);

  EXPECT_EQ(dt_nn_linear(4, 4, 1, nullptr, &m), DT_ERR_INVALID_ARG);
}

std::vector<float> all_params(const dt_module *m) {
  std::vector<float> out;
  for (int i = 0; i < dt_module_num_parameters(m); i++) {
    std::vector<float> v = ToVector(dt_module_parameter_at(m, i, nullptr));
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TEST(ModuleInit, SeedDeterminesParameters) {
  dt_module *a = nullptr, *b = nullptr, *c = nullptr;
  ASSERT_DT_OK(dt_model_create("lenet", 7, &a));
  ASSERT_DT_OK(dt_model_create("lenet", 7, &b));
  ASSERT_DT_OK(dt_model_create("lenet", 8, &c));
  std::vector<float> pa = all_params(a), pb = all_params(b), pc = all_params(c);
  EXPECT_EQ(pa, pb);
  ASSERT_EQ(pa.size(), pc.size());
  size_t same = 0;
  for (size_t i = 0; i < pa.size(); i++)
    same += pa[i] == pc[i];
  EXPECT_LT(same, pa.size() / 100);
  dt_module_destroy(a);
  dt_module_destroy(b);
  dt_module_destroy(c);
}

TEST(ModuleInit, NormAndEmbeddingDefaults) {
  dt_module *bn = nullptr, *ln = nullptr, *emb = nullptr;
  ASSERT_DT_OK(dt_nn_batch_norm2d(3, 1e-5f, 0.1f, &bn));
  EXPECT_EQ(ToVector(dt_module_parameter(bn, "weight")), (std::vector<float>{1, 1, 1}));
  EXPECT_EQ(ToVector(dt_module_parameter(bn, "bias")), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(ToVector(dt_module_buffer(bn, "running_mean")), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(ToVector(dt_module_buffer(bn, "running_var")), (std::vector<float>{1, 1, 1}));
  dt_tensor *count = dt_module_buffer(bn, "num_batches_tracked");
  EXPECT_EQ(dt_tensor_dtype(count), DT_DTYPE_I64);
  EXPECT_FALSE(dt_tensor_requires_grad(count));
  ASSERT_DT_OK(dt_nn_layer_norm(5, 1e-5f, &ln));
  EXPECT_EQ(ToVector(dt_module_parameter(ln, "weight")), std::vector<float>(5, 1.0f));
  EXPECT_EQ(ToVector(dt_module_parameter(ln, "bias")), std::vector<float>(5, 0.0f));
  dt_generator gen;
  dt_generator_init(&gen, 3);
  ASSERT_DT_OK(dt_nn_embedding(100, 50, &gen, &emb));
  std::vector<float> w = ToVector(dt_module_parameter(emb, "weight"));
  double sum = 0, sq = 0;
  for (float v : w) {
    sum += v;
    sq += (double)v * v;
  }
  EXPECT_NEAR(sum / (double)w.size(), 0.0, 0.05);
  EXPECT_NEAR(sq / (double)w.size(), 1.0, 0.05);
  dt_module_destroy(bn);
  dt_module_destroy(ln);
  dt_module_destroy(emb);
}

// ---- BatchNorm and Dropout ----

TEST(ModuleBehaviour, BatchNormUpdatesRunningStatsInTrainingOnly) {
  dt_module *bn = nullptr;
  ASSERT_DT_OK(dt_nn_batch_norm2d(2, 1e-5f, 0.1f, &bn));
  dt_tensor *x = MakeTensor(Ramp(4 * 2 * 3 * 3, 0.5f), {4, 2, 3, 3});
  // Shift channel means so the batch mean is clearly nonzero.
  dt_tensor *y = nullptr;
  ASSERT_DT_OK(dt_module_call(bn, x, &y));
  dt_tensor_release(y);
  std::vector<float> mean1 = ToVector(dt_module_buffer(bn, "running_mean"));
  std::vector<float> var1 = ToVector(dt_module_buffer(bn, "running_var"));
  EXPECT_NE(var1, (std::vector<float>{1, 1}));
  double count = 0;
  ASSERT_DT_OK(dt_tensor_item(dt_module_buffer(bn, "num_batches_tracked"), 0, &count));
  EXPECT_EQ(count, 1.0);

  dt_module_train(bn, 0);
  ASSERT_DT_OK(dt_module_call(bn, x, &y));
  EXPECT_EQ(ToVector(dt_module_buffer(bn, "running_mean")), mean1);
  EXPECT_EQ(ToVector(dt_module_buffer(bn, "running_var")), var1);
  ASSERT_DT_OK(dt_tensor_item(dt_module_buffer(bn, "num_batches_tracked"), 0, &count));
  EXPECT_EQ(count, 1.0);
  dt_tensor_release(y);

  dt_module_train(bn, 1);
  ASSERT_DT_OK(dt_module_call(bn, x, &y));
  dt_tensor_release(y);
  EXPECT_NE(ToVector(dt_module_buffer(bn, "running_var")), var1);
  ASSERT_DT_OK(dt_tensor_item(dt_module_buffer(bn, "num_batches_tracked"), 0, &count));
  EXPECT_EQ(count, 2.0);
  dt_tensor_release(x);
  dt_module_destroy(bn);
}

TEST(ModuleBehaviour, DropoutIsSeededAndIdentityInEval) {
  const int64_t n = 1000;
  dt_tensor *x = MakeTensor(std::vector<float>((size_t)n, 1.0f), {n});
  auto run = [&](uint64_t seed, int training) {
    dt_module *d = nullptr;
    EXPECT_EQ(dt_nn_dropout(0.5f, seed, &d), DT_OK) << dt_last_error();
    dt_module_train(d, training);
    dt_tensor *y = nullptr;
    EXPECT_EQ(dt_module_call(d, x, &y), DT_OK) << dt_last_error();
    std::vector<float> first = ToVector(y);
    dt_tensor_release(y);
    EXPECT_EQ(dt_module_call(d, x, &y), DT_OK) << dt_last_error();
    std::vector<float> second = ToVector(y);
    dt_tensor_release(y);
    dt_module_destroy(d);
    first.insert(first.end(), second.begin(), second.end());
    return first;
  };
  std::vector<float> a = run(5, 1), b = run(5, 1), c = run(6, 1), e = run(5, 0);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // The generator advances: the second call draws a different mask.
  EXPECT_NE(std::vector<float>(a.begin(), a.begin() + n),
            std::vector<float>(a.begin() + n, a.end()));
  int zeros = 0;
  for (float v : a) {
    ASSERT_TRUE(v == 0.0f || v == 2.0f) << v;
    zeros += v == 0.0f;
  }
  EXPECT_NEAR(zeros / (2.0 * n), 0.5, 0.05);
  EXPECT_EQ(e, std::vector<float>(2 * (size_t)n, 1.0f));
  EXPECT_EQ(dt_nn_dropout(1.0f, 0, nullptr), DT_ERR_INVALID_ARG);
  dt_tensor_release(x);
}

// ---- device moves ----

TEST(ModuleDevice, MoveBetweenCpuDevicesKeepsHandlesAndValues) {
  ASSERT_GE(dt_device_count(DT_DEVICE_CPU), 2) << "the CPU backend exposes several devices";
  const dt_device cpu1 = {DT_DEVICE_CPU, 1};
  dt_generator gen;
  dt_generator_init(&gen, 9);
  dt_module *mods[2] = {nullptr, nullptr};
  ASSERT_DT_OK(dt_nn_linear(3, 2, 1, &gen, &mods[0]));
  ASSERT_DT_OK(dt_nn_batch_norm2d(2, 1e-5f, 0.1f, &mods[1]));
  dt_module *m = nullptr;
  ASSERT_DT_OK(dt_nn_sequential(mods, 2, &m));
  dt_tensor *w = dt_module_parameter_at(m, 0, nullptr);
  std::vector<float> before = ToVector(w);

  ASSERT_DT_OK(dt_module_to(m, cpu1));
  EXPECT_EQ(dt_module_parameter_at(m, 0, nullptr), w);  // same handle
  for (int i = 0; i < dt_module_num_parameters(m); i++) {
    dt_tensor *p = dt_module_parameter_at(m, i, nullptr);
    EXPECT_TRUE(dt_device_equal(dt_tensor_device(p), cpu1));
    EXPECT_TRUE(dt_tensor_requires_grad(p));
  }
  for (int i = 0; i < dt_module_num_buffers(m); i++)
    EXPECT_TRUE(dt_device_equal(dt_tensor_device(dt_module_buffer_at(m, i, nullptr)), cpu1));
  EXPECT_EQ(ToVector(w), before);

  dt_tensor *x0 = MakeTensor(Ramp(4 * 3), {4, 3});
  dt_tensor *y = nullptr;
  EXPECT_EQ(dt_module_call(m, x0, &y), DT_ERR_DEVICE_MISMATCH);
  EXPECT_EQ(y, nullptr);
  EXPECT_NE(std::string(dt_last_error()).find("cpu:1"), std::string::npos) << dt_last_error();
  dt_tensor *x1 = MakeTensor(Ramp(4 * 3), {4, 3}, false, cpu1);
  ASSERT_DT_OK(dt_module_call(m, x1, &y));
  EXPECT_TRUE(dt_device_equal(dt_tensor_device(y), cpu1));
  dt_tensor_release(y);

  ASSERT_DT_OK(dt_module_to(m, DT_CPU));
  EXPECT_TRUE(dt_device_equal(dt_tensor_device(w), DT_CPU));
  EXPECT_EQ(ToVector(w), before);
  ASSERT_DT_OK(dt_module_call(m, x0, &y));
  dt_tensor_release(y);
  EXPECT_EQ(dt_module_to(m, dt_device{DT_DEVICE_CPU, 1000}), DT_ERR_NO_DEVICE);
  dt_tensor_release(x0);
  dt_tensor_release(x1);
  dt_module_destroy(m);
}

}  // namespace
