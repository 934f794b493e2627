/* Convolution and batch normalisation through cuDNN 9 (the legacy
 * cudnnConvolution* / cudnnBatchNormalization* API, still in cuDNN 9).
 *
 * Per device, each convolution geometry gets its descriptors and its
 * algorithms (forward, backward data, backward filter) chosen once and
 * cached: by cuDNN's heuristics, preferring deterministic algorithms so that
 * runs repeat bit for bit, or, when DT_CUDNN_BENCHMARK=1 (PyTorch's
 * cudnn.benchmark), the fastest by timing every algorithm on buffers from
 * the caching allocator (the *Ex find functions). Workspaces come from the
 * caching allocator.
 *
 * Mixed precision: a plan of f16/bf16 (ex->dtype) has 16-bit x, w and y
 * descriptors and an f32 compute type (cuDNN's PSEUDO_HALF and
 * PSEUDO_BFLOAT16 configurations: the sums accumulate in f32, each result
 * is rounded once to 16 bits), the tensor-op math the heuristics rank;
 * the bias stays f32 and is added (forward) and reduced (backward) by the
 * small kernels of kernels_conv.cu, which take an f32 bias beside 16-bit
 * tensors. Pooling is in kernels_conv.cu too: the backend contract
 * hands argmax indices between max-pool forward and backward, which cuDNN
 * pooling does not produce. */
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda.h"
#include "cuda/cuda_internal.h"

#define WORKSPACE_CAP DT_GIB /* largest workspace an algorithm may ask for */

/* ---- geometry ---- */

/* ---- the per-device cache of convolution plans ---- */

typedef struct conv_plan {
  dt_conv2d_geom g;
  int tf32;
  dt_dtype dtype; /* of x, w, y (and dy, dx, dw) */
  cudnnTensorDescriptor_t x, y, bias;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
  cudnnConvolutionFwdAlgo_t fwd;
  cudnnConvolutionBwdDataAlgo_t bwd_data;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter;
  cudnnMathType_t fwd_math, bwd_data_math, bwd_filter_math;
  size_t ws_fwd, ws_bwd_data, ws_bwd_filter;
} conv_plan;

struct dt_cuda_conv_cache {
  conv_plan **plans;
  size_t n, cap;
};

static void plan_destroy(conv_plan *p) {
  if (!p)
    return;
  if (p->x)
    cudnnDestroyTensorDescriptor(p->x);
  if (p->y)
    cudnnDestroyTensorDescriptor(p->y);
  if (p->bias)
    cudnnDestroyTensorDescriptor(p->bias);
  if (p->w)
    cudnnDestroyFilterDescriptor(p->w);
  if (p->conv)
    cudnnDestroyConvolutionDescriptor(p->conv);
  free(p);
}

void dt_cuda_conv_cache_destroy(dt_cuda_conv_cache *c) {
  if (!c)
    return;
  for (size_t i = 0; i < c->n; i++)
    plan_destroy(c->plans[i]);
  free(c->plans);
  free(c);
}

static dt_status no_algorithm(const char *what, const dt_conv2d_geom *g) {
  return DT_ERROR(DT_ERR_UNSUPPORTED,
                  "cuDNN has no %s algorithm for conv2d n=%d c=%d h=%d w=%d oc=%d kernel %dx%d "
                  "stride %dx%d padding %dx%d within a %zu MiB workspace",
                  what, g->n, g->c, g->h, g->w, g->oc, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw,
                  WORKSPACE_CAP >> 20);
}

/* Whether a ranked algorithm may be used: it works, its workspace fits,
 * and it keeps f32 data in f32 (TF32 at most): ALLOW_CONVERSION would let
 * cuDNN round the inputs to f16. */
#define USABLE(perf)                                                          \
  ((perf).status == CUDNN_STATUS_SUCCESS && (perf).memory <= WORKSPACE_CAP && \
   (perf).mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)

/* Index into cuDNN's ranked list of the algorithm to use (-1: none
 * usable): the first usable deterministic one, so that a run repeats bit
 * for bit, falling back to the first usable one; in benchmark mode the
 * fastest usable one (the list is then sorted by measured time). */
#define PICK_ALGO(perf, got, bench, out)                             \
  do {                                                               \
    int first_ = -1, det_ = -1;                                      \
    for (int i_ = 0; i_ < (got); i_++) {                             \
      if (!USABLE((perf)[i_]))                                       \
        continue;                                                    \
      if (first_ < 0)                                                \
        first_ = i_;                                                 \
      if (det_ < 0 && (perf)[i_].determinism == CUDNN_DETERMINISTIC) \
        det_ = i_;                                                   \
    }                                                                \
    (out) = (bench) || det_ < 0 ? first_ : det_;                     \
  } while (0)

/* Benchmark mode times the algorithms on real buffers (the *Ex find
 * functions) taken from the caching allocator, not from cudaMalloc. */
typedef struct find_buffers {
  void *x, *w, *y, *ws;
  size_t ws_bytes;
} find_buffers;

static void find_buffers_free(dt_cuda_ctx *ctx, find_buffers *b) {
  void *all[4] = {b->ws, b->y, b->w, b->x};
  for (int i = 0; i < 4; i++)
    if (all[i])
      dt_cuda_scratch_free(ctx, all[i]);
  memset(b, 0, sizeof *b);
}

