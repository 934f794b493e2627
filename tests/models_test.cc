// Reference models: output shapes, parameter counts, gradients for every
// parameter, creation by name.
#include <gtest/gtest.h>

#include <algorithm>
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

// torchvision's resnet18/34/50 (3 channels, 1000 classes): its parameter
// counts, its names, BatchNorm buffers, the Kaiming (fan_out) init and
// zero_init_residual.
TEST(Models, ResNetLayoutAsTorchvision) {
  struct {
    const char *name;
    int64_t params;
    int batch_norms;
    const char *downsample, *last_bn;
  } cases[] = {{"resnet18", 11689512, 20, "layer2.0.downsample.1.running_var", "bn2"},
               {"resnet34", 21797672, 36, "layer4.0.downsample.0.weight", "bn2"},
               {"resnet50", 25557032, 53, "layer1.0.downsample.0.weight", "bn3"}};
  for (const auto &c : cases) {
    dt_resnet_config cfg;
    ASSERT_DT_OK(dt_resnet_config_named(c.name, &cfg));
    EXPECT_EQ(dt_resnet_parameter_count(&cfg), c.params) << c.name;
    if (cfg.blocks[1] == 4 && !cfg.bottleneck)
      continue;  // resnet34: resnet18's blocks, more of them; its 22M draws would slow the test
    cfg.zero_init_residual = 1;
    dt_module *m = nullptr;
    ASSERT_DT_OK(dt_model_resnet(&cfg, 0, &m));
    EXPECT_EQ(dt_module_parameter_count(m), c.params) << c.name;
    EXPECT_EQ(dt_module_num_buffers(m), 3 * c.batch_norms) << c.name;
    bool has_downsample = false;
    for (int i = 0; i < dt_module_num_buffers(m); i++) {
      const char *name = nullptr;
      dt_module_buffer_at(m, i, &name);
      has_downsample |= std::string(name) == c.downsample;
    }
    for (int i = 0; i < dt_module_num_parameters(m); i++) {
      const char *name = nullptr;
      dt_tensor *p = dt_module_parameter_at(m, i, &name);
      std::string n = name;
      has_downsample |= n == c.downsample;
      std::vector<float> v = ToVector(p);
      if (dt_tensor_ndim(p) == 4) {  // kaiming_normal_, fan_out: std sqrt(2 / (out k k))
        const int64_t *sh = dt_tensor_shape(p);
        double want = std::sqrt(2.0 / (double)(sh[0] * sh[2] * sh[3])), ss = 0;
        for (float x : v)
          ss += (double)x * x;
        EXPECT_NEAR(std::sqrt(ss / (double)v.size()), want, 0.1 * want) << c.name << " " << n;
      } else if (n.find(".bn") != std::string::npos ||
                 n.find("downsample.1") != std::string::npos) {
        bool last = n.find(std::string(".") + c.last_bn + ".weight") != std::string::npos;
        float want = n.find(".bias") != std::string::npos || last ? 0.0f : 1.0f;
        for (float x : v)
          ASSERT_EQ(x, want) << c.name << " " << n;
      }
    }
    EXPECT_TRUE(has_downsample) << c.name << " lacks " << c.downsample;
    dt_module_destroy(m);
  }
  dt_resnet_config bad;
  ASSERT_DT_OK(dt_resnet_config_named("resnet18", &bad));
  bad.in_channels = 0;
  dt_module *m = nullptr;
  EXPECT_EQ(dt_model_resnet(&bad, 0, &m), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_resnet_config_named("resnet101", &bad), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("resnet18, resnet34, resnet50"), std::string::npos)
      << dt_last_error();
}

