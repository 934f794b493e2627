/* Which of OpenBLAS's kernel sets the CPU backend's GEMMs run on, for
 * `dtrain doctor`. OpenBLAS (DYNAMIC_ARCH) picks its set by CPU model;
 * OPENBLAS_CORETYPE overrides it, and an override that names an AVX2 set
 * (Haswell, Zen) on a CPU with AVX-512 costs the GEMMs about a third of
 * their speed (sgemm 512^3 on one Zen 5 core: 91 GFLOP/s with Haswell's set
 * against 147-165 with SkylakeX's or Cooperlake's). The backend leaves the
 * choice to OpenBLAS and the user; it only says what it is. */
#define _GNU_SOURCE
#include <cblas.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "core/cpu.h"

static pthread_once_t blas_note_once = PTHREAD_ONCE_INIT;
static char blas_note[256];

static bool cpu_has_avx512_gemm_set(void) {
  __builtin_cpu_init();
  /* What OpenBLAS's SkylakeX kernels use; __builtin_cpu_supports also
   * checks that the OS saves the 512-bit state. */
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
}

static void describe_blas_kernels(void) {
  const char *core = openblas_get_corename();
  const char *forced = getenv("OPENBLAS_CORETYPE");
  if (!core)
    core = "?";
  bool avx2_set = strcasecmp(core, "haswell") == 0 || strcasecmp(core, "zen") == 0;
  if (forced && *forced && avx2_set && cpu_has_avx512_gemm_set())
    snprintf(blas_note, sizeof blas_note,
             "%s, chosen by OPENBLAS_CORETYPE=%s: AVX2 kernels on a CPU with AVX-512 "
             "(unset it to let OpenBLAS choose; GEMMs about 1.6x faster here)",
             core, forced);
  else if (forced && *forced)
    snprintf(blas_note, sizeof blas_note, "%s, chosen by OPENBLAS_CORETYPE=%s", core, forced);
  else
    snprintf(blas_note, sizeof blas_note, "%s, chosen by OpenBLAS for this CPU", core);
}

const char *dt_cpu_blas_kernels(void) {
  pthread_once(&blas_note_once, describe_blas_kernels);
  return blas_note;
}