static dt_status find_buffers_alloc(dt_cuda_ctx *ctx, const dt_conv2d_geom *g, find_buffers *b) {
  memset(b, 0, sizeof *b);
  size_t f = sizeof(float);
  size_t nx = (size_t)g->n * g->c * g->h * g->w, nw = (size_t)g->oc * g->c * g->kh * g->kw,
         ny = (size_t)g->n * g->oc * g->oh * g->ow;
  dt_status st = DT_OK;
  DT_CHECK_GOTO(dt_cuda_scratch_alloc(ctx, nx * f, &b->x), st, fail);
  DT_CHECK_GOTO(dt_cuda_scratch_alloc(ctx, nw * f, &b->w), st, fail);
  DT_CHECK_GOTO(dt_cuda_scratch_alloc(ctx, ny * f, &b->y), st, fail);
  /* As large a workspace as the pool gives, up to the cap: algorithms that
   * need more are skipped by the find. */
  for (size_t ws = WORKSPACE_CAP; ws >= ((size_t)1 << 20) && !b->ws; ws /= 4) {
    if (dt_cuda_scratch_alloc(ctx, ws, &b->ws) == DT_OK)
      b->ws_bytes = ws;
  }
  dt_clear_error();
  return DT_OK;
fail:
  find_buffers_free(ctx, b);
  return st;
}

/* One direction of plan_choose_with: ranks cuDNN's algorithms (timed on
 * fb's buffers when benchmarking), picks one (PICK_ALGO), records it with
 * its math type and workspace size. The direction's descriptors are
 * (d1, d2, d3) in the order its cuDNN calls take them: forward (x, w, y),
 * backward-data (w, y, x), backward-filter (x, y, w). The three differ in
 * types and function names only, hence a macro. Returns from the caller
 * on a failure. */
#define CHOOSE_DIRECTION(what, Perf, COUNT, find_fn, get_fn, ws_size_fn, d1, d2, d3, algo_field,   \
                         math_field, ws_field)                                                     \
  do {                                                                                             \
    Perf perf_[COUNT];                                                                             \
    DT_CUDNN_CHECK(cudnnSetConvolutionMathType(p->conv, base));                                    \
    if (bench)                                                                                     \
      DT_CUDNN_CHECK(find_fn(h, p->d1, fb->d1, p->d2, fb->d2, p->conv, p->d3, fb->d3, COUNT, &got, \
                             perf_, fb->ws, fb->ws_bytes));                                        \
    else                                                                                           \
      DT_CUDNN_CHECK(get_fn(h, p->d1, p->d2, p->conv, p->d3, COUNT, &got, perf_));                 \
    PICK_ALGO(perf_, got, bench, i);                                                               \
    if (i < 0)                                                                                     \
      return no_algorithm(what, &p->g);                                                            \
    p->algo_field = perf_[i].algo;                                                                 \
    p->math_field = exact ? CUDNN_FMA_MATH : perf_[i].mathType;                                    \
    DT_CUDNN_CHECK(cudnnSetConvolutionMathType(p->conv, p->math_field));                           \
    DT_CUDNN_CHECK(ws_size_fn(h, p->d1, p->d2, p->conv, p->d3, p->algo_field, &p->ws_field));      \
  } while (0)

/* Picks the three algorithms, with FMA math (exact f32) for f32 data when
 * TF32 is off, tensor-op math for 16-bit data. Each query starts from the
 * plan's base math type (the previous direction's choice is not a
 * constraint on the next). */
static dt_status plan_choose_with(dt_cuda_ctx *ctx, conv_plan *p, const find_buffers *fb) {
  cudnnHandle_t h = ctx->cudnn;
  int bench = fb != NULL, got = 0, i = -1;
  const int exact = p->dtype == DT_DTYPE_F32 && !p->tf32;
  const cudnnMathType_t base = p->dtype != DT_DTYPE_F32 ? CUDNN_TENSOR_OP_MATH
                               : p->tf32                ? CUDNN_DEFAULT_MATH
                                                        : CUDNN_FMA_MATH;
  CHOOSE_DIRECTION("forward", cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                   cudnnFindConvolutionForwardAlgorithmEx, cudnnGetConvolutionForwardAlgorithm_v7,
                   cudnnGetConvolutionForwardWorkspaceSize, x, w, y, fwd, fwd_math, ws_fwd);
  CHOOSE_DIRECTION(
      "backward-data", cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
      cudnnFindConvolutionBackwardDataAlgorithmEx, cudnnGetConvolutionBackwardDataAlgorithm_v7,
      cudnnGetConvolutionBackwardDataWorkspaceSize, w, y, x, bwd_data, bwd_data_math, ws_bwd_data);
  CHOOSE_DIRECTION(
      "backward-filter", cudnnConvolutionBwdFilterAlgoPerf_t,
      CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, cudnnFindConvolutionBackwardFilterAlgorithmEx,
      cudnnGetConvolutionBackwardFilterAlgorithm_v7, cudnnGetConvolutionBackwardFilterWorkspaceSize,
      x, y, w, bwd_filter, bwd_filter_math, ws_bwd_filter);
  return DT_OK;
}

