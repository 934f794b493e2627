/* A language model of the zoo in the Hugging Face layout (transformers'
 * from_pretrained reads it):
 *   config.json             GPT2LMHeadModel or LlamaForCausalLM, the sizes
 *                           of the model at the task's context
 *   generation_config.json  BOS and EOS (GPT-2's <|endoftext|>, 50256)
 *   model.safetensors       f32 tensors under transformers' names:
 *     GPT-2  transformer.{wte,wpe,ln_f}, transformer.h.N.{ln_1, attn.c_attn,
 *            attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}; the Conv1D weights
 *            transposed to (in, out); the head tied to wte (not stored)
 *     Llama  model.{embed_tokens,norm}, model.layers.N.{input_layernorm,
 *            self_attn.{q,k,v,o}_proj, post_attention_layernorm,
 *            mlp.{gate,up,down}_proj}, lm_head when untied; the RoPE is
 *            already HF's rotate_half, so q and k are as trained
 *     the token tables (and an untied head) cut to the real vocabulary
 *   vocab.json, merges.txt  GPT-2's BPE (tokenizer_dir's encoder.json and
 *   tokenizer_config.json   vocab.bpe), GPT2Tokenizer
 * Other formats (GGUF) belong beside it, as their own file. */
#ifndef DT_MODELS_HF_EXPORT_H
#define DT_MODELS_HF_EXPORT_H

#include "core/module.h"
#include "core/status.h"
#include "models/tasks.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes `model` (built by `task`, a gpt2-* or llama-* language model, at
 * the task's context) into the folder `dir` (created when missing; files
 * written atomically), the tokenizer files copied from tokenizer_dir.
 * DT_ERR_INVALID_ARG for a task that is neither (naming it), DT_ERR_IO
 * naming the file that cannot be read or written. */
dt_status dt_hf_export(const dt_task *task, const dt_module *model, const char *tokenizer_dir,
                       const char *dir);

/* The inverse, for fine-tuning: dir/model.safetensors (as dt_hf_export
 * writes it; F32 tensors, names with or without the transformer./model.
 * prefix) loaded into `model`, freshly built by `task`: the Conv1D weights
 * transposed back, the token tables' rows past the file's vocabulary (the
 * padding) left as the model initialised them. DT_ERR_INVALID_ARG naming
 * the tensor that is missing, extra (another size or architecture), of
 * another shape or dtype; DT_ERR_IO naming the file. */
dt_status dt_hf_import(const dt_task *task, dt_module *model, const char *dir);

#ifdef __cplusplus
}
#endif
#endif
