/* `dtrain export`: the checkpoint's model rebuilt and loaded as dtrain
 * eval and sample do (launch/eval.h), then written by the format's
 * library (models/hf_export.h, models/gguf_export.h). */
#include "launch/export.h"

#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>

#include "core/env.h"
#include "core/status.h"
#include "launch/eval.h"
#include "launch/flags.h"
#include "models/gguf_export.h"
#include "models/hf_export.h"

static dt_status export_work(void *arg) {
  dt_cli_ckpt_args *a = arg;
  const bool gguf = !strcmp(a->format, "gguf");
  struct stat sb;
  if (gguf && stat(a->out, &sb) == 0 && S_ISDIR(sb.st_mode))
    return DT_ERROR(DT_ERR_IO, "--out %s is a directory: --format gguf writes one file", a->out);
  if (!gguf && strcmp(a->dtype, "f32"))
    return DT_ERROR(DT_ERR_INVALID_ARG, "--dtype %s: --format hf writes f32 only", a->dtype);
  if (!gguf && stat(a->out, &sb) == 0 && !S_ISDIR(sb.st_mode))
    return DT_ERROR(DT_ERR_IO,
                    "--out %s exists and is not a directory: --format hf writes a folder", a->out);
  dt_cli_ckpt_model m;
  dt_status st = dt_cli_ckpt_model_open(a->checkpoint, a->device, "export", &m);
  char tokenizer[4200];
  snprintf(tokenizer, sizeof tokenizer, "%s/%s", a->data_dir,
           m.task.tokenizer ? m.task.tokenizer : "gpt2");
  if (st == DT_OK)
    st = gguf ? dt_gguf_export(&m.task, m.module, tokenizer, a->dtype, a->out)
              : dt_hf_export(&m.task, m.module, tokenizer, a->out);
  if (st == DT_OK)
    printf("dtrain export: checkpoint %s (model %s, context %lld, optimizer step %s) -> %s (%s)\n",
           m.dir, m.model, (long long)m.task.input_shape[0], m.step, a->out,
           gguf ? "GGUF" : "Hugging Face layout");
  dt_cli_ckpt_model_close(&m);
  return st;
}

int dt_cli_export(int argc, char **argv, FILE *err) {
  dt_cli_ckpt_args a = {NULL, "data", "cpu", 1, DT_SAMPLE_CONFIG_DEFAULT, NULL, NULL, 2, "f32"};
  dt_env_string(DT_ENV_DATA_DIR, &a.data_dir);
  dt_flag own[] = {
      DT_CHOICE_FLAG("format", &a.format, "FORMAT",
                     "hf: config.json, model.safetensors and the tokenizer files of "
                     "transformers (GPT2LMHeadModel, LlamaForCausalLM); gguf: one GGUF v3 file "
                     "llama.cpp reads, GPT-2's tokenizer inside",
                     "hf|gguf"),
      DT_STRING_FLAG("out", &a.out, "PATH",
                     "hf: the folder the files go to (created when missing); gguf: the file"),
      DT_CHOICE_FLAG("dtype", &a.dtype, "DTYPE",
                     "gguf: the matrices' type (vectors stay f32); hf writes f32 (default f32)",
                     "f32|f16|bf16"),
  };
  dt_flag_set set = {
      .command = "export",
      .usage = "export --checkpoint PATH --format hf|gguf --out PATH [--dtype f32|f16|bf16]",
      .about =
          "Writes a language model's checkpoint (gpt2-*, llama-*) in the Hugging Face\n"
          "layout: config.json, generation_config.json, model.safetensors with\n"
          "transformers' names and shapes, vocab.json and merges.txt (GPT-2's BPE from\n"
          "--data-dir/gpt2); or one GGUF v3 file (architecture gpt2 or llama, GPT-2's\n"
          "tokenizer inside) that llama.cpp loads. Exit status: 0, 1 when it fails (a\n"
          "missing or damaged checkpoint, a model other than GPT-2 or Llama, an --out of\n"
          "the wrong kind), 2 for a bad command line.",
  };
  return dt_cli_checkpoint_command(&set, &a, own, 3, argc, argv, err, export_work);
}
