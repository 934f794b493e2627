/* Losses: cross-entropy (fused log-softmax + NLL) and mean squared error. */
#include <math.h>
#include <string.h>

#include "core/ops_internal.h"

/* shape pointer for 0-dim (scalar) outputs */
static const int64_t scalar_shape[1] = {1};

/* out (0-dim) = scale * sum(x (n)); x contiguous f32. n == 0 gives 0. */
static dt_status sum_to_scalar(dt_device dev, const float *x, int64_t n, float scale, float *out) {
  dt_exec ex;
  DT_CHECK(dt_exec_init(dev, DT_DTYPE_F32, &ex));
  if (n == 0)
    return dt_kernel_fill(&ex, out, 0.0f, 1);
  return dt_kernel_reduce_sum(&ex, x, out, 1, n, 1, scale);
}

static const char *reduction_name(dt_reduction r) {
  switch (r) {
    case DT_REDUCTION_MEAN: return "mean";
    case DT_REDUCTION_SUM: return "sum";
    case DT_REDUCTION_NONE: return "none";
  }
  return "?";
}

static dt_status check_reduction(const char *op, dt_reduction r) {
  if (r != DT_REDUCTION_MEAN && r != DT_REDUCTION_SUM && r != DT_REDUCTION_NONE)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s: unknown reduction %d: use DT_REDUCTION_MEAN, _SUM or _NONE", op, (int)r);
  return DT_OK;
}

/* The arguments of a classification loss: logits (N, C) or (..., C) f32
 * with C >= 1, target (N) or (...) i32/i64 on the same device; *cols = C,
 * *rows = N. */
static dt_status check_logits_target(const char *op, dt_tensor *logits, dt_tensor *target,
                                     int64_t *cols, int64_t *rows) {
  DT_CHECK(dt_ops_check_indexed(op, target, "target", "class ids", logits));
  int nl = dt_tensor_ndim(logits);
  const int64_t *sl = dt_tensor_shape(logits);
  char bl[128], bt[128];
  *cols = nl >= 1 ? sl[nl - 1] : 0;
  *rows = nl >= 1 ? dt_shape_numel(sl, nl - 1) : 0;
  if (nl < 1 || *cols < 1 || dt_tensor_numel(target) != *rows)
    return DT_ERROR(
        DT_ERR_SHAPE,
        "%s: logits %s and target %s do not match: expected logits (N, C) or "
        "(..., C) with C >= 1 and target (N) or (...)",
        op, dt_shape_format(sl, nl, bl, sizeof bl),
        dt_shape_format(dt_tensor_shape(target), dt_tensor_ndim(target), bt, sizeof bt));
  return DT_OK;
}

/* ---- cross-entropy ---- */

/* out (n) = a[0] / b[0] for every element: scalars a and b broadcast, on
 * the device (the mean's division by the kept-row count, which stays on
 * the device). */
static dt_status divide_scalars(const dt_exec *ex, const float *a, const float *b, float *out,
                                int64_t n) {
  dt_binary_args args;
  memset(&args, 0, sizeof args);
  args.op = DT_BINARY_DIV;
  args.ndim = 1;
  args.shape[0] = n;
  return dt_kernel_binary(ex, &args, a, b, out);
}

/* saved: 0 logits (rows, c) contiguous, 1 target (rows) contiguous, 2 lse
 * (rows), 3 count (1: rows kept, f32, on the device). */
typedef struct cross_entropy_saved {
  dt_reduction reduction;
  int64_t ignore_index, rows, c;
} cross_entropy_saved;

