// Tensor API and the autograd engine (the ops themselves: ops_*_test.cc).
#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/memory.h"
#include "core/ops.h"
#include "tests/test_util.h"

namespace {

using dtt::MakeTensor;
using dtt::ToVector;

TEST(Tensor, CreateAndReadBack) {
  dt_tensor *t = MakeTensor({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(dt_tensor_ndim(t), 2);
  EXPECT_EQ(dt_tensor_dim(t, -1), 3);
  EXPECT_EQ(dt_tensor_numel(t), 6);
  EXPECT_TRUE(dt_tensor_is_contiguous(t));
  EXPECT_EQ(ToVector(t), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  char buf[64];
  EXPECT_STREQ(dt_tensor_describe(t, buf, sizeof buf), "f32[2, 3] cpu:0");
  dt_tensor_release(t);
  dt_tensor_release(nullptr);  // no-op
}

TEST(Tensor, ZerosFullItem) {
  int64_t shape[] = {3};
  dt_tensor *z, *f;
  ASSERT_EQ(dt_tensor_zeros(shape, 1, DT_DTYPE_I64, DT_CPU, &z), DT_OK);
  ASSERT_EQ(dt_tensor_full(shape, 1, 2.5f, DT_CPU, &f), DT_OK);
  double v;
  ASSERT_EQ(dt_tensor_item(z, 2, &v), DT_OK);
  EXPECT_EQ(v, 0.0);
  ASSERT_EQ(dt_tensor_item(f, 1, &v), DT_OK);
  EXPECT_EQ(v, 2.5);
  EXPECT_EQ(dt_tensor_item(f, 3, &v), DT_ERR_INVALID_ARG);
  dt_tensor_release(z);
  dt_tensor_release(f);
}

// A shape whose element or byte count overflows 64 bits is refused instead
// of wrapping to a tiny allocation that later ops would overrun.
TEST(Tensor, HugeShapeIsRefusedNotWrapped) {
  const int64_t shape[2] = {INT64_C(1) << 32, INT64_C(1) << 32};
  dt_tensor *t = nullptr;
  EXPECT_EQ(dt_tensor_empty(shape, 2, DT_DTYPE_F32, DT_CPU, &t), DT_ERR_SHAPE);
  EXPECT_EQ(t, nullptr);
  EXPECT_NE(std::string(dt_last_error()).find("too large"), std::string::npos);
  const int64_t bytes_wrap[1] = {INT64_C(1) << 62};  // 2^62 elements x 4 bytes
  EXPECT_EQ(dt_tensor_zeros(bytes_wrap, 1, DT_DTYPE_F32, DT_CPU, &t), DT_ERR_SHAPE);
}

TEST(Tensor, ViewsShareStorage) {
  dt_tensor *t = MakeTensor({0, 1, 2, 3, 4, 5}, {2, 3});
  dt_tensor *tr, *r, *s, *c;
  ASSERT_EQ(dt_tensor_transpose(t, 0, 1, &tr), DT_OK);
  EXPECT_TRUE(dt_tensor_shares_storage(t, tr));
  EXPECT_FALSE(dt_tensor_is_contiguous(tr));
  EXPECT_EQ(ToVector(tr), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  int64_t shape[] = {-1, 2};
  ASSERT_EQ(dt_tensor_reshape(t, shape, 2, &r), DT_OK);
  EXPECT_TRUE(dt_tensor_shares_storage(t, r));
  EXPECT_EQ(dt_tensor_dim(r, 0), 3);
  ASSERT_EQ(dt_tensor_slice(r, 1, 3, &s), DT_OK);
  EXPECT_TRUE(dt_tensor_shares_storage(t, s));
  EXPECT_EQ(ToVector(s), (std::vector<float>{2, 3, 4, 5}));
  ASSERT_EQ(dt_tensor_contiguous(tr, &c), DT_OK);
  EXPECT_FALSE(dt_tensor_shares_storage(t, c));
  EXPECT_TRUE(dt_tensor_is_contiguous(c));
  int64_t bad[] = {4, 2};
  dt_tensor *x;
  EXPECT_EQ(dt_tensor_reshape(t, bad, 2, &x), DT_ERR_SHAPE);
  EXPECT_NE(std::string(dt_last_error()).find("[4, 2]"), std::string::npos) << dt_last_error();
  EXPECT_EQ(dt_tensor_slice(t, 1, 5, &x), DT_ERR_INVALID_ARG);
  for (dt_tensor *p : {t, tr, r, s, c})
    dt_tensor_release(p);
}

TEST(Tensor, CopyConvertsDtypeAndLayout) {
  dt_tensor *t = MakeTensor({1.5f, -2.25f, 3.0f, 65504.0f}, {2, 2});
  dt_tensor *h, *tr, *dst;
  ASSERT_EQ(dt_tensor_to_dtype(t, DT_DTYPE_F16, &h), DT_OK);
  ASSERT_EQ(dt_tensor_transpose(h, 0, 1, &tr), DT_OK);
  int64_t shape[] = {2, 2};
  ASSERT_EQ(dt_tensor_empty(shape, 2, DT_DTYPE_F32, DT_CPU, &dst), DT_OK);
  ASSERT_EQ(dt_tensor_copy_(dst, tr), DT_OK);
  EXPECT_EQ(ToVector(dst), (std::vector<float>{1.5f, 3.0f, -2.25f, 65504.0f}));
  int64_t other[] = {4};
  dt_tensor *wrong;
  ASSERT_EQ(dt_tensor_empty(other, 1, DT_DTYPE_F32, DT_CPU, &wrong), DT_OK);
  EXPECT_EQ(dt_tensor_copy_(wrong, t), DT_ERR_SHAPE);
  for (dt_tensor *p : {t, h, tr, dst, wrong})
    dt_tensor_release(p);
}

TEST(Tensor, CrossDeviceCopyBetweenCpuDevices) {
  dt_tensor *t = MakeTensor({1, 2, 3}, {3}, true);
  dt_device d1;
  ASSERT_EQ(dt_device_parse("cpu:1", &d1), DT_OK);
  dt_tensor *u;
  ASSERT_EQ(dt_tensor_to_device(t, d1, &u), DT_OK);
  EXPECT_TRUE(dt_device_equal(dt_tensor_device(u), d1));
  EXPECT_EQ(ToVector(u), (std::vector<float>{1, 2, 3}));
  dt_tensor *s;
  ASSERT_EQ(dt_op_sum(u, nullptr, 0, 0, &s), DT_OK);
  ASSERT_EQ(dt_backward(s, nullptr), DT_OK) << dt_last_error();
  ASSERT_NE(dt_tensor_grad(t), nullptr);
  EXPECT_TRUE(dt_device_equal(dt_tensor_device(dt_tensor_grad(t)), DT_CPU));
  EXPECT_EQ(ToVector(dt_tensor_grad(t)), (std::vector<float>{1, 1, 1}));
  for (dt_tensor *p : {t, u, s})
    dt_tensor_release(p);
}

TEST(Device, ParseAndErrors) {
  dt_device d;
  ASSERT_EQ(dt_device_parse("cuda:3", &d), DT_OK);
  EXPECT_EQ(d.type, DT_DEVICE_CUDA);
  EXPECT_EQ(d.index, 3);
  ASSERT_EQ(dt_device_parse("cpu", &d), DT_OK);
  EXPECT_EQ(d.index, 0);
  EXPECT_EQ(dt_device_parse("tpu:0", &d), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_device_parse("cpu:x", &d), DT_ERR_INVALID_ARG);
}

TEST(Autograd, SecondBackwardFailsClearly) {
  dt_tensor *x = MakeTensor({1, 2}, {2}, true);
  dt_tensor *y, *s;
  ASSERT_EQ(dt_op_mul(x, x, &y), DT_OK);
  ASSERT_EQ(dt_op_sum(y, nullptr, 0, 0, &s), DT_OK);
  ASSERT_EQ(dt_backward(s, nullptr), DT_OK) << dt_last_error();
  EXPECT_EQ(ToVector(dt_tensor_grad(x)), (std::vector<float>{2, 4}));
  EXPECT_EQ(dt_backward(s, nullptr), DT_ERR_STATE);
  EXPECT_NE(std::string(dt_last_error()).find("already freed"), std::string::npos);
  for (dt_tensor *p : {x, y, s})
    dt_tensor_release(p);
}

// A backward that fails on an already-freed part of the graph must not
// leave the live part marked as visited: a later backward through it would
// silently skip it (x would get no gradient).
TEST(Autograd, FailedBackwardLeavesLiveGraphUsable) {
  dt_tensor *x = MakeTensor({1, 2}, {2}, true);
  dt_tensor *y, *ys, *t, *both, *bs, *ts;
  ASSERT_EQ(dt_op_scale(x, 2.0f, &y), DT_OK);
  ASSERT_EQ(dt_op_sum(y, nullptr, 0, 0, &ys), DT_OK);
  ASSERT_EQ(dt_backward(ys, nullptr), DT_OK) << dt_last_error();  // frees y's graph
  ASSERT_EQ(dt_op_scale(x, 3.0f, &t), DT_OK);
  ASSERT_EQ(dt_op_add(t, y, &both), DT_OK);  // t live, y freed
  ASSERT_EQ(dt_op_sum(both, nullptr, 0, 0, &bs), DT_OK);
  EXPECT_EQ(dt_backward(bs, nullptr), DT_ERR_STATE);
  EXPECT_EQ(ToVector(dt_tensor_grad(x)), (std::vector<float>{2, 2}));
  ASSERT_EQ(dt_op_sum(t, nullptr, 0, 0, &ts), DT_OK);
  ASSERT_EQ(dt_backward(ts, nullptr), DT_OK) << dt_last_error();
  EXPECT_EQ(ToVector(dt_tensor_grad(x)), (std::vector<float>{5, 5}));
  for (dt_tensor *p : {x, y, ys, t, both, bs, ts})
    dt_tensor_release(p);
}

TEST(Autograd, GradOutputMustBeF32OnTheLossDevice) {
  dt_tensor *x = MakeTensor({1, 2}, {2}, true);
  dt_tensor *y, *half, *other;
  ASSERT_EQ(dt_op_scale(x, 2.0f, &y), DT_OK);
  dt_tensor *go = MakeTensor({1, 1}, {2});
  ASSERT_EQ(dt_tensor_to_dtype(go, DT_DTYPE_F16, &half), DT_OK);
  EXPECT_EQ(dt_backward(y, half), DT_ERR_DTYPE);
  dt_device d1;
  ASSERT_EQ(dt_device_parse("cpu:1", &d1), DT_OK);
  ASSERT_EQ(dt_tensor_to_device(go, d1, &other), DT_OK);
  EXPECT_EQ(dt_backward(y, other), DT_ERR_DEVICE_MISMATCH);
  EXPECT_NE(std::string(dt_last_error()).find("cpu:1"), std::string::npos) << dt_last_error();
  ASSERT_EQ(dt_backward(y, go), DT_OK) << dt_last_error();
  for (dt_tensor *p : {x, y, go, half, other})
    dt_tensor_release(p);
}

TEST(Autograd, NonScalarNeedsGradOutputAndAccumulates) {
  dt_tensor *x = MakeTensor({1, 2, 3}, {3}, true);
  dt_tensor *y;
  ASSERT_EQ(dt_op_scale(x, 3.0f, &y), DT_OK);
  EXPECT_EQ(dt_backward(y, nullptr), DT_ERR_SHAPE);
  dt_tensor *go = MakeTensor({1, 0, -1}, {3});
  ASSERT_EQ(dt_backward(y, go), DT_OK) << dt_last_error();
  EXPECT_EQ(ToVector(dt_tensor_grad(x)), (std::vector<float>{3, 0, -3}));
  // A second pass accumulates into .grad.
  dt_tensor *y2;
  ASSERT_EQ(dt_op_scale(x, 1.0f, &y2), DT_OK);
  ASSERT_EQ(dt_backward(y2, go), DT_OK);
  EXPECT_EQ(ToVector(dt_tensor_grad(x)), (std::vector<float>{4, 0, -4}));
  for (dt_tensor *p : {x, y, go, y2})
    dt_tensor_release(p);
}

TEST(Autograd, GradReadyHookFiresOnceWithCompleteGradient) {
  // w is used three times; the hook must fire once, after all three parts.
  dt_tensor *w = MakeTensor({1, 2}, {2}, true);
  dt_tensor *other = MakeTensor({5, 5}, {2}, true);
  dtt::GradReadyRecord log;
  dt_hook_handle h;
  ASSERT_EQ(dt_tensor_add_grad_ready_hook(w, dtt::RecordGradReady, &log, &h), DT_OK);
  dt_tensor *a, *b, *c, *d, *s;
  ASSERT_EQ(dt_op_mul(w, w, &a), DT_OK);  // grad 2w
  ASSERT_EQ(dt_op_add(a, other, &b), DT_OK);
  ASSERT_EQ(dt_op_mul(b, w, &c), DT_OK);  // (w^2 + o) w
  ASSERT_EQ(dt_op_sum(c, nullptr, 0, 0, &s), DT_OK);
  ASSERT_EQ(dt_backward(s, nullptr), DT_OK) << dt_last_error();
  EXPECT_EQ(log.fired, 1);
  // d/dw sum((w^2+o) w) = 3 w^2 + o
  EXPECT_EQ(log.grad, (std::vector<float>{8, 17}));
  // A second pass fires again, once.
  ASSERT_EQ(dt_op_scale(w, 2.0f, &d), DT_OK);
  dt_tensor *s2;
  ASSERT_EQ(dt_op_sum(d, nullptr, 0, 0, &s2), DT_OK);
  ASSERT_EQ(dt_backward(s2, nullptr), DT_OK);
  EXPECT_EQ(log.fired, 2);
  ASSERT_EQ(dt_tensor_remove_grad_ready_hook(w, h), DT_OK);
  EXPECT_EQ(dt_tensor_remove_grad_ready_hook(w, h), DT_ERR_INVALID_ARG);
  for (dt_tensor *p : {w, other, a, b, c, d, s, s2})
    dt_tensor_release(p);
}

struct SelfRemoving {
  dt_hook_handle handle = 0;
  int calls = 0;
};

void remove_self(dt_tensor *leaf, void *user) {
  auto *s = static_cast<SelfRemoving *>(user);
  s->calls++;
  EXPECT_EQ(dt_tensor_remove_grad_ready_hook(leaf, s->handle), DT_OK);
}

void count_call(dt_tensor *, void *user) { (*static_cast<int *>(user))++; }

TEST(Autograd, HookMayRemoveItselfWithoutSkippingTheNext) {
  dt_tensor *w = MakeTensor({1, 2}, {2}, true);
  SelfRemoving first;
  int second = 0;
  ASSERT_EQ(dt_tensor_add_grad_ready_hook(w, remove_self, &first, &first.handle), DT_OK);
  ASSERT_EQ(dt_tensor_add_grad_ready_hook(w, count_call, &second, nullptr), DT_OK);
  for (int pass = 0; pass < 2; pass++) {
    dt_tensor *y, *s;
    ASSERT_EQ(dt_op_scale(w, 2.0f, &y), DT_OK);
    ASSERT_EQ(dt_op_sum(y, nullptr, 0, 0, &s), DT_OK);
    ASSERT_EQ(dt_backward(s, nullptr), DT_OK);
    dt_tensor_release(y);
    dt_tensor_release(s);
  }
  EXPECT_EQ(first.calls, 1);  // removed itself during the first pass
  EXPECT_EQ(second, 2);       // fired in both passes, not skipped
  dt_tensor_release(w);
}

TEST(Autograd, NoGradRecordsNothing) {
  dt_tensor *x = MakeTensor({1, 2}, {2}, true);
  dt_tensor *y;
  dt_no_grad_begin();
  EXPECT_FALSE(dt_grad_enabled());
  ASSERT_EQ(dt_op_mul(x, x, &y), DT_OK);
  dt_no_grad_end();
  EXPECT_TRUE(dt_grad_enabled());
  EXPECT_FALSE(dt_tensor_requires_grad(y));
  EXPECT_TRUE(dt_tensor_is_leaf(y));
  EXPECT_EQ(dt_backward(y, nullptr), DT_ERR_INVALID_ARG);
  dt_tensor_release(x);
  dt_tensor_release(y);
}

TEST(Autograd, RequiresGradOnlyOnFloatLeaves) {
  int64_t shape[] = {2};
  dt_tensor *i;
  ASSERT_EQ(dt_tensor_zeros(shape, 1, DT_DTYPE_I32, DT_CPU, &i), DT_OK);
  EXPECT_EQ(dt_tensor_set_requires_grad(i, 1), DT_ERR_DTYPE);
  dt_tensor *x = MakeTensor({1, 2}, {2}, true), *y;
  ASSERT_EQ(dt_op_scale(x, 2.0f, &y), DT_OK);
  EXPECT_EQ(dt_tensor_set_requires_grad(y, 0), DT_ERR_INVALID_ARG);
  for (dt_tensor *p : {i, x, y})
    dt_tensor_release(p);
}

}  // namespace
