/* `dtrain launch`: the workstation launcher. Runs the dtrain binary itself
 * under Open MPI's mpirun with sensible binding and threads per rank:
 *
 *   dtrain launch [-n N] [--hosts h1,h2 | --hostfile F] [--threads C]
 *                 [--mpirun-arg ARG]... [--dry-run] -- train ...
 *
 * runs, in a child it waits for (launch/job_watch.h: it forwards the
 * signals sent to the launcher, and ends a job whose rank is still there
 * --comm-timeout seconds, 5 at least, after another rank exited, exit 70),
 *
 *   mpirun -np N --bind-to none --map-by slot -x OMP_NUM_THREADS=C
 *          -x DT_NUM_THREADS=C [-x DT_*]... [-x CUDA_VISIBLE_DEVICES]
 *          [-x NCCL_*]... [--oversubscribe]
 *          [--allow-run-as-root] [--host ... | --hostfile ...] [ARG...]
 *          /path/to/dtrain train ...
 *
 * Each -x names a variable set in this environment: every DT_* variable
 * of core/env_params.def (the test ones aside), CUDA_VISIBLE_DEVICES (even
 * when empty) and every NCCL_*. Without -n, N is the number
 * of visible GPUs (dt_device_count(DT_DEVICE_CUDA)): one rank per GPU, each
 * taking the GPU of its local rank with `--device cuda`; with no GPU, or
 * with --hosts / --hostfile, -n is required (exit 2). The README's default
 * job passes -n 2 itself (the ./dtrain wrapper).
 *
 * with C = max(1, cores / N) where cores is what sched_getaffinity allows
 * this process (or --threads C); --oversubscribe when N > cores (mpirun
 * counts slots per physical core and refuses otherwise), --allow-run-as-root
 * when running as root. The command line is printed to stderr first.
 */
#ifndef DT_LAUNCH_LAUNCHER_H
#define DT_LAUNCH_LAUNCHER_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* argv holds the arguments after "launch"; command-line errors go to
 * `err`. Returns the exit status: mpirun's (128 + N when a signal ended
 * it), 70 when the end-of-job watch ended the job, 2 for a bad command
 * line, 1 when mpirun is missing or a DT_* variable is bad, 0 after
 * --dry-run. */
int dt_cli_launch(int argc, char **argv, FILE *err);
/* The CPUs this process may use (its affinity mask; else the online ones). */
int dt_cli_cores_available(void);

/* The mpirun dtrain launch runs: DT_MPIRUN when set (NULL unless it is an
 * executable file), else the first executable `mpirun` on PATH (copied into
 * buf), else NULL. */
const char *dt_cli_find_mpirun(char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
