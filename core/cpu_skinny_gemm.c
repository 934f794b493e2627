/* C = op(A) B without packing (core/cpu_conv_table.h): the products of
 * ResNet's deep layers at small batches, where the weights are the large
 * operand and the columns few (512 output channels by 4608 at 2x2 pixels,
 * batch 16: N = 64).
 *
 * A sgemm packs its operands into blocks before it multiplies; with 64
 * columns every element of the weights is packed (read, written, read
 * again) for 64 multiply-adds. Here A is read where it lies, once per 64
 * columns: a 6 x 64 block of C stays in 24 AVX-512 registers while k runs
 * over a 128-deep slice, each step broadcasting six elements of A against
 * four vectors of B's row k. B's slice (128 x 64 floats, 32 KB) stays in
 * L1 across the row blocks. op(A) = A^T reads six consecutive elements of
 * A's row k, a cache line reused by the next row blocks.
 *
 * On the conv's shapes (2 threads, Ice Lake, the operands hot in the
 * caches): w (512, 4608) by 64 columns 1.36 ms against OpenBLAS's 1.94,
 * w^T by 64 columns 1.79 against 2.35; at 256 columns as fast as OpenBLAS
 * hot, and faster in a training step, where the weights come from memory
 * (ResNet-18's 256-channel 4x4 forward at batch 16: 2.0 against 2.4-3.0
 * ms). With a shallow K and a long N (the weight gradient) OpenBLAS is
 * twice as fast: the convolution uses this for at most DT_SKINNY_MAX_N
 * columns.
 *
 * Each element of C is the sum over k in order, slice by slice, so the
 * result does not depend on the thread count (threads split the rows). */
#include <omp.h>
#include <stdatomic.h>
#include <stdint.h>

#include "core/cpu.h"
#include "core/cpu_conv_table.h"

#define MR 6   /* rows of C a block */
#define NR 64  /* columns of C a block: four vectors */
#define KC 128 /* depth of a slice */
#define MIN(a, b) ((a) < (b) ? (a) : (b))

static atomic_int skinny_enabled = 1;

int dt_cpu_set_gemm_skinny(int enabled) { return atomic_exchange(&skinny_enabled, enabled != 0); }

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define TARGET_AVX512 __attribute__((target("avx512f")))
#define UNROLL _Pragma("GCC unroll 8")

int dt_cpu_gemm_skinny_on(void) {
  __builtin_cpu_init();
  return atomic_load_explicit(&skinny_enabled, memory_order_relaxed) &&
         __builtin_cpu_supports("avx512f");
}

/* C block (mr <= MR rows, nv vectors of 16 columns, the last masked by
 * `last`) = (add ? C : 0) + op(A) block (mr, kc) x B slice (kc, nv * 16).
 * Rows past mr repeat row mr - 1 and are not stored. */
static inline __attribute__((always_inline)) TARGET_AVX512 void block(
    int trans, int nv, const float *A, int64_t lda, const float *B, int64_t ldb, float *C,
    int64_t ldc, int kc, int mr, __mmask16 last, int add) {
  __m512 c[MR][4];
  UNROLL for (int i = 0; i < MR; i++) UNROLL for (int j = 0; j < 4; j++) c[i][j] =
      _mm512_setzero_ps();
  int64_t ro[MR]; /* row i's offset in A (A^T: its column) */
  UNROLL for (int i = 0; i < MR; i++) ro[i] = (int64_t)(i < mr ? i : mr - 1) * (trans ? 1 : lda);
  for (int k = 0; k < kc; k++) {
    const float *bk = B + (int64_t)k * ldb, *ak = trans ? A + (int64_t)k * lda : A + k;
    __m512 b[4];
    UNROLL for (int j = 0; j < nv; j++) b[j] =
        j == nv - 1 ? _mm512_maskz_loadu_ps(last, bk + 16 * j) : _mm512_loadu_ps(bk + 16 * j);
    UNROLL for (int i = 0; i < MR; i++) {
      __m512 a = _mm512_set1_ps(ak[ro[i]]);
      UNROLL for (int j = 0; j < nv; j++) c[i][j] = _mm512_fmadd_ps(a, b[j], c[i][j]);
    }
  }
  UNROLL for (int i = 0; i < MR; i++) UNROLL for (int j = 0; j < nv; j++) {
    if (i >= mr)
      break;
    float *cp = C + (int64_t)i * ldc + 16 * j;
    __mmask16 m = j == nv - 1 ? last : (__mmask16)0xffff;
    __m512 v = c[i][j];
    if (add)
      v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, cp));
    _mm512_mask_storeu_ps(cp, m, v);
  }
}

