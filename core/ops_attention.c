/* Causal multi-head self-attention: the fused kernels (flash-attention
 * style), or the heads' batched GEMMs with two row kernels between them
 * (DT_ATTENTION; below); and grouped-query attention's repeat_kv (at the
 * end). */
#include <math.h>

#include "core/env.h"
#include "core/ops_internal.h"

/* ---- the attention as GEMMs ----
 *
 * The fused kernels never store a (T, T) block of scores; on a GPU the CUDA
 * ones compute in f32 FMA loops, so GPT-2's attention ran far below the
 * tensor cores. This path gives the products to the backend's GEMM (on
 * CUDA cuBLASLt, 16-bit operands on the tensor cores, f32 accumulation)
 * and keeps the same contract as the fused kernels: out and the row
 * logsumexp forward, dqkv backward from qkv, lse and dout (out unused).
 * q, k and v are first copied head by head, (3, B*H, T, hd) in qkv's
 * dtype; then for a group of heads at a time (at most
 * ATT_GEMM_SCRATCH_BYTES of scores and probabilities, even groups):
 *   forward   S = q k^T / sqrt(hd) (f32)   P = exp(S - lse) (qkv's dtype,
 *             causal_attention_probs, which writes lse)   O = P v
 *   backward  S and P again (P from the saved lse: the forward's bits)
 *             dV = P^T dO   dP = dO v^T (f32, into S's buffer)
 *             dS = P (dP - rowsum(P dP)) (causal_attention_dscores, into P)
 *             dQ = dS k / sqrt(hd)   dK = dS^T q / sqrt(hd)
 * with dO in qkv's dtype. Under autocast P, dO and dS are rounded to 16
 * bits where the GEMMs read them (flash attention does the same); every
 * product accumulates in f32 and the softmax statistics are f32. The
 * GEMMs compute the masked half of each block too (it is zero in P and
 * dS). */
#define ATT_GEMM_SCRATCH_BYTES ((int64_t)256 << 20)
static int64_t att_gemm_scratch = ATT_GEMM_SCRATCH_BYTES;

int64_t dt_ops_attention_gemm_scratch(int64_t bytes) {
  int64_t prev = att_gemm_scratch;
  att_gemm_scratch = bytes > 0 ? bytes : ATT_GEMM_SCRATCH_BYTES;
  return prev;
}

/* Whether qkv of `dtype` on `dev` runs the GEMM path: DT_ATTENTION=gemm or
 * fused, and auto: GEMMs for 16-bit qkv on a GPU (the tensor cores), the
 * fused kernels elsewhere (the CPU's fused kernel is faster and needs no
 * (T, T) scratch; f32 on a GPU keeps the fused kernels, which use no TF32). */
static dt_status attention_uses_gemms(dt_device dev, dt_dtype dtype, int *out) {
  int choice = 0; /* auto|fused|gemm */
  DT_CHECK(dt_env_choice(DT_ENV_ATTENTION, &choice));
  *out = choice == 2 || (choice == 0 && dev.type == DT_DEVICE_CUDA && dt_dtype_is_half(dtype));
  return DT_OK;
}

/* Heads per group: the scores (f32) and probabilities of a group fit the
 * scratch budget (at least one head). */
static int64_t gemm_group(int64_t bh, int64_t t, size_t esize) {
  int64_t per_head = t * t * (int64_t)(sizeof(float) + esize);
  int64_t n = att_gemm_scratch / (per_head > 0 ? per_head : 1);
  if (n < 1)
    n = 1;
  if (n >= bh)
    return bh;
  int64_t groups = (bh + n - 1) / n; /* even groups */
  return (bh + groups - 1) / groups;
}

/* qkv's layout (b, t, 3, h, hd) <-> the heads' (3, b, h, t, hd), elements
 * of `esize` bytes: to_heads copies qkv into the heads, else back (dqkv). */
