/* Failure scenarios for dist_fault_test.sh, run under mpirun:
 *   dist_fault_tool stuck TIMEOUT   the last rank stops calling collectives;
 *                                   the others' watchdog must abort the job
 *   dist_fault_tool kill            the last rank dies (SIGKILL) mid-job;
 *                                   mpirun must end the job (watchdog 120 s)
 *   dist_fault_tool late TIMEOUT    the last rank stalls before creating the
 *                                   communicator (as if still loading data);
 *                                   the others, blocked in MPI_Comm_dup, must
 *                                   name it and abort the job
 *   dist_fault_tool die TIMEOUT     the last rank dies (SIGKILL) in the middle
 *                                   of a large all-reduce; the others must
 *                                   fail it naming the dead rank, well within
 *                                   TIMEOUT (run under mpirun
 *                                   --enable-recovery, which lets them)
 *   dist_fault_tool die-shared TIMEOUT  the same, the all-reduce in place
 *                                   over a buffer the ranks share
 *                                   (dt_comm_shared_buffer, as DDP's
 *                                   gradients): the survivors read the dead
 *                                   rank's part while it dies
 *   dist_fault_tool stop-at-end TIMEOUT  after the last collective the last
 *                                   rank stops (SIGSTOP) before the end of
 *                                   the job: the others, at dt_pg_destroy's
 *                                   barrier, must name it and end the job
 *                                   (else they exit and mpirun waits for
 *                                   ever on the stopped rank)
 *   dist_fault_tool stop-in-finalize TIMEOUT  the last rank stops as it
 *                                   enters MPI_Finalize (this program's
 *                                   MPI_Finalize, MPI's profiling
 *                                   interface, wraps the library's): Open
 *                                   MPI's MPI_Finalize waits for every
 *                                   rank, so the others, in theirs, must
 *                                   name it and end the job
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist/comm.h"
#include "dist/process_group.h"

static int stop_in_finalize; /* this rank stops as it enters MPI_Finalize */

int MPI_Finalize(void) {
  if (stop_in_finalize)
    raise(SIGSTOP);
  return PMPI_Finalize();
}

static int fail(const char *what) {
  fprintf(stderr, "dist_fault_tool: %s: %s\n", what, dt_last_error());
  return 1;
}

/* A 64 MiB all-reduce, which the last rank leaves by dying a moment after
 * it began: the others must fail it, naming the dead rank, long before the
 * deadline. */
static int die_mid_collective(dt_comm *comm, int victim, int shared, double timeout_s) {
  int64_t n = 16 << 20;
  dt_tensor *big = NULL, *ones = NULL;
  if (dt_tensor_full(&n, 1, 1.0f, DT_CPU, &ones) != DT_OK)
    return fail("tensor");
  if (shared) {
    if (dt_comm_shared_buffer(comm, n, DT_DTYPE_F32, &big) != DT_OK || big == NULL)
      return fail("shared buffer");
    if (dt_tensor_copy_(big, ones) != DT_OK)
      return fail("filling the shared buffer");
    dt_tensor_release(ones);
  } else {
    big = ones;
  }
  dt_work *w = NULL;
  if (dt_comm_allreduce(comm, big, DT_REDUCE_SUM, NULL, &w) != DT_OK)
    return fail("allreduce");
  if (victim) {
    struct timespec pause = {0, 2000000L};
    nanosleep(&pause, NULL);
    raise(SIGKILL);
  }
  double start = dt_comm_now();
  dt_status st = dt_work_wait(w, 0);
  double took = dt_comm_now() - start;
  dt_work_release(w);
  dt_tensor_release(big);
  if (st == DT_OK) {
    printf("rank %d: finished without noticing the failure\n", dt_comm_rank(comm));
    return 0;
  }
  fprintf(stderr,
          "dist_fault_tool: rank %d: allreduce failed after %.1f s of a %g s deadline: %s\n",
          dt_comm_rank(comm), took, timeout_s, dt_last_error());
  return 1;
}

int main(int argc, char **argv) {
  static const char *const modes[] = {
      "stuck", "kill", "late", "die", "die-shared", "stop-at-end", "stop-in-finalize"};
  int known = 0;
  for (size_t i = 0; argc >= 2 && i < sizeof modes / sizeof modes[0]; i++)
    known = known || strcmp(argv[1], modes[i]) == 0;
  if (!known) {
    fprintf(stderr,
            "usage: dist_fault_tool stuck TIMEOUT_S | kill | late TIMEOUT_S | die "
            "TIMEOUT_S | die-shared TIMEOUT_S | stop-at-end TIMEOUT_S | stop-in-finalize "
            "TIMEOUT_S\n");
    return 2;
  }
  int stuck = strcmp(argv[1], "stuck") == 0, late = strcmp(argv[1], "late") == 0;
  int shared = strcmp(argv[1], "die-shared") == 0;
  int die = strcmp(argv[1], "die") == 0 || shared;
  int at_finalize = strcmp(argv[1], "stop-in-finalize") == 0;
  int stop_at_end = strcmp(argv[1], "stop-at-end") == 0 || at_finalize;
  dt_pg *pg = NULL;
  dt_pg_config pc = DT_PG_CONFIG_DEFAULT;
  pc.mode = DT_PG_MPI;
  if (stop_at_end)
    pc.init_timeout_s = atof(argc > 2 ? argv[2] : "3");
  if (dt_pg_create(&pc, &pg) != DT_OK)
    return fail("process group");
  dt_comm_config cc = DT_COMM_CONFIG_DEFAULT;
  cc.timeout_s = stuck || late || die ? atof(argc > 2 ? argv[2] : "3") : 120.0;
  if (late && dt_pg_rank(pg) == dt_pg_world_size(pg) - 1)
    sleep(120); /* never reaches the communicator's creation in time */
  dt_comm *comm = NULL;
  if (dt_comm_create_mpi(pg, &cc, &comm) != DT_OK)
    return fail("communicator");
  int rank = dt_pg_rank(pg), last = dt_pg_world_size(pg) - 1;
  int64_t n = 1024;
  dt_tensor *t = NULL;
  if (dt_tensor_full(&n, 1, 1.0f, DT_CPU, &t) != DT_OK)
    return fail("tensor");
  if (dt_comm_allreduce_sync(comm, t, DT_REDUCE_SUM) != DT_OK)
    return fail("first allreduce");
  printf("rank %d: first allreduce done\n", rank);
  fflush(stdout);
  if (die)
    return die_mid_collective(comm, rank == last, shared, cc.timeout_s);
  if (stop_at_end) {
    dt_tensor_release(t);
    dt_comm_destroy(comm);
    if (rank == last && at_finalize)
      stop_in_finalize = 1; /* past the barrier too */
    else if (rank == last)
      raise(SIGSTOP); /* the others are past every collective */
    dt_pg_destroy(pg);
    printf("rank %d: left the job without noticing the stopped rank\n", rank);
    return 0;
  }
  if (rank == last) {
    if (stuck) {
      sleep(120); /* stops calling collectives */
    } else {
      raise(SIGKILL);
    }
  }
  for (int i = 0; i < 1000; i++) {
    dt_work *w = NULL;
    if (dt_comm_allreduce(comm, t, DT_REDUCE_SUM, NULL, &w) != DT_OK)
      return fail("allreduce");
    dt_status st = dt_work_wait(w, 0);
    dt_work_release(w);
    if (st != DT_OK)
      return fail("allreduce wait");
  }
  printf("rank %d: finished without noticing the failure\n", rank);
  dt_tensor_release(t);
  dt_comm_destroy(comm);
  dt_pg_destroy(pg);
  return 0;
}
