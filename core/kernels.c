/* The kernel dispatch generated from core/op_table.def: the execution
 * context, the argument checks every backend relies on (written once,
 * here), and one dt_kernel_<name>() per kernel. */
#include <math.h>
#include <stdio.h>

#include "core/backend.h"
#include "core/half.h"

dt_status dt_exec_init(dt_device dev, dt_dtype dtype, dt_exec *out) {
  const dt_backend_ops *be = NULL;
  DT_CHECK(dt_backend_get(dev, &be));
  out->be = be;
  out->dev = dev;
  out->dtype = dtype;
  out->stream = be->stream ? be->stream(dev, DT_STREAM_COMPUTE) : NULL;
  return DT_OK;
}

/* The backend implements `name` for ex->dtype. */
static dt_status kernel_begin(const dt_exec *ex, const char *name, unsigned dtypes,
                              int implemented) {
  if (!ex || !ex->be)
    return DT_ERROR(DT_ERR_INVALID_ARG, "kernel %s: no execution context (use dt_exec_init)", name);
  if ((unsigned)ex->dtype >= DT_DTYPE_COUNT || !(dtypes & DT_KDTYPE(ex->dtype)))
    return DT_ERROR(DT_ERR_DTYPE, "kernel %s: element type %s is not supported: convert to f32",
                    name, (unsigned)ex->dtype < DT_DTYPE_COUNT ? dt_dtype_name(ex->dtype) : "?");
  if (!implemented)
    return DT_ERROR(DT_ERR_UNSUPPORTED, "kernel %s is not implemented by the %s backend", name,
                    ex->be->name);
  return DT_OK;
}

/* ---- strided iteration plans ---- */

void dt_strided_plan_build(dt_strided_plan *p, int ndim, const int64_t *shape, const int64_t *s0,
                           const int64_t *s1, const int64_t *s2) {
  const int64_t *in[3] = {s0, s1, s2};
  int nd = 0;
  p->numel = 1;
  for (int d = 0; d < ndim; d++) {
    p->numel *= shape[d];
    if (shape[d] == 1)
      continue;
    if (nd > 0) {
      int j = nd - 1;
      bool merge = true;
      for (int k = 0; k < 3; k++)
        merge = merge && p->s[k][j] == in[k][d] * shape[d];
      if (merge) {
        p->shape[j] *= shape[d];
        for (int k = 0; k < 3; k++)
          p->s[k][j] = in[k][d];
        continue;
      }
    }
    p->shape[nd] = shape[d];
    for (int k = 0; k < 3; k++)
      p->s[k][nd] = in[k][d];
    nd++;
  }
  if (nd == 0) {
    p->shape[0] = 1;
    for (int k = 0; k < 3; k++)
      p->s[k][0] = 0;
    nd = 1;
  }
  p->ndim = nd;
}

void dt_binary_plan(const dt_binary_args *args, dt_strided_plan *p) {
  int64_t out_strides[DT_MAX_DIMS];
  int64_t acc = 1;
  for (int d = args->ndim - 1; d >= 0; d--) {
    out_strides[d] = acc;
    acc *= args->shape[d];
  }
  dt_strided_plan_build(p, args->ndim, args->shape, out_strides, args->a_strides, args->b_strides);
}

/* ---- argument checks named by the op table ---- */

static dt_status dt_kcheck_sizes(const char *op, int64_t a, int64_t b, int64_t c) {
  if (a < 0 || b < 0 || c < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: negative size (%lld, %lld, %lld)", op, (long long)a,
                    (long long)b, (long long)c);
  return DT_OK;
}

static dt_status dt_kcheck_cast(int64_t n, dt_dtype src, dt_dtype dst) {
  if ((unsigned)src >= DT_DTYPE_COUNT || (unsigned)dst >= DT_DTYPE_COUNT)
    return DT_ERROR(DT_ERR_DTYPE, "cast: unknown dtype (src %d, dst %d)", (int)src, (int)dst);
  return dt_kcheck_sizes("cast", n, 0, 0);
}

static dt_status dt_kcheck_strided(const int64_t *shape, int ndim, size_t elem_size) {
  if (ndim < 0 || ndim > DT_MAX_DIMS || elem_size == 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "copy_strided: ndim %d (max %d), elem_size %zu", ndim,
                    DT_MAX_DIMS, elem_size);
  for (int d = 0; d < ndim; d++)
    if (shape[d] < 0)
      return DT_ERROR(DT_ERR_INVALID_ARG, "copy_strided: negative size %lld in dim %d",
                      (long long)shape[d], d);
  return DT_OK;
}

