/* Winograd F(2x2, 3x3) convolution (core/cpu_conv_winograd.h).
 *
 * Layout. Tiles are numbered p = image * T + ty * tw + tx within a chunk of
 * images (T = th * tw tiles an image). The transformed inputs are
 * V[e][c][p], the filters U[e][o][c], the products M[e][o][p]: each of the
 * 16 planes e is a row-major matrix, so the 16 products of a chunk are
 * plain sgemm calls. A chunk is a run of whole images whose V and M stay
 * within WG_CHUNK_FLOATS, so that the transforms' writes are still in the
 * caches when the GEMMs read them; the chunks go to the threads in turn,
 * each thread running single-threaded sgemms on its own buffers.
 *
 * The transforms are vectorised along the tiles: the input's over a row
 * of tiles, reading the zero-padded plane split by row and column parity
 * (unit-stride runs, below), the others over all of an image's tiles.
 *
 * The weight gradient is summed per thread over its chunks, then over the
 * threads in order: the result depends on the thread count by rounding,
 * as the im2col path's does. */
#include <cblas.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "core/cpu.h"
#include "core/cpu_conv_winograd.h"
#include "core/cpu_internal.h"
#include "core/env.h"

#define WG_E 16
#define WG_CHUNK_FLOATS (1 << 19) /* V and M of one chunk: 2 MB */
#define WG_MIN_TILES 128          /* per thread */
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* -1: not read yet; then DT_CONV_WINOGRAD's setting (default 1) or the
 * last dt_cpu_set_conv_winograd. */
static atomic_int wg_enabled = -1;

static int wg_on(void) {
  int v = atomic_load(&wg_enabled);
  if (v < 0) {
    bool on = true;
    if (dt_env_is_set(DT_ENV_CONV_WINOGRAD))
      (void)dt_env_bool(DT_ENV_CONV_WINOGRAD, &on);
    int expect = -1;
    atomic_compare_exchange_strong(&wg_enabled, &expect, on ? 1 : 0);
    v = atomic_load(&wg_enabled);
  }
  return v;
}

int dt_cpu_set_conv_winograd(int enabled) {
  int prev = wg_on(); /* DT_CONV_WINOGRAD's, if nothing set it yet */
  atomic_store(&wg_enabled, enabled != 0);
  return prev;
}

int dt_cpu_conv_winograd_eligible(const dt_conv2d_geom *g) {
  if (g->kh != 3 || g->kw != 3 || g->sh != 1 || g->sw != 1 || g->n < 1)
    return 0;
  if (g->c < 16 || g->oc < 16 || g->oh < 4 || g->ow < 4 || (g->oh & 1) || (g->ow & 1))
    return 0;
  /* enough tiles a thread that the GEMMs amortise packing U */
  int64_t tiles = (int64_t)g->n * (g->oh / 2) * (g->ow / 2);
  if (tiles < (int64_t)WG_MIN_TILES * dt_cpu_threads())
    return 0;
  return wg_on();
}

/* ---- geometry of a call ---- */

typedef struct wg_plan {
  int th, tw, T;  /* tiles of an image: rows, columns, total */
  int hp, wp;     /* the zero-padded input plane: 2 th + 2 by 2 tw + 2 */
  int ipc, pc;    /* images and tiles of a chunk */
  int chunks, nt; /* chunks of the batch; threads that run them */
  size_t thread_floats;
  int rows16; /* AVX-512 and rows of at most 32 floats: the rows' parity splits by permutes */
} wg_plan;

static int wg_avx512(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
#else
  return 0;
#endif
}

static void plan_of(const dt_conv2d_geom *g, int nt, int backward, wg_plan *pl) {
  pl->th = (g->oh + 1) / 2;
  pl->tw = (g->ow + 1) / 2;
  pl->T = pl->th * pl->tw;
  pl->hp = 2 * pl->th + 2;
  pl->wp = 2 * pl->tw + 2;
  int per_tile = WG_E * (g->c + g->oc);
  int ipc = MAX(1, WG_CHUNK_FLOATS / per_tile / pl->T);
  int per_thread = (g->n + nt - 1) / nt; /* every thread a chunk where it can */
  pl->ipc = MIN(ipc, per_thread);
  pl->pc = pl->ipc * pl->T;
  pl->chunks = (g->n + pl->ipc - 1) / pl->ipc;
  pl->nt = MIN(nt, pl->chunks);
  size_t f = (size_t)WG_E * (g->c + g->oc) * pl->pc; /* V (or dV) and M (or dM) */
  /* a padded plane (the backward's sub-planes), or the shifted ones */
  f += MAX((size_t)pl->hp * pl->wp, (size_t)8 * (pl->th + 1) * pl->tw);
  f += (size_t)(WG_E + 4) * pl->T; /* an image's tiles, by element */
  if (backward)
    f += (size_t)WG_E * g->oc * g->c; /* the thread's dU */
  pl->thread_floats = (f + 15) / 16 * 16;
  pl->rows16 = wg_avx512() && g->w + g->pw <= 32 && g->ow <= 32 && pl->tw <= 16;
}

