/* `dtrain eval --checkpoint PATH`: the test metrics of a checkpoint. */
#ifndef DT_LAUNCH_EVAL_H
#define DT_LAUNCH_EVAL_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* argv holds the arguments after "eval". PATH is a checkpoint directory or
 * a run directory (its newest complete checkpoint). Prints
 * "test_loss=... test_<metric>=..." on stdout. Returns the exit status: 0,
 * 1 on a failure (the message printed), 2 on a bad command line. */
int dt_cli_eval(int argc, char **argv, FILE *err);

#ifdef __cplusplus
}
#endif
#endif
