/* CPU elementwise kernels (core/ops_elementwise.c and the tensor layer):
 * binary ops with broadcasting, fill, axpby, unary ops (and their 16-bit
 * variants), SwiGLU, casts and strided copies. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_internal.h"
#include "core/half.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---- strided iteration shared by binary and copy_strided ---- */

/* Position of the iteration at flat index `start`: multi-index and the
 * three operand offsets. */
typedef struct strided_cursor {
  int64_t idx[DT_MAX_DIMS];
  int64_t o0, o1, o2;
} strided_cursor;

static void cursor_seek(const dt_strided_plan *p, int64_t start, strided_cursor *c) {
  c->o0 = c->o1 = c->o2 = 0;
  for (int d = p->ndim - 1; d >= 0; d--) {
    c->idx[d] = start % p->shape[d];
    start /= p->shape[d];
    c->o0 += c->idx[d] * p->s[0][d];
    c->o1 += c->idx[d] * p->s[1][d];
    c->o2 += c->idx[d] * p->s[2][d];
  }
}

/* Advances by `len` elements along the innermost dim (never past its end). */
static void cursor_advance(const dt_strided_plan *p, strided_cursor *c, int64_t len) {
  int last = p->ndim - 1;
  c->idx[last] += len;
  c->o0 += len * p->s[0][last];
  c->o1 += len * p->s[1][last];
  c->o2 += len * p->s[2][last];
  if (c->idx[last] < p->shape[last])
    return;
  for (int d = last; d >= 0; d--) {
    if (d < last) {
      c->idx[d]++;
      c->o0 += p->s[0][d];
      c->o1 += p->s[1][d];
      c->o2 += p->s[2][d];
    }
    if (c->idx[d] < p->shape[d])
      return;
    c->o0 -= c->idx[d] * p->s[0][d];
    c->o1 -= c->idx[d] * p->s[1][d];
    c->o2 -= c->idx[d] * p->s[2][d];
    c->idx[d] = 0;
  }
}

/* Number of equal flat ranges to split `numel` elements into: none smaller
 * than half the parallel threshold, a few per thread for balance. */
static int64_t flat_chunks(int64_t numel, int nt) {
  int64_t c = numel / (DT_CPU_PAR_MIN / 2);
  return MAX(1, MIN(c, (int64_t)nt * 4));
}

/* ---- binary ---- */

#define BIN_LOOP(EXPR)                      \
  do {                                      \
    if (sa == 1 && sb == 1)                 \
      for (int64_t i = 0; i < len; i++) {   \
        float u = a[i], v = b[i];           \
        out[i] = (EXPR);                    \
      }                                     \
    else if (sa == 1 && sb == 0) {          \
      float v = b[0];                       \
      for (int64_t i = 0; i < len; i++) {   \
        float u = a[i];                     \
        out[i] = (EXPR);                    \
      }                                     \
    } else if (sa == 0 && sb == 1) {        \
      float u = a[0];                       \
      for (int64_t i = 0; i < len; i++) {   \
        float v = b[i];                     \
        out[i] = (EXPR);                    \
      }                                     \
    } else                                  \
      for (int64_t i = 0; i < len; i++) {   \
        float u = a[i * sa], v = b[i * sb]; \
        out[i] = (EXPR);                    \
      }                                     \
  } while (0)

static void binary_inner(dt_binary_op op, const float *a, int64_t sa, const float *b, int64_t sb,
                         float *out, int64_t len) {
  switch (op) {
    case DT_BINARY_ADD: BIN_LOOP(u + v); break;
    case DT_BINARY_SUB: BIN_LOOP(u - v); break;
    case DT_BINARY_MUL: BIN_LOOP(u * v); break;
    case DT_BINARY_DIV: BIN_LOOP(u / v); break;
  }
}

static void binary_range(const dt_strided_plan *p, dt_binary_op op, const float *a, const float *b,
                         float *out, int64_t start, int64_t end) {
  strided_cursor c;
  cursor_seek(p, start, &c);
  int last = p->ndim - 1;
  for (int64_t pos = start; pos < end;) {
    int64_t len = MIN(p->shape[last] - c.idx[last], end - pos);
    binary_inner(op, a + c.o1, p->s[1][last], b + c.o2, p->s[2][last], out + pos, len);
    pos += len;
    cursor_advance(p, &c, len);
  }
}