/* ---- transforms ----
 *
 * A plane is held as four sub-planes by the parity of its (zero-padded)
 * rows and columns, each (th + 1) x (tw + 1): sub-plane ab holds padded
 * row 2 r + a, column 2 m + b at r * S + m (S = tw + 1). The 4x4 patch of
 * tile (ty, tx) is then rows (ty, a = 0), (ty, 1), (ty + 1, 0), (ty + 1, 1)
 * and columns (tx, b = 0), (tx, 1), (tx + 1, 0), (tx + 1, 1): unit-stride
 * runs along a row of tiles, which the loops below read as vectors. */

#define WG_CLONES __attribute__((target_clones("avx512f", "default")))

/* Row k / 4 of a transform, t (4 values) times B: planes k .. k + 3 of
 * tile tx. Written out (no arrays, no loops) so that the tile loops
 * vectorise. */
#define WG_BT_ROW(o, k, t0, t1, t2, t3)                   \
  do {                                                    \
    float t0_ = (t0), t1_ = (t1), t2_ = (t2), t3_ = (t3); \
    (o)[((k) + 0) * ld_e + tx] = t0_ - t2_;               \
    (o)[((k) + 1) * ld_e + tx] = t1_ + t2_;               \
    (o)[((k) + 2) * ld_e + tx] = t2_ - t1_;               \
    (o)[((k) + 3) * ld_e + tx] = t1_ - t3_;               \
  } while (0)
/* Row k / 4 of A dY A^T from q (2 values) times A^T */
#define WG_A_ROW(o, k, q0, q1)              \
  do {                                      \
    float q0_ = (q0), q1_ = (q1);           \
    (o)[((k) + 0) * ld_e + tx] = q0_;       \
    (o)[((k) + 1) * ld_e + tx] = q0_ + q1_; \
    (o)[((k) + 2) * ld_e + tx] = q0_ - q1_; \
    (o)[((k) + 3) * ld_e + tx] = -q1_;      \
  } while (0)

typedef struct wg_sub {
  float *p[2][2]; /* [row parity][column parity] */
  int S;
} wg_sub;

static wg_sub sub_planes(const wg_plan *pl, float *base) {
  wg_sub q;
  int64_t n = (int64_t)(pl->th + 1) * (pl->tw + 1);
  for (int a = 0; a < 2; a++)
    for (int b = 0; b < 2; b++)
      q.p[a][b] = base + (2 * a + b) * n;
  q.S = pl->tw + 1;
  return q;
}

/* The input plane for the forward transform, as eight shifted sub-planes
 * of (th + 1) x tw at base + ((2 a + b) * 2 + s) * n (n = (th + 1) tw):
 * [a][b][s][r tw + m] holds padded row 2 r + a, column 2 (m + s) + b.
 * The 4x4 patch of tile p = ty tw + tx is then element p of the four
 * column planes of rows (a = 0, 1) at p and at p + tw: one unit-stride
 * run over all the image's tiles. */
static void split_shifted(const dt_conv2d_geom *g, const wg_plan *pl, const float *x, float *base) {
  int tw = pl->tw;
  int64_t n = (int64_t)(pl->th + 1) * tw;
  memset(base, 0, (size_t)(8 * n) * sizeof(float));
  for (int iy = 0; iy < g->h; iy++) {
    int r = (iy + g->ph) >> 1, a = (iy + g->ph) & 1;
    const float *xr = x + (int64_t)iy * g->w;
    for (int k = 0; k < 4 && r <= pl->th; k++) { /* k = 2 b + s */
      int off = 2 * (k & 1) + (k >> 1) - g->pw;  /* input column of m = 0 */
      float *d = base + (int64_t)(4 * a + 2 * (k >> 1) + (k & 1)) * n + (int64_t)r * tw;
      for (int m = off < 0 ? (1 - off) / 2 : 0; m < tw && 2 * m + off < g->w; m++)
        d[m] = xr[2 * m + off];
    }
  }
}

/* The permutes of split_shifted_short, worked out once a call: for each
 * of the four shifted rows k = 2 b + s, the input column of lane m and
 * the lanes that read one (the others are padding). */
typedef struct wg_short {
  int lanes[4][16];
  unsigned valid[4];
} wg_short;

