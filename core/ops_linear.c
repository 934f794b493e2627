/* Linear algebra ops: matmul (2-D, flattened leading dims, batched) and
 * linear (x W^T + b), both on the backend's gemm. */
#include <limits.h>
#include <string.h>

#include "core/ops_internal.h"

/* C (batch x m,n) = op(A) op(B) (+ beta C) with the degenerate sizes
 * handled here (BLAS conventions differ on k == 0). A and B hold elements
 * of `ab` (f32, or 16-bit under autocast), C is f32. */
static dt_status gemm(dt_device dev, dt_dtype ab, int ta, int tb, int64_t m, int64_t n, int64_t k,
                      const void *a, int64_t lda, int64_t sa, const void *b, int64_t ldb,
                      int64_t sb, float beta, float *c, int64_t ldc, int64_t sc, int64_t batch) {
  dt_exec ex;
  DT_CHECK(dt_exec_init(dev, ab, &ex));
  if (m == 0 || n == 0 || batch == 0)
    return DT_OK;
  if (k == 0) {
    ex.dtype = DT_DTYPE_F32; /* C is f32 */
    return beta == 0.0f ? dt_kernel_fill(&ex, c, 0.0f, batch * m * n) : DT_OK;
  }
  return dt_kernel_gemm(&ex, ta, tb, (int)m, (int)n, (int)k, 1.0f, a, (int)lda, sa, b, (int)ldb, sb,
                        beta, c, (int)ldc, sc, (int)batch);
}

static dt_status check_int_range(const char *op, int64_t m, int64_t n, int64_t k, int64_t batch) {
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX || batch > INT_MAX)
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "%s: gemm sizes m=%lld n=%lld k=%lld batch=%lld exceed the 32-bit range of "
                    "the kernels: split the batch",
                    op, (long long)m, (long long)n, (long long)k, (long long)batch);
  return DT_OK;
}

/* ---- matmul ---- */

/* saved: 0 a (contiguous), 1 b (contiguous). Unbatched a is (batch*m, k). */
typedef struct matmul_saved {
  int64_t batch, m, k, n;
  bool batched; /* b has the batch dims too */
} matmul_saved;

static dt_status matmul_backward(dt_node *node, dt_tensor *g, dt_tensor **grad_in) {
  dt_tensor *a = node->saved[0], *b = node->saved[1];
  const matmul_saved *s = DT_NODE_PARAMS(node, matmul_saved);
  int64_t batch = s->batch, m = s->m, k = s->k, n = s->n;
  int batched = s->batched;
  dt_device dev = dt_tensor_device(g);
  dt_dtype ab = dt_tensor_dtype(a);
  dt_tensor *da = NULL, *db = NULL, *gc = NULL;
  dt_status st = DT_OK;
  DT_CHECK(dt_ops_cast(g, ab, &gc)); /* the gradient in the operands' dtype */
  if (!batched) {
    m *= batch;
    batch = 1;
  }
  /* into a leaf's .grad (beta = 1) where the engine offers it */
  float *da_dest = dt_node_grad_dest(node, 0), *db_dest = dt_node_grad_dest(node, 1);
  if (node->needs_grad[0]) {
    /* da (m,k) (+)= g (m,n) @ b^T, b (k,n) */
    if (da_dest == NULL)
      DT_CHECK_GOTO(dt_ops_empty_like(a, dev, &da), st, fail);
    DT_CHECK_GOTO(gemm(dev, ab, 0, 1, m, k, n, dt_tensor_data(gc), n, m * n, dt_tensor_data(b), n,
                       batched ? k * n : 0, da_dest ? 1.0f : 0.0f, da_dest ? da_dest : DT_F32(da),
                       k, m * k, batch),
                  st, fail);
  }
  if (node->needs_grad[1]) {
    /* db (k,n) (+)= a^T (k,m) @ g (m,n) */
    if (db_dest == NULL)
      DT_CHECK_GOTO(dt_ops_empty_like(b, dev, &db), st, fail);
    DT_CHECK_GOTO(
        gemm(dev, ab, 1, 0, k, n, m, dt_tensor_data(a), k, m * k, dt_tensor_data(gc), n, m * n,
             db_dest ? 1.0f : 0.0f, db_dest ? db_dest : DT_F32(db), n, k * n, batch),
        st, fail);
  }
  st = DT_OK;
fail:
  dt_tensor_release(gc);
  return dt_ops_grads_result(st, (dt_tensor *[]){da, db}, 2, grad_in);
}

