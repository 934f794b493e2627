/* CPU convolution (im2col + OpenBLAS sgemm) and pooling, NCHW.
 *
 * With at least as many images as threads, each OpenMP thread convolves
 * whole images with a single-threaded sgemm (OpenBLAS runs single-threaded
 * inside a parallel region); with fewer images the images go one by one and
 * sgemm itself uses the threads. im2col buffers are per-thread scratch kept
 * between calls, so conv2d_workspace is 0 and the workspace argument is
 * unused on the CPU.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_internal.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---- geometry ---- */

static dt_status check_geom(const char *op, const dt_conv2d_geom *g, int conv) {
  if (g->n < 0 || g->c <= 0 || g->h <= 0 || g->w <= 0 || g->kh <= 0 || g->kw <= 0 ||
      g->sh <= 0 || g->sw <= 0 || g->ph < 0 || g->pw < 0 || (conv && g->oc <= 0))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s: bad geometry: n=%d c=%d h=%d w=%d oc=%d kernel %dx%d stride %dx%d "
                    "padding %dx%d",
                    op, g->n, g->c, g->h, g->w, g->oc, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw);
  int oh = (g->h + 2 * g->ph - g->kh) / g->sh + 1;
  int ow = (g->w + 2 * g->pw - g->kw) / g->sw + 1;
  if (g->h + 2 * g->ph < g->kh || g->w + 2 * g->pw < g->kw || g->oh != oh || g->ow != ow)
    return DT_ERROR(DT_ERR_SHAPE,
                    "%s: output %dx%d does not match input %dx%d, kernel %dx%d, stride %dx%d, "
                    "padding %dx%d (expected %dx%d): the kernel must fit in the padded input",
                    op, g->oh, g->ow, g->h, g->w, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw,
                    g->h + 2 * g->ph < g->kh ? 0 : oh, g->w + 2 * g->pw < g->kw ? 0 : ow);
  return DT_OK;
}

