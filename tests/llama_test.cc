// The Llama family (models/llama.c): sizes and parameter counts, names and
// initialisation; the forward, tied and untied, against a loop-by-loop
// reference written from Hugging Face's LlamaForCausalLM (RMS norm,
// rotate_half RoPE, each key/value head serving H / Hkv consecutive query
// heads, SwiGLU); bad configurations.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

extern "C" {
#include "core/module.h"
#include "core/tensor.h"
#include "models/models.h"
#include "models/tasks.h"
}
#include "tests/test_util.h"

namespace {

// 2 layers, 4 heads sharing 2 KV heads of 4 columns, FFN 12, context 6,
// 11 tokens padded to 16.
dt_llama_config TinyConfig(bool tied) {
  return dt_llama_config{2, 4, 2, 16, 12, 6, 11, 16, 10000.0f, 1e-5f, tied ? 1 : 0};
}

using Params = std::map<std::string, std::vector<float>>;

Params AllParams(dt_module *m) {
  Params p;
  for (int i = 0; i < dt_module_num_parameters(m); i++) {
    const char *name = nullptr;
    dt_tensor *t = dt_module_parameter_at(m, i, &name);
    p[name] = dtt::ToVector(t);
  }
  return p;
}

using Rows = std::vector<std::vector<double>>;  // (T, width)

// x (T, in) times w^T, w (out, in) row-major
Rows Times(const Rows &x, const std::vector<float> &w) {
  const size_t in = x[0].size(), out = w.size() / in;
  Rows y(x.size(), std::vector<double>(out, 0.0));
  for (size_t t = 0; t < x.size(); t++)
    for (size_t k = 0; k < out * in; k++)
      y[t][k / in] += x[t][k % in] * w[k];
  return y;
}

Rows RmsNorm(const Rows &x, const std::vector<float> &w) {
  Rows y = x;
  for (std::vector<double> &r : y) {
    double ss = 0;
    for (double v : r)
      ss += v * v / (double)r.size();
    for (size_t j = 0; j < r.size(); j++)
      r[j] *= w[j] / std::sqrt(ss + 1e-5);
  }
  return y;
}

// Hugging Face's apply_rotary_pos_emb on `heads` heads of hd: x * cos +
// rotate_half(x) * sin, rotate_half(x) = [-x2, x1], at position t
void Rotate(Rows &x, int heads, int hd, double theta) {
  for (size_t t = 0; t < x.size(); t++)
    for (int h = 0; h < heads; h++) {
      std::vector<double> v(x[t].begin() + h * hd, x[t].begin() + (h + 1) * hd);
      for (int i = 0; i < hd; i++) {
        const double a = (double)t * std::pow(theta, -2.0 * (i % (hd / 2)) / hd);
        const double half = i < hd / 2 ? -v[(size_t)(i + hd / 2)] : v[(size_t)(i - hd / 2)];
        x[t][(size_t)(h * hd + i)] = v[(size_t)i] * std::cos(a) + half * std::sin(a);
      }
    }
}

// One sequence through the model, from the definition.
Rows ReferenceLogits(const Params &p, const dt_llama_config &c, const std::vector<int32_t> &ids) {
  const int H = c.n_head, G = c.n_head / c.n_kv_head, hd = c.n_embd / c.n_head;
  const std::vector<float> &emb = p.at("embed_tokens.weight");
  Rows x;
  for (int32_t id : ids)
    x.emplace_back(emb.begin() + id * c.n_embd, emb.begin() + (id + 1) * c.n_embd);
  for (int l = 0; l < c.n_layer; l++) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    Rows h = RmsNorm(x, p.at(pre + "input_layernorm.weight"));
    Rows q = Times(h, p.at(pre + "self_attn.q_proj.weight"));
    Rows k = Times(h, p.at(pre + "self_attn.k_proj.weight"));
    Rows v = Times(h, p.at(pre + "self_attn.v_proj.weight"));
    Rotate(q, H, hd, c.rope_theta);
    Rotate(k, c.n_kv_head, hd, c.rope_theta);
    Rows att(x.size(), std::vector<double>((size_t)c.n_embd, 0.0));
    for (int head = 0; head < H; head++) {
      const int kvh = head / G;  // repeat_kv: query head h reads KV head h / G
      for (size_t i = 0; i < x.size(); i++) {
        std::vector<double> w(i + 1);
        double sum = 0;
        for (size_t j = 0; j <= i; j++) {
          double s = 0;
          for (int d = 0; d < hd; d++)
            s += q[i][(size_t)(head * hd + d)] * k[j][(size_t)(kvh * hd + d)];
          sum += w[j] = std::exp(s / std::sqrt((double)hd));
        }
        for (size_t j = 0; j <= i; j++)
          for (int d = 0; d < hd; d++)
            att[i][(size_t)(head * hd + d)] += w[j] / sum * v[j][(size_t)(kvh * hd + d)];
      }
    }
    Rows o = Times(att, p.at(pre + "self_attn.o_proj.weight"));
    for (size_t t = 0; t < x.size(); t++)
      for (size_t j = 0; j < x[t].size(); j++)
        x[t][j] += o[t][j];
    Rows h2 = RmsNorm(x, p.at(pre + "post_attention_layernorm.weight"));
    Rows g = Times(h2, p.at(pre + "mlp.gate_proj.weight"));
    Rows u = Times(h2, p.at(pre + "mlp.up_proj.weight"));
    for (size_t t = 0; t < g.size(); t++)
      for (size_t j = 0; j < g[t].size(); j++)
        g[t][j] = g[t][j] / (1.0 + std::exp(-g[t][j])) * u[t][j];
    Rows f = Times(g, p.at(pre + "mlp.down_proj.weight"));
    for (size_t t = 0; t < x.size(); t++)
      for (size_t j = 0; j < x[t].size(); j++)
        x[t][j] += f[t][j];
  }
  return Times(RmsNorm(x, p.at("norm.weight")),
               p.at(c.tied ? "embed_tokens.weight" : "lm_head.weight"));
}