// out (shape) = a (shape, a_strides) op b (shape, b_strides), out contiguous
dt_status dt_cpu_binary(const dt_exec *ex, const dt_binary_args *args, const float *a,
                        const float *b, float *out) {
  (void)ex;
  dt_strided_plan p;
  dt_binary_plan(args, &p);
  if (p.numel == 0)
    return DT_OK;
  if (p.numel < DT_CPU_PAR_MIN) {
    binary_range(&p, args->op, a, b, out, 0, p.numel);
    return DT_OK;
  }
  int nt = dt_cpu_threads();
  int64_t chunks = flat_chunks(p.numel, nt);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t ci = 0; ci < chunks; ci++)
    binary_range(&p, args->op, a, b, out, p.numel * ci / chunks, p.numel * (ci + 1) / chunks);
  return DT_OK;
}

/* ---- elementwise ---- */

// x (n) = value
dt_status dt_cpu_fill(const dt_exec *ex, float *x, float value, int64_t n) {
  (void)ex;
  int nt = dt_cpu_threads();
#pragma omp parallel for simd if (parallel : n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; i++)
    x[i] = value;
  return DT_OK;
}

// y (n) = alpha * x + beta * y
dt_status dt_cpu_axpby(const dt_exec *ex, int64_t n, float alpha, const float *x, float beta,
                       float *y) {
  if (dt_dtype_is_half(ex->dtype))
    return dt_cpu_half_axpby(ex, n, alpha, x, beta, y);
  int nt = dt_cpu_threads();
  if (beta == 0.0f) {
#pragma omp parallel for simd if (parallel : n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; i++)
      y[i] = alpha * x[i];
  } else {
#pragma omp parallel for simd if (parallel : n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; i++)
      y[i] = alpha * x[i] + beta * y[i];
  }
  return DT_OK;
}

#define UNARY_BLOCK 4096 /* elements per call of a vectorised function (core/cpu_math.c) */

// y (n) = f(x)
dt_status dt_cpu_unary_forward(const dt_exec *ex, dt_unary_op op, int64_t n, const float *x,
                               float *y) {
  if (dt_dtype_is_half(ex->dtype))
    return dt_cpu_half_unary_forward(ex, op, n, x, y);
  int nt = dt_cpu_threads();
  switch (op) {
    case DT_UNARY_RELU:
#pragma omp parallel for simd if (parallel : n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
      for (int64_t i = 0; i < n; i++)
        y[i] = x[i] < 0.0f ? 0.0f : x[i]; /* NaN propagates, as torch.relu */
      return DT_OK;
    case DT_UNARY_GELU:
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN / 8) num_threads(nt) schedule(static)
      for (int64_t i0 = 0; i0 < n; i0 += UNARY_BLOCK)
        dt_cpu_gelu(x + i0, y + i0, MIN(UNARY_BLOCK, n - i0));
      return DT_OK;
    case DT_UNARY_TANH:
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN / 8) num_threads(nt) schedule(static)
      for (int64_t i = 0; i < n; i++)
        y[i] = tanhf(x[i]);
      return DT_OK;
  }
  return DT_ERROR(DT_ERR_INVALID_ARG, "unary_forward: unknown op %d", (int)op);
}

// dx (n) = dy * f'(x), overwritten
dt_status dt_cpu_unary_backward(const dt_exec *ex, dt_unary_op op, int64_t n, const float *x,
                                const float *dy, float *dx) {
  if (dt_dtype_is_half(ex->dtype))
    return dt_cpu_half_unary_backward(ex, op, n, x, dy, dx);
  int nt = dt_cpu_threads();
  switch (op) {
    case DT_UNARY_RELU:
#pragma omp parallel for simd if (parallel : n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
      for (int64_t i = 0; i < n; i++) {
        float g = dy[i]; /* loaded unconditionally so that the select vectorizes */
        dx[i] = x[i] > 0.0f ? g : 0.0f;
      }
      return DT_OK;
    case DT_UNARY_GELU:
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN / 8) num_threads(nt) schedule(static)
      for (int64_t i0 = 0; i0 < n; i0 += UNARY_BLOCK)
        dt_cpu_gelu_backward(x + i0, dy + i0, dx + i0, MIN(UNARY_BLOCK, n - i0));
      return DT_OK;
    case DT_UNARY_TANH:
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN / 8) num_threads(nt) schedule(static)
      for (int64_t i = 0; i < n; i++) {
        float t = tanhf(x[i]);
        dx[i] = dy[i] * (1.0f - t * t);
      }
      return DT_OK;
  }
  return DT_ERROR(DT_ERR_INVALID_ARG, "unary_backward: unknown op %d", (int)op);
}

