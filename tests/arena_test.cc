// The flat parameter arena: parameters and gradients as views into two flat
// buffers, in registration order.
#include <gtest/gtest.h>

#include <string>
#include <vector>

extern "C" {
#include "core/autograd.h"
#include "core/module.h"
#include "core/nn.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "models/models.h"
}
#include "tests/test_util.h"

namespace {

using dtt::CopyFromHost;
using dtt::MakeTensor;
using dtt::Ramp;
using dtt::ToVector;

// MLP 4-3-2: parameters 1.weight (3,4), 1.bias (3), 3.weight (2,3), 3.bias (2).
dt_module *small_mlp(uint64_t seed) {
  static const int sizes[] = {4, 3, 2};
  dt_module *m = nullptr;
  EXPECT_EQ(dt_model_mlp(sizes, 3, seed, &m), DT_OK) << dt_last_error();
  return m;
}

// Cross-entropy of the model on a fixed batch of 5, then backward.
dt_status forward_backward(dt_module *m) {
  dt_tensor *x = MakeTensor(Ramp(5 * 4), {5, 4});
  int64_t labels[5] = {0, 1, 1, 0, 1};
  int64_t n = 5;
  dt_tensor *target = nullptr, *logits = nullptr, *loss = nullptr;
  dt_status st = dt_tensor_from_host(labels, &n, 1, DT_DTYPE_I64, DT_CPU, &target);
  if (st == DT_OK)
    st = dt_module_call(m, x, &logits);
  if (st == DT_OK)
    st = dt_op_cross_entropy(logits, target, DT_REDUCTION_MEAN, DT_IGNORE_INDEX, &loss);
  if (st == DT_OK)
    st = dt_backward(loss, nullptr);
  dt_tensor_release(loss);
  dt_tensor_release(logits);
  dt_tensor_release(target);
  dt_tensor_release(x);
  return st;
}

// small_mlp(seed) with its arena, after one forward_backward. Call it
// through ASSERT_NO_FATAL_FAILURE.
void MlpAfterBackward(uint64_t seed, dt_module **m, dt_param_arena **a) {
  *m = small_mlp(seed);
  ASSERT_DT_OK(dt_param_arena_create(*m, a));
  ASSERT_DT_OK(forward_backward(*m));
}

TEST(ParamArena, ParametersBecomeViewsInRegistrationOrder) {
  dt_module *m = small_mlp(1);
  std::vector<std::vector<float>> before;
  for (int i = 0; i < dt_module_num_parameters(m); i++)
    before.push_back(ToVector(dt_module_parameter_at(m, i, nullptr)));

  dt_param_arena *a = nullptr;
  ASSERT_DT_OK(dt_param_arena_create(m, &a));
  ASSERT_EQ(dt_param_arena_count(a), 4);
  EXPECT_EQ(dt_param_arena_numel(a), 12 + 3 + 6 + 2);
  EXPECT_EQ(dt_param_arena_numel(a), dt_module_parameter_count(m));
  EXPECT_TRUE(dt_device_equal(dt_param_arena_device(a), DT_CPU));
  const int64_t offsets[4] = {0, 12, 15, 21};
  const char *names[4] = {"1.weight", "1.bias", "3.weight", "3.bias"};
  dt_tensor *data = dt_param_arena_data(a), *grads = dt_param_arena_grads(a);
  ASSERT_EQ(dt_tensor_ndim(data), 1);
  EXPECT_EQ(dt_tensor_dim(data, 0), 23);
  EXPECT_EQ(dt_tensor_dim(grads, 0), 23);
  std::vector<float> flat = ToVector(data);
  for (int i = 0; i < 4; i++) {
    const char *name = nullptr;
    dt_tensor *p = dt_param_arena_param(a, i, &name);
    EXPECT_STREQ(name, names[i]);
    EXPECT_EQ(p, dt_module_parameter_at(m, i, nullptr));  // same handle as the module's
    EXPECT_EQ(dt_param_arena_offset(a, i), offsets[i]);
    EXPECT_TRUE(dt_tensor_shares_storage(p, data));
    EXPECT_EQ((float *)dt_tensor_data(p), (float *)dt_tensor_data(data) + offsets[i]);
    EXPECT_TRUE(dt_tensor_requires_grad(p));
    EXPECT_TRUE(dt_tensor_is_leaf(p));
    // Values were copied in.
    EXPECT_EQ(ToVector(p), before[(size_t)i]);
    EXPECT_EQ(std::vector<float>(flat.begin() + offsets[i],
                                 flat.begin() + offsets[i] + (int64_t)before[(size_t)i].size()),
              before[(size_t)i]);
    // Gradients are views of the flat gradient buffer.
    dt_tensor *g = dt_tensor_grad(p);
    ASSERT_NE(g, nullptr);
    EXPECT_TRUE(dt_tensor_shares_storage(g, grads));
    EXPECT_EQ((float *)dt_tensor_data(g), (float *)dt_tensor_data(grads) + offsets[i]);
    EXPECT_EQ(dt_tensor_ndim(g), dt_tensor_ndim(p));
    for (int d = 0; d < dt_tensor_ndim(p); d++)
      EXPECT_EQ(dt_tensor_dim(g, d), dt_tensor_dim(p, d));
  }
  EXPECT_EQ(ToVector(grads), std::vector<float>(23, 0.0f));
  EXPECT_EQ(dt_param_arena_param(a, 4, nullptr), nullptr);
  EXPECT_EQ(dt_param_arena_offset(a, -1), -1);

  // Writing the flat buffer changes the parameters.
  std::vector<float> fresh(23);
  for (int i = 0; i < 23; i++)
    fresh[(size_t)i] = (float)i;
  ASSERT_DT_OK(CopyFromHost(data, fresh));
  EXPECT_EQ(ToVector(dt_module_parameter(dt_module_child(m, "3"), "bias")),
            (std::vector<float>{21, 22}));
  double v = 0;
  ASSERT_DT_OK(dt_tensor_item(dt_module_parameter(dt_module_child(m, "1"), "weight"), 5, &v));
  EXPECT_EQ(v, 5.0);

  dt_param_arena_destroy(a);
  dt_param_arena_destroy(nullptr);
  // The parameters keep the arena's storage alive.
  EXPECT_EQ(ToVector(dt_module_parameter(dt_module_child(m, "3"), "bias")),
            (std::vector<float>{21, 22}));
  dt_module_destroy(m);
}

// Every parameter's gradient, one after the other in registration order;
// empty (and a failure) when a parameter has none.
std::vector<float> concatenated_grads(const dt_module *m) {
  std::vector<float> all;
  for (int i = 0; i < dt_module_num_parameters(m); i++) {
    dt_tensor *g = dt_tensor_grad(dt_module_parameter_at(m, i, nullptr));
    if (!g) {
      ADD_FAILURE() << "parameter " << i << " has no gradient";
      return {};
    }
    std::vector<float> gv = ToVector(g);
    all.insert(all.end(), gv.begin(), gv.end());
  }
  return all;
}

TEST(ParamArena, BackwardAccumulatesIntoTheFlatBufferAndZeroGradClearsIt) {
  // Reference: the same model without an arena.
  dt_module *ref = small_mlp(3);
  ASSERT_DT_OK(forward_backward(ref));
  std::vector<float> want = concatenated_grads(ref);
  ASSERT_FALSE(want.empty());

  dt_module *m = small_mlp(3);
  dt_param_arena *a = nullptr;
  ASSERT_DT_OK(dt_param_arena_create(m, &a));
  std::vector<dt_tensor *> grad_handles;
  for (int i = 0; i < dt_param_arena_count(a); i++)
    grad_handles.push_back(dt_tensor_grad(dt_param_arena_param(a, i, nullptr)));

  ASSERT_DT_OK(forward_backward(m));
  std::vector<float> got = ToVector(dt_param_arena_grads(a));
  ASSERT_EQ(got.size(), want.size());
  bool any_nonzero = false;
  for (size_t i = 0; i < got.size(); i++) {
    EXPECT_NEAR(got[i], want[i], 1e-6f) << "element " << i;
    any_nonzero |= got[i] != 0.0f;
  }
  EXPECT_TRUE(any_nonzero);
  // The engine accumulated into the views; it did not replace them.
  for (int i = 0; i < dt_param_arena_count(a); i++)
    EXPECT_EQ(dt_tensor_grad(dt_param_arena_param(a, i, nullptr)), grad_handles[(size_t)i]);

  ASSERT_DT_OK(forward_backward(m));  // accumulates (+=)
  got = ToVector(dt_param_arena_grads(a));
  for (size_t i = 0; i < got.size(); i++)
    EXPECT_NEAR(got[i], 2.0f * want[i], 2e-6f) << "element " << i;

  ASSERT_DT_OK(dt_param_arena_zero_grad(a));
  EXPECT_EQ(ToVector(dt_param_arena_grads(a)), std::vector<float>(got.size(), 0.0f));
  EXPECT_EQ(ToVector(dt_tensor_grad(dt_param_arena_param(a, 2, nullptr))),
            std::vector<float>(6, 0.0f));

  dt_param_arena_destroy(a);
  dt_module_destroy(m);
  dt_module_destroy(ref);
}

TEST(ParamArena, KeepsAnExistingGradient) {
  dt_module *m = small_mlp(4);
  ASSERT_DT_OK(forward_backward(m));
  std::vector<float> want = concatenated_grads(m);
  ASSERT_FALSE(want.empty());
  dt_param_arena *a = nullptr;
  ASSERT_DT_OK(dt_param_arena_create(m, &a));
  EXPECT_EQ(ToVector(dt_param_arena_grads(a)), want);
  dt_param_arena_destroy(a);
  dt_module_destroy(m);
}

TEST(ParamArena, RejectsMixedDevicesDtypesAndEmptyModules) {
  dt_module *m = small_mlp(5);
  // One parameter on another device.
  dt_module *last = dt_module_child(m, "3");
  ASSERT_DT_OK(dt_module_to(last, dt_device{DT_DEVICE_CPU, 1}));
  dt_param_arena *a = nullptr;
  EXPECT_EQ(dt_param_arena_create(m, &a), DT_ERR_DEVICE_MISMATCH);
  EXPECT_EQ(a, nullptr);
  EXPECT_NE(std::string(dt_last_error()).find("3.weight"), std::string::npos) << dt_last_error();
  // Whole module on cpu:1 works, and the buffers live there.
  ASSERT_DT_OK(dt_module_to(m, dt_device{DT_DEVICE_CPU, 1}));
  ASSERT_DT_OK(dt_param_arena_create(m, &a));
  EXPECT_TRUE(dt_device_equal(dt_param_arena_device(a), (dt_device{DT_DEVICE_CPU, 1})));
  EXPECT_TRUE(
      dt_device_equal(dt_tensor_device(dt_param_arena_grads(a)), (dt_device{DT_DEVICE_CPU, 1})));
  dt_param_arena_destroy(a);
  dt_module_destroy(m);

  // An f16 parameter.
  dt_module *relu = nullptr;
  ASSERT_DT_OK(dt_nn_relu(&relu));
  EXPECT_EQ(dt_param_arena_create(relu, &a), DT_ERR_INVALID_ARG);  // no parameters
  int64_t shape[1] = {4};
  uint16_t half[4] = {0, 0, 0, 0};
  dt_tensor *h = nullptr;
  ASSERT_DT_OK(dt_tensor_from_host(half, shape, 1, DT_DTYPE_F16, DT_CPU, &h));
  ASSERT_DT_OK(dt_module_register_parameter(relu, "h", h));
  dt_tensor_release(h);
  EXPECT_EQ(dt_param_arena_create(relu, &a), DT_ERR_DTYPE);
  EXPECT_NE(std::string(dt_last_error()).find("\"h\""), std::string::npos) << dt_last_error();
  dt_module_destroy(relu);
}

}  // namespace

