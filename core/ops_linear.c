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

/* Rows r0..r0+n of dx (rows, in) through the GELU whose output the linear
 * read: (g (n, out) @ w (out, in)) * gelu'(pre (rows, in)), all of `ab`
 * (16-bit; gemm_dgelu). */
static dt_status linear_dgelu(dt_device dev, dt_dtype ab, const void *g, int64_t n, int64_t r0,
                              int64_t in, int64_t outf, const void *w, const void *pre,
                              dt_tensor *dx) {
  dt_exec ex;
  DT_CHECK(dt_exec_init(dev, ab, &ex));
  const size_t off = (size_t)(r0 * in) * dt_dtype_size(ab);
  return dt_kernel_gemm_dgelu(&ex, (int)n, (int)in, (int)outf, g, w,
                              (const float *)((const char *)pre + off),
                              (float *)((char *)dt_tensor_data(dx) + off));
}

/* A linear's input and weight gradients from its output's gradient g
 * (rows, out) of `ab`, a slice of half_slice_rows at a time: dx (rows, in)
 * = g @ w (NULL: none), or with `pre` given (the input was gelu(pre)) the
 * gradient of pre, (g @ w) * gelu'(pre); dw (out, in) f32 = g^T x, added
 * into dw when `accumulate` (NULL: none). */
static dt_status linear_grads(dt_device dev, dt_dtype ab, const void *g, const void *x,
                              const void *w, const void *pre, int64_t rows, int64_t in,
                              int64_t outf, dt_tensor *dx, float *dw, int accumulate) {
  const size_t esize = dt_dtype_size(ab);
  const int64_t chunk = half_slice_rows(dev, ab, rows, outf);
  int64_t r0 = 0;
  do { /* once when rows is 0: dw = 0 */
    int64_t n = rows - r0 < chunk ? rows - r0 : chunk;
    const void *gp = (const char *)g + (size_t)(r0 * outf) * esize;
    /* dx (n, in) = g (n, out) @ w (out, in), rows r0.. */
    if (dx && pre)
      DT_CHECK(linear_dgelu(dev, ab, gp, n, r0, in, outf, w, pre, dx));
    else if (dx)
      DT_CHECK(linear_dx(dev, ab, gp, n, r0, in, outf, w, dx));
    /* dw (out, in) (+)= g^T (out, n) @ x (n, in) */
    if (dw)
      DT_CHECK(gemm(dev, ab, 1, 0, outf, in, n, gp, outf, 0,
                    (const char *)x + (size_t)(r0 * in) * esize, in, 0,
                    r0 > 0 || accumulate ? 1.0f : 0.0f, dw, in, 0, 1));
    r0 += n;
  } while (r0 < rows);
  return DT_OK;
}

/* db (out) = the sum of g's rows, as a new tensor; where the engine offers
 * input i's .grad with early reports (the DDP reducer's rows hook), added
 * into it and reported at once instead (*db NULL then). */