/* ---- SwiGLU: x (rows, 2f) = [a | b], a chunk of a row's halves at a time
 * (16-bit: widened on the stack, each result rounded once) ---- */

#define GLU_CHUNK 256

static float sigmoid_f32(float a) { return 1.0f / (1.0f + expf(-a)); }

// x (rows, 2f) -> y (rows, f) = silu(a) * b
dt_status dt_cpu_swiglu_forward(const dt_exec *ex, const float *x, float *y, int64_t rows,
                                int64_t f) {
  const dt_dtype dt = ex->dtype;
  DT_CPU_PARALLEL_FOR(r, rows, rows * f, DT_CPU_PAR_MIN / 4) {
    float wa[GLU_CHUNK], wb[GLU_CHUNK], out[GLU_CHUNK];
    for (int64_t j0 = 0; j0 < f; j0 += GLU_CHUNK) {
      const int64_t len = MIN(GLU_CHUNK, f - j0);
      const float *a = dt_cpu_f32_span(x, dt, r * 2 * f + j0, len, wa);
      const float *b = dt_cpu_f32_span(x, dt, r * 2 * f + f + j0, len, wb);
      for (int64_t k = 0; k < len; k++)
        out[k] = a[k] * sigmoid_f32(a[k]) * b[k];
      dt_cpu_store_span(y, dt, r * f + j0, len, out);
    }
  }
  return DT_OK;
}

// x (rows, 2f), dy (rows, f) -> dx (rows, 2f) = [dy * b * silu'(a) | dy * silu(a)]
dt_status dt_cpu_swiglu_backward(const dt_exec *ex, const float *x, const float *dy, float *dx,
                                 int64_t rows, int64_t f) {
  const dt_dtype dt = ex->dtype;
  DT_CPU_PARALLEL_FOR(r, rows, rows * f, DT_CPU_PAR_MIN / 4) {
    float wa[GLU_CHUNK], wb[GLU_CHUNK], wg[GLU_CHUNK], da[GLU_CHUNK], db[GLU_CHUNK];
    for (int64_t j0 = 0; j0 < f; j0 += GLU_CHUNK) {
      const int64_t len = MIN(GLU_CHUNK, f - j0);
      const float *a = dt_cpu_f32_span(x, dt, r * 2 * f + j0, len, wa);
      const float *b = dt_cpu_f32_span(x, dt, r * 2 * f + f + j0, len, wb);
      const float *g = dt_cpu_f32_span(dy, dt, r * f + j0, len, wg);
      for (int64_t k = 0; k < len; k++) {
        const float s = sigmoid_f32(a[k]);
        da[k] = g[k] * b[k] * s * (1.0f + a[k] * (1.0f - s));
        db[k] = g[k] * a[k] * s;
      }
      dt_cpu_store_span(dx, dt, r * 2 * f + j0, len, da);
      dt_cpu_store_span(dx, dt, r * 2 * f + f + j0, len, db);
    }
  }
  return DT_OK;
}

/* ---- the 16-bit variants of the f32 kernels (their dispatch calls these
 * for ex->dtype f16/bf16) ---- */

typedef struct axpby_ctx {
  float alpha, beta;
} axpby_ctx;

static dt_status axpby_block(const dt_exec *ex32, const void *ctx, const float *const *in,
                             float *out, int64_t len) {
  const axpby_ctx *c = ctx;
  if (c->beta != 0.0f) { /* in[1] is y's old value */
    for (int64_t i = 0; i < len; i++)
      out[i] = in[1][i];
  }
  return dt_cpu_axpby(ex32, len, c->alpha, in[0], c->beta, out);
}

// y (n) = alpha * x + beta * y, x and y 16-bit
dt_status dt_cpu_half_axpby(const dt_exec *ex, int64_t n, float alpha, const void *x, float beta,
                            void *y) {
  const axpby_ctx c = {alpha, beta};
  const void *in[2] = {x, y};
  return dt_cpu_half_blocks(ex, n, beta != 0.0f ? 2 : 1, in, y, axpby_block, &c);
}

