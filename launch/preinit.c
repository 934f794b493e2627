/* What dtrain settles before any library starts. The libraries' own
 * constructors (OpenBLAS's, libgomp's) run before main and read their
 * environment once, so the dynamic loader's .preinit_array, which runs the
 * executable's functions here before every constructor, is the one place
 * to act without re-executing the binary. The decisions are pure functions
 * of core/cpu.h.
 *
 * OpenBLAS's start-up buffers. OpenBLAS 0.3.21 maps a 128 MiB buffer per
 * thread of its pool (OMP_NUM_THREADS, else every configured CPU) in its
 * constructor and, when mmap fails (ulimit -v / -d), retries for ever: the
 * binary spun before main. Its buffer size is fixed when it is built, and
 * OPENBLAS_NUM_THREADS does not shrink the start-up pool of its OpenMP
 * build. Under such a limit dtrain checks the room first: too little for
 * the pool and one more buffer, it starts OpenBLAS with one thread
 * (OMP_NUM_THREADS=1, unless the user set it; dtrain sets its own thread
 * count later); too little even for that, it exits with an error naming
 * the limit and the least that works. The CPU backend then runs no more
 * threads than OpenBLAS's buffers fit (core/cpu_backend.c). */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/cpu.h"
#include "core/memory.h"

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

static void preinit(int argc, char **argv, char **envp) {
  (void)argc;
  (void)argv;
  (void)envp;
  dt_host_memory m;
  dt_host_memory_read_rlimits(&m);
  size_t room = dt_host_address_room(&m);
  if (room == SIZE_MAX)
    return;
  const char *omp = getenv("OMP_NUM_THREADS");
  bool omp_set = omp && omp[0];
  int pool = dt_host_blas_pool(omp, sysconf(_SC_NPROCESSORS_CONF));
  if (room >= dt_host_blas_room_needed(pool))
    return;
  if (!omp_set && room >= dt_host_blas_room_needed(1)) {
    setenv("OMP_NUM_THREADS", "1", 1);
    return;
  }
  refuse(&m, room, omp_set ? pool : 1);
}

__attribute__((section(".preinit_array"),
               used)) static void (*const dt_preinit_entry)(int, char **, char **) = preinit;
