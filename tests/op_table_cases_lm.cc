// The op table's rows for attention and the language-model ops (see
// tests/op_table.h for the columns): the causal softmax, the fused causal
// attention, the fused LM-head loss and the layer norm fused with the
// residual add. Each fused op is checked on every call against its
// definition in smaller ops (CheckedAgainst), so both the gradient and the
// parity rows compare it with the composition too.
#include <cmath>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "tests/op_table.h"

namespace optable {

dt_status CheckedAgainst(dt_status st, dt_tensor **out,
                         const std::function<dt_status(dt_tensor **)> &reference, double atol,
                         double rtol, const char *what) {
  if (st != DT_OK)
    return st;
  dt_tensor *ref = nullptr;
  dt_no_grad_begin();
  st = reference(&ref);
  dt_no_grad_end();
  if (st == DT_OK && dt_tensor_numel(ref) != dt_tensor_numel(*out))
    st = DT_ERROR(DT_ERR_INTERNAL, "%s: %lld elements, its definition gives %lld", what,
                  (long long)dt_tensor_numel(*out), (long long)dt_tensor_numel(ref));
  std::vector<float> got = st == DT_OK ? dtt::ToVector(*out) : std::vector<float>();
  std::vector<float> want = st == DT_OK ? dtt::ToVector(ref) : std::vector<float>();
  dt_tensor_release(ref);
  for (size_t k = 0; st == DT_OK && k < got.size(); k++)
    if (!(std::fabs(got[k] - want[k]) <= atol + rtol * std::fabs(want[k])) &&
        !(std::isnan(got[k]) && std::isnan(want[k])))
      st = DT_ERROR(DT_ERR_INTERNAL, "%s: element %zu is %.9g, its definition gives %.9g", what, k,
                    (double)got[k], (double)want[k]);
  if (st != DT_OK) {
    dt_tensor_release(*out);
    *out = nullptr;
  }
  return st;
}

namespace {

using dtt::OpFn;
using V = std::vector<dt_tensor *>;
constexpr dt_dtype F32 = DT_DTYPE_F32;
constexpr Acc kReduction = Acc::kReduction, kNormalisation = Acc::kNormalisation;

dt_tensor *Opt(const V &x, size_t i) { return i < x.size() ? x[i] : nullptr; }

// Intermediate tensors of a reference computation, released at the end (a
// deque: the slots handed out stay put).
struct Temps {
  std::deque<dt_tensor *> v;
  dt_tensor **next() {
    v.push_back(nullptr);
    return &v.back();
  }
  ~Temps() {
    for (dt_tensor *t : v)
      dt_tensor_release(t);
  }
};

// The causal softmax, checked against its definition on every call: the
// softmax of the scores with the future masked by a very negative number.
dt_status CausalSoftmaxChecked(const V &x, dt_tensor **out) {
  auto reference = [&](dt_tensor **ref) {
    const int nd = dt_tensor_ndim(x[0]);
    const int64_t t = dt_tensor_dim(x[0], -1), n = dt_tensor_numel(x[0]);
    std::vector<float> mask(static_cast<size_t>(n), 0.0f);
    for (int64_t k = 0; k < n; k++)
      if (k % t > (k / t) % t)  // column j > row i of its (T, T) block
        mask[static_cast<size_t>(k)] = -1e30f;
    Temps tmp;
    dt_tensor **m = tmp.next(), **masked = tmp.next();
    DT_CHECK(dt_tensor_from_host(mask.data(), dt_tensor_shape(x[0]), nd, DT_DTYPE_F32,
                                 dt_tensor_device(x[0]), m));
    DT_CHECK(dt_op_add(x[0], *m, masked));
    return dt_op_softmax(*masked, -1, ref);
  };
  return CheckedAgainst(dt_op_causal_softmax(x[0], out), out, reference, 1e-6, 1e-5,
                        "causal softmax");
}

// The fused causal attention, checked against its definition on every
// call: per head causal_softmax(q k^T / sqrt(hd)) v from matmuls.
OpFn CausalAttentionChecked(int n_head) {
  return [n_head](const V &x, dt_tensor **out) {
    auto reference = [&](dt_tensor **ref) {
      const int64_t b = dt_tensor_dim(x[0], 0), t = dt_tensor_dim(x[0], 1),
                    c = dt_tensor_dim(x[0], 2) / 3, hd = c / n_head;
      Temps tmp;
      const int64_t split[5] = {b, t, 3, n_head, hd}, heads[4] = {b, n_head, t, hd};
      const int to_heads[5] = {2, 0, 3, 1, 4}, back[4] = {0, 2, 1, 3};
      dt_tensor **s5 = tmp.next(), **p5 = tmp.next(), **c5 = tmp.next(), *qkv[3];
      DT_CHECK(dt_tensor_reshape(x[0], split, 5, s5));
      DT_CHECK(dt_tensor_permute(*s5, to_heads, p5));  // (3, b, h, t, hd)
      DT_CHECK(dt_tensor_contiguous(*p5, c5));
      for (int k = 0; k < 3; k++) {
        dt_tensor **part = tmp.next(), **head = tmp.next();
        DT_CHECK(dt_tensor_slice(*c5, k, k + 1, part));
        DT_CHECK(dt_tensor_reshape(*part, heads, 4, head));
        qkv[k] = *head;
      }
      dt_tensor **kt = tmp.next(), **s = tmp.next(), **ss = tmp.next(), **p = tmp.next(),
                **o = tmp.next(), **ob = tmp.next(), **oc = tmp.next();
      DT_CHECK(dt_tensor_transpose(qkv[1], 2, 3, kt));
      DT_CHECK(dt_op_matmul(qkv[0], *kt, s));
      DT_CHECK(dt_op_scale(*s, (float)(1.0 / std::sqrt((double)hd)), ss));
      DT_CHECK(dt_op_causal_softmax(*ss, p));
      DT_CHECK(dt_op_matmul(*p, qkv[2], o));  // (b, h, t, hd)
      DT_CHECK(dt_tensor_permute(*o, back, ob));
      DT_CHECK(dt_tensor_contiguous(*ob, oc));
      *ref = dt_tensor_retain(*oc);
      return DT_OK;
    };
    return CheckedAgainst(dt_op_causal_attention(x[0], n_head, out), out, reference, 2e-6, 1e-4,
                          "causal attention");
  };
}

OpFn ClassifierLoss(int64_t n_classes, int64_t ignore) {
  return [n_classes, ignore](const V &x, dt_tensor **out) {
    return dt_op_classifier_loss(x[0], x[1], n_classes, ignore, out);
  };
}

// The fused classifier over all columns equals dt_op_cross_entropy (mean)
// bit for bit.
OpFn ClassifierLossIsCrossEntropy(int64_t ignore) {
  return [ignore](const V &x, dt_tensor **out) {
    return CheckedAgainst(
        dt_op_classifier_loss(x[0], x[1], dt_tensor_dim(x[0], -1), ignore, out), out,
        [&](dt_tensor **ref) {
          return dt_op_cross_entropy(x[0], x[1], DT_REDUCTION_MEAN, ignore, ref);
        },
        0.0, 0.0, "classifier loss");
  };
}

// The consuming variant on logits computed from the input (so that nothing
// else holds them and their memory becomes the gradient), or on a second
// reference to the input itself (which must then stay as it was).
OpFn ClassifierLossConsume(int64_t n_classes, bool intermediate) {
  return [n_classes, intermediate](const V &x, dt_tensor **out) {
    dt_tensor *logits = nullptr;
    if (intermediate)
      DT_CHECK(dt_op_scale(x[0], 1.0f, &logits));
    else
      logits = dt_tensor_retain(x[0]);
    DT_CHECK(dt_op_classifier_loss_consume(&logits, x[1], n_classes, -100, out));
    if (logits)
      return DT_ERROR(DT_ERR_INTERNAL, "classifier_loss_consume left the caller's reference");
    return DT_OK;
  };
}

using dtt::ConcatBoth;
using dtt::ResidualLayerNormBoth;

// The same, checked on every call against add + layer_norm (the same
// arithmetic: equal bit for bit).
dt_status ResidualLayerNormChecked(const V &x, dt_tensor **out) {
  auto reference = [&](dt_tensor **ref) {
    dt_tensor *s = nullptr, *n = nullptr;
    dt_status rs = dt_op_add(x[0], x[1], &s);
    if (rs == DT_OK)
      rs = dt_op_layer_norm(s, Opt(x, 2), Opt(x, 3), 1e-5f, &n);
    return ConcatBoth(rs, s, n, ref);
  };
  return CheckedAgainst(ResidualLayerNormBoth(x, out), out, reference, 0.0, 0.0,
                        "residual layer norm");
}

}  // namespace

void AddLanguageModelCases(std::vector<OpCase> *table) {
  auto add = [table](OpCase c) { table->push_back(std::move(c)); };
  // causal softmax of attention scores (B, H, T, T): small, T = 1 (constant 1: no
  // gradient to check), and long rows
  OpFn causal = CausalSoftmaxChecked;
  add({"causal_softmax", "2x3x5x5", F32, {X({2, 3, 5, 5}).Range(-2, 2)}, causal, kReduction});
  add({"causal_softmax", "1x1", F32, {X({1, 1})}, causal, kReduction, kParityOnly});
  add({"causal_softmax",
       "2x4x300x300",
       F32,
       {X({2, 4, 300, 300}).Range(-8, 8)},
       causal,
       kReduction,
       kParityOnly});

  // fused causal attention (B, T, H, hd): small ones with the gradient; T
  // across the CPU's query (32) and key (64) blocks and the CUDA tiles (32),
  // hd 64 and 128 and one not a multiple of 32, and a GPT-2 124M layer's
  // sequence (T 1024, 12 heads of 64)
  struct AttentionGeom {
    int64_t b, t, h, hd;
    unsigned flags;
  };
  const AttentionGeom attentions[] = {
      {1, 5, 2, 2, 0},
      {2, 7, 2, 4, 0},
      {1, 37, 2, 3, 0},
      {1, 1, 1, 8, kParityOnly},
      {3, 100, 2, 64, kParityOnly},
      {1, 77, 1, 128, kParityOnly},
      {2, 65, 3, 48, kParityOnly},
      {1, 130, 4, 32, kParityOnly},
      {1, 1024, 12, 64, kParityOnly},
  };
  for (const AttentionGeom &a : attentions)
    add({"causal_attention",
         std::to_string(a.b) + "x" + std::to_string(a.t) + "_h" + std::to_string(a.h) + "_hd" +
             std::to_string(a.hd),
         F32,
         {X({a.b, a.t, 3 * a.h * a.hd}).Range(-2, 2)},
         CausalAttentionChecked((int)a.h),
         kReduction,
         a.flags});
  add({"causal_attention",
       "heads_do_not_divide",
       F32,
       {X({1, 4, 30}).Const()},
       CausalAttentionChecked(4),
       kReduction,
       kParityOnly,
       DT_ERR_INVALID_ARG,
       "does not divide"});
  add({"causal_attention",
       "not_3c_wide",
       F32,
       {X({1, 4, 31}).Const()},
       CausalAttentionChecked(1),
       kReduction,
       kParityOnly,
       DT_ERR_SHAPE,
       "expected (B, T, 3C)"});

  // the fused LM-head loss: padded vocabulary (the padding takes no part),
  // no padding, equal to cross_entropy, ignored rows, GPT-2's 50257 of 50304
  add({"classifier_loss",
       "8x13_of_11_padded",
       F32,
       {X({8, 13}).Range(-3, 3), RandIds({8}, 11, DT_DTYPE_I64, 5)},
       ClassifierLoss(11, -100),
       kReduction});
  add({"classifier_loss",
       "2x3x7_unpadded_i32",
       F32,
       {X({2, 3, 7}).Range(-3, 3), RandIds({2, 3}, 7, DT_DTYPE_I32)},
       ClassifierLoss(7, -100),
       kReduction});
  add({"classifier_loss",
       "equals_cross_entropy_6x9",
       F32,
       {X({6, 9}).Range(-3, 3), RandIds({6}, 9, DT_DTYPE_I64, 4, -1)},
       ClassifierLossIsCrossEntropy(-1),
       kReduction});
  add({"classifier_loss",
       "equals_cross_entropy_50x1000",
       F32,
       {X({50, 1000}).Range(-5, 5), RandIds({50}, 1000, DT_DTYPE_I64, 7)},
       ClassifierLossIsCrossEntropy(-100),
       kReduction,
       kParityOnly});
  add({"classifier_loss",
       "64x50304_of_50257",
       F32,
       {X({64, 50304}).Range(-4, 4), RandIds({64}, 50257, DT_DTYPE_I32, 9)},
       ClassifierLoss(50257, -100),
       kReduction,
       kParityOnly});
  add({"classifier_loss",
       "all_ignored_mean_is_nan",
       F32,
       {X({3, 6}), Ids({-100, -100, -100}, {3})},
       ClassifierLoss(5, -100),
       kReduction,
       kParityOnly});
  add({"classifier_loss",
       "target_in_the_padding",
       F32,
       {X({6, 13}).Const(), Ids({1, 0, 10, 11, 2, -100}, {6})},
       ClassifierLoss(11, -100),
       kReduction,
       kParityOnly,
       DT_ERR_INVALID_ARG,
       "target 11 at row 3"});
  add({"classifier_loss",
       "more_classes_than_columns",
       F32,
       {X({2, 5}).Const(), Ids({1, 0}, {2})},
       ClassifierLoss(6, -100),
       kReduction,
       kParityOnly,
       DT_ERR_INVALID_ARG,
       "n_classes 6"});
  add({"classifier_loss_consume",
       "intermediate_logits_8x13_of_11",
       F32,
       {X({8, 13}).Range(-3, 3), RandIds({8}, 11, DT_DTYPE_I64, 5)},
       ClassifierLossConsume(11, true),
       kReduction});
  add({"classifier_loss_consume",
       "shared_logits_8x13_of_11",
       F32,
       {X({8, 13}).Range(-3, 3), RandIds({8}, 11, DT_DTYPE_I64, 5)},
       ClassifierLossConsume(11, false),
       kReduction});
  add({"classifier_loss_consume",
       "intermediate_logits_64x50304",
       F32,
       {X({64, 50304}).Range(-4, 4), RandIds({64}, 50257, DT_DTYPE_I32, 9)},
       ClassifierLossConsume(50257, true),
       kReduction,
       kParityOnly});

  // layer norm fused with the residual add: affine, plain, a frozen input,
  // GPT-2's width; shapes that differ
  OpFn residual_ln = ResidualLayerNormChecked;
  add({"residual_layer_norm",
       "affine_2x3x5",
       F32,
       {X({2, 3, 5}).Range(-2, 2), X({2, 3, 5}), X({5}).Range(0.5f, 1.5f), X({5})},
       residual_ln,
       kNormalisation});
  add({"residual_layer_norm",
       "plain_4x6",
       F32,
       {X({4, 6}).Range(-2, 2), X({4, 6})},
       residual_ln,
       kNormalisation});
  add({"residual_layer_norm",
       "frozen_x_3x4",
       F32,
       {X({3, 4}).Const(), X({3, 4}), X({4}).Range(0.5f, 1.5f), X({4})},
       residual_ln,
       kNormalisation});
  add({"residual_layer_norm",
       "300x768",
       F32,
       {X({300, 768}).Range(-3, 3), X({300, 768}), X({768}).Range(0.5f, 1.5f), X({768})},
       residual_ln,
       kNormalisation,
       kParityOnly});
  add({"residual_layer_norm",
       "shapes_differ",
       F32,
       {X({3, 4}).Const(), X({4}).Const()},
       residual_ln,
       kNormalisation,
       kParityOnly,
       DT_ERR_SHAPE,
       "differ in shape"});

  // mixed precision: attention under autocast (see the GEMM rows); the
  // kernels read the 16-bit qkv (CUDA into f32 tiles): T across the CUDA
  // tiles, hd not a multiple of 32, and a GPT-2 124M layer
  struct AutocastAttention {
    int64_t b, t, h, hd;
    unsigned flags;
  };
  const AutocastAttention autocast_attentions[] = {
      {2, 9, 2, 8, 0},
      {2, 65, 3, 48, kParityOnly},
      {1, 1024, 12, 64, kParityOnly},
  };
  for (dt_dtype d : {DT_DTYPE_BF16, DT_DTYPE_F16})
    for (const AutocastAttention &a : autocast_attentions) {
      const int heads = (int)a.h;
      add({"causal_attention",
           "autocast_" + std::to_string(a.b) + "x" + std::to_string(a.t) + "_h" +
               std::to_string(a.h) + "_hd" + std::to_string(a.hd),
           d,
           {X({a.b, a.t, 3 * a.h * a.hd}).Range(-2, 2)},
           // not checked against the matmul definition: under autocast that
           // rounds other intermediates (the scores) than the fused kernel
           [heads](const V &x, dt_tensor **out) {
             return dt_op_causal_attention(x[0], heads, out);
           },
           kReduction,
           a.flags});
    }

  // 16-bit activations (see op_table_cases.cc): 16-bit qkv, logits and
  // residual-stream inputs; the fused classifier reads 16-bit logits and
  // writes their 16-bit gradient (GPT-2's LM head, 50257 of 50304)
  for (dt_dtype d : {DT_DTYPE_BF16, DT_DTYPE_F16}) {
    add({"causal_attention",
         "half_qkv_2x9_h2_hd8",
         d,
         {X({2, 9, 48}).Range(-2, 2).Half()},
         [](const V &x, dt_tensor **out) { return dt_op_causal_attention(x[0], 2, out); },
         kReduction});
    add({"classifier_loss",
         "half_8x13_of_11",
         d,
         {X({8, 13}).Range(-3, 3).Half(), RandIds({8}, 11, DT_DTYPE_I64, 5)},
         ClassifierLoss(11, -100),
         kReduction});
    add({"classifier_loss",
         "half_64x50304",
         d,
         {X({64, 50304}).Range(-4, 4).Half(), RandIds({64}, 50257, DT_DTYPE_I32, 9)},
         ClassifierLoss(50257, -100),
         kReduction,
         kParityOnly});
    add({"classifier_loss_consume",
         "half_intermediate_logits_8x13_of_11",
         d,
         {X({8, 13}).Range(-3, 3).Half(), RandIds({8}, 11, DT_DTYPE_I64, 5)},
         ClassifierLossConsume(11, true),
         kReduction});
    add({"residual_layer_norm",
         "half_x_2x3x5",
         d,
         {X({2, 3, 5}).Range(-2, 2).Half(), X({2, 3, 5}), X({5}).Range(0.5f, 1.5f), X({5})},
         ResidualLayerNormBoth,
         kNormalisation});
  }

  // The row kernels read a 16-bit x (softmax, log-softmax, the causal
  // softmax, layer norm, the fused residual layer norm; the CPU a block of
  // rows at a time, CUDA into f32 registers): many rows per CPU block with
  // a partial last one, rows longer than a block, GPT-2's width (more than
  // one column block of dgamma), enough elements for the CPU's threads and
  // rows wider than a CUDA block's 256 threads; the residual layer norm
  // with a 16-bit residual added to an f32 x (GPT-2's), both 16-bit, and
  // no affine parameters.
  OpFn softmax = [](const V &x, dt_tensor **out) { return dt_op_softmax(x[0], -1, out); };
  OpFn log_softmax = [](const V &x, dt_tensor **out) { return dt_op_log_softmax(x[0], -1, out); };
  OpFn layer_norm = [](const V &x, dt_tensor **out) {
    return dt_op_layer_norm(x[0], Opt(x, 1), Opt(x, 2), 1e-5f, out);
  };
  for (dt_dtype d : {DT_DTYPE_BF16, DT_DTYPE_F16}) {
    add({"softmax", "half_37x300", d, {X({37, 300}).Range(-4, 4).Half()}, softmax, kReduction});
    add({"softmax",
         "half_5x3000",
         d,
         {X({5, 3000}).Range(-4, 4).Half()},
         softmax,
         kReduction,
         kParityOnly});
    add({"log_softmax",
         "half_300x260",
         d,
         {X({300, 260}).Range(-4, 4).Half()},
         log_softmax,
         kReduction,
         kParityOnly});
    add({"causal_softmax",
         "half_2x4x64x64",
         d,
         {X({2, 4, 64, 64}).Range(-2, 2).Half()},
         causal,
         kReduction,
         kParityOnly});
    add({"layer_norm",
         "half_plain_37x300",
         d,
         {X({37, 300}).Range(-2, 2).Half()},
         layer_norm,
         kNormalisation});
    add({"layer_norm",
         "half_300x768",
         d,
         {X({300, 768}).Range(-3, 3).Half(), X({768}).Range(0.5f, 1.5f), X({768})},
         layer_norm,
         kNormalisation,
         kParityOnly});
    add({"residual_layer_norm",
         "half_residual_300x768",
         d,
         {X({300, 768}).Range(-3, 3), X({300, 768}).Half(), X({768}).Range(0.5f, 1.5f), X({768})},
         residual_ln,
         kNormalisation,
         kParityOnly});
    add({"residual_layer_norm",
         "half_both_plain_37x300",
         d,
         {X({37, 300}).Range(-2, 2).Half(), X({37, 300}).Half()},
         ResidualLayerNormBoth,
         kNormalisation});
  }
}

}  // namespace optable