static dt_status linear_bias_grad(dt_node *node, int i, dt_tensor *gc, int64_t rows, int64_t outf,
                                  dt_tensor **db) {
  DT_CHECK(bias_grad(gc, rows, outf, db));
  float *dest = dt_node_grad_dest(node, i);
  if (dest == NULL || dt_node_grad_rows_per_part(node, i) <= 0)
    return DT_OK;
  /* what the engine would do with a returned db: .grad += db */
  dt_status st = dt_kernel_axpby(DT_TENSOR_EXEC(*db), outf, 1.0f, DT_F32(*db), 1.0f, dest);
  dt_tensor_release(*db);
  *db = NULL;
  if (st == DT_OK)
    dt_node_grad_rows_ready(node, i, 0, outf);
  return st;
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
  DT_CHECK_GOTO(linear_grads(dev, ab, dt_tensor_data(gc), dt_tensor_data(x), dt_tensor_data(w),
                             NULL, rows, in, outf, dx,
                             dw_dest ? dw_dest
                             : dw    ? DT_F32(dw)
                                     : NULL,
                             dw_dest != NULL),
                st, fail);
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
  if (s->has_bias && node->needs_grad[2])
    DT_CHECK_GOTO(linear_bias_grad(node, 2, gc, s->rows, s->out, &db), st, fail);
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

/* ---- the GELU MLP ---- */

typedef struct gelu_mlp_saved {
  int64_t rows, in, hidden, out;
  int i_b_fc, i_w_proj, i_b_proj; /* the node's input indices (NULL biases are dropped): -1 none */
} gelu_mlp_saved;

/* A weight's gradient: into its .grad where the engine offers it, else a
 * new f32 tensor in *dw; NULL when it needs none. */
static dt_status weight_grad_dest(dt_node *node, int i, dt_tensor *w, float **dest,
                                  dt_tensor **dw) {
  *dest = NULL;
  if (!node->needs_grad[i])
    return DT_OK;
  *dest = dt_node_grad_dest(node, i);
  if (*dest == NULL) {
    DT_CHECK(dt_ops_empty_like(w, dt_tensor_device(w), dw));
    *dest = DT_F32(*dw);
  }
  return DT_OK;
}

/* saved: 0 x (rows, in), 1 w_fc (hidden, in), 2 w_proj (out, hidden), 3
 * pre (rows, hidden) = x w_fc^T + b_fc, 4 h = gelu(pre), all 16-bit
 * (the fused node exists under 16-bit autocast only). Inputs: x, w_fc[,
 * b_fc], w_proj[, b_proj]. */
static dt_status gelu_mlp_backward(dt_node *node, dt_tensor *g, dt_tensor **grad_in) {
  const gelu_mlp_saved *s = DT_NODE_PARAMS(node, gelu_mlp_saved);
  dt_tensor *x = node->saved[0], *w1 = node->saved[1], *w2 = node->saved[2];
  dt_tensor *pre = node->saved[3], *h = node->saved[4];
  const int64_t rows = s->rows, hid = s->hidden;
  dt_device dev = dt_tensor_device(g);
  dt_dtype ab = dt_tensor_dtype(x);
  /* in input order: x, w_fc, b_fc, w_proj, b_proj */
  dt_tensor *grads[5] = {NULL, NULL, NULL, NULL, NULL}, *gc = NULL, *dpre = NULL;
  float *dw1 = NULL, *dw2 = NULL;
  dt_status st = DT_OK;
  DT_CHECK(dt_ops_cast(g, ab, &gc)); /* g's dtype is ab already: a new reference */
  /* the second projection: its bias and weight (the bias reported at once
   * where the engine asks), and the gradient of pre through the GELU */
  if (s->i_b_proj >= 0 && node->needs_grad[s->i_b_proj])
    DT_CHECK_GOTO(linear_bias_grad(node, s->i_b_proj, gc, rows, s->out, &grads[4]), st, fail);
  DT_CHECK_GOTO(weight_grad_dest(node, s->i_w_proj, w2, &dw2, &grads[3]), st, fail);
  int first =
      node->needs_grad[0] || node->needs_grad[1] || (s->i_b_fc >= 0 && node->needs_grad[s->i_b_fc]);
  if (first) {
    const int64_t shape[2] = {rows, hid};
    DT_CHECK_GOTO(dt_tensor_empty(shape, 2, ab, dev, &dpre), st, fail);
  }
  DT_CHECK_GOTO(linear_grads(dev, ab, dt_tensor_data(gc), dt_tensor_data(h), dt_tensor_data(w2),
                             dt_tensor_data(pre), rows, hid, s->out, dpre, dw2, grads[3] == NULL),
                st, fail);
  if (dw2 && grads[3] == NULL && dt_node_grad_rows_per_part(node, s->i_w_proj) > 0)
    dt_node_grad_rows_ready(node, s->i_w_proj, 0, s->out);
  /* the first projection, from dpre */
  if (first) {
    if (s->i_b_fc >= 0 && node->needs_grad[s->i_b_fc])
      DT_CHECK_GOTO(linear_bias_grad(node, s->i_b_fc, dpre, rows, hid, &grads[2]), st, fail);
    DT_CHECK_GOTO(weight_grad_dest(node, 1, w1, &dw1, &grads[1]), st, fail);
    if (node->needs_grad[0])
      DT_CHECK_GOTO(linear_dx_new(node, ab, dev, &grads[0]), st, fail);
    DT_CHECK_GOTO(linear_grads(dev, ab, dt_tensor_data(dpre), dt_tensor_data(x), dt_tensor_data(w1),
                               NULL, rows, s->in, hid, grads[0], dw1, grads[1] == NULL),
                  st, fail);
  }
fail:
  DT_RELEASE_TENSORS(dpre, gc);
  /* the inputs the node has, in order */
  dt_tensor *compact[5];
  int n = 0;
  for (int i = 0; i < 5; i++)
    if ((i != 2 || s->i_b_fc >= 0) && (i != 4 || s->i_b_proj >= 0))
      compact[n++] = grads[i];
  return dt_ops_grads_result(st, compact, n, grad_in);
}

/* The three ops, recorded as such: f32, or a size of 0 somewhere. */
static dt_status gelu_mlp_composed(dt_tensor *x, dt_tensor *w_fc, dt_tensor *b_fc,
                                   dt_tensor *w_proj, dt_tensor *b_proj, dt_tensor **out) {
  dt_tensor *pre = NULL, *h = NULL;
  dt_status st = dt_op_linear(x, w_fc, b_fc, &pre);
  if (st == DT_OK)
    st = dt_op_gelu(pre, &h);
  if (st == DT_OK)
    st = dt_op_linear(h, w_proj, b_proj, out);
  DT_RELEASE_TENSORS(h, pre);
  return st;
}

static dt_status gelu_mlp_check(const char *op, dt_tensor *x, dt_tensor *w_fc, dt_tensor *b_fc,
                                dt_tensor *w_proj, dt_tensor *b_proj) {
  const int nx = dt_tensor_ndim(x);
  const int64_t *sx = dt_tensor_shape(x), *s1 = dt_tensor_shape(w_fc),
                *s2 = dt_tensor_shape(w_proj);
  char bx[128], b1[128], b2[128];
  if (nx < 1 || dt_tensor_ndim(w_fc) != 2 || dt_tensor_ndim(w_proj) != 2 || sx[nx - 1] != s1[1] ||
      s2[1] != s1[0])
    return DT_ERROR(DT_ERR_SHAPE,
                    "%s: x %s, w_fc %s and w_proj %s do not match: expected x (..., in), w_fc "
                    "(hidden, in) and w_proj (out, hidden)",
                    op, dt_shape_format(sx, nx, bx, sizeof bx),
                    dt_shape_format(s1, 2, b1, sizeof b1), dt_shape_format(s2, 2, b2, sizeof b2));
  if ((b_fc && (dt_tensor_ndim(b_fc) != 1 || dt_tensor_shape(b_fc)[0] != s1[0])) ||
      (b_proj && (dt_tensor_ndim(b_proj) != 1 || dt_tensor_shape(b_proj)[0] != s2[0])))
    return DT_ERROR(DT_ERR_SHAPE, "%s: expected b_fc (%lld) and b_proj (%lld) (or NULL)", op,
                    (long long)s1[0], (long long)s2[0]);
  return DT_OK;
}

dt_status dt_op_gelu_mlp(dt_tensor *x, dt_tensor *w_fc, dt_tensor *b_fc, dt_tensor *w_proj,
                         dt_tensor *b_proj, dt_tensor **out) {
  static const char *op = "dt_op_gelu_mlp";
  if (!x || !w_fc || !w_proj || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument (x, w_fc and w_proj are required)", op);
  dt_tensor *ins[5] = {x, w_fc, b_fc, w_proj, b_proj};
  DT_CHECK(dt_ops_check_float_inputs(op, ins, 5));
  DT_CHECK(gelu_mlp_check(op, x, w_fc, b_fc, w_proj, b_proj));
  const int nx = dt_tensor_ndim(x);
  const int64_t in = dt_tensor_shape(w_fc)[1], hid = dt_tensor_shape(w_fc)[0];
  const int64_t outf = dt_tensor_shape(w_proj)[0];
  const int64_t rows = dt_shape_numel(dt_tensor_shape(x), nx - 1);
  DT_CHECK(check_int_range(op, rows, hid > outf ? hid : outf, hid > in ? hid : in, 1));
  if (!dt_dtype_is_half(dt_autocast_dtype_for(op)) || rows == 0 || in == 0 || hid == 0 || outf == 0)
    return gelu_mlp_composed(x, w_fc, b_fc, w_proj, b_proj, out);

  int64_t oshape[DT_MAX_DIMS];
  memcpy(oshape, dt_tensor_shape(x), (size_t)nx * sizeof(int64_t));
  oshape[nx - 1] = outf;
  const int64_t hshape[2] = {rows, hid};
  dt_device dev = dt_tensor_device(x);
  dt_tensor *xc = NULL, *w1 = NULL, *b1 = NULL, *w2 = NULL, *b2 = NULL;
  dt_tensor *pre = NULL, *h = NULL, *y = NULL;
  dt_node *node = NULL;
  dt_exec ex;
  dt_status st;
  /* 16-bit: the parameters' working copies, as dt_op_linear */
  DT_CHECK_GOTO(dt_ops_autocast_input(op, x, &xc), st, fail);
  DT_CHECK_GOTO(dt_ops_autocast_input(op, w_fc, &w1), st, fail);
  DT_CHECK_GOTO(dt_ops_autocast_input(op, b_fc, &b1), st, fail);
  DT_CHECK_GOTO(dt_ops_autocast_input(op, w_proj, &w2), st, fail);
  DT_CHECK_GOTO(dt_ops_autocast_input(op, b_proj, &b2), st, fail);
  const dt_dtype ab = dt_tensor_dtype(xc);
  DT_CHECK_GOTO(dt_exec_init(dev, ab, &ex), st, fail);
  DT_CHECK_GOTO(dt_tensor_empty(hshape, 2, ab, dev, &pre), st, fail);
  DT_CHECK_GOTO(dt_tensor_empty(hshape, 2, ab, dev, &h), st, fail);
  DT_CHECK_GOTO(dt_tensor_empty(oshape, nx, ab, dev, &y), st, fail);
  /* pre = x w_fc^T + b_fc, h = gelu(pre), y = h w_proj^T + b_proj */
  DT_CHECK_GOTO(dt_kernel_linear_gelu_forward(&ex, (int)rows, (int)hid, (int)in, dt_tensor_data(xc),
                                              dt_tensor_data(w1), b1 ? dt_tensor_data(b1) : NULL,
                                              dt_tensor_data(pre), dt_tensor_data(h)),
                st, fail);
  DT_CHECK_GOTO(dt_kernel_linear_forward(&ex, (int)rows, (int)outf, (int)hid, dt_tensor_data(h),
                                         dt_tensor_data(w2), b2 ? dt_tensor_data(b2) : NULL,
                                         dt_tensor_data(y)),
                st, fail);
  DT_CHECK_GOTO(dt_ops_maybe_record(op, gelu_mlp_backward, ins, 5, y, &node), st, fail);
  dt_tensor *saved[5] = {xc, w1, w2, pre, h};
  dt_ops_save_for_backward(node, saved, 5);
  const int i_b_fc = b_fc ? 2 : -1, i_w_proj = b_fc ? 3 : 2;
  DT_OPS_SAVE_PARAMS(node, gelu_mlp_saved,
                     {rows, in, hid, outf, i_b_fc, i_w_proj, b_proj ? i_w_proj + 1 : -1});
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(y, h, pre, b2, w2, b1, w1, xc);
  return st;
}
