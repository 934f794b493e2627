/* CPU convolution (im2col + OpenBLAS sgemm) and pooling, NCHW.
 *
 * With at least as many images as threads, each OpenMP thread convolves
 * whole images with a single-threaded sgemm (OpenBLAS runs single-threaded
 * inside a parallel region); with fewer images the images go one by one and
 * sgemm itself uses the threads. im2col buffers are per-thread scratch kept
 * between calls, so conv2d_workspace is 0 and the workspace argument is
 * unused on the CPU. The paths, in the order they are tried:
 *   - outputs of at most 64 pixels (ResNet's deep layers): a run of images
 *     in one GEMM per product, split among the threads along its longer
 *     side, im2col through an index table (batched_*);
 *   - stride 1 on small images where the CPU has AVX-512: the direct
 *     kernels of cpu_kernels_conv_direct.c (forward; the backward only for
 *     shallow products, LeNet's and a stem's);
 *   - otherwise im2col (on wide rows for stride 1) and sgemm per image.
 * Each was measured against the others on ResNet-18's layers at 64 px and
 * the small stem's at 28 px (docs/decisions.md, "CPU convolution paths").
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_conv_direct.h"
#include "core/cpu_conv_table.h"
#include "core/cpu_conv_winograd.h"
#include "core/cpu_internal.h"
#include "core/half.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---- geometry ---- */

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

/* ---- im2col / col2im ----
 *
 * The rows are short (ow is 10..28 in LeNet), so the copies are plain loops
 * marked `omp simd` rather than memcpy calls, whose per-call cost dominated
 * at these lengths. */

// x (c,h,w) -> col (c*kh*kw, oh*ow), rows ld floats apart
static void im2col(const dt_conv2d_geom *g, const float *x, float *col, int64_t ld, int par) {
  int rows = g->c * g->kh * g->kw, ohw = g->oh * g->ow;
  int padded = g->ph > 0 || g->pw > 0; /* else every window lies inside x */
#pragma omp parallel for if (par) num_threads(dt_cpu_threads()) schedule(static)
  for (int r = 0; r < rows; r++) {
    int ci = r / (g->kh * g->kw), ki = (r / g->kw) % g->kh, kj = r % g->kw;
    int lo, hi, ow = g->ow, sw = g->sw;
    valid_cols(g, kj, &lo, &hi);
    float *dst = col + (int64_t)r * ld;
    const float *plane = x + (int64_t)ci * g->h * g->w;
    if (padded) /* one call for the row, then only the valid runs are copied */
      memset(dst, 0, (size_t)ohw * sizeof(float));
    for (int oy = 0; oy < g->oh; oy++, dst += ow) {
      int iy = oy * g->sh - g->ph + ki;
      if (iy < 0 || iy >= g->h)
        continue;
      const float *src = plane + (int64_t)iy * g->w - g->pw + kj;
      if (sw == 1) {
#pragma omp simd
        for (int ox = lo; ox < hi; ox++)
          dst[ox] = src[ox];
      } else {
#pragma omp simd
        for (int ox = lo; ox < hi; ox++)
          dst[ox] = src[ox * sw];
      }
    }
  }
}