static dt_status cross_entropy_backward(dt_node *node, dt_tensor *g, dt_tensor **grad_in) {
  dt_tensor *logits = node->saved[0], *target = node->saved[1], *lse = node->saved[2];
  dt_tensor *count = node->saved[3];
  const cross_entropy_saved *s = DT_NODE_PARAMS(node, cross_entropy_saved);
  dt_reduction red = s->reduction;
  int64_t ignore = s->ignore_index, rows = s->rows, c = s->c;
  dt_device dev = dt_tensor_device(g);
  const dt_exec ex = dt_tensor_exec(g);
  dt_tensor *dlogits = NULL, *drows = NULL;
  dt_status st;
  DT_CHECK(dt_ops_empty_like(logits, dev, &dlogits));
  if (rows * c > 0) {
    const float *dloss_rows = DT_F32(g);
    if (red != DT_REDUCTION_NONE) {
      /* drows (rows) = g (scalar), over the count for the mean. With no
       * row kept that is g/0, but every row is then ignored, and ignored
       * rows get a zero gradient whatever their dloss. */
      DT_CHECK_GOTO(dt_tensor_empty(&rows, 1, DT_DTYPE_F32, dev, &drows), st, fail);
      if (red == DT_REDUCTION_SUM)
        DT_CHECK_GOTO(dt_kernel_broadcast_axis(&ex, DT_F32(g), DT_F32(drows), 1, rows, 1, 1.0f), st,
                      fail);
      else
        DT_CHECK_GOTO(divide_scalars(&ex, DT_F32(g), DT_F32(count), DT_F32(drows), rows), st, fail);
      dloss_rows = DT_F32(drows);
    }
    DT_CHECK_GOTO(dt_kernel_cross_entropy_backward(&ex, DT_F32(logits), dt_tensor_data(target),
                                                   dt_tensor_dtype(target), DT_F32(lse), dloss_rows,
                                                   DT_F32(dlogits), rows, c, ignore),
                  st, fail);
  }
  st = DT_OK;
fail:
  dt_tensor_release(drows);
  return dt_ops_grad_result(st, dlogits, &grad_in[0]);
}