TEST(Llama, SizesAndParameterCounts) {
  dt_llama_config c;
  ASSERT_DT_OK(dt_llama_config_named("llama-tiny", &c));
  EXPECT_EQ(dt_llama_parameter_count(&c), 7226496);
  dt_module *m = nullptr;
  ASSERT_DT_OK(dt_model_llama(&c, 0, &m));
  EXPECT_EQ(dt_module_parameter_count(m), 7226496);
  EXPECT_EQ(dt_module_num_parameters(m), 1 + 4 * 9 + 1) << "tied: no lm_head";
  dt_module_destroy(m);
  auto shape = [](const dt_llama_config &k) {
    return std::vector<int>{k.n_layer, k.n_head, k.n_kv_head, k.n_embd, k.ffn};
  };
  ASSERT_DT_OK(dt_llama_config_named("llama-135m", &c));  // SmolLM2-135M's shape
  EXPECT_EQ(shape(c), (std::vector<int>{30, 9, 3, 576, 1536}));
  EXPECT_EQ(dt_llama_parameter_count(&c), 135178560);
  ASSERT_DT_OK(dt_llama_config_named("llama-1b", &c));  // Llama-3.2-1B's
  EXPECT_EQ(shape(c), (std::vector<int>{16, 32, 8, 2048, 8192}));
  EXPECT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(dt_llama_parameter_count(&c), 1076168704);
  EXPECT_DOUBLE_EQ(dt_llama_flops_per_token(&c, 2048), 6.0 * 1076168704 + 12.0 * 16 * 2048 * 2048);
  EXPECT_EQ(dt_llama_config_named("llama-70b", &c), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("llama-135m"), std::string::npos) << dt_last_error();
  const dt_task *t = nullptr;
  ASSERT_DT_OK(dt_task_find("llama-tiny", &t));
  EXPECT_EQ(t->max_context, 64);
}