// col (c*kh*kw, oh*ow), rows ld floats apart -> x (c,h,w) overwritten with the sum of
// overlapping entries
static void col2im(const dt_conv2d_geom *g, const float *col, int64_t ld, float *x, int par) {
#pragma omp parallel for if (par) num_threads(dt_cpu_threads()) schedule(static)
  for (int ci = 0; ci < g->c; ci++) {
    float *plane = x + (int64_t)ci * g->h * g->w;
    int sw = g->sw;
    memset(plane, 0, (size_t)g->h * g->w * sizeof(float));
    for (int ki = 0; ki < g->kh; ki++)
      for (int kj = 0; kj < g->kw; kj++) {
        int lo, hi;
        valid_cols(g, kj, &lo, &hi);
        const float *src = col + (int64_t)((ci * g->kh + ki) * g->kw + kj) * ld;
        for (int oy = 0; oy < g->oh; oy++, src += g->ow) {
          int iy = oy * g->sh - g->ph + ki;
          if (iy < 0 || iy >= g->h)
            continue;
          float *dst = plane + (int64_t)iy * g->w - g->pw + kj;
          if (sw == 1) {
#pragma omp simd
            for (int ox = lo; ox < hi; ox++)
              dst[ox] += src[ox];
          } else {
            for (int ox = lo; ox < hi; ox++)
              dst[ox * sw] += src[ox];
          }
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
  return DT_ERROR(DT_ERR_OOM,
                  "%s: im2col buffer of %zu bytes: malloc failed: reduce the batch "
                  "size or image size",
                  op, floats * sizeof(float));
}

dt_status dt_cpu_conv2d_workspace(const dt_exec *ex, const dt_conv2d_geom *g, size_t *bytes) {
  (void)ex;
  (void)g;
  *bytes = 0;
  return DT_OK;
}

/* ---- stride-1 convolution on wide rows ----
 *
 * With stride 1, output (oy, ox) reads the padded input at (oy + ki,
 * ox + kj). Numbering the outputs oy * wp + ox (wp the padded row length)
 * makes the im2col row of tap (ci, ki, kj) one contiguous run of the padded
 * plane, L = (oh - 1) * wp + ow floats from ci*hp*wp + ki*wp + kj: one
 * memcpy per row instead of oh short copies, and col2im becomes L-long
 * vector adds. The wp - ow columns between output rows are computed and
 * dropped (forward) or fed zero gradients (backward), which adds exact
 * zeros to the sums. */

typedef struct wide_geom {
  int hp, wp, L, ckk;
  int64_t plane; /* hp * wp */
  int padded;
} wide_geom;

static int is_wide(const dt_conv2d_geom *g) { return g->sh == 1 && g->sw == 1 && !is_pointwise(g); }

static void wide_geom_of(const dt_conv2d_geom *g, wide_geom *wg) {
  wg->hp = g->h + 2 * g->ph;
  wg->wp = g->w + 2 * g->pw;
  wg->L = (g->oh - 1) * wg->wp + g->ow;
  wg->ckk = g->c * g->kh * g->kw;
  wg->plane = (int64_t)wg->hp * wg->wp;
  wg->padded = g->ph > 0 || g->pw > 0;
}

static size_t round16(size_t floats) { return (floats + 15) / 16 * 16; }

/* Scratch floats per image: padded input, columns (ckk, L), wide output
 * or gradient (oc, L), padded input gradient. */
static size_t wide_scratch_floats(const dt_conv2d_geom *g, const wide_geom *wg) {
  size_t xp = wg->padded ? round16((size_t)g->c * wg->plane) : 0;
  return 2 * xp + round16((size_t)wg->ckk * wg->L) + round16((size_t)g->oc * wg->L);
}

// x (c,h,w) -> xp (c,hp,wp) with zero borders
static void wide_pad(const dt_conv2d_geom *g, const wide_geom *wg, const float *x, float *xp) {
  memset(xp, 0, (size_t)g->c * wg->plane * sizeof(float));
  for (int ci = 0; ci < g->c; ci++)
    for (int iy = 0; iy < g->h; iy++)
      memcpy(xp + ci * wg->plane + (int64_t)(iy + g->ph) * wg->wp + g->pw,
             x + ((int64_t)ci * g->h + iy) * g->w, (size_t)g->w * sizeof(float));
}

// xp (c,hp,wp) -> col (ckk, L)
static void wide_im2col(const dt_conv2d_geom *g, const wide_geom *wg, const float *xp, float *col,
                        int par) {
#pragma omp parallel for if (par) num_threads(dt_cpu_threads()) schedule(static)
  for (int r = 0; r < wg->ckk; r++) {
    int ci = r / (g->kh * g->kw), ki = (r / g->kw) % g->kh, kj = r % g->kw;
    memcpy(col + (int64_t)r * wg->L, xp + ci * wg->plane + (int64_t)ki * wg->wp + kj,
           (size_t)wg->L * sizeof(float));
  }
}

// dcol (ckk, L) -> dxp (c,hp,wp) overwritten with the sum of overlapping entries
static void wide_col2im(const dt_conv2d_geom *g, const wide_geom *wg, const float *dcol, float *dxp,
                        int par) {
  int L = wg->L, taps = g->kh * g->kw;
#pragma omp parallel for if (par) num_threads(dt_cpu_threads()) schedule(static)
  for (int ci = 0; ci < g->c; ci++) {
    float *plane = dxp + ci * wg->plane;
    memset(plane, 0, (size_t)wg->plane * sizeof(float));
    for (int t = 0; t < taps; t++) {
      float *dst = plane + (int64_t)(t / g->kw) * wg->wp + t % g->kw;
      const float *src = dcol + ((int64_t)ci * taps + t) * L;
#pragma omp simd
      for (int p = 0; p < L; p++)
        dst[p] += src[p];
    }
  }
}

// one image: x (c,h,w), w (oc, ckk), bias (oc) or NULL -> y (oc, oh, ow); 0 when out of memory
static int wide_forward_image(const dt_conv2d_geom *g, const float *x, const float *w,
                              const float *bias, float *y, int par) {
  wide_geom wg;
  wide_geom_of(g, &wg);
  float *buf = thread_scratch(wide_scratch_floats(g, &wg));
  if (!buf)
    return 0;
  float *col = buf, *wide = col + round16((size_t)wg.ckk * wg.L);
  const float *xp = x;
  if (wg.padded) {
    float *pad = wide + round16((size_t)g->oc * wg.L);
    wide_pad(g, &wg, x, pad);
    xp = pad;
  }
  wide_im2col(g, &wg, xp, col, par);
  /* wide (oc, L) = w (oc, ckk) @ col (ckk, L) */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->oc, wg.L, wg.ckk, 1.0f, w, wg.ckk, col,
              wg.L, 0.0f, wide, wg.L);
  for (int o = 0; o < g->oc; o++) {
    float b = bias ? bias[o] : 0.0f;
    for (int oy = 0; oy < g->oh; oy++) {
      const float *src = wide + (int64_t)o * wg.L + (int64_t)oy * wg.wp;
      float *dst = y + ((int64_t)o * g->oh + oy) * g->ow;
      if (bias) {
#pragma omp simd
        for (int ox = 0; ox < g->ow; ox++)
          dst[ox] = src[ox] + b;
      } else {
#pragma omp simd
        for (int ox = 0; ox < g->ow; ox++)
          dst[ox] = src[ox];
      }
    }
  }
  return 1;
}

/* One image of the backward on wide rows: dwt_acc (ckk, oc) += col dy^T
 * (beta 0 for the first image of a run), dx (c,h,w) = col2im(w^T dy). */
static int wide_backward_image(const dt_conv2d_geom *g, const float *x, const float *w,
                               const float *dy, float *dx, float *dwt_acc, float dw_beta, int par) {
  wide_geom wg;
  wide_geom_of(g, &wg);
  float *buf = thread_scratch(wide_scratch_floats(g, &wg));
  if (!buf)
    return 0;
  size_t xp_floats = wg.padded ? round16((size_t)g->c * wg.plane) : 0;
  float *col = buf, *dwide = col + round16((size_t)wg.ckk * wg.L);
  float *pad = dwide + round16((size_t)g->oc * wg.L), *dpad = pad + xp_floats;
  /* dwide (oc, L): dy spread onto wide rows, zeros in the dropped columns */
  for (int o = 0; o < g->oc; o++)
    for (int oy = 0; oy < g->oh; oy++) {
      float *dst = dwide + (int64_t)o * wg.L + (int64_t)oy * wg.wp;
      const float *src = dy + ((int64_t)o * g->oh + oy) * g->ow;
      int ow = g->ow, gap = oy + 1 < g->oh ? wg.wp - ow : 0;
      if (gap > 0 && gap <= ow) {
        /* zeros in the gap from one branch-free loop: the loads past ow
         * stay inside dy's next row */
#pragma omp simd
        for (int ox = 0; ox < wg.wp; ox++) {
          float v = src[ox];
          dst[ox] = ox < ow ? v : 0.0f;
        }
      } else {
        for (int ox = 0; ox < ow; ox++)
          dst[ox] = src[ox];
        for (int k = 0; k < gap; k++)
          dst[ow + k] = 0.0f;
      }
    }
  if (dwt_acc) {
    const float *xp = x;
    if (wg.padded) {
      wide_pad(g, &wg, x, pad);
      xp = pad;
    }
    wide_im2col(g, &wg, xp, col, par);
    /* dwt_acc (ckk, oc) += col (ckk, L) @ dwide^T (L, oc) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, wg.ckk, g->oc, wg.L, 1.0f, col, wg.L,
                dwide, wg.L, dw_beta, dwt_acc, g->oc);
  }
  if (dx) {
    /* dcol (ckk, L) = w^T (ckk, oc) @ dwide (oc, L), into the column buffer */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, wg.ckk, wg.L, g->oc, 1.0f, w, wg.ckk,
                dwide, wg.L, 0.0f, col, wg.L);
    if (!wg.padded) {
      wide_col2im(g, &wg, col, dx, par);
    } else {
      wide_col2im(g, &wg, col, dpad, par);
      for (int ci = 0; ci < g->c; ci++)
        for (int iy = 0; iy < g->h; iy++)
          memcpy(dx + ((int64_t)ci * g->h + iy) * g->w,
                 dpad + ci * wg.plane + (int64_t)(iy + g->ph) * wg.wp + g->pw,
                 (size_t)g->w * sizeof(float));
    }
  }
  return 1;
}

/* ---- convolution ---- */

/* The direct kernels take whole images per thread: with fewer images than
 * threads the im2col path's threaded sgemm keeps every thread busy. */
static int direct_runs(const dt_conv2d_geom *g, int nt) {
  return (nt == 1 || g->n >= nt) && dt_cpu_conv_direct_usable(g);
}

/* The direct backward wins on shallow products (LeNet's, a stem's: depth
 * c*kh*kw up to 256); deeper ones (ResNet's 64- and 128-channel layers)
 * run faster as im2col and sgemm on wide rows: 3.2 against 3.9 ms for
 * 64 channels at 16x16, batch 16, 2 threads. */
#define DIRECT_BACKWARD_MAX_CKK 256

static int direct_backward_wins(const dt_conv2d_geom *g) {
  return (int64_t)g->c * g->kh * g->kw <= DIRECT_BACKWARD_MAX_CKK;
}

/* The backward on the direct kernels: each team (a thread with a run of
 * images) sums its images' weight gradients in its own (oc, ckk) buffer;
 * the buffers are added in team order. */
static dt_status direct_backward(const dt_conv2d_geom *g, const float *x, const float *w,
                                 const float *dy, float *dx, float *dw, int dw_acc, int nt) {
  int64_t in_sz = (int64_t)g->c * g->h * g->w, out_sz = (int64_t)g->oc * g->oh * g->ow;
  int64_t w_sz = (int64_t)g->oc * g->c * g->kh * g->kw;
  size_t floats = dt_cpu_conv_direct_scratch_floats(g);
  int teams = MIN(nt, g->n);
  float *wt = NULL, *acc = NULL;
  if (dx)
    wt = malloc((size_t)w_sz * sizeof(float));
  if (dw)
    acc = malloc((size_t)teams * w_sz * sizeof(float));
  if ((dx && !wt) || (dw && !acc)) {
    free(wt);
    free(acc);
    return DT_ERROR(DT_ERR_OOM, "conv2d_backward: %d weight buffers of %lld floats: malloc failed",
                    teams + 1, (long long)w_sz);
  }
  if (wt)
    dt_cpu_conv_direct_pack_wt(g, w, wt);
  int failed = 0;
#pragma omp parallel if (teams > 1) num_threads(teams) reduction(| : failed)
  {
    int t = omp_get_thread_num(), nteam = omp_get_num_threads();
    int i0 = (int)((int64_t)g->n * t / nteam), i1 = (int)((int64_t)g->n * (t + 1) / nteam);
    float *mine = acc ? acc + (int64_t)t * w_sz : NULL;
    float *buf = thread_scratch(floats);
    failed |= !buf;
    if (mine && (i0 == i1 || !buf))
      memset(mine, 0, (size_t)w_sz * sizeof(float));
    for (int i = i0; buf && i < i1; i++)
      dt_cpu_conv_direct_backward_image(g, x + i * in_sz, wt, dy + i * out_sz,
                                        dx ? dx + i * in_sz : NULL, mine, i != i0, buf);
    if (t == 0)
      teams = nteam; /* read after the region's closing barrier */
  }
  if (dw && !failed)
    for (int64_t j = 0; j < w_sz; j++) {
      float v = acc[j];
      for (int t = 1; t < teams; t++)
        v += acc[(int64_t)t * w_sz + j];
      dw[j] = dw_acc ? dw[j] + v : v;
    }
  free(acc);
  free(wt);
  return failed ? scratch_oom("conv2d_backward", floats) : DT_OK;
}

/* Scratch floats one image needs (for the out-of-memory message). */
static size_t conv_scratch_floats(const dt_conv2d_geom *g) {
  if (is_wide(g)) {
    wide_geom wg;
    wide_geom_of(g, &wg);
    return wide_scratch_floats(g, &wg);
  }
  return (size_t)g->c * g->kh * g->kw * g->oh * g->ow;
}

// one image: x (c,h,w), w (oc, c*kh*kw) -> y (oc, oh*ow)
static int conv_forward_image(const dt_conv2d_geom *g, const float *x, const float *w,
                              const float *bias, float *y, int par) {
  if (is_wide(g))
    return wide_forward_image(g, x, w, bias, y, par);
  int ckk = g->c * g->kh * g->kw, ohw = g->oh * g->ow;
  const float *col = x;
  if (!is_pointwise(g)) {
    float *buf = thread_scratch((size_t)ckk * ohw);
    if (!buf)
      return 0;
    im2col(g, x, buf, ohw, par);
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

/* ---- small outputs: a run of images in one GEMM ----
 *
 * With few output pixels per image (ResNet's deep layers: 7x7, 4x4) a GEMM
 * per image has only oh*ow columns against the whole weight matrix, which
 * OpenBLAS packs again on every call: the packing, not the arithmetic, took
 * the time (resnet18-small's 512-channel 4x4 layers ran at a tenth of the
 * 7x7 ones' rate). Here the images' columns sit side by side, col (ckk,
 * nb*ohw), and each product is one threaded sgemm over a run of nb images:
 * the weights are packed once per run and dw sums over the run inside the
 * GEMM. */

#define BATCH_MAX_OHW 64
/* col plus the (oc, nb*ohw) operand of a run: 4 MB. Runs of 16M floats
 * (the whole batch of 64 at 64 px) left the caches between im2col and the
 * GEMM's packing: 128 channels at 8x8, batch 64, forward 6.6 -> 5.7 ms */
#define BATCH_MAX_FLOATS ((size_t)1 << 20)

static int batched_runs(const dt_conv2d_geom *g) {
  return g->n > 1 && !is_pointwise(g) && (int64_t)g->oh * g->ow <= BATCH_MAX_OHW;
}

typedef struct batched_run {
  int64_t ohw, ckk, in_sz, out_sz;
  int nb;           /* images per run, at least 1 */
  float *col, *mat; /* (ckk, nb*ohw) and (oc, nb*ohw), the calling thread's scratch */
  int has_tab;      /* tab holds tap_table's entries (table_fits) */
  int32_t tab[DT_CONV_TABLE_MAX];
} batched_run;

static dt_status batched_setup(const dt_conv2d_geom *g, const char *op, batched_run *b) {
  b->ohw = (int64_t)g->oh * g->ow;
  b->ckk = (int64_t)g->c * g->kh * g->kw;
  b->in_sz = (int64_t)g->c * g->h * g->w;
  b->out_sz = g->oc * b->ohw;
  /* a run's operands stay within BATCH_MAX_FLOATS, but it keeps at least
   * oc columns: below that the weights, packed again per run, are the
   * larger operand */
  size_t per = (size_t)(b->ckk + g->oc) * b->ohw, nb = BATCH_MAX_FLOATS / per;
  size_t least = ((size_t)g->oc + b->ohw - 1) / b->ohw;
  nb = nb < least ? least : nb;
  nb = nb < 1 ? 1 : nb > (size_t)g->n ? (size_t)g->n : nb;
  b->nb = (int)nb;
  b->col = thread_scratch(nb * per);
  if (!b->col)
    return scratch_oom(op, nb * per);
  b->mat = b->col + b->ckk * b->nb * b->ohw;
  b->has_tab = dt_cpu_conv_table_fits(g);
  if (b->has_tab)
    dt_cpu_conv_tap_table(g, b->tab);
  return DT_OK;
}

// images i0 .. i0+m-1 of x -> col (ckk, m*ohw), image i in columns i*ohw..
static void batched_im2col(const dt_conv2d_geom *g, const batched_run *b, const float *x, int i0,
                           int m, int nt) {
#pragma omp parallel for if (nt > 1) num_threads(nt) schedule(static)
  for (int i = 0; i < m; i++) {
    if (b->has_tab)
      dt_cpu_conv_table_im2col(g, b->tab, x + (i0 + i) * b->in_sz, b->col + i * b->ohw, m * b->ohw);
    else
      im2col(g, x + (i0 + i) * b->in_sz, b->col + i * b->ohw, m * b->ohw, 0);
  }
}

static dt_status batched_forward(const dt_conv2d_geom *g, const float *x, const float *w,
                                 const float *bias, float *y, int nt) {
  batched_run b;
  dt_status st = batched_setup(g, "conv2d_forward", &b);
  if (st != DT_OK)
    return st;
  int64_t ohw = b.ohw;
  for (int i0 = 0; i0 < g->n; i0 += b.nb) {
    int m = MIN(b.nb, g->n - i0);
    int64_t ld = m * ohw;
    batched_im2col(g, &b, x, i0, m, nt);
    /* mat (oc, m*ohw) = w (oc, ckk) @ col (ckk, m*ohw); a few columns
     * (ResNet's 2x2 and 4x4 layers at small batches) without packing w */
    if (ld > DT_SKINNY_MAX_N || !dt_cpu_skinny_sgemm(0, g->oc, (int)ld, (int)b.ckk, w, (int)b.ckk,
                                                     b.col, (int)ld, b.mat, (int)ld, nt))
      dt_cpu_split_sgemm(CblasNoTrans, CblasNoTrans, g->oc, (int)ld, (int)b.ckk, w, (int)b.ckk,
                         b.col, (int)ld, 0.0f, b.mat, (int)ld, nt);
#pragma omp parallel for if (nt > 1) num_threads(nt) schedule(static)
    for (int i = 0; i < m; i++)
      for (int o = 0; o < g->oc; o++) {
        const float *src = b.mat + o * ld + i * ohw;
        float *dst = y + (i0 + i) * b.out_sz + o * ohw, bo = bias ? bias[o] : 0.0f;
#pragma omp simd
        for (int64_t p = 0; p < ohw; p++)
          dst[p] = src[p] + bo;
      }
  }
  return DT_OK;
}

/* dw (oc, ckk) = the images' dy col^T summed; dx = col2im(w^T dy); either may be NULL. */
static dt_status batched_backward(const dt_conv2d_geom *g, const float *x, const float *w,
                                  const float *dy, float *dx, float *dw, int dw_acc, int nt) {
  batched_run b;
  dt_status st = batched_setup(g, "conv2d_backward", &b);
  if (st != DT_OK)
    return st;
  int64_t ohw = b.ohw, ckk = b.ckk;
  for (int i0 = 0; i0 < g->n; i0 += b.nb) {
    int m = MIN(b.nb, g->n - i0);
    int64_t ld = m * ohw;
    /* mat (oc, m*ohw): the run's dy, image i in columns i*ohw.. */
#pragma omp parallel for if (nt > 1) num_threads(nt) schedule(static)
    for (int o = 0; o < g->oc; o++)
      for (int i = 0; i < m; i++)
        memcpy(b.mat + o * ld + i * ohw, dy + (i0 + i) * b.out_sz + o * ohw,
               (size_t)ohw * sizeof(float));
    if (dw) {
      batched_im2col(g, &b, x, i0, m, nt);
      /* dw (oc, ckk) (+)= dy (oc, m*ohw) @ col^T (m*ohw, ckk) */
      dt_cpu_split_sgemm(CblasNoTrans, CblasTrans, g->oc, (int)ckk, (int)ld, b.mat, (int)ld, b.col,
                         (int)ld, i0 == 0 && !dw_acc ? 0.0f : 1.0f, dw, (int)ckk, nt);
    }
    if (dx) {
      /* dcol (ckk, m*ohw) = w^T (ckk, oc) @ dy (oc, m*ohw), into the column buffer */
      if (ld > DT_SKINNY_MAX_N || !dt_cpu_skinny_sgemm(1, (int)ckk, (int)ld, g->oc, w, (int)ckk,
                                                       b.mat, (int)ld, b.col, (int)ld, nt))
        dt_cpu_split_sgemm(CblasTrans, CblasNoTrans, (int)ckk, (int)ld, g->oc, w, (int)ckk, b.mat,
                           (int)ld, 0.0f, b.col, (int)ld, nt);
#pragma omp parallel for if (nt > 1) num_threads(nt) schedule(static)
      for (int i = 0; i < m; i++) {
        if (b.has_tab)
          dt_cpu_conv_table_col2im(g, b.tab, b.col + i * ohw, ld, dx + (i0 + i) * b.in_sz);
        else
          col2im(g, b.col + i * ohw, ld, dx + (i0 + i) * b.in_sz, 0);
      }
    }
  }
  return DT_OK;
}

// x (n,c,h,w), w (oc,c,kh,kw), bias (oc) or NULL -> y (n,oc,oh,ow)
dt_status dt_cpu_conv2d_forward(const dt_exec *ex, const dt_conv2d_geom *g, const float *x,
                                const float *w, const float *bias, float *y, void *workspace) {
  if (g->nhwc)
    return dt_cpu_conv2d_nhwc_forward(ex, g, x, w, bias, y, workspace);
  if (dt_dtype_is_half(ex->dtype))
    return dt_cpu_conv2d_half_forward(ex, g, x, w, bias, y, workspace);
  (void)workspace;
  int64_t in_sz = (int64_t)g->c * g->h * g->w, out_sz = (int64_t)g->oc * g->oh * g->ow;
  size_t col_floats = (size_t)g->c * g->kh * g->kw * g->oh * g->ow;
  size_t scratch_floats = conv_scratch_floats(g);
  int nt = dt_cpu_threads();
  int failed = 0;
  /* small outputs (ResNet's 8x8 and smaller): one GEMM over a run of
   * images beats the direct kernels' short wide rows */
  if (dt_cpu_conv_winograd_eligible(g))
    return dt_cpu_conv_winograd_forward(g, x, w, bias, y, nt);
  if (batched_runs(g) && dt_cpu_conv_small_usable(g, 0))
    return dt_cpu_conv_small_forward(g, x, w, bias, y, nt);
  if (batched_runs(g))
    return batched_forward(g, x, w, bias, y, nt);
  if (direct_runs(g, nt)) {
    size_t floats = dt_cpu_conv_direct_scratch_floats(g);
#pragma omp parallel for if (nt > 1) num_threads(nt) schedule(static) reduction(| : failed)
    for (int i = 0; i < g->n; i++) {
      float *buf = thread_scratch(floats);
      if (buf)
        dt_cpu_conv_direct_forward_image(g, x + i * in_sz, w, bias, y + i * out_sz, buf);
      failed |= !buf;
    }
    return failed ? scratch_oom("conv2d_forward", floats) : DT_OK;
  }
  if (nt > 1 && g->n >= nt) {
#pragma omp parallel for num_threads(nt) schedule(static) reduction(| : failed)
    for (int i = 0; i < g->n; i++)
      failed |= !conv_forward_image(g, x + i * in_sz, w, bias, y + i * out_sz, 0);
  } else {
    int par = (int64_t)col_floats >= DT_CPU_PAR_MIN;
    for (int i = 0; i < g->n && !failed; i++)
      failed = !conv_forward_image(g, x + i * in_sz, w, bias, y + i * out_sz, par);
  }
  return failed ? scratch_oom("conv2d_forward", scratch_floats) : DT_OK;
}

/* One image of the backward: dwt_acc (ckk, oc) += col dy^T (beta 0 for
 * the first image of a run), dx (c,h,w) = col2im(w^T dy). */
static int conv_backward_image(const dt_conv2d_geom *g, const float *x, const float *w,
                               const float *dy, float *dx, float *dwt_acc, float dw_beta, int par) {
  if (is_wide(g))
    return wide_backward_image(g, x, w, dy, dx, dwt_acc, dw_beta, par);
  int ckk = g->c * g->kh * g->kw, ohw = g->oh * g->ow;
  int pointwise = is_pointwise(g);
  float *buf = NULL;
  if (!pointwise) {
    buf = thread_scratch((size_t)ckk * ohw);
    if (!buf)
      return 0;
  }
  if (dwt_acc) {
    const float *col = x;
    if (!pointwise) {
      im2col(g, x, buf, ohw, par);
      col = buf;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ckk, g->oc, ohw, 1.0f, col, ohw, dy, ohw,
                dw_beta, dwt_acc, g->oc);
  }
  if (dx) {
    float *dcol = pointwise ? dx : buf;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ckk, ohw, g->oc, 1.0f, w, ckk, dy, ohw,
                0.0f, dcol, ohw);
    if (!pointwise)
      col2im(g, dcol, ohw, dx, par);
  }
  return 1;
}

// x (n,c,h,w), w (oc,c,kh,kw), dy (n,oc,oh,ow) -> dx (n,c,h,w), dw (oc,c,kh,kw), db (oc);
// each may be NULL; all overwrite but dw with dw_acc (added to)
static dt_status conv2d_backward_f32(const dt_conv2d_geom *g, const float *x, const float *w,
                                     const float *dy, float *dx, float *dw, int dw_acc, float *db) {
  int64_t in_sz = (int64_t)g->c * g->h * g->w, out_sz = (int64_t)g->oc * g->oh * g->ow;
  int64_t ohw = (int64_t)g->oh * g->ow, ckk = (int64_t)g->c * g->kh * g->kw, w_sz = g->oc * ckk;
  size_t col_floats = (size_t)ckk * ohw;
  int nt = dt_cpu_threads();

  if (db) { /* db[o] = sum over images of each image's pixel sum, in double */
#pragma omp parallel for if ((int64_t)g->n * out_sz >= DT_CPU_PAR_MIN) num_threads(nt)
    for (int o = 0; o < g->oc; o++) {
      double s = 0.0;
      for (int i = 0; i < g->n; i++)
        s += dt_cpu_sum_contiguous(dy + i * out_sz + o * ohw, ohw);
      db[o] = (float)s;
    }
  }
  if (!dx && !dw)
    return DT_OK;
  if (dw && g->n == 0) {
    if (!dw_acc)
      memset(dw, 0, (size_t)w_sz * sizeof(float));
    dw = NULL;
  }
  /* small outputs: the batched GEMMs before the direct kernels, whose
   * backward ran slower there (resnet18-small's 256-channel 7x7 layers) */
  if (dt_cpu_conv_winograd_eligible(g))
    return dt_cpu_conv_winograd_backward(g, x, w, dy, dx, dw, dw_acc, nt);
  if (batched_runs(g) && dx && dt_cpu_conv_small_usable(g, 1)) { /* dw on the GEMMs */
    dt_status st = dw ? batched_backward(g, x, w, dy, NULL, dw, dw_acc, nt) : DT_OK;
    return st != DT_OK ? st : dt_cpu_conv_small_dx(g, w, dy, dx, nt);
  }
  if (batched_runs(g))
    return batched_backward(g, x, w, dy, dx, dw, dw_acc, nt);
  if (direct_runs(g, nt) && direct_backward_wins(g))
    return direct_backward(g, x, w, dy, dx, dw, dw_acc, nt);

  /* Each team (a thread with a contiguous run of images, or the one
   * sequential run) accumulates dw transposed, (ckk, oc), in its own
   * buffer: that orientation of the product runs faster in OpenBLAS for
   * these shapes. The buffers are summed in team order into dw. */
  int per_image = nt > 1 && g->n >= nt;
  int teams = per_image ? MIN(nt, g->n) : 1;
  float *dwt = NULL;
  if (dw) {
    dwt = malloc((size_t)teams * w_sz * sizeof(float));
    if (!dwt)
      return DT_ERROR(DT_ERR_OOM,
                      "conv2d_backward: %d weight-gradient buffers of %lld floats: "
                      "malloc failed",
                      teams, (long long)w_sz);
  }
  int failed = 0;
  if (per_image) {
#pragma omp parallel num_threads(teams) reduction(| : failed)
    {
      int t = omp_get_thread_num(), nteam = omp_get_num_threads();
      int i0 = (int)((int64_t)g->n * t / nteam), i1 = (int)((int64_t)g->n * (t + 1) / nteam);
      float *acc = dwt ? dwt + (int64_t)t * w_sz : NULL;
      if (acc && i0 == i1)
        memset(acc, 0, (size_t)w_sz * sizeof(float));
      for (int i = i0; i < i1 && !failed; i++)
        failed |= !conv_backward_image(g, x + i * in_sz, w, dy + i * out_sz,
                                       dx ? dx + i * in_sz : NULL, acc, i == i0 ? 0.0f : 1.0f, 0);
      if (t == 0)
        teams = nteam; /* read after the region's closing barrier */
    }
  } else {
    int par = (int64_t)col_floats >= DT_CPU_PAR_MIN;
    for (int i = 0; i < g->n && !failed; i++)
      failed = !conv_backward_image(g, x + i * in_sz, w, dy + i * out_sz,
                                    dx ? dx + i * in_sz : NULL, dwt, i == 0 ? 0.0f : 1.0f, par);
  }
  if (dw && !failed)
    for (int o = 0; o < g->oc; o++)
      for (int64_t r = 0; r < ckk; r++) {
        float v = dwt[r * g->oc + o];
        for (int t = 1; t < teams; t++)
          v += dwt[(int64_t)t * w_sz + r * g->oc + o];
        dw[o * ckk + r] = dw_acc ? dw[o * ckk + r] + v : v;
      }
  free(dwt);
  return failed ? scratch_oom("conv2d_backward", conv_scratch_floats(g)) : DT_OK;
}

dt_status dt_cpu_conv2d_backward(const dt_exec *ex, const dt_conv2d_geom *g, const float *x,
                                 const float *w, const float *dy, float *dx, float *dw, float *db,
                                 void *workspace) {
  if (g->nhwc)
    return dt_cpu_conv2d_nhwc_backward(ex, g, x, w, dy, dx, dw, db, workspace, 0);
  if (dt_dtype_is_half(ex->dtype))
    return dt_cpu_conv2d_half_backward(ex, g, x, w, dy, dx, dw, db, workspace);
  return conv2d_backward_f32(g, x, w, dy, dx, dw, 0, db);
}

dt_status dt_cpu_conv2d_backward_acc(const dt_exec *ex, const dt_conv2d_geom *g, const float *x,
                                     const float *w, const float *dy, float *dx, float *dw,
                                     float *db, void *workspace) {
  if (g->nhwc)
    return dt_cpu_conv2d_nhwc_backward(ex, g, x, w, dy, dx, dw, db, workspace, 1);
  return conv2d_backward_f32(g, x, w, dy, dx, dw, 1, db);
}