dt_status dt_op_cross_entropy(dt_tensor *logits, dt_tensor *target, dt_reduction reduction,
                              int64_t ignore_index, dt_tensor **out) {
  static const char *op = "dt_op_cross_entropy";
  if (!out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument", op);
  /* 16-bit logits: widened, an f32 loss (autocast's fp32 ops) */
  DT_OPS_RUN_IN_F32(logits, DT_DTYPE_F32, l32, out,
                    dt_op_cross_entropy(l32, target, reduction, ignore_index, out));
  int64_t c = 0, rows = 0;
  DT_CHECK(check_logits_target(op, logits, target, &c, &rows));
  DT_CHECK(check_reduction(op, reduction));
  dt_dtype tdt = dt_tensor_dtype(target);

  dt_device dev = dt_tensor_device(logits);
  const dt_exec ex = dt_tensor_exec(logits);
  dt_tensor *lc = NULL, *tc = NULL, *loss_rows = NULL, *lse = NULL, *count = NULL, *y = NULL;
  dt_tensor *sum = NULL;
  dt_node *node = NULL;
  dt_status st;
  DT_CHECK_GOTO(dt_ops_contiguous(logits, &lc), st, fail);
  DT_CHECK_GOTO(dt_ops_contiguous(target, &tc), st, fail);
  /* loss_rows has target's shape so that reduction "none" returns it as is */
  DT_CHECK_GOTO(dt_ops_empty_like(target, dev, &loss_rows), st, fail);
  DT_CHECK_GOTO(dt_tensor_empty(&rows, 1, DT_DTYPE_F32, dev, &lse), st, fail);
  DT_CHECK_GOTO(dt_tensor_empty(scalar_shape, 0, DT_DTYPE_F32, dev, &count), st, fail);
  if (rows > 0)
    DT_CHECK_GOTO(dt_kernel_cross_entropy_forward(&ex, DT_F32(lc), dt_tensor_data(tc), tdt, rows, c,
                                                  ignore_index, DT_F32(loss_rows), DT_F32(lse),
                                                  DT_F32(count)),
                  st, fail);
  else
    DT_CHECK_GOTO(dt_kernel_fill(&ex, DT_F32(count), 0.0f, 1), st, fail);
  if (reduction == DT_REDUCTION_NONE) {
    y = dt_tensor_retain(loss_rows);
  } else {
    DT_CHECK_GOTO(dt_tensor_empty(scalar_shape, 0, DT_DTYPE_F32, dev, &y), st, fail);
    if (reduction == DT_REDUCTION_SUM) {
      DT_CHECK_GOTO(sum_to_scalar(dev, DT_F32(loss_rows), rows, 1.0f, DT_F32(y)), st, fail);
    } else {
      /* sum / count on the device; over zero kept rows that is 0/0 = NaN,
       * as PyTorch gives */
      DT_CHECK_GOTO(dt_tensor_empty(scalar_shape, 0, DT_DTYPE_F32, dev, &sum), st, fail);
      DT_CHECK_GOTO(sum_to_scalar(dev, DT_F32(loss_rows), rows, 1.0f, DT_F32(sum)), st, fail);
      DT_CHECK_GOTO(divide_scalars(&ex, DT_F32(sum), DT_F32(count), DT_F32(y), 1), st, fail);
    }
  }
  DT_CHECK_GOTO(dt_ops_maybe_record(op, cross_entropy_backward, &logits, 1, y, &node), st, fail);
  dt_tensor *saved[4] = {lc, tc, lse, count};
  dt_ops_save_for_backward(node, saved, 4);
  DT_OPS_SAVE_PARAMS(node, cross_entropy_saved, {reduction, ignore_index, rows, c});
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(y, sum, count, loss_rows, lse, tc, lc);
  return st;
}

/* ---- fused classifier (LM-head loss) ---- */

/* saved: 0 dlogits (rows, vp): (softmax - onehot) * dlogits_scale, in the
 * logits' dtype (a 16-bit activation's gradient is 16-bit); 1 count (1:
 * rows kept times dlogits_scale, f32, on the device) */
static dt_status classifier_loss_backward(dt_node *node, dt_tensor *g, dt_tensor **grad_in) {
  dt_tensor *dlogits = node->saved[0], *count = node->saved[1];
  int64_t n = dt_tensor_numel(dlogits);
  /* the buffer is the node's and backward runs once: scale it in place */
  dt_status st = DT_OK;
  if (n > 0)
    st = dt_kernel_classifier_loss_backward(DT_TENSOR_EXEC(dlogits), DT_F32(dlogits), DT_F32(g),
                                            DT_F32(count), n);
  return dt_ops_grad_result(st, dt_tensor_retain(dlogits), &grad_in[0]);
}

/* The fused classifier; `reuse` lets the gradient overwrite the logits
 * (the caller has given up its reference and nothing else holds them). */
static dt_status classifier_loss(const char *op, dt_tensor *logits, dt_tensor *target,
                                 int64_t n_classes, int64_t ignore_index, bool reuse,
                                 dt_tensor **out) {
  if (!out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument", op);
  int64_t vp = 0, rows = 0;
  DT_CHECK(check_logits_target(op, logits, target, &vp, &rows));
  dt_dtype tdt = dt_tensor_dtype(target);
  char bl[128];
  if (n_classes < 1 || n_classes > vp)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s: n_classes %lld for logits %s: the classes are the first 1..%lld "
                    "columns (the rest pad the vocabulary)",
                    op, (long long)n_classes,
                    dt_shape_format(dt_tensor_shape(logits), dt_tensor_ndim(logits), bl, sizeof bl),
                    (long long)vp);
  dt_device dev = dt_tensor_device(logits);
  /* 16-bit logits are read as they are (f32 math) and their gradient
   * buffer has their dtype: no f32 copy of the LM head's output */
  const dt_exec ex = dt_tensor_exec(logits);
  dt_exec ex32;
  DT_CHECK(dt_exec_init(dev, DT_DTYPE_F32, &ex32));
  const int record = dt_autograd_should_record(&logits, 1);
  reuse = reuse && record && dt_tensor_is_contiguous(logits) && logits->refcount == 1 &&
          logits->storage->refcount == 1;
  dt_tensor *lc = NULL, *tc = NULL, *loss_rows = NULL, *dlogits = NULL, *y = NULL;
  dt_tensor *count = NULL, *sum = NULL;
  dt_node *node = NULL;
  dt_status st;
  DT_CHECK_GOTO(dt_ops_contiguous(logits, &lc), st, fail);
  DT_CHECK_GOTO(dt_ops_contiguous(target, &tc), st, fail);
  DT_CHECK_GOTO(dt_tensor_empty(&rows, 1, DT_DTYPE_F32, dev, &loss_rows), st, fail);
  if (reuse)
    DT_CHECK_GOTO(dt_tensor_detach(lc, &dlogits), st, fail);
  else if (record)
    DT_CHECK_GOTO(dt_tensor_empty(dt_tensor_shape(lc), dt_tensor_ndim(lc), dt_tensor_dtype(lc), dev,
                                  &dlogits),
                  st, fail);
  /* logits (rows, vp) -> loss_rows (rows), dlogits (rows, vp) = (softmax - onehot) *
   * dlogits_scale: in f16, 2^15 (|softmax - onehot| <= 1) keeps the small
   * probabilities out of the subnormals (GPT-2's ~2e-5 are below f16's
   * 6.1e-5); the backward divides it out again with the count it gets */
  const float dlogits_scale = dt_tensor_dtype(lc) == DT_DTYPE_F16 ? 32768.0f : 1.0f;
  DT_CHECK_GOTO(dt_tensor_empty(scalar_shape, 0, DT_DTYPE_F32, dev, &count), st, fail);
  if (rows > 0)
    DT_CHECK_GOTO(dt_kernel_classifier_loss_forward(&ex, DT_F32(lc), dt_tensor_data(tc), tdt, rows,
                                                    vp, n_classes, ignore_index, DT_F32(loss_rows),
                                                    dlogits ? DT_F32(dlogits) : NULL, dlogits_scale,
                                                    DT_F32(count)),
                  st, fail);
  else
    DT_CHECK_GOTO(dt_kernel_fill(&ex32, DT_F32(count), 0.0f, 1), st, fail);
  /* sum / count on the device (the count stays there); over zero kept rows
   * that is 0/0 = NaN, as PyTorch gives */
  DT_CHECK_GOTO(dt_tensor_empty(scalar_shape, 0, DT_DTYPE_F32, dev, &sum), st, fail);
  DT_CHECK_GOTO(dt_tensor_empty(scalar_shape, 0, DT_DTYPE_F32, dev, &y), st, fail);
  DT_CHECK_GOTO(sum_to_scalar(dev, DT_F32(loss_rows), rows, 1.0f, DT_F32(sum)), st, fail);
  DT_CHECK_GOTO(divide_scalars(&ex32, DT_F32(sum), DT_F32(count), DT_F32(y), 1), st, fail);
  DT_CHECK_GOTO(dt_ops_maybe_record(op, classifier_loss_backward, &logits, 1, y, &node), st, fail);
  if (node && dlogits_scale != 1.0f) { /* the backward's count: count * dlogits_scale, exact */
    dt_tensor *scaled = NULL;
    DT_CHECK_GOTO(dt_ops_scaled_copy(count, dlogits_scale, &scaled), st, fail);
    dt_tensor_release(count);
    count = scaled;
  }
  dt_tensor *saved[2] = {dlogits, count};
  dt_ops_save_for_backward(node, saved, 2);
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(y, sum, count, dlogits, loss_rows, tc, lc);
  return st;
}

dt_status dt_op_classifier_loss(dt_tensor *logits, dt_tensor *target, int64_t n_classes,
                                int64_t ignore_index, dt_tensor **out) {
  return classifier_loss("dt_op_classifier_loss", logits, target, n_classes, ignore_index, false,
                         out);
}

dt_status dt_op_classifier_loss_consume(dt_tensor **logits, dt_tensor *target, int64_t n_classes,
                                        int64_t ignore_index, dt_tensor **out) {
  static const char *op = "dt_op_classifier_loss_consume";
  if (!logits)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument", op);
  /* the caller's reference is the op's from here on */
  dt_tensor *l = *logits;
  *logits = NULL;
  dt_status st = classifier_loss(op, l, target, n_classes, ignore_index, true, out);
  dt_tensor_release(l);
  return st;
}

/* ---- mean squared error ---- */

/* out (shape) = a op b with a, b of that same shape (any strides) */
static dt_status same_shape_binary(dt_binary_op opc, const dt_tensor *a, const dt_tensor *b,
                                   float *out) {
  dt_binary_args args;
  memset(&args, 0, sizeof args);
  args.op = opc;
  int ndim = dt_tensor_ndim(a);
  if (dt_tensor_numel(a) == 0)
    return DT_OK;
  if (ndim == 0) {
    args.ndim = 1;
    args.shape[0] = 1;
  } else {
    args.ndim = ndim;
    memcpy(args.shape, dt_tensor_shape(a), (size_t)ndim * sizeof(int64_t));
    memcpy(args.a_strides, dt_tensor_strides(a), (size_t)ndim * sizeof(int64_t));
    memcpy(args.b_strides, dt_tensor_strides(b), (size_t)ndim * sizeof(int64_t));
  }
  return dt_kernel_binary(DT_TENSOR_EXEC(a), &args, DT_F32(a), DT_F32(b), out);
}

/* saved: 0 diff = a - b (contiguous, a's shape).
 * da = coef * g * diff, db = -da; coef 2 (sum, none) or 2/numel (mean). */
typedef struct mse_saved {
  dt_reduction reduction;
} mse_saved;

static dt_status mse_backward(dt_node *node, dt_tensor *g, dt_tensor **grad_in) {
  dt_tensor *diff = node->saved[0];
  dt_reduction red = DT_NODE_PARAMS(node, mse_saved)->reduction;
  int64_t n = dt_tensor_numel(diff);
  dt_device dev = dt_tensor_device(g);
  const dt_exec ex = dt_tensor_exec(g);
  dt_tensor *gb = NULL, *da = NULL;
  dt_status st = DT_OK;
  DT_CHECK(dt_ops_empty_like(diff, dev, &da));
  if (n > 0) {
    if (red == DT_REDUCTION_NONE) {
      DT_CHECK_GOTO(same_shape_binary(DT_BINARY_MUL, g, diff, DT_F32(da)), st, fail);
      DT_CHECK_GOTO(dt_kernel_axpby(&ex, n, 2.0f, DT_F32(da), 0.0f, DT_F32(da)), st, fail);
    } else {
      float coef = red == DT_REDUCTION_SUM ? 2.0f : 2.0f / (float)n;
      DT_CHECK_GOTO(dt_ops_empty_like(diff, dev, &gb), st, fail);
      DT_CHECK_GOTO(dt_kernel_broadcast_axis(&ex, DT_F32(g), DT_F32(gb), 1, n, 1, coef), st, fail);
      DT_CHECK_GOTO(same_shape_binary(DT_BINARY_MUL, gb, diff, DT_F32(da)), st, fail);
    }
  }
  if (node->needs_grad[1])
    DT_CHECK_GOTO(dt_ops_scaled_copy(da, -1.0f, &grad_in[1]), st, fail);
  dt_tensor_release(gb);
  if (node->needs_grad[0])
    grad_in[0] = da;
  else
    dt_tensor_release(da);
  return DT_OK;
fail:
  dt_tensor_release(gb);
  dt_tensor_release(da);
  return st;
}

dt_status dt_op_mse(dt_tensor *a, dt_tensor *b, dt_reduction reduction, dt_tensor **out) {
  static const char *op = "dt_op_mse";
  if (!a || !b || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument", op);
  dt_tensor *ins[2] = {a, b};
  /* 16-bit a or b: widened, an f32 loss (autocast's fp32 ops) */
  DT_OPS_RUN_IN_F32_2(a, b, DT_DTYPE_F32, a32, b32, out, dt_op_mse(a32, b32, reduction, out));
  DT_CHECK(dt_ops_check_inputs(op, ins, 2));
  DT_CHECK(check_reduction(op, reduction));
  int nd = dt_tensor_ndim(a);
  char ba[128], bb[128];
  if (nd != dt_tensor_ndim(b) ||
      memcmp(dt_tensor_shape(a), dt_tensor_shape(b), (size_t)nd * sizeof(int64_t)) != 0)
    return DT_ERROR(DT_ERR_SHAPE,
                    "%s: input %s and target %s differ in shape: mse (reduction %s) needs equal "
                    "shapes (no broadcasting)",
                    op, dt_shape_format(dt_tensor_shape(a), nd, ba, sizeof ba),
                    dt_shape_format(dt_tensor_shape(b), dt_tensor_ndim(b), bb, sizeof bb),
                    reduction_name(reduction));
  dt_device dev = dt_tensor_device(a);
  const dt_exec ex = dt_tensor_exec(a);
  int64_t n = dt_tensor_numel(a);
  dt_tensor *diff = NULL, *sq = NULL, *y = NULL;
  dt_node *node = NULL;
  dt_status st;
  /* diff = a - b; sq = diff^2; y = sq or its (scaled) sum */
  DT_CHECK(dt_ops_empty_like(a, dev, &diff));
  DT_CHECK_GOTO(same_shape_binary(DT_BINARY_SUB, a, b, DT_F32(diff)), st, fail);
  DT_CHECK_GOTO(dt_ops_empty_like(a, dev, &sq), st, fail);
  DT_CHECK_GOTO(same_shape_binary(DT_BINARY_MUL, diff, diff, DT_F32(sq)), st, fail);
  if (reduction == DT_REDUCTION_NONE) {
    y = dt_tensor_retain(sq);
  } else {
    DT_CHECK_GOTO(dt_tensor_empty(scalar_shape, 0, DT_DTYPE_F32, dev, &y), st, fail);
    if (reduction == DT_REDUCTION_MEAN && n == 0)
      DT_CHECK_GOTO(dt_kernel_fill(&ex, DT_F32(y), NAN, 1), st,
                    fail); /* PyTorch: mean of nothing */
    else
      DT_CHECK_GOTO(
          sum_to_scalar(dev, DT_F32(sq), n, reduction == DT_REDUCTION_MEAN ? 1.0f / (float)n : 1.0f,
                        DT_F32(y)),
          st, fail);
  }
  DT_CHECK_GOTO(dt_ops_maybe_record(op, mse_backward, ins, 2, y, &node), st, fail);
  dt_ops_save_for_backward(node, &diff, 1);
  DT_OPS_SAVE_PARAMS(node, mse_saved, {reduction});
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(y, sq, diff);
  return st;
}