namespace {

// ZeRO's tail: the flat buffers grow by zeroed elements, every value and
// accumulated gradient stays, .grad views point into the new buffer.
TEST(ParamArena, PadKeepsValuesAndGradientsAndDropGradsLetsAutogradAllocate) {
  dt_module *m = nullptr;
  dt_param_arena *a = nullptr;
  ASSERT_NO_FATAL_FAILURE(MlpAfterBackward(5, &m, &a));
  std::vector<float> data = ToVector(dt_param_arena_data(a));
  std::vector<float> grads = ToVector(dt_param_arena_grads(a));
  int64_t n = dt_param_arena_numel(a);
  ASSERT_DT_OK(dt_param_arena_pad(a, 3));
  EXPECT_EQ(dt_param_arena_numel(a), n);
  EXPECT_EQ(dt_param_arena_tail(a), 3);
  EXPECT_EQ(ToVector(dt_param_arena_data(a)), data);
  EXPECT_EQ(ToVector(dt_param_arena_grads(a)), grads);
  std::vector<float> padded = ToVector(dt_param_arena_padded_data(a));
  ASSERT_EQ(padded.size(), static_cast<size_t>(n + 3));
  EXPECT_EQ(std::vector<float>(padded.end() - 3, padded.end()), std::vector<float>(3, 0.0f));
  ASSERT_DT_OK(dt_param_arena_pad(a, 1));  // smaller: nothing to do
  EXPECT_EQ(dt_param_arena_tail(a), 3);
  // The parameters read the new buffer, their gradients accumulate into it.
  ASSERT_DT_OK(forward_backward(m));
  std::vector<float> twice = ToVector(dt_param_arena_grads(a));
  for (size_t i = 0; i < twice.size(); i++)
    EXPECT_NEAR(twice[i], 2.0f * grads[i], 2e-6f) << i;
  std::vector<float> tail = ToVector(dt_param_arena_padded_grads(a));
  EXPECT_EQ(std::vector<float>(tail.end() - 3, tail.end()), std::vector<float>(3, 0.0f));

  ASSERT_DT_OK(dt_param_arena_drop_grads(a));
  EXPECT_EQ(dt_param_arena_grads(a), nullptr);
  EXPECT_EQ(dt_tensor_grad(dt_param_arena_param(a, 0, nullptr)), nullptr);
  ASSERT_DT_OK(forward_backward(m));  // autograd allocates each gradient
  dt_tensor *g0 = dt_tensor_grad(dt_param_arena_param(a, 0, nullptr));
  ASSERT_NE(g0, nullptr);
  std::vector<float> g0v = ToVector(g0);
  for (size_t i = 0; i < g0v.size(); i++)
    EXPECT_NEAR(g0v[i], grads[i], 1e-6f) << i;
  ASSERT_DT_OK(dt_param_arena_zero_grad(a));
  EXPECT_EQ(dt_tensor_grad(dt_param_arena_param(a, 0, nullptr)), nullptr);
  dt_param_arena_destroy(a);
  dt_module_destroy(m);
}

// Gradients moved into caller memory (a tensor over it, as DDP's shared
// buffer): the values so far are kept, backward accumulates there, zero
// grad clears it, and the memory is released once the arena and the
// module let go; wrong buffers are refused and change nothing.
struct Released {
  int calls = 0;
};
void CountRelease(void *ctx) { static_cast<Released *>(ctx)->calls++; }

TEST(ParamArena, MoveGradsIntoCallerMemoryKeepsThemAndReleasesIt) {
  dt_module *m = nullptr;
  dt_param_arena *a = nullptr;
  ASSERT_NO_FATAL_FAILURE(MlpAfterBackward(6, &m, &a));
  std::vector<float> grads = ToVector(dt_param_arena_grads(a));
  int64_t n = dt_param_arena_numel(a);
  std::vector<float> memory(static_cast<size_t>(n) + 4, -1.0f);
  Released rel;
  dt_tensor *flat = nullptr;
  ASSERT_DT_OK(dt_tensor_from_cpu_memory(memory.data(), memory.size() * sizeof(float), &n, 1,
                                         DT_DTYPE_F32, CountRelease, &rel, &flat));
  dt_tensor *wrong = nullptr;
  int64_t short_n = n - 1;
  ASSERT_DT_OK(dt_tensor_from_cpu_memory(memory.data(), memory.size() * sizeof(float), &short_n, 1,
                                         DT_DTYPE_F32, nullptr, nullptr, &wrong));
  EXPECT_EQ(dt_param_arena_move_grads(a, wrong), DT_ERR_INVALID_ARG);
  dt_tensor_release(wrong);
  EXPECT_EQ(ToVector(dt_param_arena_grads(a)), grads) << "a refused move changed nothing";
  ASSERT_DT_OK(dt_param_arena_move_grads(a, flat));
  dt_tensor_release(flat);
  EXPECT_EQ(std::vector<float>(memory.begin(), memory.begin() + n), grads);
  EXPECT_EQ(memory[static_cast<size_t>(n)], -1.0f) << "wrote past the gradients";
  EXPECT_EQ(dt_tensor_data(dt_param_arena_grads(a)), static_cast<void *>(memory.data()));
  ASSERT_DT_OK(forward_backward(m));  // accumulates into the caller's memory
  for (int64_t i = 0; i < n; i++)
    EXPECT_NEAR(memory[static_cast<size_t>(i)], 2.0f * grads[static_cast<size_t>(i)], 2e-6f) << i;
  ASSERT_DT_OK(dt_param_arena_zero_grad(a));
  EXPECT_EQ(std::vector<float>(memory.begin(), memory.begin() + n),
            std::vector<float>(static_cast<size_t>(n), 0.0f));
  dt_param_arena_destroy(a);
  EXPECT_EQ(rel.calls, 0) << "the parameters' .grad views still hold it";
  dt_module_destroy(m);
  EXPECT_EQ(rel.calls, 1);
}

TEST(ParamArena, CallerMemoryMustHoldTheShape) {
  float memory[8];
  int64_t n = 9;
  dt_tensor *t = nullptr;
  EXPECT_EQ(
      dt_tensor_from_cpu_memory(memory, sizeof memory, &n, 1, DT_DTYPE_F32, nullptr, nullptr, &t),
      DT_ERR_INVALID_ARG);
  EXPECT_EQ(t, nullptr);
  n = 1;
  EXPECT_EQ(dt_tensor_from_cpu_memory(reinterpret_cast<char *>(memory) + 1, 4, &n, 1, DT_DTYPE_F32,
                                      nullptr, nullptr, &t),
            DT_ERR_INVALID_ARG)
      << "misaligned";
  n = 8;
  Released rel;
  ASSERT_DT_OK(dt_tensor_from_cpu_memory(memory, sizeof memory, &n, 1, DT_DTYPE_F32, CountRelease,
                                         &rel, &t));
  dt_tensor *view = nullptr;
  int64_t four = 4;
  ASSERT_DT_OK(dt_tensor_view_flat(t, 2, &four, 1, &view));
  dt_tensor_release(t);
  EXPECT_EQ(rel.calls, 0) << "a view holds the memory";
  dt_tensor_release(view);
  EXPECT_EQ(rel.calls, 1);
}

}  // namespace
