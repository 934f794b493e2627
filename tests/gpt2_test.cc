// GPT-2 (models/gpt2.c): parameter count, names and initialisation; the
// forward against a plain loop-by-loop reference written from the GPT-2
// definition; the tied embedding's gradient (both uses) against finite
// differences and its grad-ready hook firing after both.
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
#include "models/tasks.h"
}
#include "tests/test_util.h"

namespace {

using dtt::ToVector;

// A configuration small enough for loops: 2 layers, 2 heads, C 8, context
// 6, 11 tokens padded to 16.
dt_gpt2_config tiny_config() { return dt_gpt2_config{2, 2, 8, 6, 11, 16}; }

std::vector<float> param(dt_module *m, const std::string &name) {
  for (int i = 0; i < dt_module_num_parameters(m); i++) {
    const char *n = nullptr;
    dt_tensor *p = dt_module_parameter_at(m, i, &n);
    if (name == n)
      return ToVector(p);
  }
  ADD_FAILURE() << "no parameter " << name;
  return {};
}

using Mat = std::vector<double>;  // row-major (rows, cols)

// y (T, out) = x (T, in) w^T + b, w (out, in)
Mat linear(const Mat &x, int64_t T, int64_t in, const std::vector<float> &w,
           const std::vector<float> &b, int64_t out) {
  Mat y((size_t)(T * out));
  for (int64_t t = 0; t < T; t++)
    for (int64_t o = 0; o < out; o++) {
      double s = b.empty() ? 0.0 : b[(size_t)o];
      for (int64_t i = 0; i < in; i++)
        s += x[(size_t)(t * in + i)] * w[(size_t)(o * in + i)];
      y[(size_t)(t * out + o)] = s;
    }
  return y;
}

Mat layer_norm(const Mat &x, int64_t T, int64_t C, const std::vector<float> &g,
               const std::vector<float> &b) {
  Mat y(x.size());
  for (int64_t t = 0; t < T; t++) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; c++)
      mean += x[(size_t)(t * C + c)] / (double)C;
    for (int64_t c = 0; c < C; c++) {
      double d = x[(size_t)(t * C + c)] - mean;
      var += d * d / (double)C;
    }
    for (int64_t c = 0; c < C; c++)
      y[(size_t)(t * C + c)] =
          (x[(size_t)(t * C + c)] - mean) / std::sqrt(var + 1e-5) * g[(size_t)c] + b[(size_t)c];
  }
  return y;
}

// One sequence through GPT-2, written from the paper's definition.
Mat reference_logits(dt_module *m, const dt_gpt2_config &c, const std::vector<int32_t> &tokens) {
  const int64_t T = (int64_t)tokens.size(), C = c.n_embd, H = c.n_head, hd = C / H;
  std::vector<float> wte = param(m, "wte.weight"), wpe = param(m, "wpe.weight");
  Mat x((size_t)(T * C));
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < C; i++)
      x[(size_t)(t * C + i)] = wte[(size_t)(tokens[(size_t)t] * C + i)] + wpe[(size_t)(t * C + i)];
  for (int l = 0; l < c.n_layer; l++) {
    std::string p = "h." + std::to_string(l) + ".";
    Mat h = layer_norm(x, T, C, param(m, p + "ln_1.weight"), param(m, p + "ln_1.bias"));
    Mat qkv = linear(h, T, C, param(m, p + "attn.c_attn.weight"), param(m, p + "attn.c_attn.bias"),
                     3 * C);
    Mat att((size_t)(T * C), 0.0);
    for (int64_t head = 0; head < H; head++)
      for (int64_t i = 0; i < T; i++) {
        std::vector<double> w((size_t)(i + 1));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; j++) {
          double s = 0;
          for (int64_t d = 0; d < hd; d++)
            s += qkv[(size_t)(i * 3 * C + head * hd + d)] *
                 qkv[(size_t)(j * 3 * C + C + head * hd + d)];
          w[(size_t)j] = s / std::sqrt((double)hd);
          mx = std::max(mx, w[(size_t)j]);
        }
        for (int64_t j = 0; j <= i; j++)
          sum += (w[(size_t)j] = std::exp(w[(size_t)j] - mx));
        for (int64_t j = 0; j <= i; j++)
          for (int64_t d = 0; d < hd; d++)
            att[(size_t)(i * C + head * hd + d)] +=
                w[(size_t)j] / sum * qkv[(size_t)(j * 3 * C + 2 * C + head * hd + d)];
      }
    Mat a =
        linear(att, T, C, param(m, p + "attn.c_proj.weight"), param(m, p + "attn.c_proj.bias"), C);
    for (size_t i = 0; i < x.size(); i++)
      x[i] += a[i];
    Mat h2 = layer_norm(x, T, C, param(m, p + "ln_2.weight"), param(m, p + "ln_2.bias"));
    Mat f = linear(h2, T, C, param(m, p + "mlp.c_fc.weight"), param(m, p + "mlp.c_fc.bias"), 4 * C);
    for (double &v : f)
      v = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    Mat g =
        linear(f, T, 4 * C, param(m, p + "mlp.c_proj.weight"), param(m, p + "mlp.c_proj.bias"), C);
    for (size_t i = 0; i < x.size(); i++)
      x[i] += g[i];
  }
  Mat z = layer_norm(x, T, C, param(m, "ln_f.weight"), param(m, "ln_f.bias"));
  return linear(z, T, C, wte, {}, c.padded_vocab);  // the tied head: wte
}

