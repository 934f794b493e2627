/* Process group bootstrap from MPI, or a single process without it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist/guard.h"
#include "dist/mpi_util.h"
#include "dist/process_group_internal.h"

static int env_set(const char *name) {
  const char *v = getenv(name);
  return v != NULL && v[0] != '\0';
}

dt_launcher dt_pg_detect_launcher(void) {
  if (env_set("OMPI_COMM_WORLD_SIZE"))
    return DT_LAUNCHER_OPEN_MPI;
  if (env_set("PMIX_RANK"))
    return DT_LAUNCHER_PMIX;
  if (env_set("PMI_RANK") || env_set("PMI_SIZE"))
    return DT_LAUNCHER_PMI;
  /* SLURM_PROCID is also set inside a plain batch script, whose step has
   * one task: only an srun step of several tasks without PMI variables is a
   * launch we cannot join (srun without --mpi=pmix). */
  const char *ntasks = getenv("SLURM_STEP_NUM_TASKS");
  if (env_set("SLURM_PROCID") && ntasks != NULL && atoi(ntasks) > 1)
    return DT_LAUNCHER_SLURM_NO_PMI;
  return DT_LAUNCHER_NONE;
}

const char *dt_launcher_name(dt_launcher l) {
  switch (l) {
    case DT_LAUNCHER_NONE: return "no launcher";
    case DT_LAUNCHER_OPEN_MPI: return "Open MPI mpirun";
    case DT_LAUNCHER_PMIX: return "PMIx (srun --mpi=pmix)";
    case DT_LAUNCHER_PMI: return "PMI";
    case DT_LAUNCHER_SLURM_NO_PMI: return "srun without an MPI plugin";
  }
  return "unknown launcher";
}

static const char *thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "unknown";
}

static dt_status init_mpi_steps(dt_pg *pg);

/* MPI start-up under a deadline (see dist/guard.h). */
static dt_status init_mpi(dt_pg *pg, double timeout_s) {
  dt_guard *g = NULL;
  DT_CHECK(dt_guard_begin(pg, "MPI start-up (MPI_Init_thread, MPI_Comm_dup, MPI_Comm_split_type)",
                          timeout_s, &g));
  dt_status st = init_mpi_steps(pg);
  dt_guard_end(g);
  return st;
}

static dt_status init_mpi_steps(dt_pg *pg) {
  int initialized = 0;
  DT_MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    /* MPI may look at argv; it does not need ours. */
    int provided = MPI_THREAD_SINGLE;
    DT_MPI_CHECK(MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided));
    pg->initialized_mpi = 1;
    pg->thread_level = provided;
  } else {
    DT_MPI_CHECK(MPI_Query_thread(&pg->thread_level));
  }
  if (pg->thread_level < MPI_THREAD_SERIALIZED)
    return DT_ERROR(DT_ERR_MPI,
                    "MPI provides only %s: dtrain runs collectives on a communication "
                    "thread and needs MPI_THREAD_SERIALIZED or better (rebuild or choose an "
                    "MPI with thread support)",
                    thread_level_name(pg->thread_level));
  DT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &pg->world_comm));
  DT_MPI_CHECK(MPI_Comm_set_errhandler(pg->world_comm, MPI_ERRORS_RETURN));
  DT_MPI_CHECK(MPI_Comm_rank(pg->world_comm, &pg->rank));
  DT_MPI_CHECK(MPI_Comm_size(pg->world_comm, &pg->world));
  MPI_Comm node = MPI_COMM_NULL;
  DT_MPI_CHECK(
      MPI_Comm_split_type(pg->world_comm, MPI_COMM_TYPE_SHARED, pg->rank, MPI_INFO_NULL, &node));
  int rc1 = MPI_Comm_rank(node, &pg->local_rank);
  int rc2 = MPI_Comm_size(node, &pg->local_size);
  if (rc1 == MPI_SUCCESS && rc2 == MPI_SUCCESS && pg->world > 1)
    dt_pg_table_open(pg, node);
  MPI_Comm_free(&node);
  DT_MPI_CHECK(rc1);
  DT_MPI_CHECK(rc2);
  return DT_OK;
}