static void short_lanes(const dt_conv2d_geom *g, const wg_plan *pl, wg_short *sh) {
  for (int k = 0; k < 4; k++) { /* k = 2 b + s, as in split_shifted */
    int off = 2 * (k & 1) + (k >> 1) - g->pw;
    sh->valid[k] = 0;
    for (int m = 0; m < 16; m++) {
      int col = 2 * m + off, in = m < pl->tw && col >= 0 && col < g->w;
      sh->lanes[k][m] = in ? col : 0;
      sh->valid[k] |= (unsigned)in << m;
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* split_shifted for rows of at most 32 floats and at most 16 tiles a row
 * (ResNet's 16x16 and 8x8 planes): the row in two registers, each of the
 * four shifted rows one permute of them, the lanes outside the input
 * (the padding) zeroed by the permute's mask. The same values as the
 * loop's. */
__attribute__((target("avx512f"))) static void split_shifted_short(const dt_conv2d_geom *g,
                                                                   const wg_plan *pl,
                                                                   const wg_short *sh,
                                                                   const float *x, float *base) {
  int tw = pl->tw;
  int64_t n = (int64_t)(pl->th + 1) * tw;
  memset(base, 0, (size_t)(8 * n) * sizeof(float));
  __m512i idx[4];
  for (int k = 0; k < 4; k++)
    idx[k] = _mm512_loadu_si512(sh->lanes[k]);
  __mmask16 out = (__mmask16)((1u << tw) - 1);
  __mmask16 lo_in = (__mmask16)(g->w >= 16 ? 0xffff : (1u << g->w) - 1);
  __mmask16 hi_in = (__mmask16)(g->w <= 16 ? 0 : g->w >= 32 ? 0xffff : (1u << (g->w - 16)) - 1);
  for (int iy = 0; iy < g->h; iy++) {
    int r = (iy + g->ph) >> 1, a = (iy + g->ph) & 1;
    if (r > pl->th)
      break;
    const float *xr = x + (int64_t)iy * g->w;
    __m512 lo = _mm512_maskz_loadu_ps(lo_in, xr), hi = _mm512_maskz_loadu_ps(hi_in, xr + 16);
    float *d = base + (int64_t)4 * a * n + (int64_t)r * tw;
    _mm512_mask_storeu_ps(d, out, _mm512_maskz_permutex2var_ps(sh->valid[0], lo, idx[0], hi));
    _mm512_mask_storeu_ps(d + n, out, _mm512_maskz_permutex2var_ps(sh->valid[1], lo, idx[1], hi));
    _mm512_mask_storeu_ps(d + 2 * n, out,
                          _mm512_maskz_permutex2var_ps(sh->valid[2], lo, idx[2], hi));
    _mm512_mask_storeu_ps(d + 3 * n, out,
                          _mm512_maskz_permutex2var_ps(sh->valid[3], lo, idx[3], hi));
  }
}

/* dst[j] = (j + s odd ? b : a)[(j + s) / 2] for j < n: two rows
 * interleaved by parity, from an offset s; n + s <= 32, and a and b hold
 * at least (n + s + 1) / 2 floats. */
__attribute__((target("avx512f"))) static void interleave_row(const float *a, const float *b, int s,
                                                              int n, float *dst) {
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i t0 = _mm512_add_epi32(iota, _mm512_set1_epi32(s));
  __m512i t1 = _mm512_add_epi32(t0, _mm512_set1_epi32(16)), one = _mm512_set1_epi32(1);
  __m512i i0 =
      _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(t0, one), 4), _mm512_srli_epi32(t0, 1));
  __m512i i1 =
      _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(t1, one), 4), _mm512_srli_epi32(t1, 1));
  int cnt = (n + s + 1) / 2;
  __mmask16 in = (__mmask16)(cnt >= 16 ? 0xffff : (1u << cnt) - 1);
  __m512 va = _mm512_maskz_loadu_ps(in, a), vb = _mm512_maskz_loadu_ps(in, b);
  _mm512_mask_storeu_ps(dst, (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1),
                        _mm512_permutex2var_ps(va, i0, vb));
  if (n > 16)
    _mm512_mask_storeu_ps(dst + 16, (__mmask16)((1u << (n - 16)) - 1),
                          _mm512_permutex2var_ps(va, i1, vb));
}

/* e[m] = r[2 m], o[m] = r[2 m + 1] for the n <= 32 floats of r. */
__attribute__((target("avx512f"))) static void deinterleave_row(const float *r, int n, float *e,
                                                                float *o) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  __m512 lo = _mm512_maskz_loadu_ps((__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1), r);
  __m512 hi = _mm512_maskz_loadu_ps((__mmask16)(n <= 16 ? 0 : (1u << (n - 16)) - 1), r + 16);
  int ne = (n + 1) / 2, no = n / 2;
  _mm512_mask_storeu_ps(e, (__mmask16)((1u << ne) - 1), _mm512_permutex2var_ps(lo, even, hi));
  _mm512_mask_storeu_ps(
      o, (__mmask16)((1u << no) - 1),
      _mm512_permutex2var_ps(lo, _mm512_add_epi32(even, _mm512_set1_epi32(1)), hi));
}
#else
static void interleave_row(const float *a, const float *b, int s, int n, float *dst) {
  (void)a, (void)b, (void)s, (void)n, (void)dst;
}
static void deinterleave_row(const float *r, int n, float *e, float *o) {
  (void)r, (void)n, (void)e, (void)o;
}
static void split_shifted_short(const dt_conv2d_geom *g, const wg_plan *pl, const wg_short *sh,
                                const float *x, float *base) {
  (void)sh;
  split_shifted(g, pl, x, base);
}
#endif

/* V[e][p0 + tile] = (B^T d B)[e] for the tiles of one channel (planes e
 * ld_e apart) from its shifted sub-planes, B^T = [1 0 -1 0; 0 1 1 0;
 * 0 -1 1 0; 0 1 0 -1] */