// Draws every parameter uniformly (biases and LayerNorm gains too), so the
// reference comparison does not rest on the zero biases of the init.
void randomise(dt_module *m, uint64_t seed) {
  for (int i = 0; i < dt_module_num_parameters(m); i++) {
    dt_tensor *p = dt_module_parameter_at(m, i, nullptr);
    ASSERT_DT_OK(dtt::CopyFromHost(
        p, dtt::RandomValues((size_t)dt_tensor_numel(p), seed + (uint64_t)i, -0.5f, 0.5f)));
  }
}

TEST(Gpt2, Gpt2ConfigHas124475904Parameters) {
  dt_gpt2_config c;
  ASSERT_DT_OK(dt_gpt2_config_named("gpt2", &c));
  EXPECT_EQ(dt_gpt2_parameter_count(&c), 124475904);  // llm.c prints this, padded vocab included
  dt_module *m = nullptr;
  ASSERT_DT_OK(dt_model_gpt2(&c, 0, &m));
  EXPECT_EQ(dt_module_parameter_count(m), 124475904);
  EXPECT_EQ(dt_module_num_parameters(m), 2 + 12 * 12 + 2);
  dt_module_destroy(m);
}

TEST(Gpt2, NamedConfigurations) {
  dt_gpt2_config c;
  ASSERT_DT_OK(dt_gpt2_config_named("gpt2-tiny", &c));
  EXPECT_EQ(c.n_layer, 4);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_embd, 128);
  EXPECT_EQ(c.block_size, 64);
  EXPECT_EQ(c.vocab, 50257);
  EXPECT_EQ(c.padded_vocab, 50304);
  ASSERT_DT_OK(dt_gpt2_config_named("gpt2-xl", &c));
  EXPECT_EQ(dt_gpt2_parameter_count(&c), 1557686400);  // llm.c's padded count for gpt2-xl
  EXPECT_EQ(dt_gpt2_config_named("gpt3", &c), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("gpt2-medium"), std::string::npos) << dt_last_error();
  // 6 N + 12 L T C
  ASSERT_DT_OK(dt_gpt2_config_named("gpt2", &c));
  EXPECT_DOUBLE_EQ(dt_gpt2_flops_per_token(&c, 1024), 6.0 * 124475904 + 12.0 * 12 * 1024 * 768);
}

