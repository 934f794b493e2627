// Gradient accumulation: K micro-batches, each loss scaled by 1/K, then one
// optimizer step, give the same parameters as one step on the whole batch
// (a model without batch norm, so the batch split changes nothing else).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/module.h"
#include "core/ops.h"
#include "core/optim.h"
#include "models/models.h"
#include "tests/test_util.h"

namespace {

using Run = dtt::SgdModel;

void Setup(const char *name, Run *r) {
  ASSERT_DT_OK(dt_model_create(name, 7, &r->model));
  ASSERT_DT_OK(dtt::AttachSgd(r, 0.05f, 0.9f, 1e-3f));
}

// Forward + mean cross-entropy on rows [lo, hi) of (x, y), scaled, backward.
void MicroBatch(Run *r, dt_tensor *x, dt_tensor *y, int64_t lo, int64_t hi, float scale) {
  dtt::Tensors ts;
  dt_tensor *xs, *ys, *logits, *loss, *scaled;
  ASSERT_DT_OK(dt_tensor_slice(x, lo, hi, &xs));
  ts.add(xs);
  ASSERT_DT_OK(dt_tensor_slice(y, lo, hi, &ys));
  ts.add(ys);
  ASSERT_DT_OK(dt_module_call(r->model, xs, &logits));
  ts.add(logits);
  ASSERT_DT_OK(dt_op_cross_entropy(logits, ys, DT_REDUCTION_MEAN, DT_IGNORE_INDEX, &loss));
  ts.add(loss);
  ASSERT_DT_OK(dt_op_scale(loss, scale, &scaled));
  ts.add(scaled);
  ASSERT_DT_OK(dt_backward(scaled, nullptr));
}

void ExpectAccumulationEqualsOneBatch(const char *model, int64_t batch, int k) {
  Run whole, accum;
  Setup(model, &whole);
  Setup(model, &accum);
  ASSERT_FALSE(::testing::Test::HasFailure());
  for (int step = 0; step < 4; step++) {
    dtt::Tensors ts;
    dt_tensor *x = ts.add(dtt::RandomTensor({batch, 1, 28, 28}, 100 + step));
    std::vector<int64_t> labels(batch);
    for (int64_t i = 0; i < batch; i++)
      labels[i] = (i * 7 + step) % 10;
    dt_tensor *y = ts.add(dtt::MakeIndexTensor(labels, {batch}, DT_DTYPE_I32));

    MicroBatch(&whole, x, y, 0, batch, 1.0f);
    ASSERT_DT_OK(dt_optim_step(whole.opt));
    ASSERT_DT_OK(dt_optim_zero_grad(whole.opt));

    int64_t micro = batch / k;
    for (int j = 0; j < k; j++)
      MicroBatch(&accum, x, y, j * micro, (j + 1) * micro, 1.0f / (float)k);
    ASSERT_DT_OK(dt_optim_step(accum.opt));
    ASSERT_DT_OK(dt_optim_zero_grad(accum.opt));
    ASSERT_FALSE(::testing::Test::HasFailure());
  }
  std::vector<float> a = dtt::ToVector(dt_param_arena_data(whole.arena));
  std::vector<float> b = dtt::ToVector(dt_param_arena_data(accum.arena));
  ASSERT_EQ(a.size(), b.size());
  double num = 0, den = 0, moved = 0;
  std::vector<float> init;
  {
    Run fresh;
    Setup(model, &fresh);
    init = dtt::ToVector(dt_param_arena_data(fresh.arena));
  }
  for (size_t i = 0; i < a.size(); i++) {
    num += (double)(a[i] - b[i]) * (a[i] - b[i]);
    den += (double)a[i] * a[i];
    moved += (double)(a[i] - init[i]) * (a[i] - init[i]);
  }
  EXPECT_LE(std::sqrt(num / den), 1e-5) << model << " K=" << k;
  // The steps did change the parameters (the comparison is not vacuous).
  EXPECT_GT(std::sqrt(moved / den), 1e-3);
}

TEST(Accumulation, MlpFourMicroBatchesEqualOneBatch) {
  ExpectAccumulationEqualsOneBatch("mlp", 32, 4);
}

TEST(Accumulation, LeNetTwoMicroBatchesEqualOneBatch) {
  ExpectAccumulationEqualsOneBatch("lenet", 16, 2);
}

}  // namespace
