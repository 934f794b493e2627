/* `dtrain doctor`: what this build can use on this machine (devices, CPU
 * threads, memory cap, GPUs, data sets, mpirun, the DT_* environment), so
 * a failing run can be diagnosed, and one verdict on the default job. */
#ifndef DT_LAUNCH_DOCTOR_H
#define DT_LAUNCH_DOCTOR_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* argv holds the arguments after "doctor"; flag errors go to `err`. Prints
 * the report to stdout, ending with one `verdict:` line. Returns the exit
 * status: 0 when the default job can run, 1 when something it needs is
 * missing (named in the verdict), 2 for bad flags. */
int dt_cli_doctor(int argc, char **argv, FILE *err);

#ifdef __cplusplus
}
#endif
#endif
