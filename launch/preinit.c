/* What dtrain settles before any library starts. The libraries' own
 * constructors (libgomp's, OpenBLAS's) run before main and read their
 * environment once, so it must be right before they run. The dynamic
 * loader's .preinit_array runs the executable's functions here before
 * every constructor, but libc's own constructor then resets `environ` to
 * the process's original one: a variable set here reaches the libraries
 * only through a fresh start. So when a setting below changes the
 * environment, the binary re-executes itself (/proc/self/exe, the same
 * arguments) once, before any library has started; the setting then holds
 * and nothing changes the second time. The decisions are pure functions of
 * core/cpu.h and launch/threads.h.
 *
 * 1. OpenMP's wait policy. A libgomp thread that waits at a barrier spins
 *    for GOMP_SPINCOUNT iterations (300000 by default, up to milliseconds)
 *    before it sleeps; on cores shared with other busy processes it spins
 *    on a core the thread it waits for needs, and a run with a thread per
 *    core fell 10-20x behind one thread. A short spin keeps an idle
 *    machine's barriers fast and lets a waiting thread sleep under
 *    contention. Unless the user chose (OMP_WAIT_POLICY or GOMP_SPINCOUNT
 *    set), dtrain sets GOMP_SPINCOUNT=DT_THREADS_SPINCOUNT.
 *
 * 2. OpenBLAS's start-up buffers. OpenBLAS 0.3.21 maps a 128 MiB buffer
 *    per thread of its pool (OMP_NUM_THREADS, else every configured CPU) in
 *    its constructor and, when mmap fails (ulimit -v / -d), retries for
 *    ever: the binary spun before main. Its buffer size is fixed when it is
 *    built, and OPENBLAS_NUM_THREADS does not shrink the start-up pool of
 *    its OpenMP build. Under such a limit dtrain checks the room first: too
 *    little for the pool and one more buffer, it starts OpenBLAS with one
 *    thread (OMP_NUM_THREADS=1, unless the user set it; dtrain sets its own
 *    thread count later); too little even for that, it exits with an error
 *    naming the limit and the least that works. The CPU backend then runs
 *    no more threads than OpenBLAS's buffers fit (core/cpu_backend.c). */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cpu.h"
#include "core/memory.h"
#include "launch/threads.h"

/* The error when OpenBLAS cannot start with `pool` threads: which limit,
 * what it leaves, and the least that works. */
static void refuse(const dt_host_memory *m, size_t room, int pool) {
  size_t need = dt_host_blas_room_needed(pool);
  size_t as_room = m->as_limit && m->as_limit > m->as_used ? m->as_limit - m->as_used : 0;
  bool as = m->as_limit && as_room <= room;
  size_t limit = as ? m->as_limit : m->data_limit, used = as ? m->as_used : m->data_used;
  char l[32], u[32], r[32], n[32], least[32];
  fprintf(stderr,
          "dtrain: error: the %s limit (ulimit -%c) is %s and dtrain's libraries take %s of it, "
          "leaving %s; OpenBLAS maps a %zu MiB buffer per thread as it starts (%d thread%s%s) "
          "and retries a failed one for ever, so dtrain needs %s: raise the limit to at least "
          "%s (ulimit -%c %zu)\n",
          as ? "address-space" : "data", as ? 'v' : 'd', dt_format_bytes(limit, l, sizeof l),
          dt_format_bytes(used, u, sizeof u), dt_format_bytes(room, r, sizeof r),
          DT_HOST_BLAS_BUFFER_BYTES >> 20, pool, pool == 1 ? "" : "s",
          pool > 1 ? ": OMP_NUM_THREADS" : "", dt_format_bytes(need, n, sizeof n),
          dt_format_bytes(used + need, least, sizeof least), as ? 'v' : 'd',
          (used + need + 1023) / 1024);
  _exit(1); /* before the libraries have started: no atexit handler to run */
}

/* libc's `environ` is not set yet (getenv sees nothing): the process's
 * environment is the loader's envp. */
static const char *env_get(char **envp, const char *name) {
  size_t n = strlen(name);
  for (char **e = envp; e && *e; e++)
    if (!strncmp(*e, name, n) && (*e)[n] == '=')
      return *e + n + 1;
  return NULL;
}

/* The settings for the fresh start: "NAME=value" strings. */
#define MAX_SETTINGS 2
static const char *settings[MAX_SETTINGS];
static int num_settings;

static void set_for_restart(char **envp, const char *setting) {
  const char *eq = strchr(setting, '=');
  char name[64];
  snprintf(name, sizeof name, "%.*s", (int)(eq - setting), setting);
  const char *now = env_get(envp, name);
  if ((!now || strcmp(now, eq + 1)) && num_settings < MAX_SETTINGS)
    settings[num_settings++] = setting;
}

/* Re-executes the binary with envp and the settings (replacing variables
 * of the same names); returns only when that fails. */
static void restart(char **argv, char **envp) {
  size_t n = 0;
  while (envp && envp[n])
    n++;
  char **env = malloc((n + MAX_SETTINGS + 1) * sizeof *env);
  if (!env)
    return;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    bool replaced = false;
    for (int j = 0; j < num_settings; j++) {
      size_t len = (size_t)(strchr(settings[j], '=') - settings[j]) + 1;
      replaced |= !strncmp(envp[i], settings[j], len);
    }
    if (!replaced)
      env[k++] = envp[i];
  }
  for (int j = 0; j < num_settings; j++)
    env[k++] = (char *)settings[j];
  env[k] = NULL;
  execve("/proc/self/exe", argv, env);
  free(env); /* go on as we are */
}

/* OMP_NUM_THREADS=1 when OpenBLAS's start-up pool does not fit the address
 * space but a pool of one does; refuses when not even that fits. */
static void fit_blas_start_up(char **envp) {
  dt_host_memory m;
  dt_host_memory_read_rlimits(&m);
  size_t room = dt_host_address_room(&m);
  if (room == SIZE_MAX)
    return;
  const char *omp = env_get(envp, "OMP_NUM_THREADS");
  bool omp_set = omp && omp[0];
  int pool = dt_host_blas_pool(omp, sysconf(_SC_NPROCESSORS_CONF));
  if (room >= dt_host_blas_room_needed(pool))
    return;
  if (!omp_set && room >= dt_host_blas_room_needed(1)) {
    set_for_restart(envp, "OMP_NUM_THREADS=1");
    return;
  }
  refuse(&m, room, omp_set ? pool : 1);
}

static void preinit(int argc, char **argv, char **envp) {
  (void)argc;
  const char *spin =
      dt_threads_spincount(env_get(envp, "OMP_WAIT_POLICY"), env_get(envp, "GOMP_SPINCOUNT"));
  if (spin)
    set_for_restart(envp, "GOMP_SPINCOUNT=" DT_THREADS_SPINCOUNT);
  fit_blas_start_up(envp);
  if (num_settings > 0)
    restart(argv, envp);
}

__attribute__((section(".preinit_array"),
               used)) static void (*const dt_preinit_entry)(int, char **, char **) = preinit;
