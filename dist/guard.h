/* Deadlines for the blocking steps outside collectives (internal to dist/):
 * MPI start-up and communicator creation are collective too, so a peer that
 * stopped or died before reaching them would block this rank for ever.
 *
 *   dt_guard *g = NULL;
 *   DT_CHECK(dt_guard_begin(pg, "creating the mpi communicator (MPI_Comm_dup)", 300, &g));
 *   ... the blocking call ...
 *   dt_guard_end(g);
 *
 * If dt_guard_end is not reached within timeout_s, a watcher thread prints
 *   dtrain: error: rank R: <what> did not complete within T s: rank P (pid
 *   N, stopped, last in PHASE, ...) did not arrive; aborting the job
 * (the ranks of this host that did not begin the step, from the progress
 * table; process_group_internal.h) and ends the job: MPI_Abort once MPI is
 * initialised (mpirun then ends every rank), else _exit(70). timeout_s <= 0
 * arms nothing. Every rank must begin the same guarded steps in the same
 * order: they are counted, armed or not. */
#ifndef DT_DIST_GUARD_H
#define DT_DIST_GUARD_H

#include "core/status.h"
#include "dist/process_group.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_guard dt_guard;

/* pg may be NULL or not yet initialised (then "rank ?" and _exit). */
dt_status dt_guard_begin(const dt_pg *pg, const char *what, double timeout_s, dt_guard **out);
/* The same for MPI_Finalize, during which MPI_Abort reaches nobody: past
 * the deadline the rank prints the message and _exits(70), and mpirun ends
 * the others on that non-zero exit. */
dt_status dt_guard_begin_finalize(const dt_pg *pg, const char *what, double timeout_s,
                                  dt_guard **out);
/* Disarms and frees the guard; NULL is a no-op. */
void dt_guard_end(dt_guard *g);

/* The exit status of a job ended by a deadline (the watchdog's too). */
#define DT_EXIT_DEADLINE 70

#ifdef __cplusplus
}
#endif
#endif
