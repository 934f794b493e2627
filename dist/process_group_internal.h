/* Process group internals shared by dist/ (not part of the public API). */
#ifndef DT_DIST_PROCESS_GROUP_INTERNAL_H
#define DT_DIST_PROCESS_GROUP_INTERNAL_H

#include <mpi.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "dist/process_group.h"

/* A rank's entry in the progress table (pg_table.c). */
typedef struct dt_pg_slot dt_pg_slot;

struct dt_pg {
  int rank, world, local_rank, local_size;
  char host[256];
  int uses_mpi;
  int initialized_mpi; /* we called MPI_Init_thread, so we finalise */
  int thread_level;    /* MPI_THREAD_*, -1 without MPI */
  dt_launcher launcher;
  int ready;           /* dt_pg_create succeeded: every rank joined */
  double timeout_s;    /* the start-up deadline, also the end's */
  MPI_Comm world_comm; /* dup of MPI_COMM_WORLD with MPI_ERRORS_RETURN */
  /* Held around every MPI call when the library gave less than
   * MPI_THREAD_MULTIPLE (several communication threads may exist). */
  pthread_mutex_t mpi_lock;
  /* The progress table of this host's ranks (world slots, this rank's at
   * [rank]), NULL when it could not be made; the phase this rank named. */
  dt_pg_slot *table;
  char phase[96];
  int progress_claimed; /* a communicator publishes its collectives here */
};

/* Locks mpi_lock unless MPI is fully thread-safe. */
void dt_pg_mpi_lock(dt_pg *pg);
void dt_pg_mpi_unlock(dt_pg *pg);

/* ---- the progress table (pg_table.c) ----
 * Each rank of a host publishes where it stands in a segment the others
 * map: its pid, its phase, how many guarded steps and collectives it
 * began and completed. A rank past a deadline reads it to name the ranks
 * that did not arrive. */

/* Collective over `node` (the ranks of this host), at start-up: makes and
 * maps the table (pg->table; NULL when some rank could not map it, which
 * only makes the messages say less). */
void dt_pg_table_open(dt_pg *pg, MPI_Comm node);
/* Unmaps it. */
void dt_pg_table_close(dt_pg *pg);
/* The phase this rank named last (dt_pg_set_phase) into buf, "" none;
 * any thread. */
void dt_pg_phase(const dt_pg *pg, char *buf, size_t cap);
/* Counts a guarded step (dt_guard_begin) begun; its number, from 1 (0
 * without a table). Every rank begins the same guarded steps in the same
 * order. */
uint64_t dt_pg_note_guard(const dt_pg *pg);
/* Publishes the newest collective begun (entered) and completed of the
 * communicator that claimed the table (0: unchanged). */
void dt_pg_note_collective(const dt_pg *pg, uint64_t entered, uint64_t completed);
/* Who keeps this rank waiting at guarded step `guard_step` (when not 0)
 * or collective `coll_seq`: "rank R (pid P, stopped, last in PHASE, its last
 * completed collective #N) did not arrive", or the ranks that arrived but
 * are stopped or gone, and how many ranks are on other hosts. */
void dt_pg_describe_behind(const dt_pg *pg, uint64_t guard_step, uint64_t coll_seq, char *buf,
                           size_t cap);

#endif