TEST(Llama, NamesOrderAndInitialisation) {
  dt_llama_config c = TinyConfig(false);
  dt_module *m = nullptr;
  ASSERT_DT_OK(dt_model_llama(&c, 7, &m));
  EXPECT_EQ(dt_module_parameter_count(m), 3280);
  EXPECT_EQ(dt_module_parameter_count(m), dt_llama_parameter_count(&c));
  std::vector<std::string> expected = {"embed_tokens.weight"};
  for (const char *part : {"input_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                           "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm",
                           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
    expected.push_back(std::string("layers.0.") + part + ".weight");
  expected.push_back("layers.1.input_layernorm.weight");
  std::vector<std::string> names;
  for (int i = 0; i < dt_module_num_parameters(m); i++) {
    const char *name = nullptr;
    dt_module_parameter_at(m, i, &name);
    names.emplace_back(name);
  }
  ASSERT_EQ(names.size(), 1u + 2 * 9 + 2);
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + 11), expected);
  EXPECT_EQ(names.back(), "lm_head.weight");
  EXPECT_EQ(names[names.size() - 2], "norm.weight");
  Params p = AllParams(m);
  EXPECT_EQ(p.size(), 1u + 2 * 9 + 2);
  EXPECT_EQ(p.at("layers.1.self_attn.k_proj.weight").size(), 8u * 16) << "2 KV heads of 4";
  EXPECT_EQ(p.at("lm_head.weight").size(), 16u * 16);
  for (const auto &kv : p) {
    bool norm = kv.first.find("layernorm") != std::string::npos || kv.first == "norm.weight";
    double s2 = 0;
    for (float v : kv.second) {
      if (norm) {
        ASSERT_EQ(v, 1.0f) << kv.first;
      }
      s2 += (double)v * v;
    }
    if (!norm && kv.second.size() >= 192) {
      EXPECT_NEAR(std::sqrt(s2 / (double)kv.second.size()), 0.02, 0.004) << kv.first;
    }
  }
  dt_module_destroy(m);
}

TEST(Llama, ForwardMatchesTheReference) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    dt_llama_config c = TinyConfig(tied);
    dt_module *m = nullptr;
    ASSERT_DT_OK(dt_model_llama(&c, 3, &m));
    for (int i = 0; i < dt_module_num_parameters(m); i++) {  // every weight, norms too
      dt_tensor *w = dt_module_parameter_at(m, i, nullptr);
      ASSERT_DT_OK(dtt::CopyFromHost(
          w, dtt::RandomValues((size_t)dt_tensor_numel(w), 100 + (uint64_t)i, -0.6f, 0.6f)));
    }
    const std::vector<int32_t> ids = {3, 10, 0, 7, 7, 1, 5, 2, 9, 4, 0, 10};
    int64_t shape[2] = {2, 6};
    dt_tensor *x = nullptr, *y = nullptr;
    ASSERT_DT_OK(dt_tensor_from_host(ids.data(), shape, 2, DT_DTYPE_I32, DT_CPU, &x));
    ASSERT_DT_OK(dt_module_call(m, x, &y));
    ASSERT_EQ(dtt::Shape(y), (std::vector<int64_t>{2, 6, 16}));
    std::vector<float> got = dtt::ToVector(y);
    Params p = AllParams(m);
    double worst = 0;
    for (size_t b = 0; b < 2; b++) {
      Rows want = ReferenceLogits(
          p, c, std::vector<int32_t>(ids.begin() + 6 * b, ids.begin() + 6 * (b + 1)));
      for (size_t t = 0; t < 6; t++)
        for (size_t v = 0; v < 16; v++)
          worst = std::max(worst, std::fabs(want[t][v] - got[(b * 6 + t) * 16 + v]) /
                                      (1.0 + std::fabs(want[t][v])));
    }
    EXPECT_LT(worst, 2e-5);
    dt_tensor_release(y);
    dt_tensor_release(x);
    dt_module_destroy(m);
  }
}

TEST(Llama, BadConfigurationsAndContexts) {
  const dt_llama_config c = TinyConfig(true);
  dt_module *m = nullptr;
  ASSERT_DT_OK(dt_model_llama(&c, 3, &m));
  dtt::TensorRef seven(dtt::MakeIndexTensor(std::vector<int64_t>(7, 1), {1, 7}));
  dt_tensor *y = nullptr;
  EXPECT_EQ(dt_module_call(m, seven.get(), &y), DT_ERR_SHAPE) << "a context of 7 for 6";
  EXPECT_NE(std::string(dt_last_error()).find("T <= 6"), std::string::npos) << dt_last_error();
  dt_module_destroy(m);
  for (int field = 0; field < 3; field++) {
    dt_llama_config bad = TinyConfig(true);
    if (field == 0)
      bad.n_kv_head = 3;  // does not divide 4 heads
    else if (field == 1)
      bad.n_head = 16;  // heads of one column: RoPE turns pairs
    else
      bad.rope_theta = 0.0f;
    EXPECT_EQ(dt_model_llama(&bad, 0, &m), DT_ERR_INVALID_ARG) << field;
    EXPECT_NE(std::string(dt_last_error()).find("KV heads a divisor"), std::string::npos)
        << dt_last_error();
  }
}

}  // namespace
