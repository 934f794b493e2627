/* Process group internals shared by dist/ (not part of the public API). */
#ifndef DT_DIST_PROCESS_GROUP_INTERNAL_H
#define DT_DIST_PROCESS_GROUP_INTERNAL_H

#include <mpi.h>
#include <pthread.h>

#include "dist/process_group.h"

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
};

/* Locks mpi_lock unless MPI is fully thread-safe. */
void dt_pg_mpi_lock(dt_pg *pg);
void dt_pg_mpi_unlock(dt_pg *pg);

#endif