WG_CLONES static void input_tiles(const wg_plan *pl, const float *base, float *v, int64_t ld_e) {
  int T = pl->T, tw = pl->tw;
  int64_t n = (int64_t)(pl->th + 1) * tw;
  /* rows of parity 0 and 1, columns 0 .. 3 of the patch */
  const float *r0c0 = base, *r0c2 = base + n, *r0c1 = base + 2 * n, *r0c3 = base + 3 * n;
  const float *r1c0 = base + 4 * n, *r1c2 = base + 5 * n, *r1c1 = base + 6 * n,
              *r1c3 = base + 7 * n;
  float *o = v;
#pragma omp simd
  for (int tx = 0; tx < T; tx++) { /* every tile of the image (the macros' tx) */
    int u = tx + tw;               /* the patch's rows 2 and 3 */
    float a0 = r0c0[tx], a1 = r0c1[tx], a2 = r0c2[tx], a3 = r0c3[tx];
    float b0 = r1c0[tx], b1 = r1c1[tx], b2 = r1c2[tx], b3 = r1c3[tx];
    float c0 = r0c0[u], c1 = r0c1[u], c2 = r0c2[u], c3 = r0c3[u];
    float d0 = r1c0[u], d1 = r1c1[u], d2 = r1c2[u], d3 = r1c3[u];
    WG_BT_ROW(o, 0, a0 - c0, a1 - c1, a2 - c2, a3 - c3);
    WG_BT_ROW(o, 4, b0 + c0, b1 + c1, b2 + c2, b3 + c3);
    WG_BT_ROW(o, 8, c0 - b0, c1 - b1, c2 - b2, c3 - b3);
    WG_BT_ROW(o, 12, b0 - d0, b1 - d1, b2 - d2, b3 - d3);
  }
}

/* V of images [i0, i0 + ni): V[e] is (c, pc) */
static void input_transform(const dt_conv2d_geom *g, const wg_plan *pl, const float *x, int i0,
                            int ni, float *V, float *plane) {
  int64_t in_sz = (int64_t)g->c * g->h * g->w, ld_e = (int64_t)g->c * pl->pc;
  int fast = pl->rows16;
  wg_short sh;
  if (fast)
    short_lanes(g, pl, &sh);
  for (int i = 0; i < ni; i++)
    for (int c = 0; c < g->c; c++) {
      const float *xc = x + (i0 + i) * in_sz + (int64_t)c * g->h * g->w;
      if (fast)
        split_shifted_short(g, pl, &sh, xc, plane);
      else
        split_shifted(g, pl, xc, plane);
      input_tiles(pl, plane, V + (int64_t)c * pl->pc + (int64_t)i * pl->T, ld_e);
    }
}

/* Row o of U: G g G^T of the c filters f (9 floats each), planes ld_e
 * apart, G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1] */
WG_CLONES static void filter_row(const float *f, int c, float *u, int64_t ld_e) {
#pragma omp simd
  for (int k = 0; k < c; k++) {
    const float *q = f + (int64_t)k * 9;
    /* G down the columns: rows t0 .. t3 of 3 */
    float t00 = q[0], t01 = q[1], t02 = q[2];
    float t10 = 0.5f * (q[0] + q[3] + q[6]), t11 = 0.5f * (q[1] + q[4] + q[7]),
          t12 = 0.5f * (q[2] + q[5] + q[8]);
    float t20 = 0.5f * (q[0] - q[3] + q[6]), t21 = 0.5f * (q[1] - q[4] + q[7]),
          t22 = 0.5f * (q[2] - q[5] + q[8]);
    float t30 = q[6], t31 = q[7], t32 = q[8];
#define WG_G_ROW(i, a, b, cc)                              \
  u[(4 * (i) + 0) * ld_e + k] = (a);                       \
  u[(4 * (i) + 1) * ld_e + k] = 0.5f * ((a) + (b) + (cc)); \
  u[(4 * (i) + 2) * ld_e + k] = 0.5f * ((a) - (b) + (cc)); \
  u[(4 * (i) + 3) * ld_e + k] = (cc)
    WG_G_ROW(0, t00, t01, t02);
    WG_G_ROW(1, t10, t11, t12);
    WG_G_ROW(2, t20, t21, t22);
    WG_G_ROW(3, t30, t31, t32);
#undef WG_G_ROW
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
/* filter_row 16 filters at a time: element j of each by one gather
 * (the loop above compiles to scalar code), the same operations in the
 * same order, so the same values. */
__attribute__((target("avx512f"))) static void filter_row_avx512(const float *f, int c, float *u,
                                                                 int64_t ld_e) {
  const __m512i nine =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(9));
  const __m512 half = _mm512_set1_ps(0.5f);
  for (int k = 0; k < c; k += 16) {
    __mmask16 in = (__mmask16)(c - k >= 16 ? 0xffff : (1u << (c - k)) - 1);
    const float *q = f + (int64_t)k * 9;
    __m512 v[9];
    for (int j = 0; j < 9; j++)
      v[j] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), in, nine, q + j, 4);
    /* G down the columns: rows t0 .. t3 of 3 */
    __m512 t[4][3];
    for (int j = 0; j < 3; j++) {
      t[0][j] = v[j];
      t[1][j] = _mm512_mul_ps(half, _mm512_add_ps(_mm512_add_ps(v[j], v[3 + j]), v[6 + j]));
      t[2][j] = _mm512_mul_ps(half, _mm512_add_ps(_mm512_sub_ps(v[j], v[3 + j]), v[6 + j]));
      t[3][j] = v[6 + j];
    }
    for (int i = 0; i < 4; i++) {
      __m512 a = t[i][0], b = t[i][1], cc = t[i][2];
      float *r = u + (int64_t)4 * i * ld_e + k;
      _mm512_mask_storeu_ps(r, in, a);
      _mm512_mask_storeu_ps(r + ld_e, in,
                            _mm512_mul_ps(half, _mm512_add_ps(_mm512_add_ps(a, b), cc)));
      _mm512_mask_storeu_ps(r + 2 * ld_e, in,
                            _mm512_mul_ps(half, _mm512_add_ps(_mm512_sub_ps(a, b), cc)));
      _mm512_mask_storeu_ps(r + 3 * ld_e, in, cc);
    }
  }
}
#endif

