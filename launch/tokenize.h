/* `dtrain tokenize`: text files and folders to GPT-2 token shards in
 * llm.c's format (train.bin, val.bin), with dtrain's own tokenizer. */
#ifndef DT_LAUNCH_TOKENIZE_H
#define DT_LAUNCH_TOKENIZE_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* argv holds the arguments after "tokenize". Returns the exit status: 0
 * (after --help too), 1 on a failure, 2 on a bad command line; messages go
 * to `err`. */
int dt_cli_tokenize(int argc, char **argv, FILE *err);

#ifdef __cplusplus
}
#endif
#endif
