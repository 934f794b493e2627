/* Text from a language model: `dtrain train`'s samples for tasks whose
 * inputs are tokens (models/tasks.h: task->tokenizer).
 *
 *   dt_sample_config sc = DT_SAMPLE_CONFIG_DEFAULT;
 *   sc.prompt = "The jury said";
 *   char *text = NULL;
 *   DT_CHECK(dt_sample_text(model, task, dev, "data", &sc, &text));
 *   printf("%s\n", text);
 *   free(text);
 *
 * Autoregressive: the prompt's tokens (GPT-2's BPE from data_dir/gpt2), or
 * <|endoftext|> for an empty prompt, then `length` tokens, each drawn from
 * the model's next-token distribution over the last T (the task's
 * context) tokens: logits / temperature, restricted to the top_k most
 * likely (ties at the k-th value kept), softmax, one draw from a generator
 * seeded with `seed`: the same seed, model and prompt give the same text
 * on every run and device ordering. temperature 0 takes the most likely
 * token (greedy). The model runs in eval mode without grad (its training
 * flag is restored).
 */
#ifndef DT_TRAIN_SAMPLE_H
#define DT_TRAIN_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "core/module.h"
#include "core/status.h"
#include "models/tasks.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_sample_config {
  const char *prompt; /* "" = start from <|endoftext|> */
  int length;         /* tokens generated; 0 = no samples */
  int every;          /* dtrain train: optimizer steps between samples, 0 = at the end only */
  float temperature;  /* 0 = greedy */
  int top_k;          /* 0 = the whole vocabulary */
  uint64_t seed;
  /* Streaming: when set, the text's bytes go to emit as they are drawn
   * (the prompt's first, then each token's; a token's bytes may end
   * inside a UTF-8 character) and dt_sample_text's out may be NULL. A
   * non-OK status from emit (a full disk, a closed pipe) ends the
   * sampling with that status. */
  dt_status (*emit)(void *ctx, const char *bytes, size_t n);
  void *emit_ctx;
} dt_sample_config;
#define DT_SAMPLE_CONFIG_DEFAULT ((dt_sample_config){"", 64, 0, 1.0f, 40, 0, NULL, NULL})

/* The prompt and its continuation as text (*out: malloc'd, NUL-terminated;
 * the caller frees it; with cfg->emit set, the text goes there instead and
 * out, if given, stays NULL). Errors: a task without a tokenizer or sequence
 * input, a negative length or temperature (DT_ERR_INVALID_ARG), the
 * tokenizer files (DT_ERR_IO / DT_ERR_FORMAT), the model's. */
dt_status dt_sample_text(dt_module *model, const dt_task *task, dt_device dev, const char *data_dir,
                         const dt_sample_config *cfg, char **out);

#ifdef __cplusplus
}
#endif
#endif