static void filter_transform(const dt_conv2d_geom *g, const float *w, float *U, int nt) {
  int64_t ld_e = (int64_t)g->oc * g->c;
  int simd = wg_avx512();
#pragma omp parallel for if (nt > 1 && ld_e >= 4096) num_threads(nt) schedule(static)
  for (int o = 0; o < g->oc; o++) {
    const float *f = w + (int64_t)o * g->c * 9;
    float *u = U + (int64_t)o * g->c;
#if defined(__x86_64__) && defined(__GNUC__)
    if (simd) {
      filter_row_avx512(f, g->c, u, ld_e);
      continue;
    }
#endif
    filter_row(f, g->c, u, ld_e);
  }
}

/* y (oh, ow) of output channel o of one image from M[e][o][tiles] (planes
 * ld_e apart): A^T M A, A^T = [1 1 1 0; 0 1 -1 -1], plus bias. `rows`
 * holds 4 tw floats: the tile row's outputs by row and column parity. */
WG_CLONES static void output_tiles(const dt_conv2d_geom *g, const wg_plan *pl, const float *m,
                                   int64_t ld_e, float bias, float *y, float *rows) {
  int T = pl->T, tw = pl->tw, ow = g->ow;
  float *y00 = rows, *y01 = rows + T, *y10 = rows + 2 * T, *y11 = rows + 3 * T;
  const float *m0 = m, *m1 = m0 + 4 * ld_e, *m2 = m1 + 4 * ld_e, *m3 = m2 + 4 * ld_e;
  /* all the image's tiles in one loop (a row of 4-10 tiles fills a
   * fraction of a vector), the outputs by row and column parity */
#pragma omp simd
  for (int p = 0; p < T; p++) {
    /* A^T down the columns: s0 = m0 + m1 + m2, s1 = m1 - m2 - m3 */
    float s00 = m0[p] + m1[p] + m2[p], s10 = m1[p] - m2[p] - m3[p];
    float s01 = m0[ld_e + p] + m1[ld_e + p] + m2[ld_e + p];
    float s11 = m1[ld_e + p] - m2[ld_e + p] - m3[ld_e + p];
    float s02 = m0[2 * ld_e + p] + m1[2 * ld_e + p] + m2[2 * ld_e + p];
    float s12 = m1[2 * ld_e + p] - m2[2 * ld_e + p] - m3[2 * ld_e + p];
    float s03 = m0[3 * ld_e + p] + m1[3 * ld_e + p] + m2[3 * ld_e + p];
    float s13 = m1[3 * ld_e + p] - m2[3 * ld_e + p] - m3[3 * ld_e + p];
    y00[p] = s00 + s01 + s02 + bias;
    y01[p] = s01 - s02 - s03 + bias;
    y10[p] = s10 + s11 + s12 + bias;
    y11[p] = s11 - s12 - s13 + bias;
  }
  for (int ty = 0; ty < pl->th; ty++) {
    int oy = 2 * ty, o = ty * tw;
    float *r0 = y + (int64_t)oy * ow;
    if (pl->rows16) {
      interleave_row(y00 + o, y01 + o, 0, ow, r0);
      if (oy + 1 < g->oh)
        interleave_row(y10 + o, y11 + o, 0, ow, r0 + ow);
      continue;
    }
    for (int ox = 0; ox < ow; ox++)
      r0[ox] = (ox & 1 ? y01 : y00)[o + (ox >> 1)];
    if (oy + 1 < g->oh) {
      float *r1 = r0 + ow;
      for (int ox = 0; ox < ow; ox++)
        r1[ox] = (ox & 1 ? y11 : y10)[o + (ox >> 1)];
    }
  }
}

/* dM[e][o][tiles] = (A dY A^T)[e] for output channel o of one image, dy
 * (oh, ow); dy outside the outputs (odd oh or ow) is zero. `rows` holds
 * 4 tw floats. */