static dt_status permute_qkv(const dt_exec *ex, const void *src, void *dst, int64_t b, int64_t t,
                             int64_t h, int64_t hd, size_t esize, int to_heads) {
  const int64_t c = h * hd;
  const int64_t shape[5] = {3, b, h, t, hd};
  const int64_t heads[5] = {b * h * t * hd, h * t * hd, t * hd, hd, 1};
  const int64_t rows[5] = {c, t * 3 * c, hd, 3 * c, 1};
  return dt_kernel_copy_strided(ex, dst, to_heads ? heads : rows, src, to_heads ? rows : heads,
                                shape, 5, esize);
}

/* out's layout (b, t, h, hd) <-> the heads' (b, h, t, hd), as above. */
static dt_status permute_out(const dt_exec *ex, const void *src, void *dst, int64_t b, int64_t t,
                             int64_t h, int64_t hd, size_t esize, int to_heads) {
  const int64_t c = h * hd;
  const int64_t shape[4] = {b, h, t, hd};
  const int64_t heads[4] = {h * t * hd, t * hd, hd, 1};
  const int64_t rows[4] = {t * c, hd, c, 1};
  return dt_kernel_copy_strided(ex, dst, to_heads ? heads : rows, src, to_heads ? rows : heads,
                                shape, 4, esize);
}

/* A new 1-D tensor of n elements of `dtype` on `dev`. */
static dt_status scratch(int64_t n, dt_dtype dtype, dt_device dev, dt_tensor **out) {
  return dt_tensor_empty(&n, 1, dtype, dev, out);
}

/* The heads' copy of qkv (qc, contiguous, of the GEMMs' dtype) and the
 * group buffers: s (f32) and p (qc's dtype), `group` heads each. */
typedef struct gemm_att {
  int64_t t, hd, bh, blk, group;
  float scale;
  dt_exec ex, ex32;
  size_t esize;
  dt_tensor *heads, *s, *p;
} gemm_att;

static dt_status gemm_att_init(dt_tensor *qc, int64_t b, int64_t t, int64_t h, int64_t hd,
                               gemm_att *a) {
  const dt_device dev = dt_tensor_device(qc);
  const dt_dtype ab = dt_tensor_dtype(qc);
  a->t = t, a->hd = hd, a->bh = b * h, a->blk = t * hd;
  a->scale = (float)(1.0 / sqrt((double)hd));
  a->esize = dt_dtype_size(ab);
  a->group = gemm_group(a->bh, t, a->esize);
  a->heads = a->s = a->p = NULL;
  DT_CHECK(dt_exec_init(dev, ab, &a->ex));
  DT_CHECK(dt_exec_init(dev, DT_DTYPE_F32, &a->ex32));
  if (t > INT32_MAX || hd > INT32_MAX)
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "dt_op_causal_attention: T = %lld, head size %lld: beyond the 32-bit sizes "
                    "of the GEMMs (DT_ATTENTION=fused has no such limit)",
                    (long long)t, (long long)hd);
  DT_CHECK(scratch(3 * a->bh * a->blk, ab, dev, &a->heads));
  DT_CHECK(
      permute_qkv(&a->ex, dt_tensor_data(qc), dt_tensor_data(a->heads), b, t, h, hd, a->esize, 1));
  DT_CHECK(scratch(a->group * t * t, DT_DTYPE_F32, dev, &a->s));
  return scratch(a->group * t * t, ab, dev, &a->p);
}

static void gemm_att_release(gemm_att *a) { DT_RELEASE_TENSORS(a->p, a->s, a->heads); }

/* Part `part` (0 q, 1 k, 2 v) of head j of the heads' copy. */
static const void *head_of(const gemm_att *a, int part, int64_t j) {
  return (const char *)dt_tensor_data(a->heads) + (size_t)((part * a->bh + j) * a->blk) * a->esize;
}

/* C (n heads of (m, k2)) = alpha op(A) op(B), A and B of the GEMMs' dtype
 * (ex), C f32: one batched GEMM over the heads of a group. A and B are
 * (T, T) blocks (lda t, stride t*t) or heads (lda hd, stride blk). */