TEST(Gpt2, NamesOrderAndInitialisation) {
  dt_gpt2_config c;
  ASSERT_DT_OK(dt_gpt2_config_named("gpt2-tiny", &c));
  dt_module *m = nullptr;
  ASSERT_DT_OK(dt_model_gpt2(&c, 7, &m));
  EXPECT_EQ(dt_module_parameter_count(m), dt_gpt2_parameter_count(&c));
  const char *expected[] = {"wte.weight",
                            "wpe.weight",
                            "h.0.ln_1.weight",
                            "h.0.ln_1.bias",
                            "h.0.attn.c_attn.weight",
                            "h.0.attn.c_attn.bias",
                            "h.0.attn.c_proj.weight",
                            "h.0.attn.c_proj.bias",
                            "h.0.ln_2.weight",
                            "h.0.ln_2.bias",
                            "h.0.mlp.c_fc.weight",
                            "h.0.mlp.c_fc.bias",
                            "h.0.mlp.c_proj.weight",
                            "h.0.mlp.c_proj.bias",
                            "h.1.ln_1.weight"};
  for (int i = 0; i < (int)(sizeof expected / sizeof expected[0]); i++) {
    const char *name = nullptr;
    dt_module_parameter_at(m, i, &name);
    EXPECT_STREQ(name, expected[i]) << i;
  }
  const char *last = nullptr;
  dt_module_parameter_at(m, dt_module_num_parameters(m) - 1, &last);
  EXPECT_STREQ(last, "ln_f.bias");
  // No separate head: the LM head is wte.
  EXPECT_EQ(dt_module_num_parameters(m), 2 + 12 * 4 + 2);

  auto stddev = [](const std::vector<float> &v) {
    double s = 0, s2 = 0;
    for (float x : v) {
      s += x;
      s2 += (double)x * x;
    }
    double mean = s / (double)v.size();
    return std::sqrt(s2 / (double)v.size() - mean * mean);
  };
  EXPECT_NEAR(stddev(param(m, "wte.weight")), 0.02, 0.0005);
  EXPECT_NEAR(stddev(param(m, "h.0.attn.c_attn.weight")), 0.02, 0.001);
  EXPECT_NEAR(stddev(param(m, "h.0.mlp.c_fc.weight")), 0.02, 0.001);
  double proj = 0.02 / std::sqrt(2.0 * 4);
  EXPECT_NEAR(stddev(param(m, "h.3.attn.c_proj.weight")), proj, 0.05 * proj);
  EXPECT_NEAR(stddev(param(m, "h.3.mlp.c_proj.weight")), proj, 0.05 * proj);
  for (float v : param(m, "h.2.mlp.c_fc.bias"))
    ASSERT_EQ(v, 0.0f);
  for (float v : param(m, "h.1.ln_2.weight"))
    ASSERT_EQ(v, 1.0f);
  for (float v : param(m, "ln_f.bias"))
    ASSERT_EQ(v, 0.0f);
  dt_module_destroy(m);
}

TEST(Gpt2, ForwardMatchesTheReference) {
  dt_gpt2_config c = tiny_config();
  dt_module *m = nullptr;
  ASSERT_DT_OK(dt_model_gpt2(&c, 3, &m));
  randomise(m, 100);
  const std::vector<std::vector<int32_t>> seqs = {{3, 10, 0, 7, 7, 1}, {5, 2, 9, 4, 0, 10}};
  std::vector<int32_t> flat;
  for (const auto &s : seqs)
    flat.insert(flat.end(), s.begin(), s.end());
  int64_t shape[2] = {2, 6};
  dt_tensor *x = nullptr, *y = nullptr;
  ASSERT_DT_OK(dt_tensor_from_host(flat.data(), shape, 2, DT_DTYPE_I32, DT_CPU, &x));
  ASSERT_DT_OK(dt_module_call(m, x, &y));
  ASSERT_EQ(dtt::Shape(y), (std::vector<int64_t>{2, 6, 16})) << "logits over the padded vocabulary";
  std::vector<float> got = ToVector(y);
  double worst = 0;
  for (size_t b = 0; b < seqs.size(); b++) {
    Mat want = reference_logits(m, c, seqs[b]);
    for (size_t i = 0; i < want.size(); i++)
      worst = std::max(worst,
                       std::fabs(want[i] - got[b * want.size() + i]) / (1.0 + std::fabs(want[i])));
  }
  EXPECT_LT(worst, 2e-5);
  // A shorter sequence: the first positions' logits do not see the future.
  int64_t short_shape[2] = {1, 3};
  dt_tensor *xs = nullptr, *ys = nullptr;
  ASSERT_DT_OK(dt_tensor_from_host(seqs[0].data(), short_shape, 2, DT_DTYPE_I32, DT_CPU, &xs));
  ASSERT_DT_OK(dt_module_call(m, xs, &ys));
  std::vector<float> prefix = ToVector(ys);
  for (size_t i = 0; i < prefix.size(); i++)
    EXPECT_NEAR(prefix[i], got[i], 1e-5) << i;
  for (dt_tensor *t : {x, y, xs, ys})
    dt_tensor_release(t);
  dt_module_destroy(m);
}