static int max_int(int a, int b) { return a > b ? a : b; }

dt_status dt_kcheck_gemm(bool trans_a, bool trans_b, int m, int n, int k, int lda, int ldb, int ldc,
                         int batch) {
  if (m < 0 || n < 0 || k < 0 || batch < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "gemm: negative size: m=%d n=%d k=%d batch=%d", m, n, k,
                    batch);
  int need_a = max_int(1, trans_a ? m : k), need_b = max_int(1, trans_b ? k : n),
      need_c = max_int(1, n);
  if (lda < need_a || ldb < need_b || ldc < need_c)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "gemm: leading dimension too small: lda=%d (need >= %d), ldb=%d (need >= "
                    "%d), ldc=%d (need >= %d) for m=%d n=%d k=%d trans_a=%d trans_b=%d",
                    lda, need_a, ldb, need_b, ldc, need_c, m, n, k, trans_a, trans_b);
  return DT_OK;
}

static dt_status dt_kcheck_linear(const char *name, int m, int n, int k) {
  if (m < 0 || n < 0 || k < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: sizes m=%d n=%d k=%d: m and n must be >= 0, k >= 1",
                    name, m, n, k);
  return DT_OK;
}

static dt_status dt_kcheck_binary(const dt_binary_args *args) {
  if (args->ndim < 0 || args->ndim > DT_MAX_DIMS)
    return DT_ERROR(DT_ERR_INVALID_ARG, "binary: ndim %d outside [0, %d]", args->ndim, DT_MAX_DIMS);
  if ((unsigned)args->op > DT_BINARY_DIV)
    return DT_ERROR(DT_ERR_INVALID_ARG, "binary: unknown op %d", (int)args->op);
  for (int d = 0; d < args->ndim; d++)
    if (args->shape[d] < 0)
      return DT_ERROR(DT_ERR_INVALID_ARG, "binary: negative size %lld in dim %d",
                      (long long)args->shape[d], d);
  return DT_OK;
}

static dt_status dt_kcheck_unary(const char *op, dt_unary_op u, int64_t n) {
  if ((unsigned)u > DT_UNARY_TANH)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: unknown op %d", op, (int)u);
  return dt_kcheck_sizes(op, n, 0, 0);
}

/* Class ids / token ids: i32 or i64 indices into `classes` (values are
 * checked by the kernels, which read them). */
static dt_status dt_kcheck_classes(const char *op, dt_dtype idx_dtype, int64_t n, int64_t classes) {
  if (idx_dtype != DT_DTYPE_I32 && idx_dtype != DT_DTYPE_I64)
    return DT_ERROR(DT_ERR_DTYPE, "%s: index dtype %s: class and token ids must be i32 or i64", op,
                    (unsigned)idx_dtype < DT_DTYPE_COUNT ? dt_dtype_name(idx_dtype) : "?");
  return dt_kcheck_sizes(op, n, classes, 0);
}

/* The fused classifier: vp columns of which the first `classes` are real. */
static dt_status dt_kcheck_classifier(dt_dtype target_dtype, int64_t n, int64_t vp,
                                      int64_t classes) {
  DT_CHECK(dt_kcheck_classes("classifier_loss_forward", target_dtype, n, vp));
  if (classes < 1 || classes > vp)
    return DT_ERROR(
        DT_ERR_INVALID_ARG,
        "classifier_loss_forward: %lld classes in rows of %lld logits: expected 1..%lld",
        (long long)classes, (long long)vp, (long long)vp);
  return DT_OK;
}

/* Convolution (conv) or pooling geometry: positive sizes, the output size
 * the input, kernel, stride and padding give, and for pooling PyTorch's
 * padding <= kernel / 2. */
