/* Process group: who am I in the job (rank, world size, local rank, host).
 *
 *   dt_pg_config cfg = DT_PG_CONFIG_DEFAULT;
 *   dt_pg *pg;
 *   dt_status st = dt_pg_create(&cfg, &pg);   // MPI under mpirun / srun
 *   int rank = dt_pg_rank(pg), world = dt_pg_world_size(pg);
 *   ... each rank takes device `dt_pg_local_rank(pg)` ...
 *   dt_pg_destroy(pg);                        // MPI_Finalize if we initialised MPI
 *
 * Modes. Under a launcher (Open MPI's mpirun, `srun --mpi=pmix`, any PMI /
 * PMIx launcher) the group comes from MPI: MPI_Init_thread asking for
 * MPI_THREAD_MULTIPLE (SERIALIZED is accepted: the communicators then
 * serialise their MPI calls on one lock), rank and size from
 * MPI_COMM_WORLD, the local rank and size from
 * MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). Without a launcher the group is
 * a plain single process (world 1, rank 0) and MPI is *not* initialised:
 * an MPI singleton start would spawn Open MPI's runtime daemon, cost time
 * and fail in restricted containers, for a group of one. The environment is
 * read in one place, dt_pg_detect_launcher().
 *
 * MPI can be initialised and finalised once per process: create at most one
 * MPI group per process, at start-up, and destroy it at exit.
 */
#ifndef DT_DIST_PROCESS_GROUP_H
#define DT_DIST_PROCESS_GROUP_H

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_pg_mode {
  DT_PG_AUTO = 0,   /* MPI when a launcher is detected, else single */
  DT_PG_SINGLE = 1, /* world 1, no MPI */
  DT_PG_MPI = 2,    /* always MPI (an MPI singleton when not launched) */
} dt_pg_mode;

typedef struct dt_pg_config {
  dt_pg_mode mode;
  /* Seconds MPI start-up (MPI_Init_thread, the world and node
   * communicators) may take before this rank names the step it waits for
   * and ends the job (exit 70): a peer that never arrives must not hang it.
   * 0 = wait for ever. */
  double init_timeout_s;
} dt_pg_config;
#define DT_PG_CONFIG_DEFAULT ((dt_pg_config){DT_PG_AUTO, 300.0})

typedef enum dt_launcher {
  DT_LAUNCHER_NONE = 0,
  DT_LAUNCHER_OPEN_MPI,     /* mpirun: OMPI_COMM_WORLD_SIZE */
  DT_LAUNCHER_PMIX,         /* srun --mpi=pmix and other PMIx launchers: PMIX_RANK */
  DT_LAUNCHER_PMI,          /* MPICH hydra, srun --mpi=pmi2: PMI_RANK / PMI_SIZE */
  DT_LAUNCHER_SLURM_NO_PMI, /* srun without an MPI plugin: SLURM_NTASKS > 1 only */
} dt_launcher;

/* Looks at the environment (the only place dist/ reads it for the group). */
dt_launcher dt_pg_detect_launcher(void);
const char *dt_launcher_name(dt_launcher l);

typedef struct dt_pg dt_pg;

/* Creates the group. Errors: DT_ERR_MPI (MPI_Init_thread failed, or thread
 * support below MPI_THREAD_SERIALIZED), DT_ERR_INVALID_ARG for a Slurm step
 * of several tasks started without an MPI plugin (advice: srun --mpi=pmix). */
dt_status dt_pg_create(const dt_pg_config *cfg, dt_pg **out);
/* Frees the group; finalises MPI when dt_pg_create initialised it. Every
 * communicator made from the group must be destroyed first. NULL is a no-op.
 * Collective over an MPI group of several ranks: they meet in a barrier
 * before MPI_Finalize, and MPI_Finalize (which waits for every rank under
 * Open MPI) runs under a deadline too, both the start-up one: a rank that
 * never arrives ends the job, exit 70, naming the step and the rank. */
void dt_pg_destroy(dt_pg *pg);

int dt_pg_rank(const dt_pg *pg);
int dt_pg_world_size(const dt_pg *pg);
int dt_pg_local_rank(const dt_pg *pg); /* rank among the processes of this host */
int dt_pg_local_size(const dt_pg *pg);
const char *dt_pg_host(const dt_pg *pg); /* this process's host name */
int dt_pg_uses_mpi(const dt_pg *pg);
/* Thread level MPI provided (MPI_THREAD_*), or -1 without MPI. */
int dt_pg_mpi_thread_level(const dt_pg *pg);
/* "rank 1/4 (local 1/2) on node-a via Open MPI mpirun" into buf. */
char *dt_pg_describe(const dt_pg *pg, char *buf, unsigned long cap);

/* Names what this rank is doing now, for the deadlines' messages ("the
 * final evaluation"; at most 95 bytes are kept): a rank whose collective
 * or guarded step passes its deadline names its own phase, and the ranks
 * of its host that did not arrive with theirs (process_group_internal.h's
 * progress table). NULL pg: a no-op. */
void dt_pg_set_phase(dt_pg *pg, const char *phase);

/* Ends every process of the job (MPI_Abort; abort() without MPI). For the
 * watchdog and for launch/ on fatal errors. */
void dt_pg_abort(const dt_pg *pg, int code) __attribute__((noreturn));

#ifdef __cplusplus
}
#endif
#endif
