/* The default thread count and the start-up settings (launch/threads.h). */
#define _GNU_SOURCE
#include "launch/threads.h"

#include <sched.h>
#include <stdio.h>

#include "core/backend.h"
#include "core/cpu.h"
#include "core/env.h"

static char note[64];

int dt_threads_cores(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return n > 0 ? n : 1;
}

int dt_threads_for(int cores, int local_ranks) {
  int n = local_ranks > 1 ? cores / local_ranks : cores;
  return n < 1 ? 1 : n;
}

void dt_threads_choose_default(int local_ranks) {
  if (dt_env_is_set(DT_ENV_NUM_THREADS))
    return;
  dt_cpu_set_num_threads(dt_threads_for(dt_threads_cores(), local_ranks));
  if (local_ranks <= 1)
    snprintf(note, sizeof note, " (auto: every core)");
}

const char *dt_threads_note(void) { return note; }

const char *dt_threads_spincount(const char *wait_policy, const char *spincount) {
  if ((wait_policy && wait_policy[0]) || (spincount && spincount[0]))
    return NULL;
  return DT_THREADS_SPINCOUNT;
}