static dt_status heads_gemm(const gemm_att *a, int ta, int tb, int64_t m, int64_t n, int64_t k,
                            float alpha, const void *x, int64_t ldx, int64_t sx, const void *y,
                            int64_t ldy, int64_t sy, float *c, int64_t ldc, int64_t sc,
                            int64_t batch) {
  return dt_kernel_gemm(&a->ex, ta, tb, (int)m, (int)n, (int)k, alpha, x, (int)ldx, sx, y, (int)ldy,
                        sy, 0.0f, c, (int)ldc, sc, (int)batch);
}

/* S (f32) = q k^T / sqrt(hd) and P = exp(S - lse) for heads j0..j0+n:
 * lse written (forward) or read (backward, lse_in). */
static dt_status scores_and_probs(const gemm_att *a, int64_t j0, int64_t n, float *lse,
                                  bool lse_in) {
  const int64_t t = a->t, hd = a->hd, tt = t * t;
  DT_CHECK(heads_gemm(a, 0, 1, t, t, hd, a->scale, head_of(a, 0, j0), hd, a->blk, head_of(a, 1, j0),
                      hd, a->blk, DT_F32(a->s), t, tt, n));
  return dt_kernel_causal_attention_probs(&a->ex, DT_F32(a->s), dt_tensor_data(a->p), lse + j0 * t,
                                          lse_in, n, t);
}

/* qc (b, t, 3c) of the GEMMs' dtype -> y (b, t, c) f32 and lse (b, h, t). */
static dt_status gemm_attention_forward(dt_tensor *qc, float *y, float *lse, int64_t b, int64_t t,
                                        int64_t h, int64_t hd) {
  gemm_att a;
  dt_tensor *o = NULL, *lse_tmp = NULL;
  dt_status st = gemm_att_init(qc, b, t, h, hd, &a);
  if (st == DT_OK)
    st = scratch(a.bh * a.blk, DT_DTYPE_F32, a.ex.dev, &o);
  if (st == DT_OK && lse == NULL) { /* not recording: the statistics are still needed */
    st = scratch(a.bh * t, DT_DTYPE_F32, a.ex.dev, &lse_tmp);
    lse = lse_tmp ? DT_F32(lse_tmp) : NULL;
  }
  for (int64_t j0 = 0; st == DT_OK && j0 < a.bh; j0 += a.group) {
    const int64_t n = a.bh - j0 < a.group ? a.bh - j0 : a.group;
    st = scores_and_probs(&a, j0, n, lse, false);
    if (st == DT_OK) /* O = P v */
      st = heads_gemm(&a, 0, 0, t, hd, t, 1.0f, dt_tensor_data(a.p), t, t * t, head_of(&a, 2, j0),
                      hd, a.blk, DT_F32(o) + j0 * a.blk, hd, a.blk, n);
  }
  if (st == DT_OK)
    st = permute_out(&a.ex32, DT_F32(o), y, b, t, h, hd, sizeof(float), 0);
  DT_RELEASE_TENSORS(lse_tmp, o);
  gemm_att_release(&a);
  return st;
}

/* dqkv (b, t, 3c) from qc (the GEMMs' dtype), lse and g (b, t, c): f32,
 * or of qc's 16-bit dtype (the gradient of a 16-bit qkv), rounded once on
 * the heads' f32 buffer before the copy into rows, which then moves half
 * the bytes (the same bits as the f32 rows rounded). */