/* floor(a / b) for b > 0 */
static int floor_div(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/* Output columns ox whose input column ox*sw - pw + kj lies in [0, w). */
static void valid_cols(const dt_conv2d_geom *g, int kj, int *lo, int *hi) {
  int l = -floor_div(-(g->pw - kj), g->sw); /* ceil((pw - kj) / sw) */
  *lo = MAX(0, l);
  *hi = MIN(g->ow, floor_div(g->w - 1 + g->pw - kj, g->sw) + 1);
  if (*hi < *lo)
    *hi = *lo;
}

/* ---- im2col / col2im ---- */

// x (c,h,w) -> col (c*kh*kw, oh*ow)
static void im2col(const dt_conv2d_geom *g, const float *x, float *col, int par) {
  int rows = g->c * g->kh * g->kw, ohw = g->oh * g->ow;
#pragma omp parallel for if (par) num_threads(dt_cpu_threads()) schedule(static)
  for (int r = 0; r < rows; r++) {
    int ci = r / (g->kh * g->kw), ki = (r / g->kw) % g->kh, kj = r % g->kw;
    int lo, hi;
    valid_cols(g, kj, &lo, &hi);
    float *dst = col + (int64_t)r * ohw;
    const float *plane = x + (int64_t)ci * g->h * g->w;
    for (int oy = 0; oy < g->oh; oy++, dst += g->ow) {
      int iy = oy * g->sh - g->ph + ki;
      if (iy < 0 || iy >= g->h) {
        memset(dst, 0, (size_t)g->ow * sizeof(float));
        continue;
      }
      const float *src = plane + (int64_t)iy * g->w - g->pw + kj;
      for (int ox = 0; ox < lo; ox++)
        dst[ox] = 0.0f;
      if (g->sw == 1)
        memcpy(dst + lo, src + lo, (size_t)(hi - lo) * sizeof(float));
      else
        for (int ox = lo; ox < hi; ox++)
          dst[ox] = src[ox * g->sw];
      for (int ox = hi; ox < g->ow; ox++)
        dst[ox] = 0.0f;
    }
  }
}

// col (c*kh*kw, oh*ow) -> x (c,h,w) overwritten with the sum of overlapping entries
static void col2im(const dt_conv2d_geom *g, const float *col, float *x, int par) {
  int ohw = g->oh * g->ow;
#pragma omp parallel for if (par) num_threads(dt_cpu_threads()) schedule(static)
  for (int ci = 0; ci < g->c; ci++) {
    float *plane = x + (int64_t)ci * g->h * g->w;
    memset(plane, 0, (size_t)g->h * g->w * sizeof(float));
    for (int ki = 0; ki < g->kh; ki++)
      for (int kj = 0; kj < g->kw; kj++) {
        int lo, hi;
        valid_cols(g, kj, &lo, &hi);
        const float *src = col + (int64_t)((ci * g->kh + ki) * g->kw + kj) * ohw;
        for (int oy = 0; oy < g->oh; oy++, src += g->ow) {
          int iy = oy * g->sh - g->ph + ki;
          if (iy < 0 || iy >= g->h)
            continue;
          float *dst = plane + (int64_t)iy * g->w - g->pw + kj;
          if (g->sw == 1)
            for (int ox = lo; ox < hi; ox++)
              dst[ox] += src[ox];
          else
            for (int ox = lo; ox < hi; ox++)
              dst[ox * g->sw] += src[ox];
        }
      }
  }
}

/* ---- per-thread scratch ---- */

/* A pthread key rather than _Thread_local so that the buffer is freed when
 * a thread exits (OpenMP retires pool threads when the count shrinks). */
typedef struct thread_scratch_buf {
  float *data;
  size_t cap; /* floats */
} thread_scratch_buf;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_destroy(void *p) {
  thread_scratch_buf *b = p;
  free(b->data);
  free(b);
}

static void scratch_key_init(void) { pthread_key_create(&scratch_key, scratch_destroy); }

/* A buffer of at least `floats` for the calling thread, reused by later
 * calls on the same thread; NULL when malloc fails. */
static float *thread_scratch(size_t floats) {
  pthread_once(&scratch_once, scratch_key_init);
  thread_scratch_buf *b = pthread_getspecific(scratch_key);
  if (!b) {
    b = calloc(1, sizeof *b);
    if (!b || pthread_setspecific(scratch_key, b) != 0) {
      free(b);
      return NULL;
    }
  }
  if (floats > b->cap) {
    free(b->data);
    b->data = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
    b->cap = b->data ? floats : 0;
  }
  return b->data;
}

static int is_pointwise(const dt_conv2d_geom *g) {
  return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

static dt_status scratch_oom(const char *op, size_t floats) {
  return DT_ERROR(DT_ERR_OOM, "%s: im2col buffer of %zu bytes: malloc failed: reduce the batch "
                  "size or image size", op, floats * sizeof(float));
}

size_t dt_cpu_conv2d_workspace(dt_device dev, const dt_conv2d_geom *g) {
  (void)dev;
  (void)g;
  return 0;
}

/* ---- convolution ---- */

// one image: x (c,h,w), w (oc, c*kh*kw) -> y (oc, oh*ow)
static int conv_forward_image(const dt_conv2d_geom *g, const float *x, const float *w,
                              const float *bias, float *y, int par) {
  int ckk = g->c * g->kh * g->kw, ohw = g->oh * g->ow;
  const float *col = x;
  if (!is_pointwise(g)) {
    float *buf = thread_scratch((size_t)ckk * ohw);
    if (!buf)
      return 0;
    im2col(g, x, buf, par);
    col = buf;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->oc, ohw, ckk, 1.0f, w, ckk, col, ohw,
              0.0f, y, ohw);
  if (bias)
    for (int o = 0; o < g->oc; o++) {
      float b = bias[o], *yo = y + (int64_t)o * ohw;
      for (int i = 0; i < ohw; i++)
        yo[i] += b;
    }
  return 1;
}

// x (n,c,h,w), w (oc,c,kh,kw), bias (oc) or NULL -> y (n,oc,oh,ow)
dt_status dt_cpu_conv2d_forward(dt_device dev, const dt_conv2d_geom *g, const float *x,
                                const float *w, const float *bias, float *y, void *workspace) {
  (void)dev;
  (void)workspace;
  DT_CHECK(check_geom("conv2d_forward", g, 1));
  int64_t in_sz = (int64_t)g->c * g->h * g->w, out_sz = (int64_t)g->oc * g->oh * g->ow;
  size_t col_floats = (size_t)g->c * g->kh * g->kw * g->oh * g->ow;
  int nt = dt_cpu_threads();
  int failed = 0;
  if (nt > 1 && g->n >= nt) {
#pragma omp parallel for num_threads(nt) schedule(static) reduction(| : failed)
    for (int i = 0; i < g->n; i++)
      failed |= !conv_forward_image(g, x + i * in_sz, w, bias, y + i * out_sz, 0);
  } else {
    int par = (int64_t)col_floats >= DT_CPU_PAR_MIN;
    for (int i = 0; i < g->n && !failed; i++)
      failed = !conv_forward_image(g, x + i * in_sz, w, bias, y + i * out_sz, par);
  }
  return failed ? scratch_oom("conv2d_forward", col_floats) : DT_OK;
}

/* One image of the backward: dw_acc (oc, ckk) += dy (oc, ohw) col^T (beta
 * 0 for the first image of a run), dx (c,h,w) = col2im(w^T dy). */
static int conv_backward_image(const dt_conv2d_geom *g, const float *x, const float *w,
                               const float *dy, float *dx, float *dw_acc, float dw_beta,
                               int par) {
  int ckk = g->c * g->kh * g->kw, ohw = g->oh * g->ow;
  int pointwise = is_pointwise(g);
  float *buf = NULL;
  if (!pointwise) {
    buf = thread_scratch((size_t)ckk * ohw);
    if (!buf)
      return 0;
  }
  if (dw_acc) {
    const float *col = x;
    if (!pointwise) {
      im2col(g, x, buf, par);
      col = buf;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g->oc, ckk, ohw, 1.0f, dy, ohw, col, ohw,
                dw_beta, dw_acc, ckk);
  }
  if (dx) {
    float *dcol = pointwise ? dx : buf;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ckk, ohw, g->oc, 1.0f, w, ckk, dy, ohw,
                0.0f, dcol, ohw);
    if (!pointwise)
      col2im(g, dcol, dx, par);
  }
  return 1;
}

// x (n,c,h,w), w (oc,c,kh,kw), dy (n,oc,oh,ow) -> dx (n,c,h,w), dw (oc,c,kh,kw), db (oc);
// each may be NULL; all overwrite
dt_status dt_cpu_conv2d_backward(dt_device dev, const dt_conv2d_geom *g, const float *x,
                                 const float *w, const float *dy, float *dx, float *dw,
                                 float *db, void *workspace) {
  (void)dev;
  (void)workspace;
  DT_CHECK(check_geom("conv2d_backward", g, 1));
  int64_t in_sz = (int64_t)g->c * g->h * g->w, out_sz = (int64_t)g->oc * g->oh * g->ow;
  int64_t ohw = (int64_t)g->oh * g->ow, w_sz = (int64_t)g->oc * g->c * g->kh * g->kw;
  size_t col_floats = (size_t)g->c * g->kh * g->kw * ohw;
  int nt = dt_cpu_threads();

  if (db) { /* db[o] = sum over images and pixels of dy, in double */
#pragma omp parallel for if ((int64_t)g->n * out_sz >= DT_CPU_PAR_MIN) num_threads(nt)
    for (int o = 0; o < g->oc; o++) {
      double s = 0.0;
      for (int i = 0; i < g->n; i++) {
        const float *p = dy + i * out_sz + o * ohw;
        for (int64_t k = 0; k < ohw; k++)
          s += p[k];
      }
      db[o] = (float)s;
    }
  }
  if (!dx && !dw)
    return DT_OK;
  if (dw && g->n == 0)
    memset(dw, 0, (size_t)w_sz * sizeof(float));

  int failed = 0;
  if (nt > 1 && g->n >= nt) {
    /* Thread t takes a contiguous run of images and accumulates its own dw
     * partial; the partials are summed in thread order afterwards. */
    int teams = MIN(nt, g->n);
    float *partials = NULL;
    if (dw && teams > 1) {
      partials = malloc((size_t)(teams - 1) * w_sz * sizeof(float));
      if (!partials)
        return DT_ERROR(DT_ERR_OOM, "conv2d_backward: %d weight-gradient partials of %lld "
                        "floats: malloc failed", teams - 1, (long long)w_sz);
    }
#pragma omp parallel num_threads(teams) reduction(| : failed)
    {
      int t = omp_get_thread_num(), nteam = omp_get_num_threads();
      int i0 = (int)((int64_t)g->n * t / nteam), i1 = (int)((int64_t)g->n * (t + 1) / nteam);
      float *acc = !dw ? NULL : t == 0 ? dw : partials + (int64_t)(t - 1) * w_sz;
      if (acc && i0 == i1)
        memset(acc, 0, (size_t)w_sz * sizeof(float));
      for (int i = i0; i < i1 && !failed; i++)
        failed |= !conv_backward_image(g, x + i * in_sz, w, dy + i * out_sz,
                                       dx ? dx + i * in_sz : NULL, acc, i == i0 ? 0.0f : 1.0f, 0);
#pragma omp barrier
      if (dw && !failed) {
        /* sum partials into dw, split by element range */
        int64_t e0 = w_sz * t / nteam, e1 = w_sz * (t + 1) / nteam;
        for (int p = 1; p < nteam; p++) {
          const float *src = partials + (int64_t)(p - 1) * w_sz;
          for (int64_t e = e0; e < e1; e++)
            dw[e] += src[e];
        }
      }
    }
    free(partials);
  } else {
    int par = (int64_t)col_floats >= DT_CPU_PAR_MIN;
    for (int i = 0; i < g->n && !failed; i++)
      failed = !conv_backward_image(g, x + i * in_sz, w, dy + i * out_sz,
                                    dx ? dx + i * in_sz : NULL, dw, i == 0 ? 0.0f : 1.0f, par);
  }
  return failed ? scratch_oom("conv2d_backward", col_floats) : DT_OK;
}
