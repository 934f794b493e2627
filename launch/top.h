/* `dtrain top`: a live view of this machine's GPUs (NVML,
 * launch/gpu_monitor.h) and of the ranks of running dtrain jobs (their
 * status files, launch/job_status.h), like nvtop/gpustat.
 *
 *   dtrain top [--interval S] [--once] [--status-dir DIR]
 *
 * Without a GPU it says why there is none to show ("GPU monitor
 * unavailable: ..."); without a running job it says where it looked. */
#ifndef DT_LAUNCH_TOP_H
#define DT_LAUNCH_TOP_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* argv: the arguments after "top". Exit status: 0, 1 on a failure (the
 * message printed to err), 2 on a bad command line. */
int dt_cli_top(int argc, char **argv, FILE *err);

#ifdef __cplusplus
}
#endif
#endif
