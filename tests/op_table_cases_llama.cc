// The op table's rows for the Llama-family ops (see tests/op_table.h for
// the columns): RMS norm, the rotary position embedding, SwiGLU and
// grouped-query attention's repeat_kv. Each f32 row is checked on every
// call against the op's definition computed on the host in double
// (CheckedAgainst), so the gradient and parity rows compare it with the
// definition too; the RoPE reference spells out the convention (Hugging
// Face's rotate_half) that the GGUF and HF exports rely on.
#include <cmath>
#include <string>
#include <vector>

#include "core/ops.h"
#include "tests/op_table.h"

namespace optable {
namespace {

const Acc kElementwise = Acc::kElementwise, kReduction = Acc::kReduction;
const Acc kNormalisation = Acc::kNormalisation;
const dt_dtype F32 = DT_DTYPE_F32;
using Shape = std::vector<int64_t>;
using V = std::vector<dt_tensor *>;
using dtt::OpFn;

// A host reference: y (shape) computed from the inputs' values, on x's device.
using HostFn = std::function<std::vector<double>(const std::vector<std::vector<float>> &)>;

OpFn Checked(std::function<dt_status(const V &, dt_tensor **)> op, HostFn host,
             std::function<Shape(const V &)> out_shape, double atol, double rtol,
             const char *what) {
  return [=](const V &x, dt_tensor **out) {
    auto reference = [&](dt_tensor **ref) {
      std::vector<std::vector<float>> in;
      for (dt_tensor *t : x)
        in.push_back(dtt::ToVector(t));
      std::vector<double> y = host(in);
      *ref = dtt::MakeTensor(std::vector<float>(y.begin(), y.end()), out_shape(x), false,
                             dt_tensor_device(x[0]));
      return *ref ? DT_OK : DT_ERROR(DT_ERR_INTERNAL, "%s: no reference tensor", what);
    };
    return CheckedAgainst(op(x, out), out, reference, atol, rtol, what);
  };
}

Shape SameShape(const V &x) { return dtt::Shape(x[0]); }

// ---- RMS norm: x (..., D), weight (D) or none ----

OpFn RmsNorm(float eps) {
  return [eps](const V &x, dt_tensor **out) {
    return dt_op_rms_norm(x[0], x.size() > 1 ? x[1] : nullptr, eps, out);
  };
}

OpFn RmsNormChecked(float eps) {
  return [eps](const V &x, dt_tensor **out) {
    const size_t d = (size_t)dt_tensor_dim(x[0], -1);
    HostFn host = [eps, d](const std::vector<std::vector<float>> &in) {
      const std::vector<float> &v = in[0];
      std::vector<double> y(v.size());
      for (size_t r = 0; r < v.size() / d; r++) {
        double ss = 0.0;
        for (size_t j = 0; j < d; j++)
          ss += (double)v[r * d + j] * v[r * d + j];
        const double rs = 1.0 / std::sqrt(ss / (double)d + (double)eps);
        for (size_t j = 0; j < d; j++)
          y[r * d + j] = v[r * d + j] * rs * (in.size() > 1 ? in[1][j] : 1.0);
      }
      return y;
    };
    return Checked(RmsNorm(eps), host, SameShape, 1e-6, 1e-5, "rms norm")(x, out);
  };
}

// ---- RoPE: x (..., T, C), heads of hd, the first n_rot rotated ----

OpFn Rope(int hd, int n_rot, float theta) {
  return [=](const V &x, dt_tensor **out) { return dt_op_rope(x[0], hd, n_rot, theta, out); };
}

// Hugging Face's LlamaRotaryEmbedding and rotate_half, written out: at
// position p, inv_freq[i] = theta^(-2i/hd), and q * cos + rotate_half(q) *
// sin with cos, sin repeated over both halves, rotate_half(q) = [-q2, q1].
OpFn RopeChecked(int hd, int n_rot, float theta) {
  auto host = [=](const V &x) {
    const int64_t c = dt_tensor_dim(x[0], -1), t = dt_tensor_dim(x[0], -2);
    return HostFn([=](const std::vector<std::vector<float>> &in) {
      const std::vector<float> &v = in[0];
      std::vector<double> y(v.begin(), v.end());
      const int64_t half = hd / 2;
      for (size_t r = 0; r < v.size() / (size_t)c; r++) {
        const double p = (double)((int64_t)r % t);
        for (int64_t h = 0; h < n_rot; h++)
          for (int64_t i = 0; i < hd; i++) {
            const double a = p * std::pow((double)theta, -2.0 * (double)(i % half) / hd);
            const size_t at = r * c + h * hd + i;
            const double rot = i < half ? -(double)v[at + half] : (double)v[at - half];
            y[at] = v[at] * std::cos(a) + rot * std::sin(a);
          }
      }
      return y;
    });
  };
  return [=](const V &x, dt_tensor **out) {
    return Checked(Rope(hd, n_rot, theta), host(x), SameShape, 1e-6, 1e-5, "rope")(x, out);
  };
}

// ---- SwiGLU: x (..., 2F) = [gate | up] -> (..., F) ----

Shape HalfWidth(const V &x) {
  Shape s = dtt::Shape(x[0]);
  s.back() /= 2;
  return s;
}

OpFn Swiglu() {
  return [](const V &x, dt_tensor **out) { return dt_op_swiglu(x[0], out); };
}

OpFn SwigluChecked() {
  auto op = [](const V &x, dt_tensor **out) {
    const int64_t f = dt_tensor_dim(x[0], -1) / 2;
    HostFn host = [f](const std::vector<std::vector<float>> &in) {
      const std::vector<float> &v = in[0];
      std::vector<double> y;
      for (size_t r = 0; r < v.size() / (size_t)(2 * f); r++)
        for (int64_t j = 0; j < f; j++) {
          const double a = v[r * 2 * f + j], b = v[r * 2 * f + f + j];
          y.push_back(a / (1.0 + std::exp(-a)) * b);
        }
      return y;
    };
    return Checked(Swiglu(), host, HalfWidth, 1e-6, 1e-5, "swiglu")(x, out);
  };
  return op;
}

// ---- repeat_kv: (B, T, (H + 2 Hkv) hd) -> (B, T, 3 H hd) ----

OpFn RepeatKv(int h, int hkv) {
  return [=](const V &x, dt_tensor **out) { return dt_op_repeat_kv(x[0], h, hkv, out); };
}

// Query head j reads key/value head j / (H / Hkv): Hugging Face's
// repeat_kv (each head repeated, not the group tiled).
OpFn RepeatKvChecked(int h, int hkv) {
  auto op = [=](const V &x, dt_tensor **out) {
    const int64_t w = dt_tensor_dim(x[0], -1), hd = w / (h + 2 * hkv);
    HostFn host = [=](const std::vector<std::vector<float>> &in) {
      const std::vector<float> &v = in[0];
      std::vector<double> y;
      for (size_t r = 0; r < v.size() / (size_t)w; r++)
        for (int part = 0; part < 3; part++)
          for (int64_t j = 0; j < h; j++) {
            const int64_t src = part == 0 ? j : h + (part - 1) * hkv + j / (h / hkv);
            for (int64_t i = 0; i < hd; i++)
              y.push_back(v[r * w + src * hd + i]);
          }
      return y;
    };
    auto shape = [=](const V &in) {
      Shape s = dtt::Shape(in[0]);
      s.back() = 3 * h * hd;
      return s;
    };
    return Checked(RepeatKv(h, hkv), host, shape, 0.0, 0.0, "repeat_kv")(x, out);
  };
  return op;
}

// A Llama attention block's core: RoPE on q and k of the fused qkv, the
// key/value heads repeated, causal attention.
OpFn LlamaAttention(int h, int hkv, int hd, float theta) {
  return [=](const V &x, dt_tensor **out) {
    dt_tensor *r = nullptr, *q = nullptr;
    dt_status st = dt_op_rope(x[0], hd, h + hkv, theta, &r);
    if (st == DT_OK)
      st = dt_op_repeat_kv(r, h, hkv, &q);
    if (st == DT_OK)
      st = dt_op_causal_attention(q, h, out);
    dt_tensor_release(q);
    dt_tensor_release(r);
    return st;
  };
}

}  // namespace

void AddLlamaCases(std::vector<OpCase> *table) {
  auto add = [table](OpCase c) { table->push_back(std::move(c)); };
  const unsigned kParity = kParityOnly;

  // RMS norm: with and without the weight (and a frozen one), a 3-D input,
  // SmolLM2's and a 1B Llama's widths (many rows: the CPU's threads and
  // column blocks of the weight's gradient, the CUDA rows)
  struct RmsRow {
    const char *name;
    Shape x;
    int weight;  // 0 none, 1 trained, 2 frozen
    unsigned flags;
  };
  const RmsRow rms_rows[] = {
      {"weight_3x5", {3, 5}, 1, 0},        {"plain_2x3x4", {2, 3, 4}, 0, 0},
      {"frozen_weight_4x6", {4, 6}, 2, 0}, {"300x576", {300, 576}, 1, kParity},
      {"40x2048", {40, 2048}, 1, kParity},
  };
  for (const RmsRow &r : rms_rows) {
    std::vector<Input> in = {X(r.x).Range(-3, 3)};
    if (r.weight)
      in.push_back(r.weight == 1 ? X({r.x.back()}).Range(0.5f, 1.5f)
                                 : X({r.x.back()}).Range(0.5f, 1.5f).Const());
    add({"rms_norm", r.name, F32, in, RmsNormChecked(1e-5f), kNormalisation, r.flags});
  }

  // RoPE: every head of q, q and k of a fused GQA qkv (v copied), several
  // sequences of a 4-D input, Llama 3's theta; long sequences of 64-wide
  // heads (angles up to 500 rad) and 128-wide ones
  struct RopeRow {
    const char *name;
    Shape x;
    int hd, n_rot;
    float theta;
    unsigned flags;
  };
  const RopeRow rope_rows[] = {
      {"2x5x12_hd4", {2, 5, 12}, 4, 3, 1e4f, 0},
      {"qk_of_qkv_2x6_h2_kv1_hd4", {2, 6, 16}, 4, 3, 1e4f, 0},
      {"2x3x4x8_hd8_theta5e5", {2, 3, 4, 8}, 8, 1, 5e5f, 0},
      {"2x500x192_hd64", {2, 500, 192}, 64, 2, 1e4f, kParity},
      {"1x77x640_hd128", {1, 77, 640}, 128, 5, 5e5f, kParity},
  };
  for (const RopeRow &r : rope_rows)
    add({"rope",
         r.name,
         F32,
         {X(r.x).Range(-2, 2)},
         RopeChecked(r.hd, r.n_rot, r.theta),
         kElementwise,
         r.flags});

  // SwiGLU: small ones with the gradient, a negative-heavy range (silu's
  // tail), a 1B Llama's MLP width
  add({"swiglu", "3x8", F32, {X({3, 8}).Range(-3, 3)}, SwigluChecked(), kElementwise});
  add({"swiglu", "2x3x10", F32, {X({2, 3, 10}).Range(-6, 2)}, SwigluChecked(), kElementwise});
  add({"swiglu",
       "16x16384",
       F32,
       {X({16, 16384}).Range(-8, 8)},
       SwigluChecked(),
       kElementwise,
       kParity});

  // repeat_kv: groups of 2 (gradients summed over the group), one KV head
  // for all (multi-query), SmolLM2's 9 heads of 3 KV heads, no grouping
  // (a new reference), T x 3H of a 1B Llama layer
  struct GqaRow {
    const char *name;
    Shape x;
    int h, hkv;
    unsigned flags;
  };
  const GqaRow gqa_rows[] = {
      {"2x3_h4_kv2_hd3", {2, 3, 24}, 4, 2, 0},
      {"mqa_1x4_h3_kv1_hd2", {1, 4, 10}, 3, 1, 0},
      {"2x5_h9_kv3_hd4", {2, 5, 60}, 9, 3, 0},
      {"h2_kv2_is_identity", {1, 3, 12}, 2, 2, 0},
      {"1x256_h32_kv8_hd64", {1, 256, 48 * 64}, 32, 8, kParity},
  };
  for (const GqaRow &r : gqa_rows)
    add({"repeat_kv",
         r.name,
         F32,
         {X(r.x)},
         RepeatKvChecked(r.h, r.hkv),
         kReduction,
         r.flags | kExactForward});

  // the three together: a Llama attention (RoPE, GQA, causal attention)
  add({"rope",
       "llama_attention_2x7_h4_kv2_hd4",
       F32,
       {X({2, 7, 32}).Range(-2, 2)},
       LlamaAttention(4, 2, 4, 1e4f),
       kReduction});
  add({"rope",
       "llama_attention_1x130_h6_kv2_hd32",
       F32,
       {X({1, 130, 320}).Range(-2, 2)},
       LlamaAttention(6, 2, 32, 1e4f),
       kReduction,
       kParity});

  // bad input: each op names what is wrong
  struct BadRow {
    const char *op, *name;
    std::vector<Input> in;
    OpFn fn;
    dt_status status;
    const char *msg;
  };
  const BadRow bad_rows[] = {
      {"rms_norm",
       "weight_mismatch",
       {X({3, 5}), X({4})},
       RmsNorm(1e-5f),
       DT_ERR_SHAPE,
       "weight [4] does not match 5 features"},
      {"rope", "odd_head_dim", {X({1, 3, 6})}, Rope(3, 2, 1e4f), DT_ERR_INVALID_ARG, "head_dim 3"},
      {"rope",
       "more_heads_than_x",
       {X({1, 3, 8})},
       Rope(4, 3, 1e4f),
       DT_ERR_INVALID_ARG,
       "n_rot 3"},
      {"swiglu", "odd_width", {X({2, 7})}, Swiglu(), DT_ERR_SHAPE, "an even width"},
      {"repeat_kv",
       "kv_does_not_divide",
       {X({1, 2, 30})},
       RepeatKv(4, 3),
       DT_ERR_INVALID_ARG,
       "n_kv_head 3 does not divide n_head 4"},
      {"repeat_kv",
       "width_not_heads",
       {X({1, 2, 25})},
       RepeatKv(4, 2),
       DT_ERR_SHAPE,
       "(B, T, 8 head_dim)"},
  };
  for (const BadRow &r : bad_rows) {
    std::vector<Input> in;
    for (const Input &i : r.in)
      in.push_back(i.Const());
    add({r.op, r.name, F32, in, r.fn, kElementwise, kParity, r.status, r.msg});
  }

  // 16-bit activations (see op_table_cases.cc): a 16-bit input to each op
  // (RMS norm reads it and returns f32; RoPE, SwiGLU and repeat_kv keep it
  // 16-bit, f32 math inside), small and at the kernels' block sizes
  for (dt_dtype d : {DT_DTYPE_BF16, DT_DTYPE_F16}) {
    for (int64_t n : {4, 300})
      add({"rms_norm",
           n == 4 ? "half_4x16" : "half_300x576",
           d,
           {X({n, n == 4 ? 16 : 576}).Range(-3, 3).Half(),
            X({n == 4 ? 16 : 576}).Range(0.5f, 1.5f)},
           RmsNorm(1e-5f),
           kNormalisation,
           n == 4 ? 0u : kParity});
    add({"rope", "half_2x9x32_hd8", d, {X({2, 9, 32}).Half()}, Rope(8, 3, 1e4f), kElementwise});
    add({"rope",
         "half_2x300x192_hd64",
         d,
         {X({2, 300, 192}).Half()},
         Rope(64, 2, 1e4f),
         kElementwise,
         kParity});
    add({"swiglu", "half_3x2x20", d, {X({3, 2, 20}).Range(-3, 3).Half()}, Swiglu(), kElementwise});
    add({"swiglu",
         "half_8x3000",
         d,
         {X({8, 3000}).Range(-4, 4).Half()},
         Swiglu(),
         kElementwise,
         kParity});
    add({"repeat_kv",
         "half_2x3_h4_kv2_hd3",
         d,
         {X({2, 3, 24}).Half()},
         RepeatKv(4, 2),
         kReduction});
  }
}

}  // namespace optable