static dt_status plan_choose(dt_cuda_ctx *ctx, conv_plan *p) {
  if (!dt_cuda_cudnn_benchmark())
    return plan_choose_with(ctx, p, NULL);
  find_buffers fb;
  DT_CHECK(find_buffers_alloc(ctx, &p->g, &fb));
  /* The finds run on the handle's stream: the compute stream, whose
   * allocations these buffers are. */
  dt_status st = DT_OK;
  DT_CUDNN_CHECK_GOTO(cudnnSetStream(ctx->cudnn, dt_cuda_compute_stream(ctx)), st, done);
  st = plan_choose_with(ctx, p, &fb);
done:
  find_buffers_free(ctx, &fb);
  return st;
}

/* cuDNN's legacy descriptors index with int: a tensor of 2^31 elements or
 * more is refused before a descriptor sees it. */
static dt_status check_cudnn_numel(const char *op, const char *what, int64_t numel) {
  if (numel > INT32_MAX)
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "%s: the %s has %lld elements, over cuDNN's 2^31 - 1: split the batch "
                    "(smaller --batch, or --accum)",
                    op, what, (long long)numel);
  return DT_OK;
}

static cudnnDataType_t cudnn_type(dt_dtype t) {
  return t == DT_DTYPE_F16    ? CUDNN_DATA_HALF
         : t == DT_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16
                              : CUDNN_DATA_FLOAT;
}

