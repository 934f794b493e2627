// Reference models: output shapes, parameter counts, gradients for every
// parameter, creation by name.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

extern "C" {
#include "core/autograd.h"
#include "core/module.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "models/models.h"
}
#include "tests/test_util.h"

namespace {

using dtt::MakeTensor;
using dtt::ToVector;

// A batch of n MNIST-shaped images (n,1,28,28) with values in [0,1).
dt_tensor *images(int64_t n) {
  std::vector<float> v((size_t)(n * 28 * 28));
  for (size_t i = 0; i < v.size(); i++)
    v[i] = (float)((i * 2654435761u) % 1000u) / 1000.0f;
  return MakeTensor(v, {n, 1, 28, 28});
}

// Forward of a batch, cross-entropy against labels i % 10, backward; every
// parameter must get a finite gradient, and each parameter tensor must get
// some nonzero gradient.
void check_train_step(dt_module *m, int64_t n) {
  dt_tensor *x = images(n);
  std::vector<int64_t> labels((size_t)n);
  for (int64_t i = 0; i < n; i++)
    labels[(size_t)i] = i % 10;
  dt_tensor *target = nullptr, *logits = nullptr, *loss = nullptr;
  ASSERT_DT_OK(dt_tensor_from_host(labels.data(), &n, 1, DT_DTYPE_I64, DT_CPU, &target));
  ASSERT_DT_OK(dt_module_call(m, x, &logits));
  ASSERT_EQ(dt_tensor_ndim(logits), 2);
  EXPECT_EQ(dt_tensor_dim(logits, 0), n);
  EXPECT_EQ(dt_tensor_dim(logits, 1), 10);
  ASSERT_DT_OK(dt_op_cross_entropy(logits, target, DT_REDUCTION_MEAN, DT_IGNORE_INDEX, &loss));
  double l = 0;
  ASSERT_DT_OK(dt_tensor_item(loss, 0, &l));
  EXPECT_TRUE(std::isfinite(l));
  EXPECT_GT(l, 0.0);
  EXPECT_LT(l, 10.0);  // about ln(10) at initialisation
  ASSERT_DT_OK(dt_backward(loss, nullptr));
  for (int i = 0; i < dt_module_num_parameters(m); i++) {
    const char *name = nullptr;
    dt_tensor *p = dt_module_parameter_at(m, i, &name);
    dt_tensor *g = dt_tensor_grad(p);
    ASSERT_NE(g, nullptr) << name << " got no gradient";
    EXPECT_EQ(dt_tensor_numel(g), dt_tensor_numel(p)) << name;
    bool nonzero = false;
    for (float v : ToVector(g)) {
      ASSERT_TRUE(std::isfinite(v)) << name;
      nonzero |= v != 0.0f;
    }
    EXPECT_TRUE(nonzero) << name << " has an all-zero gradient";
  }
  dt_tensor_release(loss);
  dt_tensor_release(logits);
  dt_tensor_release(target);
  dt_tensor_release(x);
}

TEST(Models, MlpShapesCountAndGradients) {
  static const int sizes[] = {784, 512, 512, 10};
  dt_module *m = nullptr;
  ASSERT_DT_OK(dt_model_mlp(sizes, 4, 0, &m));
  EXPECT_EQ(dt_module_parameter_count(m), 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10);
  EXPECT_EQ(dt_module_parameter_count(m), 669706);
  EXPECT_EQ(dt_module_num_parameters(m), 6);
  const char *name = nullptr;
  dt_module_parameter_at(m, 0, &name);
  EXPECT_STREQ(name, "1.weight");
  dt_module_parameter_at(m, 5, &name);
  EXPECT_STREQ(name, "5.bias");
  check_train_step(m, 8);
  dt_module_destroy(m);
}

TEST(Models, LeNetShapesCountAndGradients) {
  dt_module *m = nullptr;
  ASSERT_DT_OK(dt_model_lenet5(10, 0, &m));
  EXPECT_EQ(dt_module_parameter_count(m), 61706);
  check_train_step(m, 6);
  dt_module_destroy(m);
}

TEST(Models, LeNetOtherClassCount) {
  dt_module *m = nullptr;
  ASSERT_DT_OK(dt_model_lenet5(7, 0, &m));
  EXPECT_EQ(dt_module_parameter_count(m), 61706 - 3 * 84 - 3);
  dt_tensor *x = images(2), *y = nullptr;
  ASSERT_DT_OK(dt_module_call(m, x, &y));
  EXPECT_EQ(dt_tensor_dim(y, 0), 2);
  EXPECT_EQ(dt_tensor_dim(y, 1), 7);
  dt_tensor_release(y);
  dt_tensor_release(x);
  dt_module_destroy(m);
}

TEST(Models, CreateByName) {
  dt_module *m = nullptr;
  ASSERT_DT_OK(dt_model_create("mlp", 1, &m));
  EXPECT_EQ(dt_module_parameter_count(m), 669706);
  dt_module_destroy(m);
  ASSERT_DT_OK(dt_model_create("lenet", 1, &m));
  EXPECT_EQ(dt_module_parameter_count(m), 61706);
  dt_module_destroy(m);

  m = nullptr;
  EXPECT_EQ(dt_model_create("resnet9000", 1, &m), DT_ERR_INVALID_ARG);
  EXPECT_EQ(m, nullptr);
  std::string err = dt_last_error();
  EXPECT_NE(err.find("resnet9000"), std::string::npos) << err;
  EXPECT_NE(err.find("mlp"), std::string::npos) << err;
  EXPECT_NE(err.find("lenet"), std::string::npos) << err;
  EXPECT_EQ(dt_model_create(nullptr, 1, &m), DT_ERR_INVALID_ARG);
}

TEST(Models, BadArguments) {
  dt_module *m = nullptr;
  const int one[] = {784};
  const int bad[] = {784, 0, 10};
  EXPECT_EQ(dt_model_mlp(one, 1, 0, &m), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_model_mlp(bad, 3, 0, &m), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_model_lenet5(0, 0, &m), DT_ERR_INVALID_ARG);
  EXPECT_EQ(m, nullptr);
}

TEST(Models, MlpInputOfWrongSizeIsAShapeError) {
  static const int sizes[] = {784, 10};
  dt_module *m = nullptr;
  ASSERT_DT_OK(dt_model_mlp(sizes, 2, 0, &m));
  int64_t shape[2] = {2, 100};
  dt_tensor *x = nullptr, *y = nullptr;
  ASSERT_DT_OK(dt_tensor_zeros(shape, 2, DT_DTYPE_F32, DT_CPU, &x));
  EXPECT_EQ(dt_module_call(m, x, &y), DT_ERR_SHAPE);
  EXPECT_EQ(y, nullptr);
  dt_tensor_release(x);
  dt_module_destroy(m);
}

}  // namespace