dt_status dt_pg_create(const dt_pg_config *cfg, dt_pg **out) {
  if (out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "creating a process group: out is NULL");
  *out = NULL;
  dt_pg_config c = cfg ? *cfg : DT_PG_CONFIG_DEFAULT;
  dt_pg *pg = calloc(1, sizeof *pg);
  if (pg == NULL)
    return DT_ERROR(DT_ERR_OOM, "creating a process group: out of host memory");
  pg->world = 1;
  pg->local_size = 1;
  pg->thread_level = -1;
  pg->world_comm = MPI_COMM_NULL;
  pthread_mutex_init(&pg->mpi_lock, NULL);
  if (gethostname(pg->host, sizeof pg->host - 1) != 0)
    snprintf(pg->host, sizeof pg->host, "localhost");
  pg->launcher = dt_pg_detect_launcher();
  pg->timeout_s = c.init_timeout_s;

  dt_status st = DT_OK;
  if (c.mode == DT_PG_AUTO && pg->launcher == DT_LAUNCHER_SLURM_NO_PMI) {
    st = DT_ERROR(DT_ERR_INVALID_ARG,
                  "this process is one of %s Slurm tasks but no MPI launcher environment "
                  "(PMIx/PMI) is present, so the tasks cannot find each other: start the "
                  "step with `srun --mpi=pmix`, or run mpirun inside the allocation",
                  getenv("SLURM_STEP_NUM_TASKS"));
    goto destroy_pg;
  }
  int want_mpi = c.mode == DT_PG_MPI || (c.mode == DT_PG_AUTO && pg->launcher != DT_LAUNCHER_NONE);
  if (want_mpi) {
    pg->uses_mpi = 1;
    st = init_mpi(pg, c.init_timeout_s);
    if (st != DT_OK) {
      st = dt_error_wrap(st, "joining the MPI job (%s)", dt_launcher_name(pg->launcher));
      goto destroy_pg;
    }
  }
  pg->ready = 1;
  *out = pg;
  return DT_OK;

destroy_pg:
  dt_pg_destroy(pg);
  return st;
}

void dt_pg_destroy(dt_pg *pg) {
  if (pg == NULL)
    return;
  /* MPI_Finalize is no barrier under Open MPI: a rank stopped (SIGSTOP) in
   * its teardown after the last collective would keep mpirun waiting for
   * ever once the others had exited. So the ranks meet first, under the
   * start-up deadline: a rank that does not arrive ends the job, named. */
  int several = pg->ready && pg->uses_mpi && pg->world > 1 && pg->world_comm != MPI_COMM_NULL;
  if (several) {
    dt_pg_set_phase(pg, "the end of the job (the barrier before MPI_Finalize)");
    dt_guard *g = NULL;
    if (dt_guard_begin(pg, "the end of the job (a barrier of every rank before MPI_Finalize)",
                       pg->timeout_s, &g) == DT_OK) {
      MPI_Barrier(pg->world_comm); /* errors return: a failed peer ends it anyway */
      dt_guard_end(g);
    } else {
      dt_clear_error();
    }
    dt_pg_set_phase(pg, "the end of the job (past the barrier, before MPI_Finalize)");
  }
  if (pg->world_comm != MPI_COMM_NULL)
    MPI_Comm_free(&pg->world_comm);
  int finalized = 0;
  if (pg->initialized_mpi)
    MPI_Finalized(&finalized);
  if (pg->initialized_mpi && !finalized) {
    /* Open MPI's MPI_Finalize waits for every rank (a fence through
     * mpirun): one stopped after the barrier would hold this rank in it
     * for ever. Past the deadline this rank exits 70, naming it, and
     * mpirun ends the job. */
    dt_guard *g = NULL;
    if (several) {
      dt_pg_set_phase(pg, "the end of the job (MPI_Finalize)");
      if (dt_guard_begin_finalize(pg, "the end of the job (MPI_Finalize, every rank)",
                                  pg->timeout_s, &g) != DT_OK)
        dt_clear_error();
    }
    MPI_Finalize();
    dt_guard_end(g);
  }
  dt_pg_table_close(pg);
  pthread_mutex_destroy(&pg->mpi_lock);
  free(pg);
}

int dt_pg_rank(const dt_pg *pg) { return pg->rank; }
int dt_pg_world_size(const dt_pg *pg) { return pg->world; }
int dt_pg_local_rank(const dt_pg *pg) { return pg->local_rank; }
int dt_pg_local_size(const dt_pg *pg) { return pg->local_size; }
const char *dt_pg_host(const dt_pg *pg) { return pg->host; }
int dt_pg_uses_mpi(const dt_pg *pg) { return pg->uses_mpi; }
int dt_pg_mpi_thread_level(const dt_pg *pg) { return pg->thread_level; }

char *dt_pg_describe(const dt_pg *pg, char *buf, unsigned long cap) {
  snprintf(buf, cap, "rank %d/%d (local %d/%d) on %s via %s", pg->rank, pg->world, pg->local_rank,
           pg->local_size, pg->host,
           pg->uses_mpi ? dt_launcher_name(pg->launcher) : "a single process");
  return buf;
}

void dt_pg_abort(const dt_pg *pg, int code) {
  fflush(stdout);
  fflush(stderr);
  if (pg != NULL && pg->uses_mpi)
    MPI_Abort(MPI_COMM_WORLD, code);
  abort();
}

void dt_pg_mpi_lock(dt_pg *pg) {
  if (pg->thread_level < MPI_THREAD_MULTIPLE)
    pthread_mutex_lock(&pg->mpi_lock);
}

void dt_pg_mpi_unlock(dt_pg *pg) {
  if (pg->thread_level < MPI_THREAD_MULTIPLE)
    pthread_mutex_unlock(&pg->mpi_lock);
}