static dt_status plan_create(dt_cuda_ctx *ctx, const dt_conv2d_geom *g, int tf32, dt_dtype dtype,
                             conv_plan **out) {
  DT_CHECK(check_cudnn_numel("conv2d", "input", (int64_t)g->n * g->c * g->h * g->w));
  DT_CHECK(check_cudnn_numel("conv2d", "output", (int64_t)g->n * g->oc * g->oh * g->ow));
  DT_CHECK(check_cudnn_numel("conv2d", "weight", (int64_t)g->oc * g->c * g->kh * g->kw));
  dt_status st = DT_OK;
  conv_plan *p = calloc(1, sizeof *p);
  if (!p)
    return DT_ERROR(DT_ERR_OOM, "conv2d plan: host malloc failed");
  p->g = *g;
  p->tf32 = tf32;
  p->dtype = dtype;
  const cudnnDataType_t t = cudnn_type(dtype);
  DT_CUDNN_CHECK_GOTO(cudnnCreateTensorDescriptor(&p->x), st, fail);
  DT_CUDNN_CHECK_GOTO(cudnnCreateTensorDescriptor(&p->y), st, fail);
  DT_CUDNN_CHECK_GOTO(cudnnCreateTensorDescriptor(&p->bias), st, fail);
  DT_CUDNN_CHECK_GOTO(cudnnCreateFilterDescriptor(&p->w), st, fail);
  DT_CUDNN_CHECK_GOTO(cudnnCreateConvolutionDescriptor(&p->conv), st, fail);
  /* channels-last: x, y and the filters NHWC (the filters transposed into
   * the workspace, filter_area) */
  const cudnnTensorFormat_t f = g->nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  DT_CUDNN_CHECK_GOTO(cudnnSetTensor4dDescriptor(p->x, f, t, g->n, g->c, g->h, g->w), st, fail);
  DT_CUDNN_CHECK_GOTO(cudnnSetTensor4dDescriptor(p->y, f, t, g->n, g->oc, g->oh, g->ow), st, fail);
  DT_CUDNN_CHECK_GOTO(
      cudnnSetTensor4dDescriptor(p->bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, g->oc, 1, 1), st,
      fail);
  DT_CUDNN_CHECK_GOTO(cudnnSetFilter4dDescriptor(p->w, t, f, g->oc, g->c, g->kh, g->kw), st, fail);
  DT_CUDNN_CHECK_GOTO(cudnnSetConvolution2dDescriptor(p->conv, g->ph, g->pw, g->sh, g->sw, 1, 1,
                                                      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                      st, fail);
  /* f32 compute for every data type; FMA math keeps f32 convolutions exact
   * when TF32 is off */
  DT_CUDNN_CHECK_GOTO(
      cudnnSetConvolutionMathType(p->conv, dtype != DT_DTYPE_F32 ? CUDNN_TENSOR_OP_MATH
                                           : tf32                ? CUDNN_DEFAULT_MATH
                                                                 : CUDNN_FMA_MATH),
      st, fail);
  DT_CHECK_GOTO(plan_choose(ctx, p), st, fail);
  *out = p;
  return DT_OK;
fail:
  plan_destroy(p);
  return st;
}

/* The cached plan for g with data of `dtype` (created on first use). */
static dt_status plan_get(dt_cuda_ctx *ctx, const dt_conv2d_geom *g, dt_dtype dtype,
                          conv_plan **out) {
  int tf32 = dt_cuda_tf32_enabled();
  dt_status st = DT_OK;
  pthread_mutex_lock(&ctx->conv_lock);
  if (!ctx->conv_cache) {
    ctx->conv_cache = calloc(1, sizeof *ctx->conv_cache);
    if (!ctx->conv_cache) {
      st = DT_ERROR(DT_ERR_OOM, "conv2d plan cache: host malloc failed");
      goto unlock;
    }
  }
  dt_cuda_conv_cache *c = ctx->conv_cache;
  for (size_t i = 0; i < c->n; i++)
    if (c->plans[i]->tf32 == tf32 && c->plans[i]->dtype == dtype &&
        memcmp(&c->plans[i]->g, g, sizeof *g) == 0) {
      *out = c->plans[i];
      goto unlock;
    }
  if (c->n == c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 16;
    conv_plan **plans = realloc(c->plans, cap * sizeof *plans);
    if (!plans) {
      st = DT_ERROR(DT_ERR_OOM, "conv2d plan cache: host realloc failed");
      goto unlock;
    }
    c->plans = plans;
    c->cap = cap;
  }
  conv_plan *p = NULL;
  st = plan_create(ctx, g, tf32, dtype, &p);
  if (st == DT_OK) {
    c->plans[c->n++] = p;
    *out = p;
  }
unlock:
  pthread_mutex_unlock(&ctx->conv_lock);
  return st;
}

/* A channels-last plan's room for its filters in (oc, kh, kw, c) order at
 * the start of the workspace (cuDNN's workspace follows it); 0 for NCHW. */
static size_t filter_area(const conv_plan *p) {
  const dt_conv2d_geom *g = &p->g;
  if (!g->nhwc)
    return 0;
  size_t bytes = (size_t)g->oc * g->c * g->kh * g->kw * dt_dtype_size(p->dtype);
  return (bytes + 255) & ~(size_t)255;
}

/* The filters of p between (oc, c, kh, kw) and the workspace's (oc, kh,
 * kw, c), by the strided copy on ex's stream: to_krsc 1 from src into the
 * area, 0 from the area into dst. */
static dt_status filter_move(const dt_exec *ex, const conv_plan *p, const void *src, void *dst,
                             int to_krsc) {
  const dt_conv2d_geom *g = &p->g;
  const int64_t c = g->c, khw = (int64_t)g->kh * g->kw, per = c * khw;
  /* in dst's order: (oc, khw, c) into channels-last, (oc, c, khw) back */
  const int64_t shape[3] = {g->oc, to_krsc ? khw : c, to_krsc ? c : khw};
  const int64_t dst_strides[3] = {per, to_krsc ? c : khw, 1};
  const int64_t src_strides[3] = {per, 1, to_krsc ? khw : c};
  return dt_cuda_copy_strided(ex, dst, dst_strides, src, src_strides, shape, 3,
                              dt_dtype_size(p->dtype));
}

dt_status dt_cuda_conv2d_workspace(const dt_exec *ex, const dt_conv2d_geom *g, size_t *bytes) {
  *bytes = 0;
  if (g->n == 0)
    return DT_OK;
  DT_CUDA_EXEC(ex, ctx, stream);
  (void)stream;
  conv_plan *p = NULL;
  DT_CHECK(plan_get(ctx, g, ex->dtype, &p));
  size_t ws = p->ws_fwd;
  if (p->ws_bwd_data > ws)
    ws = p->ws_bwd_data;
  if (p->ws_bwd_filter > ws)
    ws = p->ws_bwd_filter;
  *bytes = filter_area(p) + ws;
  return DT_OK;
}

/* `given` when the caller passed a workspace, else a temporary one from the
 * allocator (freed by the caller through *tmp). */
static dt_status workspace_get(dt_cuda_ctx *ctx, void *given, size_t bytes, void **ws, void **tmp) {
  *tmp = NULL;
  *ws = given;
  if (given || bytes == 0)
    return DT_OK;
  DT_CHECK(dt_cuda_scratch_alloc(ctx, bytes, tmp));
  *ws = *tmp;
  return DT_OK;
}

/* Ends what conv_begin began: the lock, the temporary workspace. st. */
static dt_status conv_end(dt_cuda_ctx *ctx, void *tmp, dt_status st) {
  pthread_mutex_unlock(&ctx->conv_lock);
  if (tmp)
    dt_cuda_scratch_free(ctx, tmp);
  return st;
}

/* A convolution's workspace (workspace_get) and the convolution lock (the
 * descriptor's math type is per direction), with cuDNN on `stream`; the
 * caller ends with conv_end. On an error nothing is held. */
static dt_status conv_begin(dt_cuda_ctx *ctx, cudaStream_t stream, void *given, size_t bytes,
                            void **ws, void **tmp) {
  DT_CHECK(workspace_get(ctx, given, bytes, ws, tmp));
  pthread_mutex_lock(&ctx->conv_lock);
  dt_status st = DT_OK;
  DT_CUDNN_CHECK_GOTO(cudnnSetStream(ctx->cudnn, stream), st, fail);
  return DT_OK;
fail:
  return conv_end(ctx, *tmp, st);
}

// x (n,c,h,w), w (oc,c,kh,kw), bias (oc, f32) or NULL -> y (n,oc,oh,ow); x, w, y of ex->dtype
dt_status dt_cuda_conv2d_forward(const dt_exec *ex, const dt_conv2d_geom *g, const float *x,
                                 const float *w, const float *bias, float *y, void *workspace) {
  if (g->n == 0)
    return DT_OK;
  DT_CUDA_EXEC(ex, ctx, stream);
  conv_plan *p = NULL;
  DT_CHECK(plan_get(ctx, g, ex->dtype, &p));
  void *ws = NULL, *tmp = NULL;
  const size_t area = filter_area(p);
  DT_CHECK(conv_begin(ctx, stream, workspace, area + p->ws_fwd, &ws, &tmp));
  const float one = 1.0f, zero = 0.0f;
  dt_status st = DT_OK;
  if (area) {
    DT_CHECK_GOTO(filter_move(ex, p, w, ws, 1), st, unlock);
    w = ws;
    ws = (char *)ws + area;
  }
  DT_CUDNN_CHECK_GOTO(cudnnSetConvolutionMathType(p->conv, p->fwd_math), st, unlock);
  DT_CUDNN_CHECK_GOTO(cudnnConvolutionForward(ctx->cudnn, &one, p->x, x, p->w, w, p->conv, p->fwd,
                                              ws, p->ws_fwd, &zero, p->y, y),
                      st, unlock);
  if (bias && p->dtype == DT_DTYPE_F32)
    DT_CUDNN_CHECK_GOTO(cudnnAddTensor(ctx->cudnn, &one, p->bias, bias, &one, p->y, y), st, unlock);
  else if (bias) /* channels-last: (n oh ow, oc, 1) */
    st = g->nhwc ? dt_cuda_conv_bias_forward(stream, p->dtype, bias, y,
                                             (int64_t)g->n * g->oh * g->ow, g->oc, 1)
                 : dt_cuda_conv_bias_forward(stream, p->dtype, bias, y, g->n, g->oc,
                                             (int64_t)g->oh * g->ow);
unlock:
  return conv_end(ctx, tmp, st);
}

/* Not on CUDA: dt_op_conv2d's backward takes conv2d_backward here (the op
 * asks for the accumulating form only on the CPU). */
dt_status dt_cuda_conv2d_backward_acc(const dt_exec *ex, const dt_conv2d_geom *g, const float *x,
                                      const float *w, const float *dy, float *dx, float *dw,
                                      float *db, void *workspace) {
  (void)ex, (void)g, (void)x, (void)w, (void)dy, (void)dx, (void)dw, (void)db, (void)workspace;
  return DT_ERROR(DT_ERR_UNSUPPORTED,
                  "conv2d_backward_acc: the CUDA backend overwrites dw (conv2d_backward)");
}

// x (n,c,h,w), w (oc,c,kh,kw), dy (n,oc,oh,ow) -> dx, dw, db (each NULL to skip; overwritten);
// all but db (f32) of ex->dtype
dt_status dt_cuda_conv2d_backward(const dt_exec *ex, const dt_conv2d_geom *g, const float *x,
                                  const float *w, const float *dy, float *dx, float *dw, float *db,
                                  void *workspace) {
  DT_CUDA_EXEC(ex, ctx, stream);
  if (g->n == 0) { /* no samples: the parameter gradients are zero */
    size_t wbytes = (size_t)g->oc * g->c * g->kh * g->kw * dt_dtype_size(ex->dtype);
    if (dw)
      DT_CUDA_CHECK(cudaMemsetAsync(dw, 0, wbytes, stream));
    if (db)
      DT_CUDA_CHECK(cudaMemsetAsync(db, 0, (size_t)g->oc * sizeof(float), stream));
    return DT_OK;
  }
  conv_plan *p = NULL;
  DT_CHECK(plan_get(ctx, g, ex->dtype, &p));
  size_t need = 0;
  if (dx)
    need = p->ws_bwd_data;
  if (dw && p->ws_bwd_filter > need)
    need = p->ws_bwd_filter;
  void *ws = NULL, *tmp = NULL;
  /* channels-last: the area holds the filters for dx, then dw before it
   * is moved out */
  const size_t area = filter_area(p);
  DT_CHECK(conv_begin(ctx, stream, workspace, area + need, &ws, &tmp));
  void *krsc = ws;
  ws = (char *)ws + area;
  const float one = 1.0f, zero = 0.0f;
  dt_status st = DT_OK;
  if (dx) {
    if (area) {
      DT_CHECK_GOTO(filter_move(ex, p, w, krsc, 1), st, unlock);
      w = krsc;
    }
    DT_CUDNN_CHECK_GOTO(cudnnSetConvolutionMathType(p->conv, p->bwd_data_math), st, unlock);
    DT_CUDNN_CHECK_GOTO(
        cudnnConvolutionBackwardData(ctx->cudnn, &one, p->w, w, p->y, dy, p->conv, p->bwd_data, ws,
                                     p->ws_bwd_data, &zero, p->x, dx),
        st, unlock);
  }
  if (dw) {
    DT_CUDNN_CHECK_GOTO(cudnnSetConvolutionMathType(p->conv, p->bwd_filter_math), st, unlock);
    DT_CUDNN_CHECK_GOTO(
        cudnnConvolutionBackwardFilter(ctx->cudnn, &one, p->x, x, p->y, dy, p->conv, p->bwd_filter,
                                       ws, p->ws_bwd_filter, &zero, p->w, area ? krsc : dw),
        st, unlock);
    if (area)
      DT_CHECK_GOTO(filter_move(ex, p, krsc, dw, 0), st, unlock);
  }
  if (db && p->dtype == DT_DTYPE_F32)
    DT_CUDNN_CHECK_GOTO(
        cudnnConvolutionBackwardBias(ctx->cudnn, &one, p->y, dy, &zero, p->bias, db), st, unlock);
  else if (db)
    st = g->nhwc ? dt_cuda_conv_bias_backward(stream, p->dtype, dy, db,
                                              (int64_t)g->n * g->oh * g->ow, g->oc, 1)
                 : dt_cuda_conv_bias_backward(stream, p->dtype, dy, db, g->n, g->oc,
                                              (int64_t)g->oh * g->ow);
unlock:
  return conv_end(ctx, tmp, st);
}

/* ---- batch normalisation ----
 *
 * x, y, dy and dx of one dtype (f32, or 16-bit with autocast's NORM
 * policy: a convolution's 16-bit output normalised into a 16-bit result)
 * go to cuDNN as they are, with f32 per-channel vectors (cuDNN's mixed
 * batch norm: f32 statistics, the 16-bit values read and written once).
 * Mixed dtypes (an f32 x with a 16-bit y), or a 16-bit batch norm cuDNN
 * answers NOT_SUPPORTED or BAD_PARAM to, run the f32 path on f32 copies
 * (cast kernels) in scratch memory, rounding the result once. */

/* Descriptors of x viewed as (n, c, hw, 1) and of the per-channel vectors.
 * With hw 1 (a (N, C) input, or channels-last activations normalised as
 * their (N*H*W, C) view) the same memory is described as NHWC, so cuDNN
 * can pick its channels-last kernels rather than read a stride-c column
 * per channel. */
typedef struct bn_desc {
  cudnnTensorDescriptor_t x, bn;
} bn_desc;

static void bn_desc_destroy(bn_desc *d) {
  if (d->x)
    cudnnDestroyTensorDescriptor(d->x);
  if (d->bn)
    cudnnDestroyTensorDescriptor(d->bn);
}

static dt_status bn_desc_create(int64_t n, int64_t c, int64_t hw, dt_dtype t, bn_desc *d) {
  memset(d, 0, sizeof *d);
  if (n > INT32_MAX || c > INT32_MAX || hw > INT32_MAX)
    return DT_ERROR(DT_ERR_UNSUPPORTED, "batch_norm2d: size (n %lld, c %lld, hw %lld) over 2^31",
                    (long long)n, (long long)c, (long long)hw);
  DT_CHECK(check_cudnn_numel("batch_norm2d", "input", n * c * hw));
  dt_status st = DT_OK;
  DT_CUDNN_CHECK_GOTO(cudnnCreateTensorDescriptor(&d->x), st, fail);
  DT_CUDNN_CHECK_GOTO(cudnnCreateTensorDescriptor(&d->bn), st, fail);
  DT_CUDNN_CHECK_GOTO(
      cudnnSetTensor4dDescriptor(d->x, hw == 1 ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                 cudnn_type(t), (int)n, (int)c, (int)hw, 1),
      st, fail);
  /* f32 for a 16-bit x too */
  DT_CUDNN_CHECK_GOTO(cudnnDeriveBNTensorDescriptor(d->bn, d->x, CUDNN_BATCHNORM_SPATIAL), st,
                      fail);
  return DT_OK;
fail:
  bn_desc_destroy(d);
  return st;
}

/* Per-channel stand-ins for NULL arguments: `count` vectors of c floats,
 * the first `ones` of them filled with 1, the rest with 0. */
static dt_status bn_scratch(dt_cuda_ctx *ctx, const dt_exec *ex, int64_t c, int count, int ones,
                            float **out) {
  DT_CHECK(dt_cuda_scratch_alloc(ctx, (size_t)(c * count) * sizeof(float), (void **)out));
  dt_exec e32 = *ex;
  e32.dtype = DT_DTYPE_F32;
  dt_status st = DT_OK;
  if (ones)
    st = dt_cuda_fill(&e32, *out, 1.0f, c * ones);
  if (st == DT_OK && count > ones)
    st = dt_cuda_fill(&e32, *out + c * ones, 0.0f, c * (count - ones));
  if (st != DT_OK)
    dt_cuda_scratch_free(ctx, *out);
  return st;
}

/* cuDNN has no kernel for this batch norm (a 16-bit one): the f32 path. */
static int bn_declined(cudnnStatus_t e) {
  return (e >= CUDNN_STATUS_BAD_PARAM && e < CUDNN_STATUS_BAD_PARAM + 1000) ||
         (e >= CUDNN_STATUS_NOT_SUPPORTED && e < CUDNN_STATUS_NOT_SUPPORTED + 1000);
}

/* Counts a batch norm with a 16-bit operand (x of t, y or dy of t2) in
 * ctx->bn_counts; returns whether cuDNN ran it (nothing left to do). */
static int bn_count(dt_cuda_ctx *ctx, dt_dtype t, dt_dtype t2, int declined) {
  dt_cuda_bn_counts *k = &ctx->bn_counts;
  if (t == DT_DTYPE_F32 && t2 == DT_DTYPE_F32)
    return !declined;
  if (!declined)
    k->half_cudnn++;
  else
    k->f32_copies++;
  if (declined && t == t2)
    k->declined++;
  return !declined;
}

dt_status dt_cuda_bn_counts_get(dt_device dev, dt_cuda_bn_counts *out) {
  memset(out, 0, sizeof *out);
  dt_cuda_ctx *ctx = NULL;
  DT_CHECK(dt_cuda_ctx_get(dev, &ctx));
  *out = ctx->bn_counts;
  return DT_OK;
}

/* An f32 stand-in for a 16-bit operand of `total` elements: p itself when
 * it is f32, else scratch (holding p widened when `widen`). */
static dt_status bn_f32(dt_cuda_ctx *ctx, const dt_exec *ex, const void *p, dt_dtype t,
                        int64_t total, int widen, float **out) {
  *out = (float *)p;
  if (t == DT_DTYPE_F32 || p == NULL)
    return DT_OK;
  DT_CHECK(dt_cuda_scratch_alloc(ctx, (size_t)total * sizeof(float), (void **)out));
  dt_status st = widen ? dt_cuda_cast(ex, p, t, *out, DT_DTYPE_F32, total) : DT_OK;
  if (st != DT_OK) {
    dt_cuda_scratch_free(ctx, *out);
    *out = NULL;
  }
  return st;
}

/* Gives back a stand-in, rounding it into `dst` (of t) first when given. */
static dt_status bn_f32_done(dt_cuda_ctx *ctx, const dt_exec *ex, dt_status st, float *f32,
                             const void *orig, void *dst, dt_dtype t, int64_t total) {
  if (f32 == NULL || f32 == orig)
    return st;
  if (st == DT_OK && dst)
    st = dt_cuda_cast(ex, f32, DT_DTYPE_F32, dst, t, total);
  dt_cuda_scratch_free(ctx, f32);
  return st;
}

/* The batch norm forward through cuDNN, x and y of `t`; *declined when
 * cuDNN has no kernel for it (nothing was written then). */
static dt_status bn_forward_cudnn(dt_cuda_ctx *ctx, const dt_exec *ex, dt_dtype t, const void *x,
                                  void *y, const float *gamma, const float *beta,
                                  float *running_mean, float *running_var, float *save_mean,
                                  float *save_invstd, int64_t n, int64_t c, int64_t hw,
                                  bool training, float momentum, float eps, int *declined) {
  *declined = 0;
  bn_desc d;
  DT_CHECK(bn_desc_create(n, c, hw, t, &d));
  /* scratch: [ones (gamma)] [zeros (beta)] [save_mean] [save_invstd] */
  float *tmp = NULL;
  dt_status st = bn_scratch(ctx, ex, c, 4, 1, &tmp);
  if (st != DT_OK) {
    bn_desc_destroy(&d);
    return st;
  }
  const float *g = gamma ? gamma : tmp;
  const float *b = beta ? beta : tmp + c;
  const float one = 1.0f, zero = 0.0f;
  cudnnStatus_t e;
  if (training)
    e = cudnnBatchNormalizationForwardTraining(
        ctx->cudnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, d.x, x, d.x, y, d.bn, g, b,
        (double)momentum, running_mean, running_var, (double)eps,
        save_mean ? save_mean : tmp + 2 * c, save_invstd ? save_invstd : tmp + 3 * c);
  else
    e = cudnnBatchNormalizationForwardInference(ctx->cudnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero,
                                                d.x, x, d.x, y, d.bn, g, b, running_mean,
                                                running_var, (double)eps);
  if (t != DT_DTYPE_F32 && bn_declined(e))
    *declined = 1;
  else if (e != CUDNN_STATUS_SUCCESS)
    st = dt_cudnn_fail(e,
                       training ? "cudnnBatchNormalizationForwardTraining"
                                : "cudnnBatchNormalizationForwardInference",
                       __func__, __FILE__, __LINE__);
  else if (!training) /* as the CPU: a backward through eval mode uses the running stats */
    st = dt_cuda_bn_eval_stats(ctx, running_mean, running_var, save_mean, save_invstd, c, eps);
  dt_cuda_scratch_free(ctx, tmp);
  bn_desc_destroy(&d);
  return st;
}

// x (n,c,hw) of ex->dtype -> y (n,c,hw) of y_dtype; batch statistics (training) or running ones
// (eval)
dt_status dt_cuda_batch_norm2d_forward(const dt_exec *ex, const float *x, float *y,
                                       dt_dtype y_dtype, const float *gamma, const float *beta,
                                       float *running_mean, float *running_var, float *save_mean,
                                       float *save_invstd, int64_t n, int64_t c, int64_t hw,
                                       bool training, float momentum, float eps) {
  if (training && (!running_mean) != (!running_var))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "batch_norm2d_forward: pass both running_mean and running_var, or neither");
  if (eps < CUDNN_BN_MIN_EPSILON)
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "batch_norm2d_forward: eps %g is below cuDNN's minimum %g: use eps >= %g",
                    (double)eps, CUDNN_BN_MIN_EPSILON, CUDNN_BN_MIN_EPSILON);
  const int64_t total = n * c * hw;
  if (total == 0)
    return DT_OK;
  DT_CUDA_EXEC(ex, ctx, stream);
  DT_CUDNN_CHECK(cudnnSetStream(ctx->cudnn, stream));
  int declined = 1;
  if (ex->dtype == y_dtype)
    DT_CHECK(bn_forward_cudnn(ctx, ex, y_dtype, x, y, gamma, beta, running_mean, running_var,
                              save_mean, save_invstd, n, c, hw, training, momentum, eps,
                              &declined));
  if (bn_count(ctx, ex->dtype, y_dtype, declined))
    return DT_OK;
  /* f32 copies of a 16-bit x and y */
  float *x32 = NULL, *y32 = NULL;
  DT_CHECK(bn_f32(ctx, ex, x, ex->dtype, total, 1, &x32));
  dt_status st = bn_f32(ctx, ex, y, y_dtype, total, 0, &y32);
  if (st == DT_OK)
    st = bn_forward_cudnn(ctx, ex, DT_DTYPE_F32, x32, y32, gamma, beta, running_mean, running_var,
                          save_mean, save_invstd, n, c, hw, training, momentum, eps, &declined);
  st = bn_f32_done(ctx, ex, st, y32, y, y, y_dtype, total);
  return bn_f32_done(ctx, ex, st, x32, x, NULL, ex->dtype, total);
}

