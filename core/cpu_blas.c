/* Which of OpenBLAS's kernel sets the CPU backend's GEMMs run on, for
 * `dtrain doctor`. OpenBLAS (DYNAMIC_ARCH) picks its set by CPU model;
 * OPENBLAS_CORETYPE overrides it, and an override that names an AVX2 set
 * (Haswell, Zen) on a CPU with AVX-512 costs the GEMMs about a third of
 * their speed (sgemm 512^3 on one Zen 5 core: 91 GFLOP/s with Haswell's set
 * against 147-165 with SkylakeX's or Cooperlake's). The backend leaves a
 * user's OPENBLAS_CORETYPE alone and only says what it is. Without one, a
 * CPU model newer than the library (Debian 12's 0.3.21 on Emerald Rapids,
 * family 6 model 207) gets OpenBLAS's SSE3 "Prescott" fallback: then, on a
 * CPU with AVX-512, the backend has OpenBLAS choose again with SkylakeX's
 * set (sgemm 512x256x4608, one thread: 6-12 -> 21-38 GFLOP/s). */
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

/* OpenBLAS's own choice of kernel set (DYNAMIC_ARCH builds; weak, so that
 * a build without it links and keeps its one set). */
extern void gotoblas_dynamic_init(void) __attribute__((weak));
extern void gotoblas_dynamic_quit(void) __attribute__((weak));

static pthread_once_t blas_choice_once = PTHREAD_ONCE_INIT;
static const char *blas_fallback; /* the set OpenBLAS fell back to, when replaced */

static bool is_avx512_set(const char *core) {
  return strcasecmp(core, "skylakex") == 0 || strcasecmp(core, "cooperlake") == 0 ||
         strcasecmp(core, "sapphirerapids") == 0;
}

static void choose_blas_kernels(void) {
  const char *forced = getenv("OPENBLAS_CORETYPE");
  const char *core = openblas_get_corename();
  if ((forced && *forced) || !core || !gotoblas_dynamic_init || !gotoblas_dynamic_quit)
    return;
  bool avx2_or_avx512 =
      strcasecmp(core, "haswell") == 0 || strcasecmp(core, "zen") == 0 || is_avx512_set(core);
  if (avx2_or_avx512 || !cpu_has_avx512_gemm_set())
    return;
  static char was[32];
  snprintf(was, sizeof was, "%s", core);
  /* gotoblas_dynamic_init reads the variable; it is unset again so that the
   * user's environment (and doctor's account of it) stays as it was. */
  setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");
  blas_fallback = was;
}

void dt_cpu_blas_choose_kernels(void) { pthread_once(&blas_choice_once, choose_blas_kernels); }

static void describe_blas_kernels(void) {
  dt_cpu_blas_choose_kernels();
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
  else if (blas_fallback)
    snprintf(blas_note, sizeof blas_note,
             "%s, chosen by dtrain: OpenBLAS does not know this CPU and fell back to %s "
             "(no AVX-512)",
             core, blas_fallback);
  else
    snprintf(blas_note, sizeof blas_note, "%s, chosen by OpenBLAS for this CPU", core);
}

const char *dt_cpu_blas_kernels(void) {
  pthread_once(&blas_note_once, describe_blas_kernels);
  return blas_note;
}