static dt_status dt_kcheck_geom(const char *op, const dt_conv2d_geom *g, bool conv) {
  if (g->n < 0 || g->c < (conv ? 1 : 0) || g->h <= 0 || g->w <= 0 || g->kh <= 0 || g->kw <= 0 ||
      g->sh <= 0 || g->sw <= 0 || g->ph < 0 || g->pw < 0 || (conv && g->oc <= 0) ||
      (g->nhwc != 0 && g->nhwc != 1))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s: bad geometry: n=%d c=%d h=%d w=%d oc=%d kernel %dx%d stride %dx%d "
                    "padding %dx%d nhwc %d",
                    op, g->n, g->c, g->h, g->w, g->oc, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw,
                    g->nhwc);
  if (!conv && (2 * g->ph > g->kh || 2 * g->pw > g->kw))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s: padding %dx%d is more than half the kernel %dx%d (as PyTorch, pad <= "
                    "kernel/2)",
                    op, g->ph, g->pw, g->kh, g->kw);
  int64_t hp = (int64_t)g->h + 2 * g->ph, wp = (int64_t)g->w + 2 * g->pw;
  int64_t oh = hp < g->kh ? 0 : (hp - g->kh) / g->sh + 1;
  int64_t ow = wp < g->kw ? 0 : (wp - g->kw) / g->sw + 1;
  if (oh == 0 || ow == 0 || g->oh != oh || g->ow != ow)
    return DT_ERROR(DT_ERR_SHAPE,
                    "%s: output %dx%d does not match input %dx%d, kernel %dx%d, stride %dx%d, "
                    "padding %dx%d (expected %lldx%lld): the window must fit in the padded "
                    "input",
                    op, g->oh, g->ow, g->h, g->w, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw,
                    (long long)oh, (long long)ow);
  return DT_OK;
}

static dt_status dt_kcheck_float_width(const char *op, const char *what, dt_dtype d);

/* y_dtype: the result's (forward) or its gradient's (backward) dtype. */
static dt_status dt_kcheck_batch_norm2d(const char *op, dt_dtype y_dtype, int64_t n, int64_t c,
                                        int64_t hw, bool training, float momentum, float eps,
                                        const float *running_mean, const float *running_var) {
  DT_CHECK(dt_kcheck_float_width(op, "result (or its gradient)", y_dtype));
  DT_CHECK(dt_kcheck_sizes("batch_norm2d", n, c, hw));
  if (training && n * hw <= 1)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "batch_norm2d: training needs more than 1 value per channel, got n=%lld x "
                    "hw=%lld: use a batch larger than 1 or eval mode",
                    (long long)n, (long long)hw);
  if (!training && (!running_mean || !running_var))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "batch_norm2d: eval mode needs running_mean and running_var");
  if (!(eps >= 0.0f) || !(momentum >= 0.0f && momentum <= 1.0f))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "batch_norm2d: eps %g must be >= 0 and momentum %g in [0, 1]", (double)eps,
                    (double)momentum);
  return DT_OK;
}

/* A float dtype of any width (f32, f16, bf16): the name for an error. */
static dt_status dt_kcheck_float_width(const char *op, const char *what, dt_dtype d) {
  if (d != DT_DTYPE_F32 && !dt_dtype_is_half(d))
    return DT_ERROR(DT_ERR_DTYPE, "%s: %s dtype %s: expected f32, f16 or bf16", op, what,
                    (unsigned)d < DT_DTYPE_COUNT ? dt_dtype_name(d) : "?");
  return DT_OK;
}

/* A norm's rows and its result's (or the result's gradient's) dtype. */
static dt_status dt_kcheck_layer_norm(const char *op, dt_dtype y_dtype, int64_t rows,
                                      int64_t cols) {
  if (rows < 0 || cols <= 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: bad size (rows %lld, cols %lld)", op, (long long)rows,
                    (long long)cols);
  return dt_kcheck_float_width(op, "result", y_dtype);
}

/* The residual of the fused residual layer norm: a float of any width. */
static dt_status dt_kcheck_residual_layer_norm(dt_dtype residual_dtype, dt_dtype y_dtype,
                                               int64_t rows, int64_t cols) {
  DT_CHECK(dt_kcheck_float_width("residual_layer_norm_forward", "residual", residual_dtype));
  return dt_kcheck_layer_norm("residual_layer_norm_forward", y_dtype, rows, cols);
}

/* Attention geometry: b sequences of t positions, h heads of hd columns. */
static dt_status dt_kcheck_attention(const char *op, int64_t b, int64_t t, int64_t h, int64_t hd) {
  if (b < 0 || t < 0 || h < 1 || hd < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s: bad geometry (batch %lld, positions %lld, heads %lld, head size %lld)", op,
                    (long long)b, (long long)t, (long long)h, (long long)hd);
  return DT_OK;
}

/* RoPE geometry: n sequences of t positions, rows of c columns that hold
 * heads of hd (even) columns, the first n_rot of them rotated; theta > 0. */
