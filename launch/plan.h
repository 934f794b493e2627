/* dtrain plan (launch/plan.c; the model: train/plan.h). */
#ifndef DT_LAUNCH_PLAN_H
#define DT_LAUNCH_PLAN_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* `dtrain plan` with the arguments after the command: 0, 1 with the
 * error on `err`, 2 for a bad command line. */
int dt_cli_plan(int argc, char **argv, FILE *err);

#ifdef __cplusplus
}
#endif
#endif