/* The training backward through cuDNN, x, dy and dx of `t`; *declined as
 * bn_forward_cudnn's. */
static dt_status bn_backward_cudnn(dt_cuda_ctx *ctx, const dt_exec *ex, dt_dtype t, const void *x,
                                   const void *dy, const float *gamma, const float *save_mean,
                                   const float *save_invstd, void *dx, float *dgamma, float *dbeta,
                                   int64_t n, int64_t c, int64_t hw, float eps, int *declined) {
  *declined = 0;
  bn_desc d;
  DT_CHECK(bn_desc_create(n, c, hw, t, &d));
  /* scratch: [ones (gamma)] [dgamma] [dbeta]; dx scratch separately */
  float *tmp = NULL;
  void *dx_tmp = NULL;
  dt_status st = bn_scratch(ctx, ex, c, 3, 1, &tmp);
  if (st != DT_OK) {
    bn_desc_destroy(&d);
    return st;
  }
  if (!dx)
    st = dt_cuda_scratch_alloc(ctx, (size_t)(n * c * hw) * dt_dtype_size(t), &dx_tmp);
  if (st == DT_OK) {
    const float one = 1.0f, zero = 0.0f;
    cudnnStatus_t e = cudnnBatchNormalizationBackward(
        ctx->cudnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, d.x, x, d.x, dy, d.x,
        dx ? dx : dx_tmp, d.bn, gamma ? gamma : tmp, dgamma ? dgamma : tmp + c,
        dbeta ? dbeta : tmp + 2 * c, (double)eps, save_mean, save_invstd);
    if (t != DT_DTYPE_F32 && bn_declined(e))
      *declined = 1;
    else if (e != CUDNN_STATUS_SUCCESS)
      st = dt_cudnn_fail(e, "cudnnBatchNormalizationBackward", __func__, __FILE__, __LINE__);
  }
  if (dx_tmp)
    dt_cuda_scratch_free(ctx, dx_tmp);
  dt_cuda_scratch_free(ctx, tmp);
  bn_desc_destroy(&d);
  return st;
}

