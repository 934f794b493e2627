/* The default thread count under contention (launch/threads.h). */
#define _GNU_SOURCE
#include "launch/threads.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <time.h>

#include "core/backend.h"
#include "core/cpu.h"
#include "core/env.h"

#define PROBE_MS 40
#define MAX_PROBES 256

static char note[96];

int dt_threads_cores(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return n > 0 ? n : 1;
}

static double seconds(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct probe {
  double until; /* CLOCK_MONOTONIC */
  double share; /* CPU time / wall time of the thread */
} probe;

static void *spin(void *arg) {
  probe *p = arg;
  double w0 = seconds(CLOCK_MONOTONIC), c0 = seconds(CLOCK_THREAD_CPUTIME_ID), w1 = w0;
  volatile unsigned long sink = 0;
  while ((w1 = seconds(CLOCK_MONOTONIC)) < p->until)
    for (int i = 0; i < 1000; i++)
      sink += (unsigned long)i;
  double c1 = seconds(CLOCK_THREAD_CPUTIME_ID);
  p->share = w1 > w0 ? (c1 - c0) / (w1 - w0) : 1.0;
  return NULL;
}

double dt_threads_free_cores(int cores, int ms) {
  if (cores > MAX_PROBES)
    cores = MAX_PROBES;
  probe probes[MAX_PROBES];
  pthread_t threads[MAX_PROBES];
  double until = seconds(CLOCK_MONOTONIC) + 1e-3 * ms;
  int started = 0;
  for (int i = 0; i < cores; i++) {
    probes[i] = (probe){until, 0.0};
    if (pthread_create(&threads[i], NULL, spin, &probes[i]) != 0)
      break;
    started++;
  }
  double free = 0.0;
  for (int i = 0; i < started; i++) {
    pthread_join(threads[i], NULL);
    free += probes[i].share > 1.0 ? 1.0 : probes[i].share;
  }
  return free;
}

int dt_threads_for_free_cores(double free, int cores) {
  if (free >= (double)cores - 0.25)
    return cores;
  int n = (int)free;
  return n < 1 ? 1 : n > cores ? cores : n;
}

void dt_threads_choose_default(int local_ranks) {
  int cores = dt_threads_cores();
  if (cores <= 1 || local_ranks > 1 || dt_env_is_set(DT_ENV_NUM_THREADS))
    return;
  double free = dt_threads_free_cores(cores, PROBE_MS);
  int n = dt_threads_for_free_cores(free, cores);
  dt_cpu_set_num_threads(n);
  snprintf(note, sizeof note, " (auto: %.1f of %d cores free)", free, cores);
}

const char *dt_threads_note(void) { return note; }
