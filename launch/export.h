/* `dtrain export --checkpoint PATH --format hf --out DIR`: a language
 * model's checkpoint in a layout that other tools read as a model. */
#ifndef DT_LAUNCH_EXPORT_H
#define DT_LAUNCH_EXPORT_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* argv holds the arguments after "export". Rebuilds the checkpoint's
 * model (at its --ctx), loads its weights and writes the --format's files
 * (hf: models/hf_export.h) under --out, the tokenizer from
 * --data-dir/gpt2. Exit status: 0; 1 for a checkpoint that is missing,
 * damaged or not of a GPT-2 or Llama model, or an --out that cannot be
 * written (a file, say); 2 for a bad command line (no --out, an unknown
 * --format). */
int dt_cli_export(int argc, char **argv, FILE *err);

#ifdef __cplusplus
}
#endif
#endif