// Forward multiply-adds at 224x224x3, 1000 classes, as torchvision's
// published figures (its docs' "GFLOPS", counted by fvcore: one
// multiply-add is one, convolutions and fc only): 1.814, 3.664 and 4.089 G.
// Within 0.5 %; conv1's share is 118 M (7x7, 112x112 outputs, 64 x 3).
TEST(Models, ResNetForwardMacsAsTorchvision) {
  struct {
    const char *name;
    double gmacs;
  } cases[] = {{"resnet18", 1.814}, {"resnet34", 3.664}, {"resnet50", 4.089}};
  for (const auto &c : cases) {
    dt_resnet_config cfg;
    ASSERT_DT_OK(dt_resnet_config_named(c.name, &cfg));
    double stem = 0.0;
    double macs = dt_resnet_forward_macs(&cfg, 224, 224, &stem);
    EXPECT_NEAR(macs / 1e9, c.gmacs, 0.005 * c.gmacs) << c.name;
    EXPECT_DOUBLE_EQ(stem, 112.0 * 112 * 64 * 3 * 49) << c.name;
  }
  // The small stem on 28x28 grey images, 10 classes: 3x3 stride 1, no
  // max-pool, so 28x28 through layer1 and 4x4 at layer4 (by hand).
  dt_resnet_config small;
  ASSERT_DT_OK(dt_resnet_config_named("resnet18", &small));
  small.in_channels = 1;
  small.num_classes = 10;
  small.small_stem = 1;
  double stem = 0.0;
  double want = 784.0 * 64 * 9 + 4 * 784.0 * 64 * 64 * 9 +
                196.0 * (128 * 64 * 9 + 3 * 128 * 128 * 9 + 64 * 128) +
                49.0 * (256 * 128 * 9 + 3 * 256 * 256 * 9 + 128 * 256) +
                16.0 * (512 * 256 * 9 + 3 * 512 * 512 * 9 + 256 * 512) + 512 * 10;
  EXPECT_DOUBLE_EQ(dt_resnet_forward_macs(&small, 28, 28, &stem), want);
  EXPECT_DOUBLE_EQ(stem, 784.0 * 64 * 9);
}

// The task's ResNet for 28x28 grey images trains (every parameter gets a
// gradient); the small stem keeps 8x8 images to the last stage; another
// channel count is a shape error naming ResNet.
TEST(Models, ResNetTrainsOnGreyImages) {
  dt_module *m = nullptr;
  ASSERT_DT_OK(dt_model_create("resnet18", 1, &m));
  EXPECT_EQ(dt_module_parameter_count(m), 11689512 - 2 * 64 * 49 - 512 * 990 - 990);
  check_train_step(m, 6);
  dt_module_destroy(m);
  ASSERT_DT_OK(dt_model_create("resnet18-small", 1, &m));
  EXPECT_EQ(dt_tensor_dim(dt_module_parameter_at(m, 0, nullptr), 3), 3);
  int64_t shape[4] = {2, 1, 8, 8};
  dt_tensor *x = nullptr, *y = nullptr;
  ASSERT_DT_OK(dt_tensor_zeros(shape, 4, DT_DTYPE_F32, DT_CPU, &x));
  ASSERT_DT_OK(dt_module_call(m, x, &y));
  EXPECT_EQ(dt_tensor_dim(y, 1), 10);
  dt_tensor_release(y);
  dt_tensor_release(x);
  shape[1] = 3;
  ASSERT_DT_OK(dt_tensor_zeros(shape, 4, DT_DTYPE_F32, DT_CPU, &x));
  y = nullptr;
  EXPECT_EQ(dt_module_call(m, x, &y), DT_ERR_SHAPE);
  EXPECT_EQ(y, nullptr);
  EXPECT_NE(std::string(dt_last_error()).find("ResNet takes images (N, 1, H, W)"),
            std::string::npos)
      << dt_last_error();
  dt_tensor_release(x);
  dt_module_destroy(m);
}

// One training step and an eval forward of a model built from cfg, on the
// same images and labels: the logits of both, every parameter's gradient
// and the buffers after the step, in the model's order.
struct StepResult {
  std::vector<float> train_logits, eval_logits;
  std::vector<std::vector<float>> grads, buffers;
};