static dt_status dt_kcheck_rope(int64_t n, int64_t t, int64_t c, int64_t hd, int64_t n_rot,
                                float theta) {
  if (n < 0 || t < 0 || hd < 2 || hd % 2 != 0 || c % hd != 0 || n_rot < 0 || n_rot * hd > c)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "rope: bad geometry (sequences %lld, positions %lld, row %lld, head size "
                    "%lld, rotated heads %lld): the head size must be even and divide the row",
                    (long long)n, (long long)t, (long long)c, (long long)hd, (long long)n_rot);
  if (!(theta > 0.0f) || isinf(theta))
    return DT_ERROR(DT_ERR_INVALID_ARG, "rope: theta %g must be a positive finite number",
                    (double)theta);
  return DT_OK;
}

static dt_status dt_kcheck_dropout(int64_t n, float p) {
  if (!(p >= 0.0f && p <= 1.0f))
    return DT_ERROR(DT_ERR_INVALID_ARG, "dropout: probability p=%g outside [0, 1]", (double)p);
  return dt_kcheck_sizes("dropout", n, 0, 0);
}

/* The optimizers' 16-bit output, when there is one. */
static dt_status dt_kcheck_half_out(const char *who, int64_t n, const dt_half_out *half) {
  if (half == NULL)
    return DT_OK;
  if (half->dtype != DT_DTYPE_BF16 && half->dtype != DT_DTYPE_F16)
    return DT_ERROR(DT_ERR_DTYPE, "%s: the 16-bit working copy is %s: expected bf16 or f16", who,
                    dt_dtype_name(half->dtype));
  if (n > 0 && half->data == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: the 16-bit working copy has no buffer", who);
  return DT_OK;
}

static dt_status dt_kcheck_half_copy(int64_t n, const dt_half_out *half) {
  DT_CHECK(dt_kcheck_sizes("half_copy", n, 0, 0));
  if (half == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "half_copy: no 16-bit output (NULL)");
  return dt_kcheck_half_out("half_copy", n, half);
}

static dt_status dt_kcheck_sgd(int64_t n, const float *momentum_buf, float lr, float momentum,
                               float dampening, float weight_decay, bool nesterov,
                               const dt_half_out *half) {
  DT_CHECK(dt_kcheck_sizes("sgd_update", n, 0, 0));
  DT_CHECK(dt_kcheck_half_out("sgd_update", n, half));
  if (!(lr >= 0.0f) || !(momentum >= 0.0f) || !(weight_decay >= 0.0f) ||
      !(dampening >= 0.0f && dampening <= 1.0f))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "sgd_update: lr %g, momentum %g, weight decay %g must be >= 0 and dampening "
                    "%g in [0, 1]",
                    (double)lr, (double)momentum, (double)weight_decay, (double)dampening);
  if (momentum != 0.0f && !momentum_buf)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "sgd_update: momentum %g needs a momentum buffer (got NULL)", (double)momentum);
  if (nesterov && (momentum <= 0.0f || dampening != 0.0f))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "sgd_update: nesterov needs momentum > 0 and dampening 0 (got momentum %g, "
                    "dampening %g), as torch.optim.SGD",
                    (double)momentum, (double)dampening);
  return DT_OK;
}

static dt_status dt_kcheck_adamw(int64_t n, float lr, float beta1, float beta2, float eps,
                                 float weight_decay, int step, const dt_half_out *half) {
  DT_CHECK(dt_kcheck_sizes("adamw_update", n, 0, 0));
  DT_CHECK(dt_kcheck_half_out("adamw_update", n, half));
  if (step < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "adamw_update: step %d: steps count from 1 (bias correction 1-beta^step)",
                    step);
  if (!(beta1 >= 0.0f && beta1 < 1.0f) || !(beta2 >= 0.0f && beta2 < 1.0f))
    return DT_ERROR(DT_ERR_INVALID_ARG, "adamw_update: betas (%g, %g) must lie in [0, 1)",
                    (double)beta1, (double)beta2);
  if (!(lr >= 0.0f) || !(eps > 0.0f) || !(weight_decay >= 0.0f))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "adamw_update: lr %g and weight decay %g must be >= 0, eps %g > 0", (double)lr,
                    (double)weight_decay, (double)eps);
  return DT_OK;
}

/* ---- the dispatch ---- */

#define DT_KERNEL(name, dtypes, check, params, args)                           \
  dt_status dt_kernel_##name DT_KPARAMS params {                               \
    DT_CHECK(kernel_begin(ex, #name, (dtypes), ex && ex->be && ex->be->name)); \
    DT_CHECK(check);                                                           \
    return ex->be->name DT_KARGS args;                                         \
  }
#include "core/op_table.def"