static dt_status unary_forward_block(const dt_exec *ex32, const void *ctx, const float *const *in,
                                     float *out, int64_t len) {
  return dt_cpu_unary_forward(ex32, *(const dt_unary_op *)ctx, len, in[0], out);
}

// y (n) = f(x), 16-bit x and y
dt_status dt_cpu_half_unary_forward(const dt_exec *ex, dt_unary_op op, int64_t n, const void *x,
                                    void *y) {
  return dt_cpu_half_blocks(ex, n, 1, (const void *[]){x}, y, unary_forward_block, &op);
}

static dt_status unary_backward_block(const dt_exec *ex32, const void *ctx, const float *const *in,
                                      float *out, int64_t len) {
  return dt_cpu_unary_backward(ex32, *(const dt_unary_op *)ctx, len, in[0], in[1], out);
}

// dx (n) = dy * f'(x), 16-bit x, dy and dx
dt_status dt_cpu_half_unary_backward(const dt_exec *ex, dt_unary_op op, int64_t n, const void *x,
                                     const void *dy, void *dx) {
  return dt_cpu_half_blocks(ex, n, 2, (const void *[]){x, dy}, dx, unary_backward_block, &op);
}

/* ---- casts ---- */

#define CAST_BLOCK 1024

static int dtype_is_int(dt_dtype t) {
  return t == DT_DTYPE_I32 || t == DT_DTYPE_I64 || t == DT_DTYPE_U8;
}

static int64_t f64_to_i64(double v) { return DT_CAST_F64_TO_I64(v); }

/* The float values of a block as f32: in place for f32, else widened
 * (exactly) into buf. */
static const float *float_values(const void *in, dt_dtype t, int64_t s, int64_t n, float *buf) {
  if (t == DT_DTYPE_F32)
    return (const float *)in + s;
  (void)dt_half_to_f32(t, (const uint16_t *)in + s, buf, n);
  return buf;
}

static void load_i64(const void *in, dt_dtype t, int64_t s, int64_t n, int64_t *v) {
  switch (t) {
    case DT_DTYPE_I32:
      for (int64_t i = 0; i < n; i++)
        v[i] = ((const int32_t *)in)[s + i];
      break;
    case DT_DTYPE_I64:
      for (int64_t i = 0; i < n; i++)
        v[i] = ((const int64_t *)in)[s + i];
      break;
    case DT_DTYPE_U8:
      for (int64_t i = 0; i < n; i++)
        v[i] = ((const uint8_t *)in)[s + i];
      break;
    default: break;
  }
}

/* Stores float values; `fv` holds them as f32 already rounded once. */
static void store_float(void *out, dt_dtype t, int64_t s, int64_t n, const float *fv) {
  switch (t) {
    case DT_DTYPE_F32: memcpy((float *)out + s, fv, (size_t)n * sizeof(float)); break;
    case DT_DTYPE_F16:
    case DT_DTYPE_BF16: (void)dt_half_from_f32(t, fv, (uint16_t *)out + s, n); break;
    default: break;
  }
}

/* Integers wrap modulo 2^bits when narrowed, as PyTorch. */
static void store_int(void *out, dt_dtype t, int64_t s, int64_t n, const int64_t *iv) {
  switch (t) {
    case DT_DTYPE_I32:
      for (int64_t i = 0; i < n; i++)
        ((int32_t *)out)[s + i] = (int32_t)(uint32_t)iv[i];
      break;
    case DT_DTYPE_I64: memcpy((int64_t *)out + s, iv, (size_t)n * sizeof(int64_t)); break;
    case DT_DTYPE_U8:
      for (int64_t i = 0; i < n; i++)
        ((uint8_t *)out)[s + i] = (uint8_t)iv[i];
      break;
    default: break;
  }
}