WG_CLONES static void grad_tiles(const dt_conv2d_geom *g, const wg_plan *pl, const float *dy,
                                 float *dm, int64_t ld_e, float *rows) {
  int T = pl->T, tw = pl->tw, ow = g->ow;
  float *a0 = rows, *a1 = rows + T, *b0 = rows + 2 * T, *b1 = rows + 3 * T;
  /* each tile's 2x2 of dy by row and column parity (0 outside the outputs) */
  memset(rows, 0, (size_t)4 * T * sizeof(float));
  for (int oy = 0; oy < g->oh; oy++) {
    const float *r = dy + (int64_t)oy * ow;
    float *e = (oy & 1 ? b0 : a0) + (oy >> 1) * tw, *o = (oy & 1 ? b1 : a1) + (oy >> 1) * tw;
    if (pl->rows16) {
      deinterleave_row(r, ow, e, o);
      continue;
    }
    for (int ox = 0; ox < ow; ox++)
      (ox & 1 ? o : e)[ox >> 1] = r[ox];
  }
#pragma omp simd
  for (int tx = 0; tx < T; tx++) { /* every tile of the image (the macros' tx) */
    /* A down the columns: dy0, dy0 + dy1, dy0 - dy1, -dy1; then across */
    float p0 = a0[tx], p1 = a1[tx], s0 = a0[tx] + b0[tx], s1 = a1[tx] + b1[tx];
    float d0 = a0[tx] - b0[tx], d1 = a1[tx] - b1[tx], n0 = -b0[tx], n1 = -b1[tx];
    WG_A_ROW(dm, 0, p0, p1);
    WG_A_ROW(dm, 4, s0, s1);
    WG_A_ROW(dm, 8, d0, d1);
    WG_A_ROW(dm, 12, n0, n1);
  }
}

/* dx (h, w) of one input channel of one image from dV[e][c][tiles]: the
 * overlap-add of B dV B^T over the patches (B = the transpose of B^T)
 * into the sub-planes, then the padding dropped. `tmp` holds 16 tw
 * floats. */
WG_CLONES static void dinput_tiles(const dt_conv2d_geom *g, const wg_plan *pl, const float *dv,
                                   int64_t ld_e, wg_sub *q, float *tmp, float *dx) {
  int T = pl->T, tw = pl->tw, S = q->S;
  memset(q->p[0][0], 0, (size_t)pl->hp * pl->wp * sizeof(float));
  const float *v0 = dv, *v1 = v0 + 4 * ld_e, *v2 = v1 + 4 * ld_e, *v3 = v2 + 4 * ld_e;
  /* every tile's B dV B^T into tmp (16 planes of T), then the rows */
#pragma omp simd
  for (int tx = 0; tx < T; tx++) { /* every tile of the image (the macros' tx) */
    /* B down the columns: row 0 = v0, 1 = v1 - v2 + v3, 2 = v1 + v2 - v0,
     * 3 = -v3 (vk the plane row k, column j at j * ld_e); then across */
#define WG_B_COL(j, t0, t1, t2, t3)                                     \
  float t0 = v0[(j)*ld_e + tx], t3 = -v3[(j)*ld_e + tx];                \
  float t1 = v1[(j)*ld_e + tx] - v2[(j)*ld_e + tx] + v3[(j)*ld_e + tx]; \
  float t2 = v1[(j)*ld_e + tx] + v2[(j)*ld_e + tx] - v0[(j)*ld_e + tx]
    WG_B_COL(0, r00, r10, r20, r30);
    WG_B_COL(1, r01, r11, r21, r31);
    WG_B_COL(2, r02, r12, r22, r32);
    WG_B_COL(3, r03, r13, r23, r33);
#undef WG_B_COL
#define WG_B_ROW(i, c0, c1, c2, c3)           \
  tmp[(4 * (i) + 0) * T + tx] = c0;           \
  tmp[(4 * (i) + 1) * T + tx] = c1 - c2 + c3; \
  tmp[(4 * (i) + 2) * T + tx] = c1 + c2 - c0; \
  tmp[(4 * (i) + 3) * T + tx] = -c3
    WG_B_ROW(0, r00, r01, r02, r03);
    WG_B_ROW(1, r10, r11, r12, r13);
    WG_B_ROW(2, r20, r21, r22, r23);
    WG_B_ROW(3, r30, r31, r32, r33);
#undef WG_B_ROW
  }
  for (int ty = 0; ty < pl->th; ty++) {
    /* patch row i lands on sub-plane row ty + i / 2 of parity i & 1; its
     * columns 0, 1 at tx, 2, 3 at tx + 1: each loop adds without overlap */
    for (int i = 0; i < 4; i++) {
      int64_t off = (int64_t)(ty + (i >> 1)) * S;
      float *e = q->p[i & 1][0] + off, *o = q->p[i & 1][1] + off;
      const float *c = tmp + (int64_t)4 * i * T + (int64_t)ty * tw;
#pragma omp simd
      for (int tx = 0; tx < tw; tx++) {
        e[tx] += c[tx];
        o[tx] += c[T + tx];
      }
#pragma omp simd
      for (int tx = 0; tx < tw; tx++) {
        e[tx + 1] += c[2 * T + tx];
        o[tx + 1] += c[3 * T + tx];
      }
    }
  }
  for (int iy = 0; iy < g->h; iy++) {
    int r = iy + g->ph;
    const float *e = q->p[r & 1][0] + (int64_t)(r >> 1) * S;
    const float *o = q->p[r & 1][1] + (int64_t)(r >> 1) * S;
    float *dr = dx + (int64_t)iy * g->w;
    if (pl->rows16) {
      interleave_row(e, o, g->pw, g->w, dr);
      continue;
    }
    for (int ix = 0; ix < g->w; ix++) {
      int s = ix + g->pw;
      dr[ix] = (s & 1 ? o : e)[s >> 1];
    }
  }
}

