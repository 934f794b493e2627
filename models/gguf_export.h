/* A language model of the zoo as one GGUF v3 file (llama.cpp reads it):
 *   general.architecture "gpt2" or "llama" and the sizes of the model at the
 *   task's context (counts u32, epsilons f32);
 *   GPT-2's BPE inside (tokenizer.ggml.model "gpt2", pre "gpt-2", the tokens
 *   from encoder.json in the byte-to-unicode form, <|endoftext|> (50256) a
 *   control token, BOS and EOS, the merges of vocab.bpe, no BOS added);
 *   the tensors under llama.cpp's names (token_embd, position_embd,
 *   output_norm, output when untied, blk.N.{attn_norm, attn_qkv, attn_q,
 *   attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}),
 *   ggml's dimensions being the reverse of dtrain's shapes; the token tables
 *   (and an untied head) cut to the 50257 real tokens; Llama's q and k rows
 *   permuted per head (k with the KV head count) from Hugging Face's
 *   rotate_half RoPE, which dtrain trains, to llama.cpp's interleaved pairs;
 *   matrices in the chosen dtype (f32, f16, bf16), vectors in f32; every
 *   offset padded to 32 bytes. */
#ifndef DT_MODELS_GGUF_EXPORT_H
#define DT_MODELS_GGUF_EXPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/module.h"
#include "core/status.h"
#include "models/tasks.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes `model` (built by `task`, a gpt2-* or llama-* language model) as
 * the file `path` (written atomically; its folder must exist), the tokenizer
 * read from tokenizer_dir (encoder.json, vocab.bpe). dtype: "f32", "f16" or
 * "bf16" (the matrices' type). DT_ERR_INVALID_ARG for another task or dtype
 * (naming it), DT_ERR_IO naming the file that cannot be read or written. */
dt_status dt_gguf_export(const dt_task *task, const dt_module *model, const char *tokenizer_dir,
                         const char *dtype, const char *path);

/* The inverse, for fine-tuning (models/gguf_import.c): the GGUF file
 * `path` (as dt_gguf_export writes it; general.architecture the task's,
 * tensors f32, f16 or bf16) loaded into `model`, freshly built by `task`:
 * converted to f32, Llama's q and k rows permuted back to rotate_half's
 * order, the token tables' rows past the file's vocabulary (the padding)
 * left as the model initialised them. DT_ERR_INVALID_ARG naming the file
 * and the architecture, or the tensor that is missing, extra, of another
 * shape or type; DT_ERR_IO naming the file. */
dt_status dt_gguf_import(const dt_task *task, dt_module *model, const char *path);

/* Shared by the export and the import: dtrain's parameter `name`
 * (transformers' naming) as llama.cpp's tensor name (token_embd.weight,
 * blk.N.attn_q.weight, ...); DT_ERR_INTERNAL for a name it does not know. */
dt_status dt_gguf_tensor_name(const char *name, char *out, size_t cap);

/* The rows (each of `cols` floats) of each of the `heads` heads of w from
 * rotate_half's order (first halves, then second halves) to interleaved
 * pairs, as Hugging Face's convert script permutes q and k; back: the
 * inverse. */
dt_status dt_gguf_permute_heads(float *w, int64_t rows, int64_t cols, int heads, bool back);

#ifdef __cplusplus
}
#endif
#endif