static dt_status gemm_attention_backward(dt_tensor *qc, const float *lse, dt_tensor *g,
                                         dt_tensor *dqkv, int64_t b, int64_t t, int64_t h,
                                         int64_t hd) {
  gemm_att a;
  dt_tensor *gc = NULL, *dout = NULL, *dheads = NULL;
  dt_status st = gemm_att_init(qc, b, t, h, hd, &a);
  if (st == DT_OK) /* dO in the GEMMs' dtype, head by head */
    st = dt_ops_cast(g, dt_tensor_dtype(qc), &gc);
  if (st == DT_OK)
    st = scratch(a.bh * a.blk, dt_tensor_dtype(qc), a.ex.dev, &dout);
  if (st == DT_OK)
    st = permute_out(&a.ex, dt_tensor_data(gc), dt_tensor_data(dout), b, t, h, hd, a.esize, 1);
  if (st == DT_OK)
    st = scratch(3 * a.bh * a.blk, DT_DTYPE_F32, a.ex.dev, &dheads);
  const int64_t tt = t * t;
  for (int64_t j0 = 0; st == DT_OK && j0 < a.bh; j0 += a.group) {
    const int64_t n = a.bh - j0 < a.group ? a.bh - j0 : a.group;
    const void *q = head_of(&a, 0, j0), *k = head_of(&a, 1, j0), *v = head_of(&a, 2, j0);
    const void *p = dt_tensor_data(a.p);
    const void *d_o = (const char *)dt_tensor_data(dout) + (size_t)(j0 * a.blk) * a.esize;
    float *dq = DT_F32(dheads) + j0 * a.blk, *dk = dq + a.bh * a.blk, *dv = dk + a.bh * a.blk;
    float *s = DT_F32(a.s);
    st = scores_and_probs(&a, j0, n, (float *)lse, true);
    if (st == DT_OK) /* dV = P^T dO */
      st = heads_gemm(&a, 1, 0, t, hd, t, 1.0f, p, t, tt, d_o, hd, a.blk, dv, hd, a.blk, n);
    if (st == DT_OK) /* dP = dO v^T, over S */
      st = heads_gemm(&a, 0, 1, t, t, hd, 1.0f, d_o, hd, a.blk, v, hd, a.blk, s, t, tt, n);
    if (st == DT_OK) /* dS, over P */
      st = dt_kernel_causal_attention_dscores(&a.ex, p, s, dt_tensor_data(a.p), n, t);
    if (st == DT_OK) /* dQ = dS k / sqrt(hd) */
      st = heads_gemm(&a, 0, 0, t, hd, t, a.scale, p, t, tt, k, hd, a.blk, dq, hd, a.blk, n);
    if (st == DT_OK) /* dK = dS^T q / sqrt(hd) */
      st = heads_gemm(&a, 1, 0, t, hd, t, a.scale, p, t, tt, q, hd, a.blk, dk, hd, a.blk, n);
  }
  dt_dtype dt = dt_tensor_dtype(dqkv);
  if (st == DT_OK && dt == DT_DTYPE_F32) {
    st = permute_qkv(&a.ex32, DT_F32(dheads), DT_F32(dqkv), b, t, h, hd, sizeof(float), 0);
  } else if (st == DT_OK) { /* rounded in place of the heads' copy (no longer needed) */
    st = dt_kernel_cast(&a.ex32, DT_F32(dheads), DT_DTYPE_F32, dt_tensor_data(a.heads), dt,
                        3 * a.bh * a.blk);
    if (st == DT_OK)
      st = permute_qkv(&a.ex, dt_tensor_data(a.heads), dt_tensor_data(dqkv), b, t, h, hd,
                       dt_dtype_size(dt), 0);
  }
  DT_RELEASE_TENSORS(dheads, dout, gc);
  gemm_att_release(&a);
  return st;
}

/* saved: 0 qkv (contiguous), 1 out (detached), both 16-bit under autocast,
 * 2 lse (b, h, t) f32 */
typedef struct causal_attention_saved {
  int64_t b, t, heads, hd;
  bool gemms; /* the forward ran the GEMM path */
} causal_attention_saved;

