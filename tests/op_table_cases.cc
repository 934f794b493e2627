// The op table's rows (see tests/op_table.h for the columns). Small shapes
// run both checks; the large ones (kParityOnly) are sized to reach the
// backends' multi-block and long-row paths, where finite differences would
// be too slow.
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "core/module.h"
#include "core/ops.h"
#include "core/optim.h"
#include "tests/op_table.h"

namespace optable {
namespace {

using dtt::OpFn;
using V = std::vector<dt_tensor *>;
using Shape = std::vector<int64_t>;
constexpr dt_dtype F32 = DT_DTYPE_F32;
constexpr Acc kExact = Acc::kExact, kElementwise = Acc::kElementwise, kReduction = Acc::kReduction,
              kNormalisation = Acc::kNormalisation;

std::string ShapeName(const Shape &s) {
  std::string r;
  for (size_t i = 0; i < s.size(); i++)
    r += (i ? "x" : "") + std::to_string(s[i]);
  return r.empty() ? "scalar" : r;
}

// ---- the ops as callables on the row's inputs ----

OpFn Unary(dt_status (*f)(dt_tensor *, dt_tensor **)) {
  return [f](const V &x, dt_tensor **out) { return f(x[0], out); };
}

OpFn Binary(dt_status (*f)(dt_tensor *, dt_tensor *, dt_tensor **)) {
  return [f](const V &x, dt_tensor **out) { return f(x[0], x[1], out); };
}

// f(view of x) for a view made by `make`, released afterwards.
template <class Make, class F>
dt_status OnView(dt_tensor *x, Make make, F f) {
  dt_tensor *view = nullptr;
  DT_CHECK(make(x, &view));
  dt_status st = f(view);
  dt_tensor_release(view);
  return st;
}

auto Transposed(int d0, int d1) {
  return [d0, d1](dt_tensor *x, dt_tensor **v) { return dt_tensor_transpose(x, d0, d1, v); };
}

auto Permuted(std::vector<int> perm) {
  return [perm](dt_tensor *x, dt_tensor **v) { return dt_tensor_permute(x, perm.data(), v); };
}

auto AsDtype(dt_dtype d) {
  return [d](dt_tensor *x, dt_tensor **v) { return dt_tensor_to_dtype(x, d, v); };
}

// f(x0, x1) with input k read through its transpose (0, 1): a strided view.
OpFn TransposedInput(size_t k, dt_status (*f)(dt_tensor *, dt_tensor *, dt_tensor **)) {
  return [k, f](const V &x, dt_tensor **out) {
    return OnView(x[k], Transposed(0, 1),
                  [&](dt_tensor *t) { return k == 0 ? f(t, x[1], out) : f(x[0], t, out); });
  };
}

// f(x0 permuted by perm).
OpFn PermutedInput(std::vector<int> perm, dt_status (*f)(dt_tensor *, dt_tensor **)) {
  return [perm, f](const V &x, dt_tensor **out) {
    return OnView(x[0], Permuted(perm), [&](dt_tensor *p) { return f(p, out); });
  };
}

dt_tensor *Opt(const V &x, size_t i) { return i < x.size() ? x[i] : nullptr; }

OpFn Linear() {
  return [](const V &x, dt_tensor **out) { return dt_op_linear(x[0], x[1], Opt(x, 2), out); };
}

// dt_op_gelu_mlp on x, w_fc[, b_fc], w_proj[, b_proj] (the inputs in that
// order, without the biases the row leaves out).
OpFn GeluMlp(bool b_fc, bool b_proj) {
  return [b_fc, b_proj](const V &x, dt_tensor **out) {
    size_t i = 2;
    dt_tensor *bf = b_fc ? x[i++] : nullptr;
    dt_tensor *wp = x[i++];
    dt_tensor *bp = b_proj ? x[i] : nullptr;
    return dt_op_gelu_mlp(x[0], x[1], bf, wp, bp, out);
  };
}

OpFn Softmax(bool log) {
  return [log](const V &x, dt_tensor **out) {
    return log ? dt_op_log_softmax(x[0], -1, out) : dt_op_softmax(x[0], -1, out);
  };
}

OpFn CrossEntropy(dt_reduction r, int64_t ignore) {
  return [r, ignore](const V &x, dt_tensor **out) {
    return dt_op_cross_entropy(x[0], x[1], r, ignore, out);
  };
}

OpFn Mse(dt_reduction r) {
  return [r](const V &x, dt_tensor **out) { return dt_op_mse(x[0], x[1], r, out); };
}

// inputs: x, weight[, bias]
OpFn Conv2d(int stride, int padding) {
  return [stride, padding](const V &x, dt_tensor **out) {
    return dt_op_conv2d(x[0], x[1], Opt(x, 2), stride, padding, out);
  };
}

// channels-last: x (N, H, W, C), the weight (OC, C, KH, KW) as ever
OpFn Conv2dNhwc(int stride, int padding) {
  return [stride, padding](const V &x, dt_tensor **out) {
    return dt_op_conv2d_nhwc(x[0], x[1], Opt(x, 2), stride, padding, out);
  };
}

OpFn Pool(dt_status (*f)(dt_tensor *, int, int, int, dt_tensor **), int k, int s, int p) {
  return [f, k, s, p](const V &x, dt_tensor **out) { return f(x[0], k, s, p, out); };
}

// inputs: x[, gamma, beta[, running_mean, running_var]]
OpFn BatchNorm(int training) {
  return [training](const V &x, dt_tensor **out) {
    return dt_op_batch_norm2d(x[0], Opt(x, 1), Opt(x, 2), Opt(x, 3), Opt(x, 4), training, 0.1f,
                              1e-5f, out);
  };
}

// SyncBatchNorm's sum across processes: `copies` processes with this one's
// batch (1: this process alone; 2: the sums doubled, as two processes with
// equal batches, whose statistics are this batch's).
dt_status SumOverCopies(dt_tensor *t, void *user) {
  const int copies = *static_cast<const int *>(user);
  std::vector<float> v((size_t)dt_tensor_numel(t));
  DT_CHECK(dt_tensor_to_host(t, v.data(), v.size() * sizeof(float)));
  for (float &f : v)
    f *= (float)copies;
  dt_tensor *host = nullptr;
  int64_t n = (int64_t)v.size();
  DT_CHECK(dt_tensor_from_host(v.data(), &n, 1, DT_DTYPE_F32, dt_tensor_device(t), &host));
  dt_status st = dt_tensor_copy_(t, host);
  dt_tensor_release(host);
  return st;
}

// inputs: x[, gamma, beta[, running_mean, running_var]]
OpFn SyncBatchNorm(int copies) {
  static const int kCopies[3] = {0, 1, 2};
  const dt_sum_across across = {SumOverCopies, const_cast<int *>(&kCopies[copies])};
  return [across](const V &x, dt_tensor **out) {
    return dt_op_sync_batch_norm2d(x[0], Opt(x, 1), Opt(x, 2), Opt(x, 3), Opt(x, 4), 0.1f, 1e-5f,
                                   &across, out);
  };
}

// inputs: x[, gamma, beta]
OpFn LayerNorm() {
  return [](const V &x, dt_tensor **out) {
    return dt_op_layer_norm(x[0], Opt(x, 1), Opt(x, 2), 1e-5f, out);
  };
}

// The same mask on every call: the generator starts afresh.
OpFn Dropout(float p, uint64_t seed, uint64_t offset) {
  return [p, seed, offset](const V &x, dt_tensor **out) {
    dt_generator gen;
    dt_generator_init(&gen, seed);
    gen.offset = offset;
    return dt_op_dropout(x[0], p, 1, &gen, out);
  };
}

OpFn Reduce(dt_status (*f)(dt_tensor *, const int *, int, bool, dt_tensor **),
            std::vector<int> dims, bool keepdim) {
  return [f, dims, keepdim](const V &x, dt_tensor **out) {
    return f(x[0], dims.data(), (int)dims.size(), keepdim, out);
  };
}

OpFn Concat(int dim) {
  return [dim](const V &x, dt_tensor **out) {
    return dt_op_concat(x.data(), (int)x.size(), dim, out);
  };
}

OpFn Cast(dt_dtype src, dt_dtype dst) {
  return [src, dst](const V &x, dt_tensor **out) {
    return OnView(x[0], AsDtype(src),
                  [&](dt_tensor *s) { return dt_tensor_to_dtype(s, dst, out); });
  };
}

// ---- optimizers and clipping, on a one-parameter module's arena ----

dt_status NoForward(dt_module *, dt_tensor *, dt_tensor **) {
  return DT_ERROR(DT_ERR_UNSUPPORTED, "op table: a parameter holder has no forward");
}
const dt_module_vtable kParamsOnly = {"ParamsOnly", NoForward, nullptr};

// A module whose one parameter is a copy of p (1-D), with gradient g.
struct OneParam {
  dt_module *m = nullptr;
  dt_param_arena *arena = nullptr;
  ~OneParam() {
    dt_param_arena_destroy(arena);
    dt_module_destroy(m);
  }
  dt_status Init(dt_tensor *p, dt_tensor *g) {
    DT_CHECK(dt_module_create(&kParamsOnly, nullptr, &m));
    dt_tensor *w = nullptr;
    DT_CHECK(dt_tensor_empty(dt_tensor_shape(p), 1, DT_DTYPE_F32, dt_tensor_device(p), &w));
    dt_status st = dt_tensor_copy_(w, p);
    if (st == DT_OK)
      st = dt_module_register_parameter(m, "w", w);
    dt_tensor_release(w);
    DT_CHECK(st);
    DT_CHECK(dt_param_arena_create(m, &arena));
    return dt_tensor_copy_(dt_param_arena_grads(arena), g);
  }
};

// out = concat(t, host values on t's device)
dt_status ConcatHost(dt_tensor *t, const std::vector<float> &host, dt_tensor **out) {
  int64_t n = (int64_t)host.size();
  dt_tensor *h = nullptr;
  DT_CHECK(dt_tensor_from_host(host.data(), &n, 1, DT_DTYPE_F32, dt_tensor_device(t), &h));
  dt_tensor *both[2] = {t, h};
  dt_status st = dt_op_concat(both, 2, 0, out);
  dt_tensor_release(h);
  return st;
}

// inputs: p, g, then the state buffers (SGD: momentum; AdamW: exp_avg,
// exp_avg_sq). One step after `steps_before` steps; out = (p, state).
template <class Create>
OpFn OptimStep(Create create, int64_t steps_before) {
  return [create, steps_before](const V &x, dt_tensor **out) {
    OneParam a;
    DT_CHECK(a.Init(x[0], x[1]));
    std::vector<float> state;
    for (size_t i = 2; i < x.size(); i++) {
      std::vector<float> s = dtt::ToVector(x[i]);
      state.insert(state.end(), s.begin(), s.end());
    }
    dt_optimizer *o = nullptr;
    DT_CHECK(create(a.arena, &o));
    dt_status st = dt_optim_state_set(o, state.data(), (int64_t)state.size(), steps_before);
    if (st == DT_OK)
      st = dt_optim_step(o);
    if (st == DT_OK)
      st = dt_optim_state_get(o, state.data(), (int64_t)state.size());
    if (st == DT_OK)
      st = ConcatHost(dt_param_arena_data(a.arena), state, out);
    dt_optim_destroy(o);
    return st;
  };
}

OpFn Sgd(dt_sgd_config cfg, int64_t steps_before) {
  return OptimStep(
      [cfg](dt_param_arena *a, dt_optimizer **o) { return dt_optim_sgd_create(a, &cfg, o); },
      steps_before);
}

OpFn AdamW(dt_adamw_config cfg, int64_t steps_before) {
  return OptimStep(
      [cfg](dt_param_arena *a, dt_optimizer **o) { return dt_optim_adamw_create(a, &cfg, o); },
      steps_before);
}

// input: g (also the parameter); out = (clipped g, the norm before)
OpFn ClipGradNorm(float max_norm) {
  return [max_norm](const V &x, dt_tensor **out) {
    OneParam a;
    DT_CHECK(a.Init(x[0], x[0]));
    double norm = 0.0;
    DT_CHECK(dt_clip_grad_norm(a.arena, max_norm, &norm));
    return ConcatHost(dt_param_arena_grads(a.arena), {(float)norm}, out);
  };
}

// ---- the table ----

std::vector<OpCase> Build() {
  std::vector<OpCase> t = {
      // elementwise: the special inputs (broadcast shapes are added below)
      {"mul", "only_lhs_requires_grad", F32, {X({3, 4}), X({4}).Const()}, Binary(dt_op_mul)},
      {"sub", "only_rhs_requires_grad", F32, {X({4}).Const(), X({3, 4})}, Binary(dt_op_sub)},
      {"mul", "transposed_lhs", F32, {X({4, 3}), X({3, 4})}, TransposedInput(0, dt_op_mul)},
      {"mul", "same_input_twice", F32, {X({2, 5})},
       [](const V &x, dt_tensor **out) { return dt_op_mul(x[0], x[0], out); }},
      {"scale", "alpha_2_5", F32, {X({3, 4})},
       [](const V &x, dt_tensor **out) { return dt_op_scale(x[0], 2.5f, out); }},
      {"scale", "alpha_minus_0_5", F32, {X({3, 4})},
       [](const V &x, dt_tensor **out) { return dt_op_scale(x[0], -0.5f, out); }},
      {"relu", "", F32, {X({2, 3, 4}).Away(0.05f)}, Unary(dt_op_relu)},
      {"gelu", "", F32, {X({2, 3, 4}).Range(-3, 3)}, Unary(dt_op_gelu)},
      {"tanh", "", F32, {X({5, 4}).Range(-2, 2)}, Unary(dt_op_tanh)},
      {"relu", "4096_with_zero", F32, {X({4096}).Range(-4, 4).Head({0})}, Unary(dt_op_relu),
       kElementwise, kParityOnly},
      {"gelu", "4096", F32, {X({4096}).Range(-4, 4).Head({0})}, Unary(dt_op_gelu), kElementwise,
       kParityOnly},
      {"tanh", "4096", F32, {X({4096}).Range(-4, 4).Head({0})}, Unary(dt_op_tanh), kElementwise,
       kParityOnly},

      // linear algebra: the backward passes reach GEMM's (N,T) and (T,N) forms
      {"matmul", "2d", F32, {X({3, 4}), X({4, 5})}, Binary(dt_op_matmul), kReduction},
      {"matmul", "leading_dims_flattened", F32, {X({2, 3, 4}), X({4, 2})}, Binary(dt_op_matmul),
       kReduction},
      {"matmul", "batched", F32, {X({2, 3, 4}), X({2, 4, 5})}, Binary(dt_op_matmul), kReduction},
      {"matmul", "batched_4d", F32, {X({2, 2, 3, 2}), X({2, 2, 2, 3})}, Binary(dt_op_matmul),
       kReduction},
      {"matmul", "transposed_rhs", F32, {X({3, 4}), X({5, 4})}, TransposedInput(1, dt_op_matmul),
       kReduction},
      {"matmul", "37x64_by_64x29", F32, {X({37, 64}), X({64, 29})}, Binary(dt_op_matmul),
       kReduction, kParityOnly},
      {"matmul", "batched_3x37x64_by_3x64x29", F32, {X({3, 37, 64}), X({3, 64, 29})},
       Binary(dt_op_matmul), kReduction, kParityOnly},
      {"matmul", "transposed_lhs_37x64_by_64x29", F32, {X({64, 37}), X({64, 29})},
       TransposedInput(0, dt_op_matmul), kReduction, kParityOnly},
      {"linear", "bias", F32, {X({4, 3}), X({5, 3}), X({5})}, Linear(), kReduction},
      {"linear", "no_bias", F32, {X({4, 3}), X({5, 3})}, Linear(), kReduction},
      {"linear", "3d_input", F32, {X({2, 3, 3}), X({5, 3}), X({5})}, Linear(), kReduction},
      {"linear", "frozen_weight", F32, {X({4, 3}), X({5, 3}).Const(), X({5})}, Linear(),
       kReduction},
      {"linear", "37x64_to_29", F32, {X({37, 64}), X({29, 64}), X({29})}, Linear(), kReduction,
       kParityOnly},
      // f32: the three ops (the fused node is 16-bit autocast's)
      {"gelu_mlp", "", F32, {X({2, 3, 4}), X({6, 4}), X({6}), X({5, 6}), X({5})},
       GeluMlp(true, true), kReduction},
      {"gelu_mlp", "no_biases", F32, {X({4, 3}), X({5, 3}), X({2, 5})}, GeluMlp(false, false),
       kReduction},

      // losses
      {"cross_entropy", "mean", F32, {X({4, 5}).Range(-2, 2), Ids({1, 0, 4, 2}, {4})},
       CrossEntropy(DT_REDUCTION_MEAN, -100), kReduction},
      {"cross_entropy", "sum", F32, {X({4, 5}).Range(-2, 2), Ids({1, 0, 4, 2}, {4})},
       CrossEntropy(DT_REDUCTION_SUM, -100), kReduction},
      {"cross_entropy", "none", F32, {X({4, 5}).Range(-2, 2), Ids({1, 0, 4, 2}, {4})},
       CrossEntropy(DT_REDUCTION_NONE, -100), kReduction},
      {"cross_entropy", "i32_ignore_index_mean", F32,
       {X({5, 3}).Range(-2, 2), Ids({2, -1, 0, -1, 1}, {5}, DT_DTYPE_I32)},
       CrossEntropy(DT_REDUCTION_MEAN, -1), kReduction},
      {"cross_entropy", "i32_ignore_index_sum", F32,
       {X({5, 3}).Range(-2, 2), Ids({2, -1, 0, -1, 1}, {5}, DT_DTYPE_I32)},
       CrossEntropy(DT_REDUCTION_SUM, -1), kReduction},
      {"cross_entropy", "i32_ignore_index_none", F32,
       {X({5, 3}).Range(-2, 2), Ids({2, -1, 0, -1, 1}, {5}, DT_DTYPE_I32)},
       CrossEntropy(DT_REDUCTION_NONE, -1), kReduction},
      {"cross_entropy", "sequence_logits", F32,
       {X({2, 3, 4}).Range(-2, 2), Ids({3, 0, 1, 2, 2, 0}, {2, 3})},
       CrossEntropy(DT_REDUCTION_MEAN, -100), kReduction},
      {"cross_entropy", "all_ignored_mean_is_nan", F32,
       {X({3, 4}), Ids({-100, -100, -100}, {3})}, CrossEntropy(DT_REDUCTION_MEAN, -100),
       kReduction, kParityOnly},
      {"mse", "mean", F32, {X({3, 4}), X({3, 4})}, Mse(DT_REDUCTION_MEAN), kReduction},
      {"mse", "sum", F32, {X({3, 4}), X({3, 4})}, Mse(DT_REDUCTION_SUM), kReduction},
      {"mse", "none", F32, {X({3, 4}), X({3, 4})}, Mse(DT_REDUCTION_NONE), kReduction},

      // convolution
      {"conv2d", "bias", F32, {X({1, 1, 5, 5}), X({2, 1, 3, 3}), X({2})}, Conv2d(1, 0),
       kReduction},
      {"conv2d", "bias_stride2_pad1", F32, {X({2, 3, 6, 5}), X({4, 3, 3, 3}), X({4})},
       Conv2d(2, 1), kReduction},
      {"conv2d", "rect_kernel_no_bias_pad1", F32, {X({2, 2, 5, 6}), X({3, 2, 2, 3})},
       Conv2d(1, 1), kReduction},
      {"conv2d", "bias_stride3_pad2", F32, {X({1, 2, 7, 7}), X({2, 2, 3, 3}), X({2})},
       Conv2d(3, 2), kReduction},
      {"conv2d", "pointwise", F32, {X({2, 4, 3, 3}), X({3, 4, 1, 1}), X({3})}, Conv2d(1, 0),
       kReduction},
      {"conv2d", "lenet_4x3x28x28_5x5_pad2", F32, {X({4, 3, 28, 28}), X({8, 3, 5, 5}), X({8})},
       Conv2d(1, 2), kReduction, kParityOnly},
      {"conv2d", "2x16x15x13_3x3_stride2_pad1", F32,
       {X({2, 16, 15, 13}), X({32, 16, 3, 3}), X({32})}, Conv2d(2, 1), kReduction, kParityOnly},
      {"conv2d", "pointwise_3x8x7x7", F32, {X({3, 8, 7, 7}), X({4, 8, 1, 1}), X({4})},
       Conv2d(1, 0), kReduction, kParityOnly},
      // channels-last: the geometries above with x (N, H, W, C)
      {"conv2d_nhwc", "bias", F32, {X({1, 5, 5, 1}), X({2, 1, 3, 3}), X({2})}, Conv2dNhwc(1, 0),
       kReduction},
      {"conv2d_nhwc", "bias_stride2_pad1", F32, {X({2, 6, 5, 3}), X({4, 3, 3, 3}), X({4})},
       Conv2dNhwc(2, 1), kReduction},
      {"conv2d_nhwc", "rect_kernel_no_bias_pad1", F32, {X({2, 5, 6, 2}), X({3, 2, 2, 3})},
       Conv2dNhwc(1, 1), kReduction},
      {"conv2d_nhwc", "pointwise", F32, {X({2, 3, 3, 4}), X({3, 4, 1, 1}), X({3})},
       Conv2dNhwc(1, 0), kReduction},
      {"conv2d_nhwc", "2x15x13x16_3x3_stride2_pad1", F32,
       {X({2, 15, 13, 16}), X({32, 16, 3, 3}), X({32})}, Conv2dNhwc(2, 1), kReduction,
       kParityOnly},
      {"conv2d_nhwc", "8x14x14x64_3x3_pad1_no_bias", F32, {X({8, 14, 14, 64}), X({64, 64, 3, 3})},
       Conv2dNhwc(1, 1), kReduction, kParityOnly},

      // normalisation
      {"batch_norm2d", "eval_affine", F32,
       {X({2, 3, 2, 2}).Range(-2, 2), X({3}).Range(0.5f, 1.5f), X({3}), X({3}).Const(),
        X({3}).Range(0.5f, 1.5f).Const()},
       BatchNorm(0), kNormalisation},
      {"batch_norm2d", "train_8x16x7x7", F32,
       {X({8, 16, 7, 7}).Range(-2, 3), X({16}).Range(0.5f, 1.5f), X({16}), X({16}).Const(),
        X({16}).Range(0.5f, 2).Const()},
       BatchNorm(1), kNormalisation, kParityOnly},
      {"batch_norm2d", "eval_8x16x7x7", F32,
       {X({8, 16, 7, 7}).Range(-2, 3), X({16}).Range(0.5f, 1.5f), X({16}), X({16}).Const(),
        X({16}).Range(0.5f, 2).Const()},
       BatchNorm(0), kNormalisation, kParityOnly},
      // no samples: the parameter gradients are zeros (dbeta was once left uninitialised)
      {"batch_norm2d", "eval_empty_batch", F32,
       {X({0, 3, 2, 2}), X({3}).Range(0.5f, 1.5f), X({3}), X({3}).Const(),
        X({3}).Range(0.5f, 1.5f).Const()},
       BatchNorm(0), kNormalisation, kParityOnly},
      {"sync_batch_norm2d", "train_8x16x7x7", F32,
       {X({8, 16, 7, 7}).Range(-2, 3), X({16}).Range(0.5f, 1.5f), X({16}), X({16}).Const(),
        X({16}).Range(0.5f, 2).Const()},
       SyncBatchNorm(2), kNormalisation, kParityOnly},
      {"layer_norm", "300x768", F32,
       {X({300, 768}).Range(-3, 3), X({768}).Range(0.5f, 1.5f), X({768})}, LayerNorm(),
       kNormalisation, kParityOnly},

      // embedding, dropout
      {"embedding", "i64", F32, {Ids({1, 0, 4, 1, 2, 1}, {2, 3}), X({5, 4})},  // id 3 unused
       Binary(dt_op_embedding), kReduction, kExactForward},
      {"embedding", "i32", F32, {Ids({1, 0, 4, 1, 2, 1}, {2, 3}, DT_DTYPE_I32), X({5, 4})},
       Binary(dt_op_embedding), kReduction, kExactForward},
      // the backward sums repeated indices in position order on every backend
      // (CUDA sorts the positions by index: no float atomics), so the
      // gradient is exact too
      {"embedding", "500_of_1000x64_repeats", F32, {RandIds({500}, 50), X({1000, 64})},
       Binary(dt_op_embedding), kExact, kParityOnly},
      {"embedding", "4x1024_of_37_into_1000x300", F32,
       {RandIds({4, 1024}, 37, DT_DTYPE_I32), X({1000, 300})}, Binary(dt_op_embedding), kExact,
       kParityOnly},
      {"embedding", "3000_of_one_into_5x40", F32, {Ids(std::vector<int64_t>(3000, 3), {3000}),
       X({5, 40})}, Binary(dt_op_embedding), kExact, kParityOnly},
      {"dropout", "p0_3", F32, {X({4, 6})}, Dropout(0.3f, 1234, 0), kExact},
      {"dropout", "p0_7", F32, {X({4, 6})}, Dropout(0.7f, 1234, 0), kExact},
      {"dropout", "100003_offset", F32, {X({100003})}, Dropout(0.3f, 0xC0FFEE, 12345), kExact,
       kParityOnly},

      // shape
      {"concat", "dim0", F32, {X({2, 3}), X({1, 3}), X({2, 3}).Const()}, Concat(0), kExact},
      {"concat", "dim1", F32, {X({2, 3}), X({2, 2}), X({2, 3}).Const()}, Concat(1), kExact},
      {"concat", "last_dim", F32, {X({2, 2}), X({2, 3})}, Concat(-1), kExact},
      {"flatten", "", F32, {X({2, 3, 2, 2})}, Unary(dt_op_flatten), kExact},
      {"flatten", "permuted", F32, {X({2, 3, 2, 2})},  // flatten copies, like torch.flatten
       PermutedInput({0, 2, 3, 1}, dt_op_flatten), kExact},
      {"argmax", "ties_and_nan", F32,
       {X({4, 6}).Const().Head({0.5f, 0.9f, 0.9f, -1, 0, 0, 0, 0, NAN, 1, 0, 2})},
       Unary(dt_op_argmax), kExact, kParityOnly},

      // composition: a small classifier end to end
      {"classifier", "linear_gelu_linear_cross_entropy", F32,
       {X({4, 6}), X({5, 6}), X({5}), X({3, 5}), Ids({0, 2, 1, 2}, {4})},
       [](const V &v, dt_tensor **out) {
         dt_tensor *h = nullptr, *a = nullptr, *logits = nullptr;
         dt_status st = dt_op_linear(v[0], v[1], v[2], &h);
         if (st == DT_OK)
           st = dt_op_gelu(h, &a);
         if (st == DT_OK)
           st = dt_op_linear(a, v[3], nullptr, &logits);
         if (st == DT_OK)
           st = dt_op_cross_entropy(logits, v[4], DT_REDUCTION_MEAN, -100, out);
         dt_tensor_release(logits);
         dt_tensor_release(a);
         dt_tensor_release(h);
         return st;
       },
       kReduction},

      // tensor copies (strided copy kernel), fill
      {"contiguous", "permuted_6x5x4", F32, {X({6, 5, 4})},
       PermutedInput({2, 1, 0}, dt_tensor_contiguous), kExact},
      {"contiguous", "f16_permuted_6x5x4", F32, {X({6, 5, 4}).Const()},
       [](const V &x, dt_tensor **out) {  // 2-byte elements
         return OnView(x[0], AsDtype(DT_DTYPE_F16), [&](dt_tensor *h) {
           return PermutedInput({2, 1, 0}, dt_tensor_contiguous)({h}, out);
         });
       },
       kExact, kParityOnly},
      {"fill", "5000", F32, {X({5000}).Const()},
       [](const V &x, dt_tensor **out) {
         dt_tensor *y = nullptr;
         DT_CHECK(
             dt_tensor_empty(dt_tensor_shape(x[0]), 1, DT_DTYPE_F32, dt_tensor_device(x[0]), &y));
         dt_status st = dt_tensor_fill_(y, 3.25f);
         if (st != DT_OK)
           dt_tensor_release(y);
         *out = st == DT_OK ? y : nullptr;
         return st;
       },
       kExact, kParityOnly},

      // optimizers and clipping (the fused update kernels)
      {"sgd", "momentum_dampening_first_step", F32,
       {X({10000}).Const(), X({10000}).Const(), X({10000}).Const()},
       Sgd({0.1f, 0.9f, 0.1f, 1e-4f, 0}, 0), kElementwise, kParityOnly},
      {"sgd", "momentum_dampening", F32,
       {X({10000}).Const(), X({10000}).Const(), X({10000}).Const()},
       Sgd({0.1f, 0.9f, 0.1f, 1e-4f, 0}, 5), kElementwise, kParityOnly},
      {"sgd", "nesterov_first_step", F32,
       {X({10000}).Const(), X({10000}).Const(), X({10000}).Const()},
       Sgd({0.1f, 0.9f, 0.0f, 1e-4f, 1}, 0), kElementwise, kParityOnly},
      {"sgd", "nesterov", F32, {X({10000}).Const(), X({10000}).Const(), X({10000}).Const()},
       Sgd({0.1f, 0.9f, 0.0f, 1e-4f, 1}, 5), kElementwise, kParityOnly},
      {"clip_grad_norm", "1_clipped", F32, {X({1}).Const().Head({3})}, ClipGradNorm(1.0f),
       kReduction, kParityOnly},
      {"clip_grad_norm", "1000_clipped", F32, {X({1000}).Range(-2, 2).Const()},
       ClipGradNorm(1.0f), kReduction, kParityOnly},
      {"clip_grad_norm", "1000_below_max", F32, {X({1000}).Range(-2, 2).Const()},
       ClipGradNorm(1e6f), kReduction, kParityOnly},
      {"clip_grad_norm", "3000000_clipped", F32, {X({3000000}).Range(-2, 2).Const()},
       ClipGradNorm(1.0f), kReduction, kParityOnly},
  };
  auto add = [&t](OpCase c) { t.push_back(std::move(c)); };

  // elementwise with broadcasting
  const std::pair<Shape, Shape> broadcasts[] = {
      {{3, 4}, {3, 4}},    {{2, 3, 4}, {4}}, {{5, 3}, {1, 3}},       {{5, 3}, {3}},
      {{2, 1, 4}, {3, 1}}, {{1}, {2, 3}},    {{2, 3, 4}, {2, 1, 4}}, {{4, 1, 3, 1}, {2, 1, 5}},
  };
  const std::pair<const char *, dt_status (*)(dt_tensor *, dt_tensor *, dt_tensor **)> binaries[] =
      {{"add", dt_op_add}, {"sub", dt_op_sub}, {"mul", dt_op_mul}};
  for (const auto &op : binaries)
    for (const auto &s : broadcasts)
      add({op.first,
           ShapeName(s.first) + "_by_" + ShapeName(s.second),
           F32,
           {X(s.first), X(s.second)},
           Binary(op.second)});

  // softmax, log-softmax: small, and long rows
  for (bool log : {false, true}) {
    const char *name = log ? "log_softmax" : "softmax";
    for (const Shape &s : {Shape{3, 5}, Shape{2, 3, 4}})
      add({name, ShapeName(s), F32, {X(s).Range(-2, 2)}, Softmax(log), kReduction});
    for (int64_t cols : {10, 257, 5000})
      add({name,
           ShapeName({33, cols}),
           F32,
           {X({33, cols}).Range(-8, 8)},
           Softmax(log),
           kReduction,
           kParityOnly});
  }

  // attention and the language-model ops (tests/op_table_cases_lm.cc)
  AddLanguageModelCases(&t);
  AddLlamaCases(&t);

  // cross-entropy over 1000 classes with ignored rows, and bad targets
  for (dt_dtype td : {DT_DTYPE_I32, DT_DTYPE_I64}) {
    std::string tn = dt_dtype_name(td);
    for (dt_reduction r : {DT_REDUCTION_NONE, DT_REDUCTION_MEAN})
      add({"cross_entropy",
           tn + "_50x1000_ignore_" + (r == DT_REDUCTION_NONE ? "none" : "mean"),
           F32,
           {X({50, 1000}).Range(-5, 5), RandIds({50}, 1000, td, 7)},
           CrossEntropy(r, -100),
           kReduction,
           kParityOnly});
    std::vector<int64_t> bad(50);
    for (int64_t i = 0; i < 50; i++)
      bad[i] = i % 7 == 3 ? -100 : (i * 37) % 1000;
    bad[17] = 1005, bad[30] = -3;
    add({"cross_entropy",
         tn + "_target_out_of_range",
         F32,
         {X({50, 1000}).Const(), Ids(bad, {50}, td)},
         CrossEntropy(DT_REDUCTION_MEAN, -100),
         kReduction,
         kParityOnly,
         DT_ERR_INVALID_ARG,
         "target 1005 at row 17"});
  }
  {
    std::vector<int64_t> bad(500);
    for (int64_t i = 0; i < 500; i++)
      bad[i] = (i * 7) % 50;
    bad[123] = 1000;
    add({"embedding",
         "index_out_of_range",
         F32,
         {Ids(bad, {500}), X({1000, 64}).Const()},
         Binary(dt_op_embedding),
         kExact,
         kParityOnly,
         DT_ERR_INVALID_ARG,
         "index 1000 at position 123"});
  }

  // pooling: distinct values (no near-ties) for the gradient check; the
  // larger geometries with an exact tie
  struct PoolGeom {
    Shape x;
    int k, s, p;
    unsigned flags;
  };
  const PoolGeom pools[] = {
      {{1, 2, 4, 4}, 2, 2, 0, 0},           {{2, 2, 5, 5}, 3, 2, 1, 0},  // stride 2 + padding
      {{1, 3, 6, 5}, 3, 1, 1, 0},                                        // overlapping windows
      {{2, 1, 7, 6}, 2, 3, 1, 0},  // stride > kernel: some inputs get no gradient
      {{2, 3, 8, 8}, 2, 2, 0, kParityOnly}, {{2, 4, 9, 7}, 3, 2, 1, kParityOnly},
      {{1, 2, 5, 5}, 3, 1, 1, kParityOnly},
  };
  for (const PoolGeom &g : pools) {
    std::string v = ShapeName(g.x) + "_k" + std::to_string(g.k) + "_s" + std::to_string(g.s) +
                    "_p" + std::to_string(g.p);
    Input x = g.flags & kParityOnly ? X(g.x).Head({0.1f, -0.2f, 0.3f, 0.5f, 0.5f})  // a tie
                                    : X(g.x).Distinct(0.05f);
    add({"max_pool2d", v, F32, {x}, Pool(dt_op_max_pool2d, g.k, g.s, g.p), kExact, g.flags});
    add({"avg_pool2d", v, F32, {X(g.x)}, Pool(dt_op_avg_pool2d, g.k, g.s, g.p), kExact, g.flags});
    // channels-last: x (N, H, W, C), the same windows
    Input xl = x;
    xl.shape = {g.x[0], g.x[2], g.x[3], g.x[1]};
    add({"max_pool2d_nhwc",
         v,
         F32,
         {xl},
         Pool(dt_op_max_pool2d_nhwc, g.k, g.s, g.p),
         kExact,
         g.flags});
    add({"avg_pool2d_nhwc",
         v,
         F32,
         {X(xl.shape)},
         Pool(dt_op_avg_pool2d_nhwc, g.k, g.s, g.p),
         kExact,
         g.flags});
  }

  // normalisation, small
  for (const Shape &s : {Shape{3, 2, 3, 2}, Shape{5, 3}}) {
    int64_t c = s[1];
    add({"batch_norm2d",
         "train_affine_" + ShapeName(s),
         F32,
         {X(s).Range(-2, 2), X({c}).Range(0.5f, 1.5f), X({c}), X({c}).Const(),
          X({c}).Range(0.5f, 1.5f).Const()},
         BatchNorm(1),
         kNormalisation});
    add({"batch_norm2d",
         "train_plain_" + ShapeName(s),
         F32,
         {X(s).Range(-2, 2)},
         BatchNorm(1),
         kNormalisation});
    for (int copies : {1, 2})
      add({"sync_batch_norm2d",
           (copies == 1 ? "one_process_" : "two_equal_processes_") + ShapeName(s),
           F32,
           {X(s).Range(-2, 2), X({c}).Range(0.5f, 1.5f), X({c}), X({c}).Const(),
            X({c}).Range(0.5f, 1.5f).Const()},
           SyncBatchNorm(copies),
           kNormalisation});
    add({"sync_batch_norm2d",
         "plain_" + ShapeName(s),
         F32,
         {X(s).Range(-2, 2)},
         SyncBatchNorm(2),
         kNormalisation});
  }
  for (const Shape &s : {Shape{3, 5}, Shape{2, 3, 4}}) {
    int64_t d = s.back();
    add({"layer_norm",
         "affine_" + ShapeName(s),
         F32,
         {X(s).Range(-2, 2), X({d}).Range(0.5f, 1.5f), X({d})},
         LayerNorm(),
         kNormalisation});
    add({"layer_norm",
         "plain_" + ShapeName(s),
         F32,
         {X(s).Range(-2, 2)},
         LayerNorm(),
         kNormalisation});
  }

  // reductions: small ones with every dims pattern, then long and wide ones
  struct ReduceDims {
    Shape shape;
    std::vector<int> dims;
    int keepdim;
    unsigned flags;
  };
  const ReduceDims reductions[] = {
      {{2, 3, 4}, {}, 0, 0},  // all dims -> scalar
      {{2, 3, 4}, {}, 1, 0},  // all dims, keepdim -> (1, 1, 1)
      {{2, 3, 4}, {0}, 0, 0},
      {{2, 3, 4}, {-1}, 1, 0},
      {{2, 3, 4}, {1, 2}, 1, 0},     // adjacent dims
      {{2, 3, 4}, {0, 2}, 0, 0},     // non-adjacent dims (backward: a broadcasting strided copy)
      {{2, 3, 4, 2}, {3, 1}, 1, 0},  // unordered, non-adjacent, keepdim
      {{5}, {0}, 0, 0},
      {{100000}, {0}, 0, kParityOnly},
      {{7, 33}, {1}, 0, kParityOnly},
      {{5, 3000, 13}, {1}, 0, kParityOnly},
      {{8192, 768}, {0}, 0, kParityOnly},
      {{3, 1, 4}, {1}, 0, kParityOnly},
      {{2, 70, 100}, {1}, 0, kParityOnly},
      {{70000, 3}, {1}, 0, kParityOnly},  // more than 65535 rows
  };
  for (const ReduceDims &r : reductions) {
    std::string v = ShapeName(r.shape) + (r.dims.empty() ? "_all" : "_dims");
    for (size_t i = 0; i < r.dims.size(); i++)
      v += (i ? "_" : "") +
           (r.dims[i] < 0 ? "m" + std::to_string(-r.dims[i]) : std::to_string(r.dims[i]));
    if (r.keepdim)
      v += "_keepdim";
    add({"sum", v, F32, {X(r.shape)}, Reduce(dt_op_sum, r.dims, r.keepdim), kReduction, r.flags});
    add({"mean", v, F32, {X(r.shape)}, Reduce(dt_op_mean, r.dims, r.keepdim), kReduction, r.flags});
  }

  // concat of more inputs than a node holds (a tree of nodes); one frozen
  {
    std::vector<Input> xs;
    for (int i = 0; i < 9; i++)
      xs.push_back(i == 4 ? X({2, 1 + i % 3, 2}).Const() : X({2, 1 + i % 3, 2}));
    add({"concat", "nine_inputs", F32, xs, Concat(1), kExact});
  }

  // casts between every pair of dtypes, NaN, Inf and f16's largest value included
  for (int s = 0; s < DT_DTYPE_COUNT; s++)
    for (int d = 0; d < DT_DTYPE_COUNT; d++)
      add({"to_dtype",
           std::string(dt_dtype_name((dt_dtype)s)) + "_to_" + dt_dtype_name((dt_dtype)d),
           F32,
           {X({1000}).Range(-300, 300).Const().Head({0.5f, -0.5f, 65504, 1e-8f, NAN, INFINITY})},
           Cast((dt_dtype)s, (dt_dtype)d),
           kExact,
           kParityOnly});

  // AdamW at several step counts (bias correction)
  for (int64_t steps : {0, 9, 999})
    add({"adamw",
         "step" + std::to_string(steps + 1),
         F32,
         {X({10000}).Const(), X({10000}).Const(), X({10000}).Range(-0.1f, 0.1f).Const(),
          X({10000}).Range(0, 0.01f).Const()},
         AdamW({1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f}, steps),
         kElementwise,
         kParityOnly});

  // Mixed precision: every op core/autocast_policy.def runs in low precision,
  // under autocast to each 16-bit dtype (f32 inputs, 16-bit products, f32
  // accumulation; the harness checks them against f32 and the device
  // against the CPU with the dtype's tolerances). Attention's rows are in
  // op_table_cases_lm.cc.
  for (dt_dtype d : {DT_DTYPE_BF16, DT_DTYPE_F16}) {
    add({"matmul",
         "autocast_7x64_by_64x9",
         d,
         {X({7, 64}), X({64, 9})},
         Binary(dt_op_matmul),
         kReduction});
    add({"matmul",
         "autocast_batched",
         d,
         {X({2, 5, 16}), X({2, 16, 6})},
         Binary(dt_op_matmul),
         kReduction});
    add({"linear", "autocast_bias", d, {X({6, 32}), X({8, 32}), X({8})}, Linear(), kReduction});
    add({"linear",
         "autocast_frozen_weight",
         d,
         {X({2, 3, 32}), X({8, 32}).Const()},
         Linear(),
         kReduction});
    // a gradient of over 2^20 elements: rounded to 16 bits in slices of rows
    add({"linear",
         "autocast_8195x8_to_130_sliced",
         d,
         {X({8195, 8}), X({130, 8}), X({130})},
         Linear(),
         kReduction});
    // one node: linear_gelu_forward and gemm_dgelu (on CUDA cuBLASLt's
    // GELU epilogues where the hidden width is a multiple of 8, else the
    // fallback kernels); the biases' input positions shift when left out
    add({"gelu_mlp",
         "autocast_bias",
         d,
         {X({2, 6, 32}), X({64, 32}), X({64}), X({16, 64}), X({16})},
         GeluMlp(true, true),
         kReduction});
    add({"gelu_mlp",
         "autocast_hidden_12",
         d,
         {X({7, 16}), X({12, 16}), X({12}), X({8, 12}), X({8})},
         GeluMlp(true, true),
         kReduction});
    add({"gelu_mlp",
         "autocast_no_fc_bias",
         d,
         {X({5, 16}), X({24, 16}), X({8, 24}), X({8})},
         GeluMlp(false, true),
         kReduction});
    add({"gelu_mlp",
         "autocast_no_biases_frozen_proj",
         d,
         {X({5, 16}), X({24, 16}), X({8, 24}).Const()},
         GeluMlp(false, false),
         kReduction});
    // pre and its gradient of over 2^20 elements: the CPU's slices of rows
    add({"gelu_mlp",
         "autocast_2100x8_hidden_512_sliced",
         d,
         {X({2100, 8}), X({512, 8}), X({512}), X({8, 512}), X({8})},
         GeluMlp(true, true),
         kReduction,
         kParityOnly});
    // autocast's NORM policy: f32 x, a 16-bit y rounded once (CUDA: the f32
    // path on f32 copies, as x and y differ); the large rows span many
    // blocks of a plane
    const std::vector<Input> bn = {X({4, 6, 5, 5}).Range(-2, 2), X({6}).Range(0.5f, 1.5f), X({6}),
                                   X({6}).Const(), X({6}).Range(0.5f, 1.5f).Const()};
    add({"batch_norm2d", "autocast_train", d, bn, BatchNorm(1), kNormalisation});
    add({"batch_norm2d", "autocast_eval", d, bn, BatchNorm(0), kNormalisation});
    add({"batch_norm2d",
         "autocast_plain",
         d,
         {X({3, 4, 3, 3}).Range(-2, 2)},
         BatchNorm(1),
         kNormalisation});
    add({"sync_batch_norm2d", "autocast_two_processes", d, bn, SyncBatchNorm(2), kNormalisation});
    add({"batch_norm2d",
         "autocast_train_16x64x16x16",
         d,
         {X({16, 64, 16, 16}).Range(-2, 3), X({64}).Range(0.5f, 1.5f), X({64}), X({64}).Const(),
          X({64}).Range(0.5f, 2).Const()},
         BatchNorm(1),
         kNormalisation,
         kParityOnly});
    add({"conv2d",
         "autocast_2x3x12x12_5x5_pad2",
         d,
         {X({2, 3, 12, 12}), X({4, 3, 5, 5}), X({4})},
         Conv2d(1, 2),
         kReduction});
    add({"conv2d_nhwc",
         "autocast_2x12x12x3_5x5_pad2",
         d,
         {X({2, 12, 12, 3}), X({4, 3, 5, 5}), X({4})},
         Conv2dNhwc(1, 2),
         kReduction});
    // a ResNet-50 stage-3 bottleneck's 1x1 and 3x3 shapes at batch 4: cuDNN's
    // NHWC tensor-core kernels on a GPU
    add({"conv2d_nhwc",
         "autocast_4x14x14x256_1x1_to_64",
         d,
         {X({4, 14, 14, 256}), X({64, 256, 1, 1})},
         Conv2dNhwc(1, 0),
         kReduction,
         kParityOnly});
    add({"conv2d_nhwc",
         "autocast_4x14x14x64_3x3_stride2",
         d,
         {X({4, 14, 14, 64}), X({64, 64, 3, 3})},
         Conv2dNhwc(2, 1),
         kReduction,
         kParityOnly});
  }

  // 16-bit activations: every op with a 16-bit input (Half(): a
  // low-precision op's result under autocast) against the same row in f32
  // (the harness checks the result's dtype against the op's policy: 16-bit
  // for the low-precision ops and for the PROMOTE ops of 16-bit inputs, f32
  // for the f32 ops and for 16-bit with f32). The large rows reach the
  // kernels' block and thread paths.
  for (dt_dtype d : {DT_DTYPE_BF16, DT_DTYPE_F16}) {
    const Shape bn = {3, 2, 4, 4};
    const std::vector<Input> bn_half = {X(bn).Range(-2, 2).Half(), X({2}).Range(0.5f, 1.5f), X({2}),
                                        X({2}).Const(), X({2}).Range(0.5f, 1.5f).Const()};
    std::vector<OpCase> rows = {
        {"matmul",
         "half_inputs",
         d,
         {X({7, 64}).Half(), X({64, 9}).Half()},
         Binary(dt_op_matmul),
         kReduction},
        {"linear", "half_x", d, {X({6, 32}).Half(), X({8, 32}), X({8})}, Linear(), kReduction},
        {"gelu_mlp",
         "half_x",
         d,
         {X({6, 32}).Half(), X({64, 32}), X({64}), X({8, 64}), X({8})},
         GeluMlp(true, true),
         kReduction},
        {"conv2d",
         "half_x",
         d,
         {X({2, 3, 8, 8}).Half(), X({4, 3, 3, 3}), X({4})},
         Conv2d(1, 1),
         kReduction},
        {"conv2d_nhwc",
         "half_x",
         d,
         {X({2, 8, 8, 3}).Half(), X({4, 3, 3, 3}), X({4})},
         Conv2dNhwc(1, 1),
         kReduction},
        {"add", "half_both_broadcast", d, {X({4, 5}).Half(), X({5}).Half()}, Binary(dt_op_add)},
        {"add", "half_plus_f32", d, {X({4, 5}).Half(), X({4, 5})}, Binary(dt_op_add)},
        {"sub", "f32_minus_half", d, {X({3, 4}), X({3, 4}).Half()}, Binary(dt_op_sub)},
        {"mul", "half_both", d, {X({3, 4}).Half(), X({3, 4}).Half()}, Binary(dt_op_mul)},
        {"scale",
         "half",
         d,
         {X({3, 4}).Half()},
         [](const V &x, dt_tensor **out) { return dt_op_scale(x[0], -2.5f, out); }},
        {"relu", "half", d, {X({2, 3, 4}).Away(0.05f).Half()}, Unary(dt_op_relu)},
        {"gelu", "half", d, {X({2, 3, 4}).Range(-3, 3).Half()}, Unary(dt_op_gelu)},
        {"tanh", "half", d, {X({5, 4}).Range(-2, 2).Half()}, Unary(dt_op_tanh)},
        {"relu",
         "half_40000",
         d,
         {X({40000}).Range(-4, 4).Head({0}).Half()},
         Unary(dt_op_relu),
         kElementwise,
         kParityOnly},
        {"gelu",
         "half_40000",
         d,
         {X({40000}).Range(-4, 4).Half()},
         Unary(dt_op_gelu),
         kElementwise,
         kParityOnly},
        {"tanh",
         "half_5000",
         d,
         {X({5000}).Range(-4, 4).Half()},
         Unary(dt_op_tanh),
         kElementwise,
         kParityOnly},
        {"dropout", "half_p0_3", d, {X({4, 6}).Half()}, Dropout(0.3f, 1234, 0)},
        {"max_pool2d",
         "half_2x2",
         d,
         {X({2, 3, 6, 6}).Distinct(0.01f).Half()},
         Pool(dt_op_max_pool2d, 2, 2, 0)},
        {"avg_pool2d",
         "half_3x3_pad1",
         d,
         {X({2, 3, 6, 6}).Half()},
         Pool(dt_op_avg_pool2d, 3, 2, 1)},
        // overlapping windows: dx sums several windows' gradients, rounded once
        {"max_pool2d",
         "half_3x3_s1_pad1",
         d,
         {X({1, 2, 5, 5}).Distinct(0.01f).Half()},
         Pool(dt_op_max_pool2d, 3, 1, 1)},
        {"avg_pool2d",
         "half_3x3_s1_pad1",
         d,
         {X({1, 3, 6, 5}).Half()},
         Pool(dt_op_avg_pool2d, 3, 1, 1)},
        // ResNet's stem pooling, channels-last
        {"max_pool2d_nhwc",
         "half_3x3_s2_pad1",
         d,
         {X({2, 9, 9, 4}).Distinct(0.01f).Half()},
         Pool(dt_op_max_pool2d_nhwc, 3, 2, 1)},
        {"avg_pool2d_nhwc",
         "half_3x3_s1_pad1",
         d,
         {X({1, 6, 5, 3}).Half()},
         Pool(dt_op_avg_pool2d_nhwc, 3, 1, 1)},
        // LeNet's first pooling at batch 8: the kernels' threads, the CUDA
        // grid (max pooling's threads are in cpu_half_rows_test: this many
        // values tie in 16 bits where the f32 reference's do not)
        {"avg_pool2d",
         "half_8x6x28x28",
         d,
         {X({8, 6, 28, 28}).Half()},
         Pool(dt_op_avg_pool2d, 2, 2, 0),
         kReduction,
         kParityOnly},
        {"concat", "half_dim1", d, {X({2, 3}).Half(), X({2, 2}).Half()}, Concat(1)},
        {"concat", "half_with_f32", d, {X({2, 3}).Half(), X({1, 3})}, Concat(0)},
        {"flatten", "half", d, {X({2, 3, 2, 2}).Half()}, Unary(dt_op_flatten)},
        {"softmax", "half", d, {X({5, 17}).Range(-3, 3).Half()}, Softmax(false), kReduction},
        {"log_softmax", "half", d, {X({5, 17}).Range(-3, 3).Half()}, Softmax(true), kReduction},
        {"causal_softmax",
         "half",
         d,
         {X({2, 2, 5, 5}).Range(-2, 2).Half()},
         Unary(dt_op_causal_softmax),
         kReduction},
        {"cross_entropy",
         "half_logits",
         d,
         {X({6, 10}).Range(-2, 2).Half(), RandIds({6}, 10)},
         CrossEntropy(DT_REDUCTION_MEAN, -100),
         kReduction},
        {"mse",
         "half",
         d,
         {X({4, 5}).Half(), X({4, 5}).Half()},
         Mse(DT_REDUCTION_MEAN),
         kReduction},
        {"batch_norm2d", "half_train", d, bn_half, BatchNorm(1), kNormalisation},
        {"batch_norm2d", "half_eval", d, bn_half, BatchNorm(0), kNormalisation},
        {"sync_batch_norm2d", "half_train", d, bn_half, SyncBatchNorm(2), kNormalisation},
        {"layer_norm",
         "half",
         d,
         {X({4, 16}).Range(-2, 2).Half(), X({16}).Range(0.5f, 1.5f), X({16})},
         LayerNorm(),
         kNormalisation},
        {"embedding",
         "half_table",
         d,
         {RandIds({5}, 7), X({7, 4}).Half()},
         [](const V &x, dt_tensor **out) { return dt_op_embedding(x[0], x[1], out); }},
        {"sum", "half", d, {X({4, 6}).Half()}, Reduce(dt_op_sum, {1}, false), kReduction},
        {"mean", "half", d, {X({4, 6}).Half()}, Reduce(dt_op_mean, {}, false), kReduction},
    };
    for (OpCase &c : rows)
      add(std::move(c));
  }
  return t;
}

}  // namespace

// ---- inputs ----

Input Input::Range(float l, float h) const {
  Input r = *this;
  r.lo = l, r.hi = h;
  return r;
}
Input Input::Const() const {
  Input r = *this;
  r.requires_grad = false;
  return r;
}
Input Input::Away(float margin) const {
  Input r = *this;
  r.fill = Fill::kAwayFromZero, r.lo = margin;
  return r;
}
Input Input::Distinct(float gap) const {
  Input r = *this;
  r.fill = Fill::kDistinct, r.lo = gap;
  return r;
}
Input Input::Head(std::vector<float> values) const {
  Input r = *this;
  r.head = std::move(values);
  return r;
}
Input Input::Half() const {
  Input r = *this;
  r.half = true;
  return r;
}

Input X(std::vector<int64_t> shape) {
  Input r;
  r.shape = std::move(shape);
  return r;
}

Input Ids(std::vector<int64_t> ids, std::vector<int64_t> shape, dt_dtype dtype) {
  Input r;
  r.shape = std::move(shape);
  r.fill = Fill::kIndex, r.requires_grad = false, r.index_dtype = dtype, r.ids = std::move(ids);
  return r;
}

Input RandIds(std::vector<int64_t> shape, int64_t classes, dt_dtype dtype, int64_t ignore_every,
              int64_t ignore) {
  Input r;
  r.shape = std::move(shape);
  r.fill = Fill::kIndex, r.requires_grad = false, r.index_dtype = dtype;
  r.lo = 0, r.hi = (float)classes, r.ignore_every = ignore_every, r.ignore = ignore;
  return r;
}

std::string OpCase::Name() const {
  return op + "_" + dt_dtype_name(dtype) + (variant.empty() ? "" : "_" + variant);
}

const std::vector<OpCase> &OpCases() {
  static const std::vector<OpCase> cases = Build();
  return cases;
}

void PrintTo(const OpCase *c, std::ostream *os) { *os << c->Name(); }

}  // namespace optable