/* The four widths and two forms of A as constants, so that block's loops
 * unroll and its accumulators stay in registers. */
#define BLOCK_NV(t, nv) block(t, nv, A, lda, B, ldb, C, ldc, kc, mr, last, add)
TARGET_AVX512 static void block_n(int trans, int nv, const float *A, int64_t lda, const float *B,
                                  int64_t ldb, float *C, int64_t ldc, int kc, int mr,
                                  __mmask16 last, int add) {
  if (trans) {
    switch (nv) {
      case 1: BLOCK_NV(1, 1); return;
      case 2: BLOCK_NV(1, 2); return;
      case 3: BLOCK_NV(1, 3); return;
      default: BLOCK_NV(1, 4); return;
    }
  }
  switch (nv) {
    case 1: BLOCK_NV(0, 1); return;
    case 2: BLOCK_NV(0, 2); return;
    case 3: BLOCK_NV(0, 3); return;
    default: BLOCK_NV(0, 4); return;
  }
}

/* Rows m0 .. m1 - 1 of C. */
TARGET_AVX512 static void rows(int trans, int m0, int m1, int N, int K, const float *A, int lda,
                               const float *B, int ldb, float *C, int ldc) {
  for (int k0 = 0; k0 < K; k0 += KC) {
    int kc = MIN(KC, K - k0);
    for (int n0 = 0; n0 < N; n0 += NR) {
      int w = MIN(NR, N - n0), nv = (w + 15) / 16, tail = w - 16 * (nv - 1);
      __mmask16 last = (__mmask16)(tail == 16 ? 0xffff : (1u << tail) - 1);
      const float *b = B + (int64_t)k0 * ldb + n0;
      for (int m = m0; m < m1; m += MR) {
        const float *a = trans ? A + (int64_t)k0 * lda + m : A + (int64_t)m * lda + k0;
        block_n(trans, nv, a, lda, b, ldb, C + (int64_t)m * ldc + n0, ldc, kc, MIN(MR, m1 - m),
                last, k0 > 0);
      }
    }
  }
}

int dt_cpu_skinny_sgemm(int trans_a, int M, int N, int K, const float *A, int lda, const float *B,
                        int ldb, float *C, int ldc, int nt) {
  if (M < 1 || N < 1 || K < 1 || !dt_cpu_gemm_skinny_on())
    return 0;
  int blocks = (M + MR - 1) / MR, parts = MIN(nt, blocks);
#pragma omp parallel for if (parts > 1) num_threads(parts) schedule(static)
  for (int t = 0; t < parts; t++) {
    int m0 = (int)((int64_t)blocks * t / parts) * MR;
    int m1 = MIN(M, (int)((int64_t)blocks * (t + 1) / parts) * MR);
    if (m0 < m1)
      rows(trans_a, m0, m1, N, K, A, lda, B, ldb, C, ldc);
  }
  return 1;
}

#else
int dt_cpu_gemm_skinny_on(void) { return 0; }
int dt_cpu_skinny_sgemm(int trans_a, int M, int N, int K, const float *A, int lda, const float *B,
                        int ldb, float *C, int ldc, int nt) {
  (void)trans_a, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)C;
  (void)ldc, (void)nt;
  return 0;
}
#endif