static dt_status causal_attention_backward(dt_node *node, dt_tensor *g, dt_tensor **grad_in) {
  dt_tensor *qkv = node->saved[0], *y = node->saved[1], *lse = node->saved[2];
  const causal_attention_saved *s = DT_NODE_PARAMS(node, causal_attention_saved);
  int64_t b = s->b, t = s->t, h = s->heads, hd = s->hd;
  dt_tensor *dqkv = NULL, *gc = NULL;
  if (s->gemms) {
    /* a 16-bit input's gradient in its own dtype (qkv under autocast, the
     * c_attn linear's 16-bit output), an f32 input's in f32 */
    dt_dtype gdt = dt_tensor_dtype(node->inputs[0]) == dt_tensor_dtype(qkv) ? dt_tensor_dtype(qkv)
                                                                            : DT_DTYPE_F32;
    dt_status st = dt_tensor_empty(dt_tensor_shape(qkv), dt_tensor_ndim(qkv), gdt,
                                   dt_tensor_device(qkv), &dqkv);
    if (st == DT_OK && b * t > 0)
      st = gemm_attention_backward(qkv, DT_F32(lse), g, dqkv, b, t, h, hd);
    return dt_ops_grad_result(st, dqkv, &grad_in[0]);
  }
  /* the kernels read qkv, out and dout in qkv's dtype (16-bit under
   * autocast) and write dqkv in it, computing in f32; the engine widens
   * dqkv for an f32 input that autocast rounded */
  const dt_dtype dt = dt_tensor_dtype(qkv);
  dt_status st = dt_ops_cast(g, dt, &gc);
  if (st == DT_OK)
    st = dt_tensor_empty(dt_tensor_shape(qkv), dt_tensor_ndim(qkv), dt, dt_tensor_device(qkv),
                         &dqkv);
  if (st == DT_OK && b * t > 0)
    st = dt_kernel_causal_attention_backward(DT_TENSOR_EXEC(qkv), DT_F32(qkv), DT_F32(y),
                                             DT_F32(lse), DT_F32(gc), DT_F32(dqkv), b, t, h, hd);
  dt_tensor_release(gc);
  return dt_ops_grad_result(st, dqkv, &grad_in[0]);
}

dt_status dt_op_causal_attention(dt_tensor *qkv, int n_head, dt_tensor **out) {
  static const char *op = "dt_op_causal_attention";
  if (!qkv || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument", op);
  DT_CHECK(dt_ops_check_float_inputs(op, &qkv, 1));
  const int nd = dt_tensor_ndim(qkv);
  const int64_t *s = dt_tensor_shape(qkv);
  char buf[128];
  if (nd != 3 || s[2] % 3 != 0 || s[2] == 0)
    return DT_ERROR(DT_ERR_SHAPE,
                    "%s: qkv %s: expected (B, T, 3C) with q, k and v side by side on the last "
                    "axis",
                    op, dt_shape_format(s, nd, buf, sizeof buf));
  const int64_t b = s[0], t = s[1], c = s[2] / 3;
  if (n_head < 1 || c % n_head != 0)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s: n_head %d does not divide the embedding width C = %lld of qkv %s: "
                    "each head takes C / n_head columns",
                    op, n_head, (long long)c, dt_shape_format(s, nd, buf, sizeof buf));
  const int64_t hd = c / n_head;
  const int64_t oshape[3] = {b, t, c}, lshape[3] = {b, n_head, t};
  dt_device dev = dt_tensor_device(qkv);
  dt_tensor *qc = NULL, *y = NULL, *lse = NULL;
  dt_node *node = NULL;
  dt_status st;
  /* under autocast qc is 16-bit (kept for the backward), which the kernels
   * read (the CPU widens it, CUDA reads 16-bit into f32 tiles) */
  DT_CHECK(dt_ops_autocast_input(op, qkv, &qc));
  int gemms = 0;
  DT_CHECK_GOTO(attention_uses_gemms(dev, dt_tensor_dtype(qc), &gemms), st, fail);
  /* the fused kernels write y in qc's dtype, the GEMM path in f32 */
  DT_CHECK_GOTO(dt_tensor_empty(oshape, 3, gemms ? DT_DTYPE_F32 : dt_tensor_dtype(qc), dev, &y), st,
                fail);
  const int record = dt_autograd_should_record(&qkv, 1);
  if (record)
    DT_CHECK_GOTO(dt_tensor_empty(lshape, 3, DT_DTYPE_F32, dev, &lse), st, fail);
  /* qkv (b, t, 3c) -> y (b, t, c), lse (b, h, t) */
  if (b * t > 0 && gemms)
    DT_CHECK_GOTO(gemm_attention_forward(qc, DT_F32(y), lse ? DT_F32(lse) : NULL, b, t, n_head, hd),
                  st, fail);
  else if (b * t > 0)
    DT_CHECK_GOTO(dt_kernel_causal_attention_forward(DT_TENSOR_EXEC(qc), DT_F32(qc), DT_F32(y),
                                                     lse ? DT_F32(lse) : NULL, b, t, n_head, hd),
                  st, fail);
  /* the result in qc's dtype: 16-bit under autocast (the GEMM path's f32 y rounded) */
  if (gemms)
    DT_CHECK_GOTO(dt_ops_narrow_result(dt_tensor_dtype(qc), &y), st, fail);
  DT_CHECK_GOTO(dt_ops_maybe_record(op, causal_attention_backward, &qkv, 1, y, &node), st, fail);
  if (node) {
    DT_CHECK_GOTO(dt_ops_save_output(node, 1, y), st, fail);
    dt_tensor *saved[1] = {qc};
    dt_ops_save_for_backward(node, saved, 1);
    DT_OPS_SAVE_PARAMS(node, causal_attention_saved, {b, t, n_head, hd, gemms});
    dt_node_save(node, 2, lse);
  }
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(y, lse, qc);
  return st;
}