/* dw (oc, c, 3, 3) (+)= (G^T dU G) */
static void filter_grad(const dt_conv2d_geom *g, const float *dU, float *dw, int acc, int nt) {
  int64_t ld_e = (int64_t)g->oc * g->c;
#pragma omp parallel for if (nt > 1 && ld_e >= 4096) num_threads(nt) schedule(static)
  for (int o = 0; o < g->oc; o++)
    for (int c = 0; c < g->c; c++) {
      const float *u = dU + (int64_t)o * g->c + c;
      float t[3][4]; /* G^T = [1 .5 .5 0; 0 .5 -.5 0; 0 .5 .5 1] down the columns */
      for (int q = 0; q < 4; q++) {
        float a = u[(0 + q) * ld_e], b = u[(4 + q) * ld_e];
        float cc = u[(8 + q) * ld_e], d = u[(12 + q) * ld_e];
        t[0][q] = a + 0.5f * (b + cc);
        t[1][q] = 0.5f * (b - cc);
        t[2][q] = 0.5f * (b + cc) + d;
      }
      float *f = dw + ((int64_t)o * g->c + c) * 9;
      for (int i = 0; i < 3; i++) {
        float r0 = t[i][0] + 0.5f * (t[i][1] + t[i][2]);
        float r1 = 0.5f * (t[i][1] - t[i][2]);
        float r2 = 0.5f * (t[i][1] + t[i][2]) + t[i][3];
        if (acc) {
          f[3 * i] += r0, f[3 * i + 1] += r1, f[3 * i + 2] += r2;
        } else {
          f[3 * i] = r0, f[3 * i + 1] = r1, f[3 * i + 2] = r2;
        }
      }
    }
}

/* ---- the calls ---- */

typedef struct wg_thread {
  float *V, *M, *plane, *tmp, *rows, *dU;
} wg_thread;

static wg_thread thread_bufs(const dt_conv2d_geom *g, const wg_plan *pl, float *base, int t,
                             int backward) {
  wg_thread b;
  float *p = base + (size_t)t * pl->thread_floats;
  b.V = p, p += (size_t)WG_E * g->c * pl->pc;
  b.M = p, p += (size_t)WG_E * g->oc * pl->pc;
  b.plane = p, p += MAX((size_t)pl->hp * pl->wp, (size_t)8 * (pl->th + 1) * pl->tw);
  b.tmp = p, p += (size_t)WG_E * pl->T;
  b.rows = p, p += (size_t)4 * pl->T;
  b.dU = backward ? p : NULL;
  return b;
}

/* A call's plan and buffers: U, then each thread's (thread_bufs). */
typedef struct wg_call {
  wg_plan pl;
  dt_cpu_scratch *s;
  float *U, *base;
} wg_call;

/* w: transformed into U when not NULL */
static dt_status acquire(const char *op, const dt_conv2d_geom *g, const float *w, int nt,
                         int backward, wg_call *c) {
  plan_of(g, nt, backward, &c->pl);
  size_t u_floats = ((size_t)WG_E * g->oc * g->c + 15) / 16 * 16;
  size_t floats = u_floats + (size_t)c->pl.nt * c->pl.thread_floats;
  void *data = NULL;
  if (dt_cpu_scratch_acquire(floats * sizeof(float), &c->s, &data) != DT_OK)
    return DT_ERROR(DT_ERR_OOM, "%s: Winograd buffers of %zu bytes: malloc failed", op,
                    floats * sizeof(float));
  c->U = data;
  c->base = c->U + u_floats;
  if (w)
    filter_transform(g, w, c->U, nt);
  return DT_OK;
}

static void forward_chunk(const dt_conv2d_geom *g, const wg_plan *pl, const float *x,
                          const float *U, const float *bias, float *y, int chunk, wg_thread *b) {
  int i0 = chunk * pl->ipc, ni = MIN(pl->ipc, g->n - i0), np = ni * pl->T;
  int64_t out_sz = (int64_t)g->oc * g->oh * g->ow;
  int64_t v_e = (int64_t)g->c * pl->pc, m_e = (int64_t)g->oc * pl->pc;
  input_transform(g, pl, x, i0, ni, b->V, b->plane);
  for (int e = 0; e < WG_E; e++)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->oc, np, g->c, 1.0f,
                U + (int64_t)e * g->oc * g->c, g->c, b->V + e * v_e, pl->pc, 0.0f, b->M + e * m_e,
                pl->pc);
  for (int i = 0; i < ni; i++)
    for (int o = 0; o < g->oc; o++)
      output_tiles(g, pl, b->M + (int64_t)o * pl->pc + (int64_t)i * pl->T, m_e,
                   bias ? bias[o] : 0.0f, y + (i0 + i) * out_sz + (int64_t)o * g->oh * g->ow,
                   b->rows);
}

