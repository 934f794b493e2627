/* Commands over a checkpoint's model: `dtrain eval --checkpoint PATH` (the
 * test metrics) and `dtrain sample --checkpoint PATH` (text from a language
 * model). */
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

/* argv holds the arguments after "sample". Rebuilds the checkpoint's
 * language model (at the checkpoint's --ctx), loads its weights and prints
 * the prompt and its continuation on stdout (what one line about the
 * checkpoint and the settings goes to stderr); the same checkpoint,
 * prompt, settings and --sample-seed give the same text. Exit status: 0;
 * 1 for a checkpoint that is missing, damaged or not of a language model;
 * 2 for a bad command line (an empty --prompt, which has no tokens,
 * included: without --prompt the text starts from <|endoftext|>). */
int dt_cli_sample(int argc, char **argv, FILE *err);

#ifdef __cplusplus
}
#endif
#endif