// x (n,c,hw) of ex->dtype, dy of dy_dtype, saved mean/invstd (c) -> dx (n,c,hw) of ex->dtype,
// dgamma, dbeta (c), overwritten
dt_status dt_cuda_batch_norm2d_backward(const dt_exec *ex, const float *x, const float *dy,
                                        dt_dtype dy_dtype, const float *gamma,
                                        const float *save_mean, const float *save_invstd, float *dx,
                                        float *dgamma, float *dbeta, int64_t n, int64_t c,
                                        int64_t hw, float eps) {
  if (eps < CUDNN_BN_MIN_EPSILON)
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "batch_norm2d_backward: eps %g is below cuDNN's minimum %g: use eps >= %g",
                    (double)eps, CUDNN_BN_MIN_EPSILON, CUDNN_BN_MIN_EPSILON);
  if (!save_mean || !save_invstd)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "batch_norm2d_backward: needs save_mean and save_invstd from the forward");
  if (c == 0)
    return DT_OK;
  DT_CUDA_EXEC(ex, ctx, stream);
  const int64_t total = n * c * hw;
  if (total == 0) {
    if (dgamma)
      DT_CUDA_CHECK(cudaMemsetAsync(dgamma, 0, (size_t)c * sizeof(float), stream));
    if (dbeta)
      DT_CUDA_CHECK(cudaMemsetAsync(dbeta, 0, (size_t)c * sizeof(float), stream));
    return DT_OK;
  }
  DT_CUDNN_CHECK(cudnnSetStream(ctx->cudnn, stream));
  int declined = 1;
  if (ex->dtype == dy_dtype)
    DT_CHECK(bn_backward_cudnn(ctx, ex, dy_dtype, x, dy, gamma, save_mean, save_invstd, dx, dgamma,
                               dbeta, n, c, hw, eps, &declined));
  if (bn_count(ctx, ex->dtype, dy_dtype, declined))
    return DT_OK;
  /* f32 copies of a 16-bit x, dy and dx */
  float *x32 = NULL, *dy32 = NULL, *dx32 = NULL;
  DT_CHECK(bn_f32(ctx, ex, x, ex->dtype, total, 1, &x32));
  dt_status st = bn_f32(ctx, ex, dy, dy_dtype, total, 1, &dy32);
  if (st == DT_OK)
    st = bn_f32(ctx, ex, dx, ex->dtype, total, 0, &dx32);
  if (st == DT_OK)
    st = bn_backward_cudnn(ctx, ex, DT_DTYPE_F32, x32, dy32, gamma, save_mean, save_invstd, dx32,
                           dgamma, dbeta, n, c, hw, eps, &declined);
  st = bn_f32_done(ctx, ex, st, dx32, dx, dx, ex->dtype, total);
  st = bn_f32_done(ctx, ex, st, dy32, dy, NULL, dy_dtype, total);
  return bn_f32_done(ctx, ex, st, x32, x, NULL, ex->dtype, total);
}