dt_status dt_cpu_conv_winograd_forward(const dt_conv2d_geom *g, const float *x, const float *w,
                                       const float *bias, float *y, int nt) {
  wg_call c;
  dt_status st = acquire("conv2d_forward", g, w, nt, 0, &c);
  if (st != DT_OK)
    return st;
    /* one thread: a team of one, outside any parallel region, so that sgemm
     * may use OpenBLAS's threads (a single chunk) */
#pragma omp parallel num_threads(c.pl.nt) if (c.pl.nt > 1)
  {
    int t = omp_get_thread_num(), nth = omp_get_num_threads();
    wg_thread b = thread_bufs(g, &c.pl, c.base, t, 0);
    for (int ch = t; ch < c.pl.chunks; ch += nth)
      forward_chunk(g, &c.pl, x, c.U, bias, y, ch, &b);
  }
  dt_cpu_scratch_release(c.s);
  return DT_OK;
}

/* One chunk of the backward: dU (+)= dM V^T (beta 0 on the thread's first
 * chunk), dx of the chunk's images. */
static void backward_chunk(const dt_conv2d_geom *g, const wg_plan *pl, const float *x,
                           const float *U, const float *dy, float *dx, int want_dw, int chunk,
                           int first, wg_thread *b) {
  int i0 = chunk * pl->ipc, ni = MIN(pl->ipc, g->n - i0), np = ni * pl->T;
  int64_t in_sz = (int64_t)g->c * g->h * g->w, out_sz = (int64_t)g->oc * g->oh * g->ow;
  int64_t v_e = (int64_t)g->c * pl->pc, m_e = (int64_t)g->oc * pl->pc;
  int64_t u_e = (int64_t)g->oc * g->c;
  for (int i = 0; i < ni; i++)
    for (int o = 0; o < g->oc; o++)
      grad_tiles(g, pl, dy + (i0 + i) * out_sz + (int64_t)o * g->oh * g->ow,
                 b->M + (int64_t)o * pl->pc + (int64_t)i * pl->T, m_e, b->rows);
  if (want_dw) {
    input_transform(g, pl, x, i0, ni, b->V, b->plane);
    for (int e = 0; e < WG_E; e++)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g->oc, g->c, np, 1.0f, b->M + e * m_e,
                  pl->pc, b->V + e * v_e, pl->pc, first ? 0.0f : 1.0f, b->dU + e * u_e, g->c);
  }
  if (dx) {
    for (int e = 0; e < WG_E; e++) /* dV over V */
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, g->c, np, g->oc, 1.0f, U + e * u_e, g->c,
                  b->M + e * m_e, pl->pc, 0.0f, b->V + e * v_e, pl->pc);
    wg_sub q = sub_planes(pl, b->plane);
    for (int i = 0; i < ni; i++)
      for (int c = 0; c < g->c; c++)
        dinput_tiles(g, pl, b->V + (int64_t)c * pl->pc + (int64_t)i * pl->T, v_e, &q, b->tmp,
                     dx + (i0 + i) * in_sz + (int64_t)c * g->h * g->w);
  }
}

dt_status dt_cpu_conv_winograd_backward(const dt_conv2d_geom *g, const float *x, const float *w,
                                        const float *dy, float *dx, float *dw, int dw_acc, int nt) {
  wg_call c;
  dt_status st = acquire("conv2d_backward", g, dx ? w : NULL, nt, 1, &c);
  if (st != DT_OK)
    return st;
  int64_t u_floats = (int64_t)WG_E * g->oc * g->c;
#pragma omp parallel num_threads(c.pl.nt) if (c.pl.nt > 1)
  {
    int t = omp_get_thread_num(), nth = omp_get_num_threads();
    wg_thread b = thread_bufs(g, &c.pl, c.base, t, 1);
    for (int ch = t; ch < c.pl.chunks; ch += nth)
      backward_chunk(g, &c.pl, x, c.U, dy, dx, dw != NULL, ch, ch == t, &b);
    if (dw && nth > 1) {
#pragma omp barrier
      /* the threads' dU summed in thread order, each thread a slice */
      int64_t lo = u_floats * t / nth, hi = u_floats * (t + 1) / nth;
      float *d0 = thread_bufs(g, &c.pl, c.base, 0, 1).dU;
      for (int k = 1; k < nth; k++) {
        const float *dk = thread_bufs(g, &c.pl, c.base, k, 1).dU;
#pragma omp simd
        for (int64_t j = lo; j < hi; j++)
          d0[j] += dk[j];
      }
    }
  }
  if (dw)
    filter_grad(g, thread_bufs(g, &c.pl, c.base, 0, 1).dU, dw, dw_acc, nt);
  dt_cpu_scratch_release(c.s);
  return DT_OK;
}