/* ---- grouped-query attention: the key and value heads repeated ----
 *
 * The attention kernels stay as they are (one key/value head per query
 * head); dt_op_repeat_kv builds their input as Hugging Face's repeat_kv
 * does. Its cost is the repeated (B, T, 2 H hd) copy the attention keeps
 * for its backward; a kernel that reads a key/value head once for its
 * group is the later step if that memory matters. */

/* copy of a (rows, width) block whose rows are src_w and dst_w elements
 * apart, elements of esize bytes */
static dt_status copy_rows(const dt_exec *ex, void *dst, int64_t dst_w, const void *src,
                           int64_t src_w, int64_t rows, int64_t width, size_t esize) {
  const int64_t shape[2] = {rows, width}, ds[2] = {dst_w, 1}, ss[2] = {src_w, 1};
  return dt_kernel_copy_strided(ex, dst, ds, src, ss, shape, 2, esize);
}

typedef struct repeat_kv_saved {
  int64_t rows, h, hkv, hd;
} repeat_kv_saved;

/* dqkv (rows, (h + 2 hkv) hd) f32: the q columns of g as they are, each
 * key/value head the sum of its repeats' gradients (reduce_sum over the
 * group of an f32 copy of g's k and v columns). */
static dt_status repeat_kv_backward(dt_node *node, dt_tensor *g, dt_tensor **grad_in) {
  const repeat_kv_saved *s = DT_NODE_PARAMS(node, repeat_kv_saved);
  const int64_t rows = s->rows, qw = s->h * s->hd, kvw = 2 * s->hkv * s->hd, win = qw + kvw,
                wout = 3 * qw, group = s->h / s->hkv;
  const int64_t dshape[2] = {rows, win}, kv_n = rows * 2 * qw, red_n = rows * kvw;
  dt_tensor *g32 = NULL, *dx = NULL, *kv = NULL, *red = NULL;
  dt_status st = dt_ops_widen(g, &g32);
  if (st == DT_OK)
    st = dt_tensor_empty(dshape, 2, DT_DTYPE_F32, dt_tensor_device(g), &dx);
  if (st == DT_OK)
    st = dt_tensor_empty(&kv_n, 1, DT_DTYPE_F32, dt_tensor_device(g), &kv);
  if (st == DT_OK)
    st = dt_tensor_empty(&red_n, 1, DT_DTYPE_F32, dt_tensor_device(g), &red);
  const dt_exec ex = dt_tensor_exec(dx ? dx : g);
  if (st == DT_OK && rows > 0)
    st = copy_rows(&ex, DT_F32(dx), win, DT_F32(g32), wout, rows, qw, sizeof(float));
  if (st == DT_OK && rows > 0)
    st = copy_rows(&ex, DT_F32(kv), 2 * qw, DT_F32(g32) + qw, wout, rows, 2 * qw, sizeof(float));
  if (st == DT_OK && rows > 0) /* (rows * 2 * hkv, group, hd) -> (rows * 2 * hkv, hd) */
    st = dt_kernel_reduce_sum(&ex, DT_F32(kv), DT_F32(red), rows * 2 * s->hkv, group, s->hd, 1.0f);
  if (st == DT_OK && rows > 0)
    st = copy_rows(&ex, DT_F32(dx) + qw, win, DT_F32(red), kvw, rows, kvw, sizeof(float));
  DT_RELEASE_TENSORS(red, kv, g32);
  return dt_ops_grad_result(st, dx, &grad_in[0]);
}

