/* `dtrain export`: the checkpoint's model rebuilt and loaded as dtrain
 * eval and sample do (launch/eval.h), then written by the format's
 * library (models/hf_export.h). */
#include "launch/export.h"

#include <string.h>
#include <sys/stat.h>

#include "core/env.h"
#include "core/status.h"
#include "launch/eval.h"
#include "launch/flags.h"
#include "models/hf_export.h"

static dt_status export_work(void *arg) {
  dt_cli_ckpt_args *a = arg;
  if (!strcmp(a->format, "gguf"))
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "--format gguf: the GGUF export is not written yet; --format hf writes the "
                    "Hugging Face layout");
  struct stat sb;
  if (stat(a->out, &sb) == 0 && !S_ISDIR(sb.st_mode))
    return DT_ERROR(DT_ERR_IO,
                    "--out %s exists and is not a directory: --format hf writes a folder", a->out);
  dt_cli_ckpt_model m;
  dt_status st = dt_cli_ckpt_model_open(a->checkpoint, a->device, "export", &m);
  char tokenizer[4200];
  snprintf(tokenizer, sizeof tokenizer, "%s/%s", a->data_dir,
           m.task.tokenizer ? m.task.tokenizer : "gpt2");
  if (st == DT_OK)
    st = dt_hf_export(&m.task, m.module, tokenizer, a->out);
  if (st == DT_OK)
    printf(
        "dtrain export: checkpoint %s (model %s, context %lld, optimizer step %s) -> %s "
        "(Hugging Face layout)\n",
        m.dir, m.model, (long long)m.task.input_shape[0], m.step, a->out);
  dt_cli_ckpt_model_close(&m);
  return st;
}

int dt_cli_export(int argc, char **argv, FILE *err) {
  dt_cli_ckpt_args a = {NULL, "data", "cpu", 1, DT_SAMPLE_CONFIG_DEFAULT, NULL, NULL, 2};
  dt_env_string(DT_ENV_DATA_DIR, &a.data_dir);
  dt_flag own[] = {
      DT_CHOICE_FLAG("format", &a.format, "FORMAT",
                     "hf: config.json, model.safetensors and the tokenizer files of "
                     "transformers (GPT2LMHeadModel, LlamaForCausalLM); gguf: not yet",
                     "hf|gguf"),
      DT_STRING_FLAG("out", &a.out, "DIR", "the folder the files go to (created when missing)"),
  };
  dt_flag_set set = {
      .command = "export",
      .usage = "export --checkpoint PATH --format hf --out DIR [flags]",
      .about =
          "Writes a language model's checkpoint (gpt2-*, llama-*) in the Hugging Face\n"
          "layout: config.json, generation_config.json, model.safetensors with\n"
          "transformers' names and shapes, vocab.json and merges.txt (GPT-2's BPE from\n"
          "--data-dir/gpt2). Exit status: 0, 1 when it fails (a missing or damaged\n"
          "checkpoint, a model other than GPT-2 or Llama, an --out that is a file), 2 for\n"
          "a bad command line.",
  };
  return dt_cli_checkpoint_command(&set, &a, own, 2, argc, argv, err, export_work);
}