dt_status dt_op_matmul(dt_tensor *a, dt_tensor *b, dt_tensor **out) {
  static const char *op = "dt_op_matmul";
  if (!a || !b || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument", op);
  dt_tensor *ins[2] = {a, b};
  DT_CHECK(dt_ops_check_float_inputs(op, ins, 2));
  int na = dt_tensor_ndim(a), nb = dt_tensor_ndim(b);
  const int64_t *sa = dt_tensor_shape(a), *sb = dt_tensor_shape(b);
  char bufa[128], bufb[128];
  int batched = nb >= 3;
  int shapes_ok = na >= 2 && nb >= 2 && sa[na - 1] == sb[nb - 2];
  if (shapes_ok && batched)
    shapes_ok = na == nb && memcmp(sa, sb, (size_t)(na - 2) * sizeof(int64_t)) == 0;
  if (!shapes_ok)
    return DT_ERROR(DT_ERR_SHAPE,
                    "%s: cannot multiply %s by %s: expected a (..., m, k) @ b (k, n) or batched "
                    "a (B..., m, k) @ b (B..., k, n)",
                    op, dt_shape_format(sa, na, bufa, sizeof bufa),
                    dt_shape_format(sb, nb, bufb, sizeof bufb));
  int64_t m = sa[na - 2], k = sa[na - 1], n = sb[nb - 1];
  int64_t batch = dt_shape_numel(sa, na - 2);
  DT_CHECK(check_int_range(op, batched ? m : m * batch, n, k, batched ? batch : 1));

  int64_t oshape[DT_MAX_DIMS];
  memcpy(oshape, sa, (size_t)(na - 1) * sizeof(int64_t));
  oshape[na - 1] = n;
  dt_tensor *ac = NULL, *bc = NULL, *y = NULL;
  dt_node *node = NULL;
  dt_status st;
  dt_device dev = dt_tensor_device(a);
  DT_CHECK_GOTO(dt_ops_autocast_input(op, a, &ac), st, fail);
  DT_CHECK_GOTO(dt_ops_autocast_input(op, b, &bc), st, fail);
  dt_dtype ab = dt_tensor_dtype(ac);
  DT_CHECK_GOTO(dt_tensor_empty(oshape, na, DT_DTYPE_F32, dev, &y), st, fail);
  /* y (m,n) = a (m,k) @ b (k,n), per batch when batched */
  if (batched)
    DT_CHECK_GOTO(gemm(dev, ab, 0, 0, m, n, k, dt_tensor_data(ac), k, m * k, dt_tensor_data(bc), n,
                       k * n, 0.0f, DT_F32(y), n, m * n, batch),
                  st, fail);
  else
    DT_CHECK_GOTO(gemm(dev, ab, 0, 0, m * batch, n, k, dt_tensor_data(ac), k, 0, dt_tensor_data(bc),
                       n, 0, 0.0f, DT_F32(y), n, 0, 1),
                  st, fail);
  DT_CHECK_GOTO(dt_ops_narrow_result(ab, &y), st, fail);
  DT_CHECK_GOTO(dt_ops_maybe_record(op, matmul_backward, ins, 2, y, &node), st, fail);
  dt_tensor *saved[2] = {ac, bc};
  dt_ops_save_for_backward(node, saved, 2);
  DT_OPS_SAVE_PARAMS(node, matmul_saved, {batch, m, k, n, batched});
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(y, bc, ac);
  return st;
}

/* ---- linear ---- */

typedef struct linear_saved {
  int64_t rows, in, out;
  bool has_bias;
} linear_saved;

/* Rows per slice when a linear's (rows, out) matrix is 16-bit: an eighth
 * of it when it is large (the LM head's logits and their gradient are a
 * language model's largest tensors), so that no f32 copy of the whole is
 * made (the forward's f32 accumulator, the CPU's widened GEMM operands).
 * A GPU's 16-bit GEMMs read their operands as they are: there each
 * product is one GEMM (the LM head's weight gradient one pass over its f32
 * .grad instead of eight, 2.2 GB a step less for GPT-2 124M at B=16,
 * T=1024: docs/gpu-traffic.md). */
static int64_t half_slice_rows(dt_device dev, dt_dtype ab, int64_t rows, int64_t outf) {
  if (dev.type == DT_DEVICE_CPU && ab != DT_DTYPE_F32 && rows * outf > ((int64_t)1 << 20))
    return (rows + 7) / 8;
  return rows;
}

/* Whether a linear of `ab` with `in` input features runs the backend's
 * 16-bit linear forward (one kernel: the GEMM, the bias and the rounding;
 * on CUDA cuBLASLt's bias epilogue), whose bias is of `ab` too. */
static int linear_is_native_half(dt_dtype ab, int64_t in) { return ab != DT_DTYPE_F32 && in > 0; }

/* y (rows, out) = x (rows, in) @ w^T (+ bias (out) broadcast over rows), x
 * and w of `ab`, y of `ab` too: a 16-bit y through the backend's
 * linear_forward (bias of `ab`), an f32 y directly, and with no input
 * features a slice of rows at a time through an f32 buffer (bias f32). */
static dt_status linear_rows(dt_device dev, dt_dtype ab, dt_tensor *xc, dt_tensor *wc,
                             dt_tensor *bc, int64_t rows, int64_t in, int64_t outf, dt_tensor *y) {
  dt_exec ex;
  if (linear_is_native_half(ab, in)) {
    DT_CHECK(dt_exec_init(dev, ab, &ex));
    return dt_kernel_linear_forward(&ex, (int)rows, (int)outf, (int)in, dt_tensor_data(xc),
                                    dt_tensor_data(wc), bc ? dt_tensor_data(bc) : NULL,
                                    dt_tensor_data(y));
  }
  DT_CHECK(dt_exec_init(dev, DT_DTYPE_F32, &ex));
  const size_t esize = dt_dtype_size(ab);
  const int64_t chunk = half_slice_rows(dev, ab, rows, outf);
  dt_tensor *buf = NULL;
  dt_status st = DT_OK;
  if (ab != DT_DTYPE_F32 && rows > 0) {
    const int64_t bshape[2] = {chunk, outf};
    DT_CHECK(dt_tensor_empty(bshape, 2, DT_DTYPE_F32, dev, &buf));
  }
  for (int64_t r0 = 0; r0 < rows && outf > 0; r0 += chunk) {
    int64_t n = rows - r0 < chunk ? rows - r0 : chunk;
    float *acc = buf ? DT_F32(buf) : DT_F32(y) + r0 * outf;
    float beta = 0.0f;
    if (bc) {
      DT_CHECK_GOTO(dt_kernel_broadcast_axis(&ex, DT_F32(bc), acc, 1, n, outf, 1.0f), st, done);
      beta = 1.0f;
    }
    DT_CHECK_GOTO(gemm(dev, ab, 0, 1, n, outf, in,
                       (const char *)dt_tensor_data(xc) + (size_t)(r0 * in) * esize, in, 0,
                       dt_tensor_data(wc), in, 0, beta, acc, outf, 0, 1),
                  st, done);
    if (buf)
      DT_CHECK_GOTO(
          dt_kernel_cast(&ex, acc, DT_DTYPE_F32,
                         (char *)dt_tensor_data(y) + (size_t)(r0 * outf) * esize, ab, n * outf),
          st, done);
  }
done:
  dt_tensor_release(buf);
  return st;
}

/* db (out) = sum over rows of g (rows, out), in f32, as a new tensor. A
 * 16-bit g is reduced as it is (reduce_sum widens it as it reads): no f32
 * copy of it (for GPT-2's c_fc, 100 MB of bf16 that were 200 MB of f32). */
static dt_status bias_grad(dt_tensor *gc, int64_t rows, int64_t outf, dt_tensor **db) {
  DT_CHECK(dt_tensor_empty(&outf, 1, DT_DTYPE_F32, dt_tensor_device(gc), db));
  if (rows == 0)
    return dt_kernel_fill(DT_TENSOR_EXEC(*db), DT_F32(*db), 0.0f, outf);
  if (outf == 0)
    return DT_OK;
  return dt_kernel_reduce_sum(DT_TENSOR_EXEC(gc), (const float *)dt_tensor_data(gc), DT_F32(*db), 1,
                              rows, outf, 1.0f);
}

static dt_status linear_backward_in_parts(dt_node *node, dt_tensor *gc, int64_t part,
                                          dt_tensor **grad_in);
/* A new gradient for the linear's input x: f32, or x's own 16-bit dtype
 * when x was already of the dtype `ab` the linear computed in (a 16-bit
 * activation under autocast), which linear_dx then writes directly. */
static dt_status linear_dx_new(dt_node *node, dt_dtype ab, dt_device dev, dt_tensor **dx) {
  dt_tensor *x = node->inputs[0];
  if (ab != DT_DTYPE_F32 && dt_tensor_dtype(x) == ab)
    return dt_tensor_empty(dt_tensor_shape(x), dt_tensor_ndim(x), ab, dev, dx);
  return dt_ops_empty_like(x, dev, dx);
}

/* Rows r0..r0+n of dx (rows, in) = g (n, out) @ w (out, in), g and w of
 * `ab`: an f32 dx through the f32-output GEMM, a 16-bit one rounded once
 * from the f32 accumulator by the backend (gemm_rounded: no f32 copy). */
static dt_status linear_dx(dt_device dev, dt_dtype ab, const void *g, int64_t n, int64_t r0,
                           int64_t in, int64_t outf, const void *w, dt_tensor *dx) {
  if (dt_tensor_dtype(dx) == DT_DTYPE_F32)
    return gemm(dev, ab, 0, 0, n, in, outf, g, outf, 0, w, in, 0, 0.0f, DT_F32(dx) + r0 * in, in, 0,
                1);
  if (n == 0 || in == 0)
    return DT_OK;
  dt_exec ex;
  DT_CHECK(dt_exec_init(dev, ab, &ex));
  /* with no outputs (k = 0) nothing is read: any leading dimension >= 1 */
  const int ld_g = outf > 0 ? (int)outf : 1;
  return dt_kernel_gemm_rounded(
      &ex, 0, 0, (int)n, (int)in, (int)outf, 1.0f, g, ld_g, w, (int)in,
      (float *)((char *)dt_tensor_data(dx) + (size_t)(r0 * in) * dt_dtype_size(ab)), (int)in);
}

/* saved: 0 x (rows, in) contiguous, 1 weight (out, in) contiguous, both of
 * the dtype the forward computed in (16-bit under autocast), which the
 * output and so its gradient g have too. Inputs: x, weight[, bias]. */
static dt_status linear_backward(dt_node *node, dt_tensor *g, dt_tensor **grad_in) {
  dt_tensor *x = node->saved[0], *w = node->saved[1];
  const linear_saved *s = DT_NODE_PARAMS(node, linear_saved);
  int64_t rows = s->rows, in = s->in, outf = s->out;
  int has_bias = s->has_bias;
  dt_device dev = dt_tensor_device(g);
  dt_dtype ab = dt_tensor_dtype(x);
  size_t esize = dt_dtype_size(ab);
  dt_tensor *dx = NULL, *dw = NULL, *db = NULL, *gc = NULL;
  dt_status st = DT_OK;
  DT_CHECK(dt_ops_cast(g, ab, &gc)); /* g's dtype is ab already: a new reference */
  /* 16-bit operands: the CPU's GEMM widens them, a slice of rows at a time */
  int64_t chunk = half_slice_rows(dev, ab, rows, outf);
  int64_t part = node->needs_grad[1] && dt_node_grad_dest(node, 1) != NULL
                     ? dt_node_grad_rows_per_part(node, 1)
                     : 0;
  if (part > 0 && part < outf && chunk == rows && rows > 0) {
    st = linear_backward_in_parts(node, gc, part, grad_in);
    dt_tensor_release(gc);
    return st;
  }
  if (node->needs_grad[0])
    DT_CHECK_GOTO(linear_dx_new(node, ab, dev, &dx), st, fail);
  /* dw straight into the weight's .grad where the engine offers it */
  float *dw_dest = node->needs_grad[1] ? dt_node_grad_dest(node, 1) : NULL;
  if (node->needs_grad[1] && dw_dest == NULL)
    DT_CHECK_GOTO(dt_ops_empty_like(w, dev, &dw), st, fail);
  int64_t r0 = 0;
  do { /* once when rows is 0: dw = 0 */
    int64_t n = rows - r0 < chunk ? rows - r0 : chunk;
    const void *gp = (const char *)dt_tensor_data(gc) + (size_t)(r0 * outf) * esize;
    /* dx (n, in) = g (n, out) @ w (out, in), rows r0.. */
    if (dx)
      DT_CHECK_GOTO(linear_dx(dev, ab, gp, n, r0, in, outf, dt_tensor_data(w), dx), st, fail);
    /* dw (out, in) (+)= g^T (out, n) @ x (n, in) */
    if (dw || dw_dest)
      DT_CHECK_GOTO(gemm(dev, ab, 1, 0, outf, in, n, gp, outf, 0,
                         (const char *)dt_tensor_data(x) + (size_t)(r0 * in) * esize, in, 0,
                         r0 > 0 || dw_dest ? 1.0f : 0.0f, dw_dest ? dw_dest : DT_F32(dw), in, 0, 1),
                    st, fail);
    r0 += n;
  } while (r0 < rows);
  if (has_bias && node->needs_grad[2])
    DT_CHECK_GOTO(bias_grad(gc, rows, outf, &db), st, fail);
  st = DT_OK;
fail:
  dt_tensor_release(gc);
  return dt_ops_grads_result(st, (dt_tensor *[]){dx, dw, db}, has_bias ? 3 : 2, grad_in);
}

/* linear_backward when the weight's gradient may be reported in blocks of
 * `part` output rows (dt_node_grad_rows_per_part; f32 or one slice of
 * 16-bit rows): the bias first (added into its .grad and reported where
 * it may be), then dw's blocks from the last to the first, each reported
 * as soon as it is written, so that the DDP reducer can send it while the
 * next is computed; dx last. Every element is the same GEMM sum as in
 * one product (a block of rows of C is the same dot products over k). */
static dt_status linear_backward_in_parts(dt_node *node, dt_tensor *gc, int64_t part,
                                          dt_tensor **grad_in) {
  const linear_saved *s = DT_NODE_PARAMS(node, linear_saved);
  dt_tensor *x = node->saved[0], *w = node->saved[1];
  const dt_dtype ab = dt_tensor_dtype(x);
  const size_t esize = dt_dtype_size(ab);
  dt_device dev = dt_tensor_device(gc);
  dt_tensor *dx = NULL, *db = NULL;
  dt_status st = DT_OK;
  if (s->has_bias && node->needs_grad[2]) {
    DT_CHECK_GOTO(bias_grad(gc, s->rows, s->out, &db), st, fail);
    float *db_dest = dt_node_grad_dest(node, 2);
    if (db_dest != NULL && dt_node_grad_rows_per_part(node, 2) > 0) {
      /* what the engine would do with a returned db: .grad += db */
      DT_CHECK_GOTO(dt_kernel_axpby(DT_TENSOR_EXEC(db), s->out, 1.0f, DT_F32(db), 1.0f, db_dest),
                    st, fail);
      dt_tensor_release(db);
      db = NULL;
      dt_node_grad_rows_ready(node, 2, 0, s->out);
    }
  }
  float *dw_dest = dt_node_grad_dest(node, 1);
  for (int64_t o0 = (s->out - 1) / part * part; o0 >= 0; o0 -= part) {
    int64_t n = s->out - o0 < part ? s->out - o0 : part;
    /* dw[o0:o0+n, :] (n, in) += g[:, o0:o0+n]^T (n, rows) @ x (rows, in) */
    DT_CHECK_GOTO(
        gemm(dev, ab, 1, 0, n, s->in, s->rows, (const char *)dt_tensor_data(gc) + o0 * esize,
             s->out, 0, dt_tensor_data(x), s->in, 0, 1.0f, dw_dest + o0 * s->in, s->in, 0, 1),
        st, fail);
    dt_node_grad_rows_ready(node, 1, o0, n);
  }
  if (node->needs_grad[0]) {
    /* dx (rows, in) = g (rows, out) @ w (out, in) */
    DT_CHECK_GOTO(linear_dx_new(node, ab, dev, &dx), st, fail);
    DT_CHECK_GOTO(
        linear_dx(dev, ab, dt_tensor_data(gc), s->rows, 0, s->in, s->out, dt_tensor_data(w), dx),
        st, fail);
  }
fail:
  return dt_ops_grads_result(st, (dt_tensor *[]){dx, NULL, db}, s->has_bias ? 3 : 2, grad_in);
}

dt_status dt_op_linear(dt_tensor *x, dt_tensor *weight, dt_tensor *bias, dt_tensor **out) {
  static const char *op = "dt_op_linear";
  if (!x || !weight || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument (x and weight are required)", op);
  dt_tensor *ins[3] = {x, weight, bias};
  DT_CHECK(dt_ops_check_float_inputs(op, ins, 3));
  int nx = dt_tensor_ndim(x);
  const int64_t *sx = dt_tensor_shape(x), *sw = dt_tensor_shape(weight);
  char bx[128], bw[128], bb[128];
  if (nx < 1 || dt_tensor_ndim(weight) != 2 || sx[nx - 1] != sw[1])
    return DT_ERROR(DT_ERR_SHAPE,
                    "%s: x %s and weight %s do not match: expected x (..., in) and weight "
                    "(out, in)",
                    op, dt_shape_format(sx, nx, bx, sizeof bx),
                    dt_shape_format(sw, dt_tensor_ndim(weight), bw, sizeof bw));
  int64_t in = sw[1], outf = sw[0];
  if (bias && (dt_tensor_ndim(bias) != 1 || dt_tensor_shape(bias)[0] != outf))
    return DT_ERROR(DT_ERR_SHAPE, "%s: bias %s does not match weight %s: expected bias (%lld)", op,
                    dt_shape_format(dt_tensor_shape(bias), dt_tensor_ndim(bias), bb, sizeof bb),
                    dt_shape_format(sw, 2, bw, sizeof bw), (long long)outf);
  int64_t rows = in > 0 ? dt_tensor_numel(x) / in : dt_shape_numel(sx, nx - 1);
  DT_CHECK(check_int_range(op, rows, outf, in, 1));

  int64_t oshape[DT_MAX_DIMS];
  memcpy(oshape, sx, (size_t)nx * sizeof(int64_t));
  oshape[nx - 1] = outf;
  dt_device dev = dt_tensor_device(x);
  dt_tensor *xc = NULL, *wc = NULL, *bc = NULL, *y = NULL;
  dt_node *node = NULL;
  dt_status st;
  DT_CHECK_GOTO(dt_ops_autocast_input(op, x, &xc), st, fail);
  DT_CHECK_GOTO(dt_ops_autocast_input(op, weight, &wc), st, fail);
  dt_dtype ab = dt_tensor_dtype(xc);
  if (bias && rows > 0 && outf > 0) /* 16-bit: the working copy, as x and w */
    DT_CHECK_GOTO(linear_is_native_half(ab, in) ? dt_ops_autocast_input(op, bias, &bc)
                                                : dt_ops_widen(bias, &bc),
                  st, fail);
  /* y (rows, out) of ab = x (rows, in) @ w^T (+ bias), f32 accumulation */
  DT_CHECK_GOTO(dt_tensor_empty(oshape, nx, ab, dev, &y), st, fail);
  DT_CHECK_GOTO(linear_rows(dev, ab, xc, wc, bc, rows, in, outf, y), st, fail);
  DT_CHECK_GOTO(dt_ops_maybe_record(op, linear_backward, ins, 3, y, &node), st, fail);
  dt_tensor *saved[2] = {xc, wc};
  dt_ops_save_for_backward(node, saved, 2);
  DT_OPS_SAVE_PARAMS(node, linear_saved, {rows, in, outf, bias != NULL});
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(y, bc, wc, xc);
  return st;
}