static void cast_block(const void *in, dt_dtype src, void *out, dt_dtype dst, int64_t s,
                       int64_t n) {
  int64_t iv[CAST_BLOCK];
  float fv[CAST_BLOCK];
  if (src == DT_DTYPE_F32 && !dtype_is_int(dst)) { /* the hot f32 -> f16/bf16 path */
    store_float(out, dst, s, n, (const float *)in + s);
    return;
  }
  if (dst == DT_DTYPE_F32 && dt_dtype_is_half(src)) { /* and back: exact, no need for f64 */
    (void)dt_half_to_f32(src, (const uint16_t *)in + s, (float *)out + s, n);
    return;
  }
  if (dtype_is_int(src)) {
    load_i64(in, src, s, n, iv);
    if (dtype_is_int(dst)) {
      store_int(out, dst, s, n, iv);
      return;
    }
    for (int64_t i = 0; i < n; i++)
      fv[i] = (float)iv[i];
    store_float(out, dst, s, n, fv);
    return;
  }
  const float *f = float_values(in, src, s, n, fv);
  if (dtype_is_int(dst)) {
    for (int64_t i = 0; i < n; i++)
      iv[i] = f64_to_i64(f[i]);
    store_int(out, dst, s, n, iv);
    return;
  }
  store_float(out, dst, s, n, f);
}

// in (n, src dtype) -> out (n, dst dtype)
dt_status dt_cpu_cast(const dt_exec *ex, const void *in, dt_dtype src, void *out, dt_dtype dst,
                      int64_t n) {
  (void)ex;
  if (n <= 0)
    return DT_OK;
  if (src == dst) {
    if (in != out)
      memmove(out, in, (size_t)n * dt_dtype_size(src));
    return DT_OK;
  }
  int nt = dt_cpu_threads();
  int64_t blocks = (n + CAST_BLOCK - 1) / CAST_BLOCK;
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
  for (int64_t bi = 0; bi < blocks; bi++)
    cast_block(in, src, out, dst, bi * CAST_BLOCK, MIN(CAST_BLOCK, n - bi * CAST_BLOCK));
  return DT_OK;
}

/* ---- strided copy ---- */

#define COPY_LOOP(T)                         \
  do {                                       \
    T *d = (T *)dst;                         \
    const T *s = (const T *)src;             \
    if (ds == 1 && ss == 1)                  \
      memcpy(d, s, (size_t)len * sizeof(T)); \
    else                                     \
      for (int64_t i = 0; i < len; i++)      \
        d[i * ds] = s[i * ss];               \
  } while (0)

static void copy_inner(char *dst, int64_t ds, const char *src, int64_t ss, int64_t len, size_t es) {
  switch (es) {
    case 1: COPY_LOOP(uint8_t); break;
    case 2: COPY_LOOP(uint16_t); break;
    case 4: COPY_LOOP(uint32_t); break;
    case 8: COPY_LOOP(uint64_t); break;
    default:
      for (int64_t i = 0; i < len; i++)
        memcpy(dst + i * ds * (int64_t)es, src + i * ss * (int64_t)es, es);
      break;
  }
}

static void copy_range(const dt_strided_plan *p, char *dst, const char *src, size_t es,
                       int64_t start, int64_t end) {
  strided_cursor c;
  cursor_seek(p, start, &c);
  int last = p->ndim - 1;
  for (int64_t pos = start; pos < end;) {
    int64_t len = MIN(p->shape[last] - c.idx[last], end - pos);
    copy_inner(dst + c.o0 * (int64_t)es, p->s[0][last], src + c.o1 * (int64_t)es, p->s[1][last],
               len, es);
    pos += len;
    cursor_advance(p, &c, len);
  }
}

// src (shape, src_strides) -> dst (shape, dst_strides), elements of elem_size bytes
dt_status dt_cpu_copy_strided(const dt_exec *ex, void *dst, const int64_t *dst_strides,
                              const void *src, const int64_t *src_strides, const int64_t *shape,
                              int ndim, size_t elem_size) {
  (void)ex;
  int64_t zeros[DT_MAX_DIMS] = {0};
  dt_strided_plan p;
  dt_strided_plan_build(&p, ndim, shape, dst_strides, src_strides, zeros);
  if (p.numel == 0)
    return DT_OK;
  if (p.numel < DT_CPU_PAR_MIN) {
    copy_range(&p, dst, src, elem_size, 0, p.numel);
    return DT_OK;
  }
  int nt = dt_cpu_threads();
  int64_t chunks = flat_chunks(p.numel, nt);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t ci = 0; ci < chunks; ci++)
    copy_range(&p, dst, src, elem_size, p.numel * ci / chunks, p.numel * (ci + 1) / chunks);
  return DT_OK;
}