TEST(Gpt2, ContextLongerThanTheModelsIsAShapeError) {
  dt_gpt2_config c = tiny_config();
  dt_module *m = nullptr;
  ASSERT_DT_OK(dt_model_gpt2(&c, 3, &m));
  std::vector<int32_t> ids(7, 1);
  int64_t shape[2] = {1, 7};
  dt_tensor *x = nullptr, *y = nullptr;
  ASSERT_DT_OK(dt_tensor_from_host(ids.data(), shape, 2, DT_DTYPE_I32, DT_CPU, &x));
  EXPECT_EQ(dt_module_call(m, x, &y), DT_ERR_SHAPE);
  EXPECT_NE(std::string(dt_last_error()).find("T <= 6"), std::string::npos) << dt_last_error();
  dt_tensor_release(x);
  dt_module_destroy(m);
  dt_gpt2_config bad = tiny_config();
  bad.n_head = 3;  // 8 % 3 != 0
  EXPECT_EQ(dt_model_gpt2(&bad, 0, &m), DT_ERR_INVALID_ARG);
  bad = tiny_config();
  bad.padded_vocab = 10;
  EXPECT_EQ(dt_model_gpt2(&bad, 0, &m), DT_ERR_INVALID_ARG);
}

// The mean next-token loss of a fixed batch.
double batch_loss(dt_module *m, dt_tensor *x, dt_tensor *y, bool backward) {
  dt_tensor *logits = nullptr, *loss = nullptr;
  EXPECT_EQ(dt_module_call(m, x, &logits), DT_OK) << dt_last_error();
  EXPECT_EQ(dt_task_loss_next_token_of(logits, y, 11, DT_REDUCTION_MEAN, &loss), DT_OK)
      << dt_last_error();
  double v = NAN;
  EXPECT_EQ(dt_tensor_item(loss, 0, &v), DT_OK);
  if (backward) {
    EXPECT_EQ(dt_backward(loss, nullptr), DT_OK) << dt_last_error();
  }
  dt_tensor_release(loss);
  dt_tensor_release(logits);
  return v;
}

// wte is used twice (embedding lookup and LM head): its gradient is the
// sum of both, which finite differences of the loss confirm for a row that
// is both an input token and a target, a row that is only a head row, and
// a padded row (no gradient at all); the grad-ready hook fires once, after
// both contributions are in.
TEST(Gpt2, TiedEmbeddingGradientHasBothUses) {
  dt_gpt2_config c = tiny_config();
  dt_module *m = nullptr;
  ASSERT_DT_OK(dt_model_gpt2(&c, 5, &m));
  randomise(m, 300);
  std::vector<int32_t> in = {3, 10, 0, 7, 7, 1}, tgt = {10, 0, 7, 7, 1, 4};
  int64_t shape[2] = {1, 6};
  dt_tensor *x = nullptr, *y = nullptr;
  ASSERT_DT_OK(dt_tensor_from_host(in.data(), shape, 2, DT_DTYPE_I32, DT_CPU, &x));
  ASSERT_DT_OK(dt_tensor_from_host(tgt.data(), shape, 2, DT_DTYPE_I32, DT_CPU, &y));
  dt_tensor *wte = dt_module_parameter_at(m, 0, nullptr);
  dtt::GradReadyRecord rec;
  dt_hook_handle h = 0;
  ASSERT_DT_OK(dt_tensor_add_grad_ready_hook(wte, dtt::RecordGradReady, &rec, &h));
  batch_loss(m, x, y, true);
  EXPECT_EQ(rec.fired, 1);
  std::vector<float> grad = ToVector(dt_tensor_grad(wte));
  EXPECT_EQ(rec.grad, grad) << "the hook fired before the last use's gradient";

  std::vector<float> w = ToVector(wte);
  const int64_t C = c.n_embd;
  const double eps = 1e-2;
  for (int64_t row : {7, 2, 13}) {  // input and target; head only; padding
    for (int64_t col : {0, 5}) {
      size_t k = (size_t)(row * C + col);
      std::vector<float> p = w;
      p[k] = w[k] + (float)eps;
      ASSERT_DT_OK(dtt::CopyFromHost(wte, p));
      double up = batch_loss(m, x, y, false);
      p[k] = w[k] - (float)eps;
      ASSERT_DT_OK(dtt::CopyFromHost(wte, p));
      double down = batch_loss(m, x, y, false);
      double fd = (up - down) / (2 * eps);
      EXPECT_NEAR(grad[k], fd, 2e-3 + 2e-2 * std::fabs(fd)) << "row " << row << " col " << col;
      if (row >= c.vocab) {
        EXPECT_EQ(grad[k], 0.0f) << "a padded row is no token";
      }
    }
  }
  ASSERT_DT_OK(dtt::CopyFromHost(wte, w));
  dt_tensor_release(x);
  dt_tensor_release(y);
  dt_module_destroy(m);
}

}  // namespace
