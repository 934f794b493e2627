/* dtrain plan on the CPU for several ranks per node: the other ranks' load.
 *
 * The ranks of a node share its memory system, caches and cores' turbo
 * budget: two ranks of GPT-tiny on this 2-core machine run their forward
 * 1.3 times and their AdamW update 1.7 times slower than one rank alone.
 * So the probe of a plan for R ranks per node on `cpu` measures with the
 * other R - 1 ranks' load running: R - 1 copies of `dtrain plan` with the
 * same flags and --probe-load, each running the probe's own steps
 * (dt_plan_probe_load) until the plan closes its stdin.
 *
 *   dt_cli_plan_load load;
 *   if (dt_cli_plan_load_start(ranks - 1, argc, argv, &load, err) != 0) ... fail
 *   ... dt_plan_probe ...
 *   dt_cli_plan_load_stop(&load);
 */
#ifndef DT_LAUNCH_PLAN_LOAD_H
#define DT_LAUNCH_PLAN_LOAD_H

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#define DT_CLI_PLAN_LOAD_MAX 255 /* copies at most (ranks per node - 1) */

typedef struct dt_cli_plan_load {
  int n;
  pid_t pid[DT_CLI_PLAN_LOAD_MAX];
  int stop_fd[DT_CLI_PLAN_LOAD_MAX];  /* the copy's stdin: closed to stop it */
  int ready_fd[DT_CLI_PLAN_LOAD_MAX]; /* its stdout: a byte once its first step is done */
} dt_cli_plan_load;

/* The copies for `ranks` ranks a node of `threads` threads each on a
 * machine of `cores` CPUs: ranks - 1, but no more than the other ranks
 * that have cores of their own (cores / threads - 1): ranks beyond the
 * cores would oversubscribe them, which the probe does not reproduce (nor
 * start that many replicas of a large model on a small machine). */
int dt_cli_plan_load_copies(int ranks, int threads, int cores);
/* Starts `copies` copies of `dtrain plan <argv> --probe-load` (argv: plan's
 * flags) and waits until each has run its first step. -1 (a message on
 * err, none left running) when one cannot start or ends before that. */
int dt_cli_plan_load_start(int copies, int argc, char **argv, dt_cli_plan_load *l, FILE *err);
/* Stops the copies (their stdin closed) and reaps them. */
void dt_cli_plan_load_stop(dt_cli_plan_load *l);
/* A copy's go_on for dt_plan_probe_load: says ready on its stdout after
 * the first step; true until its stdin ends. */
bool dt_cli_plan_load_go_on(void *user, int steps);

#endif