StepResult ResNetStep(dt_resnet_config cfg, int64_t n, int64_t side) {
  StepResult r;
  dt_module *m = nullptr;
  EXPECT_EQ(dt_model_resnet(&cfg, 7, &m), DT_OK) << dt_last_error();
  std::vector<float> v((size_t)(n * cfg.in_channels * side * side));
  for (size_t i = 0; i < v.size(); i++)
    v[i] = (float)((i * 2654435761u) % 1000u) / 500.0f - 1.0f;
  dt_tensor *x = MakeTensor(v, {n, cfg.in_channels, side, side});
  std::vector<int64_t> labels((size_t)n);
  for (int64_t i = 0; i < n; i++)
    labels[(size_t)i] = i % cfg.num_classes;
  dt_tensor *target = nullptr, *logits = nullptr, *loss = nullptr;
  EXPECT_EQ(dt_tensor_from_host(labels.data(), &n, 1, DT_DTYPE_I64, DT_CPU, &target), DT_OK)
      << dt_last_error();
  EXPECT_EQ(dt_module_call(m, x, &logits), DT_OK) << dt_last_error();
  r.train_logits = ToVector(logits);
  EXPECT_EQ(dt_op_cross_entropy(logits, target, DT_REDUCTION_MEAN, DT_IGNORE_INDEX, &loss), DT_OK)
      << dt_last_error();
  EXPECT_EQ(dt_backward(loss, nullptr), DT_OK) << dt_last_error();
  for (int i = 0; i < dt_module_num_parameters(m); i++)
    r.grads.push_back(ToVector(dt_tensor_grad(dt_module_parameter_at(m, i, nullptr))));
  for (int i = 0; i < dt_module_num_buffers(m); i++) {
    dt_tensor *b = dt_module_buffer_at(m, i, nullptr);
    if (dt_tensor_dtype(b) == DT_DTYPE_F32)
      r.buffers.push_back(ToVector(b));
  }
  dt_module_train(m, 0);
  dt_tensor *eval = nullptr;
  EXPECT_EQ(dt_module_call(m, x, &eval), DT_OK) << dt_last_error();
  r.eval_logits = ToVector(eval);
  for (dt_tensor *t : {eval, loss, logits, target, x})
    dt_tensor_release(t);
  dt_module_destroy(m);
  return r;
}

void ExpectClose(const std::vector<float> &got, const std::vector<float> &want, float tol,
                 const std::string &what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (float w : want)
    scale = std::max(scale, (double)std::fabs(w));
  for (size_t i = 0; i < got.size(); i++)
    ASSERT_NEAR(got[i], want[i], tol * (scale + 1e-6)) << what << " element " << i;
}

// Channels-last (dt_resnet_config.channels_last, --channels-last) is the
// same model: the same parameters, and the NCHW model's logits, gradients
// and running statistics to rounding (the batch norms sum their
// statistics in another order), with the max-pool stem and the small one.
TEST(Models, ResNetChannelsLastMatchesNchw) {
  for (int small : {0, 1}) {
    dt_resnet_config cfg;
    ASSERT_DT_OK(dt_resnet_config_named("resnet18", &cfg));
    cfg.num_classes = 10;
    cfg.small_stem = small;
    StepResult want = ResNetStep(cfg, 4, small ? 12 : 40);
    cfg.channels_last = 1;
    StepResult got = ResNetStep(cfg, 4, small ? 12 : 40);
    std::string s = small ? "small stem: " : "stem with max-pool: ";
    ExpectClose(got.train_logits, want.train_logits, 1e-4f, s + "training logits");
    ExpectClose(got.eval_logits, want.eval_logits, 1e-4f, s + "eval logits");
    ASSERT_EQ(got.grads.size(), want.grads.size());
    for (size_t i = 0; i < got.grads.size(); i++)
      ExpectClose(got.grads[i], want.grads[i], 1e-3f, s + "gradient " + std::to_string(i));
    ASSERT_EQ(got.buffers.size(), want.buffers.size());
    for (size_t i = 0; i < got.buffers.size(); i++)
      ExpectClose(got.buffers[i], want.buffers[i], 1e-4f, s + "buffer " + std::to_string(i));
  }
}

}  // namespace
