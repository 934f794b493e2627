/* Deadlines for blocking steps outside collectives: one watcher thread per
 * armed guard, waiting on a condition variable with a monotonic deadline. */
#include "dist/guard.h"

#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist/process_group_internal.h"

struct dt_guard {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  const dt_pg *pg;
  char what[160];
  double timeout_s;
  struct timespec deadline; /* CLOCK_MONOTONIC */
  uint64_t step;            /* the guarded step's number in the progress table, 0 none */
  int exit_only;            /* past the deadline: _exit, not MPI_Abort (MPI_Finalize) */
};

static void *watch(void *arg) {
  dt_guard *g = arg;
  pthread_mutex_lock(&g->mu);
  int rc = 0;
  while (!g->done && rc != ETIMEDOUT)
    rc = pthread_cond_timedwait(&g->cv, &g->mu, &g->deadline);
  int fire = !g->done;
  pthread_mutex_unlock(&g->mu);
  if (!fire)
    return NULL;
  int mpi_up = 0, finalized = 0;
  MPI_Initialized(&mpi_up);
  MPI_Finalized(&finalized);
  /* During start-up the rank is only known to the launcher. */
  char who[32] = "?";
  static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                                     "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0] && who[0] == '?'; i++) {
    const char *v = getenv(vars[i]);
    if (v && v[0])
      snprintf(who, sizeof who, "%s", v);
  }
  if (who[0] == '?' && g->pg && g->pg->uses_mpi && mpi_up)
    snprintf(who, sizeof who, "%d", g->pg->rank);
  char behind[1024] = "a peer rank stopped, died or never reached it (see the other ranks' output)";
  if (g->step > 0)
    dt_pg_describe_behind(g->pg, g->step, 0, behind, sizeof behind);
  fprintf(stderr, "dtrain: error: rank %s: %s did not complete within %g s: %s; aborting the job\n",
          who, g->what, g->timeout_s, behind);
  fflush(stderr);
  fflush(stdout);
  /* In MPI_Finalize, MPI_Abort reaches nobody: the non-zero exit makes
   * mpirun end the others. */
  if (mpi_up && !finalized && !g->exit_only)
    MPI_Abort(MPI_COMM_WORLD, DT_EXIT_DEADLINE);
  _exit(DT_EXIT_DEADLINE);
}

static dt_status begin(const dt_pg *pg, const char *what, double timeout_s, int exit_only,
                       dt_guard **out) {
  *out = NULL;
  uint64_t step = dt_pg_note_guard(pg); /* counted on every rank, armed or not */
  if (!(timeout_s > 0))
    return DT_OK;
  dt_guard *g = calloc(1, sizeof *g);
  if (!g)
    return DT_ERROR(DT_ERR_OOM, "arming a deadline for %s: out of host memory", what);
  g->pg = pg;
  g->timeout_s = timeout_s;
  g->step = step;
  g->exit_only = exit_only;
  snprintf(g->what, sizeof g->what, "%s", what);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&g->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&g->mu, NULL);
  clock_gettime(CLOCK_MONOTONIC, &g->deadline);
  double whole = (double)(time_t)timeout_s;
  g->deadline.tv_sec += (time_t)timeout_s;
  g->deadline.tv_nsec += (long)((timeout_s - whole) * 1e9);
  if (g->deadline.tv_nsec >= 1000000000L) {
    g->deadline.tv_sec++;
    g->deadline.tv_nsec -= 1000000000L;
  }
  int rc = pthread_create(&g->thread, NULL, watch, g);
  if (rc != 0) {
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
    return DT_ERROR(DT_ERR_INTERNAL, "arming a deadline for %s: pthread_create: %s", what,
                    strerror(rc));
  }
  *out = g;
  return DT_OK;
}

dt_status dt_guard_begin(const dt_pg *pg, const char *what, double timeout_s, dt_guard **out) {
  return begin(pg, what, timeout_s, 0, out);
}

dt_status dt_guard_begin_finalize(const dt_pg *pg, const char *what, double timeout_s,
                                  dt_guard **out) {
  return begin(pg, what, timeout_s, 1, out);
}

void dt_guard_end(dt_guard *g) {
  if (!g)
    return;
  pthread_mutex_lock(&g->mu);
  g->done = 1;
  pthread_cond_signal(&g->cv);
  pthread_mutex_unlock(&g->mu);
  pthread_join(g->thread, NULL);
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
  free(g);
}
