/* `dtrain tokenize`: text files and folders to GPT-2 token shards in
 * llm.c's format (train.bin, val.bin), with dtrain's own tokenizer. */
#ifndef DT_LAUNCH_TOKENIZE_H
#define DT_LAUNCH_TOKENIZE_H

#ifdef __cplusplus
extern "C" {
#endif

/* argv holds the arguments after "tokenize". Returns the exit status: 0,
 * 1 on a failure (the message printed), 2 on a bad command line. */
int dt_cli_tokenize(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