dt_status dt_op_repeat_kv(dt_tensor *qkv, int n_head, int n_kv_head, dt_tensor **out) {
  static const char *op = "dt_op_repeat_kv";
  DT_CHECK(dt_ops_check_float_unary(op, qkv, out));
  if (n_head < 1 || n_kv_head < 1 || n_head % n_kv_head != 0)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s: n_kv_head %d does not divide n_head %d: each key/value head serves "
                    "n_head / n_kv_head query heads",
                    op, n_kv_head, n_head);
  const int64_t heads = (int64_t)n_head + 2 * (int64_t)n_kv_head, *s = dt_tensor_shape(qkv);
  const int nd = dt_tensor_ndim(qkv);
  char buf[128];
  if (nd != 3 || s[2] == 0 || s[2] % heads != 0)
    return DT_ERROR(DT_ERR_SHAPE,
                    "%s: qkv %s: expected (B, T, (n_head + 2 n_kv_head) head_dim) = (B, T, %lld "
                    "head_dim): q, k and v side by side on the last axis",
                    op, dt_shape_format(s, nd, buf, sizeof buf), (long long)heads);
  if (n_kv_head == n_head) {
    *out = dt_tensor_retain(qkv);
    return DT_OK;
  }
  const int64_t rows = s[0] * s[1], h = n_head, hkv = n_kv_head, hd = s[2] / heads, group = h / hkv,
                qw = h * hd, win = s[2], wout = 3 * qw;
  const int64_t oshape[3] = {s[0], s[1], wout};
  dt_tensor *x = NULL, *y = NULL;
  dt_node *node = NULL;
  dt_status st;
  DT_CHECK(dt_ops_contiguous(qkv, &x));
  DT_CHECK_GOTO(dt_tensor_empty(oshape, 3, dt_tensor_dtype(x), dt_tensor_device(x), &y), st, fail);
  const size_t es = dt_dtype_size(dt_tensor_dtype(x));
  const dt_exec ex = dt_tensor_exec(x);
  char *yd = dt_tensor_data(y);
  const char *xd = dt_tensor_data(x);
  if (rows > 0) { /* q as it is; k and v: (rows, 2, hkv, group, hd) read with stride 0 on group */
    const int64_t shape[5] = {rows, 2, hkv, group, hd}, ds[5] = {wout, qw, group * hd, hd, 1},
                  ss[5] = {win, hkv * hd, hd, 0, 1};
    DT_CHECK_GOTO(copy_rows(&ex, yd, wout, xd, win, rows, qw, es), st, fail);
    DT_CHECK_GOTO(dt_kernel_copy_strided(&ex, yd + qw * es, ds, xd + qw * es, ss, shape, 5, es), st,
                  fail);
  }
  DT_CHECK_GOTO(dt_ops_maybe_record(op, repeat_kv_backward, &qkv, 1, y, &node), st, fail);
  DT_OPS_SAVE_PARAMS(node, repeat_kv_saved, {rows, h, hkv, hd});
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(y, x);
  return st;
}
